// Parameter initialisation kernel (launcher in init.cu). Device code only: also compiled as
// host C++ by the CPU emulator tests (tests/test_cuda_kernels_emulated.cpp). The values come
// from include/trainmem/base/param_init.hpp, shared with the host path (Backend::init_param).
#pragma once
#include <cstdint>

#include "common/cuda_device.cuh"
#include "common/storage.hpp"
#include "trainmem/base/param_init.hpp"

namespace trainmem::cuda {

// dst (n) S = round(value(i)); master (n) f32 = value(i) when non-null.
template <class S>
__global__ void init_param_kernel(void* dst, float* master, std::int64_t n, ParamInit init) {
  for (std::int64_t i = cuda::global_thread_index(); i < n; i += cuda::global_thread_count()) {
    const float v = param_init_value(init, std::uint64_t(i));
    S::store(dst, std::size_t(i), v);
    if (master != nullptr) master[i] = v;
  }
}

}  // namespace trainmem::cuda
