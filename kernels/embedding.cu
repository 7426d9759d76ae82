// Token embedding, forward and backward, on the GPU.
// Forward: out[n, c] = wte[tokens[n], c]. Backward: dwte[v, c] += sum over rows n with
// tokens[n] == v of dout[n, c], in fp32 starting from dwte, in position order, rounded once
// (the same sequence as embedding_cpu: bit-identical results).
#include "cuda_common.cuh"
#include "embedding.cuh"
#include "trainmem/checked.hpp"

namespace trainmem {
namespace {

using cuda::global_thread_count;
using cuda::global_thread_index;

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
        (tok >= 0 && tok < V) ? S::load(wte, std::size_t(tok) * C + c) : __int_as_float(0x7fc00000);
    S::store(out, i, val);
  }
}

constexpr int kBwdThreads = 256;
constexpr int kBwdColsPerThread = 8;  // a block covers 2048 columns
constexpr int kBwdColsPerBlock = kBwdThreads * kBwdColsPerThread;

// grid (N, ceil(C / 2048)), block kBwdThreads. Block (n, y) works only if row n is the first
// row holding its id: it then sums dout over all rows m >= n with that id, for its 2048
// columns, and is the only writer of those elements of dwte. No atomics, no scratch.
template <class S>
__global__ void __launch_bounds__(kBwdThreads)
    embedding_backward_kernel(void* dwte, const void* dout, const std::int32_t* tokens,
                              std::int64_t N, std::int64_t C, std::int64_t V) {
  __shared__ std::int32_t s_tok[kBwdThreads];
  const std::int64_t n = blockIdx.x;
  const std::int32_t tok = tokens[n];  // same value in every thread: the returns are uniform
  if (tok < 0 || tok >= V) return;
  int earlier = 0;
  for (std::int64_t m = threadIdx.x; m < n; m += kBwdThreads) {
    if (tokens[m] == tok) {
      earlier = 1;
      break;
    }
  }
  if (__syncthreads_or(earlier)) return;

  // acc starts from dwte and adds the rows in position order: the same fp32 sequence as
  // embedding_cpu, so both round to the same value.
  const std::int64_t c0 = std::int64_t(blockIdx.y) * kBwdColsPerBlock + threadIdx.x;
  const std::size_t dst = std::size_t(tok) * C;
  float acc[kBwdColsPerThread];
#pragma unroll
  for (int k = 0; k < kBwdColsPerThread; ++k) {
    const std::int64_t c = c0 + std::int64_t(k) * kBwdThreads;
    acc[k] = c < C ? S::load(dwte, dst + c) : 0.0f;
  }

  for (std::int64_t m0 = n; m0 < N; m0 += kBwdThreads) {
    __syncthreads();  // every thread is done with the previous chunk of s_tok
    const std::int64_t m = m0 + threadIdx.x;
    s_tok[threadIdx.x] = m < N ? tokens[m] : -1;
    __syncthreads();
    const std::int64_t left = N - m0;
    const int count = left < kBwdThreads ? int(left) : kBwdThreads;
    for (int r = 0; r < count; ++r) {
      if (s_tok[r] != tok) continue;  // uniform: every thread reads the same s_tok[r]
      const std::size_t row = std::size_t(m0 + r) * C;
#pragma unroll
      for (int k = 0; k < kBwdColsPerThread; ++k) {
        const std::int64_t c = c0 + std::int64_t(k) * kBwdThreads;
        if (c < C) acc[k] += S::load(dout, row + c);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kBwdColsPerThread; ++k) {
    const std::int64_t c = c0 + std::int64_t(k) * kBwdThreads;
    if (c < C) S::store(dwte, dst + c, acc[k]);
  }
}

void check_dims(const char* op, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t V) {
  cuda::require_fits(B, cuda::kMaxGridX, op, "B");
  cuda::require_fits(T, cuda::kMaxGridX, op, "T");
  cuda::require_fits(C, std::numeric_limits<std::int64_t>::max(), op, "C");
  cuda::require_fits(V, std::numeric_limits<std::int32_t>::max(), op, "V");
}

}  // namespace

// ---------------------------------------------------------------- launchers

void embedding_forward_cuda(void* out, const std::int32_t* tokens, const void* wte, std::int64_t B,
                            std::int64_t T, std::int64_t C, std::int64_t V, DType dt,
                            cudaStream_t stream) {
  check_dims("embedding_forward_cuda", B, T, C, V);
  const std::int64_t N = std::int64_t(checked_mul(B, T, "embedding_forward_cuda: B*T"));
  const std::int64_t total = std::int64_t(checked_mul(N, C, "embedding_forward_cuda: B*T*C"));
  if (total == 0) return;
  constexpr int kThreads = 256;
  TM_DISPATCH_STORAGE(
      dt, "embedding_forward_cuda",
      embedding_forward_kernel<S>
      <<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(out, tokens, wte, N, C, V);
      TM_CUDA_CHECK_LAUNCH());
}

void embedding_backward_cuda(void* dwte, const void* dout, const std::int32_t* tokens,
                             std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t V,
                             DType dt, cudaStream_t stream) {
  check_dims("embedding_backward_cuda", B, T, C, V);
  const std::int64_t N = std::int64_t(checked_mul(B, T, "embedding_backward_cuda: B*T"));
  if (N == 0 || C == 0) return;
  cuda::require_fits(N, cuda::kMaxGridX, "embedding_backward_cuda", "B*T");
  const std::int64_t col_blocks = (C + kBwdColsPerBlock - 1) / kBwdColsPerBlock;
  cuda::require_fits(col_blocks, cuda::kMaxGridY, "embedding_backward_cuda", "C / 2048");
  const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>(col_blocks));
  TM_DISPATCH_STORAGE(dt, "embedding_backward_cuda",
                      embedding_backward_kernel<S>
                      <<<grid, kBwdThreads, 0, stream>>>(dwte, dout, tokens, N, C, V);
                      TM_CUDA_CHECK_LAUNCH());
}

}  // namespace trainmem
