// Bias add and its backward, CPU reference (summation order in bias_math.hpp). Forward: rows run
// in parallel. Backward: column blocks run in parallel, each column summed whole by one thread
// in bias_math.hpp's fixed order, so the result is the same for any team size.
#include <algorithm>
#include <string>

#include "bias/bias.hpp"
#include "bias/bias_math.hpp"
#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

void check_dims(const char* op, std::int64_t n, std::int64_t c) {
  if (n < 0) throw InputError(std::string(op) + ": n must be >= 0, got " + std::to_string(n));
  if (c < 0) throw InputError(std::string(op) + ": c must be >= 0, got " + std::to_string(c));
}

template <class S>
void bias_forward_impl(void* out, const void* bias, std::int64_t n, std::int64_t c) {
#pragma omp parallel for if (n * c >= kParallelMinElements)
  for (std::int64_t row = 0; row < n; ++row) {
    const std::size_t base = std::size_t(row) * std::size_t(c);
    for (std::int64_t j = 0; j < c; ++j)
      S::store(out, base + j, S::load(out, base + j) + S::load(bias, std::size_t(j)));
  }
}

template <class S>
void bias_backward_impl(void* dbias, const void* dout, std::int64_t n, std::int64_t c) {
  constexpr std::int64_t kCols = kBiasColumns;
  const std::int64_t blocks = (c + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (n * c >= kParallelMinElements)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    const std::int64_t j0 = blk * kCols, cols = std::min(kCols, c - j0);
    float partial[kBiasRowLanes][kCols] = {};
    for (std::int64_t row = 0; row < n; ++row) {
      float* p = partial[row % kBiasRowLanes];
      const std::size_t base = std::size_t(row) * std::size_t(c) + std::size_t(j0);
      for (std::int64_t j = 0; j < cols; ++j) p[j] += S::load(dout, base + j);
    }
    for (std::int64_t j = 0; j < cols; ++j) {
      float total = 0.0f;
      for (int y = 0; y < kBiasRowLanes; ++y) total += partial[y][j];
      const std::size_t at = std::size_t(j0 + j);
      S::store(dbias, at, S::load(dbias, at) + total);
    }
  }
}

}  // namespace

void bias_forward_cpu(void* out, const void* bias, std::int64_t n, std::int64_t c, DType dt) {
  cpu_threads_setup();
  check_dims("bias_forward", n, c);
  if (n == 0 || c == 0) return;
  dispatch_storage(dt, "bias_forward",
                   [&](auto tag) { bias_forward_impl<decltype(tag)>(out, bias, n, c); });
}

void bias_backward_cpu(void* dbias, const void* dout, std::int64_t n, std::int64_t c, DType dt) {
  cpu_threads_setup();
  check_dims("bias_backward", n, c);
  if (n == 0 || c == 0) return;
  dispatch_storage(dt, "bias_backward",
                   [&](auto tag) { bias_backward_impl<decltype(tag)>(dbias, dout, n, c); });
}

}  // namespace trainmem
