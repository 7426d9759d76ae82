// Host-side helpers of the CUDA launchers: launch geometry and the checks every launcher makes
// before it launches (the device-side helpers are in cuda_device.cuh). Include only from .cu
// files.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>

#include "common/cuda_device.cuh"
#include "common/launch_shape.hpp"
#include "common/storage.hpp"
#include "trainmem/base/cuda_check.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem::cuda {

// ---------------------------------------------------------------- host: launch geometry
// (grid_for, require_fits, LaunchShape and the limits are plain C++ in launch_shape.hpp, so
// that the CPU tests check them.)

inline dim3 grid_of(const LaunchShape& s) {
  return dim3(s.grid_x, s.grid_y);
}
inline dim3 block_of(const LaunchShape& s) {
  return dim3(s.block_x, s.block_y);
}

// Raises the dynamic shared memory limit of `kernel` to the shape's bytes when above the
// 48 KiB that need no opt-in (sm_80 allows up to 163 KiB, sm_86/89 99 KiB, sm_90 227 KiB per
// block). Call before every launch with that shape: the attribute is per kernel.
template <class Kernel>
void allow_dynamic_smem(Kernel kernel, const LaunchShape& s) {
  if (s.needs_smem_opt_in()) {
    TM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(s.smem_bytes)));
  }
}

}  // namespace trainmem::cuda
