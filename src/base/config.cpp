// Model and run configuration: presets, validation, exact parameter counts, and the
// HuggingFace config.json loader. Field names in messages are the config.json keys, since
// those are the names users see.
#include "trainmem/base/config.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trainmem/base/checked.hpp"
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

std::string label(const ModelConfig& c) {
  return c.name.empty() ? "model" : c.name;
}

// A number as %g writes it (32, 0.5, 1e-05).
std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Positivity and divisibility: what param_count() needs before it may divide.
void check_shape(const ModelConfig& c) {
  const std::string who = label(c) + ": ";
  const struct {
    const char* field;
    std::int64_t value;
  } sizes[] = {{"vocab_size", c.vocab},
               {"hidden_size", c.hidden},
               {"intermediate_size", c.intermediate},
               {"num_hidden_layers", c.layers},
               {"num_attention_heads", c.heads},
               {"num_key_value_heads", c.kv_heads},
               {"max_position_embeddings", c.max_positions}};
  for (const auto& s : sizes) {
    if (s.value <= 0)
      throw InputError(who + s.field + " must be a positive integer, got " +
                       std::to_string(s.value));
  }
  // Every command's run time is linear in the layer count (the trace books each layer's tensors,
  // the estimate lists them); no published model is near this bound (LLaMA-3.1 405B: 126).
  if (c.layers > kMaxLayers)
    throw InputError(who + "num_hidden_layers must be at most " + std::to_string(kMaxLayers) +
                     ", got " + std::to_string(c.layers));
  if (c.explicit_head_dim < 0)
    throw InputError(who + "head_dim must be a positive even integer, got " +
                     std::to_string(c.explicit_head_dim));
  if (c.explicit_head_dim == 0 && c.hidden % c.heads != 0)
    throw InputError(who + "num_attention_heads (" + std::to_string(c.heads) +
                     ") must divide hidden_size (" + std::to_string(c.hidden) + ")");
  if (c.heads % c.kv_heads != 0)
    throw InputError(who + "num_key_value_heads (" + std::to_string(c.kv_heads) +
                     ") must divide num_attention_heads (" + std::to_string(c.heads) + ")");
  if (c.explicit_head_dim > 0 && c.explicit_head_dim % 2 != 0)
    throw InputError(who + "head_dim (" + std::to_string(c.explicit_head_dim) +
                     ") must be a positive even integer (rotate-half RoPE pairs the two halves)");
  if (c.head_dim() % 2 != 0)
    throw InputError(
        who + "head dim hidden_size / num_attention_heads = " + std::to_string(c.head_dim()) +
        " must be even (rotate-half RoPE pairs the two halves)");
  if (c.sliding_window < 0)
    throw InputError(who + "sliding_window must be a positive integer (or null), got " +
                     std::to_string(c.sliding_window));
  if (c.window_from_layer < 0)
    throw InputError(who + "window_from_layer (max_window_layers) must be >= 0, got " +
                     std::to_string(c.window_from_layer));
}

std::vector<ModelConfig> make_presets() {
  // name, V, h, i, L, a, k, max, eps, theta, tied, torch_dtype (as in the published configs)
  auto m = [](const char* name, std::int64_t V, std::int64_t h, std::int64_t i, std::int64_t L,
              std::int64_t a, std::int64_t k, std::int64_t max, double eps, double theta, bool tied,
              std::optional<DType> td) {
    ModelConfig c;
    c.name = name;
    c.vocab = V;
    c.hidden = h;
    c.intermediate = i;
    c.layers = L;
    c.heads = a;
    c.kv_heads = k;
    c.max_positions = max;
    c.rms_eps = eps;
    c.rope_theta = theta;
    c.tied_embeddings = tied;
    c.torch_dtype = td;
    return c;
  };
  // The families' departures from LLaMA, set on a preset made by m().
  auto family = [](ModelConfig c, const char* fam) {
    c.family = fam;
    return c;
  };
  auto qwen2 = [&](ModelConfig c) {
    c = family(std::move(c), "qwen2");
    c.qkv_bias = true;
    return c;
  };
  auto qwen3 = [&](ModelConfig c, std::int64_t head_dim) {
    c = family(std::move(c), "qwen3");
    c.qk_norm = true;
    // Stored only when it departs from h/a, as the loader does.
    if (c.hidden % c.heads != 0 || c.hidden / c.heads != head_dim) c.explicit_head_dim = head_dim;
    return c;
  };
  auto window = [](ModelConfig c, std::int64_t w, std::int64_t from) {
    c.sliding_window = w;
    c.window_from_layer = from;
    return c;
  };
  auto llama3_rope = [](ModelConfig c, double factor, double low, double high,
                        std::int64_t original) {
    c.rope_scaling.kind = RopeScalingKind::llama3;
    c.rope_scaling.factor = factor;
    c.rope_scaling.low_freq_factor = low;
    c.rope_scaling.high_freq_factor = high;
    c.rope_scaling.original_max_positions = original;
    return c;
  };
  const auto f16 = std::optional<DType>(DType::f16);
  const auto bf16 = std::optional<DType>(DType::bf16);
  const auto none = std::optional<DType>();
  return {
      m("llama-7b", 32000, 4096, 11008, 32, 32, 32, 2048, 1e-6, 1e4, false, f16),
      m("llama-13b", 32000, 5120, 13824, 40, 40, 40, 2048, 1e-6, 1e4, false, f16),
      m("llama-33b", 32000, 6656, 17920, 60, 52, 52, 2048, 1e-6, 1e4, false, f16),
      m("llama-65b", 32000, 8192, 22016, 80, 64, 64, 2048, 1e-5, 1e4, false, f16),
      m("llama2-7b", 32000, 4096, 11008, 32, 32, 32, 4096, 1e-5, 1e4, false, f16),
      m("llama2-13b", 32000, 5120, 13824, 40, 40, 40, 4096, 1e-5, 1e4, false, f16),
      m("llama2-70b", 32000, 8192, 28672, 80, 64, 8, 4096, 1e-5, 1e4, false, f16),
      m("llama3-8b", 128256, 4096, 14336, 32, 32, 8, 8192, 1e-5, 500000.0, false, bf16),
      // The families of issue 16 (tests/data/configs/<name>.json are their config.json files).
      llama3_rope(
          m("llama3.2-1b", 128256, 2048, 8192, 16, 32, 8, 131072, 1e-5, 500000.0, true, bf16), 32.0,
          1.0, 4.0, 8192),
      window(family(m("mistral-7b", 32000, 4096, 14336, 32, 32, 8, 32768, 1e-5, 1e4, false, bf16),
                    "mistral"),
             4096, 0),
      // Qwen2/2.5 ship use_sliding_window false: no window.
      qwen2(m("qwen2-7b", 152064, 3584, 18944, 28, 28, 4, 131072, 1e-6, 1e6, false, bf16)),
      qwen2(m("qwen2.5-0.5b", 151936, 896, 4864, 24, 14, 2, 32768, 1e-6, 1e6, true, bf16)),
      qwen2(m("qwen2.5-7b", 152064, 3584, 18944, 28, 28, 4, 131072, 1e-6, 1e6, false, bf16)),
      qwen3(m("qwen3-0.6b", 151936, 1024, 3072, 28, 16, 8, 40960, 1e-6, 1e6, true, bf16), 128),
      qwen3(m("qwen3-8b", 151936, 4096, 12288, 36, 32, 8, 40960, 1e-6, 1e6, false, bf16), 128),
      // Tiny models for tests: small enough for the cpu backend and finite differences.
      m("tiny", 128, 64, 176, 2, 4, 4, 256, 1e-5, 1e4, false, none),
      m("tiny-gqa", 96, 48, 128, 2, 6, 2, 256, 1e-5, 1e4, false, none),
      m("tiny-tied", 64, 32, 96, 2, 2, 2, 128, 1e-5, 1e4, true, none),
      m("tiny-awkward", 71, 40, 104, 3, 5, 1, 128, 1e-5, 1e4, false, none),
      window(
          family(m("tiny-mistral", 96, 48, 128, 2, 6, 2, 256, 1e-5, 1e4, false, none), "mistral"),
          5, 0),
      window(qwen2(m("tiny-qwen2", 96, 48, 128, 2, 6, 2, 256, 1e-6, 1e6, true, none)), 6, 1),
      qwen3(m("tiny-qwen3", 96, 48, 128, 2, 4, 2, 256, 1e-6, 1e6, false, none), 16),
      llama3_rope(m("tiny-llama3", 96, 48, 128, 2, 6, 2, 256, 1e-5, 5e5, true, none), 8.0, 1.0, 4.0,
                  16),
      // Used by the step benchmark: big enough that GEMMs dominate, small enough for a CPU.
      m("small-256", 2048, 256, 688, 4, 4, 4, 1024, 1e-5, 1e4, false, none),
  };
}

const std::vector<ModelConfig>& presets() {
  static const std::vector<ModelConfig> all = make_presets();
  return all;
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

}  // namespace

// ------------------------------------------------------------------ ModelConfig

std::uint64_t ModelConfig::param_count() const {
  check_shape(*this);
  const auto V = static_cast<std::uint64_t>(vocab);
  const auto h = static_cast<std::uint64_t>(hidden);
  const auto i = static_cast<std::uint64_t>(intermediate);
  const auto L = static_cast<std::uint64_t>(layers);
  const auto d = static_cast<std::uint64_t>(head_dim());
  try {
    const char* widths_name =
        "hidden_size * (num_attention_heads + num_key_value_heads) * head_dim";
    const auto qd = checked_mul(static_cast<std::uint64_t>(heads), d, widths_name);
    const auto kd = checked_mul(static_cast<std::uint64_t>(kv_heads), d, widths_name);
    // q_proj (qd,h) + k_proj (kd,h) + v_proj (kd,h) + o_proj (h,qd)
    const std::uint64_t widths = checked_add(qd, kd, widths_name);
    const std::uint64_t embed = checked_mul(V, h, "vocab_size * hidden_size");
    std::uint64_t attn = checked_product({2, h, widths}, widths_name);
    // q_proj, k_proj, v_proj biases (qd + 2·kd <= widths·2 <= attn: no overflow before the add)
    if (qkv_bias) attn = checked_add(attn, qd + 2 * kd, widths_name);
    if (qk_norm) attn = checked_add(attn, 2 * d, "q_norm, k_norm (2 * head_dim)");
    // gate_proj, up_proj (i,h) + down_proj (h,i)
    const std::uint64_t mlp = checked_product({3, i, h}, "intermediate_size * hidden_size");
    const std::uint64_t per_layer = checked_add(checked_add(attn, mlp), 2 * h, "per-layer params");
    std::uint64_t total = checked_mul(
        L, per_layer,
        "num_hidden_layers * per-layer parameters (hidden_size, intermediate_size, head_dim)");
    total = checked_add(total, embed, "parameter count");
    total = checked_add(total, h, "parameter count");  // final norm
    if (!tied_embeddings) total = checked_add(total, embed, "parameter count (lm_head)");
    return total;
  } catch (const OverflowError& e) {
    throw OverflowError(label(*this) + ": " + e.what());
  }
}

void ModelConfig::validate() const {
  check_shape(*this);
  const std::uint64_t params = param_count();
  // The largest per-parameter footprint trainmem models: fp32 weights + fp32 gradients +
  // AdamW m and v = 16 bytes (mixed precision is also 2 + 2 + 12 = 16). Every byte count of
  // the persistent state must fit in a signed 64-bit integer.
  std::uint64_t bytes;
  if (__builtin_mul_overflow(params, std::uint64_t{16}, &bytes) ||
      bytes > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    throw OverflowError(
        label(*this) + ": parameter count " + std::to_string(params) +
        " (from vocab_size, hidden_size, intermediate_size, num_hidden_layers, head_dim) "
        "is too large: 16 bytes per parameter overflows 63 bits");
  if (!std::isfinite(rms_eps) || rms_eps <= 0)
    throw InputError(label(*this) + ": rms_norm_eps must be a positive finite number");
  if (!std::isfinite(rope_theta) || rope_theta <= 0)
    throw InputError(label(*this) + ": rope_theta must be a positive finite number");
  if (rope_scaling.kind == RopeScalingKind::llama3) {
    const RopeScaling& r = rope_scaling;
    const std::string who = label(*this) + ": rope_scaling.";
    if (!std::isfinite(r.factor) || r.factor < 1)
      throw InputError(who + "factor must be a finite number >= 1, got " + number_text(r.factor));
    if (!std::isfinite(r.low_freq_factor) || r.low_freq_factor <= 0)
      throw InputError(who + "low_freq_factor must be a positive finite number, got " +
                       number_text(r.low_freq_factor));
    if (!std::isfinite(r.high_freq_factor) || r.high_freq_factor <= r.low_freq_factor)
      throw InputError(who + "high_freq_factor (" + number_text(r.high_freq_factor) +
                       ") must be a finite number greater than low_freq_factor (" +
                       number_text(r.low_freq_factor) + ")");
    if (r.original_max_positions <= 0)
      throw InputError(who + "original_max_position_embeddings must be a positive integer, got " +
                       std::to_string(r.original_max_positions));
  }
}

std::vector<std::string> ModelConfig::features() const {
  std::vector<std::string> f;
  if (explicit_head_dim > 0)
    f.push_back("head_dim " + std::to_string(explicit_head_dim) +
                " (hidden_size / num_attention_heads = " +
                number_text(double(hidden) / double(heads)) + ")");
  if (qkv_bias) f.push_back("q/k/v biases");
  if (qk_norm) f.push_back("q/k RMSNorm per head (q_norm, k_norm)");
  if (sliding_window > 0 && window_from_layer < layers)
    f.push_back("sliding window " + std::to_string(sliding_window) +
                (window_from_layer == 0 ? std::string(" in every layer")
                                        : " from layer " + std::to_string(window_from_layer)));
  if (rope_scaling.kind == RopeScalingKind::llama3)
    f.push_back("rope scaling llama3 (factor " + number_text(rope_scaling.factor) +
                ", low_freq_factor " + number_text(rope_scaling.low_freq_factor) +
                ", high_freq_factor " + number_text(rope_scaling.high_freq_factor) +
                ", original_max_position_embeddings " +
                std::to_string(rope_scaling.original_max_positions) + ")");
  return f;
}

// ------------------------------------------------------------------ enums

const char* optimizer_name(Optimizer o) {
  switch (o) {
    case Optimizer::adamw:
      return "adamw";
    case Optimizer::sgd:
      return "sgd";
    case Optimizer::lomo:
      return "lomo";
  }
  return "?";
}
const char* checkpointing_name(Checkpointing c) {
  switch (c) {
    case Checkpointing::none:
      return "none";
    case Checkpointing::full:
      return "full";
  }
  return "?";
}
const char* attention_name(Attention a) {
  switch (a) {
    case Attention::eager:
      return "eager";
    case Attention::flash:
      return "flash";
  }
  return "?";
}
std::optional<Optimizer> parse_optimizer(const std::string& s) {
  if (s == "adamw") return Optimizer::adamw;
  if (s == "sgd") return Optimizer::sgd;
  if (s == "lomo") return Optimizer::lomo;
  return std::nullopt;
}
std::optional<Checkpointing> parse_checkpointing(const std::string& s) {
  if (s == "none") return Checkpointing::none;
  if (s == "full") return Checkpointing::full;
  return std::nullopt;
}
std::optional<Attention> parse_attention(const std::string& s) {
  if (s == "eager") return Attention::eager;
  if (s == "flash") return Attention::flash;
  return std::nullopt;
}

void TrainConfig::validate() const {
  if (batch < 1) throw InputError("--batch must be >= 1, got " + std::to_string(batch));
  if (seq < 2)
    throw InputError("--seq must be >= 2 (the loss predicts the next token), got " +
                     std::to_string(seq));
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16)
    throw InputError(std::string("--dtype must be one of bf16, fp16, fp32, got ") +
                     dtype_name(dtype));
}

// ------------------------------------------------------------------ presets

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& p : presets()) names.push_back(p.name);
  return names;
}

std::optional<ModelConfig> find_preset(const std::string& name) {
  for (const auto& p : presets())
    if (p.name == name) return p;
  return std::nullopt;
}

// ------------------------------------------------------------------ config.json

namespace {

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

// Keys of mixture-of-experts models: a dense model has none of them.
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

const char* const kFamilies = "llama, mistral, qwen2, qwen3";

// The defaults of transformers' config classes (LlamaConfig, MistralConfig, Qwen2Config,
// Qwen3Config) for the keys a file may leave out.
struct FamilyDefaults {
  std::optional<std::int64_t> kv_heads;  // none: = num_attention_heads
  std::int64_t max_positions;
  std::optional<std::int64_t> head_dim;  // Qwen3Config: 128
};
FamilyDefaults family_defaults(const std::string& family) {
  if (family == "mistral") return {8, 4096 * 32, std::nullopt};
  if (family == "qwen2") return {32, 32768, std::nullopt};
  if (family == "qwen3") return {32, 32768, 128};
  return {std::nullopt, 2048, std::nullopt};
}

// The keys read, and those judged not to matter, so that the rest can be reported.
struct Keys {
  std::vector<std::string> used;
  std::vector<std::string> ignored;
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

}  // namespace

ModelConfig parse_hf_config(const std::string& json_text, const std::string& source) {
  const std::string src = source.empty() ? std::string("config.json") : source;
  const json j = parse_json_strict<json>(json_text, src);
  if (!j.is_object())
    throw InputError(src + ": expected a JSON object (a HuggingFace config.json), got " +
                     json_kind(j));

  const std::string supported = std::string("(supported: ") + kFamilies + ")";
  const json* type = field(j, "model_type");
  if (!type) throw InputError(src + ": missing required field model_type " + supported);
  if (!type->is_string())
    throw InputError(src + ": model_type must be a string " + supported + ", got " +
                     json_kind(*type));
  const std::string family = type->get<std::string>();
  if (family == "mixtral" || family == "qwen2_moe" || family == "qwen3_moe")
    throw InputError(src + ": model_type \"" + clip(family) +
                     "\" is a mixture of experts, which trainmem does not model " + supported);
  if (family != "llama" && family != "mistral" && family != "qwen2" && family != "qwen3")
    throw InputError(src + ": model_type \"" + clip(family) + "\" is not supported " + supported);
  const bool qwen = family == "qwen2" || family == "qwen3";
  for (const char* k : kMoeKeys)
    if (field(j, k))
      throw InputError(src + ": " + k +
                       " is a mixture-of-experts field, which trainmem does not model (dense "
                       "models only), got " +
                       text_of(*field(j, k)));

  Keys keys;
  keys.used = {"model_type"};
  auto use = [&](const char* k) { keys.used.push_back(k); };
  const FamilyDefaults defaults = family_defaults(family);

  ModelConfig c;
  c.name = src;
  c.family = family;
  for (const char* k : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                        "rms_norm_eps", "tie_word_embeddings", "hidden_act", "head_dim"})
    use(k);
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

  // Biases. Qwen2Attention: q/k/v always have one, o_proj never; LLaMA, Mistral and Qwen3:
  // attention_bias puts one on all four, o_proj's included, which the model lacks.
  use("mlp_bias");
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
  if (family != "qwen2") use("attention_bias");
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

  // RoPE: rope_theta and rope_scaling (4.x), or rope_parameters holding both (5.x).
  use("rope_theta");
  use("rope_scaling");
  use("rope_parameters");
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

  // Sliding window.
  if (family == "mistral") {
    // MistralConfig: 4096 when absent, null for none; every layer uses it.
    use("sliding_window");
    if (!j.contains("sliding_window"))
      c.sliding_window = 4096;
    else if (field(j, "sliding_window"))
      c.sliding_window = read_int(j, "sliding_window", src, std::nullopt);
    c.window_from_layer = 0;
    if (j.contains("layer_types")) {
      // MistralModel does not read layer_types (it warns and applies the window everywhere).
      keys.ignored.push_back("layer_types");
    }
  } else if (qwen) {
    // Qwen2Config/Qwen3Config: the window (sliding_window, default 4096) exists only with
    // use_sliding_window; layer l uses it when layer_types[l] is "sliding_attention", which
    // defaults to l >= max_window_layers (default 28).
    const bool use_window = read_bool(j, "use_sliding_window", src, false);
    use("use_sliding_window");
    // Validated even when unused: a window <= 0 is an error either way.
    const std::int64_t given =
        j.contains("sliding_window")
            ? (field(j, "sliding_window") ? read_int(j, "sliding_window", src, std::nullopt) : 0)
            : 4096;
    std::int64_t window = 0;
    if (use_window) {
      use("sliding_window");
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
      use("layer_types");
      const std::string form =
          "layer_types must list num_hidden_layers entries of the form \"full_attention\"..., "
          "\"sliding_attention\"... (the sliding layers last)";
      if (!lt->is_array() || static_cast<std::int64_t>(lt->size()) != c.layers)
        throw InputError(
            src + ": " + form + ", got " +
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
      use("max_window_layers");
      from = max_window_layers.value_or(28);
    } else if (j.contains("max_window_layers")) {
      keys.ignored.push_back("max_window_layers");
    }
    if (window > 0 && from && *from < c.layers) {
      c.sliding_window = window;
      c.window_from_layer = *from;
    }
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
  c.validate();

  // Everything else: ignored when known not to matter, else reported as unrecognised.
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
