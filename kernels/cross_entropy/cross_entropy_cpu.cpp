// Cross-entropy over the vocabulary, CPU reference (math in cross_entropy_math.hpp). One row
// per position, rows in parallel. The log-sum-exp is taken in two passes (max, then the sum
// of exp(x - max)), which is the same state LseState holds and vectorises better on the CPU.
// Backward may run in place (dlogits == logits): each element is read before it is written.
#include <string>

#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "cross_entropy/cross_entropy.hpp"
#include "cross_entropy/cross_entropy_math.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

void check_targets(const std::int32_t* targets, std::int64_t n, std::int64_t V) {
  for (std::int64_t row = 0; row < n; ++row) {
    if (targets[row] >= V)
      throw InputError("targets: id " + std::to_string(targets[row]) + " at position " +
                       std::to_string(row) + " is outside the vocabulary [0, " + std::to_string(V) +
                       ") (negative ids mark ignored positions)");
  }
}

template <class S>
void cross_entropy_forward_impl(float* losses, float* lse, const void* logits,
                                const std::int32_t* targets, std::int64_t n, std::int64_t V) {
#pragma omp parallel for if (n * V >= kParallelMinElements)
  for (std::int64_t row = 0; row < n; ++row) {
    const std::size_t base = std::size_t(row) * V;
    LseState<float> st = LseState<float>::empty();
    for (std::int64_t j = 0; j < V; ++j) st.max = tm_max(st.max, S::load(logits, base + j));
    for (std::int64_t j = 0; j < V; ++j) st.sum += tm_exp(S::load(logits, base + j) - st.max);
    const float l = lse_finish(st);
    lse[row] = l;
    const std::int32_t t = targets[row];
    losses[row] = t < 0 ? 0.0f : cross_entropy_loss(l, S::load(logits, base + t));
  }
}

template <class S>
void cross_entropy_backward_impl(void* dlogits, const void* logits, const float* lse,
                                 const std::int32_t* targets, std::int64_t n, std::int64_t V,
                                 float scale) {
#pragma omp parallel for if (n * V >= kParallelMinElements)
  for (std::int64_t row = 0; row < n; ++row) {
    const std::size_t base = std::size_t(row) * V;
    const std::int32_t t = targets[row];
    if (t < 0) {
      for (std::int64_t j = 0; j < V; ++j) S::store(dlogits, base + j, 0.0f);
      continue;
    }
    const float l = lse[row];
    for (std::int64_t j = 0; j < V; ++j)
      S::store(dlogits, base + j,
               cross_entropy_dlogit(S::load(logits, base + j), l, j == t, scale));
  }
}

}  // namespace

void cross_entropy_forward_cpu(float* losses, float* lse, const void* logits,
                               const std::int32_t* targets, std::int64_t n, std::int64_t V,
                               DType dt) {
  cpu_threads_setup();
  check_targets(targets, n, V);
  dispatch_storage(dt, "cross_entropy_forward", [&](auto tag) {
    cross_entropy_forward_impl<decltype(tag)>(losses, lse, logits, targets, n, V);
  });
}

void cross_entropy_backward_cpu(void* dlogits, const void* logits, const float* lse,
                                const std::int32_t* targets, std::int64_t n, std::int64_t V,
                                float scale, DType dt) {
  cpu_threads_setup();
  check_targets(targets, n, V);
  dispatch_storage(dt, "cross_entropy_backward", [&](auto tag) {
    cross_entropy_backward_impl<decltype(tag)>(dlogits, logits, lse, targets, n, V, scale);
  });
}

}  // namespace trainmem
