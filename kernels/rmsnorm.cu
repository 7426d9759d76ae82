// RMSNorm, forward and backward, on the GPU (LlamaRMSNorm: no mean subtraction).
//   rstd = 1/sqrt(mean(x^2) + eps), y = x * rstd * w;
//   dx_j += rstd*w_j*dy_j - x_j*rstd^3*dot/C with dot = sum_k dy_k*w_k*x_k;  dw_j += sum_n
//   dy*x*rstd.
// Activation gradients accumulate here (+=): the model sums the residual stream's gradient
// into dinp.
#include "cuda_common.cuh"
#include "rmsnorm.cuh"
#include "rmsnorm_math.hpp"
#include "trainmem/checked.hpp"

namespace trainmem {
namespace {

constexpr int kRowThreads = 256;

// ---------------------------------------------------------------- kernels

// grid N, block kRowThreads: one row per block.
template <class S>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_forward_kernel(void* out, float* rstd, const void* inp, const void* weight,
                           std::int64_t C, float eps) {
  __shared__ float scratch[32];
  const std::size_t base = std::size_t(blockIdx.x) * C;
  float sum_sq = 0.0f;
  for (std::int64_t c = threadIdx.x; c < C; c += kRowThreads) {
    const float x = S::load(inp, base + c);
    sum_sq += x * x;
  }
  sum_sq = cuda::block_sum(sum_sq, scratch);
  const float r = rmsnorm_rstd<float>(sum_sq, C, eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (std::int64_t c = threadIdx.x; c < C; c += kRowThreads) {
    S::store(out, base + c, rmsnorm_out<float>(S::load(inp, base + c), r, S::load(weight, c)));
  }
}

// grid N, block kRowThreads: dinp of one row per block.
template <class S>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_backward_dinp_kernel(void* dinp, const void* dout, const void* inp, const void* weight,
                                 const float* rstd, std::int64_t C) {
  __shared__ float scratch[32];
  const std::size_t base = std::size_t(blockIdx.x) * C;
  float dot = 0.0f;
  for (std::int64_t c = threadIdx.x; c < C; c += kRowThreads) {
    dot += rmsnorm_dot_term<float>(S::load(dout, base + c), S::load(weight, c),
                                   S::load(inp, base + c));
  }
  dot = cuda::block_sum(dot, scratch);
  const float r = rstd[blockIdx.x];
  for (std::int64_t c = threadIdx.x; c < C; c += kRowThreads) {
    const float dx = rmsnorm_dinp<float>(S::load(inp, base + c), S::load(weight, c),
                                         S::load(dout, base + c), r, dot, C);
    S::store(dinp, base + c, S::load(dinp, base + c) + dx);
  }
}

constexpr int kColX = 32;  // columns per block (a warp reads 32 consecutive elements)
constexpr int kColY = 16;  // row groups per block

// grid ceil(C/32), block (32, 16). Thread (x, y) sums rows n = y, y+16, ... of column c in
// fp32; the 16 partials are added in shared memory in a fixed order (deterministic).
template <class S>
__global__ void __launch_bounds__(kColX* kColY)
    rmsnorm_backward_dweight_kernel(void* dweight, const void* dout, const void* inp,
                                    const float* rstd, std::int64_t N, std::int64_t C) {
  __shared__ float partial[kColY][kColX + 1];
  const std::int64_t c = std::int64_t(blockIdx.x) * kColX + threadIdx.x;
  float acc = 0.0f;
  if (c < C) {
    for (std::int64_t n = threadIdx.y; n < N; n += kColY) {
      const std::size_t i = std::size_t(n) * C + c;
      acc += rmsnorm_dweight_term<float>(S::load(inp, i), S::load(dout, i), rstd[n]);
    }
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sum = 0.0f;
#pragma unroll
    for (int y = 0; y < kColY; ++y) sum += partial[y][threadIdx.x];
    S::store(dweight, c, S::load(dweight, c) + sum);
  }
}

void check_dims(const char* op, std::int64_t N, std::int64_t C) {
  cuda::require_fits(N, cuda::kMaxGridX, op, "N (rows)");
  cuda::require_fits(C, cuda::kMaxGridX, op, "C");
  checked_mul(N, C, op);
}

}  // namespace

// ---------------------------------------------------------------- launchers

void rmsnorm_forward_cuda(void* out, float* rstd, const void* inp, const void* weight,
                          std::int64_t N, std::int64_t C, float eps, DType dt,
                          cudaStream_t stream) {
  check_dims("rmsnorm_forward_cuda", N, C);
  if (N == 0) return;
  cuda::require_positive(C, "rmsnorm_forward_cuda", "C");
  TM_DISPATCH_STORAGE(dt, "rmsnorm_forward_cuda",
                      rmsnorm_forward_kernel<S>
                      <<<unsigned(N), kRowThreads, 0, stream>>>(out, rstd, inp, weight, C, eps);
                      TM_CUDA_CHECK_LAUNCH());
}

void rmsnorm_backward_cuda(void* dinp, void* dweight, const void* dout, const void* inp,
                           const void* weight, const float* rstd, std::int64_t N, std::int64_t C,
                           DType dt, cudaStream_t stream) {
  check_dims("rmsnorm_backward_cuda", N, C);
  if (N == 0 || C == 0) return;
  const dim3 col_block(kColX, kColY);
  const unsigned col_grid = unsigned((C + kColX - 1) / kColX);
  TM_DISPATCH_STORAGE(dt, "rmsnorm_backward_cuda",
                      rmsnorm_backward_dinp_kernel<S>
                      <<<unsigned(N), kRowThreads, 0, stream>>>(dinp, dout, inp, weight, rstd, C);
                      TM_CUDA_CHECK_LAUNCH(); rmsnorm_backward_dweight_kernel<S>
                      <<<col_grid, col_block, 0, stream>>>(dweight, dout, inp, rstd, N, C);
                      TM_CUDA_CHECK_LAUNCH());
}

}  // namespace trainmem
