// bitsandbytes' AdamW8bit kernels (launchers in adamw8bit.cu). Device code only: also compiled
// as host C++ by the CPU emulator tests (tests/test_cuda_kernels_emulated.cpp).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "adamw8bit/adamw8bit_math.hpp"
#include "common/cuda_device.cuh"
#include "common/storage.hpp"

namespace trainmem::cuda {

template <class S>
__global__ void bnb_adamw8bit_kernel(void* param, const void* grad, std::uint8_t* s1,
                                     std::uint8_t* s2, float* absmax1, float* absmax2,
                                     const float* qmap1, const float* qmap2,
                                     const std::uint8_t* lut1, const std::uint8_t* lut2,
                                     std::int64_t n, std::int64_t nb, BnbAdamWConsts c) {
  for (std::int64_t b = cuda::global_thread_index(); b < nb; b += cuda::global_thread_count())
    bnb_adamw8bit_block<S>(param, grad, s1, s2, absmax1, absmax2, qmap1, qmap2, lut1, lut2, n, b,
                           c);
}

template <class S>
__global__ void bnb_adamw32_kernel(void* param, const void* grad, float* m, float* v,
                                   std::int64_t n, BnbAdamWConsts c) {
  for (std::int64_t i = cuda::global_thread_index(); i < n; i += cuda::global_thread_count()) {
    float mi = m[i], vi = v[i];
    bnb_adam_moments(S::load(grad, std::size_t(i)), &mi, &vi, c);
    m[i] = mi;
    v[i] = vi;
    S::store(param, std::size_t(i), bnb_adamw32_param(S::load(param, std::size_t(i)), mi, vi, c));
  }
}

}  // namespace trainmem::cuda
