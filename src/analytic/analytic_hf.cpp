// The HF profiles, `hf-eager` and `hf-sdpa`: the tensors PyTorch autograd saves for a
// HuggingFace LlamaForCausalLM training step, era by era (a transformers release range whose
// LLaMA code saves the same tensors, HfEra) and PyTorch series (TorchEra), plus what the
// training loop holds at the end of forward (Loop: the returned logits, past_key_values).
// Derived op by op from each era's released modeling_llama.py (docs/formulas.md, "hf-eager");
// proven by tools/hf_saved_tensors.py (saved_tensors_hooks on the real model, each storage
// counted once), whose output is tests/data/hf_golden/<era>[-sdpa].json.
//
// Rules of autograd that decide what is saved (PyTorch 1.13 to 2.15):
//   - a x b (MulBackward0) saves b when a needs a gradient and a when b does;
//   - x.pow(2) saves x; x.mean(dim) saves x before PyTorch 2.2 (later: only the sizes);
//     rsqrt saves its result; softmax and log_softmax save their result; silu saves its input;
//     maximum saves both inputs; bmm saves both inputs; linear saves its input (and the weight,
//     a parameter: not counted); nll_loss saves its target and a 0-dim total_weight;
//     scaled_dot_product_attention's flash kernel saves q, k, v, the output and an fp32
//     logsumexp (b, a, s);
//   - .to(dtype), +, views, cat, neg save no tensor; tensor / python_number saves the number as
//     a 0-dim fp64 CPU tensor (host memory even in a GPU run: not counted);
//   - .to(dtype) to the tensor's own dtype returns the same tensor (no new storage): in fp32
//     training the fp32 upcasts of RMSNorm and softmax disappear;
//   - reshape of a non-viewable tensor copies it; the copy is what bmm saves.
#include <algorithm>

#include "analytic_detail.hpp"
#include "trainmem/analytic/hf_step.hpp"
#include "trainmem/base/lora.hpp"

namespace trainmem::analytic_detail {
namespace {

// What one HF step is: the era's code, the PyTorch series, the attention, the loop.
struct Hf {
  HfEra era;
  TorchEra torch;
  bool sdpa;
  Loop loop;
  bool use_cache;
  bool qk_norm;  // Qwen3: RMSNorm over each head of q and k (q_norm, k_norm)
  // A mixture of experts (its MoE layers' MLP the experts'; null for a dense model and for a MoE
  // model's dense layers) and its experts implementation.
  const ModelConfig* moe = nullptr;
  bool grouped_mm = true;
  bool before_4_31() const { return era == HfEra::v4_28 || era == HfEra::v4_30; }
  bool mean_saves() const { return torch == TorchEra::before_2_2; }
};

// The saved tensors of one LlamaRMSNorm. `with_input`: the input's own storage, when the era
// saves it (the checkpointed replay's input is the checkpoint's storage, counted there).
//   4.28:  var = x.to(f32).pow(2).mean(-1); y = x * rsqrt(var + eps); y = y.to(weight dtype);
//          return weight * y
//   4.30:  the same, but return (weight * y).to(x.dtype): the multiply saves y in fp32
//   4.31+: x = x.to(f32); var = x.pow(2).mean(-1); y = x * rsqrt(var + eps);
//          return weight * y.to(input_dtype): x itself is not saved in 16-bit training
void rmsnorm(std::vector<TensorEntry>& v, const Dims& d, const Hf& hf, const std::string& p,
             bool with_input, const std::string& input_name) {
  const bool f32 = d.w == 4;
  const std::uint64_t bsh4 = bytes_of({d.b, d.s, d.h}, 4);
  if (hf.before_4_31()) {
    if (with_input)
      v.push_back(entry(d, p + "." + input_name, "(b,s,h)", d.dt, bytes_of({d.b, d.s, d.h}, d.w),
                        Term::sbh, "x * rsqrt(...) (MulBackward0 saves x)",
                        "d rsqrt needs x; also the residual stream (one storage)"));
    if (!f32)
      v.push_back(entry(d, p + ".x_f32", "(b,s,h)", "fp32", bsh4, Term::sbh,
                        "x.to(float32).pow(2) (PowBackward0 saves its input)",
                        "fp32 upcast of x for the variance"));
  } else if (!f32) {
    v.push_back(entry(d, p + ".x_f32", "(b,s,h)", "fp32", bsh4, Term::sbh,
                      "x.to(float32): pow(2) and x * rsqrt(...) save it (one storage)",
                      "4.31+ upcasts first; the 16-bit input itself is not kept"));
  } else if (with_input) {
    v.push_back(entry(d, p + "." + input_name, "(b,s,h)", d.dt, bsh4, Term::sbh,
                      "pow(2) and x * rsqrt(...) (x.to(float32) is x in fp32)",
                      "the layer's input, the residual stream (one storage)"));
  }
  if (hf.mean_saves())
    v.push_back(entry(d, p + ".x_squared_f32", "(b,s,h)", "fp32", bsh4, Term::sbh,
                      ".mean(-1, keepdim=True) (MeanBackward1 saves its input before "
                      "PyTorch 2.2)",
                      "x_f32.pow(2): the one fp32 tensor PyTorch >= 2.2 no longer keeps"));
  v.push_back(entry(d, p + ".rsqrt", "(b,s,1)", "fp32", bytes_of({d.b, d.s}, 4), Term::sb,
                    "rsqrt (RsqrtBackward0 saves its result), x * rsqrt (MulBackward0)",
                    "1/rms of each row"));
  if (hf.era == HfEra::v4_30)
    v.push_back(entry(d, p + ".x_normed_f32", "(b,s,h)", "fp32", bsh4, Term::sbh,
                      "weight * y (MulBackward0 saves y for d weight)",
                      "4.30: 16-bit x times an fp32 (b,s,1) tensor promotes to fp32, and the "
                      "multiply by the weight runs before the cast back"));
  else
    v.push_back(entry(d, p + ".x_normed", "(b,s,h)", d.dt, bytes_of({d.b, d.s, d.h}, d.w),
                      Term::sbh, "weight * y (MulBackward0 saves y for d weight)",
                      hf.era == HfEra::v4_28 ? "4.28: y cast to the weight dtype first"
                                             : "4.31+: y cast back to the input dtype first"));
}

// Qwen3's q_norm / k_norm: Qwen3RMSNorm(head_dim) over q_proj(x).view(b, s, heads, d), the
// 4.31+ code (x.to(f32); var = x.pow(2).mean(-1); y = x * rsqrt(var + eps);
// weight * y.to(input_dtype)) on `heads` heads: in 16-bit training the fp32 upcast (pow and
// x * rsqrt save it), 1/rms (b,s,heads,1) and y in 16 bits (weight * y saves it); in fp32 the
// projection's output itself instead of the upcast. Its output goes on through transpose and
// RoPE (q * cos saves cos, not q), so nothing more is kept.
void head_norm(std::vector<TensorEntry>& v, const Dims& d, const std::string& p,
               std::uint64_t heads) {
  const bool f32 = d.w == 4;
  const std::uint64_t n4 = bytes_of({d.b, d.s, heads, d.d}, 4);
  const std::string shape = p == "q_norm" ? "(b,s,a,d)" : "(b,s,k,d)";
  v.push_back(entry(d, p + (f32 ? ".x" : ".x_f32"), shape, "fp32", n4, Term::sbh,
                    "pow(2) and x * rsqrt(...) (one storage)",
                    f32 ? "the projection's output, per head (x.to(float32) is x)"
                        : "the fp32 upcast of the projection's output, per head"));
  v.push_back(entry(d, p + ".rsqrt", p == "q_norm" ? "(b,s,a,1)" : "(b,s,k,1)", "fp32",
                    bytes_of({d.b, d.s, heads}, 4), Term::sb,
                    "rsqrt (RsqrtBackward0 saves its result), x * rsqrt (MulBackward0)",
                    "1/rms of each head's row"));
  v.push_back(entry(d, p + ".x_normed", shape, d.dt, bytes_of({d.b, d.s, heads, d.d}, d.w),
                    Term::sbh, "weight * y (MulBackward0 saves y for d weight)",
                    "y cast back to the input dtype first (weight of head_dim elements)"));
}

// RoPE's cos and sin as saved by q * cos, rotate_half(q) * sin (and k's): (1,1,s,d) each.
void rope_tables(std::vector<TensorEntry>& v, const Dims& d, const Hf& hf) {
  const char* why = hf.era == HfEra::v5_25
                        ? "computed once per forward by LlamaModel.rotary_emb and passed to "
                          "every layer (one storage)"
                        : "cos[position_ids] is a fresh tensor in every layer";
  v.push_back(entry(d, "rope.cos", "(1,1,s,d)", d.dt, bytes_of({d.s, d.d}, d.w), Term::other,
                    "q * cos, k * cos (MulBackward0 saves cos)", why));
  v.push_back(entry(d, "rope.sin", "(1,1,s,d)", d.dt, bytes_of({d.s, d.d}, d.w), Term::other,
                    "rotate_half(q) * sin, rotate_half(k) * sin", why));
}

// A MoE layer's MLP as transformers 5.25's MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock /
// Qwen3MoeSparseMoeBlock keep it (docs/moe-plan.md, measured on the real classes; d.i is the
// experts' width i_m here). T = b·s tokens, each routed to k experts: whatever the routing, the
// experts hit see T·k rows in all, so their storages (up to eight per expert hit, whose shapes
// follow the routing) add up to the same bytes; they are listed here as those sums.
void moe_saved(std::vector<TensorEntry>& v, const Dims& d, const Hf& hf) {
  const ModelConfig& m = *hf.moe;
  const std::string& D = d.dt;
  const std::uint64_t w = d.w, T = checked_mul(d.b, d.s, "tokens");
  const std::uint64_t k = static_cast<std::uint64_t>(m.experts_per_token);
  const std::uint64_t E = static_cast<std::uint64_t>(m.experts);
  const std::uint64_t Tk = checked_mul(T, k, "routed rows");
  const bool mixtral = m.family == "mixtral", qwen2 = m.family == "qwen2_moe";
  // Mixtral keeps the routing weights in fp32; Qwen casts them back to the logits' dtype.
  const std::uint64_t r = mixtral ? 4 : w;
  const std::string rdt = mixtral ? "fp32" : D;
  v.push_back(entry(d, "post_attention_layernorm.out", "(b,s,h)", D, bytes_of({d.b, d.s, d.h}, w),
                    Term::sbh,
                    qwen2 ? "the router, shared_expert_gate and the shared expert's gate_proj, "
                            "up_proj (linear saves its input; one storage)"
                          : "the router mlp.gate (linear saves its input)",
                    "dW_router needs it"));
  v.push_back(entry(d, "router.softmax_f32", "(T,E)", "fp32", bytes_of({T, E}, 4), Term::sb,
                    "softmax(router_logits, dtype=float32) (SoftmaxBackward0 saves its result)",
                    "the router logits themselves are not saved"));
  v.push_back(entry(d, "router.topk_indices", "(T,k)", "int64", bytes_of({T, k}, 8), Term::sb,
                    "topk (TopkBackward0 saves the indices)", "which k experts each token takes"));
  if (m.norm_topk_prob) {
    v.push_back(entry(d, "router.topk_values", "(T,k)", "fp32", bytes_of({T, k}, 4), Term::sb,
                      "top_k / top_k.sum() (DivBackward0 saves self)",
                      mixtral ? "Mixtral always renormalises the top-k weights"
                              : "norm_topk_prob: the top-k weights renormalised"));
    v.push_back(entry(d, "router.topk_sum", "(T,1)", "fp32", bytes_of({T}, 4), Term::sb,
                      "top_k / top_k.sum() (DivBackward0 saves other)", "their sum"));
  }
  const char* each = hf.grouped_mm ? "over the T·k rows sorted by expert"
                                   : "summed over the experts hit (t_e rows each, Σ t_e = T·k)";
  if (hf.grouped_mm) {
    v.push_back(entry(d, "experts.sort_indices", "3 × (T·k)", "int64", bytes_of({Tk}, 24), Term::sb,
                      "index and index_add (their backward nodes save the indices)",
                      "grouped_mm: the sorting permutation and the token and slot of each row"));
    v.push_back(entry(d, "experts.group_offsets", "(E)", "int32", bytes_of({E}, 4), Term::other,
                      "torch._grouped_mm (saves offs)", "where each expert's rows end"));
  } else {
    v.push_back(entry(d, "experts.where", "(T·k,2)", "int64", bytes_of({Tk, 2}, 8), Term::sb,
                      "hidden_states[token_idx] and index_add_ (IndexBackward0, "
                      "IndexAddBackward0 save the indices)",
                      "torch.where(expert_mask[e]): one (t_e, 2) storage per expert hit"));
  }
  v.push_back(entry(d, "experts.input", "(T·k,h)", D, bytes_of({Tk, d.h}, w), Term::sbh,
                    "the gate_up projection (saves its input)",
                    std::string("the tokens gathered per expert, ") + each));
  v.push_back(entry(d, "experts.gate_up", "(T·k,2·i_m)", D, bytes_of({Tk, 2 * d.i}, w), Term::sbi,
                    "act_fn (SiluBackward0 saves the gate half), the product (saves the up half)",
                    std::string("one storage, ") + each));
  v.push_back(entry(d, "experts.silu", "(T·k,i_m)", D, bytes_of({Tk, d.i}, w), Term::sbi,
                    "silu(gate) * up (MulBackward0 saves self)", each));
  v.push_back(entry(d, "experts.prod", "(T·k,i_m)", D, bytes_of({Tk, d.i}, w), Term::sbi,
                    "the down projection (saves its input)", each));
  v.push_back(entry(d, "experts.down_out", "(T·k,h)", D, bytes_of({Tk, d.h}, w), Term::sbh,
                    "the weighting multiply (MulBackward0 saves self)", each));
  v.push_back(entry(d, "experts.weights", "(T·k,1)", rdt, bytes_of({Tk}, r), Term::sb,
                    "the weighting multiply (MulBackward0 saves other)",
                    std::string("the routing weight of each row, ") +
                        (mixtral ? "fp32 (Mixtral)" : "in the logits' dtype (Qwen)")));
  if (!hf.grouped_mm)
    v.push_back(
        entry(d, "experts.weighted_out", "(T·k,h)", D, bytes_of({Tk, d.h}, w), Term::sbh,
              "index_add_ (IndexAddBackward0 saves source)",
              mixtral ? "the fp32 product cast back (.to(dtype) copies it), " + std::string(each)
                      : std::string("the weighted output, ") + each));
  if (qwen2) {
    const std::uint64_t is = static_cast<std::uint64_t>(m.shared_expert_intermediate);
    const std::uint64_t bsi = bytes_of({T, is}, w);
    v.push_back(entry(d, "shared_expert.gate", "(T,i_s)", D, bsi, Term::other,
                      "act_fn (SiluBackward0 saves its input)", "the shared expert's gate_proj"));
    v.push_back(entry(d, "shared_expert.silu", "(T,i_s)", D, bsi, Term::other,
                      "silu(gate) * up (MulBackward0 saves self)", "the shared expert"));
    v.push_back(entry(d, "shared_expert.up", "(T,i_s)", D, bsi, Term::other,
                      "silu(gate) * up (MulBackward0 saves other)", "the shared expert"));
    v.push_back(entry(d, "shared_expert.prod", "(T,i_s)", D, bsi, Term::other,
                      "down_proj (linear saves its input)", "the shared expert"));
    v.push_back(entry(d, "shared_expert.out", "(T,h)", D, bytes_of({T, d.h}, w), Term::sbh,
                      "sigmoid(gate) * out (MulBackward0 saves other)", "its output"));
    v.push_back(entry(d, "shared_expert_gate.sigmoid", "(T,1)", D, bytes_of({T}, w), Term::sb,
                      "sigmoid (saves its result), the multiply (saves self)", "one storage"));
  }
}

// One decoder layer's saved tensors, in the order autograd saves them. `window_mask`: SDPA in
// a sliding-window layer with s >= the window, where HF passes a (b,1,s,s) boolean mask
// instead of is_causal=True (transformers 5.25 masking_utils: the causal skip needs
// kv_length < sliding_window).
std::vector<TensorEntry> layer_saved(const Dims& d, const Hf& hf, bool with_input,
                                     bool window_mask = false) {
  const std::string D = d.dt;
  const std::uint64_t w = d.w;
  const bool f32 = w == 4;
  const bool gqa = d.k < d.a;
  const std::uint64_t q_bytes = bytes_of({d.b, d.s, d.a, d.d}, w);  // (b,s,a·d): h unless head_dim
  const std::uint64_t kv_bytes = bytes_of({d.b, d.s, d.kd}, w);
  // repeat_kv's expand(b, k, n_rep, s, d).reshape(b, k·n_rep, s, d) is a view when k = 1 (a
  // stride-0 head dimension), and matmul can then fold (b, a) into one batch dimension without
  // a copy only when b = 1: eager keeps k and v at the kv heads (their own storages) exactly
  // when k = 1 and b = 1; SDPA, which takes the 4-D view as it is, whenever k = 1.
  const bool eager_kv_view = gqa && d.k == 1 && d.b == 1;
  const bool sdpa_kv_view = gqa && d.k == 1;
  std::vector<TensorEntry> v;
  rmsnorm(v, d, hf, "input_layernorm", with_input, "x");
  v.push_back(entry(d, "input_layernorm.out", "(b,s,h)", D, bytes_of({d.b, d.s, d.h}, w), Term::sbh,
                    "q_proj, k_proj, v_proj (linear saves its input; one storage)",
                    "dW_q, dW_k, dW_v need the normalised input"));
  if (hf.qk_norm) {
    head_norm(v, d, "q_norm", d.a);
    head_norm(v, d, "k_norm", d.k);
  }
  if (hf.era != HfEra::v5_25) rope_tables(v, d, hf);
  if (hf.sdpa && window_mask) {
    // sdpa_attention_forward with a mask: use_gqa_in_sdpa is false (no enable_gqa), so
    // repeat_kv copies k and v to all a heads; PyTorch turns the boolean mask into an additive
    // one in the query's dtype, a fresh (b,1,s,s) tensor per call, which the kernel saves.
    v.push_back(entry(d, "sdpa.q", "(b,a,s,d)", D, q_bytes, Term::sbh,
                      "scaled_dot_product_attention (saves query)", "RoPE's output"));
    v.push_back(entry(
        d, gqa ? "sdpa.k_repeated" : "sdpa.k", "(b,a,s,d)", D, sdpa_kv_view ? kv_bytes : q_bytes,
        Term::sbh, "scaled_dot_product_attention (saves key)",
        gqa ? "repeat_kv copied k to all a heads (a mask rules out enable_gqa)" : "RoPE's output"));
    v.push_back(entry(
        d, gqa ? "sdpa.v_repeated" : "sdpa.v", "(b,a,s,d)", D, sdpa_kv_view ? kv_bytes : q_bytes,
        Term::sbh, "scaled_dot_product_attention (saves value)",
        gqa ? "repeat_kv copied v to all a heads" : "a transposed view of v_proj's output"));
    v.push_back(entry(d, "sdpa.out", "(b,a,s,d)", D, q_bytes, Term::sbh,
                      "scaled_dot_product_attention (saves its output), o_proj (its input)",
                      "one storage, as without a mask"));
    v.push_back(entry(d, "sdpa.logsumexp", "(b,a,s)", "fp32", bytes_of({d.b, d.a, d.s}, 4),
                      Term::sb, "scaled_dot_product_attention (saves logsumexp)",
                      "the softmax is recomputed in backward from it"));
    v.push_back(entry(d, "sdpa.window_mask", "(b,1,s,s)", D, bytes_of({d.b, d.s, d.s}, w),
                      Term::other, "scaled_dot_product_attention (saves attn_mask)",
                      "the sliding-window boolean mask converted to an additive mask in the "
                      "query's dtype, in every windowed layer"));
  } else if (hf.sdpa) {
    // transformers 5.25 sdpa_attention_forward: q, k, v in (b, heads, s, d) go to
    // scaled_dot_product_attention(is_causal=True, enable_gqa=True): the flash kernel saves
    // them as given (k, v at the kv heads), the output and the logsumexp.
    const std::uint64_t kv = bytes_of({d.b, d.s, d.kd}, w);
    v.push_back(entry(d, "sdpa.q", "(b,a,s,d)", D, q_bytes, Term::sbh,
                      "scaled_dot_product_attention (flash: saves query)",
                      "RoPE's output, saved as it is (no copy)"));
    v.push_back(entry(d, "sdpa.k", "(b,k,s,d)", D, kv, Term::sbh,
                      "scaled_dot_product_attention (flash: saves key)",
                      gqa ? "at the kv heads: enable_gqa, no repeat_kv copy" : "RoPE's output"));
    v.push_back(entry(d, "sdpa.v", "(b,k,s,d)", D, kv, Term::sbh,
                      "scaled_dot_product_attention (flash: saves value)",
                      "a transposed view of v_proj's output"));
    v.push_back(entry(d, "sdpa.out", "(b,a,s,d)", D, q_bytes, Term::sbh,
                      "scaled_dot_product_attention (saves its output), o_proj (its input: "
                      "one storage)",
                      "the kernel writes (b,s,a,d) memory, so transpose().contiguous() and "
                      "reshape are views"));
    v.push_back(entry(d, "sdpa.logsumexp", "(b,a,s)", "fp32", bytes_of({d.b, d.a, d.s}, 4),
                      Term::sb, "scaled_dot_product_attention (flash: saves logsumexp)",
                      "the softmax is recomputed in backward from it"));
  } else {
    v.push_back(entry(d, "q_embed_copy", "(b·a,s,d)", D, bytes_of({d.b, d.a, d.s, d.d}, w),
                      Term::sbh, "matmul(q, k^T) (bmm saves both inputs)",
                      "d k = d scores^T · q; RoPE's elementwise ops keep q's (b,s,a,d) layout, so "
                      "matmul's reshape to (b·a,s,d) copies it"));
    v.push_back(entry(d, gqa ? "k_embed_repeated" : "k_embed_copy", "(b·a,d,s)", D,
                      eager_kv_view ? kv_bytes : bytes_of({d.b, d.a, d.s, d.d}, w), Term::sbh,
                      "matmul(q, k^T) (bmm saves both inputs)",
                      gqa ? "d q = d scores · k; repeat_kv materialised k at all a heads"
                          : "d q = d scores · k; k^T cannot be viewed as (b·a,d,s): copied"));
    if (hf.before_4_31()) {
      v.push_back(entry(d, "scores_masked", "(b,a,s,s)", D, bytes_of({d.b, d.a, d.s, d.s}, w),
                        Term::as2b,
                        "torch.max(scores + mask, finfo.min) (MaximumBackward0 saves both)",
                        "where(self >= other) needs the masked scores (removed in 4.31)"));
      v.push_back(entry(d, "finfo_min", "()", "fp32", 4, Term::other,
                        "torch.max(..., torch.tensor(finfo.min)) (MaximumBackward0 saves both)",
                        "a 0-dim tensor of the default dtype (fp32) created in every layer"));
    }
    v.push_back(entry(d, "softmax_f32", "(b,a,s,s)", "fp32", bytes_of({d.b, d.a, d.s, d.s}, 4),
                      Term::as2b, "softmax(dtype=float32) (SoftmaxBackward0 saves its result)",
                      f32 ? "softmax output; in fp32 training .to(fp32) is the same tensor"
                          : "the fp32 probabilities before the cast back"));
    if (!f32)
      v.push_back(entry(d, "probs", "(b,a,s,s)", D, bytes_of({d.b, d.a, d.s, d.s}, w), Term::as2b,
                        "matmul(probs, v) (bmm saves both inputs)",
                        "the probabilities cast back to 16 bits: d v = probs^T · d out"));
    v.push_back(
        entry(d, gqa ? "v_repeated" : "v_copy", "(b·a,s,d)", D,
              eager_kv_view ? kv_bytes : bytes_of({d.b, d.a, d.s, d.d}, w), Term::sbh,
              "matmul(probs, v) (bmm saves both inputs)",
              gqa ? "repeat_kv materialised v at all a heads"
                  : "v.view().transpose(1,2) cannot be viewed as (b·a,s,d): reshape copies"));
    v.push_back(entry(d, "attn_output", "(b,s,a·d)", D, q_bytes, Term::sbh,
                      "o_proj (linear saves its input)",
                      "the attention output's transpose(1,2) is copied before o_proj"));
  }
  rmsnorm(v, d, hf, "post_attention_layernorm", true, "h_mid");
  if (hf.moe) {
    moe_saved(v, d, hf);
    return v;
  }
  v.push_back(entry(d, "post_attention_layernorm.out", "(b,s,h)", D, bytes_of({d.b, d.s, d.h}, w),
                    Term::sbh, "gate_proj, up_proj (linear saves its input; one storage)",
                    "dW_gate, dW_up need it"));
  v.push_back(entry(d, "mlp.gate", "(b,s,i)", D, bytes_of({d.b, d.s, d.i}, w), Term::sbi,
                    "act_fn = SiLU (SiluBackward0 saves its input)", "silu'(gate)"));
  v.push_back(entry(d, "mlp.silu", "(b,s,i)", D, bytes_of({d.b, d.s, d.i}, w), Term::sbi,
                    "silu(gate) * up (MulBackward0 saves both)", "d up = d prod · silu(gate)"));
  v.push_back(entry(d, "mlp.up", "(b,s,i)", D, bytes_of({d.b, d.s, d.i}, w), Term::sbi,
                    "silu(gate) * up (MulBackward0 saves both)", "d silu = d prod · up"));
  v.push_back(entry(d, "mlp.prod", "(b,s,i)", D, bytes_of({d.b, d.s, d.i}, w), Term::sbi,
                    "down_proj (linear saves its input)", "dW_down needs it"));
  return v;
}

// The logits the model returns: fp32 in 4.31-4.35 (`logits = logits.float()`), else the
// training dtype.
std::pair<std::string, std::uint64_t> logits_dtype(const Dims& d, const Hf& hf) {
  if (hf.era == HfEra::v4_31 || hf.era == HfEra::v4_35) return {"fp32", 4};
  return {d.dt, d.w};
}

// The loss's saved tensors (log_softmax's output, nll_loss's target and total_weight).
void loss_saved(std::vector<TensorEntry>& head, const Dims& d, const Hf& hf) {
  if (hf.loop == Loop::none) return;
  const bool v5_model_loss = hf.era == HfEra::v5_25 && hf.loop == Loop::hf_model_loss;
  // 5.25's ForCausalLMLoss: logits.float(), labels padded with -100 by one position, so every
  // row of the logits enters the loss. Otherwise: logits[..., :-1, :].contiguous().
  const auto [ldt, lw] =
      v5_model_loss ? std::pair<std::string, std::uint64_t>{"fp32", 4} : logits_dtype(d, hf);
  const std::uint64_t rows =
      v5_model_loss ? checked_mul(d.b, d.s, "loss rows") : checked_mul(d.b, d.s - 1, "loss rows");
  const std::string whose =
      hf.loop == Loop::hf_model_loss ? "the model's loss" : "the caller's loss";
  head.push_back(entry(d, "loss.log_softmax", v5_model_loss ? "(b·s,V)" : "(b·(s-1),V)", ldt,
                       bytes_of({rows, d.V}, lw), Term::other,
                       "cross_entropy: log_softmax (saves its result), nll_loss (saves self)",
                       whose + (v5_model_loss ? ": on logits.float(), all s positions (the "
                                                "labels are padded)"
                                              : ": on the shifted contiguous logits, in the "
                                                "logits' dtype")));
  if (v5_model_loss) {
    // pad(labels, (0, 1)) is a new (b, s+1) tensor; [..., 1:].contiguous() copies it unless
    // b = 1, where the slice is contiguous and nll_loss keeps the padded tensor itself.
    if (d.b > 1)
      head.push_back(entry(d, "loss.shift_labels", "(b·s)", "int64", bytes_of({d.b, d.s}, 8),
                           Term::sb, "nll_loss (NllLossBackward0 saves target)",
                           "pad(labels)[..., 1:].contiguous() is a copy"));
    else
      head.push_back(entry(d, "loss.padded_labels", "(1,s+1)", "int64", bytes_of({d.s + 1}, 8),
                           Term::other, "nll_loss (NllLossBackward0 saves target)",
                           "b = 1: the shifted slice is a view of pad(labels)"));
  } else if (d.b > 1) {
    // labels[..., 1:].contiguous() copies unless b = 1, where the slice is already contiguous
    // and nll_loss keeps the caller's labels (inputs) instead.
    head.push_back(entry(d, "loss.shift_labels", "(b·(s-1))", "int64",
                         bytes_of({checked_mul(d.b, d.s - 1, "loss rows")}, 8), Term::other,
                         "nll_loss (NllLossBackward0 saves target)",
                         "labels[..., 1:].contiguous() is a copy"));
  }
  head.push_back(entry(d, "loss.total_weight", "()", ldt, lw, Term::other,
                       "nll_loss (NllLossBackward0 saves total_weight)",
                       "0-dim count of non-ignored targets, in the logits' dtype"));
}

// What use_cache=True adds: the past (k, v) the caller holds beyond the saved tensors.
//   4.28-4.35: each layer's present k (after RoPE) and v (the v_proj output) are not the
//     storages bmm saved (its copies) unless matmul could view them (b = 1 or a = 1) and no
//     repeat_kv copied them (GQA).
//   5.25: the DynamicCache's contiguous copies are what matmul then saves instead of its own
//     copies (eager) or what SDPA saves (sdpa): nothing more, except the unrepeated k, v
//     beside the repeat_kv copies under GQA (eager; sdpa in the layers with a window mask),
//     and a sliding-window cache layer's own 0-dim int64 `_sliding_window_tensor` (8 bytes).
std::uint64_t use_cache_extra(const Dims& d, const Hf& hf, const ModelConfig& m) {
  const bool gqa = d.k < d.a;
  const std::uint64_t kv = checked_mul(2, bytes_of({d.b, d.s, d.kd}, d.w), "past_key_values");
  // repeat_kv copies (see layer_saved): not when k = 1 and b = 1 (eager), k = 1 (sdpa).
  const bool eager_copy = gqa && !(d.k == 1 && d.b == 1);
  const bool sdpa_copy = gqa && d.k != 1;
  if (hf.era != HfEra::v5_25)
    return eager_copy || (!gqa && d.b > 1 && d.a > 1) ? checked_mul(d.L, kv, "past_key_values") : 0;
  std::uint64_t total = 0;
  for (std::int64_t l = 0; l < m.layers; ++l) {
    const std::int64_t W = m.window_of(l);
    const bool mask = W > 0 && static_cast<std::uint64_t>(W) <= d.s;
    if (hf.sdpa ? (mask && sdpa_copy) : eager_copy)
      total = checked_add(total, kv, "past_key_values");
    if (W > 0) total = checked_add(total, 8, "past_key_values");
  }
  return total;
}

// The HF class of the model's family.
std::string hf_class(const ModelConfig& m) {
  if (m.family == "mixtral") return "MixtralForCausalLM";
  if (m.family == "qwen2_moe") return "Qwen2MoeForCausalLM";
  if (m.family == "qwen3_moe") return "Qwen3MoeForCausalLM";
  if (m.family == "mistral") return "MistralForCausalLM";
  if (m.family == "qwen2") return "Qwen2ForCausalLM";
  if (m.family == "qwen3") return "Qwen3ForCausalLM";
  return "LlamaForCausalLM";
}

// What the MoE classes were measured with (docs/moe-plan.md): transformers 5.25, eager or SDPA
// attention, bf16 or fp32, every layer's MLP the experts'. The rest exits 2 naming the flag or
// field. Checkpointing keeps each layer's input and replays the layer, as for the dense 5.25
// families (derived there too: use_reentrant=False hides the replay from the measuring hooks).
void check_hf_moe(const Estimate& est) {
  const ModelConfig& m = est.model;
  const TrainConfig& t = est.train;
  const std::string who = std::string(profile_name(est.profile)) + " on " + m.name + " (" +
                          m.family + ", a mixture of experts): ";
  if (est.hf.era && *est.hf.era != HfEra::v5_25)
    throw InputError("--hf-version " + est.hf.hf_version + ": " + who +
                     "the MoE classes were measured with transformers 5.25 only");
  if (t.lora())
    throw InputError("--finetune: " + who + "LoRA of a mixture of experts is not modelled");
  const std::int64_t dense = m.layers - m.moe_layer_count();
  const std::int64_t ckpt = t.checkpointed_count(0, m.layers);
  if (dense > 0 && ckpt > 0 && ckpt < m.layers)
    throw InputError("--checkpointing " + checkpointing_name(t) + ": " + who +
                     "a per-layer policy is not modelled when dense layers (decoder_sparse_step, "
                     "mlp_only_layers: " +
                     std::to_string(dense) + " of " + std::to_string(m.layers) +
                     ") sit among the MoE layers; use none or full");
  if (const std::string why = grouped_mm_problem(m, t.dtype, est.hf); !why.empty())
    throw InputError("--experts-impl grouped_mm: " + who + why);
}

std::string era_label(const Hf& hf, const HfOptions& o) {
  std::string s = "transformers ";
  s += o.hf_version.empty() ? hf_era_name(hf.era) : o.hf_version;
  s += std::string(" (era ") + hf_era_range(hf.era) + ")";
  s += ", PyTorch ";
  s += o.torch_version.empty() ? (hf.torch == TorchEra::before_2_2 ? "2.0" : "2.15")
                               : o.torch_version;
  s += std::string(" (") + torch_era_name(hf.torch) + ")";
  return s;
}

}  // namespace

namespace {

// The step's event sequence (hf_step.hpp) where it models the configuration: its true
// high-water mark, instant by instant, replaces the category maxima; the model states follow the
// precision recipe. Elsewhere the maxima stay, and a recipe other than mixed is refused.
void apply_step_sequence(Estimate& est, bool sdpa) {
  const HfOptions& o = est.hf;
  const Precision recipe = o.recipe(est.train.dtype);
  const std::string why = hf_step_unsupported(est.model, est.train, o);
  if (!why.empty()) {
    if (o.precision && *o.precision != Precision::mixed) throw InputError(why);
    HfOptions at_5_25 = o;
    at_5_25.era = HfEra::v5_25;
    const bool era = hf_step_unsupported(est.model, est.train, at_5_25).empty();
    est.notes.push_back(
        "not modelled: autograd's transient gradients, caching-allocator blocks: workspace is 0 "
        "and peak = params + gradients + optimizer states + activations_peak + inputs (the "
        "category maxima added, an estimate; " +
        (era ? std::string("--hf-version 5.25 gives the step's true peak from its event "
                           "sequence, docs/hf-step.md")
             : "the step's event sequence does not apply: " + why) +
        ")");
    return;
  }
  HfStepOptions so;
  so.sdpa = sdpa;
  so.step = 2;
  const HfStep st = hf_step(est.model, est.train, o, so);
  est.hf_step_peak = true;
  auto& f = est.figures;
  // Each category's own maximum over the step (the workspace's: the temporaries and mixed's
  // master gradients).
  const CategoryBytes most = hf_step_category_maxima(st);
  const CategoryBytes start = hf_step_categories(st.start_by_kind);
  f.params = start[static_cast<int>(Category::params)];
  f.optimizer_states = start[static_cast<int>(Category::optimizer_states)];
  f.gradients = most[static_cast<int>(Category::gradients)];
  if (recipe == Precision::amp) {
    // autocast's dtypes: the saved-tensor tables above are the 16-bit model's
    f.activations = st.activations_at_backward;
    f.activations_peak = most[static_cast<int>(Category::activations)];
  }
  f.workspace = most[static_cast<int>(Category::workspace)];
  f.inputs = start[static_cast<int>(Category::inputs)];
  f.peak = st.peak;
  f.peak_breakdown = hf_step_categories(st.by_kind_at_peak);
  // One instant per phase, its largest; the peak's named by its event.
  const HfStepTensor& at = st.tensors[st.events[st.peak_event].tensor];
  est.instants.clear();
  for (int p = 0; p < kHfStepPhases; ++p) {
    if (!st.phase_seen[p]) continue;
    const std::string phase = hf_step_phase_name(static_cast<HfStepPhase>(p));
    std::string name = phase + " (its largest instant)";
    if (static_cast<HfStepPhase>(p) == st.peak_phase) {
      est.peak_instant = static_cast<int>(est.instants.size());
      name = phase + ": " + at.name + (st.events[st.peak_event].alloc ? " allocated" : " freed");
    }
    est.instants.push_back(Instant{name, hf_step_categories(st.phase_by_kind[p])});
  }
  est.notes.push_back(
      std::string("peak = the step's true high-water mark, from its event sequence (every "
                  "allocation and free of forward, loss, backward, AdamW ") +
      adamw_impl_name(o.adamw_impl) +
      " and zero_grad(set_to_none=True), step 2 of the loop; docs/hf-step.md): in " +
      hf_step_phase_name(st.peak_phase) + ", as " + at.name + " is " +
      (st.events[st.peak_event].alloc ? "allocated" : "freed") +
      "; workspace = the most bytes of temporaries alive at once");
  switch (recipe) {
    case Precision::pure:
      est.notes.push_back(std::string("precision pure: the model in ") +
                          dtype_name(est.train.dtype) +
                          ", AdamW's moments in it too (torch.optim.AdamW on the model's "
                          "parameters; its 4-byte step tensors are host memory)");
      break;
    case Precision::amp:
      est.notes.push_back(std::string("precision amp: an fp32 model under torch.autocast(") +
                          dtype_name(est.train.dtype) +
                          "), as HF's Trainer runs bf16=True/fp16=True: fp32 parameters, "
                          "gradients and moments, autocast's cache of 16-bit weight copies");
      break;
    case Precision::mixed:
      est.notes.push_back(
          "precision mixed" + std::string(o.precision ? "" : " (the default)") +
          ": the 16-bit model with fp32 master weights (counted as optimizer states) and fp32 "
          "AdamW moments, the fp32 master gradients made before the step (DeepSpeed, Megatron); "
          "HF's Trainer with bf16=True is --precision amp, a bf16 model with torch AdamW "
          "--precision pure");
      break;
  }
}

}  // namespace

void build_hf(Estimate& est) {
  Dims d = make_dims(est.model, est.train);
  const TrainConfig& t = est.train;
  if (est.model.moe()) {
    check_hf_moe(est);
    d.i = static_cast<std::uint64_t>(est.model.expert_intermediate);  // sbi: s·b·i_m
  }
  // Any layer checkpointed: HF's gradient checkpointing is on (use_cache off, the checkpoint's
  // shared arguments kept); a per-layer policy checkpoints the layers it lists (issue 30).
  const std::int64_t checkpointed = t.checkpointed_count(0, est.model.layers);
  const bool full = checkpointed > 0;
  const bool sdpa = est.profile == Profile::hf_sdpa;
  HfOptions& o = est.hf;
  const ModelConfig& m = est.model;
  const bool era_defaulted = !o.era;
  if (!o.era) o.era = hf_era_for(est.profile, o, m);
  if (!o.torch) o.torch = *o.era == HfEra::v5_25 ? TorchEra::from_2_2 : TorchEra::before_2_2;
  const Hf hf{*o.era,
              *o.torch,
              sdpa,
              o.loop,
              o.use_cache && !full,
              m.qk_norm,
              m.moe() ? &m : nullptr,
              o.experts_grouped_mm};
  // A MoE model's dense layers (Qwen): the dense list at the dense MLP's width.
  Hf dense_hf = hf;
  dense_hf.moe = nullptr;
  Dims dense_dims = d;
  dense_dims.i = static_cast<std::uint64_t>(m.intermediate);
  auto dense_layer = [&](std::int64_t l) { return m.moe() && !m.is_moe_layer(l); };
  // SDPA layers whose window makes HF pass a mask (s >= window): they keep another list.
  auto window_mask = [&](std::int64_t l) {
    const std::int64_t W = m.window_of(l);
    return sdpa && W > 0 && static_cast<std::uint64_t>(W) <= d.s;
  };
  std::int64_t masked_layers = 0;
  for (std::int64_t l = 0; l < m.layers; ++l) masked_layers += window_mask(l) ? 1 : 0;
  est.label = "HF " + hf_class(m) + ", " + (sdpa ? "SDPA" : "eager") + " attention, " +
              (m.moe() ? std::string("experts ") + (hf.grouped_mm ? "grouped_mm" : "eager") + ", "
                       : std::string()) +
              era_label(hf, o) + ", loop " + loop_name(hf.loop) +
              (hf.use_cache ? " with use_cache" : "") + ": autograd's saved tensors + the loop's";
  auto& acts = est.activations;
  const std::string D = d.dt;
  const std::uint64_t w = d.w;
  const std::uint64_t bsh = bytes_of({d.b, d.s, d.h}, w);

  if (hf.era == HfEra::v5_25) rope_tables(acts.shared, d, hf);
  if (full) {
    // HF per-layer gradient checkpointing: each layer's checkpoint keeps its arguments: the
    // layer input, and the mask and position ids (the same storages for every layer).
    const bool v5 = hf.era == HfEra::v5_25;
    std::vector<TensorEntry> kept;
    kept.push_back(entry(d, "checkpoint.hidden_states", "(b,s,h)", D, bsh, Term::sbh,
                         v5 ? "torch.utils.checkpoint(use_reentrant=False) keeps the "
                              "layer's arguments"
                            : "CheckpointFunction.save_for_backward",
                         "the layer input, replayed through the layer in backward"));
    if (hf.era == HfEra::v4_35)
      acts.shared.push_back(entry(d, "checkpoint.attention_mask", "(b,1,s,s) of (s,s)", D,
                                  bytes_of({d.s, d.s}, w), Term::other,
                                  "CheckpointFunction.save_for_backward (every layer, one storage)",
                                  "4.35 without an attention_mask: the causal (s,s) mask expanded "
                                  "to (b,1,s,s), one (s,s) storage"));
    else if (!v5)
      acts.shared.push_back(
          entry(d, "checkpoint.attention_mask", "(b,1,s,s)", D, bytes_of({d.b, d.s, d.s}, w),
                Term::other, "CheckpointFunction.save_for_backward (every layer, one storage)",
                "the combined causal + padding mask, passed as a tensor argument"));
    acts.shared.push_back(entry(d, "checkpoint.position_ids", "(1,s)", "int64", bytes_of({d.s}, 8),
                                Term::other,
                                v5 ? "torch.utils.checkpoint(use_reentrant=False) keeps the "
                                     "layer's arguments"
                                   : "CheckpointFunction.save_for_backward (every layer, one "
                                     "storage)",
                                "arange(s) built by LlamaModel.forward"));
    // The replayed layer is the last checkpointed one (windowed if any layer is).
    std::int64_t replayed = m.layers - 1;
    while (!t.checkpointed(replayed)) --replayed;
    if (checkpointed < m.layers && masked_layers > 0 && masked_layers < m.layers)
      throw InputError("--checkpointing " + checkpointing_name(t) + ": " +
                       profile_name(est.profile) +
                       " does not model a per-layer policy when only some layers are windowed "
                       "(" +
                       std::to_string(masked_layers) + " of " + std::to_string(m.layers) +
                       "); use none or full");
    split_layers(acts, t, 0, m.layers, layer_saved(d, hf, /*with_input=*/true, masked_layers > 0),
                 std::move(kept),
                 dense_layer(replayed)
                     ? layer_saved(dense_dims, dense_hf, /*with_input=*/false, false)
                     : layer_saved(d, hf, /*with_input=*/false, window_mask(replayed)));
  } else if (m.moe() && m.moe_layer_count() < m.layers) {
    // Qwen's dense layers among the MoE ones: the dense MLP of width `intermediate`.
    acts.layer = layer_saved(d, hf, /*with_input=*/true, false);
    acts.layer_dense = layer_saved(dense_dims, dense_hf, /*with_input=*/true, false);
    acts.dense_layers = m.layers - m.moe_layer_count();
  } else if (masked_layers == 0 || masked_layers == m.layers) {
    acts.layer = layer_saved(d, hf, /*with_input=*/true, masked_layers > 0);
  } else {
    acts.layer = layer_saved(d, hf, /*with_input=*/true, false);
    acts.layer_windowed = layer_saved(d, hf, /*with_input=*/true, true);
    acts.windowed_layers = masked_layers;
  }
  // Head: final norm (its input x_L is the last layer's output), lm_head, the loss.
  rmsnorm(acts.head, d, hf, "norm", true, "x");
  acts.head.push_back(entry(d, "norm.out", "(b,s,h)", D, bsh, Term::sbh,
                            "lm_head (linear saves its input)", "dW_head"));
  loss_saved(acts.head, d, hf);
  if (hf.moe && m.output_router_logits) {
    // load_balancing_loss_func: softmax of every layer's logits in their dtype (no fp32 upcast),
    // and the fp32 tokens per expert; the caller also holds out.router_logits.
    const std::uint64_t TE = bytes_of({d.b, d.s, static_cast<std::uint64_t>(m.experts)}, w);
    acts.head.push_back(
        entry(d, "aux_loss.softmax", "L × (T,E)", D,
              checked_mul(static_cast<std::uint64_t>(m.moe_layer_count()), TE, "aux loss"),
              Term::other, "softmax (SoftmaxBackward0 saves its result)",
              "output_router_logits: every layer's routing probabilities"));
    acts.head.push_back(entry(d, "aux_loss.tokens_per_expert", "(E)", "fp32",
                              bytes_of({static_cast<std::uint64_t>(m.experts)}, 4), Term::other,
                              "the product with router_prob_per_expert (MulBackward0 saves self)",
                              "the fraction of tokens routed to each expert"));
  }
  // The loop: the caller holds the returned output until backward.
  const auto [ldt, lw] = logits_dtype(d, hf);
  acts.loop.push_back(
      entry(d, "loop.logits", "(b,s,V)", ldt, bytes_of({d.b, d.s, d.V}, lw), Term::other,
            hf.loop == Loop::hf_model_loss ? "the caller (out.logits of model(..., labels=...))"
                                           : "the caller (logits = model(input_ids).logits)",
            ldt == "fp32" && w != 4 ? "returned in fp32 (4.31-4.35: logits = logits.float())"
                                    : "returned in the training dtype; not saved by autograd"));
  if (hf.moe && m.output_router_logits)
    acts.loop.push_back(
        entry(d, "loop.router_logits", "L × (T,E)", D,
              checked_mul(static_cast<std::uint64_t>(m.moe_layer_count()),
                          bytes_of({d.b, d.s, static_cast<std::uint64_t>(m.experts)}, w),
                          "router logits"),
              Term::other, "the caller (out.router_logits)", "every layer's router logits"));
  est.use_cache_bytes = full ? 0 : use_cache_extra(d, hf, m);
  if (hf.use_cache && est.use_cache_bytes > 0)
    acts.loop.push_back(entry(d, "loop.past_key_values", "L × 2 × (b,k,s,d)", D,
                              est.use_cache_bytes, Term::other, "the caller (out.past_key_values)",
                              "use_cache=True: every layer's k (after RoPE) and v, where they are "
                              "not the storages autograd saved"));
  const bool labels_saved_as_input = d.b == 1 && hf.loop != Loop::none &&
                                     !(hf.era == HfEra::v5_25 && hf.loop == Loop::hf_model_loss);
  acts.inputs.push_back(entry(d, "input_ids", "(b,s)", "int64", bytes_of({d.b, d.s}, 8), Term::sb,
                              "embedding (EmbeddingBackward0 saves the indices)", "token ids"));
  acts.inputs.push_back(entry(
      d, "labels", "(b,s)", "int64", bytes_of({d.b, d.s}, 8), Term::sb,
      labels_saved_as_input ? "nll_loss (b = 1: the shifted labels are a view)" : "the caller",
      "labels = input_ids"));
  finish(acts, est.model.layers);

  auto& f = est.figures;
  f.activations = acts.total_bytes;
  f.inputs = sum_bytes(acts.inputs);
  f.activations_peak = f.activations;
  if (full) {
    // Backward of layer L-1: the head's saved tensors are released (its nodes ran), the L
    // checkpoints, the shared tensors and the loop's stay, and the layer's forward is replayed.
    const std::uint64_t during =
        csum({csub(f.activations, acts.head_bytes, "hf recompute"), acts.recompute_bytes}, "hf");
    f.activations_peak = std::max(f.activations, during);
  }
  f.workspace = 0;
  f.peak = csum({f.params, f.gradients, f.optimizer_states, f.activations_peak, f.inputs}, "peak");
  f.peak_breakdown = {f.params, f.gradients, f.optimizer_states, f.activations_peak, 0, f.inputs};

  est.notes.push_back(
      "activations = storages autograd saves for backward (each counted once; parameters and "
      "the int64 input_ids, reported as inputs, excluded) + what the loop holds at the end of "
      "forward (group loop: the returned logits; past_key_values with --use-cache)");
  apply_step_sequence(est, sdpa);
  if (hf.loop != Loop::none) {
    const bool v5_model_loss = hf.era == HfEra::v5_25 && hf.loop == Loop::hf_model_loss;
    const std::uint64_t copy = v5_model_loss
                                   ? bytes_of({d.b, d.s, d.V}, 4)
                                   : bytes_of({d.b, d.s - 1, d.V}, logits_dtype(d, hf).second);
    est.notes.push_back(
        std::string("during the loss, ") +
        (v5_model_loss ? "logits.float()" : "the shifted copy logits[..., :-1, :].contiguous()") +
        " (" + format_bytes_human(copy) +
        ") is alive for an instant before it is freed: not in activations");
  }
  if (hf.mean_saves()) {
    const std::uint64_t x_sq = bytes_of({d.b, d.s, d.h}, 4);
    const std::uint64_t norms_kept = full ? 1 : checked_add(checked_mul(2, d.L), 1);
    const std::uint64_t newer = csub(f.activations, checked_mul(norms_kept, x_sq), "torch 2.2");
    est.notes.push_back(
        "with PyTorch >= 2.2 (mean() no longer saves its fp32 input x^2) activations would be " +
        format_bytes_human(newer) + " (" + std::to_string(newer) + " B; --torch-version 2.2)");
  }
  if (!full && !hf.use_cache && est.use_cache_bytes > 0)
    est.notes.push_back(
        "with --use-cache (the config's default use_cache=True, the output kept) "
        "the loop would also hold past_key_values: " +
        format_bytes_human(est.use_cache_bytes));
  if (full && o.use_cache)
    est.notes.push_back("--use-cache ignored: HF turns use_cache off under gradient checkpointing");
  if (d.k < d.a && hf.before_4_31())
    est.notes.push_back(std::string("GQA: transformers ") + hf_era_name(hf.era) +
                        " has none; modelled as 4.31's repeat_kv, which materialises k and v at "
                        "all heads, so the saved k/v do not shrink");
  if (era_defaulted && hf.era == HfEra::v5_25 && !sdpa && m.family != "llama")
    est.notes.push_back("transformers 5.25 (the one era whose " + hf_class(m) +
                        " was measured) used: --hf-version not given");
  if (m.sliding_window > 0)
    est.notes.push_back(
        std::string("sliding window ") + std::to_string(m.sliding_window) +
        (sdpa ? ": in the " + std::to_string(masked_layers) +
                    " windowed layer(s) (s >= window) HF passes a (b,1,s,s) mask, so SDPA "
                    "keeps it (in the training dtype, per layer) and k, v at all a heads (no "
                    "enable_gqa); measured with the CPU kernel. On a GPU a mask selects the "
                    "memory-efficient kernel (logsumexp padded to 32 positions): not measured"
              : ": eager attention computes the full (b,a,s,s) scores and adds the window mask "
                "(built once per forward, not saved): the saved tensors are LLaMA's"));
  if (!sdpa && t.attention == Attention::flash)
    est.notes.push_back("hf-eager is eager attention by definition: --attention flash ignored");
  if (sdpa)
    est.notes.push_back(
        "SDPA: modelled as PyTorch's flash kernel, which a GPU picks for fp16/bf16 with no mask "
        "tensor (transformers passes is_causal=True and no mask when nothing is padded); its "
        "saved tensors were measured with the CPU flash kernel, which saves the same q, k, v, "
        "output and (b,a,s) fp32 logsumexp. A padded batch or fp32 picks the memory-efficient "
        "kernel instead, whose logsumexp is padded to a multiple of 32 positions and which "
        "also keeps the mask: not modelled, and no GPU kernel was run here");
  if (t.checkpointing == Checkpointing::selective)
    est.notes.push_back(
        "checkpointing selective: transformers has no selective recompute (its gradient "
        "checkpointing replays whole layers); the figures are those without checkpointing");
  if (full && checkpointed < m.layers)
    est.notes.push_back("checkpointing " + checkpointing_name(t) +
                        ": transformers checkpoints every layer or none; modelled as only these " +
                        std::to_string(checkpointed) + " of " + std::to_string(m.layers) +
                        " layers wrapped in torch.utils.checkpoint (as torchtitan's per-layer "
                        "activation checkpointing does), the others keeping their saved tensors");
  if (hf.era == HfEra::v4_35 && full)
    est.notes.push_back(
        "4.35 without an attention_mask argument: with one (a tokenizer's batch) "
        "the checkpoints share a (b,1,s,s) mask instead of (s,s)");
  if (full)
    est.notes.push_back(
        hf.era == HfEra::v5_25
            ? "checkpointing: transformers 5.25 calls torch.utils.checkpoint with "
              "use_reentrant=False, whose own hooks hide the layers' tensors from "
              "saved_tensors_hooks: the layer inputs, RoPE tables and position ids are read "
              "from the code, not measured; the eager mask a checkpoint would also keep is not "
              "modelled"
            : "checkpointing: HF per-layer torch.utils.checkpoint (reentrant); activations_peak "
              "adds the replayed layer's saved tensors during its backward (the head's are "
              "released by then)");
}

// ---------------------------------------------------------------- hf-peft
// peft's LoRA on the 5.25 SDPA step (docs/lora-plan.md, sections 2 and 8; docs/formulas.md,
// "hf-peft"). What changes against hf-sdpa, from autograd's rules with frozen base weights:
//   - a frozen linear (16-bit or bitsandbytes 4-bit) saves no input: only the weight would
//     need it (MatMul4Bit keeps (None, packed weight), the weight a parameter);
//   - a frozen norm keeps no `weight * y` operand, only its fp32 x and 1/rms, and nothing at
//     all where its input needs no gradient (layer 0, after the frozen embedding, unless the
//     input is made to require one, as prepare_model_for_kbit_training does for
//     checkpointing);
//   - each LoRA branch, lora_B(lora_A(dropout(x.to(A's dtype)))) · scaling, keeps lora_A's
//     input and lora_B's (b·s, r) input; lora_A's input is x itself (one storage however many
//     adapters read it) when x is already in the adapters' dtype, else a copy per adapter;
//     with dropout, the mask and the dropped copy per adapter instead;
//   - prepare_model_for_kbit_training upcasts every non-4-bit weight to fp32, so the
//     embedding's output, the residual stream and every activation are fp32.
namespace {

// The dtypes of a LoRA step and its recipe.
struct PeftStep {
  std::uint64_t wr;  // the residual stream's and the activations' width
  std::string rdt;
  std::uint64_t wa;  // the adapters' width
  std::string adt;
  std::uint64_t r;
  bool dropout;
  std::uint64_t mask_w;
  std::string mask_dt;
  unsigned targets;
  bool has(unsigned t) const { return (targets & t) != 0; }
};

// One wrapped linear's LoRA branch. `x_grad`: whether x requires a gradient (the dropout keeps
// its mask only then); `shared_saved`: whether x's own storage is already saved (set when this
// branch saves it).
void lora_branch(std::vector<TensorEntry>& v, const Dims& d, const PeftStep& ps,
                 const std::string& proj, std::uint64_t in, const std::string& in_shape,
                 const std::string& input_name, bool x_grad, bool* shared_saved) {
  const Term term = in == d.i && in != d.h ? Term::sbi : Term::sbh;
  const std::uint64_t x_bytes = bytes_of({d.b, d.s, in}, ps.wa);
  if (ps.dropout) {
    if (x_grad)
      v.push_back(entry(d, proj + ".lora_dropout.mask", in_shape, ps.mask_dt,
                        bytes_of({d.b, d.s, in}, ps.mask_w), term,
                        "lora_dropout (the dropout's mask, kept for its backward)",
                        ps.mask_w == 1 ? "CUDA's native_dropout keeps a bool mask"
                                       : "the CPU keeps the mask in the dropped tensor's dtype"));
    v.push_back(entry(d, proj + ".lora_A.input", in_shape, ps.adt, x_bytes, term,
                      "lora_A (linear saves its input)", "the dropped x: dW_A needs it"));
  } else if (ps.wr == ps.wa) {
    if (!*shared_saved)
      v.push_back(entry(d, input_name, in_shape, ps.adt, x_bytes, term,
                        "lora_A of every adapter reading it (linear saves its input; one storage)",
                        "x is already in the adapters' dtype: no copy"));
    *shared_saved = true;
  } else {
    v.push_back(entry(d, proj + ".lora_A.x_copy", in_shape, ps.adt, x_bytes, term,
                      "lora_A (linear saves its input)",
                      "x.to(lora_A.weight.dtype): a copy per adapter"));
  }
  v.push_back(entry(d, proj + ".lora_B.input", "(b·s,r)", ps.adt, bytes_of({d.b, d.s, ps.r}, ps.wa),
                    Term::sb, "lora_B (linear saves its input)", "lora_A's output: dW_B needs it"));
}

// What one decoder layer keeps under LoRA. `in_grad`: the layer's input requires a gradient;
// `with_input`: count the input's storage where its norm saves it (not in a checkpointed
// layer's replay: the checkpoint holds it). *out_grad: whether the layer's output requires a
// gradient; *rope: whether q * cos and k * cos keep RoPE's tables.
std::vector<TensorEntry> peft_layer_saved(const Dims& d, const PeftStep& ps, bool in_grad,
                                          bool with_input, bool* out_grad, bool* rope) {
  std::vector<TensorEntry> v;
  const std::string R = ps.rdt;
  const std::uint64_t w = ps.wr;
  const std::uint64_t bsh4 = bytes_of({d.b, d.s, d.h}, 4);
  auto norm = [&](const std::string& p, bool layer_input) {
    if (w == 4) {
      if (!layer_input || with_input)
        v.push_back(entry(d, p + ".x", "(b,s,h)", "fp32", bsh4, Term::sbh,
                          "pow(2) and x * rsqrt(...) (x.to(float32) is x in fp32)",
                          layer_input ? "the layer's input, the residual stream (one storage)"
                                      : "the residual stream after attention (one storage)"));
    } else {
      v.push_back(entry(d, p + ".x_f32", "(b,s,h)", "fp32", bsh4, Term::sbh,
                        "x.to(float32): pow(2) and x * rsqrt(...) save it (one storage)",
                        "the fp32 upcast of the 16-bit residual"));
    }
    v.push_back(entry(d, p + ".rsqrt", "(b,s,1)", "fp32", bytes_of({d.b, d.s}, 4), Term::sb,
                      "rsqrt (RsqrtBackward0 saves its result), x * rsqrt (MulBackward0)",
                      "1/rms of each row; the frozen weight needs no weight * y operand"));
  };
  if (in_grad) norm("input_layernorm", true);
  bool n1_saved = false;
  const std::uint64_t ad = checked_mul(d.a, d.d, "a·d");
  if (ps.has(kLoraQ))
    lora_branch(v, d, ps, "q_proj", d.h, "(b,s,h)", "input_layernorm.out", in_grad, &n1_saved);
  if (ps.has(kLoraK))
    lora_branch(v, d, ps, "k_proj", d.h, "(b,s,h)", "input_layernorm.out", in_grad, &n1_saved);
  if (ps.has(kLoraV))
    lora_branch(v, d, ps, "v_proj", d.h, "(b,s,h)", "input_layernorm.out", in_grad, &n1_saved);
  const bool qg = in_grad || ps.has(kLoraQ), kg = in_grad || ps.has(kLoraK);
  const bool attn = qg || kg || in_grad || ps.has(kLoraV);
  *rope = qg || kg;
  if (attn) {
    const std::uint64_t q_bytes = bytes_of({d.b, d.s, d.a, d.d}, w);
    const std::uint64_t kv = bytes_of({d.b, d.s, d.kd}, w);
    v.push_back(entry(d, "sdpa.q", "(b,a,s,d)", R, q_bytes, Term::sbh,
                      "scaled_dot_product_attention (flash: saves query)", "RoPE's output"));
    v.push_back(entry(d, "sdpa.k", "(b,k,s,d)", R, kv, Term::sbh,
                      "scaled_dot_product_attention (flash: saves key)",
                      "at the kv heads (enable_gqa)"));
    v.push_back(entry(d, "sdpa.v", "(b,k,s,d)", R, kv, Term::sbh,
                      "scaled_dot_product_attention (flash: saves value)",
                      "a transposed view of v_proj's output"));
    v.push_back(entry(d, "sdpa.out", "(b,a,s,d)", R, q_bytes, Term::sbh,
                      "scaled_dot_product_attention (saves its output)",
                      "also o_proj's input (one storage)"));
    v.push_back(entry(d, "sdpa.logsumexp", "(b,a,s)", "fp32", bytes_of({d.b, d.a, d.s}, 4),
                      Term::sb, "scaled_dot_product_attention (flash: saves logsumexp)",
                      "the softmax is recomputed in backward from it"));
  }
  bool out_saved = attn;  // SDPA's output is o_proj's input
  if (ps.has(kLoraO))
    lora_branch(v, d, ps, "o_proj", ad, "(b,s,a·d)", "sdpa.out", attn, &out_saved);
  const bool h_mid = in_grad || attn || ps.has(kLoraO);
  if (h_mid) norm("post_attention_layernorm", false);
  bool n2_saved = false;
  if (ps.has(kLoraGate))
    lora_branch(v, d, ps, "gate_proj", d.h, "(b,s,h)", "post_attention_layernorm.out", h_mid,
                &n2_saved);
  if (ps.has(kLoraUp))
    lora_branch(v, d, ps, "up_proj", d.h, "(b,s,h)", "post_attention_layernorm.out", h_mid,
                &n2_saved);
  const bool gate_g = h_mid || ps.has(kLoraGate), up_g = h_mid || ps.has(kLoraUp);
  const std::uint64_t bsi = bytes_of({d.b, d.s, d.i}, w);
  if (gate_g)
    v.push_back(entry(d, "mlp.gate", "(b,s,i)", R, bsi, Term::sbi,
                      "act_fn = SiLU (SiluBackward0 saves its input)", "silu'(gate)"));
  if (up_g)
    v.push_back(entry(d, "mlp.silu", "(b,s,i)", R, bsi, Term::sbi,
                      "silu(gate) * up (MulBackward0 saves silu for d up)",
                      "d up = d prod · silu(gate)"));
  if (gate_g)
    v.push_back(entry(d, "mlp.up", "(b,s,i)", R, bsi, Term::sbi,
                      "silu(gate) * up (MulBackward0 saves up for d silu)",
                      "d silu = d prod · up"));
  bool prod_saved = false;  // the frozen down_proj keeps no input
  if (ps.has(kLoraDown))
    lora_branch(v, d, ps, "down_proj", d.i, "(b,s,i)", "mlp.prod", gate_g || up_g, &prod_saved);
  *out_grad = h_mid || gate_g || up_g || ps.has(kLoraDown);
  return v;
}

}  // namespace

void build_hf_peft(Estimate& est) {
  const ModelConfig& m = est.model;
  const TrainConfig& t = est.train;
  HfOptions& o = est.hf;
  const PeftOptions& pf = o.peft;
  o.era = HfEra::v5_25;
  if (!o.torch) o.torch = TorchEra::from_2_2;
  const Dims d = make_dims(m, t);
  const bool quant = pf.finetune == Finetune::qlora && pf.quant != Quant::none;
  const bool fp32_residual = quant && pf.kbit_prepare;
  // Dims of the residual stream: the tables, the loss and the logits follow its dtype.
  Dims dr = d;
  if (fp32_residual) {
    dr.w = 4;
    dr.dt = "fp32";
  }
  PeftStep ps;
  ps.wr = dr.w;
  ps.rdt = dr.dt;
  ps.wa = pf.adapters_are_fp32() ? 4 : d.w;
  ps.adt = pf.adapters_are_fp32() ? "fp32" : d.dt;
  ps.r = static_cast<std::uint64_t>(pf.rank);
  ps.dropout = pf.dropout > 0;
  ps.mask_w = pf.cpu_dropout_mask ? ps.wa : 1;
  ps.mask_dt = pf.cpu_dropout_mask ? ps.adt : "bool";
  ps.targets = pf.targets;
  for (std::int64_t l = 0; l < m.layers; ++l) {
    const std::int64_t W = m.window_of(l);
    if (W > 0 && static_cast<std::uint64_t>(W) <= d.s)
      throw InputError("--seq " + std::to_string(t.seq) + ": hf-peft does not model the window " +
                       "mask SDPA keeps once the sequence reaches sliding_window " +
                       std::to_string(W) + " (layer " + std::to_string(l) +
                       "); use --seq below it, or --profile hf-sdpa for a full fine-tune");
  }
  if (pf.quant == Quant::int8)
    throw InputError(
        "--quant int8: the hf-peft profile does not model bitsandbytes' 8-bit base yet "
        "(MatMul8bitLt keeps each layer's input and the outlier columns of every batch, sizes "
        "that depend on the data, and the CPU takes MatMul8bitFp instead, so a CPU run cannot "
        "prove it); trainmem's own step (--profile native) runs it");
  if (t.optimizer == Optimizer::lomo)
    throw InputError(
        "--optimizer lomo: LOMO updates every weight inside the backward; peft "
        "trains the adapters with a torch optimizer (allowed with --finetune " +
        std::string(finetune_name(pf.finetune)) + ": adamw, sgd)");
  if (t.checkpointing == Checkpointing::selective)
    throw InputError(
        "--checkpointing selective: transformers has no selective recompute; "
        "hf-peft models none or full");
  const std::int64_t checkpointed = t.checkpointed_count(0, m.layers);
  if (checkpointed > 0 && checkpointed < m.layers)
    throw InputError("--checkpointing " + checkpointing_name(t) +
                     ": hf-peft models HF's gradient checkpointing of every layer (none or full)");
  const bool full = checkpointed > 0;
  const Hf hf{HfEra::v5_25, *o.torch, true, o.loop, false, false};

  // Model states. Params: every stored byte (4-bit weights with their quantization state, the
  // other weights in the base's dtype or fp32 after prepare, the adapters, RoPE's buffers).
  const auto specs = parameter_specs(m);
  std::uint64_t params = 0, base_elements = 0;
  for (const auto& p : specs) {
    base_elements = checked_add(base_elements, p.elements, "parameters");
    if (quant && is_layer_linear(p.name))
      params = checked_add(
          params,
          quant4_weight_bytes(p.elements, static_cast<std::uint64_t>(pf.quant_blocksize),
                              pf.double_quant),
          "params");
    else
      params =
          checked_add(params, checked_mul(p.elements, fp32_residual ? 4 : d.w, "params"), "params");
  }
  const std::uint64_t trainable = lora_trainable_count(m, pf.rank, pf.targets);
  const std::uint64_t adapter_bytes = checked_mul(trainable, ps.wa, "adapters");
  const std::uint64_t rope_buffers = checked_mul(4, d.d, "rotary buffers");  // 2 × (d/2) fp32
  auto& f = est.figures;
  f.params = csum({params, adapter_bytes, rope_buffers}, "params");
  f.gradients = adapter_bytes;
  est.param_count = checked_add(base_elements, trainable, "parameters");
  est.trainable_params = trainable;
  // The largest adapter gradient: A (r, in) or B (out, r) of the widest target.
  std::uint64_t widest = 0;
  std::string widest_name;
  const std::uint64_t ad = checked_mul(d.a, d.d, "a·d");
  const struct {
    unsigned bit;
    const char* name;
    std::uint64_t in, out;
  } projections[] = {
      {kLoraQ, "self_attn.q_proj", d.h, ad},   {kLoraK, "self_attn.k_proj", d.h, d.kd},
      {kLoraV, "self_attn.v_proj", d.h, d.kd}, {kLoraO, "self_attn.o_proj", ad, d.h},
      {kLoraGate, "mlp.gate_proj", d.h, d.i},  {kLoraUp, "mlp.up_proj", d.h, d.i},
      {kLoraDown, "mlp.down_proj", d.i, d.h}};
  for (const auto& pr : projections) {
    if (!ps.has(pr.bit)) continue;
    const bool a_wider = pr.in >= pr.out;
    const std::uint64_t n = checked_mul(ps.r, a_wider ? pr.in : pr.out, "adapter");
    if (n > widest) {
      widest = n;
      widest_name = "model.layers." + std::to_string(m.layers - 1) + "." + pr.name +
                    (a_wider ? ".lora_A.default.weight" : ".lora_B.default.weight");
    }
  }
  est.largest_gradient_bytes = checked_mul(widest, ps.wa, "adapter gradient");
  est.largest_gradient_name = widest_name;
  // Optimizer states: torch's AdamW keeps m and v in the adapters' dtype; SGD nothing.
  // bitsandbytes' (Optimizer2State.init_state, 0.50): a tensor of n >= min_8bit_size (4,096)
  // elements keeps uint8 state1/state2 (n bytes each) and fp32 absmax1/absmax2 over 256-element
  // blocks; a smaller one, or any under the 32-bit PagedAdamW, fp32 state1/state2 (4n each);
  // the two 256-entry fp32 quantile maps (dynamic, udynamic) are one pair shared by every 8-bit
  // tensor. A paged optimizer takes state1/state2 of a tensor of n >= 1e5 elements from CUDA
  // managed memory (get_state_buffer), the rest as ordinary tensors.
  // bitsandbytes' optimizers are TrainConfig optimizers (the native step runs them too); a
  // PeftOptions::optimizer, when set, must be the same one.
  const BnbOptimizer bo = t.optimizer == Optimizer::adamw8bit     ? BnbOptimizer::adamw8bit
                          : t.optimizer == Optimizer::paged_adamw ? BnbOptimizer::paged_adamw
                          : t.optimizer == Optimizer::paged_adamw8bit
                              ? BnbOptimizer::paged_adamw8bit
                              : pf.optimizer;
  if (pf.optimizer != BnbOptimizer::none &&
      (pf.optimizer != bo || !(t.optimizer == Optimizer::adamw || bnb_optimizer(t.optimizer))))
    throw InputError(
        std::string("--optimizer ") + bnb_optimizer_name(pf.optimizer) +
        ": a bitsandbytes optimizer replaces torch's AdamW; the torch optimizer beside it "
        "must be adamw (not sgd or lomo)");
  if (bo == BnbOptimizer::none) {
    f.optimizer_states =
        t.optimizer == Optimizer::adamw ? checked_mul(2, adapter_bytes, "optimizer states") : 0;
  } else {
    const bool bits8 = bo != BnbOptimizer::paged_adamw;
    const std::uint64_t block = pf.bnb_era == BnbEra::v0_43 ? 2048 : 256;  // absmax block
    const bool paged = bo != BnbOptimizer::adamw8bit;
    std::uint64_t device = 0, managed = 0;
    bool any8 = false;
    const std::uint64_t layers = static_cast<std::uint64_t>(m.layers);
    // One adapter tensor of n elements in every layer.
    auto add_tensor = [&](std::uint64_t n) {
      bnb_state_bytes(bits8, paged, block, n, layers, device, managed, any8);
    };
    for (const auto& pr : projections) {
      if (!ps.has(pr.bit)) continue;
      add_tensor(checked_mul(ps.r, pr.in, "adapter"));   // lora_A (r, in)
      add_tensor(checked_mul(ps.r, pr.out, "adapter"));  // lora_B (out, r)
    }
    if (any8) device = checked_add(device, 2 * 256 * 4, "optimizer states");
    f.optimizer_states = device;
    est.optimizer_states_managed = managed;
  }

  est.label = "HF " + hf_class(m) + " + peft LoRA r " + std::to_string(pf.rank) + " on " +
              lora_targets_name(pf.targets) +
              (quant ? std::string(", bitsandbytes ") + quant_name(pf.quant) +
                           (pf.double_quant ? " + double quant" : "") + " base" +
                           (pf.kbit_prepare ? ", prepare_model_for_kbit_training" : "")
                     : ", " + d.dt + " base") +
              ", SDPA attention, transformers 5.25 / peft " + peft_era_measured(pf.peft_era) +
              " / bitsandbytes 0.50, loop " + loop_name(hf.loop) +
              ": autograd's saved tensors + the loop's";

  auto& acts = est.activations;
  // Under checkpointing every layer's input is made to require a gradient
  // (enable_input_require_grads; without it reentrant checkpointing gives the adapters no
  // gradient); otherwise layer 0's input, the frozen embedding's output, needs none.
  bool rope = false;
  bool grad = full;
  std::vector<TensorEntry> first, rest;
  for (std::int64_t l = 0; l < std::min<std::int64_t>(m.layers, 2); ++l) {
    bool out_grad = false, r = false;
    auto list = peft_layer_saved(d, ps, grad, true, &out_grad, &r);
    rope = rope || r;
    (l == 0 ? first : rest) = std::move(list);
    grad = out_grad;
  }
  // From layer 1 on the list repeats (a layer's output needs a gradient whenever its input
  // does or an adapter is in it).
  const bool first_differs = m.layers > 1 && sum_bytes(first) != sum_bytes(rest);
  if (full) {
    bool og = false, r2 = false;
    std::vector<TensorEntry> kept;
    kept.push_back(entry(dr, "checkpoint.hidden_states", "(b,s,h)", dr.dt,
                         bytes_of({d.b, d.s, d.h}, dr.w), Term::sbh,
                         "torch.utils.checkpoint keeps the layer's input",
                         "the layer input, replayed through the layer in backward"));
    split_layers(acts, t, 0, m.layers, first, std::move(kept),
                 peft_layer_saved(d, ps, true, false, &og, &r2));
    acts.shared.push_back(entry(d, "checkpoint.position_ids", "(1,s)", "int64", bytes_of({d.s}, 8),
                                Term::other,
                                "the checkpoints' closures (one storage; not a saved tensor)",
                                "arange(s) built by LlamaModel.forward"));
  } else if (first_differs) {
    acts.first_layer = std::move(first);
    acts.layer = std::move(rest);
  } else {
    acts.layer = std::move(first);
  }
  if (rope || full) rope_tables(acts.shared, dr, hf);
  // Head: the final norm (its input needs a gradient: an adapter is in some layer), the frozen
  // lm_head keeps nothing, the loss.
  acts.head.push_back(entry(d, dr.w == 4 ? "norm.x" : "norm.x_f32", "(b,s,h)", "fp32",
                            bytes_of({d.b, d.s, d.h}, 4), Term::sbh,
                            "pow(2) and x * rsqrt(...) (one storage)",
                            dr.w == 4 ? "the last layer's output" : "the fp32 upcast of it"));
  acts.head.push_back(entry(d, "norm.rsqrt", "(b,s,1)", "fp32", bytes_of({d.b, d.s}, 4), Term::sb,
                            "rsqrt (RsqrtBackward0 saves its result), x * rsqrt (MulBackward0)",
                            "1/rms of each row"));
  loss_saved(acts.head, dr, hf);
  acts.loop.push_back(entry(dr, "loop.logits", "(b,s,V)", dr.dt, bytes_of({d.b, d.s, d.V}, dr.w),
                            Term::other, "the caller (out.logits of model(..., labels=...))",
                            fp32_residual ? "in fp32: prepare upcast lm_head"
                                          : "in the base's dtype; not saved by autograd"));
  acts.inputs.push_back(entry(d, "input_ids", "(b,s)", "int64", bytes_of({d.b, d.s}, 8), Term::sb,
                              "the caller (the frozen embedding saves no indices)", "token ids"));
  acts.inputs.push_back(entry(d, "labels", "(b,s)", "int64", bytes_of({d.b, d.s}, 8), Term::sb,
                              "the caller", "labels = input_ids"));
  finish(acts, m.layers);

  f.activations = acts.total_bytes;
  f.inputs = sum_bytes(acts.inputs);
  f.activations_peak = f.activations;
  if (full) {
    const std::uint64_t during =
        csum({csub(f.activations, acts.head_bytes, "hf-peft recompute"), acts.recompute_bytes},
             "hf-peft");
    f.activations_peak = std::max(f.activations, during);
  }
  f.workspace = 0;
  f.peak = csum({f.params, f.gradients, f.optimizer_states, f.activations_peak, f.inputs}, "peak");
  f.peak_breakdown = {f.params, f.gradients, f.optimizer_states, f.activations_peak, 0, f.inputs};

  est.notes.push_back(
      "params = every stored byte of the model: the frozen base (" +
      std::string(quant ? "4-bit linear weights with their absmax, nested absmax, offset and "
                          "codes; the other weights "
                        : "") +
      (fp32_residual ? "upcast to fp32 by prepare_model_for_kbit_training" : d.dt) +
      "), the adapters (" + ps.adt + ") and RoPE's inv_freq buffers; trainable = " +
      std::to_string(trainable) + " adapter elements (r·(in + out) per target)");
  if (bo == BnbOptimizer::none)
    est.notes.push_back(
        std::string("gradients and optimizer states: the adapters' only (") +
        (t.optimizer == Optimizer::adamw ? "AdamW m and v in the adapters' dtype" : "SGD: none") +
        "); torch's AdamW keeps each parameter's `step` as a 4-byte tensor on the host "
        "(not counted)");
  else
    est.notes.push_back(
        std::string("gradients and optimizer states: the adapters' only; bitsandbytes ") +
        (bo == BnbOptimizer::adamw8bit     ? "AdamW8bit"
         : bo == BnbOptimizer::paged_adamw ? "PagedAdamW"
                                           : "PagedAdamW8bit") +
        (bo == BnbOptimizer::paged_adamw
             ? ": fp32 m and v"
             : std::string(": uint8 m and v with an fp32 absmax per ") +
                   (pf.bnb_era == BnbEra::v0_43 ? "2,048 elements (bitsandbytes 0.43)"
                                                : "256 elements") +
                   " for tensors of 4,096 elements or more, fp32 m and v below that, two "
                   "shared 256-entry quantile maps") +
        (bo == BnbOptimizer::adamw8bit
             ? std::string()
             : "; m and v of tensors of 100,000 elements or more in CUDA managed memory "
               "(optimizer_states_managed, " +
                   std::to_string(est.optimizer_states_managed) +
                   " B: outside PyTorch's allocator and the peak; migrated to the GPU when "
                   "the step touches them, evicted under memory pressure)"));
  est.notes.push_back(
      "activations = storages autograd saves for backward (each counted once) + the returned "
      "logits; transients (bitsandbytes' dequantized weight in every forward and backward of a "
      "4-bit linear, autograd's gradients) are not modelled: peak = the category maxima added");
  if (first_differs)
    est.notes.push_back(
        "layer 0 keeps less: its input (the frozen embedding's output) needs no gradient, so "
        "its first norm saves nothing");
  if (pf.peft_era == PeftEra::v0_10)
    est.notes.push_back(std::string("peft 0.10-0.11 (--peft-version): the adapters take the base "
                                    "weight's dtype (") +
                        ps.adt + "), with no autocast_adapter_dtype to upcast them");
  else if (pf.peft_era == PeftEra::v0_12 && quant && !pf.adapters_fp32)
    est.notes.push_back(
        "peft 0.12-0.18 (--peft-version): --lora-dtype model (autocast_adapter_dtype=False) "
        "leaves a 4-bit base's adapters in fp32 (peft issue #2889, fixed in 0.19)");
  if (ps.dropout)
    est.notes.push_back(
        std::string("lora_dropout > 0: each adapter keeps the dropout's mask (") +
        (ps.mask_w == 1 ? "a bool on CUDA" : "in the dropped dtype, as on the CPU") +
        ") and its dropped input instead of sharing x");
  if (full)
    est.notes.push_back(
        "checkpointing: every layer in torch.utils.checkpoint, its input made to require a "
        "gradient (prepare_model_for_kbit_training / enable_input_require_grads); "
        "activations_peak adds the replayed layer's saved tensors during its backward");
  if (m.family != "llama")
    est.notes.push_back(hf_class(m) +
                        ": derived from LLaMA's measurement under peft and the family's hf-sdpa "
                        "measurement (its frozen biases keep nothing), not measured under peft");
}

}  // namespace trainmem::analytic_detail

namespace trainmem {

std::string grouped_mm_problem(const ModelConfig& model, DType dtype, const HfOptions& opts) {
  if (!model.moe() || !opts.experts_grouped_mm) return "";
  const std::uint64_t row =
      static_cast<std::uint64_t>(model.expert_intermediate) * dtype_size(dtype);
  if (row % 16 == 0) return "";
  return "torch._grouped_mm needs rows of a multiple of 16 bytes and the experts' rows are " +
         std::to_string(row) + " (moe_intermediate_size " +
         std::to_string(model.expert_intermediate) +
         "): transformers raises there; use --experts-impl eager";
}

}  // namespace trainmem
