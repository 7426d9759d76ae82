// AdamW and SGD (and LOMO, which is SGD applied inside backward) on the GPU: one thread per
// element, grid-stride, fp32 math on the fp32 master value (or on the parameter itself).
#include "adamw/adamw.hpp"
#include "adamw/adamw_kernels.cuh"
#include "adamw/adamw_math.hpp"
#include "common/cuda_common.cuh"

namespace trainmem {
namespace {

constexpr int kThreads = cuda::kElementwiseThreads;

}  // namespace

// ---------------------------------------------------------------- launchers

void adamw_update_cuda(void* param, const void* grad, float* master, float* m, float* v,
                       std::int64_t n, const AdamWParams& hp, int step, float grad_scale, DType dt,
                       cudaStream_t stream) {
  cuda::require_fits(n, std::numeric_limits<std::int64_t>::max(), "adamw_update_cuda", "n");
  if (step < 1)
    throw InputError("adamw_update_cuda: step must be >= 1 (bias correction), got " +
                     std::to_string(step));
  if (n == 0) return;
  const AdamWStepConsts c =
      adamw_step_consts(hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, step);
  dispatch_storage(dt, "adamw_update_cuda", [&](auto tag) {
    cuda::adamw_kernel<decltype(tag)><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
        param, grad, master, m, v, n, c, grad_scale);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void sgd_update_cuda(void* param, const void* grad, float* master, std::int64_t n, float lr,
                     float grad_scale, DType dt, cudaStream_t stream) {
  cuda::require_fits(n, std::numeric_limits<std::int64_t>::max(), "sgd_update_cuda", "n");
  if (n == 0) return;
  dispatch_storage(dt, "sgd_update_cuda", [&](auto tag) {
    cuda::sgd_kernel<decltype(tag)><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
        param, grad, master, n, lr, grad_scale);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace trainmem
