// bitsandbytes' AdamW8bit update (and the fp32-state update it uses for tensors under 4,096
// elements), per element and per 256-element block, shared by the CPU reference
// (adamw8bit_cpu.cpp) and the CUDA kernels (adamw8bit_kernels.cuh). The arithmetic is the one
// bitsandbytes 0.50.2 runs on the CPU (`_optimizer_update_8bit_blockwise_cpu` and
// `_optimizer_update_32bit_cpu`, torch operations in fp32), operation by operation:
//
//   g = grad in fp32 * gnorm_scale;  p = param in fp32     (g.float() * gnorm_scale)
//   m <- fma(g, 1 - b1, m * b1)               state1.mul_(b1).add_(g, alpha=1-b1)
//   v <- fma((1 - b2) * g, g, v * b2)          state2.mul_(b2).addcmul_(g, g, value=1-b2)
//   c1 = 1 - b1^t, c2 = sqrt(1 - b2^t)         (in double, as Python computes them)
//   8-bit:  d = sqrt(v) / c2 + eps;  p <- p * (1 - lr*wd);  p <- p + ((-lr / c1) * m) / d
//   fp32:   d = sqrt(v) + eps*c2;    p <- p * (1 - lr*wd);  p <- fma(m / d, -lr*c2/c1, p)
//   (the decay only when wd > 0). The 8-bit states are dequantized first (code[q] * absmax of
//   the block) and quantized again after the update, each moment with its own absmax per block
//   of 256 (quant4_math.hpp: quantize_blockwise8_block), the first with the signed dynamic map,
//   the second with the unsigned one.
//
// One difference stays: torch computes sqrt on the CPU with MKL's vectorized routine, which is
// not correctly rounded; here sqrt is IEEE (sqrtf). The denominator can then differ in its last
// bit, and so the parameter (the states are unaffected: they do not depend on it). The test
// states it (tests/test_ops_quant.cpp: every moment, absmax and code bit for bit; the parameter
// within one ulp).
#pragma once
#include <cstdint>

#include "common/common_math.hpp"
#include "quant4/quant4_math.hpp"
#include "trainmem/base/op_types.hpp"

namespace trainmem {

// The fp32 constants of step t (>= 1), converted from double as torch converts a Python scalar.
struct BnbAdamWConsts {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float decay;  // 1 - lr*wd
  bool decay_on;
  float c2;         // sqrt(1 - b2^t)           (8-bit)
  float eps;        //                          (8-bit)
  float neg_lr_c1;  // -lr / c1                 (8-bit)
  float eps_c2;     // eps * c2                 (fp32 states)
  float step_size;  // -lr * c2 / c1            (fp32 states)
  float gnorm_scale;
};
inline BnbAdamWConsts bnb_adamw_consts(const BnbAdamWParams& hp, int step) {
  const double c1 = 1.0 - ::pow(hp.beta1, double(step));
  const double c2 = ::sqrt(1.0 - ::pow(hp.beta2, double(step)));
  BnbAdamWConsts c;
  c.beta1 = float(hp.beta1);
  c.one_minus_beta1 = float(1.0 - hp.beta1);
  c.beta2 = float(hp.beta2);
  c.one_minus_beta2 = float(1.0 - hp.beta2);
  c.decay = float(1.0 - hp.lr * hp.weight_decay);
  c.decay_on = hp.weight_decay > 0.0;
  c.c2 = float(c2);
  c.eps = float(hp.eps);
  c.neg_lr_c1 = float(-hp.lr / c1);
  c.eps_c2 = float(hp.eps * c2);
  c.step_size = float(-hp.lr * c2 / c1);
  c.gnorm_scale = hp.gnorm_scale;
  return c;
}

// The moments after gradient g.
TM_HD void bnb_adam_moments(float g, float* m, float* v, const BnbAdamWConsts& c) {
  g = tm_mul_rn(g, c.gnorm_scale);
  *m = ::fmaf(g, c.one_minus_beta1, tm_mul_rn(*m, c.beta1));
  *v = ::fmaf(tm_mul_rn(c.one_minus_beta2, g), g, tm_mul_rn(*v, c.beta2));
}

// The parameter after the 8-bit update with the new moments m, v.
TM_HD float bnb_adamw8bit_param(float p, float m, float v, const BnbAdamWConsts& c) {
  const float d = ::sqrtf(v) / c.c2 + c.eps;
  if (c.decay_on) p = tm_mul_rn(p, c.decay);
  return p + tm_mul_rn(c.neg_lr_c1, m) / d;
}

// The parameter after the fp32-state update with the new moments m, v.
TM_HD float bnb_adamw32_param(float p, float m, float v, const BnbAdamWConsts& c) {
  const float u = m / (::sqrtf(v) + c.eps_c2);
  if (c.decay_on) p = tm_mul_rn(p, c.decay);
  return ::fmaf(u, c.step_size, p);
}

// One 256-element block b of the 8-bit update (n elements in all): the parameter (storage S)
// updated, the states dequantized, updated and quantized again with their new absmax. Two
// passes over the block: the first updates the parameter and finds the new absmax of each
// moment, the second computes the same moments again (same inputs, same bits) and quantizes them
// (no block-sized scratch).
template <class S>
TM_HD void bnb_adamw8bit_block(void* param, const void* grad, std::uint8_t* s1, std::uint8_t* s2,
                               float* absmax1, float* absmax2, const float* qmap1,
                               const float* qmap2, const std::uint8_t* lut1,
                               const std::uint8_t* lut2, std::int64_t n, std::int64_t b,
                               const BnbAdamWConsts& c) {
  constexpr std::int64_t kBlock = 256;
  const std::int64_t lo = b * kBlock, hi = lo + kBlock < n ? lo + kBlock : n;
  const float a1 = absmax1[b], a2 = absmax2[b];
  auto moments = [&](std::int64_t i, float* m, float* v) {
    *m = tm_mul_rn(qmap1[s1[i]], a1);
    *v = tm_mul_rn(qmap2[s2[i]], a2);
    bnb_adam_moments(S::load(grad, std::size_t(i)), m, v, c);
  };
  float am1 = 0.0f, am2 = 0.0f;
  for (std::int64_t i = lo; i < hi; ++i) {
    float m, v;
    moments(i, &m, &v);
    const float p = bnb_adamw8bit_param(S::load(param, std::size_t(i)), m, v, c);
    S::store(param, std::size_t(i), p);
    const float x1 = ::fabsf(m), x2 = ::fabsf(v);
    if (x1 > am1) am1 = x1;
    if (x2 > am2) am2 = x2;
  }
  const float inv1 = 1.0f / am1, inv2 = 1.0f / am2;
  for (std::int64_t i = lo; i < hi; ++i) {
    float m, v;
    moments(i, &m, &v);
    s1[i] = am1 == 0.0f ? std::uint8_t(0) : lut1[blockwise8_lut_index(tm_mul_rn(m, inv1))];
    s2[i] = am2 == 0.0f ? std::uint8_t(0) : lut2[blockwise8_lut_index(tm_mul_rn(v, inv2))];
  }
  absmax1[b] = am1;
  absmax2[b] = am2;
}

}  // namespace trainmem
