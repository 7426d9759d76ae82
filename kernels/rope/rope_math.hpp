// RoPE, HuggingFace rotate-half convention. For a head vector x of d elements and position
// pos, the pairs are (x_j, x_{j+d/2}) for j < d/2, rotated by angle pos * inv_freq[j]:
//   y_j        = x_j * cos - x_{j+d/2} * sin
//   y_{j+d/2} = x_{j+d/2} * cos + x_j * sin
// with inv_freq[j] = 1 / theta^(2j / d). The rotation is orthogonal, so its backward (the
// transpose) is the rotation by -angle.
// The angle is computed in fp32 as HuggingFace does (inv_freq and pos * inv_freq are fp32
// tensors there); rope_angle<double> exists for tests.
#pragma once
#include <cstdint>

#include "common/common_math.hpp"

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

}  // namespace trainmem
