// Helpers shared by the CUDA kernels: launch geometry, warp and block reductions, and the
// checks every launcher makes before it launches. Device code only where marked __device__;
// the rest is host code. Include only from .cu files.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>

#include "storage.hpp"
#include "trainmem/cuda_check.hpp"
#include "trainmem/error.hpp"

namespace trainmem::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

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

// ---------------------------------------------------------------- device: reductions

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
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

}  // namespace trainmem::cuda
