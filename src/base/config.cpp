// Model and run configuration: presets, validation, exact parameter counts, and the
// HuggingFace config.json loader. Field names in messages are the config.json keys, since
// those are the names users see.
#include "trainmem/config.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trainmem/checked.hpp"
#include "trainmem/error.hpp"

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
  if (c.hidden % c.heads != 0)
    throw InputError(who + "num_attention_heads (" + std::to_string(c.heads) +
                     ") must divide hidden_size (" + std::to_string(c.hidden) + ")");
  if (c.heads % c.kv_heads != 0)
    throw InputError(who + "num_key_value_heads (" + std::to_string(c.kv_heads) +
                     ") must divide num_attention_heads (" + std::to_string(c.heads) + ")");
  if (c.head_dim() % 2 != 0)
    throw InputError(
        who + "head dim hidden_size / num_attention_heads = " + std::to_string(c.head_dim()) +
        " must be even (rotate-half RoPE pairs the two halves)");
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
      // Tiny models for tests: small enough for the cpu backend and finite differences.
      m("tiny", 128, 64, 176, 2, 4, 4, 256, 1e-5, 1e4, false, none),
      m("tiny-gqa", 96, 48, 128, 2, 6, 2, 256, 1e-5, 1e4, false, none),
      m("tiny-tied", 64, 32, 96, 2, 2, 2, 128, 1e-5, 1e4, true, none),
      m("tiny-awkward", 71, 40, 104, 3, 5, 1, 128, 1e-5, 1e4, false, none),
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
  const auto qd = static_cast<std::uint64_t>(heads * head_dim());  // == h
  const auto kd = static_cast<std::uint64_t>(kv_dim());
  try {
    const std::uint64_t embed = checked_mul(V, h, "vocab_size * hidden_size");
    // q_proj (qd,h) + k_proj (kd,h) + v_proj (kd,h) + o_proj (h,qd)
    const std::uint64_t attn = checked_product({h, checked_add(checked_mul(2, qd), 2 * kd)},
                                               "hidden_size * attention widths");
    // gate_proj, up_proj (i,h) + down_proj (h,i)
    const std::uint64_t mlp = checked_product({3, i, h}, "intermediate_size * hidden_size");
    const std::uint64_t per_layer = checked_add(checked_add(attn, mlp), 2 * h, "per-layer params");
    std::uint64_t total = checked_mul(L, per_layer, "num_hidden_layers * per-layer parameters");
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
    throw OverflowError(label(*this) + ": parameter count " + std::to_string(params) +
                        " (from vocab_size, hidden_size, intermediate_size, num_hidden_layers) "
                        "is too large: 16 bytes per parameter overflows 63 bits");
  if (!std::isfinite(rms_eps) || rms_eps <= 0)
    throw InputError(label(*this) + ": rms_norm_eps must be a positive finite number");
  if (!std::isfinite(rope_theta) || rope_theta <= 0)
    throw InputError(label(*this) + ": rope_theta must be a positive finite number");
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

ModelConfig parse_hf_config(const std::string& json_text, const std::string& source) {
  const std::string src = source.empty() ? std::string("config.json") : source;
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw InputError(src + ": not valid JSON at byte " + std::to_string(e.byte) + ": " + e.what());
  }
  if (!j.is_object())
    throw InputError(src + ": expected a JSON object (a HuggingFace config.json), got " +
                     json_kind(j));

  const json* type = field(j, "model_type");
  if (!type) throw InputError(src + ": missing required field model_type (supported: llama)");
  if (!type->is_string())
    throw InputError(src + ": model_type must be a string (supported: llama), got " +
                     json_kind(*type));
  if (type->get<std::string>() != "llama")
    throw InputError(src + ": model_type \"" + type->get<std::string>() +
                     "\" is not supported (supported: llama)");

  ModelConfig c;
  c.name = src;
  c.vocab = read_int(j, "vocab_size", src, std::nullopt);
  c.hidden = read_int(j, "hidden_size", src, std::nullopt);
  c.intermediate = read_int(j, "intermediate_size", src, std::nullopt);
  c.layers = read_int(j, "num_hidden_layers", src, std::nullopt);
  c.heads = read_int(j, "num_attention_heads", src, std::nullopt);
  // Defaults as transformers' LlamaConfig.
  c.kv_heads = read_int(j, "num_key_value_heads", src, c.heads);
  c.max_positions = read_int(j, "max_position_embeddings", src, std::int64_t{2048});
  c.rms_eps = read_positive_double(j, "rms_norm_eps", src, 1e-6);
  c.rope_theta = read_positive_double(j, "rope_theta", src, 10000.0);
  c.tied_embeddings = read_bool(j, "tie_word_embeddings", src, false);
  if (const json* td = field(j, "torch_dtype")) {
    std::optional<DType> d;
    if (td->is_string()) d = parse_dtype(td->get<std::string>());
    if (!d)
      throw InputError(src + ": torch_dtype must be one of float32, float16, bfloat16, got " +
                       json_kind(*td));
    c.torch_dtype = d;
  }
  // Variants trainmem's model does not implement: refuse rather than miscount.
  if (const json* act = field(j, "hidden_act")) {
    if (!act->is_string() || act->get<std::string>() != "silu")
      throw InputError(src + ": hidden_act must be \"silu\" (SwiGLU), got " + json_kind(*act));
  }
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    if (read_bool(j, bias, src, false))
      throw InputError(src + ": " + bias + " = true is not supported (LLaMA has no biases)");
  }

  c.validate();
  if (const json* hd = field(j, "head_dim")) {
    if (!hd->is_number_integer() || hd->get<std::int64_t>() != c.head_dim())
      throw InputError(src + ": head_dim must equal hidden_size / num_attention_heads = " +
                       std::to_string(c.head_dim()) + ", got " +
                       (hd->is_number_integer() ? hd->dump() : json_kind(*hd)));
  }
  return c;
}

ModelConfig load_hf_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("--model: cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InputError("--model: error reading " + path);
  return parse_hf_config(text.str(), path);
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
