// LoRA dropout kernels (launchers in dropout.cu). Device code only: also compiled as host C++
// by the CPU emulator tests (tests/test_cuda_kernels_emulated.cpp).
#pragma once
#include <cstdint>

#include "common/cuda_device.cuh"
#include "common/storage.hpp"
#include "dropout/dropout_math.hpp"

namespace trainmem::cuda {

// static: the emulator tests compile this header as host code beside the device library.
static __global__ void dropout_mask_kernel(std::uint8_t* mask, std::int64_t n, float p,
                                           std::uint64_t seed, std::uint64_t stream) {
  for (std::int64_t e = cuda::global_thread_index(); e < n; e += cuda::global_thread_count())
    mask[e] = dropout_keep(seed, stream, std::uint64_t(e), p);
}

template <class S>
__global__ void dropout_apply_kernel(void* out, const void* x, const std::uint8_t* mask,
                                     std::int64_t n, float scale, bool accumulate) {
  for (std::int64_t e = cuda::global_thread_index(); e < n; e += cuda::global_thread_count())
    S::store(out, e,
             dropout_apply_elem(accumulate ? S::load(out, e) : 0.0f, S::load(x, e), mask[e], scale,
                                accumulate));
}

}  // namespace trainmem::cuda
