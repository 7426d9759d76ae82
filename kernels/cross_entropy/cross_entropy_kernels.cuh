// Cross-entropy kernels (launchers in cross_entropy.cu). Device code only: also compiled as
// host C++ by the CPU emulator tests (tests/test_cuda_kernels_emulated.cpp).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/cuda_device.cuh"
#include "common/launch_shape.hpp"
#include "common/storage.hpp"
#include "cross_entropy/cross_entropy_math.hpp"

namespace trainmem::cuda {

constexpr int kCeFwdThreads = 512;
constexpr int kCeBwdThreads = 512;

__device__ __forceinline__ LseState<float> warp_lse_merge(LseState<float> s) {
  TM_UNROLL
  for (int o = 16; o > 0; o >>= 1) {
    LseState<float> other;
    other.max = __shfl_xor_sync(cuda::kFullMask, s.max, o);
    other.sum = __shfl_xor_sync(cuda::kFullMask, s.sum, o);
    s = lse_merge<float>(s, other);
  }
  return s;
}

// ---------------------------------------------------------------- kernels

// grid n, block kCeFwdThreads.
template <class S>
__global__ void __launch_bounds__(kCeFwdThreads)
    cross_entropy_forward_kernel(float* losses, float* lse, const void* logits,
                                 const std::int32_t* targets, std::int64_t V) {
  __shared__ float s_max[32];
  __shared__ float s_sum[32];
  const std::int64_t row = blockIdx.x;
  const std::size_t base = std::size_t(row) * V;
  LseState<float> st = LseState<float>::empty();
  for (std::int64_t j = threadIdx.x; j < V; j += kCeFwdThreads)
    lse_update<float>(&st, S::load(logits, base + j));
  st = warp_lse_merge(st);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) {
    s_max[warp] = st.max;
    s_sum[warp] = st.sum;
  }
  __syncthreads();
  if (warp == 0) {
    constexpr int kWarps = kCeFwdThreads / 32;
    st = LseState<float>::empty();
    if (lane < kWarps) st = LseState<float>{s_max[lane], s_sum[lane]};
    st = warp_lse_merge(st);
    if (lane == 0) {
      const float row_lse = lse_finish<float>(st);
      lse[row] = row_lse;
      const std::int32_t t = targets[row];
      float loss = 0.0f;
      if (t >= V) {
        loss = cuda::quiet_nan();  // NaN: an invalid target must not pass silently
      } else if (t >= 0) {
        loss = cross_entropy_loss<float>(row_lse, S::load(logits, base + t));
      }
      losses[row] = loss;
    }
  }
}

// grid n, block kCeBwdThreads.
template <class S>
__global__ void __launch_bounds__(kCeBwdThreads)
    cross_entropy_backward_kernel(void* dlogits, const void* logits, const float* lse,
                                  const std::int32_t* targets, std::int64_t V, float scale) {
  const std::int64_t row = blockIdx.x;
  const std::size_t base = std::size_t(row) * V;
  const std::int32_t t = targets[row];
  const float row_lse = lse[row];
  for (std::int64_t j = threadIdx.x; j < V; j += kCeBwdThreads) {
    float d;
    if (t < 0) {
      d = 0.0f;
    } else if (t >= V) {
      d = cuda::quiet_nan();
    } else {
      d = cross_entropy_dlogit<float>(S::load(logits, base + j), row_lse, j == t, scale);
    }
    S::store(dlogits, base + j, d);  // same element, same thread: in place is safe
  }
}

// ---------------------------------------------------------------- launch geometry

// Forward and backward: one block of `threads` per row, grid n.
inline LaunchShape cross_entropy_launch(std::int64_t n, int threads, const char* op) {
  require_positive(n, op, "n (rows)");
  require_fits(n, kMaxGridX, op, "n (rows)");
  LaunchShape shape;
  shape.grid_x = unsigned(n);
  shape.block_x = unsigned(threads);
  return shape;
}

}  // namespace trainmem::cuda
