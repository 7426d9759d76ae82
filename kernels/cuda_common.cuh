// Host-side helpers of the CUDA launchers: launch geometry and the checks every launcher makes
// before it launches (the device-side helpers are in cuda_device.cuh). Include only from .cu
// files.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>

#include "cuda_device.cuh"
#include "storage.hpp"
#include "trainmem/cuda_check.hpp"
#include "trainmem/error.hpp"

namespace trainmem::cuda {

// ---------------------------------------------------------------- host: launch geometry

// Grid for a grid-stride loop over n elements with `block` threads per block. The grid is
// capped (the loops stride), so any n >= 1 is fine.
inline unsigned grid_for(std::int64_t n, int block) {
  const std::int64_t want = (n + block - 1) / block;
  const std::int64_t cap = std::int64_t(1) << 20;
  return static_cast<unsigned>(want < 1 ? 1 : (want > cap ? cap : want));
}

// A dimension that becomes a grid dimension or a 32-bit loop bound. `what` names it.
inline void require_fits(std::int64_t value, std::int64_t limit, const char* op, const char* what) {
  if (value < 0 || value > limit)
    throw InputError(std::string(op) + ": " + what + " = " + std::to_string(value) +
                     " is outside what the CUDA kernel supports (0.." + std::to_string(limit) +
                     ")");
}
inline void require_positive(std::int64_t value, const char* op, const char* what) {
  if (value <= 0)
    throw InputError(std::string(op) + ": " + what + " must be > 0, got " + std::to_string(value));
}

constexpr std::int64_t kMaxGridX = 2147483647;  // 2^31 - 1
constexpr std::int64_t kMaxGridY = 65535;

// Raises the dynamic shared memory limit of `kernel` to `bytes` when above the 48 KiB that
// needs no opt-in (sm_80 allows up to 163 KiB, sm_90 227 KiB per block).
template <class Kernel>
void allow_dynamic_smem(Kernel kernel, std::size_t bytes) {
  if (bytes > 48 * 1024) {
    TM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
  }
}

}  // namespace trainmem::cuda
