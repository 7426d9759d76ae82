// Device-side helpers shared by the kernels (kernels/<op>/<op>_kernels.cuh): warp and block
// reductions, grid-stride indices, dynamic shared memory. Device code only, so that the kernel
// headers also compile as host C++ under the CUDA emulator of tests/cuda_emulator.hpp (the
// CPU tests in tests/test_cuda_kernels_emulated.cpp run the real kernel code that way).
#pragma once
#include <cstdint>

// `#pragma unroll` under nvcc, nothing for host compilers (the emulator tests).
#if defined(__CUDACC__)
#define TM_UNROLL _Pragma("unroll")
#else
#define TM_UNROLL
#endif

namespace trainmem::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
  TM_UNROLL
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  TM_UNROLL
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum over the whole block, returned to every thread. blockDim.x must be a multiple of 32
// (at most 1024) and every thread of the block must call it. `scratch` is 32 floats of
// shared memory; it may be reused by the next call (the leading barrier protects it).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call may still be reading scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.0f;
  return warp_sum(v);  // every warp reduces the per-warp partials itself
}

// Grid-stride index helpers (64-bit).
__device__ __forceinline__ std::int64_t global_thread_index() {
  return std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t global_thread_count() {
  return std::int64_t(gridDim.x) * blockDim.x;
}

// A quiet NaN, written where a kernel meets input it cannot reject (it cannot throw).
__device__ __forceinline__ float quiet_nan() {
  return __int_as_float(0x7fc00000);
}

}  // namespace trainmem::cuda

// The kernel's dynamic shared memory as `T* name` (the launch's third <<<>>> argument).
#ifndef TM_DYNAMIC_SHARED
#define TM_DYNAMIC_SHARED(T, name)       \
  extern __shared__ T name##_storage_[]; \
  T* name = name##_storage_
#endif
