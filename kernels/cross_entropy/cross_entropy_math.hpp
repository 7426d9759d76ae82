// Cross-entropy on one row of V logits with an integer target (target < 0: ignored row).
//   lse = log(sum_j exp(x_j)),  loss = lse - x[target],
//   dx_j = scale * (exp(x_j - lse) - [j == target]).
// The log-sum-exp is accumulated online (one pass, numerically safe): start from
// LseState::empty(), fold in elements (or partial states from other threads) with update /
// merge, then finish.
#pragma once
#include "common/common_math.hpp"

namespace trainmem {

template <class T>
struct LseState {
  T max;  // running maximum
  T sum;  // sum of exp(x - max)
  static TM_HD LseState empty() { return {tm_neg_inf<T>(), T(0)}; }
};

template <class T>
TM_HD void lse_update(LseState<T>* s, T x) {
  if (x > s->max) {
    s->sum = s->sum * tm_exp(s->max - x) + T(1);
    s->max = x;
  } else {
    s->sum += tm_exp(x - s->max);
  }
}
template <class T>
TM_HD LseState<T> lse_merge(LseState<T> a, LseState<T> b) {
  if (a.max == tm_neg_inf<T>()) return b;
  if (b.max == tm_neg_inf<T>()) return a;
  const T m = tm_max(a.max, b.max);
  return {m, a.sum * tm_exp(a.max - m) + b.sum * tm_exp(b.max - m)};
}
template <class T>
TM_HD T lse_finish(LseState<T> s) {
  return s.max + tm_log(s.sum);
}

template <class T>
TM_HD T cross_entropy_loss(T lse, T target_logit) {
  return lse - target_logit;
}
template <class T>
TM_HD T cross_entropy_dlogit(T x, T lse, bool is_target, T scale) {
  return scale * (tm_exp(x - lse) - (is_target ? T(1) : T(0)));
}

}  // namespace trainmem
