// RMSNorm, CPU reference (math in rmsnorm_math.hpp). Rows run in parallel. dinp accumulates
// (+=) into the residual-stream gradient; dweight is reduced over rows in fixed chunks, in a
// fixed order, so the result does not depend on the thread count.
#include <algorithm>
#include <vector>

#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "rmsnorm/rmsnorm.hpp"
#include "rmsnorm/rmsnorm_math.hpp"

namespace trainmem {
namespace {

template <class S>
void rmsnorm_forward_impl(void* out, float* rstd, const void* inp, const void* weight,
                          std::int64_t n, std::int64_t h, float eps) {
  std::vector<float> w(h);  // (h)
  for (std::int64_t c = 0; c < h; ++c) w[c] = S::load(weight, c);
#pragma omp parallel for if (n * h >= kParallelMinElements)
  for (std::int64_t row = 0; row < n; ++row) {
    const std::size_t base = std::size_t(row) * h;
    float sum_sq = 0.0f;
    for (std::int64_t c = 0; c < h; ++c) {
      const float x = S::load(inp, base + c);
      sum_sq += x * x;
    }
    const float r = rmsnorm_rstd(sum_sq, h, eps);
    rstd[row] = r;
    for (std::int64_t c = 0; c < h; ++c)
      S::store(out, base + c, rmsnorm_out(S::load(inp, base + c), r, w[c]));
  }
}

template <class S>
void rmsnorm_backward_impl(void* dinp, void* dweight, const void* dout, const void* inp,
                           const void* weight, const float* rstd, std::int64_t n, std::int64_t h) {
  std::vector<float> w(h);  // (h)
  for (std::int64_t c = 0; c < h; ++c) w[c] = S::load(weight, c);
  const std::int64_t chunks = std::min<std::int64_t>(n, 32);
  std::vector<float> dw_part(std::size_t(chunks) * h, 0.0f);  // (chunks, h)
#pragma omp parallel for schedule(static, 1) if (n * h >= kParallelMinElements)
  for (std::int64_t ch = 0; ch < chunks; ++ch) {
    const std::int64_t n0 = n * ch / chunks, n1 = n * (ch + 1) / chunks;
    float* dw = dw_part.data() + std::size_t(ch) * h;
    for (std::int64_t row = n0; row < n1; ++row) {
      const std::size_t base = std::size_t(row) * h;
      const float r = rstd[row];
      float dot = 0.0f;
      for (std::int64_t c = 0; c < h; ++c)
        dot += rmsnorm_dot_term(S::load(dout, base + c), w[c], S::load(inp, base + c));
      for (std::int64_t c = 0; c < h; ++c) {
        const float x = S::load(inp, base + c), dy = S::load(dout, base + c);
        dw[c] += rmsnorm_dweight_term(x, dy, r);
        S::store(dinp, base + c, S::load(dinp, base + c) + rmsnorm_dinp(x, w[c], dy, r, dot, h));
      }
    }
  }
  if (!dweight) return;  // a frozen weight (LoRA's base): no gradient
  for (std::int64_t c = 0; c < h; ++c) {
    float acc = S::load(dweight, c);
    float sum = 0.0f;
    for (std::int64_t ch = 0; ch < chunks; ++ch) sum += dw_part[std::size_t(ch) * h + c];
    S::store(dweight, c, acc + sum);
  }
}

}  // namespace

void rmsnorm_forward_cpu(void* out, float* rstd, const void* inp, const void* weight,
                         std::int64_t n, std::int64_t h, float eps, DType dt) {
  cpu_threads_setup();
  dispatch_storage(dt, "rmsnorm_forward", [&](auto tag) {
    rmsnorm_forward_impl<decltype(tag)>(out, rstd, inp, weight, n, h, eps);
  });
}

void rmsnorm_backward_cpu(void* dinp, void* dweight, const void* dout, const void* inp,
                          const void* weight, const float* rstd, std::int64_t n, std::int64_t h,
                          DType dt) {
  cpu_threads_setup();
  dispatch_storage(dt, "rmsnorm_backward", [&](auto tag) {
    rmsnorm_backward_impl<decltype(tag)>(dinp, dweight, dout, inp, weight, rstd, n, h);
  });
}

}  // namespace trainmem
