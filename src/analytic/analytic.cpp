// The analytic model: profile names, parameter list, optimizer rules shared by every profile,
// and the dispatch to the per-profile builders (analytic_native.cpp, analytic_hf.cpp,
// analytic_reference.cpp). Formulas: docs/formulas.md.
#include "trainmem/analytic/analytic.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>

#include "analytic_detail.hpp"
#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/lora.hpp"
#include "trainmem/base/op_types.hpp"

namespace trainmem {

using analytic_detail::Dims;

const char* profile_name(Profile p) {
  switch (p) {
    case Profile::native:
      return "native";
    case Profile::hf_eager:
      return "hf-eager";
    case Profile::megatron:
      return "megatron";
    case Profile::zero:
      return "zero";
    case Profile::hf_sdpa:
      return "hf-sdpa";
    case Profile::hf_peft:
      return "hf-peft";
  }
  return "?";
}

const char* finetune_name(Finetune f) {
  switch (f) {
    case Finetune::full:
      return "full";
    case Finetune::lora:
      return "lora";
    case Finetune::qlora:
      return "qlora";
  }
  return "?";
}

std::optional<Finetune> parse_finetune(const std::string& name) {
  for (Finetune f : {Finetune::full, Finetune::lora, Finetune::qlora})
    if (name == finetune_name(f)) return f;
  return std::nullopt;
}

const char* bnb_optimizer_name(BnbOptimizer o) {
  switch (o) {
    case BnbOptimizer::none:
      return "";
    case BnbOptimizer::adamw8bit:
      return "adamw8bit";
    case BnbOptimizer::paged_adamw:
      return "paged-adamw";
    case BnbOptimizer::paged_adamw8bit:
      return "paged-adamw8bit";
  }
  return "?";
}

void PeftOptions::apply_to(TrainConfig& t) const {
  t.lora_rank = rank;
  t.lora_targets = targets;
  t.lora_dropout = dropout;
  t.quant = quant;
  t.double_quant = double_quant;
  t.quant_blocksize = quant_blocksize;
}

const char* peft_era_name(PeftEra e) {
  switch (e) {
    case PeftEra::v0_10:
      return "0.10-0.11";
    case PeftEra::v0_12:
      return "0.12-0.18";
    case PeftEra::v0_19:
      return "0.19-0.21";
  }
  return "?";
}
const char* peft_era_measured(PeftEra e) {
  switch (e) {
    case PeftEra::v0_10:
      return "0.10.0";
    case PeftEra::v0_12:
      return "0.18.1";
    case PeftEra::v0_19:
      return "0.21.2";
  }
  return "?";
}

bool PeftOptions::adapters_are_fp32() const {
  const bool four_bit = finetune == Finetune::qlora && quant != Quant::none;
  switch (peft_era) {
    case PeftEra::v0_10:
      return four_bit;
    case PeftEra::v0_12:
      return four_bit || adapters_fp32;
    case PeftEra::v0_19:
      break;
  }
  return adapters_fp32;
}

const char* bnb_era_name(BnbEra e) {
  switch (e) {
    case BnbEra::v0_43:
      return "0.43";
    case BnbEra::v0_44:
      return "0.44-0.50";
  }
  return "?";
}

std::optional<Profile> parse_profile(const std::string& s) {
  for (Profile p : all_profiles())
    if (s == profile_name(p)) return p;
  if (s == "hf_eager" || s == "hf") return Profile::hf_eager;
  if (s == profile_name(Profile::hf_peft)) return Profile::hf_peft;
  return std::nullopt;
}

std::vector<Profile> all_profiles() {
  return {Profile::native, Profile::hf_eager, Profile::megatron, Profile::zero, Profile::hf_sdpa};
}

const char* hf_era_name(HfEra e) {
  switch (e) {
    case HfEra::v4_28:
      return "4.28";
    case HfEra::v4_30:
      return "4.30";
    case HfEra::v4_31:
      return "4.31";
    case HfEra::v4_35:
      return "4.35";
    case HfEra::v5_25:
      return "5.25";
  }
  return "?";
}

const char* hf_era_range(HfEra e) {
  switch (e) {
    case HfEra::v4_28:
      return "4.28.0-4.29.x";
    case HfEra::v4_30:
      return "4.30.x";
    case HfEra::v4_31:
      return "4.31.0-4.34.x";
    case HfEra::v4_35:
      return "4.35.x";
    case HfEra::v5_25:
      return "5.25.x";
  }
  return "?";
}

const char* torch_era_name(TorchEra t) {
  return t == TorchEra::before_2_2 ? "<2.2" : ">=2.2";
}

const char* loop_name(Loop l) {
  switch (l) {
    case Loop::hf_model_loss:
      return "hf-model-loss";
    case Loop::shift_ce:
      return "shift-ce";
    case Loop::none:
      return "none";
  }
  return "?";
}

std::vector<HfEra> all_hf_eras() {
  return {HfEra::v4_28, HfEra::v4_30, HfEra::v4_31, HfEra::v4_35, HfEra::v5_25};
}

std::optional<Loop> parse_loop(const std::string& s) {
  for (Loop l : {Loop::hf_model_loss, Loop::shift_ce, Loop::none})
    if (s == loop_name(l)) return l;
  return std::nullopt;
}

namespace {

// "4.29.2" -> {4, 29}; false unless it is MAJOR.MINOR[.PATCH[suffix]] with digits, the suffix
// a release tag of letters, digits and . + _ - not ending in '.' (rc1, +cu121, .dev0).
bool major_minor(const std::string& v, int* major, int* minor) {
  std::size_t pos = 0;
  auto number = [&](int* out) {
    const std::size_t start = pos;
    long n = 0;
    while (pos < v.size() && v[pos] >= '0' && v[pos] <= '9' && pos - start < 6)
      n = n * 10 + (v[pos++] - '0');
    *out = static_cast<int>(n);
    return pos > start;
  };
  if (!number(major) || pos >= v.size() || v[pos++] != '.' || !number(minor)) return false;
  if (pos == v.size()) return true;
  if (v[pos] != '.') return false;
  ++pos;
  int patch = 0;
  if (!number(&patch)) return false;
  for (std::size_t k = pos; k < v.size(); ++k)
    if (!std::isalnum(static_cast<unsigned char>(v[k])) && !std::strchr(".+_-", v[k])) return false;
  return v.back() != '.';
}

std::string known_hf_eras() {
  std::string out;
  for (HfEra e : all_hf_eras()) {
    if (!out.empty()) out += ", ";
    out += std::string(hf_era_name(e)) + " (" + hf_era_range(e) + ")";
  }
  return out;
}

}  // namespace

HfEra parse_hf_version(const std::string& version) {
  int major = 0, minor = 0;
  if (major_minor(version, &major, &minor)) {
    if (major == 4 && (minor == 28 || minor == 29)) return HfEra::v4_28;
    if (major == 4 && minor == 30) return HfEra::v4_30;
    if (major == 4 && minor >= 31 && minor <= 34) return HfEra::v4_31;
    if (major == 4 && minor == 35) return HfEra::v4_35;
    if (major == 5 && minor == 25) return HfEra::v5_25;
  }
  throw InputError(
      "--hf-version: '" + version +
      "' is not a transformers release in a modelled era; known eras: " + known_hf_eras() +
      " (each proven against the released code by tools/hf_saved_tensors.py)");
}

BnbEra parse_bnb_version(const std::string& version) {
  int major = 0, minor = 0;
  if (major_minor(version, &major, &minor) && major == 0) {
    if (minor == 43) return BnbEra::v0_43;
    if (minor >= 44 && minor <= 50) return BnbEra::v0_44;
  }
  throw InputError("--bnb-version " + version +
                   ": hf-peft knows bitsandbytes 0.43.x (8-bit optimizer blocks of 2,048, read "
                   "from the 0.43.3 release) and 0.44.0 to 0.50.x (blocks of 256; 0.50.2 "
                   "measured); other releases were not read");
}

PeftEra parse_peft_version(const std::string& version) {
  int major = 0, minor = 0;
  if (major_minor(version, &major, &minor) && major == 0) {
    if (minor == 10 || minor == 11) return PeftEra::v0_10;
    if (minor >= 12 && minor <= 18) return PeftEra::v0_12;
    if (minor >= 19 && minor <= 21) return PeftEra::v0_19;
  }
  throw InputError("--peft-version " + version +
                   ": hf-peft knows peft 0.10.x and 0.11.x (adapters in the base's dtype; 0.10.0 "
                   "and 0.11.1 measured), 0.12 to 0.18.x (fp32 adapters, always on a 4-bit base; "
                   "0.12.0 and 0.18.1 measured) and 0.19 to 0.21.x (0.21.2 measured); other "
                   "releases were not read");
}

TorchEra parse_torch_version(const std::string& version, HfOptions* opts) {
  int major = 0, minor = 0;
  if (major_minor(version, &major, &minor)) {
    const int v = major * 100 + minor;
    if (opts) {
      opts->torch_major = major;
      opts->torch_minor = minor;
    }
    if (v >= 113 && v < 202) return TorchEra::before_2_2;
    if (v >= 202 && v <= 215) return TorchEra::from_2_2;
  }
  throw InputError("--torch-version: '" + version +
                   "' is not a modelled PyTorch release; known: 1.13-2.1 (<2.2: mean() saves "
                   "its input) and 2.2-2.15 (>=2.2: it does not)");
}

void check_hf_options(Profile profile, const HfOptions& opts) {
  if (profile != Profile::hf_peft && opts.peft.optimizer != BnbOptimizer::none)
    throw InputError(std::string("--optimizer ") + bnb_optimizer_name(opts.peft.optimizer) +
                     ": bitsandbytes' optimizers are modelled for the adapters of --finetune "
                     "lora|qlora (profile hf-peft) only");
  if (profile == Profile::hf_peft) {
    if (opts.era && *opts.era != HfEra::v5_25)
      throw InputError("--hf-version " + opts.hf_version +
                       ": hf-peft models transformers 5.25 (5.25.x) with peft 0.21 and "
                       "bitsandbytes 0.50, the releases it was measured with");
    const PeftOptions& pf = opts.peft;
    if (pf.finetune == Finetune::full)
      throw InputError("--profile hf-peft: needs --finetune lora or qlora");
    if (pf.rank < 1 || pf.rank > 65536)
      throw InputError("--lora-rank " + std::to_string(pf.rank) + ": allowed 1 to 65536");
    if (!(pf.dropout >= 0 && pf.dropout < 1))
      throw InputError("--lora-dropout: allowed 0 <= p < 1");
    if (pf.targets == 0 || (pf.targets & ~0x7fu) != 0)
      throw InputError(
          "--lora-targets: at least one of q_proj, k_proj, v_proj, o_proj, "
          "gate_proj, up_proj, down_proj, or all-linear");
    if (pf.finetune == Finetune::lora && (pf.quant == Quant::nf4 || pf.quant == Quant::fp4))
      throw InputError(std::string("--quant ") + quant_name(pf.quant) +
                       " with --finetune lora: a 4-bit base is --finetune qlora (--finetune lora "
                       "trains adapters on a 16-bit base, or with --quant int8 an 8-bit one)");
    if (pf.finetune == Finetune::qlora && (pf.quant == Quant::none || pf.quant == Quant::int8))
      throw InputError(std::string("--quant ") + quant_name(pf.quant) +
                       " with --finetune qlora: qlora needs a 4-bit base (nf4, fp4); for a "
                       "16-bit base use --finetune lora, for an 8-bit one --finetune lora "
                       "--quant int8");
    check_quant_blocksize(pf.quant_blocksize);
  }
  if (profile != Profile::hf_eager && profile != Profile::hf_sdpa && profile != Profile::hf_peft)
    return;
  if (profile == Profile::hf_sdpa && opts.era && *opts.era != HfEra::v5_25)
    throw InputError("--hf-version " + opts.hf_version +
                     ": hf-sdpa models the SDPA attention of transformers 5.25 (5.25.x) only; "
                     "earlier eras are eager (--profile hf-eager)");
  const bool v5 = profile == Profile::hf_sdpa || (opts.era && *opts.era == HfEra::v5_25);
  if (v5 && !opts.torch_version.empty() &&
      (opts.torch_major < 2 || (opts.torch_major == 2 && opts.torch_minor < 6)))
    throw InputError("--torch-version " + opts.torch_version +
                     ": transformers 5.25 requires PyTorch >= 2.6; allowed with it: 2.6-2.15");
}

namespace {

// Why the HF profiles cannot model `m` in `era` (empty: they can). The families and features
// were measured on the 5.25 era's classes only (tests/data/hf_golden/<family>-5.25*.json):
// MistralForCausalLM (sliding window in every layer, head_dim), Qwen2ForCausalLM (q/k/v
// biases, always on; windows from max_window_layers; tied), Qwen3ForCausalLM (q/k norms,
// always on; head_dim; windows from max_window_layers), LlamaForCausalLM (head_dim,
// rope_scaling llama3). Anything else (a Qwen3 with attention_bias, a LLaMA with q/k norms, an
// older era) was not measured.
std::string hf_unproven(const ModelConfig& m, HfEra era) {
  // A MoE family's attention is its dense family's (MixtralForCausalLM: Mistral's; the Qwen MoE
  // classes: Qwen2's, Qwen3's), measured on the MoE classes too (docs/moe-plan.md).
  const std::string f = m.family == "mixtral"     ? std::string("mistral")
                        : m.family == "qwen2_moe" ? std::string("qwen2")
                        : m.family == "qwen3_moe" ? std::string("qwen3")
                                                  : m.family;
  if (m.moe() && era != HfEra::v5_25)
    return m.family + " (" + (m.family == "mixtral" ? "MixtralForCausalLM" : "a Qwen MoE class") +
           ") was measured with the 5.25 era's classes only";
  const bool head_dim = m.explicit_head_dim > 0 && m.explicit_head_dim * m.heads != m.hidden;
  const bool rope = m.rope_scaling.kind != RopeScalingKind::none;
  const bool window = m.sliding_window > 0;
  if (f != "llama" && f != "mistral" && f != "qwen2" && f != "qwen3")
    return "model family '" + f + "' has no HF profile (known: llama, mistral, qwen2, qwen3)";
  std::string feature;
  if (f != "llama")
    feature = f + " (" +
              (f == "mistral" ? "MistralForCausalLM, 4.34+"
               : f == "qwen2" ? "Qwen2ForCausalLM, 4.37+"
                              : "Qwen3ForCausalLM, 4.51+") +
              ")";
  else if (head_dim)
    feature = "an explicit head_dim != hidden/heads";
  else if (rope)
    feature = "rope_scaling";
  else if (m.qkv_bias || m.qk_norm || window)
    feature = "q/k/v biases, q/k norms or a window";
  if (!feature.empty() && era != HfEra::v5_25)
    return feature + " was measured with the 5.25 era's classes only";
  // Within 5.25: the combinations that were measured.
  if (f == "qwen2" && !m.qkv_bias) return "Qwen2ForCausalLM always has q/k/v biases";
  if (f == "qwen3" && !m.qk_norm) return "Qwen3ForCausalLM always has q_norm and k_norm";
  if (m.qkv_bias && f != "qwen2") return "q/k/v biases were measured for qwen2 only";
  if (m.qk_norm && f != "qwen3") return "q/k norms were measured for qwen3 only";
  if (window && f == "llama") return "a sliding window was measured for mistral, qwen2, qwen3";
  if (window && f == "mistral" && m.window_from_layer != 0)
    return "MistralForCausalLM windows every layer (window_from_layer 0)";
  if (head_dim && f == "qwen2") return "Qwen2ForCausalLM has no head_dim (hidden/heads)";
  if (rope && f != "llama") return "rope_scaling was measured for llama only";
  return "";
}

bool needs_5_25(const ModelConfig& m) {
  return m.family != "llama" ||
         (m.explicit_head_dim > 0 && m.explicit_head_dim * m.heads != m.hidden) ||
         m.rope_scaling.kind != RopeScalingKind::none || m.qkv_bias || m.qk_norm ||
         m.sliding_window > 0;
}

}  // namespace

HfEra hf_era_for(Profile profile, const HfOptions& opts, const ModelConfig& model) {
  if (opts.era) return *opts.era;
  // a recipe other than the default is modelled by the step's event sequence, 5.25's
  const bool recipe = opts.precision && *opts.precision != Precision::mixed;
  if (profile == Profile::hf_sdpa || profile == Profile::hf_peft || needs_5_25(model) || recipe)
    return HfEra::v5_25;
  return HfEra::v4_30;
}

void check_hf_model(Profile profile, const HfOptions& opts, const ModelConfig& model) {
  if (profile != Profile::hf_eager && profile != Profile::hf_sdpa && profile != Profile::hf_peft)
    return;
  const HfEra era = hf_era_for(profile, opts, model);
  std::string why = hf_unproven(model, era);
  // hf-peft: LLaMA was measured under peft; Mistral and Qwen2 differ from it only by what a
  // frozen base keeps no tensor for (biases) or by a window that the sequence does not reach
  // (checked in build_hf_peft). Qwen3's q/k norms were not measured under peft.
  if (why.empty() && profile == Profile::hf_peft && model.qk_norm)
    why = "q/k norms (qwen3) were not measured under peft (tools/peft_saved_tensors.py ran LLaMA)";
  if (why.empty()) return;
  const std::string flag =
      opts.era ? "--hf-version " +
                     (opts.hf_version.empty() ? std::string(hf_era_name(era)) : opts.hf_version)
               : std::string("model_type ") + model.family;
  throw InputError(flag + ": " + profile_name(profile) + " cannot model " + model.name + ": " +
                   why + " (transformers " + hf_era_name(era) + " era, " + hf_era_range(era) +
                   "; proven combinations: tests/data/hf_golden/<family>-5.25*.json, "
                   "docs/formulas.md \"Model families\")");
}

const char* term_name(Term t) {
  switch (t) {
    case Term::sbh:
      return "sbh";
    case Term::sbi:
      return "sbi";
    case Term::as2b:
      return "as2b";
    case Term::sb:
      return "sb";
    case Term::other:
      return "other";
  }
  return "?";
}

std::uint64_t Instant::total() const {
  std::uint64_t t = 0;
  for (auto x : bytes) t = checked_add(t, x, "instant total");
  return t;
}

Coefficients sum_coefficients(const std::vector<TensorEntry>& entries) {
  Coefficients c;
  for (const auto& e : entries) {
    switch (e.term) {
      case Term::sbh:
        c.sbh += e.coefficient;
        break;
      case Term::sbi:
        c.sbi += e.coefficient;
        break;
      case Term::as2b:
        c.as2b += e.coefficient;
        break;
      case Term::sb:
        c.sb += e.coefficient;
        break;
      case Term::other:
        c.other_bytes = checked_add(c.other_bytes, e.bytes, "other bytes");
        break;
    }
  }
  return c;
}

std::uint64_t sum_bytes(const std::vector<TensorEntry>& entries) {
  std::uint64_t t = 0;
  for (const auto& e : entries) t = checked_add(t, e.bytes, "activation bytes");
  return t;
}

std::vector<ParamSpec> parameter_specs(const ModelConfig& m) {
  const std::int64_t h = m.hidden, i = m.intermediate, V = m.vocab;
  const std::int64_t ad = m.heads * m.head_dim(), kd = m.kv_dim();
  std::vector<ParamSpec> specs;
  auto add = [&](std::string name, std::vector<std::int64_t> shape) {
    std::uint64_t n = 1;
    for (auto x : shape) n = checked_mul(n, static_cast<std::uint64_t>(x), "parameter size");
    specs.push_back({std::move(name), std::move(shape), n});
  };
  add("model.embed_tokens.weight", {V, h});
  for (std::int64_t l = 0; l < m.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {h});
    add(p + "self_attn.q_proj.weight", {ad, h});
    if (m.qkv_bias) add(p + "self_attn.q_proj.bias", {ad});
    add(p + "self_attn.k_proj.weight", {kd, h});
    if (m.qkv_bias) add(p + "self_attn.k_proj.bias", {kd});
    add(p + "self_attn.v_proj.weight", {kd, h});
    if (m.qkv_bias) add(p + "self_attn.v_proj.bias", {kd});
    add(p + "self_attn.o_proj.weight", {h, ad});
    if (m.qk_norm) {
      add(p + "self_attn.q_norm.weight", {m.head_dim()});
      add(p + "self_attn.k_norm.weight", {m.head_dim()});
    }
    add(p + "post_attention_layernorm.weight", {h});
    if (m.is_moe_layer(l)) {
      // transformers 5.x: the router, the experts as two 3-D tensors, Qwen2-MoE's shared expert
      // and its gate (docs/moe-plan.md, "Parameters").
      const std::int64_t E = m.experts, im = m.expert_intermediate;
      add(p + "mlp.gate.weight", {E, h});
      add(p + "mlp.experts.gate_up_proj", {E, 2 * im, h});
      add(p + "mlp.experts.down_proj", {E, h, im});
      if (const std::int64_t is = m.shared_expert_intermediate; is > 0) {
        add(p + "mlp.shared_expert.gate_proj.weight", {is, h});
        add(p + "mlp.shared_expert.up_proj.weight", {is, h});
        add(p + "mlp.shared_expert.down_proj.weight", {h, is});
        add(p + "mlp.shared_expert_gate.weight", {1, h});
      }
      continue;
    }
    add(p + "mlp.gate_proj.weight", {i, h});
    add(p + "mlp.up_proj.weight", {i, h});
    add(p + "mlp.down_proj.weight", {h, i});
  }
  add("model.norm.weight", {h});
  if (!m.tied_embeddings) add("lm_head.weight", {V, h});
  return specs;
}

std::uint64_t parameter_count(const std::vector<ParamSpec>& specs) {
  std::uint64_t n = 0;
  for (const auto& p : specs) n = checked_add(n, p.elements, "parameter count");
  return n;
}

StateFigures state_figures(const ModelConfig& model, const TrainConfig& train) {
  const std::uint64_t w = dtype_size(train.dtype);
  const bool fp32 = train.dtype == DType::f32;
  // The largest gradient tensor comes from the first layer and the embedding/head; the other
  // layers repeat the same shapes, so one layer is enough (keeps 80-layer models cheap). A
  // mixture of experts may mix dense and MoE layers: every layer then (`per_layer` is their sum
  // and counts once).
  ModelConfig one_layer = model;
  if (!model.moe()) one_layer.layers = std::min<std::int64_t>(model.layers, 1);
  const std::uint64_t layer_copies = model.moe() ? 1 : static_cast<std::uint64_t>(model.layers);
  const auto few = parameter_specs(one_layer);
  // Exact count for all layers: embedding + final norm (+ lm_head) + L × one layer.
  std::uint64_t per_layer = 0, outside = 0;
  for (const auto& p : few) {
    if (p.name.rfind("model.layers.", 0) == 0)
      per_layer = checked_add(per_layer, p.elements, "parameter count");
    else
      outside = checked_add(outside, p.elements, "parameter count");
  }
  const std::uint64_t P =
      checked_add(outside, checked_mul(per_layer, layer_copies, "parameter count"), "params");

  StateFigures f;
  f.params = checked_mul(P, w, "params bytes");
  f.elements = P;
  f.trainable = P;
  const ParamSpec* largest = nullptr;
  for (const auto& p : few)
    if (!largest || p.elements > largest->elements) largest = &p;
  std::string largest_name = largest ? largest->name : "";
  std::uint64_t largest_elements = largest ? largest->elements : 0;
  std::vector<std::uint64_t> adapters;  // LoRA: each adapter's elements, one layer
  if (train.lora()) {
    // LoRA: the adapters of layer 0's targets, each A (r, in) then B (out, r), in the order of
    // the projections; the first largest names the largest gradient.
    const std::uint64_t r = static_cast<std::uint64_t>(train.lora_rank);
    const std::uint64_t h = model.hidden, i = model.intermediate;
    const std::uint64_t ad = checked_mul(model.heads, model.head_dim()), kd = model.kv_dim();
    struct Proj {
      const char* name;
      std::uint64_t in, out;
    };
    const Proj proj[7] = {{"self_attn.q_proj", h, ad}, {"self_attn.k_proj", h, kd},
                          {"self_attn.v_proj", h, kd}, {"self_attn.o_proj", ad, h},
                          {"mlp.gate_proj", h, i},     {"mlp.up_proj", h, i},
                          {"mlp.down_proj", i, h}};
    largest_elements = 0;
    for (int t = 0; t < 7; ++t) {
      if (!(train.lora_targets & (1u << t))) continue;
      const std::uint64_t a = checked_mul(r, proj[t].in), bb = checked_mul(r, proj[t].out);
      adapters.insert(adapters.end(), {a, bb});
      const std::string pre = std::string("model.layers.0.") + proj[t].name;
      if (a > largest_elements) largest_elements = a, largest_name = pre + ".lora_A.weight";
      if (bb > largest_elements) largest_elements = bb, largest_name = pre + ".lora_B.weight";
    }
    f.trainable = lora_trainable_count(model, train.lora_rank, train.lora_targets);
    f.elements = checked_add(P, f.trainable, "params");
    f.params = checked_mul(f.elements, w, "params bytes");
  }
  if (train.quantized()) {
    // QLoRA: each layer's `*_proj.weight` in bitsandbytes' 4-bit tensors (--quant int8: int8
    // with an fp32 absmax per row), the rest in D.
    std::uint64_t layer_bytes = 0;
    for (const auto& p : few)
      if (p.name.rfind("model.layers.", 0) == 0)
        layer_bytes =
            checked_add(layer_bytes,
                        analytic_detail::is_layer_linear(p.name)
                            ? analytic_detail::quantized_weight_bytes(
                                  p.elements, static_cast<std::uint64_t>(p.shape.at(0)), train)
                            : checked_mul(p.elements, w, "params bytes"),
                        "params bytes");
    f.params = analytic_detail::csum(
        {checked_mul(checked_add(outside, f.trainable, "params"), w, "params bytes"),
         checked_mul(layer_bytes, layer_copies, "params bytes")},
        "params bytes");
  }
  // bitsandbytes' optimizers: the states of every trained tensor (one layer's, times the layers,
  // + the rest), and the shared maps and lookup tables once any tensor keeps 8-bit states.
  std::uint64_t states_bnb = 0, states_managed = 0;
  bool any8 = false;
  if (bnb_optimizer(train.optimizer)) {
    const std::uint64_t L = static_cast<std::uint64_t>(model.layers);
    auto add = [&](std::uint64_t n, std::uint64_t copies) {
      analytic_detail::bnb_state_bytes(eight_bit_optimizer(train.optimizer),
                                       paged_optimizer(train.optimizer), kBnbStateBlock, n, copies,
                                       states_bnb, states_managed, any8);
    };
    if (train.lora()) {
      for (std::uint64_t n : adapters) add(n, L);
    } else {
      for (const auto& p : few)
        add(p.elements, p.name.rfind("model.layers.", 0) == 0 ? layer_copies : 1);
    }
    if (any8)
      states_bnb = checked_add(
          states_bnb, static_cast<std::uint64_t>(2 * kBnbMapEntries * 4 + 2 * kBnbLutEntries),
          "states");
  }
  const std::uint64_t T = f.trainable;
  f.largest_gradient_bytes = checked_mul(largest_elements, w, "gradient bytes");
  f.largest_gradient_name = largest_name + ".grad";
  switch (train.optimizer) {
    case Optimizer::adamw:
      f.gradients = checked_mul(T, w, "gradient bytes");
      f.optimizer_states = checked_mul(T, fp32 ? 8 : 12, "optimizer states");
      break;
    case Optimizer::sgd:
      f.gradients = checked_mul(T, w, "gradient bytes");
      f.optimizer_states = fp32 ? 0 : checked_mul(T, 4, "optimizer states");
      break;
    case Optimizer::adamw8bit:
    case Optimizer::paged_adamw:
    case Optimizer::paged_adamw8bit:
      f.gradients = checked_mul(T, w, "gradient bytes");
      f.optimizer_states = states_bnb;
      f.optimizer_states_managed = states_managed;
      break;
    case Optimizer::lomo: {
      f.optimizer_states = 0;
      if (model.tied_embeddings) {
        // The shared embedding/lm_head gradient lives from the head's backward to the
        // embedding's; the largest other gradient is allocated while it is alive.
        const std::uint64_t emb = checked_mul(checked_mul(model.vocab, model.hidden), w);
        std::uint64_t other = 0;
        for (const auto& p : few)
          if (p.name != "model.embed_tokens.weight")
            other = std::max(other, checked_mul(p.elements, w, "gradient bytes"));
        f.gradients = checked_add(emb, other, "gradients");
      } else {
        f.gradients = f.largest_gradient_bytes;
      }
      break;
    }
  }
  return f;
}

Estimate estimate(Profile profile, const ModelConfig& model, const TrainConfig& train,
                  const HfOptions& hf) {
  model.validate();
  // hf-eager and hf-sdpa model the MoE classes (build_hf checks what was measured), native
  // trainmem's own MoE layer (its Stage runs require_native_moe); the others do not.
  train.validate();
  if (profile != Profile::native && profile != Profile::hf_eager && profile != Profile::hf_sdpa)
    require_dense(model, std::string("profile ") + profile_name(profile));
  train.check_checkpoint_resolved("this command");
  check_hf_options(profile, hf);
  check_hf_model(profile, hf, model);
  Estimate est;
  est.profile = profile;
  est.model = model;
  est.train = train;
  const StateFigures st = state_figures(model, train);
  est.figures.params = st.params;
  est.figures.gradients = st.gradients;
  est.figures.optimizer_states = st.optimizer_states;
  est.optimizer_states_managed = st.optimizer_states_managed;
  est.param_count = st.elements;
  est.trainable_params = st.trainable;
  est.largest_gradient_bytes = st.largest_gradient_bytes;
  est.largest_gradient_name = st.largest_gradient_name;
  switch (profile) {
    case Profile::native:
      analytic_detail::build_native(est);
      break;
    case Profile::hf_eager:
    case Profile::hf_sdpa:
      est.hf = hf;
      analytic_detail::build_hf(est);
      break;
    case Profile::hf_peft:
      est.hf = hf;
      analytic_detail::build_hf_peft(est);
      break;
    case Profile::megatron:
      analytic_detail::build_megatron(est);
      break;
    case Profile::zero:
      analytic_detail::build_zero(est);
      break;
  }
  if (train.offload_activations && profile != Profile::native)
    est.notes.push_back(
        "activation offload is modelled for trainmem's own step (native) only: "
        "these figures keep every activation on the device");
  auto& f = est.figures;
  f.sum = analytic_detail::csum({f.params, f.gradients, f.optimizer_states, f.activations}, "sum");
  return est;
}

namespace analytic_detail {

Dims make_dims(const ModelConfig& m, const TrainConfig& t) {
  Dims d;
  d.b = static_cast<std::uint64_t>(t.batch);
  d.s = static_cast<std::uint64_t>(t.seq);
  d.h = static_cast<std::uint64_t>(m.hidden);
  d.i = static_cast<std::uint64_t>(m.intermediate);
  d.a = static_cast<std::uint64_t>(m.heads);
  d.k = static_cast<std::uint64_t>(m.kv_heads);
  d.d = static_cast<std::uint64_t>(m.head_dim());
  d.kd = checked_mul(d.k, d.d, "kv dim");
  d.V = static_cast<std::uint64_t>(m.vocab);
  d.L = static_cast<std::uint64_t>(m.layers);
  d.w = dtype_size(t.dtype);
  d.dt = dtype_name(t.dtype);
  return d;
}

TensorEntry entry(const Dims& d, std::string name, std::string shape, std::string dtype,
                  std::uint64_t bytes, Term term, std::string kept_by, std::string why) {
  TensorEntry e;
  e.name = std::move(name);
  e.shape = std::move(shape);
  e.dtype = std::move(dtype);
  e.bytes = bytes;
  e.term = term;
  const double sb = static_cast<double>(d.s) * static_cast<double>(d.b);
  double mono = 1;
  switch (term) {
    case Term::sbh:
      mono = sb * static_cast<double>(d.h);
      break;
    case Term::sbi:
      mono = sb * static_cast<double>(d.i);
      break;
    case Term::as2b:
      mono = sb * static_cast<double>(d.a) * static_cast<double>(d.s);
      break;
    case Term::sb:
      mono = sb;
      break;
    case Term::other:
      mono = 1;
      break;
  }
  e.coefficient = static_cast<double>(bytes) / mono;
  e.kept_by = std::move(kept_by);
  e.why = std::move(why);
  return e;
}

void finish(ActivationBreakdown& acts, std::int64_t layers) {
  acts.layers = layers;
  acts.per_layer = sum_coefficients(acts.layer);
  acts.per_layer_bytes = sum_bytes(acts.layer);
  acts.layer_windowed_bytes = sum_bytes(acts.layer_windowed);
  acts.layer_dense_bytes = sum_bytes(acts.layer_dense);
  acts.embedding_bytes = sum_bytes(acts.embedding);
  acts.shared_bytes = sum_bytes(acts.shared);
  acts.head_bytes = sum_bytes(acts.head);
  acts.loop_bytes = sum_bytes(acts.loop);
  acts.recompute_bytes = sum_bytes(acts.recompute);
  acts.layer_checkpointed_bytes = sum_bytes(acts.layer_checkpointed);
  acts.first_layer_bytes = sum_bytes(acts.first_layer);
  const std::int64_t windowed = acts.layer_windowed.empty() ? 0 : acts.windowed_layers;
  const std::int64_t ckpt = acts.layer_checkpointed.empty() ? 0 : acts.checkpointed_layers;
  const std::int64_t first = acts.first_layer.empty() ? 0 : 1;
  const std::int64_t dense = acts.layer_dense.empty() ? 0 : acts.dense_layers;
  if (windowed < 0 || ckpt < 0 || dense < 0 || windowed + ckpt + first + dense > layers ||
      (first > 0 && windowed + ckpt > 0) || (dense > 0 && windowed + first > 0))
    throw Error("analytic: windowed, dense, checkpointed or first layers out of range");
  acts.total_bytes = csum(
      {acts.embedding_bytes, acts.first_layer_bytes,
       checked_mul(acts.per_layer_bytes, layers - windowed - ckpt - first - dense, "activations"),
       checked_mul(acts.layer_windowed_bytes, windowed, "activations"),
       checked_mul(acts.layer_dense_bytes, dense, "activations"),
       checked_mul(acts.layer_checkpointed_bytes, ckpt, "activations"), acts.shared_bytes,
       acts.head_bytes, acts.loop_bytes},
      "activations");
}

std::int64_t split_layers(ActivationBreakdown& acts, const TrainConfig& train, std::int64_t first,
                          std::int64_t count, std::vector<TensorEntry> saved,
                          std::vector<TensorEntry> kept, std::vector<TensorEntry> recompute) {
  const std::int64_t n = train.checkpointed_count(first, count);
  if (n == 0) {
    acts.layer = std::move(saved);
    return 0;
  }
  acts.recompute = std::move(recompute);
  if (n == count) {
    acts.layer = std::move(kept);
  } else {
    acts.layer = std::move(saved);
    acts.layer_checkpointed = std::move(kept);
    acts.checkpointed_layers = n;
  }
  return n;
}

// bitsandbytes' bytes for one 4-bit weight (docs/formulas.md, "4-bit weights"):
// the packed pairs, the absmax per block (u8 under double quantization, with one fp32 absmax
// per 256 of them, the fp32 offset and the 256-entry fp32 nested code; fp32 otherwise) and the
// 16-entry fp32 code.
std::uint64_t quant4_weight_bytes(std::uint64_t n, std::uint64_t blocksize, bool double_quant) {
  const std::uint64_t blocks = (n + blocksize - 1) / blocksize;
  const std::uint64_t packed = (n + 1) / 2;
  if (!double_quant) return csum({packed, checked_mul(blocks, 4, "absmax"), 64}, "4-bit weight");
  return csum({packed, blocks, checked_mul((blocks + 255) / 256, 4, "nested absmax"), 4, 64, 1024},
              "4-bit weight");
}

std::uint64_t quantized_weight_bytes(std::uint64_t n, std::uint64_t out, const TrainConfig& train) {
  if (train.quant8()) return csum({n, checked_mul(out, 4, "SCB")}, "8-bit weight");
  return quant4_weight_bytes(n, static_cast<std::uint64_t>(train.quant_blocksize),
                             train.double_quant);
}

void bnb_state_bytes(bool bits8, bool paged, std::uint64_t block, std::uint64_t n,
                     std::uint64_t copies, std::uint64_t& device, std::uint64_t& managed,
                     bool& any8) {
  const bool eight = bits8 && n >= static_cast<std::uint64_t>(kBnbMin8BitSize);
  const bool in_managed = paged && n >= static_cast<std::uint64_t>(kBnbPagedMinSize);
  any8 = any8 || eight;
  const std::uint64_t states = checked_mul(checked_mul(n, eight ? 2 : 8, "bnb states"), copies);
  std::uint64_t& moments = in_managed ? managed : device;
  moments = checked_add(moments, states, "bnb states");
  if (eight)
    device = checked_add(device, checked_mul(checked_mul((n + block - 1) / block, 8), copies),
                         "bnb states");
}

bool is_layer_linear(const std::string& name) {
  return name.rfind("model.layers.", 0) == 0 && name.size() > 12 &&
         name.compare(name.size() - 12, 12, "_proj.weight") == 0;
}

std::uint64_t csum(std::initializer_list<std::uint64_t> xs, const char* what) {
  std::uint64_t t = 0;
  for (auto x : xs) t = checked_add(t, x, what);
  return t;
}

std::uint64_t csub(std::uint64_t a, std::uint64_t b, const char* what) {
  if (b > a) throw Error(std::string("analytic: negative byte count in ") + what);
  return a - b;
}

}  // namespace analytic_detail
}  // namespace trainmem
