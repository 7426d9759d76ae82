// Mixture of experts, per token (kernels/moe/moe.hpp), shared by the CPU reference and the CUDA
// kernels. Every sum runs in a fixed order in fp32, products rounded on their own (tm_mul_rn),
// so that a token's results do not depend on the backend or the team size.
#pragma once
#include <cstdint>

#include "common/common_math.hpp"

namespace trainmem {

// Token t's routing: its softmax over E logits (S storage) into probs_t (E f32), its top K into
// idx_t / weight_t (K each). Softmax as PyTorch's: max, exp(x − max), sum in order, divide.
template <class S>
TM_HD void moe_route_token(float* probs_t, std::int32_t* idx_t, float* weight_t, const void* logits,
                           std::int64_t t, std::int64_t E, std::int64_t K, bool normalize) {
  const std::int64_t base = t * E;
  float mx = S::load(logits, std::size_t(base));
  for (std::int64_t e = 1; e < E; ++e) mx = tm_max(mx, S::load(logits, std::size_t(base + e)));
  float sum = 0.0f;
  for (std::int64_t e = 0; e < E; ++e) {
    const float x = tm_exp(S::load(logits, std::size_t(base + e)) - mx);
    probs_t[e] = x;
    sum += x;
  }
  for (std::int64_t e = 0; e < E; ++e) probs_t[e] = probs_t[e] / sum;
  // Top K by selection: the largest probability not yet chosen, the lower expert on a tie.
  float total = 0.0f;
  for (std::int64_t j = 0; j < K; ++j) {
    std::int32_t best = -1;
    for (std::int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (std::int64_t c = 0; c < j; ++c) taken = taken || idx_t[c] == std::int32_t(e);
      if (taken) continue;
      if (best < 0 || probs_t[e] > probs_t[best]) best = std::int32_t(e);
    }
    idx_t[j] = best;
    weight_t[j] = probs_t[best];
    total += probs_t[best];
  }
  if (normalize)
    for (std::int64_t j = 0; j < K; ++j) weight_t[j] = weight_t[j] / total;
}

// Token t's logit gradient (E, S storage) from the gradient of its K weights: through the
// normalisation w_j = p_j / Σp (dp_j = (dw_j − Σ_c dw_c·w_c) / Σp) when `normalize`, then the
// softmax (dlogit_e = p_e·(dp_e − Σ_f dp_f·p_f), dp zero outside the top K). `aux` (E, or
// nullptr): a gradient of every probability alike (the load-balancing loss's), added to dp.
template <class S>
TM_HD void moe_route_backward_token(void* dlogits, const float* dweight_t, const float* probs_t,
                                    const std::int32_t* idx_t, const float* aux, std::int64_t t,
                                    std::int64_t E, std::int64_t K, bool normalize) {
  float total = 0.0f, dot = 0.0f;
  if (normalize) {
    for (std::int64_t j = 0; j < K; ++j) total += probs_t[idx_t[j]];
    for (std::int64_t j = 0; j < K; ++j) dot += tm_mul_rn(dweight_t[j], probs_t[idx_t[j]] / total);
  }
  // dp of choice j, and g = Σ_e dp_e·p_e: the chosen experts', then the aux term's over all.
  float g = 0.0f;
  for (std::int64_t j = 0; j < K; ++j) {
    const float dp = normalize ? (dweight_t[j] - dot) / total : dweight_t[j];
    g += tm_mul_rn(dp, probs_t[idx_t[j]]);
  }
  if (aux)
    for (std::int64_t e = 0; e < E; ++e) g += tm_mul_rn(aux[e], probs_t[e]);
  for (std::int64_t e = 0; e < E; ++e) {
    float dp = 0.0f;
    for (std::int64_t j = 0; j < K; ++j)
      if (idx_t[j] == std::int32_t(e)) dp = normalize ? (dweight_t[j] - dot) / total : dweight_t[j];
    if (aux) dp += aux[e];
    S::store(dlogits, std::size_t(t * E + e), tm_mul_rn(probs_t[e], dp - g));
  }
}

// The stable counting sort of the choices by expert, serial: offsets (E + 1), pos (n, K). With
// a capacity (cap > 0: rows per expert, GShard's token dropping) expert e keeps its first
// min(count_e, cap) choices in token order; the rest get pos −1 (dropped) and the offsets count
// the kept rows only. Pass 1 numbers each choice within its expert (offsets[e + 1] counting e's
// choices), pass 2 turns the counts, clipped, into the experts' first rows, pass 3 the numbers
// into rows.
TM_HD void moe_sort_serial(std::int32_t* pos, std::int32_t* offsets, const std::int32_t* idx,
                           std::int64_t n, std::int64_t E, std::int64_t K, std::int64_t cap) {
  for (std::int64_t e = 0; e <= E; ++e) offsets[e] = 0;
  for (std::int64_t c = 0; c < n * K; ++c) pos[c] = offsets[idx[c] + 1]++;
  for (std::int64_t e = 0; e < E; ++e) {
    if (cap > 0 && offsets[e + 1] > cap) offsets[e + 1] = std::int32_t(cap);
    offsets[e + 1] += offsets[e];
  }
  for (std::int64_t c = 0; c < n * K; ++c)
    pos[c] = cap > 0 && pos[c] >= cap ? -1 : offsets[idx[c]] + pos[c];
}

// Row t of the combine (moe.hpp): out[t, c] for c in [c0, c1).
template <class S>
TM_HD void moe_combine_token(void* out, const void* res, const void* rows, const float* weight,
                             const std::int32_t* pos, std::int64_t t, std::int64_t K,
                             std::int64_t h, std::int64_t c0, std::int64_t c1) {
  for (std::int64_t c = c0; c < c1; ++c) {
    float acc = res ? S::load(res, std::size_t(t * h + c)) : 0.0f;
    for (std::int64_t j = 0; j < K; ++j) {
      if (pos[t * K + j] < 0) continue;  // dropped (capacity): no contribution
      const float y = S::load(rows, std::size_t(std::int64_t(pos[t * K + j]) * h + c));
      acc += weight ? tm_mul_rn(weight[t * K + j], y) : y;
    }
    S::store(out, std::size_t(t * h + c), acc);
  }
}

// Choice (t, j) of the combine's backward: its row of drows, and dweight[t, j].
template <class S>
TM_HD void moe_combine_backward_choice(void* drows, float* dweight, const void* dout,
                                       const void* rows, const float* weight,
                                       const std::int32_t* pos, std::int64_t t, std::int64_t j,
                                       std::int64_t K, std::int64_t h) {
  const std::int64_t r = pos[t * K + j];
  if (r < 0) {  // dropped (capacity): its weight reached no output
    dweight[t * K + j] = 0.0f;
    return;
  }
  const float w = weight[t * K + j];
  float dot = 0.0f;
  for (std::int64_t c = 0; c < h; ++c) {
    const float d = S::load(dout, std::size_t(t * h + c));
    S::store(drows, std::size_t(r * h + c), tm_mul_rn(w, d));
    dot += tm_mul_rn(d, S::load(rows, std::size_t(r * h + c)));
  }
  dweight[t * K + j] = dot;
}

// The shared expert's gate (moe.hpp): σ(x) = 1 / (1 + exp(−x)) in fp32.
TM_HD float moe_sigmoid(float x) {
  return 1.0f / (1.0f + tm_exp(-x));
}
// out[t, c] for c in [c0, c1): out + σ(score[t])·y.
template <class S>
TM_HD void moe_gate_add_token(void* out, const void* y, const void* score, std::int64_t t,
                              std::int64_t h, std::int64_t c0, std::int64_t c1) {
  const float g = moe_sigmoid(S::load(score, std::size_t(t)));
  for (std::int64_t c = c0; c < c1; ++c) {
    const std::size_t e = std::size_t(t * h + c);
    S::store(out, e, S::load(out, e) + tm_mul_rn(g, S::load(y, e)));
  }
}
// Token t of its backward: dy's row and dscore[t].
template <class S>
TM_HD void moe_gate_backward_token(void* dy, void* dscore, const void* dout, const void* y,
                                   const void* score, std::int64_t t, std::int64_t h) {
  const float g = moe_sigmoid(S::load(score, std::size_t(t)));
  float dot = 0.0f;
  for (std::int64_t c = 0; c < h; ++c) {
    const std::size_t e = std::size_t(t * h + c);
    const float d = S::load(dout, e);
    S::store(dy, e, tm_mul_rn(g, d));
    dot += tm_mul_rn(d, S::load(y, e));
  }
  S::store(dscore, std::size_t(t), tm_mul_rn(dot, tm_mul_rn(g, 1.0f - g)));
}

}  // namespace trainmem
