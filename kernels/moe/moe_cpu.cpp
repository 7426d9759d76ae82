// Mixture of experts, CPU reference (math in moe_math.hpp): per token in parallel (each token's
// results are a function of its own inputs), the counting sort serial.
#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "moe/moe.hpp"
#include "moe/moe_math.hpp"

namespace trainmem {

void moe_route_cpu(float* probs, std::int32_t* idx, float* weight, std::int32_t* pos,
                   std::int32_t* offsets, const void* logits, std::int64_t n, std::int64_t E,
                   std::int64_t K, std::int64_t capacity, bool normalize, DType dt) {
  cpu_threads_setup();
  dispatch_storage(dt, "moe_route", [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel for schedule(static) if (n * E >= kParallelMinElements)
    for (std::int64_t t = 0; t < n; ++t)
      moe_route_token<S>(probs + t * E, idx + t * K, weight + t * K, logits, t, E, K, normalize);
  });
  moe_sort_serial(pos, offsets, idx, n, E, K, capacity);
}

void moe_route_backward_cpu(void* dlogits, const float* dweight, const float* probs,
                            const std::int32_t* idx, const float* aux, std::int64_t n,
                            std::int64_t E, std::int64_t K, bool normalize, DType dt) {
  cpu_threads_setup();
  dispatch_storage(dt, "moe_route_backward", [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel for schedule(static) if (n * E >= kParallelMinElements)
    for (std::int64_t t = 0; t < n; ++t)
      moe_route_backward_token<S>(dlogits, dweight + t * K, probs + t * E, idx + t * K, aux, t, E,
                                  K, normalize);
  });
}

void moe_permute_cpu(void* rows, const void* x, const std::int32_t* pos, std::int64_t n,
                     std::int64_t K, std::int64_t h, DType dt) {
  cpu_threads_setup();
  dispatch_storage(dt, "moe_permute", [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel for schedule(static) if (n * K * h >= kParallelMinElements)
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t j = 0; j < K; ++j) {
        const std::int64_t r = pos[t * K + j];
        if (r < 0) continue;  // dropped (capacity)
        for (std::int64_t c = 0; c < h; ++c)
          S::store(rows, std::size_t(r * h + c), S::load(x, std::size_t(t * h + c)));
      }
  });
}

void moe_combine_cpu(void* out, const void* res, const void* rows, const float* weight,
                     const std::int32_t* pos, std::int64_t n, std::int64_t K, std::int64_t h,
                     DType dt) {
  cpu_threads_setup();
  dispatch_storage(dt, "moe_combine", [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel for schedule(static) if (n * K * h >= kParallelMinElements)
    for (std::int64_t t = 0; t < n; ++t)
      moe_combine_token<S>(out, res, rows, weight, pos, t, K, h, 0, h);
  });
}

void moe_combine_backward_cpu(void* drows, float* dweight, const void* dout, const void* rows,
                              const float* weight, const std::int32_t* pos, std::int64_t n,
                              std::int64_t K, std::int64_t h, DType dt) {
  cpu_threads_setup();
  dispatch_storage(dt, "moe_combine_backward", [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel for schedule(static) if (n * K * h >= kParallelMinElements)
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t j = 0; j < K; ++j)
        moe_combine_backward_choice<S>(drows, dweight, dout, rows, weight, pos, t, j, K, h);
  });
}

void moe_gate_add_cpu(void* out, const void* y, const void* score, std::int64_t n, std::int64_t h,
                      DType dt) {
  cpu_threads_setup();
  dispatch_storage(dt, "moe_gate_add", [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel for schedule(static) if (n * h >= kParallelMinElements)
    for (std::int64_t t = 0; t < n; ++t) moe_gate_add_token<S>(out, y, score, t, h, 0, h);
  });
}

void moe_gate_backward_cpu(void* dy, void* dscore, const void* dout, const void* y,
                           const void* score, std::int64_t n, std::int64_t h, DType dt) {
  cpu_threads_setup();
  dispatch_storage(dt, "moe_gate_backward", [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel for schedule(static) if (n * h >= kParallelMinElements)
    for (std::int64_t t = 0; t < n; ++t)
      moe_gate_backward_token<S>(dy, dscore, dout, y, score, t, h);
  });
}

}  // namespace trainmem
