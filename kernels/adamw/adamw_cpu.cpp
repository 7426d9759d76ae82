// Optimizer updates, CPU reference (math in adamw_math.hpp): elementwise, in parallel. The
// per-step constants (bias corrections) are computed once on the host in double.
// The loop runs in chunks of kChunk elements; each chunk is one call of adamw_chunk, compiled
// twice: for the baseline x86-64 and, chosen at run time on CPUs with AVX-512 (F, BW, VL),
// with 16-wide vectors. Both compute every element with the same IEEE operations in the same
// order (fp-contract=off: no fused multiply-add; sqrt and division are exact in either), so the
// bits do not depend on the variant, the chunking or the team size.
#include <algorithm>
#include <string>

#include "adamw/adamw.hpp"
#include "adamw/adamw_math.hpp"
#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

constexpr std::int64_t kChunk = 1 << 14;

// Elements lo..hi. The master / no-master cases are separate loops so that each vectorises.
template <class S>
inline __attribute__((always_inline)) void adamw_chunk(void* param, const void* grad, float* master,
                                                       float* m, float* v, std::int64_t lo,
                                                       std::int64_t hi, const AdamWStepConsts& k,
                                                       float grad_scale) {
  const float beta1 = k.beta1, beta2 = k.beta2, eps = k.eps, step_size = k.step_size,
              inv_sqrt_bc2 = k.inv_sqrt_bc2, decay = k.decay;
  if (master) {
    for (std::int64_t i = lo; i < hi; ++i) {
      float p = master[i];
      adamw_update_elem(&p, &m[i], &v[i], unscaled_grad(S::load(grad, i), grad_scale), beta1, beta2,
                        eps, step_size, inv_sqrt_bc2, decay);
      master[i] = p;
      S::store(param, i, p);
    }
  } else {
    for (std::int64_t i = lo; i < hi; ++i) {
      float p = S::load(param, i);
      adamw_update_elem(&p, &m[i], &v[i], unscaled_grad(S::load(grad, i), grad_scale), beta1, beta2,
                        eps, step_size, inv_sqrt_bc2, decay);
      S::store(param, i, p);
    }
  }
}

template <class S>
__attribute__((noinline)) void adamw_chunk_base(void* param, const void* grad, float* master,
                                                float* m, float* v, std::int64_t lo,
                                                std::int64_t hi, const AdamWStepConsts& k,
                                                float grad_scale) {
  adamw_chunk<S>(param, grad, master, m, v, lo, hi, k, grad_scale);
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")
#pragma GCC optimize("fp-contract=off")
template <class S>
__attribute__((noinline)) void adamw_chunk_avx512(void* param, const void* grad, float* master,
                                                  float* m, float* v, std::int64_t lo,
                                                  std::int64_t hi, const AdamWStepConsts& k,
                                                  float grad_scale) {
  adamw_chunk<S>(param, grad, master, m, v, lo, hi, k, grad_scale);
}
#pragma GCC pop_options

bool cpu_has_avx512bw() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return has;
}

template <class S>
void adamw_impl(void* param, const void* grad, float* master, float* m, float* v, std::int64_t n,
                const AdamWStepConsts& k, float grad_scale) {
  const bool wide = cpu_has_avx512bw();
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    if (wide)
      adamw_chunk_avx512<S>(param, grad, master, m, v, lo, hi, k, grad_scale);
    else
      adamw_chunk_base<S>(param, grad, master, m, v, lo, hi, k, grad_scale);
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
