// AdamW and SGD kernels (launchers in adamw.cu). Device code only: also compiled as host C++
// by the CPU emulator tests (tests/test_cuda_kernels_emulated.cpp).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "adamw/adamw_math.hpp"
#include "common/cuda_device.cuh"
#include "common/storage.hpp"

namespace trainmem::cuda {

// ---------------------------------------------------------------- kernels

template <class S>
__global__ void adamw_kernel(void* param, const void* grad, float* master, float* m, float* v,
                             std::int64_t n, AdamWStepConsts c, float grad_scale) {
  for (std::int64_t i = cuda::global_thread_index(); i < n; i += cuda::global_thread_count()) {
    float p = master != nullptr ? master[i] : S::load(param, i);
    float mi = m[i];
    float vi = v[i];
    adamw_update_elem<float>(&p, &mi, &vi, unscaled_grad(S::load(grad, i), grad_scale), c.beta1,
                             c.beta2, c.eps, c.step_size, c.inv_sqrt_bc2, c.decay);
    m[i] = mi;
    v[i] = vi;
    if (master != nullptr) master[i] = p;
    S::store(param, i, p);
  }
}

template <class S>
__global__ void sgd_kernel(void* param, const void* grad, float* master, std::int64_t n, float lr,
                           float grad_scale) {
  for (std::int64_t i = cuda::global_thread_index(); i < n; i += cuda::global_thread_count()) {
    const float p0 = master != nullptr ? master[i] : S::load(param, i);
    const float p = sgd_update_elem<float>(p0, unscaled_grad(S::load(grad, i), grad_scale), lr);
    if (master != nullptr) master[i] = p;
    S::store(param, i, p);
  }
}

}  // namespace trainmem::cuda
