// Ring attention's per-row pieces (attention_ring.hpp), shared by the CPU reference
// (attention_ring_cpu.cpp) and the CUDA kernels (attention_ring_kernels.cuh), so that both
// compute every element with the same operations in the same order: scores in fp32 in key order,
// the block's softmax in two passes (its maximum, then the weights), the merge by log-sum-exp.
// Backward in two passes: per query row (delta, then dq over the block's keys), per key row (dk,
// dv over the query heads of its group, rows in order).
#pragma once
#include <cstddef>
#include <cstdint>

#include "attention/attention_math.hpp"
#include "common/common_math.hpp"
#include "trainmem/base/op_types.hpp"

namespace trainmem {

constexpr std::int64_t kRingMaxHeadDim = 256;  // the forward row keeps d fp32 values

struct RingShape {
  std::int64_t b, sq, sk, a, kv, d, window;
  // Element offset of (batch, row, head) in a (b, rows, heads, d) buffer.
  TM_HD std::size_t q_at(std::int64_t bi, std::int64_t i, std::int64_t head) const {
    return std::size_t(((bi * sq + i) * a + head) * d);
  }
  TM_HD std::size_t k_at(std::int64_t bi, std::int64_t j, std::int64_t head) const {
    return std::size_t(((bi * sk + j) * kv + head) * d);
  }
  // Index of (batch, head, row) in a (b, a, sq) buffer (lse, delta).
  TM_HD std::size_t row_at(std::int64_t bi, std::int64_t head, std::int64_t i) const {
    return std::size_t((bi * a + head) * sq + i);
  }
};

// q_i · k_j over the head dim, in fp32.
template <class S>
TM_HD float ring_dot(const void* x, std::size_t xo, const void* y, std::size_t yo, std::int64_t d) {
  float dot = 0;
  for (std::int64_t e = 0; e < d; ++e)
    dot += S::load(x, xo + std::size_t(e)) * S::load(y, yo + std::size_t(e));
  return dot;
}

// Forward of query row i of (bi, qh): merges the block into acc (its d values) and *lse.
// o: d floats of scratch.
template <class S>
TM_HD void ring_forward_row(float* acc, float* lse, float* o, const void* q, const void* k,
                            const void* v, const RingShape& x, std::int64_t bi, std::int64_t qh,
                            std::int64_t i, SeqPositions qpos, SeqPositions kpos, bool first) {
  const float scale = attention_scale<float>(x.d);
  const float ninf = tm_neg_inf<float>();
  if (first) {
    for (std::int64_t e = 0; e < x.d; ++e) acc[e] = 0;
    *lse = ninf;
  }
  const std::int64_t kh = attention_kv_head(qh, x.a, x.kv), pq = qpos.at(i);
  const std::size_t qo = x.q_at(bi, i, qh);
  float mx = ninf;
  for (std::int64_t j = 0; j < x.sk; ++j)
    if (window_visible(pq, kpos.at(j), x.window))
      mx = tm_max(mx, ring_dot<S>(q, qo, k, x.k_at(bi, j, kh), x.d) * scale);
  if (mx == ninf) return;  // no key of this block is visible from row i
  float l = 0;
  for (std::int64_t e = 0; e < x.d; ++e) o[e] = 0;
  for (std::int64_t j = 0; j < x.sk; ++j) {
    if (!window_visible(pq, kpos.at(j), x.window)) continue;
    const std::size_t ko = x.k_at(bi, j, kh);
    const float p = tm_exp(ring_dot<S>(q, qo, k, ko, x.d) * scale - mx);
    l += p;
    for (std::int64_t e = 0; e < x.d; ++e) o[e] += p * S::load(v, ko + std::size_t(e));
  }
  const float lb = mx + tm_log(l);
  if (*lse == ninf) {
    for (std::int64_t e = 0; e < x.d; ++e) acc[e] = o[e] / l;
    *lse = lb;
    return;
  }
  const float m2 = tm_max(*lse, lb);
  const float merged = m2 + tm_log(tm_exp(*lse - m2) + tm_exp(lb - m2));
  const float wa = tm_exp(*lse - merged), wb = tm_exp(lb - merged);
  for (std::int64_t e = 0; e < x.d; ++e) acc[e] = acc[e] * wa + (o[e] / l) * wb;
  *lse = merged;
}

// Backward, query row i of (bi, qh): delta (written when `first`), then dq (d values) += scale
// Σ_j ds k_j over the block's visible keys.
template <class S>
TM_HD void ring_dq_row(float* dq, float* delta, const void* dout, const void* q, const void* k,
                       const void* v, const void* out, const float* lse, const RingShape& x,
                       std::int64_t bi, std::int64_t qh, std::int64_t i, SeqPositions qpos,
                       SeqPositions kpos, bool first) {
  const float scale = attention_scale<float>(x.d);
  const std::int64_t kh = attention_kv_head(qh, x.a, x.kv), pq = qpos.at(i);
  const std::size_t qo = x.q_at(bi, i, qh), row = x.row_at(bi, qh, i);
  if (first) delta[row] = ring_dot<S>(dout, qo, out, qo, x.d);
  for (std::int64_t j = 0; j < x.sk; ++j) {
    if (!window_visible(pq, kpos.at(j), x.window)) continue;
    const std::size_t ko = x.k_at(bi, j, kh);
    const float p = softmax_prob_from_lse(ring_dot<S>(q, qo, k, ko, x.d) * scale, lse[row]);
    const float ds = softmax_backward_elem(p, ring_dot<S>(dout, qo, v, ko, x.d), delta[row]);
    for (std::int64_t e = 0; e < x.d; ++e) dq[e] += scale * ds * S::load(k, ko + std::size_t(e));
  }
}

// Backward, key row j of (bi, kh): dk, dv (d values each) += over the group's query heads in
// order and their rows in order (delta already written).
template <class S>
TM_HD void ring_dkdv_row(float* dk, float* dv, const float* delta, const void* dout, const void* q,
                         const void* k, const void* v, const float* lse, const RingShape& x,
                         std::int64_t bi, std::int64_t kh, std::int64_t j, SeqPositions qpos,
                         SeqPositions kpos) {
  const float scale = attention_scale<float>(x.d);
  const std::int64_t group = x.a / x.kv, pk = kpos.at(j);
  const std::size_t ko = x.k_at(bi, j, kh);
  for (std::int64_t qh = kh * group; qh < (kh + 1) * group; ++qh)
    for (std::int64_t i = 0; i < x.sq; ++i) {
      if (!window_visible(qpos.at(i), pk, x.window)) continue;
      const std::size_t qo = x.q_at(bi, i, qh), row = x.row_at(bi, qh, i);
      const float p = softmax_prob_from_lse(ring_dot<S>(q, qo, k, ko, x.d) * scale, lse[row]);
      const float ds = softmax_backward_elem(p, ring_dot<S>(dout, qo, v, ko, x.d), delta[row]);
      for (std::int64_t e = 0; e < x.d; ++e) {
        dk[e] += scale * ds * S::load(q, qo + std::size_t(e));
        dv[e] += p * S::load(dout, qo + std::size_t(e));
      }
    }
}

}  // namespace trainmem
