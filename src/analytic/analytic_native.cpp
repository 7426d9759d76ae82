// The `native` profile: trainmem's own training step, in closed form, from docs/native-plan.md.
//
// Activations are the plan's per-layer tensors; `peak` is the maximum over the instants of the
// plan at which live bytes can reach a maximum (the end of every run of allocations), taken in
// chronological order so that a tie keeps the first instant, as a ledger does:
//   forward  (full) the last layer's `out`, and the end of forward (ce_losses allocated);
//   head     steps 2 and 3 of the head backward;
//   layer    each step of the FIRST layer processed by the backward (layer L-1): later layers
//            hold strictly fewer activations (one layer's set, or one checkpoint, less) and the
//            same transient buffers and gradients, so they never exceed it;
//   embedding the embedding backward (LOMO allocates the embedding gradient there).
// Derivation: docs/formulas.md, "native".
#include <algorithm>

#include "analytic_detail.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem::analytic_detail {
namespace {

constexpr int P = static_cast<int>(Category::params);
constexpr int G = static_cast<int>(Category::gradients);
constexpr int O = static_cast<int>(Category::optimizer_states);
constexpr int A = static_cast<int>(Category::activations);
constexpr int W = static_cast<int>(Category::workspace);
constexpr int I = static_cast<int>(Category::inputs);

// The plan's per-layer forward tensors, in allocation order (`out` last).
std::vector<TensorEntry> layer_tensors(const Dims& d, Attention attn, bool qk_norm) {
  const std::string D = d.dt;
  const std::uint64_t w = d.w;
  std::vector<TensorEntry> v;
  v.push_back(entry(d, "rstd1", "(b,s)", "fp32", bytes_of({d.b, d.s}, 4), Term::sb,
                    "input_layernorm backward", "1/rms of each row of x_l"));
  v.push_back(entry(d, "xn1", "(b,s,h)", D, bytes_of({d.b, d.s, d.h}, w), Term::sbh,
                    "q/k/v projection backward", "input of the q, k and v GEMMs (dW_q/k/v)"));
  if (qk_norm) {
    v.push_back(entry(d, "q_pre", "(b,s,a·d)", D, bytes_of({d.b, d.s, d.a, d.d}, w), Term::sbh,
                      "q_norm backward", "q projection (+ bias) before the per-head RMSNorm"));
    v.push_back(entry(d, "k_pre", "(b,s,k·d)", D, bytes_of({d.b, d.s, d.kd}, w), Term::sbh,
                      "k_norm backward", "k projection (+ bias) before the per-head RMSNorm"));
    v.push_back(entry(d, "q_rstd", "(b,s,a)", "fp32", bytes_of({d.b, d.s, d.a}, 4), Term::sb,
                      "q_norm backward", "1/rms of each query head"));
    v.push_back(entry(d, "k_rstd", "(b,s,k)", "fp32", bytes_of({d.b, d.s, d.k}, 4), Term::sb,
                      "k_norm backward", "1/rms of each key head"));
  }
  v.push_back(entry(d, "q", "(b,s,a·d)", D, bytes_of({d.b, d.s, d.a, d.d}, w), Term::sbh,
                    "attention backward", "query after RoPE (in place)"));
  v.push_back(entry(d, "k", "(b,s,k·d)", D, bytes_of({d.b, d.s, d.kd}, w), Term::sbh,
                    "attention backward", "key after RoPE, sized by the kv heads"));
  v.push_back(entry(d, "v", "(b,s,k·d)", D, bytes_of({d.b, d.s, d.kd}, w), Term::sbh,
                    "attention backward", "value, sized by the kv heads"));
  if (attn == Attention::eager) {
    v.push_back(entry(d, "probs", "(b,a,s,s)", D, bytes_of({d.b, d.a, d.s, d.s}, w), Term::as2b,
                      "attention backward", "materialised causal softmax probabilities"));
  } else {
    v.push_back(entry(d, "lse", "(b,a,s)", "fp32", bytes_of({d.b, d.a, d.s}, 4), Term::sb,
                      "attention backward",
                      "row log-sum-exp: flash recomputes the probabilities from it (4a·sb "
                      "bytes, folded into c_sb)"));
  }
  v.push_back(entry(d, "attn_out", "(b,s,a·d)", D, bytes_of({d.b, d.s, d.a, d.d}, w), Term::sbh,
                    "o_proj backward and attention backward",
                    "input of the o GEMM (dW_o); the flash/eager backward reads it too"));
  v.push_back(entry(d, "h_mid", "(b,s,h)", D, bytes_of({d.b, d.s, d.h}, w), Term::sbh,
                    "post_attention_layernorm backward", "residual stream after attention"));
  v.push_back(entry(d, "rstd2", "(b,s)", "fp32", bytes_of({d.b, d.s}, 4), Term::sb,
                    "post_attention_layernorm backward", "1/rms of each row of h_mid"));
  v.push_back(entry(d, "xn2", "(b,s,h)", D, bytes_of({d.b, d.s, d.h}, w), Term::sbh,
                    "gate/up projection backward", "input of the gate and up GEMMs"));
  v.push_back(entry(d, "gate", "(b,s,i)", D, bytes_of({d.b, d.s, d.i}, w), Term::sbi,
                    "SwiGLU backward", "silu'(gate) needs the pre-activation"));
  v.push_back(entry(d, "up", "(b,s,i)", D, bytes_of({d.b, d.s, d.i}, w), Term::sbi,
                    "SwiGLU backward", "d gate = d act · up · silu'(gate)"));
  v.push_back(entry(d, "act", "(b,s,i)", D, bytes_of({d.b, d.s, d.i}, w), Term::sbi,
                    "down_proj backward", "input of the down GEMM (dW_down)"));
  v.push_back(entry(d, "out", "(b,s,h)", D, bytes_of({d.b, d.s, d.h}, w), Term::sbh,
                    "next layer's input_layernorm backward (or the final norm's)",
                    "the layer output x_{l+1}, the next layer's input"));
  return v;
}

}  // namespace

void build_native(Estimate& est) {
  const Dims d = make_dims(est.model, est.train);
  const TrainConfig& t = est.train;
  const bool full = t.checkpointing == Checkpointing::full;
  const bool lomo = t.optimizer == Optimizer::lomo;
  const bool tied = est.model.tied_embeddings;
  const bool qkn = est.model.qk_norm;
  const std::uint64_t w = d.w;
  est.label = "trainmem's own step (docs/native-plan.md), exact";

  auto& acts = est.activations;
  const std::string D = d.dt;
  const std::uint64_t bsh = bytes_of({d.b, d.s, d.h}, w);  // one (b,s,h) D tensor
  const std::uint64_t bsi = bytes_of({d.b, d.s, d.i}, w);
  const std::uint64_t bskd = bytes_of({d.b, d.s, d.kd}, w);
  const std::uint64_t bsad = bytes_of({d.b, d.s, d.a, d.d}, w);  // q, attn_out (a·d may != h)
  const std::uint64_t bs4 = bytes_of({d.b, d.s}, 4);             // one (b,s) f32 tensor
  const std::uint64_t store = t.attention == Attention::eager
                                  ? bytes_of({d.b, d.a, d.s, d.s}, w)  // probs
                                  : bytes_of({d.b, d.a, d.s}, 4);      // lse
  const std::uint64_t scratch = t.attention == Attention::eager
                                    ? bytes_of({d.b, d.a, d.s, d.s}, w)  // d_probs
                                    : bytes_of({d.b, d.a, d.s}, 4);      // attn_delta

  acts.embedding.push_back(entry(d, "embed_out", "(b,s,h)", D, bsh, Term::sbh,
                                 "layer 0's input_layernorm backward",
                                 "embedding output x_0, layer 0's input"));
  std::vector<TensorEntry> full_set = layer_tensors(d, t.attention, qkn);
  if (full) {
    acts.layer.push_back(full_set.back());  // `out`: the next layer's checkpointed input
    acts.layer.back().kept_by = "checkpointing: kept as the next layer's input";
    acts.layer.back().why = "the only tensor a checkpointed layer keeps; the rest is recomputed";
    acts.recompute.assign(full_set.begin(), full_set.end() - 1);
    for (auto& e : acts.recompute) e.kept_by = "recomputed in backward; " + e.kept_by;
  } else {
    acts.layer = full_set;
  }
  acts.head.push_back(entry(d, "final_norm_out", "(b,s,h)", D, bsh, Term::sbh, "lm_head backward",
                            "input of the lm_head GEMM (dW_head)"));
  acts.head.push_back(entry(d, "final_rstd", "(b,s)", "fp32", bs4, Term::sb, "final norm backward",
                            "1/rms of each row of x_L"));
  acts.head.push_back(entry(d, "logits", "(b,s,V)", D, bytes_of({d.b, d.s, d.V}, w), Term::other,
                            "cross-entropy backward (in place)",
                            "d logits are written into this buffer"));
  acts.head.push_back(entry(d, "ce_lse", "(b,s)", "fp32", bs4, Term::sb, "cross-entropy backward",
                            "row log-sum-exp of the logits"));
  acts.inputs.push_back(entry(d, "tokens", "(b,s)", "int32", bytes_of({d.b, d.s}, 4), Term::sb,
                              "embedding backward", "token ids"));
  acts.inputs.push_back(entry(d, "targets", "(b,s)", "int32", bytes_of({d.b, d.s}, 4), Term::sb,
                              "cross-entropy", "next-token labels (-1 at each row's end)"));
  finish(acts, est.model.layers);

  const std::uint64_t S = sum_bytes(full_set);            // one layer, all tensors
  const std::uint64_t R = csub(S, bsh, "recompute set");  // one layer without `out`
  const std::uint64_t A_end = acts.total_bytes;
  // Activations when layer L-1's backward starts (step 1): all layers' sets (none) or the L
  // checkpoints x_0..x_{L-1} plus the recomputed layer (full); the head is gone.
  const std::uint64_t A_L =
      full ? csum({checked_mul(d.L, bsh), R}) : checked_mul(d.L, S, "activations");

  // ---- the instants ----
  const std::uint64_t Pb = est.figures.params;
  const std::uint64_t Ob = est.figures.optimizer_states;
  const std::uint64_t Gp = lomo ? 0 : est.figures.gradients;  // persistent gradients
  const std::uint64_t Ib = sum_bytes(acts.inputs);
  const std::uint64_t C = kCublasWorkspaceBytes;
  const std::uint64_t emb_grad = bytes_of({d.V, d.h}, w);
  const std::uint64_t T = (lomo && tied) ? emb_grad : 0;  // tied LOMO gradient, kept
  auto g = [&](std::uint64_t lomo_bytes) { return csum({Gp, T, lomo ? lomo_bytes : 0}); };
  auto at = [&](std::string name, std::uint64_t act, std::uint64_t ws, std::uint64_t grads) {
    Instant in;
    in.name = std::move(name);
    in.bytes[P] = Pb;
    in.bytes[G] = grads;
    in.bytes[O] = Ob;
    in.bytes[A] = act;
    in.bytes[W] = ws;
    in.bytes[I] = Ib;
    est.instants.push_back(std::move(in));
  };
  const std::uint64_t had = bytes_of({d.h, d.a, d.d}, w), ih = bytes_of({d.i, d.h}, w);
  const std::uint64_t hw = bytes_of({d.h}, w), dw = bytes_of({d.d}, w);

  at("start of step", 0, C, Gp);
  if (full) {
    // Forward of layer L-1, when its `out` is allocated: x_0, the L-1 earlier checkpoints and
    // the layer's whole set.
    at("forward: layer L-1 `out` allocated (its other tensors not yet freed)",
       csum({checked_mul(d.L, bsh), S}), C, Gp);
  }
  at("end of forward: ce_losses allocated", A_end, csum({C, bs4}), Gp);
  // Head backward. Step 2: d_final_norm_out, then (LOMO) the lm_head gradient (tied: the shared
  // embedding gradient, kept until the embedding backward).
  at("backward head step 2: d_final_norm_out" + std::string(lomo ? " + lm_head gradient" : ""),
     csub(A_end, bs4, "head"), csum({C, bsh}), csum({Gp, lomo ? emb_grad : 0}));
  at("backward head step 3: d_residual" + std::string(lomo ? " + norm gradient" : ""),
     csub(A_end, csum({bs4, bytes_of({d.b, d.s, d.V}, w)}), "head"), csum({C, bsh, bsh}), g(hw));
  if (full) at("backward layer L-1 step 0: recompute done", A_L, csum({C, bsh}), g(0));
  at("backward layer L-1 step 1: d_act" + std::string(lomo ? " + down_proj gradient" : ""), A_L,
     csum({C, bsh, bsi}), g(ih));
  at("backward layer L-1 step 2: d_gate, d_up (SwiGLU backward)", csub(A_L, bsi, "step 2"),
     csum({C, bsh, bsi, bsi, bsi}), g(0));
  const std::uint64_t A3 = csub(A_L, checked_mul(3, bsi), "step 3");
  at("backward layer L-1 step 3: d_xn2" + std::string(lomo ? " + gate_proj gradient" : ""), A3,
     csum({C, bsh, bsh, bsi, bsi}), g(ih));
  const std::uint64_t A4 = csub(A3, bsh, "step 4");  // xn2 freed
  if (lomo)
    at("backward layer L-1 step 4: post_attention_layernorm gradient", A4, csum({C, bsh, bsh}),
       g(hw));
  const std::uint64_t A5 = csub(A4, csum({bsh, bs4}), "step 5");  // h_mid, rstd2 freed
  at("backward layer L-1 step 5: d_attn_out" + std::string(lomo ? " + o_proj gradient" : ""), A5,
     csum({C, bsh, bsad}), g(had));
  at(std::string("backward layer L-1 step 6: d_q, d_k, d_v, ") +
         (t.attention == Attention::eager ? "d_probs" : "attn_delta") + " (attention backward)",
     A5, csum({C, bsh, bsad, bsad, bskd, bskd, scratch}), g(0));
  const std::uint64_t A7 = csub(A5, csum({bsad, store}), "step 7");  // attn_out, probs|lse freed
  std::uint64_t A8 = A7;
  if (qkn) {
    // Step 7, q/k norm backward: d_q_pre, then d_k_pre, beside d_q, d_k, d_v; then d_q, d_k
    // and the four norm tensors are freed.
    at("backward layer L-1 step 7: d_q_pre" + std::string(lomo ? " + q_norm gradient" : ""), A7,
       csum({C, bsh, bsad, bskd, bskd, bsad}), g(dw));
    at("backward layer L-1 step 7: d_k_pre" + std::string(lomo ? " + k_norm gradient" : ""), A7,
       csum({C, bsh, bsad, bskd, bskd, bsad, bskd}), g(dw));
    A8 = csub(A7, csum({bsad, bskd, bytes_of({d.b, d.s, d.a}, 4), bytes_of({d.b, d.s, d.k}, 4)}),
              "step 8");
  }
  at("backward layer L-1 step 8: d_xn1" + std::string(lomo ? " + q_proj gradient" : ""), A8,
     csum({C, bsh, bsh, bsad, bskd, bskd}), g(had));
  if (lomo) {
    const std::uint64_t A9 = csub(A8, csum({bsad, bsh, bskd, bskd}), "step 9");
    at("backward layer L-1 step 9: input_layernorm gradient", A9, csum({C, bsh, bsh}), g(hw));
    if (!tied) at("backward embedding: embed_tokens gradient", 0, csum({C, bsh}), emb_grad);
  }

  // ---- figures from the instants ----
  auto& f = est.figures;
  f.inputs = Ib;
  f.activations = A_end;
  std::uint64_t ws_peak = 0, grad_peak = 0, act_peak = 0;
  for (const auto& in : est.instants) {
    ws_peak = std::max(ws_peak, in.bytes[W]);
    grad_peak = std::max(grad_peak, in.bytes[G]);
    act_peak = std::max(act_peak, in.bytes[A]);
  }
  f.workspace = ws_peak;
  f.activations_peak = act_peak;
  if (grad_peak != f.gradients)
    throw Error("analytic native: gradient peak of the instants (" + std::to_string(grad_peak) +
                ") differs from the optimizer rule (" + std::to_string(f.gradients) + ")");
  std::uint64_t best = 0;
  for (std::size_t n = 0; n < est.instants.size(); ++n) {
    const std::uint64_t tot = est.instants[n].total();
    if (est.peak_instant < 0 || tot > best) {  // strictly greater: a tie keeps the first
      best = tot;
      est.peak_instant = static_cast<int>(n);
    }
  }
  f.peak = best;
  f.peak_breakdown = est.instants[est.peak_instant].bytes;

  est.notes.push_back("exact: every figure must equal trainmem's ledger byte for byte");
  est.notes.push_back(
      "workspace = 32 MiB cuBLAS workspace + the largest set of transient buffers alive together "
      "(ce_losses, activation gradients in flight, d_probs or attn_delta)");
  est.notes.push_back("inputs (int32 tokens and targets) are counted in `peak`, not in `sum`");
  if (full)
    est.notes.push_back(
        "checkpointing full: activations_peak includes the forward of the last layer and the "
        "recomputed layer L-1 during backward");
  if (lomo)
    est.notes.push_back(tied ? "LOMO, tied embeddings: the shared embedding gradient is alive "
                               "from the head backward to the embedding backward"
                             : "LOMO: one gradient at a time, the largest is the gradient figure");
}

}  // namespace trainmem::analytic_detail
