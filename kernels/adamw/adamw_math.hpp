// Optimizer updates, per element, in fp32 on the fp32 master value (or on the parameter
// itself when the training dtype is fp32).
// AdamW (PyTorch's torch.optim.AdamW, decoupled weight decay, bias correction, step t >= 1):
//   p <- p * (1 - lr * wd)
//   m <- b1 * m + (1 - b1) * g;   v <- b2 * v + (1 - b2) * g^2
//   p <- p - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),  bc1 = 1 - b1^t, bc2 = 1 - b2^t.
// SGD (no momentum) and LOMO's fused update: p <- p - lr * g.
// Both see g = stored gradient * grad_scale (fp32): a run with a static loss scale S stores
// S-times gradients and passes grad_scale = 1/S (docs/decisions.md, "fp16 loss scale").
// grad_scale 1 leaves every value as it was, bit for bit (x * 1.0f == x in IEEE arithmetic).
#pragma once
#include "common/common_math.hpp"

namespace trainmem {

// Per-step constants, computed once on the host in double (as PyTorch does in Python).
struct AdamWStepConsts {
  float lr, beta1, beta2, eps, weight_decay;
  float step_size;     // lr / bc1
  float inv_sqrt_bc2;  // 1 / sqrt(bc2)
  float decay;         // 1 - lr * wd
};
inline AdamWStepConsts adamw_step_consts(float lr, float beta1, float beta2, float eps,
                                         float weight_decay, int step) {
  const double bc1 = 1.0 - ::pow(double(beta1), double(step));
  const double bc2 = 1.0 - ::pow(double(beta2), double(step));
  AdamWStepConsts c;
  c.lr = lr;
  c.beta1 = beta1;
  c.beta2 = beta2;
  c.eps = eps;
  c.weight_decay = weight_decay;
  c.step_size = float(double(lr) / bc1);
  c.inv_sqrt_bc2 = float(1.0 / ::sqrt(bc2));
  c.decay = float(1.0 - double(lr) * double(weight_decay));
  return c;
}

// Updates p, m, v in place for gradient g.
template <class T>
TM_HD void adamw_update_elem(T* p, T* m, T* v, T g, T beta1, T beta2, T eps, T step_size,
                             T inv_sqrt_bc2, T decay) {
  *m = beta1 * *m + (T(1) - beta1) * g;
  *v = beta2 * *v + (T(1) - beta2) * g * g;
  const T denom = tm_sqrt(*v) * inv_sqrt_bc2 + eps;
  *p = *p * decay - step_size * (*m / denom);
}

// The gradient the update uses, from the stored one (loaded as fp32).
template <class T>
TM_HD T unscaled_grad(T stored, T grad_scale) {
  return stored * grad_scale;
}

template <class T>
TM_HD T sgd_update_elem(T p, T g, T lr) {
  return p - lr * g;
}

}  // namespace trainmem
