// Bias add and column-sum kernels (launchers in bias.cu). Device code only: also compiled as host
// C++ by the CPU emulator tests (tests/test_cuda_kernels_emulated.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "bias/bias_math.hpp"
#include "common/cuda_device.cuh"
#include "common/launch_shape.hpp"
#include "common/storage.hpp"

namespace trainmem::cuda {

// ---------------------------------------------------------------- kernels

// out (n, c) D += bias (c) D: one thread per element, grid-stride over n*c.
template <class S>
__global__ void bias_forward_kernel(void* out, const void* bias, std::int64_t total,
                                    std::int64_t c) {
  for (std::int64_t i = cuda::global_thread_index(); i < total; i += cuda::global_thread_count())
    S::store(out, std::size_t(i), S::load(out, std::size_t(i)) + S::load(bias, std::size_t(i % c)));
}

// dbias (c) D += column sums of dout (n, c) D. Block (kBiasColumns, kBiasRowLanes) per
// kBiasColumns columns: thread (x, y) sums rows y, y + kBiasRowLanes, ... of column
// blockIdx.x * kBiasColumns + x in fp32; thread y = 0 then adds the kBiasRowLanes partials left to
// right (bias_math.hpp's order, the CPU reference's) and the loaded dbias, and rounds once. One
// writer per element: no atomics, deterministic.
template <class S>
__global__ void __launch_bounds__(kBiasColumns* kBiasRowLanes)
    bias_backward_kernel(void* dbias, const void* dout, std::int64_t n, std::int64_t c) {
  __shared__ float partial[kBiasRowLanes][kBiasColumns + 1];
  const std::int64_t col = std::int64_t(blockIdx.x) * kBiasColumns + threadIdx.x;
  float acc = 0.0f;
  if (col < c) {
    for (std::int64_t row = threadIdx.y; row < n; row += kBiasRowLanes)
      acc += S::load(dout, std::size_t(row) * std::size_t(c) + std::size_t(col));
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    float total = 0.0f;
    TM_UNROLL
    for (int y = 0; y < kBiasRowLanes; ++y) total += partial[y][threadIdx.x];
    S::store(dbias, std::size_t(col), S::load(dbias, std::size_t(col)) + total);
  }
}

// ---------------------------------------------------------------- launch geometry

// Backward: grid ceil(c / kBiasColumns), block (kBiasColumns, kBiasRowLanes).
inline LaunchShape bias_backward_launch(std::int64_t c, const char* op) {
  require_positive(c, op, "c");
  const std::int64_t blocks = ceil_div(c, kBiasColumns);
  require_fits(blocks, kMaxGridX, op, "c / 32 (column blocks)");
  LaunchShape shape;
  shape.grid_x = unsigned(blocks);
  shape.block_x = kBiasColumns;
  shape.block_y = kBiasRowLanes;
  return shape;
}

}  // namespace trainmem::cuda
