// The HuggingFace config.json loader (include/trainmem/base/config.hpp): the dense LLaMA,
// Mistral, Qwen2 and Qwen3 families, every key that changes the step read and validated (each
// error names the field), the rest listed as ignored. Field names in messages are the
// config.json keys, since those are the names users see.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "trainmem/base/config.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/input_file.hpp"

namespace trainmem {
namespace {

using json = nlohmann::json;

std::string join(const std::vector<std::string>& xs, const char* sep = ", ") {
  std::string out;
  for (std::size_t n = 0; n < xs.size(); ++n) {
    if (n) out += sep;
    out += xs[n];
  }
  return out;
}

// ---- config.json field readers: each error names the field ----

std::string json_kind(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return std::string("a boolean (") + (v.get<bool>() ? "true" : "false") + ")";
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s.size() > 40) s = s.substr(0, 40) + "...";
    return "a string (\"" + s + "\")";
  }
  if (v.is_number_float()) return "a floating-point number (" + v.dump() + ")";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return v.type_name();
}

// A field present with a non-null value.
const json* field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

std::int64_t read_int(const json& j, const char* name, const std::string& src,
                      std::optional<std::int64_t> fallback) {
  const json* v = field(j, name);
  if (!v) {
    if (fallback) return *fallback;
    throw InputError(src + ": missing required field " + name + " (a positive integer)");
  }
  if (v->is_number_integer()) {  // nlohmann: also true for unsigned
    std::int64_t x;
    if (v->is_number_unsigned()) {
      auto u = v->get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        throw OverflowError(src + ": " + name + " = " + std::to_string(u) +
                            " does not fit in a signed 64-bit integer");
      x = static_cast<std::int64_t>(u);
    } else {
      x = v->get<std::int64_t>();
    }
    if (x <= 0)
      throw InputError(src + ": " + name + " must be a positive integer, got " + std::to_string(x));
    return x;
  }
  throw InputError(src + ": " + name + " must be a positive integer, got " + json_kind(*v));
}

double read_positive_double(const json& j, const char* name, const std::string& src,
                            double fallback) {
  const json* v = field(j, name);
  if (!v) return fallback;
  if (!v->is_number())
    throw InputError(src + ": " + name + " must be a positive number, got " + json_kind(*v));
  double x = v->get<double>();
  if (!std::isfinite(x) || x <= 0)
    throw InputError(src + ": " + name + " must be a positive finite number, got " + v->dump());
  return x;
}

bool read_bool(const json& j, const char* name, const std::string& src, bool fallback) {
  const json* v = field(j, name);
  if (!v) return fallback;
  if (!v->is_boolean())
    throw InputError(src + ": " + name + " must be true or false, got " + json_kind(*v));
  return v->get<bool>();
}

// config.json keys that say nothing about a training step's computation or memory: listed
// as ignored by --explain. (torch_dtype/dtype are read as information, and listed too.)
const char* const kIgnoredKeys[] = {"_name_or_path",
                                    "architectures",
                                    "auto_map",
                                    "bos_token_id",
                                    "eos_token_id",
                                    "pad_token_id",
                                    "sep_token_id",
                                    "decoder_start_token_id",
                                    "initializer_range",
                                    "transformers_version",
                                    "use_cache",
                                    "torch_dtype",
                                    "dtype",
                                    "use_bfloat16",
                                    "return_dict",
                                    "output_attentions",
                                    "output_hidden_states",
                                    "torchscript",
                                    "tokenizer_class",
                                    "id2label",
                                    "label2id",
                                    "problem_type",
                                    "finetuning_task",
                                    "task_specific_params",
                                    "max_length",
                                    "min_length",
                                    "do_sample",
                                    "early_stopping",
                                    "num_beams",
                                    "num_beam_groups",
                                    "temperature",
                                    "top_k",
                                    "top_p",
                                    "typical_p",
                                    "repetition_penalty",
                                    "length_penalty",
                                    "no_repeat_ngram_size",
                                    "num_return_sequences",
                                    "bad_words_ids",
                                    "forced_bos_token_id",
                                    "forced_eos_token_id"};

// Keys of mixture-of-experts models: a dense model has none of them; the MoE families read the
// first eleven (read_moe) and refuse the rest (other MoE designs: DeepSeek's shared and
// fine-grained experts).
const char* const kMoeKeys[] = {"num_experts",
                                "num_local_experts",
                                "num_experts_per_tok",
                                "moe_intermediate_size",
                                "shared_expert_intermediate_size",
                                "decoder_sparse_step",
                                "mlp_only_layers",
                                "norm_topk_prob",
                                "output_router_logits",
                                "router_aux_loss_coef",
                                "router_jitter_noise",
                                "n_routed_experts",
                                "n_shared_experts",
                                "moe_layer_freq",
                                "first_k_dense_replace"};

const char* const kFamilies = "llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe";

bool moe_family(const std::string& family) {
  return family == "mixtral" || family == "qwen2_moe" || family == "qwen3_moe";
}
// The dense family whose attention and config keys a MoE family shares: Mixtral's attention is
// Mistral's, Qwen2-MoE's Qwen2's (q/k/v biases), Qwen3-MoE's Qwen3's (q/k norms).
std::string attention_family(const std::string& family) {
  if (family == "mixtral") return "mistral";
  if (family == "qwen2_moe") return "qwen2";
  if (family == "qwen3_moe") return "qwen3";
  return family;
}

// The defaults of transformers' config classes (LlamaConfig, MistralConfig, Qwen2Config,
// Qwen3Config) for the keys a file may leave out.
struct FamilyDefaults {
  std::optional<std::int64_t> kv_heads;  // none: = num_attention_heads
  std::int64_t max_positions;
  std::optional<std::int64_t> head_dim;  // Qwen3Config: 128
};
FamilyDefaults family_defaults(const std::string& family) {
  // MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig (transformers 5.25): no default head_dim.
  if (family == "mixtral") return {8, 4096 * 32, std::nullopt};
  if (family == "qwen2_moe") return {16, 32768, std::nullopt};
  if (family == "qwen3_moe") return {4, 32768, std::nullopt};
  if (family == "mistral") return {8, 4096 * 32, std::nullopt};
  if (family == "qwen2") return {32, 32768, std::nullopt};
  if (family == "qwen3") return {32, 32768, 128};
  return {std::nullopt, 2048, std::nullopt};
}

// The keys read, and those judged not to matter, so that the rest can be reported.
struct Keys {
  std::vector<std::string> used;
  std::vector<std::string> ignored;
  void use(const char* k) { used.push_back(k); }
};

std::string text_of(const json& v) {
  return v.is_number() ? v.dump() : json_kind(v);
}

// A number field of a rope dict (`where` is e.g. "rope_scaling"): finite, as a double.
double rope_number(const json& o, const char* key, const std::string& where,
                   const std::string& src) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null())
    throw InputError(src + ": " + where + "." + key + " is required by rope_type llama3");
  if (!it->is_number() || it->is_boolean())
    throw InputError(src + ": " + where + "." + key + " must be a number, got " + json_kind(*it));
  const double x = it->get<double>();
  if (!std::isfinite(x))
    throw InputError(src + ": " + where + "." + key + " must be finite, got " + it->dump());
  return x;
}

// rope_scaling (transformers 4.x) or rope_parameters (5.x): null or {"rope_type"|"type":
// "default"} is plain RoPE; "llama3" with its four parameters; anything else is refused.
// rope_parameters may also hold rope_theta, returned in `theta`.
RopeScaling parse_rope(const json& o, const std::string& where, const std::string& src,
                       std::int64_t max_positions, std::optional<double>& theta) {
  RopeScaling r;
  if (o.is_null()) return r;
  if (!o.is_object())
    throw InputError(src + ": " + where + " must be an object or null, got " + json_kind(o));
  std::optional<std::string> type;
  for (const char* k : {"rope_type", "type"}) {
    auto it = o.find(k);
    if (it == o.end() || it->is_null()) continue;
    if (!it->is_string())
      throw InputError(src + ": " + where + "." + k + " must be a string, got " + json_kind(*it));
    if (type && *type != it->get<std::string>())
      throw InputError(src + ": " + where + ".rope_type (\"" + clip(*type) + "\") and " + where +
                       ".type (\"" + clip(it->get<std::string>()) + "\") disagree");
    type = it->get<std::string>();
  }
  const std::string t = type.value_or("default");
  if (t != "default" && t != "llama3")
    throw InputError(src + ": " + where + ".rope_type \"" + clip(t) +
                     "\" is not supported (supported: default, i.e. none, and llama3)");
  std::vector<std::string> allowed = {"rope_type", "type", "rope_theta"};
  if (auto it = o.find("rope_theta"); it != o.end() && !it->is_null()) {
    if (!it->is_number() || it->is_boolean() || !std::isfinite(it->get<double>()) ||
        it->get<double>() <= 0)
      throw InputError(src + ": " + where + ".rope_theta must be a positive finite number, got " +
                       text_of(*it));
    theta = it->get<double>();
  }
  if (auto it = o.find("partial_rotary_factor"); it != o.end() && !it->is_null()) {
    if (!it->is_number() || it->is_boolean() || it->get<double>() != 1.0)
      throw InputError(src + ": " + where +
                       ".partial_rotary_factor must be 1 (RoPE over the whole head), got " +
                       text_of(*it));
  }
  allowed.push_back("partial_rotary_factor");
  if (t == "llama3") {
    r.kind = RopeScalingKind::llama3;
    r.factor = rope_number(o, "factor", where, src);
    r.low_freq_factor = rope_number(o, "low_freq_factor", where, src);
    r.high_freq_factor = rope_number(o, "high_freq_factor", where, src);
    // transformers falls back to max_position_embeddings when it is missing.
    r.original_max_positions =
        read_int(o, "original_max_position_embeddings", src + ": " + where, max_positions);
    const std::string who = src + ": " + where + ".";
    if (r.factor < 1) throw InputError(who + "factor must be >= 1, got " + o.at("factor").dump());
    if (r.low_freq_factor <= 0)
      throw InputError(who + "low_freq_factor must be positive, got " +
                       o.at("low_freq_factor").dump());
    if (r.high_freq_factor <= r.low_freq_factor)
      throw InputError(who + "high_freq_factor (" + o.at("high_freq_factor").dump() +
                       ") must be greater than low_freq_factor (" + o.at("low_freq_factor").dump() +
                       ")");
    for (const char* k :
         {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      allowed.push_back(k);
  }
  for (const auto& item : o.items()) {
    if (std::find(allowed.begin(), allowed.end(), item.key()) == allowed.end())
      throw InputError(src + ": " + where + "." + item.key() + " is not supported with rope_type " +
                       t + " (a parameter trainmem does not model)");
  }
  return r;
}

bool same_rope(const RopeScaling& a, const RopeScaling& b) {
  return a.kind == b.kind && a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor &&
         a.original_max_positions == b.original_max_positions;
}

// A non-negative number that must be 0 (dropout probabilities).
void require_zero(const json& j, const char* name, const std::string& src, Keys& keys,
                  const char* why) {
  const json* v = field(j, name);
  if (!v) return;
  if (!v->is_number() || v->is_boolean())
    throw InputError(src + ": " + name + " must be a number, got " + json_kind(*v));
  if (v->get<double>() != 0.0)
    throw InputError(src + ": " + name + " = " + v->dump() + " is not supported (" + why + ")");
  keys.ignored.push_back(name);
}

// model_type, checked: one of the dense families or the three MoE families; other MoE designs'
// keys refused.
std::string read_family(const json& j, const std::string& src) {
  const std::string supported = std::string("(supported: ") + kFamilies + ")";
  const json* type = field(j, "model_type");
  if (!type) throw InputError(src + ": missing required field model_type " + supported);
  if (!type->is_string())
    throw InputError(src + ": model_type must be a string " + supported + ", got " +
                     json_kind(*type));
  const std::string family = type->get<std::string>();
  if (family != "llama" && family != "mistral" && family != "qwen2" && family != "qwen3" &&
      !moe_family(family))
    throw InputError(src + ": model_type \"" + clip(family) + "\" is not supported " + supported);
  const bool moe = moe_family(family);
  for (std::size_t n = 0; n < std::size(kMoeKeys); ++n)
    if (field(j, kMoeKeys[n]) && (!moe || n >= 11))
      throw InputError(src + ": " + kMoeKeys[n] +
                       (moe ? " belongs to another mixture-of-experts design (shared or "
                              "fine-grained experts), which trainmem does not model; model_type " +
                                  family + " has no such key"
                            : " is a mixture-of-experts field, but model_type " + family +
                                  " is dense (use mixtral, qwen2_moe or qwen3_moe)") +
                       ", got " + text_of(*field(j, kMoeKeys[n])));

  return family;
}

// The sizes, the dtype, the activation and head_dim, with the family's defaults.
ModelConfig read_sizes(const json& j, const std::string& src, const std::string& family,
                       Keys& keys) {
  const FamilyDefaults defaults = family_defaults(family);

  ModelConfig c;
  c.name = src;
  c.family = family;
  for (const char* k : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                        "rms_norm_eps", "tie_word_embeddings", "hidden_act", "head_dim"})
    keys.use(k);
  c.vocab = read_int(j, "vocab_size", src, std::nullopt);
  c.hidden = read_int(j, "hidden_size", src, std::nullopt);
  c.intermediate = read_int(j, "intermediate_size", src, std::nullopt);
  c.layers = read_int(j, "num_hidden_layers", src, std::nullopt);
  c.heads = read_int(j, "num_attention_heads", src, std::nullopt);
  // Absent: the family's default; null: = num_attention_heads (as transformers).
  c.kv_heads =
      read_int(j, "num_key_value_heads", src,
               j.contains("num_key_value_heads") ? c.heads : defaults.kv_heads.value_or(c.heads));
  c.max_positions = read_int(j, "max_position_embeddings", src, defaults.max_positions);
  c.rms_eps = read_positive_double(j, "rms_norm_eps", src, 1e-6);
  c.tied_embeddings = read_bool(j, "tie_word_embeddings", src, false);
  for (const char* key : {"torch_dtype", "dtype"}) {  // transformers 5 writes "dtype"
    const json* td = field(j, key);
    if (!td) continue;
    std::optional<DType> d;
    if (td->is_string()) d = parse_dtype(td->get<std::string>());
    if (!d)
      throw InputError(src + ": " + key + " must be one of float32, float16, bfloat16, got " +
                       json_kind(*td));
    c.torch_dtype = d;
  }
  // Variants trainmem's model does not implement: refuse rather than miscount.
  if (const json* act = field(j, "hidden_act")) {
    if (!act->is_string() || act->get<std::string>() != "silu")
      throw InputError(src + ": hidden_act must be \"silu\" (SwiGLU), got " + json_kind(*act));
  }

  // head_dim: any family may set it apart from hidden/heads (Qwen3 does).
  std::optional<std::int64_t> head_dim = defaults.head_dim;
  if (const json* hd = field(j, "head_dim")) {
    if (!hd->is_number_integer() || hd->get<std::int64_t>() <= 0 || hd->get<std::int64_t>() % 2)
      throw InputError(src + ": head_dim must be a positive even integer, got " + text_of(*hd));
    head_dim = hd->get<std::int64_t>();
  }
  if (head_dim && (c.hidden % c.heads != 0 || c.hidden / c.heads != *head_dim))
    c.explicit_head_dim = *head_dim;

  return c;
}

// Biases, dropout, sliced projections, multimodal RoPE, quantization: what the model has, and
// the variants it does not implement refused rather than miscounted.
void read_variants(const json& j, const std::string& src, const std::string& family, Keys& keys,
                   ModelConfig& c) {
  // Biases. Qwen2Attention: q/k/v always have one, o_proj never; LLaMA, Mistral and Qwen3:
  // attention_bias puts one on all four, o_proj's included, which the model lacks.
  keys.use("mlp_bias");
  const bool attention_bias = read_bool(j, "attention_bias", src, false);
  const bool mlp_bias = read_bool(j, "mlp_bias", src, false);
  if (family == "qwen2") {
    c.qkv_bias = true;
    // Not a Qwen2Config key: Qwen2Attention's biases do not depend on it.
    keys.ignored.push_back("attention_bias");
  } else if (attention_bias) {
    throw InputError(src + ": attention_bias = true is not supported: " + family +
                     " then puts a bias on o_proj too, which trainmem's model does not have "
                     "(only qwen2's q/k/v biases are modelled)");
  }
  if (family != "qwen2") keys.use("attention_bias");
  if (mlp_bias)
    throw InputError(src + ": mlp_bias = true is not supported (the MLP has no biases)");
  c.qk_norm = family == "qwen3";

  require_zero(j, "attention_dropout", src, keys,
               "dropout keeps a mask per attention matrix; trainmem models no dropout");
  if (const json* tp = field(j, "pretraining_tp")) {
    if (!tp->is_number_integer() || tp->get<std::int64_t>() != 1)
      throw InputError(src +
                       ": pretraining_tp must be 1 (sliced projections are not modelled), got " +
                       text_of(*tp));
    keys.ignored.push_back("pretraining_tp");
  }
  if (const json* mrope = field(j, "use_mrope")) {
    if (!mrope->is_boolean())
      throw InputError(src + ": use_mrope must be true or false, got " + json_kind(*mrope));
    if (mrope->get<bool>())
      throw InputError(src + ": use_mrope = true is not supported (multimodal RoPE)");
    keys.ignored.push_back("use_mrope");
  }
  if (const json* q = field(j, "quantization_config"))
    throw InputError(src + ": quantization_config is not supported (quantized weights), got " +
                     json_kind(*q));
}

// RoPE: rope_theta and rope_scaling (4.x), or rope_parameters holding both (5.x).
void read_rope(const json& j, const std::string& src, Keys& keys, ModelConfig& c) {
  keys.use("rope_theta");
  keys.use("rope_scaling");
  keys.use("rope_parameters");
  std::optional<double> theta_top;
  if (field(j, "rope_theta")) theta_top = read_positive_double(j, "rope_theta", src, 10000.0);
  std::optional<double> theta_params, theta_scaling;
  RopeScaling from_params, from_scaling;
  if (const json* rp = field(j, "rope_parameters"))
    from_params = parse_rope(*rp, "rope_parameters", src, c.max_positions, theta_params);
  if (const json* rs = field(j, "rope_scaling"))
    from_scaling = parse_rope(*rs, "rope_scaling", src, c.max_positions, theta_scaling);
  if (theta_scaling)
    throw InputError(src +
                     ": rope_scaling.rope_theta: give rope_theta at the top level or in "
                     "rope_parameters");
  if (field(j, "rope_parameters") && field(j, "rope_scaling") &&
      !same_rope(from_params, from_scaling))
    throw InputError(src + ": rope_scaling and rope_parameters disagree (give one of them)");
  c.rope_scaling = field(j, "rope_parameters") ? from_params : from_scaling;
  if (theta_top && theta_params && *theta_top != *theta_params)
    throw InputError(src + ": rope_theta (" + field(j, "rope_theta")->dump() +
                     ") and rope_parameters.rope_theta disagree");
  c.rope_theta = theta_top ? *theta_top : theta_params.value_or(10000.0);
}

// Qwen2Config/Qwen3Config's sliding window.
void read_qwen_window(const json& j, const std::string& src, Keys& keys, ModelConfig& c) {
  // Qwen2Config/Qwen3Config: the window (sliding_window, default 4096) exists only with
  // use_sliding_window; layer l uses it when layer_types[l] is "sliding_attention", which
  // defaults to l >= max_window_layers (default 28).
  const bool use_window = read_bool(j, "use_sliding_window", src, false);
  keys.use("use_sliding_window");
  // Validated even when unused: a window <= 0 is an error either way.
  const std::int64_t given =
      j.contains("sliding_window")
          ? (field(j, "sliding_window") ? read_int(j, "sliding_window", src, std::nullopt) : 0)
          : 4096;
  std::int64_t window = 0;
  if (use_window) {
    keys.use("sliding_window");
    window = given;
  } else if (j.contains("sliding_window")) {
    keys.ignored.push_back("sliding_window");
  }
  std::optional<std::int64_t> max_window_layers;
  if (const json* mw = field(j, "max_window_layers")) {
    if (!mw->is_number_integer() || mw->get<std::int64_t>() < 0)
      throw InputError(src + ": max_window_layers must be a non-negative integer, got " +
                       text_of(*mw));
    max_window_layers = mw->get<std::int64_t>();
  }
  std::optional<std::int64_t> from;
  if (const json* lt = field(j, "layer_types")) {
    keys.use("layer_types");
    const std::string form =
        "layer_types must list num_hidden_layers entries of the form \"full_attention\"..., "
        "\"sliding_attention\"... (the sliding layers last)";
    if (!lt->is_array() || static_cast<std::int64_t>(lt->size()) != c.layers)
      throw InputError(src + ": " + form + ", got " +
                       (lt->is_array() ? std::to_string(lt->size()) + " entries" : json_kind(*lt)));
    std::int64_t first_sliding = c.layers;
    for (std::int64_t l = 0; l < c.layers; ++l) {
      const json& e = (*lt)[static_cast<std::size_t>(l)];
      const bool full = e.is_string() && e.get<std::string>() == "full_attention";
      const bool sliding = e.is_string() && e.get<std::string>() == "sliding_attention";
      if (!full && !sliding)
        throw InputError(src + ": " + form + ", entry " + std::to_string(l) + " is " +
                         json_kind(e));
      if (sliding && first_sliding == c.layers) first_sliding = l;
      if (full && first_sliding < l)
        throw InputError(src + ": " + form + ", entry " + std::to_string(l) +
                         " is full_attention after a sliding_attention");
    }
    if (first_sliding < c.layers && window == 0)
      throw InputError(src +
                       ": layer_types lists sliding_attention layers but no window is "
                       "set (use_sliding_window false or sliding_window null)");
    from = first_sliding;
    if (j.contains("max_window_layers")) keys.ignored.push_back("max_window_layers");
  } else if (window > 0) {
    keys.use("max_window_layers");
    from = max_window_layers.value_or(28);
  } else if (j.contains("max_window_layers")) {
    keys.ignored.push_back("max_window_layers");
  }
  if (window > 0 && from && *from < c.layers) {
    c.sliding_window = window;
    c.window_from_layer = *from;
  }
}

// The sliding window of each family (Mistral: every layer; Qwen: the last layers; LLaMA: none).
void read_window(const json& j, const std::string& src, const std::string& family, Keys& keys,
                 ModelConfig& c) {
  if (family == "mistral") {
    // MistralConfig: 4096 when absent, null for none; every layer uses it.
    keys.use("sliding_window");
    if (!j.contains("sliding_window"))
      c.sliding_window = 4096;
    else if (field(j, "sliding_window"))
      c.sliding_window = read_int(j, "sliding_window", src, std::nullopt);
    c.window_from_layer = 0;
    if (j.contains("layer_types")) {
      // MistralModel does not read layer_types (it warns and applies the window everywhere).
      keys.ignored.push_back("layer_types");
    }
  } else if (family == "qwen2" || family == "qwen3") {
    read_qwen_window(j, src, keys, c);
  } else {
    // LlamaConfig has no window: a sliding_window key would be ignored by transformers, and
    // trainmem does not guess.
    for (const char* k :
         {"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"})
      if (field(j, k))
        throw InputError(src + ": " + k +
                         " is not a llama config key (LlamaAttention has no "
                         "sliding window); use model_type mistral, qwen2 or qwen3");
  }
}

// The experts of a MoE family, with the defaults of transformers' MixtralConfig,
// Qwen2MoeConfig and Qwen3MoeConfig (5.25) for absent keys (docs/moe-plan.md, "Config keys").
void read_moe(const json& j, const std::string& src, const std::string& family, Keys& keys,
              ModelConfig& c) {
  const bool mixtral = family == "mixtral", qwen2 = family == "qwen2_moe";
  // Mixtral: num_local_experts (num_experts is its alias); Qwen: num_experts.
  const char* experts_key =
      mixtral && !j.contains("num_experts") ? "num_local_experts" : "num_experts";
  if (mixtral && field(j, "num_experts") && field(j, "num_local_experts") &&
      *field(j, "num_experts") != *field(j, "num_local_experts"))
    throw InputError(src + ": num_experts and num_local_experts disagree (give one of them)");
  if (mixtral) keys.use("num_local_experts");
  keys.use("num_experts");
  c.experts = read_int(j, experts_key, src, mixtral ? 8 : qwen2 ? 60 : 128);
  keys.use("num_experts_per_tok");
  c.experts_per_token = read_int(j, "num_experts_per_tok", src, mixtral ? 2 : qwen2 ? 4 : 8);
  if (c.experts_per_token > c.experts)
    throw InputError(src + ": num_experts_per_tok (" + std::to_string(c.experts_per_token) +
                     ") must be at most the number of experts (" + std::to_string(c.experts) + ")");
  keys.use("output_router_logits");
  c.output_router_logits = read_bool(j, "output_router_logits", src, false);
  // The auxiliary loss's weight (the config classes' default 0.001): no tensor depends on it
  // (docs/moe-plan.md, measured), the native step's loss and router gradients do when
  // output_router_logits adds the loss; without it the key changes nothing (listed as ignored).
  if (const json* coef = field(j, "router_aux_loss_coef")) {
    if (!coef->is_number() || coef->get<double>() < 0 || !std::isfinite(coef->get<double>()))
      throw InputError(src + ": router_aux_loss_coef must be a number >= 0, got " + coef->dump());
    c.router_aux_loss_coef = coef->get<double>();
    if (c.output_router_logits)
      keys.use("router_aux_loss_coef");
    else
      keys.ignored.push_back("router_aux_loss_coef");
  }
  if (mixtral) {
    c.expert_intermediate = c.intermediate;  // MixtralConfig: intermediate_size is the experts'
    c.norm_topk_prob = true;                 // MixtralSparseMoeBlock always renormalises
    require_zero(j, "router_jitter_noise", src, keys,
                 "jitter noise multiplies the router's input by random factors in training, "
                 "which keeps one more (T, h) tensor and routes at random; not modelled");
    return;
  }
  keys.use("moe_intermediate_size");
  c.expert_intermediate = read_int(j, "moe_intermediate_size", src, qwen2 ? 1408 : 768);
  if (qwen2) {
    keys.use("shared_expert_intermediate_size");
    c.shared_expert_intermediate = read_int(j, "shared_expert_intermediate_size", src, 5632);
  }
  keys.use("norm_topk_prob");
  c.norm_topk_prob = read_bool(j, "norm_topk_prob", src, false);
  keys.use("decoder_sparse_step");
  c.decoder_sparse_step = read_int(j, "decoder_sparse_step", src, 1);
  keys.use("mlp_only_layers");
  if (const json* mo = field(j, "mlp_only_layers")) {
    if (!mo->is_array())
      throw InputError(src + ": mlp_only_layers must be a list of layer indices, got " +
                       json_kind(*mo));
    for (const json& e : *mo) {
      if (!e.is_number_integer() || e.get<std::int64_t>() < 0 || e.get<std::int64_t>() >= c.layers)
        throw InputError(src + ": mlp_only_layers entries must be layer indices 0 to " +
                         std::to_string(c.layers - 1) + ", got " + text_of(e));
      c.mlp_only_layers.push_back(e.get<std::int64_t>());
    }
    std::sort(c.mlp_only_layers.begin(), c.mlp_only_layers.end());
    c.mlp_only_layers.erase(std::unique(c.mlp_only_layers.begin(), c.mlp_only_layers.end()),
                            c.mlp_only_layers.end());
  }
  if (read_bool(j, "use_sliding_window", src, false))
    throw InputError(src + ": use_sliding_window = true is not supported for model_type " + family +
                     " (a windowed MoE model was not measured)");
}

// Everything else: ignored when known not to matter, else reported as unrecognised.
void list_other_keys(const json& j, const std::string& src, const Keys& keys, ModelConfig& c) {
  for (const auto& item : j.items()) {
    const std::string& k = item.key();
    const bool is_ignored =
        std::find(keys.ignored.begin(), keys.ignored.end(), k) != keys.ignored.end() ||
        std::find(std::begin(kIgnoredKeys), std::end(kIgnoredKeys), k) != std::end(kIgnoredKeys);
    if (std::find(keys.used.begin(), keys.used.end(), k) != keys.used.end() && !is_ignored)
      continue;
    if (is_ignored) {
      c.ignored_fields.push_back(k);
    } else {
      c.ignored_fields.push_back(clip(k) + " (unrecognised)");
      spdlog::warn(
          "{}: config.json key {} is not one trainmem knows; ignored (check that it "
          "does not change the model)",
          src, clip(k));
    }
  }
}

}  // namespace

ModelConfig parse_hf_config(const std::string& json_text, const std::string& source) {
  const std::string src = source.empty() ? std::string("config.json") : source;
  const json j = parse_json_strict<json>(json_text, src);
  if (!j.is_object())
    throw InputError(src + ": expected a JSON object (a HuggingFace config.json), got " +
                     json_kind(j));

  const std::string family = read_family(j, src);
  const std::string attention = attention_family(family);
  Keys keys;
  keys.used = {"model_type"};
  ModelConfig c = read_sizes(j, src, family, keys);
  read_variants(j, src, attention, keys, c);
  read_rope(j, src, keys, c);
  if (family == "mixtral" && !j.contains("sliding_window")) {
    // MixtralConfig's window defaults to none (Mistral's to 4096).
    keys.use("sliding_window");
  } else {
    read_window(j, src, attention, keys, c);
  }
  if (moe_family(family)) read_moe(j, src, family, keys, c);
  c.validate();
  list_other_keys(j, src, keys, c);
  return c;
}

ModelConfig load_hf_config(const std::string& path) {
  return parse_hf_config(read_input_file(path, "--model", kMaxConfigBytes), path);
}

ModelConfig resolve_model(const std::string& name_or_path) {
  if (auto p = find_preset(name_or_path)) return *p;
  const std::string suffix = ".json";
  if (name_or_path.size() >= suffix.size() &&
      name_or_path.compare(name_or_path.size() - suffix.size(), suffix.size(), suffix) == 0)
    return load_hf_config(name_or_path);
  throw InputError("--model: unknown model '" + name_or_path + "'; presets: " +
                   join(preset_names()) + "; or a path to a HuggingFace config.json");
}

}  // namespace trainmem
