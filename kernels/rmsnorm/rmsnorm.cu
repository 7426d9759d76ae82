// RMSNorm, forward and backward, on the GPU (LlamaRMSNorm: no mean subtraction).
//   rstd = 1/sqrt(mean(x^2) + eps), y = x * rstd * w;
//   dx_j += rstd*w_j*dy_j - x_j*rstd^3*dot/C with dot = sum_k dy_k*w_k*x_k;  dw_j += sum_n
//   dy*x*rstd.
// Activation gradients accumulate here (+=): the model sums the residual stream's gradient
// into dinp.
#include "common/cuda_common.cuh"
#include "rmsnorm/rmsnorm.hpp"
#include "rmsnorm/rmsnorm_kernels.cuh"
#include "rmsnorm/rmsnorm_math.hpp"
#include "trainmem/checked.hpp"

namespace trainmem {
namespace {

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
  const cuda::LaunchShape L = cuda::rmsnorm_row_launch(N, "rmsnorm_forward_cuda");
  dispatch_storage(dt, "rmsnorm_forward_cuda", [&](auto s) {
    cuda::rmsnorm_forward_kernel<decltype(s)>
        <<<cuda::grid_of(L), cuda::block_of(L), 0, stream>>>(out, rstd, inp, weight, C, eps);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void rmsnorm_backward_cuda(void* dinp, void* dweight, const void* dout, const void* inp,
                           const void* weight, const float* rstd, std::int64_t N, std::int64_t C,
                           DType dt, cudaStream_t stream) {
  check_dims("rmsnorm_backward_cuda", N, C);
  if (N == 0 || C == 0) return;
  const cuda::LaunchShape rows = cuda::rmsnorm_row_launch(N, "rmsnorm_backward_cuda");
  const cuda::LaunchShape cols = cuda::rmsnorm_dweight_launch(C, "rmsnorm_backward_cuda");
  dispatch_storage(dt, "rmsnorm_backward_cuda", [&](auto s) {
    using S = decltype(s);
    cuda::rmsnorm_backward_dinp_kernel<S><<<cuda::grid_of(rows), cuda::block_of(rows), 0, stream>>>(
        dinp, dout, inp, weight, rstd, C);
    TM_CUDA_CHECK_LAUNCH();
    cuda::rmsnorm_backward_dweight_kernel<S>
        <<<cuda::grid_of(cols), cuda::block_of(cols), 0, stream>>>(dweight, dout, inp, rstd, N, C);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace trainmem
