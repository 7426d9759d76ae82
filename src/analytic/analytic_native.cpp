// The `native` profile: trainmem's own training step in closed form, for one rank of a parallel
// layout (include/trainmem/analytic/analytic_rank.hpp). The single-GPU profile is the layout of
// one GPU: the same code with tp = pp = dp = 1. Derivations: docs/native-plan.md (the step) and
// docs/distributed.md ("The sharded step": what a rank's slice changes).
//
// A rank holds one pipeline stage with its local sizes: heads a/tp, kv heads k/tp, intermediate
// i/tp, vocabulary V/tp, and the residual stream's rows s/tp under sequence parallelism. The peak
// is the maximum over the instants at which live bytes can reach a maximum (the end of every run
// of allocations), in chronological order so that a tie keeps the first, as a ledger does:
//   forward   the last layer's `out` (checkpointed: before the layer's other tensors are freed;
//             under sp with its reduce-scatter buffer) and, under ZeRO-3, the last layers whose
//             gather window reaches the head;
//   head      its forward gather (sp), the end of forward (ce_losses), backward steps 2 and 3;
//   layer     each step of the first layer the backward processes: later layers hold fewer
//             activations (one layer's set, or one checkpoint, less) and the same or smaller
//             buffers and gradients, so they never exceed it;
//   embedding the embedding backward (LOMO, untied: the embedding gradient is allocated there);
// with, on stage k of a pipeline, the activations of the other min(pp - k, M) - 1 micro-batches
// in flight added to every instant (1F1B), and under ZeRO-3 the gathered units of the window.
#include <algorithm>

#include "analytic_detail.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/lora.hpp"

namespace trainmem::analytic_detail {
namespace {

constexpr int P = static_cast<int>(Category::params);
constexpr int G = static_cast<int>(Category::gradients);
constexpr int O = static_cast<int>(Category::optimizer_states);
constexpr int A = static_cast<int>(Category::activations);
constexpr int W = static_cast<int>(Category::workspace);
constexpr int I = static_cast<int>(Category::inputs);
constexpr int X = static_cast<int>(Category::communication);

std::uint64_t u(std::int64_t v) {
  return static_cast<std::uint64_t>(v);
}

// Optimizer-state bytes per parameter (docs/design.md's rule, per element of what is updated).
std::uint64_t state_bytes_per_param(Optimizer o, std::uint64_t w) {
  switch (o) {
    case Optimizer::adamw:
      return w == 4 ? 8 : 12;
    case Optimizer::sgd:
      return w == 4 ? 0 : 4;
    case Optimizer::lomo:
    case Optimizer::adamw8bit:  // bitsandbytes': per tensor (state_figures); one GPU only
    case Optimizer::paged_adamw:
    case Optimizer::paged_adamw8bit:
      return 0;
  }
  return 0;
}

// The local sizes of one rank (letters of docs/distributed.md) and the shapes' letters.
struct Local {
  std::uint64_t b, s, sr, h, d, a, k, i, V, w;  // sr: rows of the residual stream (s or s/tp)
  std::uint64_t ad, kd;                         // a·d, k·d (local)
  // Tensor bytes.
  std::uint64_t X;       // (b, sr, h) D: a residual-stream tensor
  std::uint64_t full;    // (b, s, h) D: a gathered or partial residual tensor
  std::uint64_t bsi;     // (b, s, i) D
  std::uint64_t bsad;    // (b, s, a·d) D
  std::uint64_t bskd;    // (b, s, k·d) D
  std::uint64_t r4;      // (b, sr) f32: an RMSNorm's 1/rms
  std::uint64_t bs4;     // (b, s) f32 / int32
  std::uint64_t store;   // probs (b,a,s,s) D | lse (b,a,s) f32
  std::uint64_t logits;  // (b, s, V) D
  // LoRA (TrainConfig::lora_rank r > 0): its targets, and one adapter row (b, s, r) D.
  std::uint64_t r = 0;
  unsigned lora = 0;
  std::uint64_t bsr = 0;
  bool targets(unsigned bits) const { return (lora & bits) != 0; }
  // LoRA dropout (TrainConfig::lora_dropped): each target keeps its mask, (b, s, in) one byte per
  // element of its input, and drops that input into a (b, s, in) D transient (drop_in).
  bool drop = false;
  // Target t's input and output widths on the rank (q, k, v, o, gate, up, down).
  std::uint64_t in_of(unsigned t) const { return t == 3 ? ad : t == 6 ? i : h; }
  std::uint64_t out_of(unsigned t) const {
    return t == 0 ? ad : t == 1 || t == 2 ? kd : t == 3 || t == 6 ? h : i;
  }
  std::uint64_t mask(unsigned t) const { return drop ? bytes_of({b, s, in_of(t)}, 1) : 0; }
  std::uint64_t drop_in(unsigned t) const { return drop ? bytes_of({b, s, in_of(t)}, w) : 0; }
  // The largest dropped input among the targets in `bits` (0 without dropout).
  std::uint64_t drop_max(unsigned bits) const {
    std::uint64_t m = 0;
    for (unsigned t = 0; t < 7; ++t)
      if (targets(bits & (1u << t))) m = std::max(m, drop_in(t));
    return m;
  }
  // The rows of the targets among `bits`: one bsr each, and its mask under dropout.
  std::uint64_t lora_rows(unsigned bits) const {
    std::uint64_t n = 0;
    for (unsigned t = 0; t < 7; ++t)
      if (lora & bits & (1u << t)) n = csum({n, bsr, mask(t)}, "LoRA rows");
    return n;
  }
  // QLoRA (TrainConfig::quantized()): the workspace a GEMM's dequantized base weight takes, the
  // weight in D and, under double quantization, its fp32 absmax beside it: deq_ha for q_proj's
  // (a·d, h) and o_proj's (h, a·d), deq_hi for gate/up/down's (i, h); 0 without quantization.
  std::uint64_t deq_ha = 0, deq_hi = 0;
  // A mixture of experts (ModelConfig::moe(); docs/native-plan.md, "Mixture of experts"): E
  // experts, K per token, an expert's width m; the bytes of (b,s,E) D (the router's logits and
  // their gradient), (b,s,E) f32 (the softmax), (b,s,K) 4-byte (indices, weights, positions),
  // (E+1) int32 (the offsets), and the rows in expert order (nk, h) and (nk, m) D: nk = b·s·K, or
  // E·capacity under --capacity-factor (moe_rows), cap the capacity (0: none).
  bool moe = false;
  std::uint64_t E = 0, K = 0, m = 0, nk = 0, cap = 0;
  std::uint64_t bsE = 0, bsE4 = 0, bsK4 = 0, off4 = 0, nkh = 0, nkm = 0;
  // Expert parallelism (ep > 1; docs/distributed.md, "Expert parallelism"): the rank's El = E/ep
  // experts compute er rows, (er, h) and (er, m) bytes, the rows the ep group's ranks route to
  // them under balanced routing; the rank's own nk rows travel out (dispatch) and back (combine).
  // Expert tensor parallelism (etp > 1, "Expert tensor parallelism"): m is the rank's m/etp
  // columns, ea (A) the rows the all-to-all brings the rank and er = etp·A the rows of its etp
  // group, which it computes. `ep`: the rows are dispatched (ep·etp > 1); `a2a`: ep > 1; `etp`:
  // etp > 1. One GPU: El = E, er = ea = nk.
  bool ep = false, a2a = false, etp = false;
  std::uint64_t El = 0, er = 0, erh = 0, erm = 0, ea = 0, eah = 0;
  // Qwen2-MoE's shared expert of width ms (m_s/tp under tensor parallelism): (b,s,ms) D rows,
  // and its gate's logit (b,sr) D.
  std::uint64_t ms = 0, bsms = 0, bsw = 0;
  // output_router_logits: the load-balancing loss's gradient of the probabilities, (E) f32,
  // uploaded beside d_router_logits.
  std::uint64_t aux4 = 0;
  // Letters of the shapes: "a" or "a/t" under tensor parallelism, rows "s" or "s/t" under sp.
  std::string la, lk, li, lV, lms, rows;
};

// The rows the experts of expert-parallel index ep_i receive under balanced routing: every one of
// the ep ranks of its group routes its nK = n·K choices ⌊nK/E⌋ to each expert and one more to
// each of the first nK mod E experts (balanced_routing), keeps at most `cap` of them per expert
// under --capacity-factor (cap 0: all), and ep_i holds experts [ep_i·El, (ep_i + 1)·El), so
// A = ep·Σ_{e local} min(count_e, cap). At ep 1 (El = E) that is the rank's own kept rows.
std::uint64_t balanced_expert_rows(std::uint64_t nK, std::uint64_t cap, std::uint64_t E,
                                   std::uint64_t ep, std::uint64_t ep_i) {
  const std::uint64_t El = E / ep, first = ep_i * El;
  std::uint64_t kept = 0;
  for (std::uint64_t e = first; e < first + El; ++e) {
    const std::uint64_t count = nK / E + (e < nK % E ? 1 : 0);
    kept += cap > 0 ? std::min(count, cap) : count;
  }
  return checked_mul(ep, kept, "expert rows");
}

Local make_local(const ModelConfig& m, const TrainConfig& t, const ParallelConfig& p,
                 std::int64_t grad_rank = 0) {
  Local l;
  l.b = u(t.batch);
  l.s = u(p.local_seq(t.seq));  // the rank's s/cp rows under context parallelism
  l.sr = p.sp ? l.s / u(p.tp) : l.s;
  l.h = u(m.hidden);
  l.d = u(m.head_dim());
  l.a = u(m.heads / p.tp);
  l.k = u(m.kv_heads / p.tp);
  l.i = u(m.intermediate / p.tp);
  l.V = u(m.vocab / p.tp);
  l.w = dtype_size(t.dtype);
  l.ad = checked_mul(l.a, l.d);
  l.kd = checked_mul(l.k, l.d);
  l.X = bytes_of({l.b, l.sr, l.h}, l.w);
  l.full = bytes_of({l.b, l.s, l.h}, l.w);
  l.bsi = bytes_of({l.b, l.s, l.i}, l.w);
  l.bsad = bytes_of({l.b, l.s, l.ad}, l.w);
  l.bskd = bytes_of({l.b, l.s, l.kd}, l.w);
  l.r4 = bytes_of({l.b, l.sr}, 4);
  l.bs4 = bytes_of({l.b, l.s}, 4);
  l.store = t.attention == Attention::eager ? bytes_of({l.b, l.a, l.s, l.s}, l.w)
                                            : bytes_of({l.b, l.a, l.s}, 4);
  l.logits = bytes_of({l.b, l.s, l.V}, l.w);
  if (t.lora()) {
    l.r = u(t.lora_rank);
    l.lora = t.lora_targets;
    l.bsr = bytes_of({l.b, l.s, l.r}, l.w);
    l.drop = t.lora_dropped();
  }
  if (t.quantized()) {
    const std::uint64_t bs = u(t.quant_blocksize);
    auto deq = [&](std::uint64_t n) {
      // 4-bit under double quantization: its fp32 absmax rebuilt beside it (int8: none).
      const std::uint64_t absmax =
          t.quant4() && t.double_quant ? checked_mul((n + bs - 1) / bs, 4) : 0;
      return csum({checked_mul(n, l.w, "dequantized weight"), absmax}, "dequantized weight");
    };
    l.deq_ha = deq(checked_mul(l.h, l.ad));
    l.deq_hi = deq(checked_mul(l.h, l.i));
  }
  if (m.moe()) {
    l.moe = true;
    l.E = u(m.experts);
    l.K = u(m.experts_per_token);
    l.m = u(m.expert_intermediate / p.etp);  // the rank's columns of each expert
    // The rank's own rows: b·(s/tp) under sequence parallelism (no gather before the router).
    l.bsE = bytes_of({l.b, l.sr, l.E}, l.w);
    l.bsE4 = bytes_of({l.b, l.sr, l.E}, 4);
    l.bsK4 = bytes_of({l.b, l.sr, l.K}, 4);
    l.off4 = bytes_of({l.E + 1}, 4);
    // The rank's b·s tokens (s/cp under context parallelism, /tp under sp) route b·s·K rows;
    // under --capacity-factor E·c, the capacity c over the rank's own tokens (Megatron's
    // get_capacity of the local tokens), whose kept rows alone travel under ep or etp.
    const std::int64_t tokens = std::int64_t(checked_mul(l.b, l.sr));
    l.nk = u(moe_rows_of(m, t.capacity_factor, tokens));
    l.cap = u(moe_capacity_of(m, t.capacity_factor, tokens));
    l.nkh = bytes_of({l.nk, l.h}, l.w);
    l.nkm = bytes_of({l.nk, l.m}, l.w);
    // The rank's place in the stage: slot j = grad_rank (gradient-group index · tp + tp index),
    // its expert-parallel index (j / etp) mod ep (Megatron's order: etp fastest, then ep, then
    // edp); every rank of its etp group receives the same A under balanced routing.
    l.a2a = p.ep > 1;
    l.etp = p.etp > 1;
    l.ep = l.a2a || l.etp;
    if (p.ep < 1 || p.etp < 1)
      throw Error("analytic native: expert parallelism of " + std::to_string(p.ep) + " × " +
                  std::to_string(p.etp));
    l.El = l.E / u(p.ep);
    // One GPU's buffers hold nk rows whatever the routing; under ep or etp the kept rows move.
    l.ea = l.ep ? balanced_expert_rows(checked_mul(u(tokens), l.K), l.cap, l.E, u(p.ep),
                                       u(grad_rank) / u(p.etp) % u(p.ep))
                : l.nk;
    l.er = checked_mul(l.ea, u(p.etp), "expert rows");
    l.eah = bytes_of({l.ea, l.h}, l.w);
    l.erh = bytes_of({l.er, l.h}, l.w);
    l.erm = bytes_of({l.er, l.m}, l.w);
    // The shared expert split like the dense MLP (m_s/tp columns of every sequence row, gathered
    // under sp); its output and gate logit on the rank's own rows.
    l.ms = u(m.shared_expert_intermediate / p.tp);
    l.bsms = bytes_of({l.b, l.s, l.ms}, l.w);
    l.bsw = l.ms > 0 ? bytes_of({l.b, l.sr}, l.w) : 0;
    l.aux4 = m.output_router_logits ? bytes_of({l.E}, 4) : 0;
  }
  const bool split = p.tp > 1;
  l.la = split ? "a/t" : "a";
  l.lk = split ? "k/t" : "k";
  l.li = split ? "i/t" : "i";
  l.lms = split ? "m_s/t" : "m_s";
  l.lV = split ? "V/t" : "V";
  l.rows = p.sp ? "s/t" : "s";
  return l;
}

// Parameter elements of one layer on a rank (two norms, q/k/v/o, gate/up/down; TP-sharded),
// with the q/k/v biases (split with their columns: a/t·d + 2·k/t·d) and the q/k norm weights
// (replicated: 2·d) of the families that have them.
// A mixture-of-experts layer (`moe`) has, in place of gate/up/down, the router (E, h) and E
// experts of three (m, h) matrices each: E·h·(1 + 3m) (under expert parallelism the rank's
// El = E/ep experts of m/etp columns: E·h + El·3·m·h, m the rank's); a shared expert adds three
// (m_s/tp, h) and its gate (1, h).
std::uint64_t layer_params(const Local& l, const ModelConfig& m, bool moe) {
  const std::uint64_t shared =
      l.ms > 0 ? checked_mul(l.h, csum({1, checked_mul(3, l.ms)}), "parameters") : 0;
  const std::uint64_t mlp =
      moe ? csum({checked_mul(l.E, l.h), checked_mul(checked_mul(l.El, l.h), checked_mul(3, l.m)),
                  shared},
                 "parameters")
          : checked_mul(3, checked_mul(l.h, l.i));
  return csum({checked_mul(2, l.h), checked_mul(l.h, l.ad), checked_mul(2, checked_mul(l.h, l.kd)),
               checked_mul(l.ad, l.h), mlp, m.qkv_bias ? csum({l.ad, l.kd, l.kd}) : 0,
               m.qk_norm ? checked_mul(2, l.d) : 0},
              "parameters");
}

// LoRA's adapter elements in one layer: r·(in + out) for each target projection (A (r, in) and
// B (out, r)), in the order q, k, v, o, gate, up, down (docs/native-plan.md, "LoRA").
std::uint64_t layer_adapters(const Local& l) {
  const std::uint64_t io[7] = {l.h + l.ad, l.h + l.kd, l.h + l.kd, l.ad + l.h,
                               l.h + l.i,  l.h + l.i,  l.i + l.h};
  std::uint64_t n = 0;
  for (unsigned t = 0; t < 7; ++t)
    if (l.targets(1u << t)) n = checked_add(n, checked_mul(l.r, io[t]), "LoRA parameters");
  return n;
}

// The largest adapter tensor of a layer on a rank: r·in (A) or out·r (B) of each target.
std::uint64_t largest_adapter(const Local& l) {
  std::uint64_t n = 0;
  for (unsigned t = 0; t < 7; ++t)
    if (l.targets(1u << t))
      n = std::max({n, checked_mul(l.r, l.in_of(t)), checked_mul(l.r, l.out_of(t))});
  return n;
}

// The per-layer forward set of one rank, in allocation order (`out` last), of a dense layer or a
// mixture-of-experts one (`moe`).
std::vector<TensorEntry> layer_set(const Dims& g, const Local& l, Attention attn, bool sp,
                                   bool qk_norm, bool moe) {
  const std::string& D = g.dt;
  const std::string res = "(b," + l.rows + ",h)", rows = "(b," + l.rows + ")";
  const std::string q_shape = "(b,s," + l.la + "·d)", kv_shape = "(b,s," + l.lk + "·d)";
  std::vector<TensorEntry> v;
  v.push_back(entry(g, "rstd1", rows, "fp32", l.r4, Term::sb, "input_layernorm backward",
                    "1/rms of each row of x_l"));
  v.push_back(entry(g, "xn1", res, D, l.X, Term::sbh, "q/k/v projection backward",
                    sp ? "the rank's rows of the GEMMs' input (gathered again in backward)"
                       : "input of the q, k and v GEMMs (dW_q/k/v)"));
  if (qk_norm) {
    v.push_back(entry(g, "q_pre", q_shape, D, l.bsad, Term::sbh, "q_norm backward",
                      "q projection (+ bias) before the per-head RMSNorm"));
    v.push_back(entry(g, "k_pre", kv_shape, D, l.bskd, Term::sbh, "k_norm backward",
                      "k projection (+ bias) before the per-head RMSNorm"));
    v.push_back(entry(g, "q_rstd", "(b,s," + l.la + ")", "fp32", bytes_of({l.b, l.s, l.a}, 4),
                      Term::sb, "q_norm backward", "1/rms of each query head"));
    v.push_back(entry(g, "k_rstd", "(b,s," + l.lk + ")", "fp32", bytes_of({l.b, l.s, l.k}, 4),
                      Term::sb, "k_norm backward", "1/rms of each key head"));
  }
  v.push_back(entry(g, "q", q_shape, D, l.bsad, Term::sbh, "attention backward",
                    "query after RoPE (in place)"));
  v.push_back(entry(g, "k", kv_shape, D, l.bskd, Term::sbh, "attention backward",
                    "key after RoPE, sized by the kv heads"));
  v.push_back(entry(g, "v", kv_shape, D, l.bskd, Term::sbh, "attention backward",
                    "value, sized by the kv heads"));
  // LoRA: target t's row a = x·Aᵀ (b, s, r), which dB = c·dyᵀ·a reads (r·w bytes per sb, folded
  // into c_sb).
  // Under dropout its mask first, (b, s, in) one byte per element (in·bs bytes: folded into c_sbh,
  // or c_sbi for down_proj's).
  auto lora_row = [&](unsigned t, const char* proj, const char* input) {
    if (!l.targets(1u << t)) return;
    if (l.drop)
      v.push_back(entry(g, std::string("lora_mask.") + proj,
                        t == 3   ? q_shape
                        : t == 6 ? "(b,s," + l.li + ")"
                                 : "(b,s,h)",
                        "uint8", l.mask(t), t == 6 ? Term::sbi : Term::sbh,
                        std::string(proj) + " adapter backward (dA, dx)",
                        "LoRA dropout's mask of " + std::string(input) +
                            ": the backward drops the same elements"));
    v.push_back(entry(g, std::string("lora_a.") + proj, "(b,s,r)", D, l.bsr, Term::sb,
                      std::string(proj) + " adapter backward (dB)",
                      std::string(input) + "·Aᵀ: the LoRA adapter's rank-r activation"));
  };
  lora_row(0, "q_proj", "xn1");
  lora_row(1, "k_proj", "xn1");
  lora_row(2, "v_proj", "xn1");
  if (attn == Attention::eager)
    v.push_back(entry(g, "probs", "(b," + l.la + ",s,s)", D, l.store, Term::as2b,
                      "attention backward", "materialised causal softmax probabilities"));
  else
    v.push_back(entry(g, "lse", "(b," + l.la + ",s)", "fp32", l.store, Term::sb,
                      "attention backward",
                      "row log-sum-exp: flash recomputes the probabilities from it (4a·sb "
                      "bytes, folded into c_sb)"));
  v.push_back(entry(g, "attn_out", q_shape, D, l.bsad, Term::sbh,
                    "o_proj backward and attention backward",
                    "input of the o GEMM (dW_o); the flash/eager backward reads it too"));
  lora_row(3, "o_proj", "attn_out");
  v.push_back(entry(g, "h_mid", res, D, l.X, Term::sbh, "post_attention_layernorm backward",
                    "residual stream after attention"));
  v.push_back(entry(g, "rstd2", rows, "fp32", l.r4, Term::sb, "post_attention_layernorm backward",
                    "1/rms of each row of h_mid"));
  v.push_back(entry(g, "xn2", res, D, l.X, Term::sbh,
                    moe ? "router and experts' backward" : "gate/up projection backward",
                    moe  ? (sp ? "the rank's rows, routed by the rank itself (no gather; a shared "
                                 "expert gathers them)"
                               : "input of the router and of the experts' rows")
                    : sp ? "the rank's rows of the gate and up GEMMs' input (gathered again in "
                           "backward)"
                         : "input of the gate and up GEMMs"));
  if (moe) {
    // The router and the experts (docs/native-plan.md, "Mixture of experts"): the bytes hold all
    // b·s·K rows (E·capacity under --capacity-factor) in expert order at once, whatever the
    // routing.
    const std::string bs = "(b," + l.rows;  // the rank's own rows (s/t under sp)
    v.push_back(entry(g, "router_probs", bs + ",E)", "fp32", l.bsE4, Term::sb, "router backward",
                      "fp32 softmax of the router logits xn2·W_routerᵀ"));
    v.push_back(entry(g, "topk_idx", bs + ",K)", "int32", l.bsK4, Term::sb, "router backward",
                      "the K experts each token is routed to"));
    v.push_back(entry(g, "topk_weight", bs + ",K)", "fp32", l.bsK4, Term::sb, "combine backward",
                      "the routing weights (renormalised under norm_topk_prob)"));
    v.push_back(entry(g, "expert_pos", bs + ",K)", "int32", l.bsK4, Term::sb,
                      "permute and combine backward",
                      "each (token, choice)'s row in expert order"));
    v.push_back(entry(g, "expert_offsets", "(E+1)", "int32", l.off4, Term::other,
                      "the experts' backward GEMMs", "where each expert's rows start"));
    // Under --capacity-factor the rows are E·c (c the capacity), whatever the routing.
    const std::string nk = l.cap > 0 ? "E·c" : "b·s·K";
    // Expert parallelism: the rows the rank's experts receive (R) in place of its own.
    const std::string er = l.ep ? "R" : nk;
    v.push_back(entry(g, "expert_in", "(" + er + ",h)", D, l.erh, Term::sbh,
                      "experts' gate/up backward",
                      l.etp  ? "the rows routed to the etp group's experts, gathered from its ranks"
                      : l.ep ? "the rows routed to this rank's experts, received by all-to-all"
                             : "xn2's rows in expert order, one per (token, choice)"));
    const std::string mw = l.etp ? ",m/etp)" : ",m)";  // the rank's columns of each expert
    v.push_back(entry(g, "expert_gate", "(" + er + mw, D, l.erm, Term::sbi, "SwiGLU backward",
                      "each expert's gate projection of its rows"));
    v.push_back(entry(g, "expert_up", "(" + er + mw, D, l.erm, Term::sbi, "SwiGLU backward",
                      "each expert's up projection of its rows"));
    v.push_back(entry(g, "expert_act", "(" + er + mw, D, l.erm, Term::sbi,
                      "experts' down backward (dW_down)", "silu(expert_gate)·expert_up"));
    v.push_back(entry(g, "expert_out", "(" + nk + ",h)", D, l.nkh, Term::sbh,
                      "combine backward (the weights' gradient)",
                      l.a2a  ? "the experts' outputs of the rank's own rows, received back by "
                               "all-to-all, before their routing weights"
                      : l.ep ? "the experts' outputs of the rank's own rows, reduce-scattered "
                               "over the etp group, before their routing weights"
                             : "each expert's output before its routing weight"));
    if (l.ms > 0) {
      const std::string sh = "(b,s," + l.lms + ")";
      v.push_back(entry(g, "shared_gate", sh, D, l.bsms, Term::sbi, "shared SwiGLU backward",
                        "the shared expert's gate projection (Qwen2-MoE)"));
      v.push_back(entry(g, "shared_up", sh, D, l.bsms, Term::sbi, "shared SwiGLU backward",
                        "the shared expert's up projection"));
      v.push_back(entry(g, "shared_act", sh, D, l.bsms, Term::sbi, "shared down backward (dW_down)",
                        "silu(shared_gate)·shared_up"));
      v.push_back(entry(g, "shared_out", res, D, l.X, Term::sbh,
                        "shared gate backward (σ's gradient)",
                        sp ? "the shared expert's output before its sigmoid gate, reduce-scattered "
                             "to the rank's rows"
                           : "the shared expert's output before its sigmoid gate"));
      v.push_back(entry(g, "shared_score", rows, D, l.bsw, Term::sb, "shared gate backward (σ')",
                        "the shared expert gate's logit"));
    }
    v.push_back(entry(g, "out", res, D, l.X, Term::sbh,
                      "next layer's input_layernorm backward (or the final norm's)",
                      "the layer output x_{l+1} = h_mid + Σ weight·expert_out"));
    return v;
  }
  const std::string i_shape = "(b,s," + l.li + ")";
  v.push_back(entry(g, "gate", i_shape, D, l.bsi, Term::sbi, "SwiGLU backward",
                    "silu'(gate) needs the pre-activation"));
  v.push_back(entry(g, "up", i_shape, D, l.bsi, Term::sbi, "SwiGLU backward",
                    "d gate = d act · up · silu'(gate)"));
  lora_row(4, "gate_proj", "xn2");
  lora_row(5, "up_proj", "xn2");
  v.push_back(entry(g, "act", i_shape, D, l.bsi, Term::sbi, "down_proj backward",
                    "input of the down GEMM (dW_down)"));
  lora_row(6, "down_proj", "act");
  v.push_back(entry(g, "out", res, D, l.X, Term::sbh,
                    "next layer's input_layernorm backward (or the final norm's)",
                    "the layer output x_{l+1}, the next layer's input"));
  return v;
}

// The ZeRO-3 gather window: units in compute order (embedding, layers, head, layers back), each
// gathered while any of the positions j..j+prefetch needs it.
struct GatherPlan {
  std::vector<int> seq;              // unit id per position: 0 embedding, 1+l layer l, L+1 head
  std::vector<std::uint64_t> bytes;  // gathered bytes per unit id
  int pinned = -1;                   // a unit gathered at every position (FSDP2's root), or -1
  // Positions before this one prefetch nothing (FSDP2's forward: a layer is resharded before
  // the next one is gathered).
  std::size_t prefetch_from = 0;
  // FSDP2 with reshard_after_forward=False: every unit gathered in forward stays until its
  // post-backward (the window at a position is what the forward gathered so far, less the
  // layers whose backward is done).
  bool keep = false;
  std::uint64_t window(std::size_t pos, std::int64_t prefetch) const {
    std::vector<int> seen;
    std::uint64_t total = 0;
    if (keep) {
      const std::size_t L = (seq.size() - 2) / 2;  // seq: 0, the layers, the head, backward
      const std::size_t last = pos <= L + 1 ? pos : 2 * L + 1 - pos + 1;  // backward: layers 0..k
      for (std::size_t j = 0; j <= last && j < seq.size(); ++j) {
        if (std::find(seen.begin(), seen.end(), seq[j]) != seen.end()) continue;
        seen.push_back(seq[j]);
        total = checked_add(total, bytes[seq[j]], "gathered parameters");
      }
      return total;
    }
    if (pinned >= 0) {
      seen.push_back(pinned);
      total = bytes[u(pinned)];
    }
    if (pos < prefetch_from) prefetch = 0;
    for (std::size_t j = pos; j < seq.size() && j <= pos + u(prefetch); ++j) {
      if (std::find(seen.begin(), seen.end(), seq[j]) != seen.end()) continue;
      seen.push_back(seq[j]);
      total = checked_add(total, bytes[seq[j]], "gathered parameters");
    }
    return total;
  }
};

// One stage of one layout: its sizes and what it holds, filled in the order a reader follows the
// step: the persistent books, one micro-batch's activations, the instants, the figures.
class Stage {
 public:
  Stage(const ModelConfig& m, const TrainConfig& t, const ParallelConfig& p, std::int64_t index,
        std::int64_t grad_rank = 0)
      : grad_rank_(grad_rank),
        m_(m),
        t_(t),
        p_(p),
        l_(make_local(m, t, p, grad_rank)),
        g_(make_dims(m, t)),
        first_(index == 0),
        last_(index == p.pp - 1),
        lomo_(t.optimizer == Optimizer::lomo),
        sel_(t.checkpointing == Checkpointing::selective && t.attention == Attention::eager),
        Ls_(m.layers / p.pp),
        off_(t.offload_activations && Ls_ >= 2) {
    // Which of the stage's layers are checkpointed (the global index of local layer k is
    // index·Ls + k); `full_`: every one of them.
    for (std::int64_t k = 0; k < Ls_; ++k) ck_.push_back(t.checkpointed(index * Ls_ + k));
    ck_count_ = std::count(ck_.begin(), ck_.end(), true);
    full_ = Ls_ > 0 && ck_count_ == Ls_;
    if (t.offload_activations && p.pp > 1)
      throw Error("analytic native: activation offload is modelled without pipeline parallelism");
    if (lomo_ && p.distributed())
      throw Error("analytic native: LOMO is modelled on one GPU only (ParallelConfig::resolve)");
    require_native_moe(m, t, "profile native");
    check_moe_layout(p, m, t);  // what the sharded step runs of a mixture of experts per rank
    if (t.lora() && (lomo_ || t.offload_activations))
      throw Error("analytic native: LoRA is modelled with adamw or sgd, without offload");
    check_lora_layout(p, t);  // what the sharded step runs of LoRA per rank
    fsdp2_ = p.per_parameter();
    r_.stage = index;
    r_.role = p.pp == 1 ? "only" : first_ ? "first" : last_ ? "last" : "middle";
    r_.ranks = p.dp * p.tp * p.cp;
    r_.layers = Ls_;
    r_.in_flight = std::min<std::int64_t>(p.pp - index, p.microbatches);
  }

  RankEstimate build() {
    books();
    activations();
    instants();
    figures();
    return std::move(r_);
  }

 private:
  void books();
  void per_parameter_books(std::uint64_t Pk, std::uint64_t N, std::uint64_t f);
  void fsdp2_units();
  void activations();
  void instants();
  void forward_instants();
  void head_instants();
  void layer_instants();
  // The steps of local layer kb's backward (its activations at step 1 from what it and the layers
  // below hold: kept_before, or offload's prefetched set).
  void layer_steps(std::int64_t kb);
  // The compute position of local layer k's backward (the ZeRO-3 window's index).
  std::uint64_t back_pos(std::int64_t k) const { return u(Ls_) + 2 + u(Ls_ - 1 - k); }
  void figures();
  // An instant: the persistent books, `act` bytes of this micro-batch's activations (plus the
  // other micro-batches in flight), workspace `ws`, communication `comm` beside the buckets and
  // the ZeRO-3 window at compute position `pos`, and `grads` bytes of gradients.
  void at(std::string name, std::uint64_t act, std::uint64_t ws, std::uint64_t comm,
          std::uint64_t pos, std::uint64_t grads, bool in_flight = true);
  // Gradient bytes alive in backward, LOMO allocating `lomo_bytes` around its op (the persistent
  // gradients otherwise).
  std::uint64_t grads(std::uint64_t lomo_bytes) const {
    if (fsdp2_) return csum({fg_base_, fg_cum_}, "gradients");
    return lomo_ ? csum({tied_lomo_, lomo_bytes}) : r_.est.figures.gradients;
  }
  // Gradients alive before the head's backward: none under LOMO or FSDP2 (zero_grad sets them
  // to None), else the persistent ones.
  std::uint64_t grads_before_head() const {
    if (fsdp2_) return fsdp2_all_;  // a later micro-batch: the earlier ones' sharded gradients
    return lomo_ ? 0 : r_.est.figures.gradients;
  }
  // FSDP2's gradient path (per-parameter sharding; docs/distributed.md): the units' sharded
  // gradients made so far and the root's unsharded ones (fg_base_), the current unit's unsharded
  // gradients made so far in its backward (fg_cum_), the reduce-scatter input in flight
  // (fg_held_, communication).
  bool fsdp2_ = false;
  std::uint64_t fg_base_ = 0, fg_cum_ = 0, fg_held_ = 0;
  std::uint64_t fsdp2_layer_shard_ = 0;  // a layer's S_u·w
  // Several micro-batches: from the second on, every unit's sharded gradient is alive (each
  // later reduce-scatter output is added into it and freed); 0 with one micro-batch.
  std::uint64_t fsdp2_all_ = 0;
  void fsdp2_backward_instants();
  // A transient (b, s, h) gather / partial buffer under sequence parallelism.
  std::uint64_t gather_buffer() const { return p_.sp ? l_.full : 0; }
  // Context parallelism (docs/distributed.md, "Context parallelism"): ring attention's receive
  // buffers of key/value blocks, (2, b, s/c, k·d) D each, min(cp-1, 2) of them; the two fp32
  // key/value gradient accumulators of the backward; the fp32 (b, s/c, a·d) accumulator of the
  // output (forward) or of d_q (backward), in workspace.
  std::uint64_t ring_buffers() const { return u(std::min<std::int64_t>(p_.cp - 1, 2)); }
  std::uint64_t ring_kv() const {
    return p_.cp > 1 ? checked_mul(ring_buffers(), bytes_of({2, l_.b, l_.s, l_.kd}, l_.w)) : 0;
  }
  std::uint64_t ring_dkv() const {
    return p_.cp > 1 ? checked_mul(2, bytes_of({2, l_.b, l_.s, l_.kd}, 4)) : 0;
  }
  // The layer's rows up to attn_out (probs among them, under selective), allocated when the
  // attention runs.
  std::uint64_t through_attn_out() const {
    std::uint64_t t = 0;
    for (const auto& e : set(Ls_ - 1)) {  // the attention's rows: the same in either kind
      t = checked_add(t, e.bytes, "activations");
      if (e.name == "attn_out") break;
    }
    return t;
  }
  // Local layer k's rows up to and including `name` (in allocation order).
  std::uint64_t rows_through(const char* name, std::int64_t k) const {
    std::uint64_t t = 0;
    for (const auto& e : set(k)) {
      t = checked_add(t, e.bytes, "activations");
      if (e.name == name) return t;
    }
    throw Error(std::string("analytic native: no row ") + name);
  }
  std::uint64_t ring_acc() const { return p_.cp > 1 ? bytes_of({l_.b, l_.s, l_.ad}, 4) : 0; }
  std::string layer_name(std::int64_t k) const {  // "L-1" on one stage, the stage's index else
    return p_.pp == 1 ? "L-" + std::to_string(Ls_ - k) : std::to_string(k);
  }

  static constexpr std::uint64_t kNoUnit = ~std::uint64_t{0};  // nothing gathered

  // Per-parameter sharding: the rank in the gradient group whose books these are (its optimizer
  // states hold the rows it owns); the other layouts' ranks of a stage have identical books.
  const std::int64_t grad_rank_;
  const ModelConfig& m_;
  const TrainConfig& t_;
  const ParallelConfig& p_;
  const Local l_;
  const Dims g_;
  const bool first_, last_, lomo_;
  // Selective recompute with eager attention: `probs` freed after the attention forward and
  // recomputed at backward step 6 (flash keeps no s² tensor: selective changes nothing there).
  const bool sel_;
  const std::int64_t Ls_;
  // --offload-activations with two layers or more (one layer has nothing to offload): layer k's
  // offload set O_k (its input and what it keeps, `out` excepted: keeps(k) bytes) leaves the
  // device after layer k+1's forward and comes back at the start of layer k+1's backward.
  const bool off_;
  std::vector<bool> ck_;  // per local layer: checkpointed
  std::int64_t ck_count_ = 0;
  bool full_ = false;
  // The bytes selective recompute drops from a layer's set (probs), 0 otherwise.
  std::uint64_t dropped() const { return sel_ ? l_.store : 0; }
  // What local layer k keeps at the end of its forward: its `out` when checkpointed, else its
  // whole set (less probs under selective recompute).
  std::uint64_t keeps(std::int64_t k) const {
    return ck_[u(k)] ? l_.X : csub(sum_bytes(set(k)), dropped(), "selective");
  }
  // The stage input and what local layers [0, k) keep.
  std::uint64_t kept_before(std::int64_t k) const {
    std::uint64_t t = l_.X;
    for (std::int64_t j = 0; j < k; ++j) t = checked_add(t, keeps(j), "activations");
    return t;
  }
  // Offload: the layer whose predecessor's set is the largest (the first such in the order
  // `from`, `to` with step `dir`); both its forward and its backward hold that set beside its own.
  std::int64_t largest_predecessor(std::int64_t from, std::int64_t to, int dir) const {
    std::int64_t best = from;
    for (std::int64_t k = from; k != to + dir; k += dir)
      if (keeps(k - 1) > keeps(best - 1)) best = k;
    return best;
  }
  // LoRA dropout in a layer's forward (and its recompute): each group of targets drops its input
  // into a (b, s, in) D transient while the layer's rows through `rows` exist (q/k/v: through
  // their adapters' rows; o: through h_mid; gate/up: through theirs; down: through its own).
  struct DropPoint {
    std::string what;
    std::uint64_t rows, drop;
  };
  std::vector<DropPoint> drop_points() const {
    std::vector<DropPoint> v;
    if (!l_.drop) return v;
    auto group = [&](unsigned bits, const char* what, std::uint64_t rows) {
      if (l_.targets(bits))
        v.push_back({std::string(what) + " (LoRA dropout: the adapter's input dropped)", rows,
                     l_.drop_max(bits)});
    };
    // The forward (not the recompute) has dropped probs under selective by o_proj.
    const std::int64_t k = Ls_ - 1;  // LoRA: every layer dense
    group(7u, "q/k/v adapters", csum({rows_through("v", k), l_.lora_rows(7u)}));
    group(1u << 3, "o_proj adapter", csub(rows_through("h_mid", k), dropped(), "selective"));
    group(3u << 4, "gate/up adapters",
          csub(csum({rows_through("up", k), l_.lora_rows(3u << 4)}), dropped(), "selective"));
    group(1u << 6, "down_proj adapter",
          csub(csum({rows_through("act", k), l_.lora_rows(1u << 6)}), dropped(), "selective"));
    return v;
  }
  RankEstimate r_;
  GatherPlan gather_;
  std::uint64_t buckets_ = 0;    // the reduce bucket(s), alive all step
  std::uint64_t emb_grad_ = 0;   // LOMO: the (V, h) embedding / lm_head gradient
  std::uint64_t tied_lomo_ = 0;  // LOMO, tied: that gradient, alive from the head backward on
  // A dense layer's forward set [0] and a mixture-of-experts layer's [1] (a model with both: Qwen's
  // dense layers among MoE ones); kind(k) says which local layer k is.
  std::vector<TensorEntry> sets_[2];
  int kind(std::int64_t k) const { return m_.is_moe_layer(r_.stage * Ls_ + k) ? 1 : 0; }
  const std::vector<TensorEntry>& set(std::int64_t k) const { return sets_[kind(k)]; }
  // Whether the stage's layers are of both kinds, and the last local layer of a kind (-1: none).
  bool mixed() const { return last_of(0) >= 0 && last_of(1) >= 0; }
  std::int64_t last_of(int kd) const {
    for (std::int64_t k = Ls_ - 1; k >= 0; --k)
      if (kind(k) == kd) return k;
    return -1;
  }
  std::uint64_t mb_ = 0;      // one micro-batch's activations that stay on the stage
  std::uint64_t others_ = 0;  // the other in-flight micro-batches' activations
  std::uint64_t inputs_ = 0;  // tokens and targets on the stage
};

void Stage::books() {
  const Local& l = l_;
  // LoRA (one GPU): the adapters are in the params and are all that trains.
  const std::uint64_t La = layer_adapters(l);
  // Each local layer's parameters (its kind's: a dense MLP or the router and experts).
  auto Lu = [&](std::int64_t k) {
    return checked_add(layer_params(l, m_, kind(k) == 1), La, "parameters");
  };
  const std::uint64_t emb = checked_mul(l.V, l.h);
  std::uint64_t Pk = 0;
  for (std::int64_t k = 0; k < Ls_; ++k) Pk = checked_add(Pk, Lu(k), "parameters");
  // A mixture of experts: each MoE layer's E experts of three (m, h) matrices, in their own flat
  // vector (the rest stays in Pk's).
  std::uint64_t Pe = 0;
  for (std::int64_t k = 0; k < Ls_; ++k)
    if (kind(k) == 1)
      Pe = checked_add(Pe, checked_mul(l.El, checked_mul(3, checked_mul(l.m, l.h))));
  if (first_) Pk = checked_add(Pk, emb);
  const bool tied_here = m_.tied_embeddings && p_.pp == 1;
  if (last_) Pk = csum({Pk, l.h, tied_here ? 0 : emb}, "parameters");
  const std::uint64_t dp = u(p_.grad_ranks());  // ZeRO shards over dp·cp
  // The flat vector ZeRO shards: every parameter, or under LoRA the adapters only (the frozen
  // base whole on every rank under ZeRO 0-2, in a flat vector of its own under ZeRO-3).
  const std::uint64_t T = t_.lora() ? checked_mul(La, u(Ls_), "LoRA parameters") : Pk - Pe;
  const std::uint64_t shard = (T + dp - 1) / dp;
  const std::uint64_t edp = u(p_.edp());
  const std::uint64_t eshard = (Pe + edp - 1) / edp;
  r_.local_params = Pk;
  r_.shard_elements = p_.zero >= 1 ? shard : T;
  r_.padding_elements = p_.zero >= 1 ? checked_mul(shard, dp) - T : 0;
  r_.expert_params = Pe;
  r_.expert_shard_elements = p_.zero >= 1 ? eshard : Pe;
  r_.expert_padding_elements = p_.zero >= 1 ? checked_mul(eshard, edp) - Pe : 0;
  // The shards ZeRO >= 1 keeps states for (and ZeRO-2 gradients): both vectors' (eshard is 0 for
  // a dense model).
  const std::uint64_t shards = checked_add(shard, eshard, "shards");
  const std::uint64_t w = l.w;
  const std::uint64_t f = state_bytes_per_param(t_.optimizer, w);
  // Flat: every rank's states are a whole shard (of each vector).
  r_.owned_elements = r_.shard_elements + r_.expert_shard_elements;
  r_.grad_rank = grad_rank_;
  const bool off_opt = p_.offload != Offload::none,
             off_params = p_.offload == Offload::optimizer_params;

  Estimate& est = r_.est;
  est.profile = Profile::native;
  est.model = m_;
  est.train = t_;
  est.param_count = Pk;
  auto& fg = est.figures;
  // ZeRO-3: the rank's shard of each flat vector (a mixture of experts: the experts' over edp).
  fg.params = p_.zero == 3 ? (off_params ? 0 : checked_mul(shards, w)) : checked_mul(Pk, w);
  if (p_.zero == 3 && t_.lora()) {
    // LoRA under ZeRO-3: the frozen base in its own flat vector, sharded alike, beside the
    // adapters' shard (check_lora_layout: a 16-bit base, no parameter offload).
    const std::uint64_t F = csub(Pk, T, "frozen parameters");
    fg.params = checked_mul(csum({(F + dp - 1) / dp, shard}, "parameter shards"), w);
  }
  if (p_.zero >= 2)
    fg.gradients = off_opt ? 0 : checked_mul(shards, w);
  else
    fg.gradients = checked_mul(Pk, w);
  const std::uint64_t updated = p_.zero >= 1 ? shards : Pk;
  fg.optimizer_states = off_opt ? 0 : checked_mul(updated, f, "optimizer states");
  if (p_.per_parameter()) per_parameter_books(Pk, dp, f);
  if (t_.quantized()) {
    // QLoRA: each layer's seven projections as bitsandbytes' 4-bit tensors instead of D
    // (--quant int8: int8 and an fp32 absmax per row).
    std::uint64_t dense = 0, q4 = 0;
    for (unsigned j = 0; j < 7; ++j) {
      const std::uint64_t n = checked_mul(l.out_of(j), l.in_of(j), "parameters");
      dense = checked_add(dense, n, "parameters");
      q4 = checked_add(q4, quantized_weight_bytes(n, l.out_of(j), t_), "quantized weights");
    }
    const std::uint64_t Ld = u(Ls_);
    fg.params = csum({checked_mul(csub(Pk, checked_mul(dense, Ld), "4-bit weights"), w),
                      checked_mul(q4, Ld, "4-bit weights")},
                     "parameters");
  }
  if (t_.lora()) {
    fg.gradients = p_.zero < 2 ? checked_mul(T, w, "gradients")
                   : off_opt   ? 0
                               : checked_mul(shard, w, "gradients");
    fg.optimizer_states =
        off_opt ? 0 : checked_mul(p_.zero >= 1 ? shard : T, f, "optimizer states");
    est.trainable_params = T;
  }
  if (!p_.distributed()) {
    // The whole model: its largest gradient (by name) from the parameter list, and LOMO's
    // gradient figure (one gradient at a time; tied: the shared one beside the largest other).
    const StateFigures st = state_figures(m_, t_);
    est.largest_gradient_bytes = st.largest_gradient_bytes;
    est.largest_gradient_name = st.largest_gradient_name;
    if (lomo_) fg.gradients = st.gradients;
    if (bnb_optimizer(t_.optimizer)) {
      fg.optimizer_states = st.optimizer_states;
      est.optimizer_states_managed = st.optimizer_states_managed;
    }
  }
  if (lomo_) {
    emb_grad_ = checked_mul(emb, w);
    tied_lomo_ = m_.tied_embeddings ? emb_grad_ : 0;
  }
  if (off_opt) {
    auto host = [&](std::string name, std::uint64_t bytes, std::string why) {
      TensorEntry e;
      e.name = std::move(name);
      e.shape = "(shard)";
      e.dtype = "fp32";
      e.bytes = bytes;
      e.why = std::move(why);
      r_.host_bytes = checked_add(r_.host_bytes, bytes, "host bytes");
      r_.host.push_back(std::move(e));
    };
    host("optimizer states", checked_mul(shard, f), "the shard's optimizer states");
    host("gradient shard", checked_mul(shard, 4), "fp32 gradients the host optimizer reads");
    if (off_params) {
      host("parameter shard", checked_mul(shard, w), "16-bit parameter shard, gathered per unit");
      r_.host.back().dtype = g_.dt;
    }
    // A mixture of experts: the experts' shard alike (DeepSpeed offloads each MoE parameter
    // group's partition over its expert-data-parallel group).
    if (eshard > 0) {
      host("expert optimizer states", checked_mul(eshard, f),
           "the experts' shard's optimizer states (over the " + std::to_string(edp) +
               " expert-data-parallel ranks)");
      host("expert gradient shard", checked_mul(eshard, 4),
           "fp32 gradients of the experts' shard the host optimizer reads");
      if (off_params) {
        host("expert parameter shard", checked_mul(eshard, w),
             "the experts' parameter shard, gathered into each MoE layer's unit");
        r_.host.back().dtype = g_.dt;
      }
    }
  }

  // Communication buffers allocated at setup: the reduce bucket(s) of ZeRO-2/3.
  // The largest trainable tensor: of attention, of a dense MLP where the stage has one, of a MoE
  // layer (the experts' gate_up_proj (E, 2m, h), the router (E, h), a shared expert's (m_s, h)).
  std::uint64_t largest = std::max(checked_mul(l.h, l.ad), checked_mul(l.h, l.kd));
  for (std::int64_t k = 0; k < Ls_; ++k)
    largest = std::max(
        largest, kind(k) == 1 ? std::max({checked_mul(checked_mul(2, l.El), checked_mul(l.m, l.h)),
                                          checked_mul(l.E, l.h), checked_mul(l.ms, l.h)})
                              : checked_mul(l.h, l.i));
  if (first_ || last_) largest = std::max(largest, emb);
  if (t_.lora()) largest = largest_adapter(l);  // the bucket holds trainable gradients only
  if (p_.zero >= 2 && !fsdp2_) {  // FSDP2 reduce-scatters each unit (fsdp2_backward_instants)
    const std::uint64_t n = std::min(std::max(p_.reduce_bucket, largest), T + Pe);
    for (int c = 0; c < (p_.overlap_comm ? 2 : 1); ++c) {
      TensorEntry e = entry(g_, c == 0 ? "reduce_bucket" : "reduce_bucket.1", "(n)", g_.dt,
                            checked_mul(n, w), Term::other, "setup (persistent)",
                            "gradients are produced here and reduce-scattered into the shard; "
                            "n = min(max(reduce bucket, largest tensor), local params) = " +
                                std::to_string(n));
      buckets_ = checked_add(buckets_, e.bytes);
      r_.communication.push_back(std::move(e));
    }
  }
  if (p_.zero == 3) {
    gather_.bytes.assign(u(Ls_) + 2, 0);
    for (std::int64_t k = 0; k < Ls_; ++k) gather_.bytes[u(k) + 1] = checked_mul(Lu(k), w);
    gather_.bytes[0] = checked_mul(emb, w);
    gather_.bytes[u(Ls_) + 1] = checked_mul(checked_add(emb, l.h), w);  // final norm + head
    gather_.seq.push_back(0);
    for (std::int64_t k = 0; k < Ls_; ++k) gather_.seq.push_back(static_cast<int>(1 + k));
    gather_.seq.push_back(static_cast<int>(Ls_ + 1));
    for (std::int64_t k = Ls_ - 1; k >= 0; --k) gather_.seq.push_back(static_cast<int>(1 + k));
    if (p_.per_parameter()) fsdp2_units();
    // The largest layer's unit (a MoE layer's holds the rank's El experts of m/etp columns,
    // gathered from the expert-data-parallel ranks, beside its dense part from the dp·cp ranks).
    const std::uint64_t largest_unit =
        *std::max_element(gather_.bytes.begin() + 1, gather_.bytes.end() - 1);
    const std::uint64_t unit_experts =
        Pe > 0 ? checked_mul(l.El, checked_mul(3, checked_mul(l.m, l.h))) : 0;
    r_.communication.push_back(entry(
        g_, "gathered units", "(layer params)", g_.dt, largest_unit, Term::other,
        "forward and backward of each unit",
        "ZeRO-3: one unit's parameters gathered, plus " + std::to_string(p_.prefetch) +
            " prefetched" +
            (p_.per_parameter() ? " (FSDP2: each parameter padded to N·ceil(rows/N) rows)" : "") +
            (unit_experts > 0
                 ? "; a MoE layer's unit holds its " + std::to_string(l.El) + " local experts (" +
                       std::to_string(unit_experts) + " elements), gathered over the " +
                       std::to_string(edp) + " expert-data-parallel ranks"
                 : "")));
    if (p_.per_parameter()) {
      r_.communication.push_back(
          entry(g_, "gathered root", "(embedding, final norm, lm_head)", g_.dt, gather_.bytes[0],
                Term::other, "from the first forward position to the end of the backward",
                "FSDP2: the root unit (fully_shard(model)) is not resharded after forward"));
      r_.communication.push_back(
          entry(g_, "reduce_scatter (layer)", "(N·S_layer)", g_.dt, gather_.bytes[1], Term::other,
                "from a layer's post-backward to the next unit's",
                "FSDP2: a unit's gradients copied in, padded, for the reduce-scatter; one in "
                "flight"));
      r_.communication.push_back(
          entry(g_, "reduce_scatter (root)", "(N·S_root)", g_.dt, gather_.bytes[0], Term::other,
                "the root's post-backward, at the end of the backward",
                "FSDP2: the embedding's, final norm's and lm_head's gradients, padded"));
    }
  }
  if (l.ep) {  // the all-to-all's buffers of each MoE layer (docs/distributed.md)
    // Under --capacity-factor E·c rows, of which the kept ones are sent.
    const std::string kept =
        l.cap > 0 ? "; the choices within the capacity c = " + std::to_string(l.cap) +
                        " of each expert are sent"
                  : "";
    r_.communication.push_back(entry(g_, "dispatch.send", l.cap > 0 ? "(E·c,h)" : "(b·s·K,h)",
                                     g_.dt, l.nkh, Term::sbh,
                                     "each MoE layer's dispatch, forward and recompute",
                                     (l.a2a ? "expert parallelism: the rank's rows in expert "
                                              "order, sent to their experts' ranks (transient)"
                                            : "expert tensor parallelism: the rank's rows in "
                                              "expert order, gathered over the etp group "
                                              "(transient)") +
                                         kept));
    if (l.a2a && l.etp)
      r_.communication.push_back(entry(g_, "a2a.recv", "(A,h)", g_.dt, l.eah, Term::sbh,
                                       "each MoE layer's dispatch, forward and recompute",
                                       "expert tensor parallelism: the rows the all-to-all "
                                       "brings, gathered over the etp group (transient); A = " +
                                           std::to_string(l.ea) + " under balanced routing"));
    if (l.etp)
      r_.communication.push_back(entry(g_, "combine.partial", "(R,h)", g_.dt, l.erh, Term::sbh,
                                       "each MoE layer's combine, forward and recompute",
                                       "expert tensor parallelism: the down projections' partial "
                                       "outputs of the etp group's rows, reduce-scattered "
                                       "(transient); R = " +
                                           std::to_string(l.er) + " under balanced routing"));
    if (l.a2a)
      r_.communication.push_back(entry(
          g_, "combine.send", l.etp ? "(A,h)" : "(R,h)", g_.dt, l.etp ? l.eah : l.erh, Term::sbh,
          "each MoE layer's combine, forward and recompute",
          "expert parallelism: the experts' outputs of the received rows, returned to "
          "their ranks (transient); " +
              std::string(l.etp ? "A = " + std::to_string(l.ea) : "R = " + std::to_string(l.er)) +
              " under balanced routing"));
  }
  if (p_.sp)
    r_.communication.push_back(entry(g_, "sp gather/partial", "(b,s,h)", g_.dt, l.full, Term::sbh,
                                     "around each tensor-parallel GEMM group",
                                     "sequence parallelism: all-gather input / reduce-scatter "
                                     "partial output, transient"));
  if (p_.cp > 1) {
    const std::string n = std::to_string(ring_buffers());
    r_.communication.push_back(entry(
        g_, "ring.kv", n + "×(2,b,s/c," + l.lk + "·d)", g_.dt, ring_kv(), Term::other,
        "each layer's attention, forward and backward",
        "context parallelism: key/value blocks received from the previous rank of the ring (" + n +
            " buffer(s): min(cp-1, 2), alternating)"));
    r_.communication.push_back(
        entry(g_, "ring.dkv", "2×(2,b,s/c," + l.lk + "·d)", "fp32", ring_dkv(), Term::other,
              "each layer's attention backward",
              "context parallelism: the key/value gradient accumulator that travels with its "
              "block, and the one being received"));
  }
}

void Stage::per_parameter_books(std::uint64_t Pk, std::uint64_t N, std::uint64_t f) {
  // FSDP2's fully_shard (docs/distributed.md, "FSDP2: per-parameter sharding"): every parameter
  // split on dim 0 into chunks of c = ceil(rows/N) rows; each rank stores c rows of every
  // parameter and of its gradient (padded: the reduce-scatter output), and optimizer states for
  // the rows it owns (unpadded: zeros_like of the local view). Shapes as the rank holds them
  // (tensor parallelism splits before FSDP2 does); check_lora_layout refuses LoRA here.
  const Local& l = l_;
  const std::uint64_t k = u(grad_rank_);
  std::uint64_t chunks = 0, owned = 0, elems = 0, tensors = 0;
  auto add = [&](std::uint64_t rows, std::uint64_t cols, std::uint64_t count) {
    chunks = checked_add(chunks, checked_mul(count, checked_mul(shard_chunk_rows(rows, N), cols)),
                         "parameter chunks");
    owned = checked_add(owned, checked_mul(count, checked_mul(shard_owned_rows(rows, N, k), cols)),
                        "owned rows");
    elems = checked_add(elems, checked_mul(count, checked_mul(rows, cols)), "parameters");
    tensors += count;
  };
  if (first_) add(l.V, l.h, 1);
  for (std::int64_t layer = 0; layer < Ls_; ++layer) {
    add(l.h, 1, 2);     // input_layernorm, post_attention_layernorm
    add(l.ad, l.h, 1);  // q_proj
    add(l.kd, l.h, 2);  // k_proj, v_proj
    add(l.h, l.ad, 1);  // o_proj: (h, a·d/t), rows whole
    add(l.i, l.h, 2);   // gate_proj, up_proj
    add(l.h, l.i, 1);   // down_proj: (h, i/t)
    if (m_.qkv_bias) {
      add(l.ad, 1, 1);
      add(l.kd, 1, 2);
    }
    if (m_.qk_norm) add(l.d, 1, 2);
  }
  if (last_) {
    add(l.h, 1, 1);
    if (!(m_.tied_embeddings && p_.pp == 1)) add(l.V, l.h, 1);
  }
  if (elems != Pk)
    throw Error("analytic native: per-parameter shapes cover " + std::to_string(elems) +
                " elements, the stage holds " + std::to_string(Pk));
  r_.shard_elements = chunks;
  r_.padding_elements = checked_mul(chunks, N) - Pk;
  r_.owned_elements = owned;
  auto& fg = r_.est.figures;
  fg.params = checked_mul(chunks, l.w, "parameters");
  fg.gradients = checked_mul(chunks, l.w, "gradients");
  fg.optimizer_states = checked_mul(owned, f, "optimizer states");
  if (p_.microbatches > 1) fsdp2_all_ = fg.gradients;
  if (t_.optimizer == Optimizer::adamw) {
    // torch.optim.AdamW's `step`: one fp32 scalar per parameter tensor, on the host unless
    // capturable or fused (torch/optim/adam.py, _init_group).
    TensorEntry e;
    e.name = "adamw.step";
    e.shape = "(" + std::to_string(tensors) + " scalars)";
    e.dtype = "fp32";
    e.bytes = checked_mul(tensors, 4);
    e.why = "AdamW's step count, one fp32 scalar per parameter tensor in host memory";
    r_.host_bytes = checked_add(r_.host_bytes, e.bytes, "host bytes");
    r_.host.push_back(std::move(e));
  }
}

void Stage::fsdp2_backward_instants() {
  // FSDP2's backward (docs/distributed.md, "FSDP2: per-parameter sharding"): every layer, in
  // backward order, holds the sharded gradients of the layers above it and the root's unsharded
  // ones (lm_head's, the final norm's), its own unsharded gradients as its steps make them, and
  // the reduce-scatter input of the layer above; at its post-backward its parameters are
  // resharded, that input released and its own allocated beside its unsharded gradients. Then
  // the embedding's backward, the root's post-backward (its gradients reduce-scattered) and the
  // optimizer step (every unit's sharded gradient).
  const Local& l = l_;
  const std::uint64_t C = kCublasWorkspaceBytes;
  const std::uint64_t root_head = csum({bytes_of({l.V, l.h}, l.w), bytes_of({l.h}, l.w)},
                                       "gradients");  // lm_head (tied: the embedding), norm
  fg_base_ = csum({fsdp2_all_, root_head}, "gradients");
  fg_held_ = 0;
  for (std::int64_t kb = Ls_ - 1; kb >= 0; --kb) {
    fg_cum_ = 0;
    layer_steps(kb);
    // The post-backward: the layer's activations and input freed, d_residual alive; its
    // parameters resharded, the previous input released and its own allocated.
    const std::uint64_t pos = back_pos(kb);
    fg_held_ = gather_.bytes[1];
    at("backward layer " + layer_name(kb) +
           " post-backward: reduce-scatter input (unsharded gradients alive)",
       csub(kept_before(kb), l.X, "the layer's input"), csum({C, l.X}),
       csub(gather_.window(pos, p_.prefetch), gather_.bytes[u(kb) + 1], "resharded"), kNoUnit,
       grads(0));
    if (fsdp2_all_ == 0) fg_base_ = checked_add(fg_base_, fsdp2_layer_shard_, "gradients");
    fg_cum_ = 0;
  }
  // The embedding's backward (untied: its unsharded gradient beside the others).
  if (!m_.tied_embeddings) fg_cum_ = bytes_of({l.V, l.h}, l.w);
  at("backward embedding: embed_tokens gradient (FSDP2: the root still gathered)", 0,
     csum({C, l.X}), csum({gather_.bytes[0], p_.sp ? l.full : 0}), kNoUnit, grads(0));
  // The root's post-backward: gathered root and d_residual freed, layer 0's input released.
  fg_held_ = gather_.bytes[0];
  at("root post-backward: reduce-scatter input (the root's unsharded gradients alive)", 0, C, 0,
     kNoUnit, grads(0));
  fg_held_ = 0;
  fg_base_ = r_.est.figures.gradients;  // every unit's sharded gradient
  fg_cum_ = 0;
  at("optimizer step: every unit's sharded gradient", 0, C, 0, kNoUnit, grads(0),
     /*in_flight=*/false);
}

void Stage::fsdp2_units() {
  // FSDP2's unsharded parameters (docs/distributed.md, "FSDP2: per-parameter sharding"): each
  // parameter gathered into its own padded buffer of N·ceil(rows/N) rows
  // (FSDPParam.init_all_gather_outputs), and the root unit (the embedding, the final norm and
  // lm_head: fully_shard(model)'s) gathered at the first position and kept through the backward,
  // the head's position included (the root is not resharded after forward).
  const Local& l = l_;
  const std::uint64_t N = u(p_.grad_ranks());
  auto padded = [&](std::uint64_t rows, std::uint64_t cols) {
    return checked_mul(checked_mul(shard_chunk_rows(rows, N), N), cols, "gathered unit");
  };
  std::uint64_t layer =
      csum({checked_mul(2, padded(l.h, 1)), padded(l.ad, l.h), checked_mul(2, padded(l.kd, l.h)),
            padded(l.h, l.ad), checked_mul(2, padded(l.i, l.h)), padded(l.h, l.i)},
           "gathered unit");
  if (m_.qkv_bias)
    layer = csum({layer, padded(l.ad, 1), checked_mul(2, padded(l.kd, 1))}, "gathered unit");
  if (m_.qk_norm) layer = checked_add(layer, checked_mul(2, padded(l.d, 1)), "gathered unit");
  for (std::int64_t k = 0; k < Ls_; ++k) gather_.bytes[u(k) + 1] = checked_mul(layer, l.w);
  const bool tied = m_.tied_embeddings;  // pp is 1 under ZeRO-3: the head is the embedding
  gather_.bytes[0] = checked_mul(
      csum({padded(l.V, l.h), padded(l.h, 1), tied ? 0 : padded(l.V, l.h)}, "gathered unit"), l.w);
  gather_.bytes[u(Ls_) + 1] = 0;
  gather_.seq[u(Ls_) + 1] = 0;
  gather_.pinned = 0;
  // A layer's sharded gradient (the reduce-scatter output) is 1/N of its padded buffer.
  fsdp2_layer_shard_ = gather_.bytes[1] / N;
  // Forward (positions 0..L): the unit computing alone (FSDP2 reshards a layer in its
  // post-forward before the next pre-forward gathers); from the head on (the root's pre-backward
  // prefetches the last layer) the backward's implicit prefetch.
  gather_.prefetch_from = u(Ls_) + 1;
  gather_.keep = !p_.reshard_after_forward;
}

void Stage::activations() {
  const Local& l = l_;
  const std::string& D = g_.dt;
  auto& acts = r_.est.activations;
  const std::string res = "(b," + l.rows + ",h)";
  const bool split = p_.tp > 1;
  if (first_)
    acts.embedding.push_back(entry(g_, "embed_out", res, D, l.X, Term::sbh,
                                   "layer 0's input_layernorm backward",
                                   std::string("embedding output x_0, layer 0's input") +
                                       (split ? " (all-reduced over the vocabulary shards)" : "")));
  else
    acts.embedding.push_back(entry(g_, "stage_input", res, D, l.X, Term::sbh,
                                   "the stage's first input_layernorm backward",
                                   "activation received from the previous stage"));
  for (int kd = 0; kd < 2; ++kd)
    sets_[kd] = layer_set(g_, l, t_.attention, p_.sp, m_.qk_norm, kd == 1);
  // `layer` lists a MoE layer's set when any layer is one; with dense layers among them (Qwen),
  // `layer_dense` lists a dense layer's, for the dense layers that keep their whole set (a
  // checkpointed layer of either kind keeps its `out` alone).
  const std::vector<TensorEntry>& S = sets_[last_of(1) >= 0 ? 1 : 0];
  std::vector<TensorEntry> kept{S.back()};  // `out`: the next layer's checkpointed input
  kept.back().kept_by = "checkpointing: kept as the next layer's input";
  kept.back().why = "the only tensor a checkpointed layer keeps; the rest is recomputed";
  std::vector<TensorEntry> recompute(S.begin(), S.end() - 1);
  for (auto& e : recompute) e.kept_by = "recomputed in backward; " + e.kept_by;
  auto without_probs = [](const std::vector<TensorEntry>& set) {
    std::vector<TensorEntry> v;
    for (const auto& e : set)
      if (e.name != "probs") v.push_back(e);
    return v;
  };
  if (sel_) {
    // Selective: every layer keeps its set but probs, recomputed at backward step 6.
    acts.layer = without_probs(S);
    for (const auto& e : S)
      if (e.name == "probs") {
        acts.recompute.push_back(e);
        acts.recompute.back().kept_by =
            "selective recompute: freed after the attention forward, recomputed at backward step 6";
      }
  } else {
    split_layers(acts, t_, r_.stage * Ls_, Ls_, S, std::move(kept), std::move(recompute));
  }
  if (mixed()) {
    std::int64_t dense = 0;
    for (std::int64_t k = 0; k < Ls_; ++k) dense += kind(k) == 0 && !ck_[u(k)];
    if (dense > 0) {
      acts.layer_dense = sel_ ? without_probs(sets_[0]) : sets_[0];
      acts.dense_layers = dense;
    }
  }
  if (last_) {
    acts.head.push_back(entry(g_, "final_norm_out", res, D, l.X, Term::sbh, "lm_head backward",
                              "input of the lm_head GEMM (dW_head)"));
    acts.head.push_back(entry(g_, "final_rstd", "(b," + l.rows + ")", "fp32", l.r4, Term::sb,
                              "final norm backward", "1/rms of each row of x_L"));
    acts.head.push_back(entry(g_, "logits", "(b,s," + l.lV + ")", D, l.logits, Term::other,
                              "cross-entropy backward (in place)",
                              split ? "the rank's vocabulary shard; d logits are written into it"
                                    : "d logits are written into this buffer"));
    acts.head.push_back(entry(
        g_, "ce_lse", "(b,s)", "fp32", l.bs4, Term::sb, "cross-entropy backward",
        split ? "row log-sum-exp over all vocabulary shards" : "row log-sum-exp of the logits"));
  }
  if (first_)
    acts.inputs.push_back(
        entry(g_, "tokens", "(b,s)", "int32", l.bs4, Term::sb, "embedding backward", "token ids"));
  if (last_)
    acts.inputs.push_back(entry(g_, "targets", "(b,s)", "int32", l.bs4, Term::sb, "cross-entropy",
                                "next-token labels (-1 at each row's end)"));
  finish(acts, Ls_);
  if (off_) {
    // On the host at the end of forward: O_0 .. O_{L-2}, the sum of keeps(k) over those layers
    // (each O_k is x_k and layer k's keep less its `out`, which is x_{k+1}: the x's telescope).
    std::uint64_t host = 0;
    for (std::int64_t k = 0; k + 1 < Ls_; ++k) host = checked_add(host, keeps(k), "offload");
    acts.offloaded_bytes = host;
    acts.total_bytes = csub(acts.total_bytes, host, "offloaded activations");
    r_.est.offload_host_bytes = host;
    r_.est.offload_transfer_bytes = checked_mul(2, host, "offload transfer bytes");
    TensorEntry e = entry(g_, "offloaded activations", "(layers 0..L-2)", g_.dt, host, Term::other,
                          "after the next layer's forward, until one layer ahead of its backward",
                          "--offload-activations: each layer's input and saved rows");
    r_.host_bytes = checked_add(r_.host_bytes, host, "host bytes");
    r_.host.push_back(std::move(e));
  }
  inputs_ = sum_bytes(acts.inputs);
  // A non-last stage frees its last layer's `out` once sent.
  mb_ = last_ ? acts.total_bytes : csub(acts.total_bytes, l.X, "stage output");
  others_ = checked_mul(u(r_.in_flight - 1), mb_, "in-flight activations");
}

void Stage::at(std::string name, std::uint64_t act, std::uint64_t ws, std::uint64_t comm,
               std::uint64_t pos, std::uint64_t grads, bool in_flight) {
  const auto& fg = r_.est.figures;
  Instant in;
  in.name = std::move(name);
  in.bytes[P] = fg.params;
  in.bytes[G] = grads;
  in.bytes[O] = fg.optimizer_states;
  in.bytes[A] = checked_add(act, in_flight ? others_ : 0, "activations");
  in.bytes[W] = ws;
  in.bytes[I] = inputs_;
  const std::uint64_t window =
      p_.zero == 3 && pos != kNoUnit ? gather_.window(pos, p_.prefetch) : 0;
  in.bytes[X] = csum({buckets_, comm, window, fsdp2_ ? fg_held_ : 0}, "communication");
  r_.est.instants.push_back(std::move(in));
}

void Stage::instants() {
  at("start of step", 0, kCublasWorkspaceBytes, 0, kNoUnit, fsdp2_ ? 0 : grads_before_head(),
     /*in_flight=*/false);
  forward_instants();
  head_instants();
  layer_instants();
}

void Stage::forward_instants() {
  const Local& l = l_;
  const std::uint64_t C = kCublasWorkspaceBytes;
  const std::uint64_t G0 = grads_before_head();
  const std::uint64_t sg = gather_buffer();
  if (fsdp2_) {
    // FSDP2's all-gathers in forward: the flat output beside the unit's buffers it is copied
    // into; the root's first, then each layer's beside what the layers below keep (the last
    // layer's holds the most).
    at("forward: root all-gather copied out (FSDP2)", 0, C, gather_.bytes[0], 0, G0);
    if (Ls_ > 0)
      at("forward: layer " + layer_name(Ls_ - 1) + " all-gather copied out (FSDP2)",
         kept_before(Ls_ - 1), C, gather_.bytes[u(Ls_)], u(Ls_), G0);
  }
  if (first_ && (p_.sp || p_.zero == 3))
    at("forward: embed_out allocated" + std::string(p_.sp ? " (partial alive)" : ""), l.X, C, sg, 0,
       G0);
  // Forward of the last layers: their `out` allocated (with the down partial under sp), the
  // stage input and the earlier layers' sets (or checkpoints) kept.
  const std::int64_t window_layers =
      p_.zero == 3 ? std::min<std::int64_t>(Ls_, p_.prefetch + 1) : 1;
  // The layers whose `out` allocation is an instant: the last ones (the ZeRO-3 window) and,
  // when only some layers are checkpointed, the last checkpointed one before them (its whole
  // set is alive then; the stage's kept bytes only grow with k, so earlier ones never exceed it).
  std::vector<std::int64_t> ks;
  if (ck_count_ > 0 && !full_) {
    std::int64_t last_ck = Ls_ - 1;
    while (!ck_[u(last_ck)]) --last_ck;
    if (last_ck < Ls_ - window_layers) ks.push_back(last_ck);
  }
  const bool last_layers =
      ck_count_ > 0 || sel_ || p_.sp || p_.zero == 3 || !last_ || off_ || p_.cp > 1;
  if (last_layers)
    for (std::int64_t k = std::max<std::int64_t>(0, Ls_ - window_layers); k < Ls_; ++k)
      ks.push_back(k);
  // ZeRO-3 with dense layers among MoE ones: the units differ by kind, so an earlier layer's
  // window (a MoE unit prefetched where a later one holds a dense unit) may hold the most: every
  // layer is an instant.
  if (p_.zero == 3 && mixed())
    for (std::int64_t k = 0; k < Ls_; ++k) ks.push_back(k);
  if (mixed()) {
    // Dense layers among MoE ones (one GPU): the same two layers of each kind, whose sets differ.
    for (int kd = 0; kd < 2; ++kd) {
      std::int64_t last_ck = -1;
      for (std::int64_t k = 0; k < Ls_; ++k)
        if (kind(k) == kd && ck_[u(k)]) last_ck = k;
      if (last_ck >= 0 && !full_) ks.push_back(last_ck);
      if (last_layers) ks.push_back(last_of(kd));
    }
    std::sort(ks.begin(), ks.end());
    ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  }
  const std::uint64_t through_attn = through_attn_out();
  if (off_) {
    // Offload: layer k's forward holds O_{k-1} (still being copied out), its input x_k and its
    // own set; every earlier layer is on the host. The largest O_{k-1} decides, the first such k.
    // Under ZeRO-3 the last layers too: their gather window reaches the head's larger unit.
    ks.assign(1, largest_predecessor(1, Ls_ - 1, 1));
    if (p_.zero == 3)
      for (std::int64_t k = std::max<std::int64_t>(0, Ls_ - window_layers); k < Ls_; ++k)
        if (k != ks.front()) ks.push_back(k);
    std::sort(ks.begin(), ks.end());
  }
  // What is alive before local layer k's own rows: the stage input and the earlier layers' keeps
  // (offload: O_{k-1}, none for layer 0, and x_k).
  auto before = [&](std::int64_t k) {
    return off_ ? csum({k > 0 ? keeps(k - 1) : 0, l.X}) : kept_before(k);
  };
  // LoRA (one GPU, no offload): the last layer's forward holds the most beside each dropout.
  for (const DropPoint& dp : drop_points())
    at("forward: layer " + layer_name(Ls_ - 1) + " " + dp.what,
       csum({kept_before(Ls_ - 1), dp.rows}), csum({C, dp.drop}), 0, u(Ls_), G0);
  // A mixture of experts: the last MoE layer's router logits (workspace) beside its rows through
  // the routing's, right before they are freed (the experts' rows come after them, in one run of
  // allocations up to `out`).
  // Under ZeRO-3 every MoE layer of the last ones (the gather window) too: an earlier layer's
  // position holds more units (those prefetched for the layers after it).
  const std::int64_t k_last = last_of(1);
  std::vector<std::int64_t> routed;  // the MoE layers whose instants are in
  auto router = [&](std::int64_t km) {
    if (km < 0 || std::find(routed.begin(), routed.end(), km) != routed.end()) return;
    routed.push_back(km);
    at("forward: layer " + layer_name(km) + " router logits (routing rows allocated)",
       csum({kept_before(km), csub(rows_through("expert_offsets", km), dropped(), "selective")}),
       csum({C, l.bsE}), 0, u(km) + 1, G0);
    // The rows through `name` of the last MoE layer, with the layers below it.
    auto through = [&](const char* name) {
      return csum({kept_before(km), csub(rows_through(name, km), dropped(), "selective")});
    };
    // Expert parallelism: the dispatch buffer (the rank's own nk rows in expert order) beside the
    // rows it sends to expert_in, then the combine buffer (the experts' outputs of the received
    // rows) beside expert_out, which it returns (docs/distributed.md, "Expert parallelism").
    // (A MoE layer's router gathers nothing under sp: it routes the rank's own rows.)
    // Expert tensor parallelism with ep > 1: the all-to-all into a2a.recv (A rows) beside
    // dispatch.send, the gather from a2a.recv into expert_in, the partial outputs (R rows)
    // reduce-scattered into combine.send (A rows), returned into expert_out (at ep 1 the gather
    // reads dispatch.send and the scatter writes expert_out: the two instants above, with the
    // partial as the combine's buffer).
    const std::string L = "forward: layer " + layer_name(km);
    if (l.a2a && l.etp) {
      at(L + " dispatch (a2a.recv received, dispatch.send alive)", through("expert_offsets"), C,
         csum({l.nkh, l.eah}), u(km) + 1, G0);
      at(L + " etp gather (expert_in gathered, a2a.recv alive)", through("expert_in"), C, l.eah,
         u(km) + 1, G0);
      at(L + " etp reduce-scatter (combine.partial and combine.send alive)", through("expert_act"),
         C, csum({l.erh, l.eah}), u(km) + 1, G0);
      at(L + " combine (expert_out received, combine.send alive)", through("expert_out"), C, l.eah,
         u(km) + 1, G0);
    } else if (l.ep) {
      at(L + " dispatch (expert_in received, dispatch.send alive)", through("expert_in"), C, l.nkh,
         u(km) + 1, G0);
      at(L + (l.etp ? " combine (expert_out reduce-scattered, combine.partial alive)"
                    : " combine (expert_out received, combine.send alive)"),
         through("expert_out"), C, l.erh, u(km) + 1, G0);
    }
    // The shared expert under sp: xn2 gathered beside its gate and up, then down's partial
    // product beside shared_out, which it is reduce-scattered into.
    if (l.ms > 0 && p_.sp) {
      at("forward: layer " + layer_name(km) + " shared expert's gate/up (xn2 gathered)",
         through("shared_up"), C, l.full, u(km) + 1, G0);
      at("forward: layer " + layer_name(km) + " shared expert's down (partial alive)",
         through("shared_out"), C, l.full, u(km) + 1, G0);
    }
  };
  for (std::int64_t k : ks) {
    if (p_.cp > 1)  // ring attention: its buffers beside the rows through attn_out
      at("forward: layer " + layer_name(k) + " ring attention (key/value blocks received)",
         csum({before(k), through_attn}), csum({C, ring_acc()}), ring_kv(), u(k) + 1, G0);
    if (sel_)
      at("forward: layer " + layer_name(k) + " attn_out allocated (probs alive)",
         csum({before(k), through_attn}), C, 0, u(k) + 1, G0);
    if (kind(k) == 1 && (k == k_last || p_.zero == 3)) router(k);
    const bool partial = p_.sp && kind(k) == 0;  // a MoE layer's `out` is the combine's
    at("forward: layer " + layer_name(k) + " `out` allocated" +
           (partial     ? " (down partial alive)"
            : ck_[u(k)] ? " (its other tensors not yet freed)"
                        : "") +
           (off_ && k > 0 ? " (layer " + layer_name(k - 1) + "'s set still being offloaded)" : ""),
       csum({before(k), csub(sum_bytes(set(k)), dropped(), "selective")}), C, partial ? sg : 0,
       u(k) + 1, G0);
  }
  router(k_last);
}

void Stage::head_instants() {
  const Local& l = l_;
  const std::uint64_t C = kCublasWorkspaceBytes;
  const std::uint64_t sg = gather_buffer();
  const std::uint64_t head_pos = u(Ls_) + 1, back_pos = u(Ls_) + 2;
  const std::uint64_t G0 = grads_before_head();
  if (!last_) {
    // The stage input and every layer's keep, less the last layer's `out`, sent and freed.
    at("backward: d_residual received from the next stage", csub(kept_before(Ls_), l.X, "sent"),
       csum({C, l.X}), 0, back_pos, G0);
    return;
  }
  const std::uint64_t A_end = r_.est.activations.total_bytes;
  const std::string lomo_head = lomo_ ? " + lm_head gradient" : "";
  if (p_.sp)
    at("head forward: logits allocated (final norm output gathered)", csub(A_end, l.bs4, "head"), C,
       sg, head_pos, G0);
  at("end of forward: ce_losses allocated", A_end, csum({C, l.bs4}), 0, head_pos, G0);
  // Step 2: d_final_norm_out, then (LOMO) the lm_head gradient (tied: the shared embedding
  // gradient, kept until the embedding backward).
  // FSDP2: lm_head's unsharded gradient (tied: the embedding's) from here to the root's
  // post-backward, then the final norm's.
  if (fsdp2_) {
    fg_base_ = fsdp2_all_;
    fg_cum_ = bytes_of({l.V, l.h}, l.w);
  }
  const std::uint64_t G2 = fsdp2_ ? grads(0) : G0;
  at("backward head step 2: d_final_norm_out" + lomo_head +
         (p_.sp ? " partial (input gathered)" : ""),
     csub(A_end, l.bs4, "head"), csum({C, l.full}), sg, head_pos, lomo_ ? emb_grad_ : G2);
  const std::uint64_t A3 = csub(A_end, csum({l.bs4, l.logits}), "head");
  if (p_.sp)
    at("backward head step 2: d_final_norm_out reduce-scattered", A3, csum({C, l.full, l.X}), 0,
       head_pos, G2);
  if (fsdp2_) fg_cum_ = checked_add(fg_cum_, bytes_of({l.h}, l.w), "gradients");
  at("backward head step 3: d_residual" + std::string(lomo_ ? " + norm gradient" : ""), A3,
     csum({C, l.X, l.X}), 0, head_pos, grads(bytes_of({l.h}, l.w)));
}

void Stage::layer_instants() {
  if (fsdp2_) {
    fsdp2_backward_instants();
    return;
  }
  // The first backward layer holds the most (below). Offload: each layer's backward holds the set
  // of the layer below, prefetched (O_{k-1}), beside its own rows and input, so the layer above
  // the largest O decides (the first such in backward order; layer 0 prefetches nothing), and
  // under ZeRO-3 any earlier layer whose gather window is larger (the window only shrinks along
  // the backward, at its end).
  if (!off_ && mixed()) {
    // Dense layers among MoE ones (one GPU): per kind, its first layer in backward order holds
    // the most of that kind's steps, and its last checkpointed one the most of its recompute
    // (step 0); in backward order.
    std::vector<std::int64_t> kbs;
    for (int kd = 0; kd < 2; ++kd) {
      kbs.push_back(last_of(kd));
      for (std::int64_t k = last_of(kd); k >= 0; --k)
        if (kind(k) == kd && ck_[u(k)]) {
          kbs.push_back(k);
          break;
        }
    }
    std::sort(kbs.rbegin(), kbs.rend());
    kbs.erase(std::unique(kbs.begin(), kbs.end()), kbs.end());
    for (std::int64_t kb : kbs) layer_steps(kb);
    return;
  }
  if (!off_) {
    layer_steps(Ls_ - 1);
    return;
  }
  const std::int64_t kb = largest_predecessor(Ls_ - 1, 1, -1);
  const auto window_at = [&](std::int64_t k) {
    return p_.zero == 3 ? gather_.window(back_pos(k), p_.prefetch) : 0;
  };
  for (std::int64_t k = Ls_ - 1; k > kb; --k)
    if (window_at(k) > window_at(kb)) layer_steps(k);
  layer_steps(kb);
}

void Stage::layer_steps(std::int64_t kb) {
  const Local& l = l_;
  const std::uint64_t C = kCublasWorkspaceBytes;
  const std::uint64_t sg = gather_buffer();
  const std::uint64_t pos = back_pos(kb);  // the layer's backward unit (ZeRO-3 window)
  const bool sp = p_.sp;
  // Gradients LOMO allocates per step: (i,h) down/gate, (h,a·d) o/q, (h) norms, (d) q/k norms.
  const std::uint64_t ih = bytes_of({l.i, l.h}, l.w), had = bytes_of({l.h, l.ad}, l.w);
  const std::uint64_t hw = bytes_of({l.h}, l.w), dw = bytes_of({l.d}, l.w);
  auto lomo = [&](const char* what) { return std::string(lomo_ ? what : ""); };
  // This micro-batch's activations when the first backward layer starts (the head and the sent
  // `out` gone; its set recomputed at step 0 when it is checkpointed). It holds the most: later
  // layers hold what the layers below them keep, which only shrinks, beside the same set and
  // buffers (with dense layers among MoE ones: the first of each kind; layer_instants). Layer
  // kb holds the layers below it, its own set and no `out` (freed by the layer above).
  const std::uint64_t S = sum_bytes(set(kb));
  const bool moe = kind(kb) == 1;
  const bool ck_last = ck_[u(kb)];
  const std::uint64_t A_L =
      off_ ? csub(csum({keeps(kb - 1), S}), dropped(), "the offloaded backward layer")
           : csub(csum({kept_before(kb), S}), csum({l.X, dropped()}), "the first backward layer");
  const std::string Lb =
      "backward layer " + layer_name(kb) + (off_ ? " (layer below prefetched) " : " ");
  if (ck_last && p_.cp > 1) {
    // The recompute's ring attention: the rows after attn_out (`out` excepted) not yet recomputed.
    const std::uint64_t rest = csub(S, csum({l.X, through_attn_out()}), "rows after attn_out");
    at(Lb + "step 0: recompute's ring attention", csub(A_L, rest, "recompute"),
       csum({C, l.X, ring_acc()}), ring_kv(), pos, grads(0));
  }
  if (ck_last && moe)  // the recompute's router logits beside d_residual
    at(Lb + "step 0: recompute's router logits",
       csum({kept_before(kb), rows_through("expert_offsets", kb)}), csum({C, l.X, l.bsE}), 0, pos,
       grads(0));
  if (ck_last && moe && l.ep) {  // the recompute's dispatch and combine (forward_instants)
    auto through = [&](const char* name) {
      return csum({kept_before(kb), rows_through(name, kb)});
    };
    if (l.a2a && l.etp) {
      at(Lb + "step 0: recompute's dispatch (dispatch.send, a2a.recv alive)",
         through("expert_offsets"), csum({C, l.X}), csum({l.nkh, l.eah}), pos, grads(0));
      at(Lb + "step 0: recompute's etp gather (a2a.recv alive)", through("expert_in"),
         csum({C, l.X}), l.eah, pos, grads(0));
      at(Lb + "step 0: recompute's etp reduce-scatter (combine.partial, combine.send alive)",
         through("expert_act"), csum({C, l.X}), csum({l.erh, l.eah}), pos, grads(0));
      at(Lb + "step 0: recompute's combine (combine.send alive)", through("expert_out"),
         csum({C, l.X}), l.eah, pos, grads(0));
    } else {
      at(Lb + "step 0: recompute's dispatch (dispatch.send alive)", through("expert_in"),
         csum({C, l.X}), l.nkh, pos, grads(0));
      at(Lb + (l.etp ? "step 0: recompute's combine (combine.partial alive)"
                     : "step 0: recompute's combine (combine.send alive)"),
         through("expert_out"), csum({C, l.X}), l.erh, pos, grads(0));
    }
  }
  if (ck_last && moe && l.ms > 0 && p_.sp) {  // the recompute's shared expert (forward_instants)
    at(Lb + "step 0: recompute's shared expert's gate/up (xn2 gathered)",
       csum({kept_before(kb), rows_through("shared_up", kb)}), csum({C, l.X}), l.full, pos,
       grads(0));
    at(Lb + "step 0: recompute's shared expert's down (partial alive)",
       csum({kept_before(kb), rows_through("shared_out", kb)}), csum({C, l.X}), l.full, pos,
       grads(0));
  }
  if (ck_last) at(Lb + "step 0: recompute done", A_L, csum({C, l.X}), 0, pos, grads(0));
  // QLoRA (one GPU): a base weight dequantized beside a step's buffers. The recompute's o_proj
  // holds the rows through h_mid and d_residual (its q_proj fewer rows, its gate and up fewer
  // than step 1 beside the same size). The forward's dequantizations are never the peak: its
  // o_proj holds what step 5's does less d_attn_out, its down_proj what step 1's does less d_act
  // (the same rows, `out` in place of d_residual), and q, gate, up fewer rows still.
  auto deq_step = [&](const std::string& what, std::uint64_t act, std::uint64_t ws,
                      std::uint64_t deq) {
    if (t_.quantized())
      at(Lb + what + " (QLoRA: the 4-bit weight dequantized)", act, csum({ws, deq}), 0, pos,
         grads(0));
  };
  if (ck_last)
    deq_step("step 0: recompute's o_proj", csum({kept_before(kb), rows_through("h_mid", kb)}),
             csum({C, l.X}), l.deq_ha);
  // LoRA dropout: the recompute drops each target's input again beside d_residual.
  if (ck_last)
    for (const DropPoint& dp : drop_points())
      at(Lb + "step 0: recompute's " + dp.what, csum({kept_before(kb), dp.rows}),
         csum({C, l.X, dp.drop}), 0, pos, grads(0));
  constexpr unsigned kDownBit = 1u << 6, kGateUpBits = 3u << 4, kOBit = 1u << 3, kQkvBits = 7u;
  // Under dropout the target's input is dropped again beside d_lora_a (`lora_drop.<proj>`, then
  // d_lora_a·A in its place): the largest input among the step's targets.
  auto lora_step = [&](unsigned bits, const std::string& what, std::uint64_t act,
                       std::uint64_t ws) {
    if (!l.targets(bits)) return;
    at(Lb + what + " (LoRA: d_lora_a" + (l.drop ? ", the input dropped again" : "") +
           ", the adapter's gradient path)",
       act, csum({ws, l.bsr, l.drop_max(bits)}), 0, pos, grads(0));
  };
  std::uint64_t A4 = 0;
  if (moe) {
    // Steps 1-3 of a MoE layer (docs/native-plan.md, "Mixture of experts"): the combine's backward
    // and the experts' down (d_expert_out, d_topk_weight, d_expert_act), the SwiGLU backward, the
    // experts' gate/up (d_expert_in), the rows summed back per token (d_xn2), the router
    // (d_router_logits); d_topk_weight lives from step 1 to the router's backward.
    // Expert parallelism: the home rows' gradient d_expert_out goes to the experts' ranks
    // (d_expert_rows, R rows) and is freed; their gate/up backward's d_expert_rows_in comes back
    // (d_expert_in, the home rows). One GPU: R = nk, erh = nkh, erm = nkm.
    // Expert tensor parallelism with ep > 1: the A rows' gradients received first
    // (d_expert_rows.recv), then gathered over the etp group into d_expert_rows (R rows); in
    // step 3 the partial input gradients reduce-scattered back (d_expert_rows_in.scattered, A
    // rows) before the all-to-all home. `wire`: what the all-to-all carries beside the home rows.
    const bool two = l.a2a && l.etp;
    const std::uint64_t wire = two ? l.eah : l.erh;
    if (l.ep) {
      at(Lb + (two ? "step 1: d_expert_out, d_topk_weight, d_expert_rows.recv (combine backward, "
                     "the gradients sent to the experts)"
                   : "step 1: d_expert_out, d_topk_weight, d_expert_rows (combine backward, the "
                     "gradients sent to the experts)"),
         A_L, csum({C, l.X, l.nkh, l.bsK4, wire}), 0, pos, grads(0));
      if (two)
        at(Lb + "step 1: d_expert_rows (the received rows gathered over etp)", A_L,
           csum({C, l.X, l.bsK4, l.eah, l.erh}), 0, pos, grads(0));
      at(Lb + "step 1: d_expert_act (experts' down_proj backward)", A_L,
         csum({C, l.X, l.bsK4, l.erh, l.erm}), 0, pos, grads(0));
    } else {
      at(Lb + "step 1: d_expert_out, d_topk_weight, d_expert_act (combine and experts' "
              "down_proj backward)",
         A_L, csum({C, l.X, l.nkh, l.bsK4, l.erm}), 0, pos, grads(0));
    }
    const std::uint64_t M2 = csub(A_L, csum({l.nkh, l.erm}), "step 2");  // expert_out, _act
    at(Lb + "step 2: d_expert_gate, d_expert_up (SwiGLU backward)", M2,
       csum({C, l.X, l.bsK4, l.erm, l.erm, l.erm}), 0, pos, grads(0));
    const std::uint64_t M3 = csub(M2, checked_mul(2, l.erm), "step 3");  // expert_gate, _up
    at(Lb + (l.ep ? "step 3: d_expert_rows_in" : "step 3: d_expert_in") +
           " (experts' gate_up_proj backward)",
       M3, csum({C, l.X, l.bsK4, l.erm, l.erm, l.erh}), 0, pos, grads(0));
    if (two)
      at(Lb + "step 3: d_expert_rows_in.scattered (the partials reduce-scattered over etp)", M3,
         csum({C, l.X, l.bsK4, l.erh, l.eah}), 0, pos, grads(0));
    if (l.ep)
      at(Lb + "step 3: d_expert_in (the rows' gradients back from the experts)", M3,
         csum({C, l.X, l.bsK4, wire, l.nkh}), 0, pos, grads(0));
    // d_xn2: the rank's rows (b, sr, h) (= (b, s, h) without sp).
    at(Lb + "step 3: d_xn2 (the rows summed back per token)", M3,
       csum({C, l.X, l.bsK4, l.nkh, l.X}), 0, pos, grads(0));
    at(Lb + "step 3: d_router_logits (router backward" +
           (l.aux4 ? ", the load-balancing loss's gradient beside it)" : ")"),
       M3, csum({C, l.X, l.bsK4, l.X, l.aux4, l.bsE}), 0, pos, grads(0));
    if (l.ms > 0) {
      // The shared expert's backward beside d_residual and d_xn2 (the rank's rows): d_shared_out,
      // d_shared_score (the gate), then d_shared_act (under sp d_shared_out gathered for it);
      // d_shared_out freed, d_shared_gate and d_shared_up. Under sp xn2 gathered again beside
      // their input gradient's (b,s,h) partial, then the partial reduce-scattered into a new
      // d_xn2 (d_shared_gate and d_shared_up freed, the old d_xn2 and the partial after it).
      const std::uint64_t base = csum({C, l.X, l.X, l.bsw});
      at(Lb +
             "step 3: d_shared_out, d_shared_score, d_shared_act (shared expert's gate and "
             "down_proj backward" +
             (p_.sp ? ", d_shared_out gathered)" : ")"),
         M3, csum({base, l.X, l.bsms}), p_.sp ? l.full : 0, pos, grads(0));
      at(Lb + "step 3: d_shared_gate, d_shared_up (shared SwiGLU backward)", M3,
         csum({base, checked_mul(3, l.bsms)}), 0, pos, grads(0));
      if (p_.sp) {
        at(Lb + "step 3: d_shared_in.partial (shared gate/up backward, xn2 gathered)", M3,
           csum({base, checked_mul(2, l.bsms), l.full}), l.full, pos, grads(0));
        at(Lb + "step 3: d_xn2 (the shared expert's partial reduce-scattered and added)", M3,
           csum({base, l.full, l.X}), 0, pos, grads(0));
      }
    }
    // xn2, expert_in, the routing's and the shared expert's rows freed
    A4 = csub(M3,
              csum({l.X, l.erh, l.bsE4, checked_mul(3, l.bsK4), l.off4, checked_mul(3, l.bsms),
                    l.ms > 0 ? l.X : 0, l.bsw}),
              "step 4");
  } else {
    if (fsdp2_) fg_cum_ = checked_add(fg_cum_, ih, "gradients");  // down_proj's
    at(Lb + "step 1: d_act" + lomo(" + down_proj gradient") + (sp ? " (d_residual gathered)" : ""),
       A_L, csum({C, l.X, l.bsi}), sg, pos, grads(ih));
    // LoRA: each target's backward allocates d_lora_a.<proj> (b, s, r) beside the step's buffers,
    // and the step frees the target's row with the others (kLoraBits: q k v o gate up down).
    deq_step("step 1: down_proj", A_L, csum({C, l.X, l.bsi}), l.deq_hi);
    lora_step(kDownBit, "step 1: d_lora_a.down_proj", A_L, csum({C, l.X, l.bsi}));
    const std::uint64_t A2 = csub(A_L, csum({l.bsi, l.lora_rows(kDownBit)}), "step 2");
    at(Lb + "step 2: d_gate, d_up (SwiGLU backward)", A2, csum({C, l.X, l.bsi, l.bsi, l.bsi}), 0,
       pos, grads(0));
    const std::uint64_t A3 = csub(A2, checked_mul(2, l.bsi), "step 3");  // gate, up freed
    if (fsdp2_) fg_cum_ = csum({fg_cum_, ih, ih}, "gradients");          // gate_proj's, up_proj's
    at(Lb + "step 3: d_xn2" + lomo(" + gate_proj gradient") + (sp ? " partial (xn2 gathered)" : ""),
       A3, csum({C, l.X, l.full, l.bsi, l.bsi}), sg, pos, grads(ih));
    if (sp)
      at(Lb + "step 3: d_xn2 reduce-scattered", A3, csum({C, l.X, l.full, l.X, l.bsi, l.bsi}), 0,
         pos, grads(0));
    deq_step("step 3: gate_proj, up_proj", A3, csum({C, l.X, l.full, l.bsi, l.bsi}), l.deq_hi);
    lora_step(kGateUpBits,
              std::string("step 3: d_lora_a.") + (l.targets(1u << 4) ? "gate_proj" : "up_proj"), A3,
              csum({C, l.X, l.full, l.bsi, l.bsi}));
    // xn2 freed (and the gate/up rows)
    A4 = csub(A3, csum({l.X, l.lora_rows(kGateUpBits)}), "step 4");
  }
  if (fsdp2_) fg_cum_ = checked_add(fg_cum_, hw, "gradients");  // post_attention_layernorm's
  if (lomo_ || fsdp2_)
    at(Lb + "step 4: post_attention_layernorm gradient", A4, csum({C, l.X, l.X}), 0, pos,
       grads(hw));
  const std::uint64_t A5 = csub(A4, csum({l.X, l.r4}), "step 5");  // h_mid, rstd2 freed
  if (fsdp2_) fg_cum_ = checked_add(fg_cum_, had, "gradients");    // o_proj's
  at(Lb + "step 5: d_attn_out" + lomo(" + o_proj gradient") + (sp ? " (d_residual gathered)" : ""),
     A5, csum({C, l.X, l.bsad}), sg, pos, grads(had));
  deq_step("step 5: o_proj", A5, csum({C, l.X, l.bsad}), l.deq_ha);
  lora_step(kOBit, "step 5: d_lora_a.o_proj", A5, csum({C, l.X, l.bsad}));
  const std::uint64_t A5b = csub(A5, l.lora_rows(kOBit), "step 5");  // the o row freed
  if (sel_)  // probs recomputed, the attention output into a workspace copy
    at(Lb + "step 6: probs recomputed (selective)", csum({A5b, l.store}),
       csum({C, l.X, l.bsad, l.bsad}), 0, pos, grads(0));
  const std::uint64_t A6 = csum({A5b, dropped()});
  at(Lb + "step 6: d_q, d_k, d_v, " +
         (t_.attention == Attention::eager ? "d_probs" : "attn_delta") +
         (p_.cp > 1 ? " (ring attention backward: accumulators and blocks)"
                    : " (attention backward)"),
     A6, csum({C, l.X, l.bsad, l.bsad, l.bskd, l.bskd, l.store, ring_acc()}),
     csum({ring_kv(), ring_dkv()}), pos, grads(0));
  const std::uint64_t A7 = csub(A6, csum({l.bsad, l.store}), "step 7");  // attn_out, probs|lse
  std::uint64_t A8 = A7;
  if (m_.qk_norm) {
    // Step 7, q/k norm backward: d_q_pre, then d_k_pre, beside d_q, d_k, d_v; then d_q, d_k
    // and the four norm tensors are freed.
    if (fsdp2_) fg_cum_ = checked_add(fg_cum_, dw, "gradients");  // q_norm's
    at(Lb + "step 7: d_q_pre" + lomo(" + q_norm gradient"), A7,
       csum({C, l.X, l.bsad, l.bskd, l.bskd, l.bsad}), 0, pos, grads(dw));
    if (fsdp2_) fg_cum_ = checked_add(fg_cum_, dw, "gradients");  // k_norm's
    at(Lb + "step 7: d_k_pre" + lomo(" + k_norm gradient"), A7,
       csum({C, l.X, l.bsad, l.bskd, l.bskd, l.bsad, l.bskd}), 0, pos, grads(dw));
    A8 =
        csub(A7, csum({l.bsad, l.bskd, bytes_of({l.b, l.s, l.a}, 4), bytes_of({l.b, l.s, l.k}, 4)}),
             "step 8");
  }
  if (fsdp2_)  // q_proj's, k_proj's, v_proj's (and their biases)
    fg_cum_ = csum({fg_cum_, had, bytes_of({l.kd, l.h}, l.w), bytes_of({l.kd, l.h}, l.w),
                    m_.qkv_bias ? bytes_of({l.ad + l.kd + l.kd}, l.w) : 0},
                   "gradients");
  at(Lb + "step 8: d_xn1" + lomo(" + q_proj gradient") + (sp ? " partial (xn1 gathered)" : ""), A8,
     csum({C, l.X, l.full, l.bsad, l.bskd, l.bskd}), sg, pos, grads(had));
  if (sp)
    at(Lb + "step 8: d_xn1 reduce-scattered", A8,
       csum({C, l.X, l.full, l.X, l.bsad, l.bskd, l.bskd}), 0, pos, grads(0));
  deq_step("step 8: q_proj", A8, csum({C, l.X, l.full, l.bsad, l.bskd, l.bskd}), l.deq_ha);
  lora_step(kQkvBits,
            std::string("step 8: d_lora_a.") + (l.targets(1u)   ? "q_proj"
                                                : l.targets(2u) ? "k_proj"
                                                                : "v_proj"),
            A8, csum({C, l.X, l.full, l.bsad, l.bskd, l.bskd}));
  if (fsdp2_) fg_cum_ = checked_add(fg_cum_, hw, "gradients");  // input_layernorm's
  if (lomo_ || fsdp2_) {  // q, k, v and xn1 (the rank's rows) freed; d_xn1 beside d_residual
    const std::uint64_t A9 = csub(A8, csum({l.bsad, l.X, l.bskd, l.bskd}), "step 9");
    at(Lb + "step 9: input_layernorm gradient", A9, csum({C, l.X, l.X}), 0, pos, grads(hw));
  }
  if (lomo_) {  // one GPU only
    if (!m_.tied_embeddings)
      at("backward embedding: embed_tokens gradient", 0, csum({C, l.X}), 0, pos, emb_grad_);
  }
}

void Stage::figures() {
  Estimate& est = r_.est;
  auto& fg = est.figures;
  fg.inputs = inputs_;
  fg.activations = checked_add(mb_, others_, "activations");
  std::uint64_t ws = 0, ap = 0, gp = 0, best = 0;
  for (std::size_t n = 0; n < est.instants.size(); ++n) {
    const auto& in = est.instants[n];
    ws = std::max(ws, in.bytes[W]);
    ap = std::max(ap, in.bytes[A]);
    gp = std::max(gp, in.bytes[G]);
    const std::uint64_t tot = in.total();
    if (est.peak_instant < 0 || tot > best) {  // strictly greater: a tie keeps the first
      best = tot;
      est.peak_instant = static_cast<int>(n);
    }
  }
  if (fsdp2_) fg.gradients = gp;  // the root's post-backward: unsharded gradients at their most
  if (gp != fg.gradients)
    throw Error("analytic native: gradient peak of the instants (" + std::to_string(gp) +
                ") differs from the optimizer rule (" + std::to_string(fg.gradients) + ")");
  fg.workspace = ws;
  fg.activations_peak = ap;
  // Recompute FLOPs per optimizer step: each checkpointed layer's forward GEMMs (q, k, v, o,
  // gate, up, down: 2 FLOPs per multiply-add over the b·s rows) and its attention (QKᵀ and PV,
  // 2·2·b·a·s²·d, the whole s × s square as Megatron counts it); selective re-runs the attention
  // only, in every layer; times the micro-batches.
  {
    const double b = double(l_.b), s = double(l_.s), h = double(l_.h), i = double(l_.i);
    const double ad = double(l_.ad), kd = double(l_.kd), a = double(l_.a), d = double(l_.d);
    // LoRA's adapters: 2 FLOPs per multiply-add of x·Aᵀ and a·Bᵀ, r·(in + out) per row.
    // A mixture of experts: the router (E·h per row), the shared expert, and three m×h GEMMs per
    // expert row: b·s·K rows, at most E·capacity of them under --capacity-factor (the kept rows
    // depend on the routing: this counts the most).
    // A dense layer among MoE ones (Qwen) counts its dense MLP.
    // Under sequence parallelism a MoE layer's router and shared-expert gate run on the rank's
    // own b·s/tp rows, and it routes those (the shared expert's m_s/tp columns see every row).
    const double sr = double(l_.sr);
    auto gemm = [&](bool moe) {
      const double mlp = moe ? 3.0 * h * double(l_.ms) : 3.0 * h * i;  // per row of b·s
      const double own = moe ? h * (double(l_.E) + (l_.ms > 0 ? 1.0 : 0.0)) : 0.0;  // of b·sr
      const double routed = b * sr * double(l_.K);
      const double expert_rows = moe ? std::min(routed, l_.cap > 0 ? double(l_.nk) : routed) : 0.0;
      // (Under expert tensor parallelism the rank computes etp times the rows over m/etp
      // columns: the same FLOPs under balanced routing.)
      return 2.0 * b * s * (h * ad + 2.0 * h * kd + ad * h + mlp + double(layer_adapters(l_))) +
             2.0 * b * sr * own + 2.0 * expert_rows * 3.0 * h * double(l_.m) * double(p_.etp);
    };
    const double attention = 4.0 * b * a * s * s * d;
    double recomputed = 0.0;
    for (std::int64_t k = 0; k < Ls_; ++k)
      if (ck_[u(k)]) recomputed += gemm(kind(k) == 1) + attention;
    est.recompute_flops =
        (recomputed + (sel_ ? double(Ls_) * attention : 0.0)) * double(p_.microbatches);
  }
  fg.peak = best;
  fg.peak_breakdown = est.instants[est.peak_instant].bytes;
  if (off_)
    est.notes.push_back(
        "activation offload: layers 0 to L-2 copy their saved tensors and input to host memory "
        "after the next layer's forward and get them back one layer ahead in backward; the "
        "device holds two layers' sets at most, the host " +
        std::to_string(est.offload_host_bytes) + " B at the end of forward; " +
        std::to_string(est.offload_transfer_bytes) + " B cross the bus per step");
  else if (t_.offload_activations)
    est.notes.push_back(
        "activation offload: one layer has nothing to offload (the last layer's "
        "set is used at once by the backward)");
  fg.sum = csum({fg.params, fg.gradients, fg.optimizer_states, fg.activations}, "sum");

  est.label = p_.distributed() ? "trainmem's sharded step (docs/distributed.md), " + p_.describe() +
                                     ", stage " + std::to_string(r_.stage)
                               : "trainmem's own step (docs/native-plan.md), exact";
  est.notes.push_back("exact: every figure must equal trainmem's ledger byte for byte");
  est.notes.push_back(
      "workspace = 32 MiB cuBLAS workspace + the largest set of transient buffers alive together "
      "(ce_losses, activation gradients in flight, d_probs or attn_delta)");
  est.notes.push_back("inputs (int32 tokens and targets) are counted in `peak`, not in `sum`");
  if (full_)
    est.notes.push_back(
        "checkpointing full: activations_peak includes the forward of the last layer and the "
        "recomputed layer L-1 during backward");
  else if (sel_)
    est.notes.push_back(
        "checkpointing selective: each layer frees its probs right after the attention forward "
        "and recomputes them at backward step 6 (the attention forward again, its output into a "
        "workspace copy)");
  else if (t_.checkpointing == Checkpointing::selective)
    est.notes.push_back(
        "checkpointing selective with flash attention: flash keeps no s² tensor, so nothing is "
        "recomputed (the step is the one without checkpointing)");
  else if (ck_count_ > 0)
    est.notes.push_back("checkpointing " + checkpointing_name(t_) + ": " +
                        std::to_string(ck_count_) + " of the " + std::to_string(Ls_) +
                        " layers here keep only their input and are recomputed in backward");
  if (t_.lora())
    est.notes.push_back(
        "LoRA r " + std::to_string(t_.lora_rank) + " on " + lora_targets_name(t_.lora_targets) +
        ": the base is frozen (no gradients, no optimizer states); each adapter (A, B in the "
        "training dtype, with the optimizer's states like every trained weight) keeps its "
        "rank-r row x·Aᵀ and allocates d_lora_a (b,s,r) in backward");
  if (t_.lora_dropped())
    est.notes.push_back(
        "LoRA dropout > 0: each adapter keeps a one-byte mask of its input (b,s,in) and drops that "
        "input into a "
        "(b,s,in) workspace copy for A's GEMM, in forward, in the recompute and again in backward "
        "(where the copy then holds d_lora_a·A, added to dx through the mask)");
  if (t_.quant8())
    est.notes.push_back(
        "8-bit base (--quant int8, bitsandbytes' LLM.int8 weight): the seven projections of every "
        "layer stored as int8 (n bytes) with an fp32 absmax per output row (SCB); each GEMM that "
        "reads one dequantizes it into workspace (CB·SCB/127 in the training dtype) and frees it "
        "after the GEMM: forward, recompute and the backward's input gradients");
  if (t_.quant4())
    est.notes.push_back(
        std::string("QLoRA: the seven projections of every layer stored 4-bit as bitsandbytes "
                    "stores them (") +
        quant_name(t_.quant) + ", blocksize " + std::to_string(t_.quant_blocksize) +
        (t_.double_quant ? ", double quantization: packed n/2 + 8-bit absmax + fp32 nested "
                           "absmax per 256 blocks + offset and codes"
                         : ": packed n/2 + fp32 absmax per block + code") +
        "); each GEMM that reads one dequantizes it into workspace (the weight in the training "
        "dtype" +
        (t_.double_quant ? " beside its fp32 absmax" : "") +
        ") and frees it after the GEMM: forward, recompute and the backward's input gradients");
  if (l_.moe)
    est.notes.push_back(
        "mixture of experts (" + std::to_string(l_.E) + " experts, top " + std::to_string(l_.K) +
        (l_.ms > 0 ? ", a shared expert" : "") +
        (m_.moe_layer_count() < m_.layers
             ? ", in " + std::to_string(m_.moe_layer_count()) + " of " + std::to_string(m_.layers) +
                   " layers; the others a dense MLP of width " + std::to_string(m_.intermediate)
             : std::string()) +
        "): each MoE layer keeps its router's fp32 softmax, the routing (indices, weights, "
        "positions, "
        "offsets) and the " +
        (l_.cap > 0 ? "E·capacity = " + std::to_string(l_.E) + "·" + std::to_string(l_.cap) +
                          " expert rows (--capacity-factor " + number_text(t_.capacity_factor) +
                          ": each expert computes at most " + std::to_string(l_.cap) +
                          " of its choices, the later ones dropped)"
                    : std::string("b·s·K expert rows")) +
        " in expert order (input, gate, up, product, output); "
        "one GEMM per expert; " +
        (l_.ep ? std::string(
                     "under ep/etp the experts' rows (input, gate, up, product) are those "
                     "received (R = " +
                     std::to_string(l_.er) + " under balanced routing" +
                     (l_.cap > 0 ? ", each source sending the choices its capacity keeps" : "") +
                     "), the rest stays on the rank's own rows")
               : std::string("no byte depends on the routing")) +
        (m_.output_router_logits
             ? std::string("; output_router_logits: the load-balancing loss from per-expert "
                           "counts and probability sums, its gradient one (E) f32 buffer per "
                           "router backward") +
                   (p_.distributed() ? " (over each rank's own tokens and micro-batch, as HF "
                                       "under DDP)"
                                     : "")
             : std::string()));
  if (eight_bit_optimizer(t_.optimizer))
    est.notes.push_back(
        "adamw8bit (bitsandbytes' AdamW8bit): no fp32 master copy (the weights are updated in "
        "place); per trained tensor of n >= 4,096 elements uint8 state1/state2 and an fp32 "
        "absmax1/absmax2 per 256 elements (2n + 8·ceil(n/256) B), fp32 state1/state2 below "
        "(8n B), and once the two 256-entry quantile maps and their 65,536-entry lookup tables "
        "(133,120 B)");
  if (paged_optimizer(t_.optimizer))
    est.notes.push_back(
        std::string(optimizer_name(t_.optimizer)) + " (bitsandbytes' " +
        (t_.optimizer == Optimizer::paged_adamw
             ? "PagedAdamW: its 32-bit Adam, fp32 state1/state2 (8n B) for every trained tensor, "
               "no fp32 master copy"
             : "PagedAdamW8bit: AdamW8bit's states") +
        "): state1/state2 of a tensor of n >= 100,000 elements live in CUDA managed memory, "
        "reported apart as optimizer_states_managed (outside the pool, the peak and "
        "--device-budget); the rest on the device");
  if (lomo_)
    est.notes.push_back(m_.tied_embeddings
                            ? "LOMO, tied embeddings: the shared embedding gradient is alive "
                              "from the head backward to the embedding backward"
                            : "LOMO: one gradient at a time, the largest is the gradient figure");
  if (p_.distributed()) {
    est.notes.push_back("per rank: every figure is one GPU's (" + std::to_string(r_.ranks) +
                        " ranks share these figures)");
    if (p_.pp > 1)
      est.notes.push_back("1F1B: " + std::to_string(r_.in_flight) +
                          " micro-batch(es) in flight on this stage at the peak");
  }
}

}  // namespace

RankEstimate native_stage(const ModelConfig& m, const TrainConfig& t, const ParallelConfig& p,
                          std::int64_t stage, std::int64_t grad_rank) {
  t.check_checkpoint_resolved("this command");
  return Stage(m, t, p, stage, grad_rank).build();
}

void build_native(Estimate& est) {
  // One GPU: the layout of one rank. The books from the parameter list (state_figures, already
  // in est) and the stage's closed form must agree; they are two derivations of the same count.
  const RankEstimate r = native_stage(est.model, est.train, ParallelConfig{}, 0);
  const MemoryFigures& f = r.est.figures;
  if (f.params != est.figures.params || f.gradients != est.figures.gradients ||
      f.optimizer_states != est.figures.optimizer_states || r.est.param_count != est.param_count)
    throw Error("analytic native: the stage's parameter books differ from the parameter list's");
  est.activations = r.est.activations;
  est.instants = r.est.instants;
  est.peak_instant = r.est.peak_instant;
  est.figures = f;
  est.label = r.est.label;
  est.notes = r.est.notes;
  est.recompute_flops = r.est.recompute_flops;
  est.offload_host_bytes = r.est.offload_host_bytes;
  est.offload_transfer_bytes = r.est.offload_transfer_bytes;
}

}  // namespace trainmem::analytic_detail
