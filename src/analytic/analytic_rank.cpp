// The native profile per rank (include/trainmem/analytic/analytic_rank.hpp), in closed form, from
// docs/distributed.md ("The sharded step") only.
//
// One pipeline stage is computed like the single-GPU `native` profile (analytic_native.cpp) with
// the rank's local sizes: heads a/tp, kv heads k/tp, intermediate i/tp, vocabulary V/tp, and the
// residual stream's rows s/tp under sequence parallelism. The peak is the maximum over the
// instants at which live bytes can reach a maximum, in chronological order (a tie keeps the first):
//   forward   the last layer's `out` (with its reduce-scatter buffer under sp) and, under ZeRO-3,
//             the last layers whose gather window reaches the head;
//   head      its forward gather (sp), the end of forward, backward steps 2 and 3;
//   layer     each step of the first layer the backward processes (later layers hold fewer
//             activations and the same or smaller buffers);
// with, on stage k of a pipeline, the activations of the other min(pp - k, M) - 1 micro-batches
// in flight added to every instant (1F1B), and under ZeRO-3 the gathered units of the window.
#include "trainmem/analytic/analytic_rank.hpp"

#include <algorithm>

#include "analytic_detail.hpp"
#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {

using analytic_detail::bytes_of;
using analytic_detail::csub;
using analytic_detail::csum;
using analytic_detail::Dims;
using analytic_detail::entry;

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
      return 0;
  }
  return 0;
}

// The local sizes of one rank (letters of docs/distributed.md).
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
};

Local make_local(const ModelConfig& m, const TrainConfig& t, const ParallelConfig& p) {
  Local l;
  l.b = u(t.batch);
  l.s = u(t.seq);
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
  return l;
}

// Parameter elements of one layer on a rank (two norms, q/k/v/o, gate/up/down; TP-sharded),
// with the q/k/v biases (split with their columns: a/t·d + 2·k/t·d) and the q/k norm weights
// (replicated: 2·d) of the families that have them.
std::uint64_t layer_params(const Local& l, const ModelConfig& m) {
  return csum({checked_mul(2, l.h), checked_mul(l.h, l.ad), checked_mul(2, checked_mul(l.h, l.kd)),
               checked_mul(l.ad, l.h), checked_mul(3, checked_mul(l.h, l.i)),
               m.qkv_bias ? csum({l.ad, l.kd, l.kd}) : 0, m.qk_norm ? checked_mul(2, l.d) : 0},
              "parameters");
}

// The per-layer forward set of one rank, in allocation order (`out` last).
std::vector<TensorEntry> layer_set(const Dims& g, const Local& l, const std::string& D,
                                   Attention attn, bool sp, bool qk_norm) {
  const std::string rows = sp ? "s/t" : "s";
  const std::string res = "(b," + rows + ",h)";
  std::vector<TensorEntry> v;
  v.push_back(entry(g, "rstd1", "(b," + rows + ")", "fp32", l.r4, Term::sb,
                    "input_layernorm backward", "1/rms of each row of x_l"));
  v.push_back(entry(g, "xn1", res, D, l.X, Term::sbh, "q/k/v projection backward",
                    sp ? "the rank's rows of the GEMMs' input (gathered again in backward)"
                       : "input of the q, k and v GEMMs (dW_q/k/v)"));
  if (qk_norm) {
    v.push_back(entry(g, "q_pre", "(b,s,a/t·d)", D, l.bsad, Term::sbh, "q_norm backward",
                      "the rank's query heads before the per-head RMSNorm"));
    v.push_back(entry(g, "k_pre", "(b,s,k/t·d)", D, l.bskd, Term::sbh, "k_norm backward",
                      "the rank's key heads before the per-head RMSNorm"));
    v.push_back(entry(g, "q_rstd", "(b,s,a/t)", "fp32", bytes_of({l.b, l.s, l.a}, 4), Term::sb,
                      "q_norm backward", "1/rms of each of the rank's query heads"));
    v.push_back(entry(g, "k_rstd", "(b,s,k/t)", "fp32", bytes_of({l.b, l.s, l.k}, 4), Term::sb,
                      "k_norm backward", "1/rms of each of the rank's key heads"));
  }
  v.push_back(entry(g, "q", "(b,s,a/t·d)", D, l.bsad, Term::sbh, "attention backward",
                    "the rank's query heads after RoPE"));
  v.push_back(entry(g, "k", "(b,s,k/t·d)", D, l.bskd, Term::sbh, "attention backward",
                    "the rank's key heads after RoPE"));
  v.push_back(entry(g, "v", "(b,s,k/t·d)", D, l.bskd, Term::sbh, "attention backward",
                    "the rank's value heads"));
  if (attn == Attention::eager)
    v.push_back(entry(g, "probs", "(b,a/t,s,s)", D, l.store, Term::as2b, "attention backward",
                      "the rank's heads' causal softmax probabilities"));
  else
    v.push_back(entry(g, "lse", "(b,a/t,s)", "fp32", l.store, Term::sb, "attention backward",
                      "row log-sum-exp of the rank's heads"));
  v.push_back(entry(g, "attn_out", "(b,s,a/t·d)", D, l.bsad, Term::sbh, "o_proj backward",
                    "input of the row-parallel o GEMM (dW_o)"));
  v.push_back(entry(g, "h_mid", res, D, l.X, Term::sbh, "post_attention_layernorm backward",
                    "residual stream after attention"));
  v.push_back(entry(g, "rstd2", "(b," + rows + ")", "fp32", l.r4, Term::sb,
                    "post_attention_layernorm backward", "1/rms of each row of h_mid"));
  v.push_back(entry(g, "xn2", res, D, l.X, Term::sbh, "gate/up projection backward",
                    "the rank's rows of the gate and up GEMMs' input"));
  v.push_back(entry(g, "gate", "(b,s,i/t)", D, l.bsi, Term::sbi, "SwiGLU backward",
                    "silu'(gate) needs the pre-activation"));
  v.push_back(entry(g, "up", "(b,s,i/t)", D, l.bsi, Term::sbi, "SwiGLU backward",
                    "d gate = d act · up · silu'(gate)"));
  v.push_back(entry(g, "act", "(b,s,i/t)", D, l.bsi, Term::sbi, "down_proj backward",
                    "input of the row-parallel down GEMM (dW_down)"));
  v.push_back(entry(g, "out", res, D, l.X, Term::sbh, "next layer's input_layernorm backward",
                    "the layer output x_{l+1}"));
  return v;
}

// The ZeRO-3 gather window: units in compute order (embedding, layers, head, layers back), each
// gathered while any of the positions j..j+prefetch needs it.
struct GatherPlan {
  std::vector<int> seq;              // unit id per position: 0 embedding, 1+l layer l, L+1 head
  std::vector<std::uint64_t> bytes;  // gathered bytes per unit id
  std::uint64_t window(std::size_t pos, std::int64_t prefetch) const {
    std::vector<int> seen;
    std::uint64_t total = 0;
    for (std::size_t j = pos; j < seq.size() && j <= pos + u(prefetch); ++j) {
      if (std::find(seen.begin(), seen.end(), seq[j]) != seen.end()) continue;
      seen.push_back(seq[j]);
      total = checked_add(total, bytes[seq[j]], "gathered parameters");
    }
    return total;
  }
};

RankEstimate estimate_stage(const ModelConfig& m, const TrainConfig& t, const ParallelConfig& p,
                            std::int64_t stage) {
  const Local l = make_local(m, t, p);
  const Dims g = analytic_detail::make_dims(m, t);
  const std::string D = g.dt;
  const bool first = stage == 0, last = stage == p.pp - 1;
  const bool full = t.checkpointing == Checkpointing::full;
  const bool sp = p.sp;
  const std::int64_t Ls = m.layers / p.pp;
  const bool tied_here = m.tied_embeddings && p.pp == 1;

  RankEstimate r;
  r.stage = stage;
  r.role = p.pp == 1 ? "only" : first ? "first" : last ? "last" : "middle";
  r.ranks = p.dp * p.tp;
  r.layers = Ls;
  r.in_flight = std::min<std::int64_t>(p.pp - stage, p.microbatches);

  // ---- persistent books ----
  const std::uint64_t Lu = layer_params(l, m);
  const std::uint64_t emb = checked_mul(l.V, l.h);
  std::uint64_t Pk = checked_mul(Lu, u(Ls), "parameters");
  if (first) Pk = checked_add(Pk, emb);
  if (last) Pk = csum({Pk, l.h, tied_here ? 0 : emb}, "parameters");
  const std::uint64_t dp = u(p.dp);
  const std::uint64_t shard = (Pk + dp - 1) / dp;
  r.local_params = Pk;
  r.shard_elements = p.zero >= 1 ? shard : Pk;
  r.padding_elements = p.zero >= 1 ? checked_mul(shard, dp) - Pk : 0;
  const std::uint64_t w = l.w;
  const std::uint64_t f = state_bytes_per_param(t.optimizer, w);
  const bool off_opt = p.offload != Offload::none,
             off_params = p.offload == Offload::optimizer_params;

  Estimate& est = r.est;
  est.profile = Profile::native;
  est.model = m;
  est.train = t;
  est.param_count = Pk;
  auto& fg = est.figures;
  fg.params = p.zero == 3 ? (off_params ? 0 : checked_mul(shard, w)) : checked_mul(Pk, w);
  if (p.zero >= 2)
    fg.gradients = off_opt ? 0 : checked_mul(shard, w);
  else
    fg.gradients = checked_mul(Pk, w);
  const std::uint64_t updated = p.zero >= 1 ? shard : Pk;
  fg.optimizer_states = off_opt ? 0 : checked_mul(updated, f, "optimizer states");
  if (off_opt) {
    auto host = [&](std::string name, std::uint64_t bytes, std::string why) {
      TensorEntry e;
      e.name = std::move(name);
      e.shape = "(shard)";
      e.dtype = "fp32";
      e.bytes = bytes;
      e.why = std::move(why);
      r.host_bytes = checked_add(r.host_bytes, bytes, "host bytes");
      r.host.push_back(std::move(e));
    };
    host("optimizer states", checked_mul(shard, f), "the shard's optimizer states");
    host("gradient shard", checked_mul(shard, 4), "fp32 gradients the host optimizer reads");
    if (off_params) {
      host("parameter shard", checked_mul(shard, w), "16-bit parameter shard, gathered per unit");
      r.host.back().dtype = D;
    }
  }

  // Communication buffers allocated at setup: the reduce bucket(s) of ZeRO-2/3.
  std::uint64_t largest =
      std::max({checked_mul(l.h, l.ad), checked_mul(l.h, l.kd), checked_mul(l.h, l.i)});
  if (first || last) largest = std::max(largest, emb);
  std::uint64_t bucket_total = 0;
  if (p.zero >= 2) {
    const std::uint64_t n = std::min(std::max(p.reduce_bucket, largest), Pk);
    for (int c = 0; c < (p.overlap_comm ? 2 : 1); ++c) {
      TensorEntry e = entry(g, c == 0 ? "reduce_bucket" : "reduce_bucket.1", "(n)", D,
                            checked_mul(n, w), Term::other, "setup (persistent)",
                            "gradients are produced here and reduce-scattered into the shard; "
                            "n = min(max(reduce bucket, largest tensor), local params) = " +
                                std::to_string(n));
      bucket_total = checked_add(bucket_total, e.bytes);
      r.communication.push_back(std::move(e));
    }
  }
  GatherPlan gp;
  if (p.zero == 3) {
    gp.bytes.assign(u(Ls) + 2, checked_mul(Lu, w));
    gp.bytes[0] = checked_mul(emb, w);
    gp.bytes[u(Ls) + 1] = checked_mul(checked_add(emb, l.h), w);  // final norm + head weight
    gp.seq.push_back(0);
    for (std::int64_t k = 0; k < Ls; ++k) gp.seq.push_back(static_cast<int>(1 + k));
    gp.seq.push_back(static_cast<int>(Ls + 1));
    for (std::int64_t k = Ls - 1; k >= 0; --k) gp.seq.push_back(static_cast<int>(1 + k));
    r.communication.push_back(entry(g, "gathered units", "(layer params)", D, gp.bytes[1],
                                    Term::other, "forward and backward of each unit",
                                    "ZeRO-3: one unit's parameters gathered, plus " +
                                        std::to_string(p.prefetch) + " prefetched"));
  }
  if (sp)
    r.communication.push_back(entry(g, "sp gather/partial", "(b,s,h)", D, l.full, Term::sbh,
                                    "around each tensor-parallel GEMM group",
                                    "sequence parallelism: all-gather input / reduce-scatter "
                                    "partial output, transient"));

  // ---- activations of one micro-batch ----
  auto& acts = est.activations;
  const std::string res = sp ? "(b,s/t,h)" : "(b,s,h)";
  if (first)
    acts.embedding.push_back(
        entry(g, "embed_out", res, D, l.X, Term::sbh, "layer 0's input_layernorm backward",
              "embedding output x_0 (all-reduced over the vocabulary shards)"));
  else
    acts.embedding.push_back(entry(g, "stage_input", res, D, l.X, Term::sbh,
                                   "the stage's first input_layernorm backward",
                                   "activation received from the previous stage"));
  const std::vector<TensorEntry> set = layer_set(g, l, D, t.attention, sp, m.qk_norm);
  if (full) {
    acts.layer.push_back(set.back());
    acts.layer.back().kept_by = "checkpointing: kept as the next layer's input";
    acts.recompute.assign(set.begin(), set.end() - 1);
  } else {
    acts.layer = set;
  }
  if (last) {
    acts.head.push_back(entry(g, "final_norm_out", res, D, l.X, Term::sbh, "lm_head backward",
                              "input of the lm_head GEMM"));
    acts.head.push_back(entry(g, "final_rstd", sp ? "(b,s/t)" : "(b,s)", "fp32", l.r4, Term::sb,
                              "final norm backward", "1/rms of each row of x_L"));
    acts.head.push_back(entry(g, "logits", "(b,s,V/t)", D, l.logits, Term::other,
                              "cross-entropy backward (in place)", "the rank's vocabulary shard"));
    acts.head.push_back(entry(g, "ce_lse", "(b,s)", "fp32", l.bs4, Term::sb,
                              "cross-entropy backward", "row log-sum-exp over all shards"));
    acts.inputs.push_back(entry(g, "targets", "(b,s)", "int32", l.bs4, Term::sb, "cross-entropy",
                                "next-token labels"));
  }
  if (first)
    acts.inputs.insert(acts.inputs.begin(), entry(g, "tokens", "(b,s)", "int32", l.bs4, Term::sb,
                                                  "embedding backward", "token ids"));
  analytic_detail::finish(acts, Ls);
  // A non-last stage frees its last layer's `out` once sent.
  const std::uint64_t A_mb = last ? acts.total_bytes : csub(acts.total_bytes, l.X, "stage output");
  const std::uint64_t others = checked_mul(u(r.in_flight - 1), A_mb, "in-flight activations");

  // ---- the instants ----
  const std::uint64_t S = sum_bytes(set);
  const std::uint64_t R = csub(S, l.X, "recompute set");
  const std::uint64_t C = kCublasWorkspaceBytes;
  const std::uint64_t Ib = sum_bytes(acts.inputs);
  const std::uint64_t sg = sp ? l.full : 0;  // a transient gather / partial buffer
  const std::uint64_t head_pos = u(Ls) + 1, back_pos = u(Ls) + 2;
  constexpr std::uint64_t kNoUnit = ~std::uint64_t{0};  // nothing gathered (start of step)
  auto gathered = [&](std::uint64_t pos) {
    return p.zero == 3 && pos != kNoUnit ? gp.window(pos, p.prefetch) : 0;
  };
  auto at = [&](std::string name, std::uint64_t act, std::uint64_t ws, std::uint64_t comm,
                std::uint64_t pos, bool in_flight = true) {
    Instant in;
    in.name = std::move(name);
    in.bytes[P] = fg.params;
    in.bytes[G] = fg.gradients;
    in.bytes[O] = fg.optimizer_states;
    in.bytes[A] = checked_add(act, in_flight ? others : 0, "activations");
    in.bytes[W] = ws;
    in.bytes[I] = Ib;
    in.bytes[X] = csum({bucket_total, comm, gathered(pos)}, "communication");
    est.instants.push_back(std::move(in));
  };
  const std::uint64_t input = l.X;  // embed_out or stage_input
  at("start of step", 0, C, 0, kNoUnit, /*in_flight=*/false);
  if (first && (sp || p.zero == 3))
    at("forward: embed_out allocated" + std::string(sp ? " (partial alive)" : ""), input, C, sg, 0);
  // Forward of the last layers: their `out` allocated (with the down partial under sp).
  const std::int64_t window_layers = p.zero == 3 ? std::min<std::int64_t>(Ls, p.prefetch + 1) : 1;
  if (full || sp || p.zero == 3 || !last) {
    for (std::int64_t k = Ls - window_layers; k < Ls; ++k) {
      const std::uint64_t kept =
          full ? csum({input, checked_mul(u(k), l.X), S}) : csum({input, checked_mul(u(k) + 1, S)});
      at("forward: layer " + std::to_string(k) + " `out` allocated" +
             (sp ? " (down partial alive)" : ""),
         kept, C, sg, u(k) + 1);
    }
  }
  // This micro-batch's activations when the first backward layer starts (the head and the sent
  // `out` gone): before the recompute, and after it.
  const std::uint64_t A_start = checked_mul(u(Ls), full ? l.X : S, "activations");
  const std::uint64_t A_L = full ? checked_add(A_start, R) : A_start;
  if (last) {
    const std::uint64_t A_end = acts.total_bytes;
    if (sp)
      at("head forward: logits allocated (final norm output gathered)", csub(A_end, l.bs4, "head"),
         C, sg, head_pos);
    at("end of forward: ce_losses allocated", A_end, csum({C, l.bs4}), 0, head_pos);
    at("backward head step 2: d_final_norm_out" +
           std::string(sp ? " partial (input gathered)" : ""),
       csub(A_end, l.bs4, "head"), csum({C, l.full}), sg, head_pos);
    const std::uint64_t A3 = csub(A_end, csum({l.bs4, l.logits}), "head");
    if (sp)
      at("backward head step 2: d_final_norm_out reduce-scattered", A3, csum({C, l.full, l.X}), 0,
         head_pos);
    at("backward head step 3: d_residual", A3, csum({C, l.X, l.X}), 0, head_pos);
  } else {
    at("backward: d_residual received from the next stage", A_start, csum({C, l.X}), 0, back_pos);
  }
  const std::string Lb = "backward layer " + std::to_string(Ls - 1) + " ";
  if (full) at(Lb + "step 0: recompute done", A_L, csum({C, l.X}), 0, back_pos);
  at(Lb + "step 1: d_act" + (sp ? " (d_residual gathered)" : ""), A_L, csum({C, l.X, l.bsi}), sg,
     back_pos);
  at(Lb + "step 2: d_gate, d_up (SwiGLU backward)", csub(A_L, l.bsi, "step 2"),
     csum({C, l.X, l.bsi, l.bsi, l.bsi}), 0, back_pos);
  const std::uint64_t A3 = csub(A_L, checked_mul(3, l.bsi), "step 3");
  at(Lb + "step 3: d_xn2" + (sp ? " partial (xn2 gathered)" : ""), A3,
     csum({C, l.X, l.full, l.bsi, l.bsi}), sg, back_pos);
  if (sp)
    at(Lb + "step 3: d_xn2 reduce-scattered", A3, csum({C, l.X, l.full, l.X, l.bsi, l.bsi}), 0,
       back_pos);
  const std::uint64_t A5 = csub(A3, csum({l.X, l.X, l.r4}), "step 5");  // xn2, h_mid, rstd2
  at(Lb + "step 5: d_attn_out" + (sp ? " (d_residual gathered)" : ""), A5, csum({C, l.X, l.bsad}),
     sg, back_pos);
  const std::uint64_t scratch = l.store;  // d_probs | attn_delta: the size of probs | lse
  at(Lb + "step 6: d_q, d_k, d_v, " + (t.attention == Attention::eager ? "d_probs" : "attn_delta") +
         " (attention backward)",
     A5, csum({C, l.X, l.bsad, l.bsad, l.bskd, l.bskd, scratch}), 0, back_pos);
  std::uint64_t A8 = csub(A5, csum({l.bsad, l.store}), "step 8");
  if (m.qk_norm) {
    // Step 7: d_q_pre and d_k_pre beside d_q, d_k, d_v; then d_q, d_k and the norm tensors go.
    at(Lb + "step 7: d_q_pre, d_k_pre (q/k norm backward)", A8,
       csum({C, l.X, l.bsad, l.bskd, l.bskd, l.bsad, l.bskd}), 0, back_pos);
    A8 =
        csub(A8, csum({l.bsad, l.bskd, bytes_of({l.b, l.s, l.a}, 4), bytes_of({l.b, l.s, l.k}, 4)}),
             "step 8");
  }
  at(Lb + "step 8: d_xn1" + (sp ? " partial (xn1 gathered)" : ""), A8,
     csum({C, l.X, l.full, l.bsad, l.bskd, l.bskd}), sg, back_pos);
  if (sp)
    at(Lb + "step 8: d_xn1 reduce-scattered", A8,
       csum({C, l.X, l.full, l.X, l.bsad, l.bskd, l.bskd}), 0, back_pos);

  // ---- figures ----
  fg.inputs = Ib;
  fg.activations = checked_add(last ? acts.total_bytes : A_mb, others, "activations");
  std::uint64_t ws = 0, ap = 0, best = 0;
  for (std::size_t n = 0; n < est.instants.size(); ++n) {
    const auto& in = est.instants[n];
    ws = std::max(ws, in.bytes[W]);
    ap = std::max(ap, in.bytes[A]);
    const std::uint64_t tot = in.total();
    if (est.peak_instant < 0 || tot > best) {
      best = tot;
      est.peak_instant = static_cast<int>(n);
    }
  }
  fg.workspace = ws;
  fg.activations_peak = ap;
  fg.peak = best;
  fg.peak_breakdown = est.instants[est.peak_instant].bytes;
  fg.sum = csum({fg.params, fg.gradients, fg.optimizer_states, fg.activations}, "sum");
  est.label = "trainmem's sharded step (docs/distributed.md), " + p.describe() + ", stage " +
              std::to_string(stage);
  est.notes.push_back("per rank: every figure is one GPU's (" + std::to_string(r.ranks) +
                      " ranks share these figures)");
  if (p.pp > 1)
    est.notes.push_back("1F1B: " + std::to_string(r.in_flight) +
                        " micro-batch(es) in flight on this stage at the peak");
  return r;
}

}  // namespace

std::uint64_t Overheads::total() const {
  return checked_add(cuda_context, nccl, "overheads");
}

Overheads estimate_overheads(const ParallelConfig& layout, const OverheadOptions& opts) {
  Overheads o;
  if (opts.host_ranks) {
    o.host_ranks = true;
    o.cuda_context_source = "none: the ranks run on the cpu backend";
    o.nccl_source = "none: the cpu backend's collectives are MPI on host memory";
    return o;
  }
  if (opts.cuda_context) {
    o.cuda_context = *opts.cuda_context;
    o.cuda_context_source = "--cuda-context";
  } else {
    o.cuda_context = kCudaContextBytes;
    o.cuda_context_source =
        "default estimate, 512 MiB (users report 0.3-0.55 GB, more on GPUs with more SMs)";
  }
  if (opts.nccl) {
    o.nccl = *opts.nccl;
    o.nccl_source = "--nccl-memory";
    return o;
  }
  // One communicator per parallel group the rank belongs to (dp, tp, pp where > 1); each holds
  // NCCL_BUFFSIZE per channel per peer, for its ring/tree peers (2: send and receive side).
  std::uint64_t comms = 0;
  for (std::int64_t deg : {layout.dp, layout.tp, layout.pp})
    if (deg > 1) ++comms;
  const std::uint64_t per = checked_mul(checked_mul(opts.nccl_buffsize, u(opts.nccl_channels)), 2);
  o.nccl = checked_mul(comms, per, "NCCL buffers");
  o.nccl_source = std::to_string(comms) + " communicator(s) × " +
                  std::to_string(opts.nccl_channels) + " channels × 2 peers × NCCL_BUFFSIZE " +
                  std::to_string(opts.nccl_buffsize) + " B";
  return o;
}

std::uint64_t LayoutEstimate::worst_total() const {
  return checked_add(ranks.at(static_cast<std::size_t>(worst)).est.figures.peak, overheads.total(),
                     "worst rank");
}

LayoutEstimate estimate_layout(const ModelConfig& model, const TrainConfig& train,
                               const ParallelConfig& layout, const OverheadOptions& overheads) {
  model.validate();
  train.validate();
  LayoutEstimate out;
  out.layout = layout;
  out.model = model;
  out.train = train;
  out.global_batch = checked_mul(checked_mul(u(train.batch), u(layout.microbatches)), u(layout.dp),
                                 "global batch");
  if (!layout.distributed() && train.optimizer == Optimizer::lomo) {
    // LOMO allocates gradients during the backward: the single-GPU profile is the whole story.
    RankEstimate r;
    r.role = "only";
    r.ranks = 1;
    r.layers = model.layers;
    r.est = estimate(Profile::native, model, train);
    r.local_params = r.shard_elements = r.est.param_count;
    out.ranks.push_back(std::move(r));
  } else {
    for (std::int64_t k = 0; k < layout.pp; ++k)
      out.ranks.push_back(estimate_stage(model, train, layout, k));
  }
  for (std::size_t n = 1; n < out.ranks.size(); ++n)
    if (out.ranks[n].est.figures.peak > out.ranks[u(out.worst)].est.figures.peak)
      out.worst = static_cast<int>(n);
  out.overheads = layout.distributed() ? estimate_overheads(layout, overheads) : Overheads{};
  if (!layout.distributed()) {
    out.overheads.cuda_context =
        overheads.cuda_context ? *overheads.cuda_context : kCudaContextBytes;
    out.overheads.cuda_context_source =
        overheads.cuda_context ? "--cuda-context" : "default estimate";
    out.overheads.nccl_source = "single GPU: no NCCL communicator";
  }
  return out;
}

}  // namespace trainmem
