// The eager attention's row kernels: causal softmax and its backward (the GEMMs are cuBLAS,
// attention_eager.cu). Device code only: also compiled as host C++ by the CPU emulator tests
// (tests/test_cuda_kernels_emulated.cpp).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "attention/attention_math.hpp"
#include "common/cuda_device.cuh"
#include "common/launch_shape.hpp"
#include "common/storage.hpp"

namespace trainmem::cuda {

constexpr int kSoftmaxWarps = 4;  // rows per block: one warp per row
constexpr int kSoftmaxThreads = kSoftmaxWarps * 32;

// ---------------------------------------------------------------- kernels

// probs (R = b*a*s rows, s) D: row r is query position i = r % s of its head; its visible keys
// are lo..i, lo = window_first_key(i, window) (0 without a window). In place:
// p_j = exp(s_j - max) / sum for lo <= j <= i, 0 elsewhere (the GEMM wrote scores there too).
template <class S>
__global__ void __launch_bounds__(kSoftmaxThreads)
    causal_softmax_kernel(void* probs, std::int64_t rows, std::int64_t s, std::int64_t window) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * kSoftmaxWarps + (threadIdx.x >> 5);
  if (row >= rows) return;  // the whole warp leaves together; no block barrier follows
  const std::int64_t i = row % s;
  const std::int64_t lo = window_first_key(i, window);
  const std::size_t base = std::size_t(row) * s;
  float mx = -INFINITY;
  for (std::int64_t j = lo + lane; j <= i; j += 32) mx = fmaxf(mx, S::load(probs, base + j));
  mx = cuda::warp_max(mx);
  float sum = 0.0f;
  for (std::int64_t j = lo + lane; j <= i; j += 32) sum += tm_exp(S::load(probs, base + j) - mx);
  sum = cuda::warp_sum(sum);
  const float inv = 1.0f / sum;
  for (std::int64_t j = lane; j < s; j += 32) {
    const float p = j >= lo && j <= i ? tm_exp(S::load(probs, base + j) - mx) * inv : 0.0f;
    S::store(probs, base + j, p);
  }
}

// dprobs holds dP on entry and dS on exit: dS_j = P_j (dP_j - sum_k P_k dP_k) for
// lo <= j <= i, 0 elsewhere. Same row layout and window as causal_softmax_kernel.
template <class S>
__global__ void __launch_bounds__(kSoftmaxThreads)
    causal_softmax_backward_kernel(void* dprobs, const void* probs, std::int64_t rows,
                                   std::int64_t s, std::int64_t window) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * kSoftmaxWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const std::int64_t i = row % s;
  const std::int64_t lo = window_first_key(i, window);
  const std::size_t base = std::size_t(row) * s;
  float dot = 0.0f;
  for (std::int64_t j = lo + lane; j <= i; j += 32)
    dot += S::load(probs, base + j) * S::load(dprobs, base + j);
  dot = cuda::warp_sum(dot);
  for (std::int64_t j = lane; j < s; j += 32) {
    const float ds =
        j >= lo && j <= i
            ? softmax_backward_elem<float>(S::load(probs, base + j), S::load(dprobs, base + j), dot)
            : 0.0f;
    S::store(dprobs, base + j, ds);
  }
}

// ---------------------------------------------------------------- launch geometry

// Both row kernels: a warp per row of the (rows = b*a*s, s) probabilities, kSoftmaxWarps rows
// per block.
inline LaunchShape causal_softmax_launch(std::int64_t rows, const char* op) {
  return warp_per_row_launch(rows, kSoftmaxWarps, op, "b*a*s");
}

}  // namespace trainmem::cuda
