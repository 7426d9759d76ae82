// Token embedding kernels (launchers in embedding.cu). Device code only: also compiled as host
// C++ by the CPU emulator tests (tests/test_cuda_kernels_emulated.cpp).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "cuda_device.cuh"
#include "launch_shape.hpp"
#include "storage.hpp"

namespace trainmem::cuda {

// ---------------------------------------------------------------- kernels

// One thread per element of out (N,C), grid-stride.
template <class S>
__global__ void embedding_forward_kernel(void* out, const std::int32_t* tokens, const void* wte,
                                         std::int64_t N, std::int64_t C, std::int64_t V) {
  const std::int64_t total = N * C;
  for (std::int64_t i = global_thread_index(); i < total; i += global_thread_count()) {
    const std::int64_t n = i / C;
    const std::int64_t c = i - n * C;
    const std::int32_t tok = tokens[n];
    const float val =
        (tok >= 0 && tok < V) ? S::load(wte, std::size_t(tok) * C + c) : cuda::quiet_nan();
    S::store(out, i, val);
  }
}

constexpr int kEmbBwdThreads = 256;
constexpr int kEmbBwdColsPerThread = 8;  // a block covers 2048 columns
constexpr int kEmbBwdColsPerBlock = kEmbBwdThreads * kEmbBwdColsPerThread;

// grid (N, ceil(C / 2048)), block kEmbBwdThreads. Block (n, y) works only if row n is the first
// row holding its id: it then sums dout over all rows m >= n with that id, for its 2048
// columns, and is the only writer of those elements of dwte. No atomics, no scratch.
template <class S>
__global__ void __launch_bounds__(kEmbBwdThreads)
    embedding_backward_kernel(void* dwte, const void* dout, const std::int32_t* tokens,
                              std::int64_t N, std::int64_t C, std::int64_t V) {
  __shared__ std::int32_t s_tok[kEmbBwdThreads];
  const std::int64_t n = blockIdx.x;
  const std::int32_t tok = tokens[n];  // same value in every thread: the returns are uniform
  if (tok < 0 || tok >= V) return;
  int earlier = 0;
  for (std::int64_t m = threadIdx.x; m < n; m += kEmbBwdThreads) {
    if (tokens[m] == tok) {
      earlier = 1;
      break;
    }
  }
  if (__syncthreads_or(earlier)) return;

  // acc starts from dwte and adds the rows in position order: the same fp32 sequence as
  // embedding_cpu, so both round to the same value.
  const std::int64_t c0 = std::int64_t(blockIdx.y) * kEmbBwdColsPerBlock + threadIdx.x;
  const std::size_t dst = std::size_t(tok) * C;
  float acc[kEmbBwdColsPerThread];
  TM_UNROLL
  for (int k = 0; k < kEmbBwdColsPerThread; ++k) {
    const std::int64_t c = c0 + std::int64_t(k) * kEmbBwdThreads;
    acc[k] = c < C ? S::load(dwte, dst + c) : 0.0f;
  }

  for (std::int64_t m0 = n; m0 < N; m0 += kEmbBwdThreads) {
    __syncthreads();  // every thread is done with the previous chunk of s_tok
    const std::int64_t m = m0 + threadIdx.x;
    s_tok[threadIdx.x] = m < N ? tokens[m] : -1;
    __syncthreads();
    const std::int64_t left = N - m0;
    const int count = left < kEmbBwdThreads ? int(left) : kEmbBwdThreads;
    for (int r = 0; r < count; ++r) {
      if (s_tok[r] != tok) continue;  // uniform: every thread reads the same s_tok[r]
      const std::size_t row = std::size_t(m0 + r) * C;
      TM_UNROLL
      for (int k = 0; k < kEmbBwdColsPerThread; ++k) {
        const std::int64_t c = c0 + std::int64_t(k) * kEmbBwdThreads;
        if (c < C) acc[k] += S::load(dout, row + c);
      }
    }
  }
  TM_UNROLL
  for (int k = 0; k < kEmbBwdColsPerThread; ++k) {
    const std::int64_t c = c0 + std::int64_t(k) * kEmbBwdThreads;
    if (c < C) S::store(dwte, dst + c, acc[k]);
  }
}

// ---------------------------------------------------------------- launch geometry

// Backward: grid (N, ceil(C / 2048)), kEmbBwdThreads threads.
inline LaunchShape embedding_backward_launch(std::int64_t N, std::int64_t C, const char* op) {
  require_positive(N, op, "B*T");
  require_positive(C, op, "C");
  require_fits(N, kMaxGridX, op, "B*T");
  const std::int64_t col_blocks = ceil_div(C, kEmbBwdColsPerBlock);
  require_fits(col_blocks, kMaxGridY, op, "C / 2048 (gridDim.y)");
  LaunchShape s;
  s.grid_x = unsigned(N);
  s.grid_y = unsigned(col_blocks);
  s.block_x = kEmbBwdThreads;
  return s;
}

}  // namespace trainmem::cuda
