// Optimizer updates, CPU reference (math in adamw_math.hpp): elementwise, in parallel. The
// per-step constants (bias corrections) are computed once on the host in double.
#include <string>

#include "adamw/adamw.hpp"
#include "adamw/adamw_math.hpp"
#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "trainmem/error.hpp"

namespace trainmem {
namespace {

template <class S>
void adamw_impl(void* param, const void* grad, float* master, float* m, float* v, std::int64_t n,
                const AdamWStepConsts& k, float grad_scale) {
#pragma omp parallel for if (n >= kParallelMinElements)
  for (std::int64_t i = 0; i < n; ++i) {
    float p = master ? master[i] : S::load(param, i);
    adamw_update_elem(&p, &m[i], &v[i], unscaled_grad(S::load(grad, i), grad_scale), k.beta1,
                      k.beta2, k.eps, k.step_size, k.inv_sqrt_bc2, k.decay);
    if (master) master[i] = p;
    S::store(param, i, p);
  }
}

template <class S>
void sgd_impl(void* param, const void* grad, float* master, std::int64_t n, float lr,
              float grad_scale) {
#pragma omp parallel for if (n >= kParallelMinElements)
  for (std::int64_t i = 0; i < n; ++i) {
    float p = master ? master[i] : S::load(param, i);
    p = sgd_update_elem(p, unscaled_grad(S::load(grad, i), grad_scale), lr);
    if (master) master[i] = p;
    S::store(param, i, p);
  }
}

}  // namespace

void adamw_update_cpu(void* param, const void* grad, float* master, float* m, float* v,
                      std::int64_t n, const AdamWParams& hp, int step, float grad_scale, DType dt) {
  cpu_threads_setup();
  if (step < 1) throw InputError("adamw: step must be >= 1, got " + std::to_string(step));
  const AdamWStepConsts k =
      adamw_step_consts(hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, step);
  dispatch_storage(dt, "adamw_update", [&](auto tag) {
    adamw_impl<decltype(tag)>(param, grad, master, m, v, n, k, grad_scale);
  });
}

void sgd_update_cpu(void* param, const void* grad, float* master, std::int64_t n, float lr,
                    float grad_scale, DType dt) {
  cpu_threads_setup();
  dispatch_storage(dt, "sgd_update", [&](auto tag) {
    sgd_impl<decltype(tag)>(param, grad, master, n, lr, grad_scale);
  });
}

}  // namespace trainmem
