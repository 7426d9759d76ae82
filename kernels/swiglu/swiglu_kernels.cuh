// SwiGLU kernels (launchers in swiglu.cu). Device code only: also compiled as host C++ by the
// CPU emulator tests (tests/test_cuda_kernels_emulated.cpp).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/cuda_device.cuh"
#include "common/storage.hpp"
#include "swiglu/swiglu_math.hpp"

namespace trainmem::cuda {

// ---------------------------------------------------------------- kernels

template <class S>
__global__ void swiglu_forward_kernel(void* out, const void* gate, const void* up, std::int64_t n) {
  for (std::int64_t i = cuda::global_thread_index(); i < n; i += cuda::global_thread_count())
    S::store(out, i, swiglu_forward_elem<float>(S::load(gate, i), S::load(up, i)));
}

template <class S>
__global__ void swiglu_backward_kernel(void* dgate, void* dup, const void* dout, const void* gate,
                                       const void* up, std::int64_t n) {
  for (std::int64_t i = cuda::global_thread_index(); i < n; i += cuda::global_thread_count()) {
    float dg, du;
    swiglu_backward_elem<float>(S::load(dout, i), S::load(gate, i), S::load(up, i), &dg, &du);
    S::store(dgate, i, dg);
    S::store(dup, i, du);
  }
}

}  // namespace trainmem::cuda
