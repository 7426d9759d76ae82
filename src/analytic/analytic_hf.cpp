// The `hf-eager` profile: the tensors PyTorch autograd saves for a HuggingFace
// LlamaForCausalLM training step with eager attention, as mid-2023 papers ran it:
// transformers 4.30 (modeling_llama.py), PyTorch 2.0 autograd, 16-bit weights, 16-bit logits,
// the loss on shifted contiguous logits, use_cache off. Derived op by op below; proven by
// tools/hf_saved_tensors.py (saved_tensors_hooks, each storage counted once) whose output is
// tests/data/hf_eager_golden.json.
//
// Rules of autograd that decide what is saved (PyTorch 2.0, also 1.13):
//   - a x b (MulBackward0) saves b when a needs a gradient and a when b does;
//   - x.pow(2) saves x; x.mean(dim) saves x (before PyTorch 2.2; later versions keep only the
//     sizes); rsqrt saves its result; softmax and log_softmax save their result;
//     silu saves its input; maximum saves both inputs; bmm saves both inputs;
//     linear saves its input (and the weight, a parameter: not counted);
//   - .to(dtype), +, views, cat, neg save no tensor; tensor / python_number saves the number as
//     a 0-dim fp64 CPU tensor (host memory even in a GPU run: not counted);
//   - .to(dtype) to the tensor's own dtype returns the same tensor (no new storage): in fp32
//     training the fp32 upcasts of RMSNorm and softmax disappear;
//   - reshape of a non-viewable tensor copies it; the copy is what bmm saves.
// GQA: transformers 4.30 has none. For kv_heads < heads we follow 4.31's repeat_kv (expand +
// reshape, which materialises k and v at all `a` heads): the saved k and v do NOT shrink.
#include <algorithm>

#include "analytic_detail.hpp"

namespace trainmem::analytic_detail {
namespace {

// The saved tensors of one LlamaRMSNorm (4.30):
//   variance = x.to(f32).pow(2).mean(-1, keepdim=True)
//   y = x * rsqrt(variance + eps)       (16-bit x times fp32 (b,s,1) -> fp32)
//   return (weight * y).to(x.dtype)
void rmsnorm(std::vector<TensorEntry>& v, const Dims& d, const std::string& p, bool with_input,
             const std::string& input_name) {
  const bool f32 = d.w == 4;
  if (with_input)
    v.push_back(entry(d, p + "." + input_name, "(b,s,h)", d.dt, bytes_of({d.b, d.s, d.h}, d.w),
                      Term::sbh, "x * rsqrt(...) (MulBackward0 saves x)",
                      "d rsqrt needs x; also the residual stream (one storage)"));
  if (!f32)
    v.push_back(entry(d, p + ".x_f32", "(b,s,h)", "fp32", bytes_of({d.b, d.s, d.h}, 4), Term::sbh,
                      "x.to(float32).pow(2) (PowBackward0 saves its input)",
                      "fp32 upcast of x for the variance"));
  v.push_back(entry(d, p + ".x_squared_f32", "(b,s,h)", "fp32", bytes_of({d.b, d.s, d.h}, 4),
                    Term::sbh,
                    ".mean(-1, keepdim=True) (MeanBackward1 saves its input before "
                    "PyTorch 2.2)",
                    "x_f32.pow(2): the one fp32 tensor PyTorch >= 2.2 no longer keeps"));
  v.push_back(entry(d, p + ".rsqrt", "(b,s,1)", "fp32", bytes_of({d.b, d.s}, 4), Term::sb,
                    "rsqrt (RsqrtBackward0 saves its result), x * rsqrt (MulBackward0)",
                    "1/rms of each row"));
  v.push_back(entry(d, p + ".x_normed_f32", "(b,s,h)", "fp32", bytes_of({d.b, d.s, d.h}, 4),
                    Term::sbh, "weight * y (MulBackward0 saves y for d weight)",
                    "16-bit x times an fp32 (b,s,1) tensor promotes to fp32"));
}

// One decoder layer's saved tensors, in the order autograd saves them. `with_input` adds the
// layer input (saved by input_layernorm); checkpointing keeps it separately.
std::vector<TensorEntry> layer_saved(const Dims& d, bool with_input) {
  const std::string D = d.dt;
  const std::uint64_t w = d.w;
  const bool f32 = w == 4;
  std::vector<TensorEntry> v;
  rmsnorm(v, d, "input_layernorm", with_input, "x");
  v.push_back(entry(d, "input_layernorm.out", "(b,s,h)", D, bytes_of({d.b, d.s, d.h}, w), Term::sbh,
                    "q_proj, k_proj, v_proj (linear saves its input; one storage)",
                    "dW_q, dW_k, dW_v need the normalised input"));
  v.push_back(entry(d, "rope.cos", "(1,1,s,d)", D, bytes_of({d.s, d.d}, w), Term::other,
                    "q * cos, k * cos (MulBackward0 saves cos)",
                    "cos[position_ids] is a fresh tensor in every layer (4.30)"));
  v.push_back(entry(d, "rope.sin", "(1,1,s,d)", D, bytes_of({d.s, d.d}, w), Term::other,
                    "rotate_half(q) * sin, rotate_half(k) * sin", "as cos"));
  v.push_back(entry(d, "q_embed_copy", "(b·a,s,d)", D, bytes_of({d.b, d.a, d.s, d.d}, w), Term::sbh,
                    "matmul(q, k^T) (bmm saves both inputs)",
                    "d k = d scores^T · q; RoPE's elementwise ops keep q's (b,s,a,d) layout, so "
                    "matmul's reshape to (b·a,s,d) copies it"));
  const bool gqa = d.k < d.a;
  v.push_back(entry(d, gqa ? "k_embed_repeated" : "k_embed_copy", "(b·a,d,s)", D,
                    bytes_of({d.b, d.a, d.s, d.d}, w), Term::sbh,
                    "matmul(q, k^T) (bmm saves both inputs)",
                    gqa ? "d q = d scores · k; repeat_kv materialised k at all a heads (4.31)"
                        : "d q = d scores · k; k^T cannot be viewed as (b·a,d,s): copied"));
  v.push_back(entry(d, "scores_masked", "(b,a,s,s)", D, bytes_of({d.b, d.a, d.s, d.s}, w),
                    Term::as2b, "torch.max(scores + mask, finfo.min) (MaximumBackward0 saves both)",
                    "where(self >= other) needs the masked scores"));
  v.push_back(entry(d, "finfo_min", "()", "fp32", 4, Term::other,
                    "torch.max(..., torch.tensor(finfo.min)) (MaximumBackward0 saves both)",
                    "a 0-dim fp32 tensor created in every layer (default dtype fp32)"));
  v.push_back(entry(d, "softmax_f32", "(b,a,s,s)", "fp32", bytes_of({d.b, d.a, d.s, d.s}, 4),
                    Term::as2b, "softmax(dtype=float32) (SoftmaxBackward0 saves its result)",
                    f32 ? "softmax output; in fp32 training .to(fp32) is the same tensor"
                        : "the fp32 probabilities before the cast back"));
  if (!f32)
    v.push_back(entry(d, "probs", "(b,a,s,s)", D, bytes_of({d.b, d.a, d.s, d.s}, w), Term::as2b,
                      "matmul(probs, v) (bmm saves both inputs)",
                      "the probabilities cast back to 16 bits: d v = probs^T · d out"));
  v.push_back(entry(d, gqa ? "v_repeated" : "v_copy", "(b·a,s,d)", D,
                    bytes_of({d.b, d.a, d.s, d.d}, w), Term::sbh,
                    "matmul(probs, v) (bmm saves both inputs)",
                    gqa ? "repeat_kv materialised v at all a heads (4.31)"
                        : "v.view().transpose(1,2) cannot be viewed as (b·a,s,d): reshape copies"));
  v.push_back(entry(d, "attn_output", "(b,s,h)", D, bytes_of({d.b, d.s, d.h}, w), Term::sbh,
                    "o_proj (linear saves its input)",
                    "transpose(1,2).reshape(b,s,h) copies the attention output"));
  rmsnorm(v, d, "post_attention_layernorm", true, "h_mid");
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

}  // namespace

void build_hf_eager(Estimate& est) {
  const Dims d = make_dims(est.model, est.train);
  const TrainConfig& t = est.train;
  const bool full = t.checkpointing == Checkpointing::full;
  est.label = "HF LlamaForCausalLM + PyTorch autograd saved tensors (transformers 4.30, eager)";
  auto& acts = est.activations;
  const std::string D = d.dt;
  const std::uint64_t w = d.w;
  const std::uint64_t bsh = bytes_of({d.b, d.s, d.h}, w);

  if (full) {
    // HF per-layer gradient checkpointing (torch.utils.checkpoint, reentrant): each layer's
    // CheckpointFunction saves its tensor arguments: hidden_states, attention_mask and
    // position_ids (the last two are the same storages for every layer: counted once).
    acts.layer.push_back(entry(d, "checkpoint.hidden_states", "(b,s,h)", D, bsh, Term::sbh,
                               "CheckpointFunction.save_for_backward",
                               "the layer input, replayed through the layer in backward"));
    acts.shared.push_back(entry(d, "checkpoint.attention_mask", "(b,1,s,s)", D,
                                bytes_of({d.b, d.s, d.s}, w), Term::other,
                                "CheckpointFunction.save_for_backward (every layer, one storage)",
                                "the combined causal + padding mask, passed as a tensor argument"));
    acts.shared.push_back(entry(d, "checkpoint.position_ids", "(1,s)", "int64", bytes_of({d.s}, 8),
                                Term::other,
                                "CheckpointFunction.save_for_backward (every layer, one storage)",
                                "arange(s) built by LlamaModel.forward"));
    acts.recompute = layer_saved(d, /*with_input=*/false);
  } else {
    acts.layer = layer_saved(d, /*with_input=*/true);
  }
  // Head: final norm (its input x_L is the last layer's output), lm_head, shifted loss.
  rmsnorm(acts.head, d, "norm", true, "x");
  acts.head.push_back(entry(d, "norm.out", "(b,s,h)", D, bsh, Term::sbh,
                            "lm_head (linear saves its input)", "dW_head"));
  const std::uint64_t rows = checked_mul(d.b, d.s - 1, "loss rows");
  // labels[..., 1:].contiguous() copies unless b = 1, where the slice is already contiguous
  // and nll_loss keeps the caller's labels (inputs) instead.
  const bool labels_copied = d.b > 1;
  acts.head.push_back(entry(d, "log_softmax", "(b·(s-1),V)", D, bytes_of({rows, d.V}, w),
                            Term::other,
                            "cross_entropy: log_softmax (saves its result), nll_loss (saves self)",
                            "on logits[..., :-1, :].contiguous() in the training dtype (4.30 "
                            "does not upcast logits)"));
  if (labels_copied)
    acts.head.push_back(entry(d, "shift_labels", "(b·(s-1))", "int64", bytes_of({rows}, 8),
                              Term::other, "nll_loss (NllLossBackward0 saves target)",
                              "labels[..., 1:].contiguous() is a copy"));
  acts.head.push_back(entry(d, "nll_total_weight", "()", D, w, Term::other,
                            "nll_loss (NllLossBackward0 saves total_weight)",
                            "0-dim count of non-ignored targets"));
  acts.inputs.push_back(entry(d, "input_ids", "(b,s)", "int64", bytes_of({d.b, d.s}, 8), Term::sb,
                              "embedding (EmbeddingBackward0 saves the indices)", "token ids"));
  acts.inputs.push_back(
      entry(d, "labels", "(b,s)", "int64", bytes_of({d.b, d.s}, 8), Term::sb,
            labels_copied ? "the caller" : "nll_loss (b = 1: the shifted labels are a view)",
            "labels = input_ids"));
  finish(acts, est.model.layers);

  // A caller that keeps the returned output with use_cache=True (4.30's default config) also
  // holds the logits and every layer's present (k, v): k after RoPE and the v projection. They
  // are not the storages bmm saved unless matmul could view them (b = 1 or a = 1, without
  // GQA's repeat_kv copies). HF checkpointing turns use_cache off: the logits only.
  est.caller_held_bytes = bytes_of({d.b, d.s, d.V}, w);
  if (!full && (d.k < d.a || (d.b > 1 && d.a > 1)))
    est.caller_held_bytes =
        csum({est.caller_held_bytes, checked_mul(2 * d.L, bytes_of({d.b, d.s, d.kd}, w))});

  auto& f = est.figures;
  f.activations = acts.total_bytes;
  f.inputs = sum_bytes(acts.inputs);
  f.activations_peak = f.activations;
  if (full) {
    // Backward of layer L-1: the head's saved tensors are released (its nodes ran), the L
    // checkpoints and the mask stay, and the layer's forward is replayed with grad enabled.
    const std::uint64_t during =
        csum({csub(f.activations, acts.head_bytes, "hf recompute"), acts.recompute_bytes}, "hf");
    f.activations_peak = std::max(f.activations, during);
  }
  f.workspace = 0;
  f.peak = csum({f.params, f.gradients, f.optimizer_states, f.activations_peak, f.inputs}, "peak");
  f.peak_breakdown = {f.params, f.gradients, f.optimizer_states, f.activations_peak, 0, f.inputs};
  est.notes.push_back(
      "activations = storages autograd saves for backward (each counted once), excluding "
      "parameters and the int64 input_ids (reported as inputs)");
  est.notes.push_back(
      "not modelled: autograd's transient gradients, caching-allocator blocks, the logits a "
      "caller keeps through the returned output: workspace is 0 and peak = params + gradients "
      "+ optimizer states + activations_peak + inputs (the category maxima added, an estimate)");
  {
    // PyTorch >= 2.2: mean() keeps only sizes, one fp32 (b,s,h) tensor less per RMSNorm kept.
    const std::uint64_t x_sq = bytes_of({d.b, d.s, d.h}, 4);
    const std::uint64_t norms_kept = full ? 1 : checked_add(checked_mul(2, d.L), 1);
    const std::uint64_t newer = csub(f.activations, checked_mul(norms_kept, x_sq), "torch 2.2");
    est.notes.push_back(
        "with PyTorch >= 2.2 (mean() no longer saves its fp32 input x^2) "
        "activations would be " +
        format_bytes_human(newer) + " (" + std::to_string(newer) + " B)");
  }
  if (d.k < d.a)
    est.notes.push_back(
        "GQA: transformers 4.30 has none; modelled as 4.31's repeat_kv, which materialises k and "
        "v at all heads, so the saved k/v do not shrink");
  if (t.attention == Attention::flash)
    est.notes.push_back("hf-eager is eager attention by definition: --attention flash ignored");
  if (full)
    est.notes.push_back(
        "checkpointing: HF per-layer torch.utils.checkpoint; activations_peak adds the replayed "
        "layer's saved tensors during its backward (the head's are released by then)");
}

}  // namespace trainmem::analytic_detail
