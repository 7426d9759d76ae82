// Residual-add and cast kernels (launchers in residual.cu), test-only: the library has no
// residual kernel (the model adds residuals as a copy plus a GEMM with beta 1) and no device cast;
// the tests use these to check storage.hpp's conversions on the device. Device code only: also
// compiled as host C++ by the CPU emulator tests (tests/test_cuda_kernels_emulated.cpp).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/cuda_device.cuh"
#include "common/storage.hpp"

namespace trainmem::cuda {

// ---------------------------------------------------------------- kernels

template <class S>
__global__ void residual_forward_kernel(void* out, const void* inp1, const void* inp2,
                                        std::int64_t n) {
  for (std::int64_t i = cuda::global_thread_index(); i < n; i += cuda::global_thread_count())
    S::store(out, i, S::load(inp1, i) + S::load(inp2, i));
}

template <class Dst, class Src>
__global__ void cast_kernel(void* dst, const void* src, std::int64_t n) {
  for (std::int64_t i = cuda::global_thread_index(); i < n; i += cuda::global_thread_count())
    Dst::store(dst, i, Src::load(src, i));
}

}  // namespace trainmem::cuda
