// RMSNorm, forward and backward, on the GPU (LlamaRMSNorm: no mean subtraction).
//   rstd = 1/sqrt(mean(x^2) + eps), y = x * rstd * w;
//   dx_j += rstd*w_j*dy_j - x_j*rstd^3*dot/h with dot = sum_k dy_k*w_k*x_k;  dw_j += sum_n
//   dy*x*rstd.
// Activation gradients accumulate here (+=): the model sums the residual stream's gradient
// into dinp.
#include "common/cuda_common.cuh"
#include "rmsnorm/rmsnorm.hpp"
#include "rmsnorm/rmsnorm_kernels.cuh"
#include "rmsnorm/rmsnorm_math.hpp"
#include "trainmem/base/checked.hpp"

namespace trainmem {
namespace {

void check_dims(const char* op, std::int64_t n, std::int64_t h) {
  cuda::require_fits(n, cuda::kMaxGridX, op, "n (rows)");
  cuda::require_fits(h, cuda::kMaxGridX, op, "h");
  checked_mul(n, h, op);
}

}  // namespace

// ---------------------------------------------------------------- launchers

void rmsnorm_forward_cuda(void* out, float* rstd, const void* inp, const void* weight,
                          std::int64_t n, std::int64_t h, float eps, DType dt,
                          cudaStream_t stream) {
  check_dims("rmsnorm_forward_cuda", n, h);
  if (n == 0) return;
  cuda::require_positive(h, "rmsnorm_forward_cuda", "h");
  const cuda::LaunchShape L = cuda::rmsnorm_row_launch(n, "rmsnorm_forward_cuda");
  dispatch_storage(dt, "rmsnorm_forward_cuda", [&](auto tag) {
    cuda::rmsnorm_forward_kernel<decltype(tag)>
        <<<cuda::grid_of(L), cuda::block_of(L), 0, stream>>>(out, rstd, inp, weight, h, eps);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void rmsnorm_backward_cuda(void* dinp, void* dweight, const void* dout, const void* inp,
                           const void* weight, const float* rstd, std::int64_t n, std::int64_t h,
                           DType dt, cudaStream_t stream) {
  check_dims("rmsnorm_backward_cuda", n, h);
  if (n == 0 || h == 0) return;
  const cuda::LaunchShape rows = cuda::rmsnorm_row_launch(n, "rmsnorm_backward_cuda");
  const cuda::LaunchShape cols = cuda::rmsnorm_dweight_launch(h, "rmsnorm_backward_cuda");
  dispatch_storage(dt, "rmsnorm_backward_cuda", [&](auto tag) {
    using S = decltype(tag);
    cuda::rmsnorm_backward_dinp_kernel<S><<<cuda::grid_of(rows), cuda::block_of(rows), 0, stream>>>(
        dinp, dout, inp, weight, rstd, h);
    TM_CUDA_CHECK_LAUNCH();
    if (!dweight) return;  // a frozen weight (LoRA's base): no gradient
    cuda::rmsnorm_backward_dweight_kernel<S>
        <<<cuda::grid_of(cols), cuda::block_of(cols), 0, stream>>>(dweight, dout, inp, rstd, n, h);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace trainmem
