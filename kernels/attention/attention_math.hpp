// Causal scaled-dot-product attention with GQA, the per-row pieces.
// Scores s_ij = scale * q_i . k_j with scale = 1/sqrt(d), visible iff j <= i (causal) and, under
// a sliding window W > 0, j > i - W (HuggingFace's `kv_idx > q_idx - sliding_window`): query i
// sees keys max(0, i-W+1)..i. W = 0 means no window (full causal);
// p_ij = softmax_j(s_ij); o_i = sum_j p_ij v_j. Query head qh reads kv head qh / (a / kv).
// Eager keeps p (b, a, s, s). Flash keeps only lse_i = log sum_j exp(s_ij) and recomputes
// p_ij = exp(s_ij - lse_i) in backward.
// Backward, with dp_ij = do_i . v_j and delta_i = sum_j p_ij dp_ij = do_i . o_i:
//   ds_ij = p_ij * (dp_ij - delta_i);  dq_i = scale * sum_j ds_ij k_j;
//   dk_j = scale * sum_i ds_ij q_i;    dv_j = sum_i p_ij do_i.
// Online softmax (flash forward) over key blocks, per query row with state (m, l, acc):
//   m' = max(m, rowmax(block)); alpha = exp(m - m'); p_j = exp(s_j - m');
//   l' = alpha * l + sum_j p_j;  acc' = alpha * acc + sum_j p_j v_j.
//   At the end o = acc / l, lse = m + log(l).
#pragma once
#include <cstdint>

#include "common/common_math.hpp"

namespace trainmem {

template <class T>
TM_HD T attention_scale(std::int64_t d) {
  return T(1) / tm_sqrt(T(d));
}
// kv head read by query head `head`.
TM_HD std::int64_t attention_kv_head(std::int64_t head, std::int64_t a, std::int64_t kv) {
  return head / (a / kv);
}
// Causal visibility of key position j from query position i.
TM_HD bool causal_visible(std::int64_t i, std::int64_t j) {
  return j <= i;
}
// Visibility under a sliding window W (0: none, full causal): j <= i and j > i - W.
TM_HD bool window_visible(std::int64_t i, std::int64_t j, std::int64_t window) {
  return j <= i && (window <= 0 || j > i - window);
}
// The first key query i sees: max(0, i - W + 1) under a window W > 0, else 0.
TM_HD std::int64_t window_first_key(std::int64_t i, std::int64_t window) {
  return window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
}

template <class T>
struct OnlineSoftmax {
  T m;  // running max of the scores seen
  T l;  // running sum of exp(s - m)
  static TM_HD OnlineSoftmax start() { return {tm_neg_inf<T>(), T(0)}; }
};
// Moves the state to a new block whose row maximum is block_max. Returns alpha, the factor by
// which the caller rescales its accumulator (and by which l has been rescaled). The caller
// then adds exp(s_j - state.m) for each score of the block to l (and p_j v_j to acc).
template <class T>
TM_HD T online_softmax_rescale(OnlineSoftmax<T>* st, T block_max) {
  const T m_new = tm_max(st->m, block_max);
  const T alpha = st->m == tm_neg_inf<T>() ? T(0) : tm_exp(st->m - m_new);
  st->l *= alpha;
  st->m = m_new;
  return alpha;
}
// Unnormalised probability of score s in the current state.
template <class T>
TM_HD T online_softmax_weight(const OnlineSoftmax<T>& st, T s) {
  return tm_exp(s - st.m);
}
template <class T>
TM_HD T online_softmax_lse(const OnlineSoftmax<T>& st) {
  return st.m + tm_log(st.l);
}
// Probability recomputed from the stored log-sum-exp (flash backward).
template <class T>
TM_HD T softmax_prob_from_lse(T s, T lse) {
  return tm_exp(s - lse);
}
// ds_ij from p_ij, dp_ij and delta_i.
template <class T>
TM_HD T softmax_backward_elem(T p, T dp, T delta) {
  return p * (dp - delta);
}

}  // namespace trainmem
