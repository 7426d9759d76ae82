// RMSNorm, one row of h channels (LLaMA / HuggingFace LlamaRMSNorm, no mean subtraction):
//   rstd = 1 / sqrt(mean(x^2) + eps),  y_j = x_j * rstd * w_j.
// Backward, with dot = sum_k dy_k * w_k * x_k:
//   dx_j = rstd * w_j * dy_j - x_j * rstd^3 * dot / h,   dw_j += dy_j * x_j * rstd.
// The row reductions (sum of squares, dot) are done by the caller (a loop on the CPU, a warp
// or block reduction on the GPU); these functions finish them and give the per-element terms.
#pragma once
#include <cstdint>

#include "common/common_math.hpp"

namespace trainmem {

// sum_sq = sum_j x_j^2 over the row.
template <class T>
TM_HD T rmsnorm_rstd(T sum_sq, std::int64_t h, T eps) {
  return T(1) / tm_sqrt(sum_sq / T(h) + eps);
}
template <class T>
TM_HD T rmsnorm_out(T x, T rstd, T w) {
  return x * rstd * w;
}
// The per-element term of the backward row reduction: dot = sum_k rmsnorm_dot_term(...).
template <class T>
TM_HD T rmsnorm_dot_term(T dy, T w, T x) {
  return dy * w * x;
}
// dx_j given the finished row dot product.
template <class T>
TM_HD T rmsnorm_dinp(T x, T w, T dy, T rstd, T dot, std::int64_t h) {
  return rstd * w * dy - x * (rstd * rstd * rstd) * dot / T(h);
}
// The contribution of one row to dw_j.
template <class T>
TM_HD T rmsnorm_dweight_term(T x, T dy, T rstd) {
  return dy * x * rstd;
}

}  // namespace trainmem
