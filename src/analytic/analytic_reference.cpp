// The GPT-style reference profiles: `megatron` (Korthikanti et al. 2022, "Reducing Activation
// Recomputation in Large Transformer Models", section 4.1: sbh(34 + 5as/h) bytes per layer for
// 16-bit activations with 1-byte dropout masks) and `zero` (Rajbhandari et al. 2020, section
// 3.2: about 12 × hidden × batch × seq elements per layer). Both describe a GPT layer
// (LayerNorm, 4h GeLU MLP, dropout); they ignore the model's intermediate width, fp32 upcasts
// and the head. We apply them per layer as published, with no embedding or head term.
#include "analytic_detail.hpp"

namespace trainmem::analytic_detail {
namespace {

// Shared tail: figures of a reference profile whose layer list and recompute list are filled.
void reference_figures(Estimate& est, const Dims& d) {
  auto& acts = est.activations;
  // Inputs as trainmem's own step keeps them (int32 tokens and targets).
  acts.inputs.push_back(entry(d, "tokens", "(b,s)", "int32", bytes_of({d.b, d.s}, 4), Term::sb,
                              "embedding", "token ids"));
  acts.inputs.push_back(
      entry(d, "targets", "(b,s)", "int32", bytes_of({d.b, d.s}, 4), Term::sb, "loss", "labels"));
  finish(acts, est.model.layers);
  auto& f = est.figures;
  f.activations = acts.total_bytes;
  f.inputs = sum_bytes(acts.inputs);
  // With full recomputation one layer's whole set exists again during its backward.
  f.activations_peak = csum({f.activations, acts.recompute_bytes}, "activations peak");
  f.workspace = 0;
  f.peak = csum({f.params, f.gradients, f.optimizer_states, f.activations_peak, f.inputs}, "peak");
  f.peak_breakdown = {f.params, f.gradients, f.optimizer_states, f.activations_peak, 0, f.inputs};
  est.notes.push_back(
      "GPT-style reference formula (LayerNorm, 4h GeLU MLP, dropout): the model's intermediate "
      "width, fp32 upcasts, embedding and head (logits) are not in it");
  est.notes.push_back(
      "workspace is not modelled (0); peak = params + gradients + optimizer states + "
      "activations_peak + inputs (the category maxima added)");
  if (!est.activations.recompute.empty() && est.train.checkpointing == Checkpointing::full)
    est.notes.push_back(
        "checkpointing " + checkpointing_name(est.train) +
        ": each checkpointed layer keeps its input (one (s,b,h) tensor); activations_peak adds "
        "one layer's full set, recomputed during its backward");
}

}  // namespace

void build_megatron(Estimate& est) {
  const Dims d = make_dims(est.model, est.train);
  const std::string D = d.dt;
  const std::uint64_t w = d.w;
  est.label = "GPT-style reference: Korthikanti et al. 2022, sbh(34 + 5as/h) per layer";
  const std::uint64_t sbh = bytes_of({d.s, d.b, d.h}, w);
  const std::uint64_t sbh4 = bytes_of({d.s, d.b, d.h, 4}, w);
  const std::uint64_t mask = bytes_of({d.s, d.b, d.h}, 1);
  const std::uint64_t as2b = bytes_of({d.a, d.s, d.s, d.b}, w);
  std::vector<TensorEntry> v;
  // Attention block: 11sbh + 5as²b in 16 bits.
  v.push_back(entry(d, "attn.qkv_input", "(s,b,h)", D, sbh, Term::sbh, "QKV GEMM", "dW_qkv"));
  v.push_back(entry(d, "attn.q", "(s,b,h)", D, sbh, Term::sbh, "QK^T", "d k"));
  v.push_back(entry(d, "attn.k", "(s,b,h)", D, sbh, Term::sbh, "QK^T", "d q"));
  v.push_back(entry(d, "attn.softmax_out", "(a,s,s,b)", D, as2b, Term::as2b, "softmax",
                    "softmax backward needs its output"));
  v.push_back(entry(d, "attn.softmax_dropout_mask", "(a,s,s,b)", "int8",
                    bytes_of({d.a, d.s, d.s, d.b}, 1), Term::as2b, "dropout", "1-byte mask"));
  v.push_back(entry(d, "attn.dropout_out", "(a,s,s,b)", D, as2b, Term::as2b, "attention over V",
                    "d v = probs^T · d out"));
  v.push_back(entry(d, "attn.v", "(s,b,h)", D, sbh, Term::sbh, "attention over V", "d probs"));
  v.push_back(
      entry(d, "attn.proj_input", "(s,b,h)", D, sbh, Term::sbh, "output projection", "dW_o"));
  v.push_back(
      entry(d, "attn.dropout_mask", "(s,b,h)", "int8", mask, Term::sbh, "dropout", "1-byte mask"));
  // MLP block: 19sbh.
  v.push_back(entry(d, "mlp.fc1_input", "(s,b,h)", D, sbh, Term::sbh, "first linear", "dW_fc1"));
  v.push_back(entry(d, "mlp.gelu_input", "(s,b,4h)", D, sbh4, Term::sbh, "GeLU", "gelu'(x)"));
  v.push_back(entry(d, "mlp.fc2_input", "(s,b,4h)", D, sbh4, Term::sbh, "second linear", "dW_fc2"));
  v.push_back(
      entry(d, "mlp.dropout_mask", "(s,b,h)", "int8", mask, Term::sbh, "dropout", "1-byte mask"));
  // Two LayerNorms: 4sbh.
  v.push_back(entry(d, "ln1.input", "(s,b,h)", D, sbh, Term::sbh, "LayerNorm", "its input"));
  v.push_back(entry(d, "ln2.input", "(s,b,h)", D, sbh, Term::sbh, "LayerNorm", "its input"));
  if (est.train.checkpointing == Checkpointing::selective) {
    // Korthikanti et al. 2022, section 5 (selective activation recomputation): the 5as²b/h of
    // the attention core (softmax output, its dropout mask and output) recomputed, 34sbh kept.
    for (auto& e : v)
      (e.term == Term::as2b ? est.activations.recompute : est.activations.layer).push_back(e);
    est.notes.push_back(
        "checkpointing selective (Korthikanti et al. section 5): the attention core's 5as²b is "
        "recomputed; each layer keeps 34sbh");
  } else {
    split_layers(est.activations, est.train, 0, est.model.layers, v,
                 {entry(d, "layer_input", "(s,b,h)", D, sbh, Term::sbh, "full recomputation",
                        "the checkpointed layer input")},
                 v);
  }
  if (w != 2)
    est.notes.push_back(
        "the published 34 and 5 assume 16-bit activations; here every activation is scaled to "
        "the training dtype and the dropout masks stay 1 byte");
  reference_figures(est, d);
}

void build_zero(Estimate& est) {
  const Dims d = make_dims(est.model, est.train);
  const std::string D = d.dt;
  est.label = "GPT-style reference: ZeRO (Rajbhandari et al. 2020), 12·h·b·s elements per layer";
  const auto all =
      entry(d, "layer_activations", "12·(b,s,h)", D, bytes_of({12, d.b, d.s, d.h}, d.w), Term::sbh,
            "(the paper gives a total, not tensors)",
            "ZeRO section 3.2: about 12 × hidden × batch × seq per layer");
  if (est.train.checkpointing == Checkpointing::selective)
    est.notes.push_back(
        "checkpointing selective: the ZeRO paper's 12·hbs has no selective variant; the figures "
        "are those without checkpointing");
  split_layers(est.activations, est.train, 0, est.model.layers, {all},
               {entry(d, "layer_input", "(b,s,h)", D, bytes_of({d.b, d.s, d.h}, d.w), Term::sbh,
                      "activation checkpointing", "the checkpointed layer input")},
               {all});
  reference_figures(est, d);
}

}  // namespace trainmem::analytic_detail
