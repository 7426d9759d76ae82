// Cross-entropy, forward and backward, on the GPU. One block per row of logits: the forward
// folds the row into an online log-sum-exp state per thread (one pass over V), merges the
// states across the block, then writes lse and the loss; the backward writes
// scale * (exp(x - lse) - onehot) per element.
#include "cross_entropy.cuh"
#include "cross_entropy_math.hpp"
#include "cuda_common.cuh"
#include "trainmem/checked.hpp"

namespace trainmem {
namespace {

constexpr int kFwdThreads = 512;
constexpr int kBwdThreads = 512;

__device__ __forceinline__ LseState<float> warp_lse_merge(LseState<float> s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    LseState<float> other;
    other.max = __shfl_xor_sync(cuda::kFullMask, s.max, o);
    other.sum = __shfl_xor_sync(cuda::kFullMask, s.sum, o);
    s = lse_merge<float>(s, other);
  }
  return s;
}

// ---------------------------------------------------------------- kernels

// grid N, block kFwdThreads.
template <class S>
__global__ void __launch_bounds__(kFwdThreads)
    cross_entropy_forward_kernel(float* losses, float* lse, const void* logits,
                                 const std::int32_t* targets, std::int64_t V) {
  __shared__ float s_max[32];
  __shared__ float s_sum[32];
  const std::int64_t n = blockIdx.x;
  const std::size_t base = std::size_t(n) * V;
  LseState<float> st = LseState<float>::empty();
  for (std::int64_t j = threadIdx.x; j < V; j += kFwdThreads)
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
    constexpr int kWarps = kFwdThreads / 32;
    st = LseState<float>::empty();
    if (lane < kWarps) st = LseState<float>{s_max[lane], s_sum[lane]};
    st = warp_lse_merge(st);
    if (lane == 0) {
      const float row_lse = lse_finish<float>(st);
      lse[n] = row_lse;
      const std::int32_t t = targets[n];
      float loss = 0.0f;
      if (t >= V) {
        loss = __int_as_float(0x7fc00000);  // NaN: an invalid target must not pass silently
      } else if (t >= 0) {
        loss = cross_entropy_loss<float>(row_lse, S::load(logits, base + t));
      }
      losses[n] = loss;
    }
  }
}

// grid N, block kBwdThreads.
template <class S>
__global__ void __launch_bounds__(kBwdThreads)
    cross_entropy_backward_kernel(void* dlogits, const void* logits, const float* lse,
                                  const std::int32_t* targets, std::int64_t V, float scale) {
  const std::int64_t n = blockIdx.x;
  const std::size_t base = std::size_t(n) * V;
  const std::int32_t t = targets[n];
  const float row_lse = lse[n];
  for (std::int64_t j = threadIdx.x; j < V; j += kBwdThreads) {
    float d;
    if (t < 0) {
      d = 0.0f;
    } else if (t >= V) {
      d = __int_as_float(0x7fc00000);
    } else {
      d = cross_entropy_dlogit<float>(S::load(logits, base + j), row_lse, j == t, scale);
    }
    S::store(dlogits, base + j, d);  // same element, same thread: in place is safe
  }
}

void check_dims(const char* op, std::int64_t N, std::int64_t V) {
  cuda::require_fits(N, cuda::kMaxGridX, op, "N (rows)");
  cuda::require_fits(V, std::numeric_limits<std::int32_t>::max(), op, "V");
  checked_mul(N, V, op);
}

}  // namespace

// ---------------------------------------------------------------- launchers

void cross_entropy_forward_cuda(float* losses, float* lse, const void* logits,
                                const std::int32_t* targets, std::int64_t N, std::int64_t V,
                                DType dt, cudaStream_t stream) {
  check_dims("cross_entropy_forward_cuda", N, V);
  if (N == 0) return;
  cuda::require_positive(V, "cross_entropy_forward_cuda", "V");
  TM_DISPATCH_STORAGE(dt, "cross_entropy_forward_cuda",
                      cross_entropy_forward_kernel<S>
                      <<<unsigned(N), kFwdThreads, 0, stream>>>(losses, lse, logits, targets, V);
                      TM_CUDA_CHECK_LAUNCH());
}

void cross_entropy_backward_cuda(void* dlogits, const void* logits, const float* lse,
                                 const std::int32_t* targets, std::int64_t N, std::int64_t V,
                                 float scale, DType dt, cudaStream_t stream) {
  check_dims("cross_entropy_backward_cuda", N, V);
  if (N == 0 || V == 0) return;
  TM_DISPATCH_STORAGE(dt, "cross_entropy_backward_cuda",
                      cross_entropy_backward_kernel<S><<<unsigned(N), kBwdThreads, 0, stream>>>(
                          dlogits, logits, lse, targets, V, scale);
                      TM_CUDA_CHECK_LAUNCH());
}

}  // namespace trainmem
