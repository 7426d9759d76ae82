// AdamW and SGD (and LOMO, which is SGD applied inside backward) on the GPU: one thread per
// element, grid-stride, fp32 math on the fp32 master value (or on the parameter itself).
#include "adamw.cuh"
#include "adamw_math.hpp"
#include "cuda_common.cuh"

namespace trainmem {
namespace {

constexpr int kThreads = 256;

// ---------------------------------------------------------------- kernels

template <class S>
__global__ void adamw_kernel(void* param, const void* grad, float* master, float* m, float* v,
                             std::int64_t n, AdamWStepConsts c) {
  for (std::int64_t i = cuda::global_thread_index(); i < n; i += cuda::global_thread_count()) {
    float p = master != nullptr ? master[i] : S::load(param, i);
    float mi = m[i];
    float vi = v[i];
    adamw_update_elem<float>(&p, &mi, &vi, S::load(grad, i), c.beta1, c.beta2, c.eps, c.step_size,
                             c.inv_sqrt_bc2, c.decay);
    m[i] = mi;
    v[i] = vi;
    if (master != nullptr) master[i] = p;
    S::store(param, i, p);
  }
}

template <class S>
__global__ void sgd_kernel(void* param, const void* grad, float* master, std::int64_t n, float lr) {
  for (std::int64_t i = cuda::global_thread_index(); i < n; i += cuda::global_thread_count()) {
    const float p0 = master != nullptr ? master[i] : S::load(param, i);
    const float p = sgd_update_elem<float>(p0, S::load(grad, i), lr);
    if (master != nullptr) master[i] = p;
    S::store(param, i, p);
  }
}

}  // namespace

// ---------------------------------------------------------------- launchers

void adamw_update_cuda(void* param, const void* grad, float* master, float* m, float* v,
                       std::int64_t n, const AdamWParams& hp, int step, DType dt,
                       cudaStream_t stream) {
  cuda::require_fits(n, std::numeric_limits<std::int64_t>::max(), "adamw_update_cuda", "n");
  if (step < 1)
    throw InputError("adamw_update_cuda: step must be >= 1 (bias correction), got " +
                     std::to_string(step));
  if (n == 0) return;
  const AdamWStepConsts c =
      adamw_step_consts(hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, step);
  TM_DISPATCH_STORAGE(dt, "adamw_update_cuda",
                      adamw_kernel<S><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
                          param, grad, master, m, v, n, c);
                      TM_CUDA_CHECK_LAUNCH());
}

void sgd_update_cuda(void* param, const void* grad, float* master, std::int64_t n, float lr,
                     DType dt, cudaStream_t stream) {
  cuda::require_fits(n, std::numeric_limits<std::int64_t>::max(), "sgd_update_cuda", "n");
  if (n == 0) return;
  TM_DISPATCH_STORAGE(dt, "sgd_update_cuda",
                      sgd_kernel<S><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
                          param, grad, master, n, lr);
                      TM_CUDA_CHECK_LAUNCH());
}

}  // namespace trainmem
