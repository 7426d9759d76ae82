// Mixture-of-experts kernels (launchers in moe.cu): grid-stride, one thread per token (routing),
// per choice (the combine's backward) or per element (permute, combine); the counting sort in one
// thread. Device code only: also compiled as host C++ by the CPU emulator tests
// (tests/test_cuda_kernels_emulated.cpp).
#pragma once
#include <cstdint>

#include "common/cuda_device.cuh"
#include "common/storage.hpp"
#include "moe/moe_math.hpp"

namespace trainmem::cuda {

template <class S>
__global__ void moe_route_kernel(float* probs, std::int32_t* idx, float* weight, const void* logits,
                                 std::int64_t n, std::int64_t E, std::int64_t K, bool normalize) {
  for (std::int64_t t = cuda::global_thread_index(); t < n; t += cuda::global_thread_count())
    moe_route_token<S>(probs + t * E, idx + t * K, weight + t * K, logits, t, E, K, normalize);
}

// One thread: the serial sort (n·K choices; the expert counts decide every later GEMM's shape).
static __global__ void moe_sort_kernel(std::int32_t* pos, std::int32_t* offsets,
                                       const std::int32_t* idx, std::int64_t n, std::int64_t E,
                                       std::int64_t K, std::int64_t cap) {
  if (cuda::global_thread_index() == 0) moe_sort_serial(pos, offsets, idx, n, E, K, cap);
}

template <class S>
__global__ void moe_route_backward_kernel(void* dlogits, const float* dweight, const float* probs,
                                          const std::int32_t* idx, const float* aux, std::int64_t n,
                                          std::int64_t E, std::int64_t K, bool normalize) {
  for (std::int64_t t = cuda::global_thread_index(); t < n; t += cuda::global_thread_count())
    moe_route_backward_token<S>(dlogits, dweight + t * K, probs + t * E, idx + t * K, aux, t, E, K,
                                normalize);
}

template <class S>
__global__ void moe_permute_kernel(void* rows, const void* x, const std::int32_t* pos,
                                   std::int64_t n, std::int64_t K, std::int64_t h) {
  for (std::int64_t e = cuda::global_thread_index(); e < n * K * h;
       e += cuda::global_thread_count()) {
    const std::int64_t c = e % h, choice = e / h, t = choice / K;
    if (pos[choice] < 0) continue;  // dropped (capacity)
    S::store(rows, std::size_t(std::int64_t(pos[choice]) * h + c),
             S::load(x, std::size_t(t * h + c)));
  }
}

template <class S>
__global__ void moe_combine_kernel(void* out, const void* res, const void* rows,
                                   const float* weight, const std::int32_t* pos, std::int64_t n,
                                   std::int64_t K, std::int64_t h) {
  for (std::int64_t e = cuda::global_thread_index(); e < n * h; e += cuda::global_thread_count())
    moe_combine_token<S>(out, res, rows, weight, pos, e / h, K, h, e % h, e % h + 1);
}

template <class S>
__global__ void moe_combine_backward_kernel(void* drows, float* dweight, const void* dout,
                                            const void* rows, const float* weight,
                                            const std::int32_t* pos, std::int64_t n, std::int64_t K,
                                            std::int64_t h) {
  for (std::int64_t e = cuda::global_thread_index(); e < n * K; e += cuda::global_thread_count())
    moe_combine_backward_choice<S>(drows, dweight, dout, rows, weight, pos, e / K, e % K, K, h);
}

template <class S>
__global__ void moe_gate_add_kernel(void* out, const void* y, const void* score, std::int64_t n,
                                    std::int64_t h) {
  for (std::int64_t e = cuda::global_thread_index(); e < n * h; e += cuda::global_thread_count())
    moe_gate_add_token<S>(out, y, score, e / h, h, e % h, e % h + 1);
}

template <class S>
__global__ void moe_gate_backward_kernel(void* dy, void* dscore, const void* dout, const void* y,
                                         const void* score, std::int64_t n, std::int64_t h) {
  for (std::int64_t t = cuda::global_thread_index(); t < n; t += cuda::global_thread_count())
    moe_gate_backward_token<S>(dy, dscore, dout, y, score, t, h);
}

}  // namespace trainmem::cuda
