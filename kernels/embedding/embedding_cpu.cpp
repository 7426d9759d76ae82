// Token embedding, CPU reference: forward gathers rows of wte, backward scatters the output
// gradient back with +=. Rows of repeated token ids are summed in fp32 in position order and
// rounded once into dwte, so the result is deterministic and independent of the thread count.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "embedding/embedding.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

void check_tokens(const std::int32_t* tokens, std::int64_t n, std::int64_t V) {  // n = b*s rows
  for (std::int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V) {
      throw InputError("tokens: id " + std::to_string(tokens[i]) + " at position " +
                       std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(V) +
                       ")");
    }
  }
}

template <class S>
void embedding_backward_impl(void* dwte, const void* dout, const std::int32_t* tokens,
                             std::int64_t n, std::int64_t h) {
  // Positions grouped by token id (stable: position order within a group).
  std::vector<std::int64_t> order(n);
  std::iota(order.begin(), order.end(), std::int64_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int64_t a, std::int64_t b) { return tokens[a] < tokens[b]; });
  std::vector<std::int64_t> starts;  // start of each group in `order`
  for (std::int64_t i = 0; i < n; ++i)
    if (i == 0 || tokens[order[i]] != tokens[order[i - 1]]) starts.push_back(i);
  starts.push_back(n);
  const std::int64_t groups = std::int64_t(starts.size()) - 1;
#pragma omp parallel if (n * h >= kParallelMinElements)
  {
    std::vector<float> acc(h);  // (h) the row being accumulated
#pragma omp for schedule(dynamic, 8)
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t row = tokens[order[starts[g]]];
      for (std::int64_t c = 0; c < h; ++c) acc[c] = S::load(dwte, row * h + c);
      for (std::int64_t i = starts[g]; i < starts[g + 1]; ++i) {
        const std::int64_t pos = order[i];
        for (std::int64_t c = 0; c < h; ++c) acc[c] += S::load(dout, pos * h + c);
      }
      for (std::int64_t c = 0; c < h; ++c) S::store(dwte, row * h + c, acc[c]);
    }
  }
}

}  // namespace

void embedding_forward_cpu(void* out, const std::int32_t* tokens, const void* wte, std::int64_t b,
                           std::int64_t s, std::int64_t h, std::int64_t V, DType dt) {
  cpu_threads_setup();
  const std::int64_t n = b * s;
  check_tokens(tokens, n, V);
  const std::size_t row_bytes = std::size_t(h) * dtype_size(dt);
  auto* dst = static_cast<unsigned char*>(out);
  const auto* src = static_cast<const unsigned char*>(wte);
#pragma omp parallel for if (n * h >= kParallelMinElements)
  for (std::int64_t row = 0; row < n; ++row) {
    std::memcpy(dst + std::size_t(row) * row_bytes, src + std::size_t(tokens[row]) * row_bytes,
                row_bytes);
  }
}

void embedding_backward_cpu(void* dwte, const void* dout, const std::int32_t* tokens,
                            std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t V,
                            DType dt) {
  cpu_threads_setup();
  check_tokens(tokens, b * s, V);
  dispatch_storage(dt, "embedding_backward", [&](auto tag) {
    embedding_backward_impl<decltype(tag)>(dwte, dout, tokens, b * s, h);
  });
}

}  // namespace trainmem
