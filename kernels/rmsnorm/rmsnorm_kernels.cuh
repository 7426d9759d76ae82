// RMSNorm kernels (launchers in rmsnorm.cu). Device code only: also compiled as host C++ by
// the CPU emulator tests (tests/test_cuda_kernels_emulated.cpp).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/cuda_device.cuh"
#include "common/launch_shape.hpp"
#include "common/storage.hpp"
#include "rmsnorm/rmsnorm_math.hpp"

namespace trainmem::cuda {

constexpr int kRmsRowThreads = 256;

// ---------------------------------------------------------------- kernels

// grid n, block kRmsRowThreads: one row per block.
template <class S>
__global__ void __launch_bounds__(kRmsRowThreads)
    rmsnorm_forward_kernel(void* out, float* rstd, const void* inp, const void* weight,
                           std::int64_t h, float eps) {
  __shared__ float scratch[32];
  const std::size_t base = std::size_t(blockIdx.x) * h;
  float sum_sq = 0.0f;
  for (std::int64_t c = threadIdx.x; c < h; c += kRmsRowThreads) {
    const float x = S::load(inp, base + c);
    sum_sq += x * x;
  }
  sum_sq = cuda::block_sum(sum_sq, scratch);
  const float r = rmsnorm_rstd<float>(sum_sq, h, eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (std::int64_t c = threadIdx.x; c < h; c += kRmsRowThreads) {
    S::store(out, base + c, rmsnorm_out<float>(S::load(inp, base + c), r, S::load(weight, c)));
  }
}

// grid n, block kRmsRowThreads: dinp of one row per block.
template <class S>
__global__ void __launch_bounds__(kRmsRowThreads)
    rmsnorm_backward_dinp_kernel(void* dinp, const void* dout, const void* inp, const void* weight,
                                 const float* rstd, std::int64_t h) {
  __shared__ float scratch[32];
  const std::size_t base = std::size_t(blockIdx.x) * h;
  float dot = 0.0f;
  for (std::int64_t c = threadIdx.x; c < h; c += kRmsRowThreads) {
    dot += rmsnorm_dot_term<float>(S::load(dout, base + c), S::load(weight, c),
                                   S::load(inp, base + c));
  }
  dot = cuda::block_sum(dot, scratch);
  const float r = rstd[blockIdx.x];
  for (std::int64_t c = threadIdx.x; c < h; c += kRmsRowThreads) {
    const float dx = rmsnorm_dinp<float>(S::load(inp, base + c), S::load(weight, c),
                                         S::load(dout, base + c), r, dot, h);
    S::store(dinp, base + c, S::load(dinp, base + c) + dx);
  }
}

constexpr int kRmsColX = 32;  // columns per block (a warp reads 32 consecutive elements)
constexpr int kRmsColY = 16;  // row groups per block

// grid ceil(h/32), block (32, 16). Thread (x, y) sums the rows y, y+16, ... of column c in
// fp32; the 16 partials are added in shared memory in a fixed order (deterministic).
template <class S>
__global__ void __launch_bounds__(kRmsColX* kRmsColY)
    rmsnorm_backward_dweight_kernel(void* dweight, const void* dout, const void* inp,
                                    const float* rstd, std::int64_t n, std::int64_t h) {
  __shared__ float partial[kRmsColY][kRmsColX + 1];
  const std::int64_t c = std::int64_t(blockIdx.x) * kRmsColX + threadIdx.x;
  float acc = 0.0f;
  if (c < h) {
    for (std::int64_t row = threadIdx.y; row < n; row += kRmsColY) {
      const std::size_t i = std::size_t(row) * h + c;
      acc += rmsnorm_dweight_term<float>(S::load(inp, i), S::load(dout, i), rstd[row]);
    }
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < h) {
    float sum = 0.0f;
    TM_UNROLL
    for (int y = 0; y < kRmsColY; ++y) sum += partial[y][threadIdx.x];
    S::store(dweight, c, S::load(dweight, c) + sum);
  }
}

// ---------------------------------------------------------------- launch geometry

// Forward and dinp: one block of kRmsRowThreads per row, grid n.
inline LaunchShape rmsnorm_row_launch(std::int64_t n, const char* op) {
  require_positive(n, op, "n (rows)");
  require_fits(n, kMaxGridX, op, "n (rows)");
  LaunchShape shape;
  shape.grid_x = unsigned(n);
  shape.block_x = kRmsRowThreads;
  return shape;
}
// dweight: grid ceil(h / 32), block (32, 16).
inline LaunchShape rmsnorm_dweight_launch(std::int64_t h, const char* op) {
  require_positive(h, op, "h");
  const std::int64_t blocks = ceil_div(h, kRmsColX);
  require_fits(blocks, kMaxGridX, op, "h / 32 (dweight blocks)");
  LaunchShape shape;
  shape.grid_x = unsigned(blocks);
  shape.block_x = kRmsColX;
  shape.block_y = kRmsColY;
  return shape;
}

}  // namespace trainmem::cuda
