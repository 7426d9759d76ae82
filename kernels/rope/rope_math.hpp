// RoPE, HuggingFace rotate-half convention. For a head vector x of d elements and position
// pos, the pairs are (x_j, x_{j+d/2}) for j < d/2, rotated by angle pos * inv_freq[j]:
//   y_j        = x_j * cos - x_{j+d/2} * sin
//   y_{j+d/2} = x_{j+d/2} * cos + x_j * sin
// with inv_freq[j] = 1 / theta^(2j / d). The rotation is orthogonal, so its backward (the
// transpose) is the rotation by -angle.
// The angle is computed in fp32 as HuggingFace does (inv_freq and pos * inv_freq are fp32
// tensors there); rope_angle<double> exists for tests.
//
// Scaling (RopeScaling of op_types.hpp): `llama3` rescales inv_freq as HuggingFace's
// _compute_llama3_parameters does, in its fp32 tensor arithmetic, op by op (docs/formulas.md,
// "RoPE scaling (llama3)"). With L = original_max_positions, lo = low_freq_factor,
// hi = high_freq_factor, f = factor, all fp32 as PyTorch sees the Python scalars:
//   wavelen = (1 / inv_freq) * 2π                         (PyTorch's scalar / tensor is
//                                                          reciprocal(tensor) * scalar)
//   inv_l   = wavelen > L/lo ? inv_freq / f : inv_freq
//   smooth  = ((1 / wavelen) * L - lo) / (hi - lo)
//   smoothed = (1 - smooth) * inv_l / f + smooth * inv_l
//   result  = (!(wavelen < L/hi) && !(wavelen > L/lo)) ? smoothed : inv_l
// L/lo, L/hi and hi - lo are Python double arithmetic rounded to fp32 once.
#pragma once
#include <cstdint>

#include "common/common_math.hpp"
#include "trainmem/base/op_types.hpp"

namespace trainmem {

template <class T>
TM_HD T rope_inv_freq(std::int64_t j, std::int64_t d, T theta) {
  return T(1) / tm_pow(theta, T(2 * j) / T(d));
}
template <class T>
TM_HD T rope_angle(std::int64_t pos, std::int64_t j, std::int64_t d, T theta) {
  return T(pos) * rope_inv_freq<T>(j, d, theta);
}
// Rotates the pair (x1 = x_j, x2 = x_{j+d/2}) in place by the angle with cosine c, sine s.
// Pass -s for the backward (inverse) rotation.
template <class T>
TM_HD void rope_rotate_pair(T* x1, T* x2, T c, T s) {
  const T a = *x1, b = *x2;
  *x1 = a * c - b * s;
  *x2 = b * c + a * s;
}

// The fp32 constants of the frequency rule, prepared on the host (rope_freq_params) and passed
// by value to the CUDA kernel.
struct RopeFreqParams {
  float theta = 10000.0f;
  bool llama3 = false;
  float factor = 1.0f;             // f
  float low_freq_factor = 1.0f;    // lo
  float old_context_len = 0.0f;    // L
  float low_freq_wavelen = 0.0f;   // L / lo
  float high_freq_wavelen = 0.0f;  // L / hi
  float band = 1.0f;               // hi - lo
  float two_pi = 0.0f;             // 2π rounded to fp32
};

inline RopeFreqParams rope_freq_params(const RopeSpec& rope) {
  RopeFreqParams p;
  p.theta = float(rope.theta);
  if (rope.scaling.kind == RopeScalingKind::llama3) {
    const RopeScaling& sc = rope.scaling;
    const double old_len = double(sc.original_max_positions);
    p.llama3 = true;
    p.factor = float(sc.factor);
    p.low_freq_factor = float(sc.low_freq_factor);
    p.old_context_len = float(old_len);
    p.low_freq_wavelen = float(old_len / sc.low_freq_factor);
    p.high_freq_wavelen = float(old_len / sc.high_freq_factor);
    p.band = float(sc.high_freq_factor - sc.low_freq_factor);
    p.two_pi = float(2.0 * 3.141592653589793);
  }
  return p;
}

// inv_freq[j] after the scaling of p (fp32, HF's operation order; the identity when p.llama3 is
// false).
TM_HD float rope_scaled_inv_freq(std::int64_t j, std::int64_t d, const RopeFreqParams& p) {
  const float inv = rope_inv_freq<float>(j, d, p.theta);
  if (!p.llama3) return inv;
  const float wavelen = tm_mul_rn(1.0f / inv, p.two_pi);
  const float inv_l = wavelen > p.low_freq_wavelen ? inv / p.factor : inv;
  const float smooth = (tm_mul_rn(1.0f / wavelen, p.old_context_len) - p.low_freq_factor) / p.band;
  const float smoothed = (1.0f - smooth) * inv_l / p.factor + tm_mul_rn(smooth, inv_l);
  const bool medium = !(wavelen < p.high_freq_wavelen) && !(wavelen > p.low_freq_wavelen);
  return medium ? smoothed : inv_l;
}
TM_HD float rope_scaled_angle(std::int64_t pos, std::int64_t j, std::int64_t d,
                              const RopeFreqParams& p) {
  return float(pos) * rope_scaled_inv_freq(j, d, p);
}

}  // namespace trainmem
