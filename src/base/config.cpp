// Model and run configuration: presets, validation, exact parameter counts (the HuggingFace
// config.json loader: hf_config.cpp). Field names in messages are the config.json keys, since
// those are the names users see.
#include "trainmem/base/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

namespace {

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
  if (c.experts < 0)
    throw InputError(who + "num_experts must be a positive integer, got " +
                     std::to_string(c.experts));
  if (c.moe()) {
    if (c.experts_per_token < 1 || c.experts_per_token > c.experts)
      throw InputError(who + "num_experts_per_tok must be 1 to the number of experts (" +
                       std::to_string(c.experts) + "), got " + std::to_string(c.experts_per_token));
    if (c.expert_intermediate <= 0)
      throw InputError(who +
                       "the experts' intermediate size (moe_intermediate_size) must be a "
                       "positive integer, got " +
                       std::to_string(c.expert_intermediate));
    if (c.shared_expert_intermediate < 0)
      throw InputError(who + "shared_expert_intermediate_size must be a positive integer, got " +
                       std::to_string(c.shared_expert_intermediate));
    if (c.decoder_sparse_step < 1)
      throw InputError(who + "decoder_sparse_step must be a positive integer, got " +
                       std::to_string(c.decoder_sparse_step));
    for (std::size_t n = 0; n < c.mlp_only_layers.size(); ++n) {
      const std::int64_t l = c.mlp_only_layers[n];
      if (l < 0 || l >= c.layers || (n > 0 && l <= c.mlp_only_layers[n - 1]))
        throw InputError(who + "mlp_only_layers must hold distinct layer indices 0 to " +
                         std::to_string(c.layers - 1) + " in ascending order, got " +
                         std::to_string(l) + " at position " + std::to_string(n));
    }
  }
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
  // Mixture of experts (docs/moe-plan.md): E experts, top-k, the experts' width and, for
  // qwen2_moe, the shared expert's; norm_topk_prob for Qwen (Mixtral always renormalises).
  auto moe = [&](ModelConfig c, const char* fam, std::int64_t E, std::int64_t k, std::int64_t im,
                 std::int64_t is, bool norm) {
    c = family(std::move(c), fam);
    c.experts = E;
    c.experts_per_token = k;
    c.expert_intermediate = im;
    c.shared_expert_intermediate = is;
    c.norm_topk_prob = norm;
    if (c.family == "qwen2_moe") c.qkv_bias = true;
    if (c.family == "qwen3_moe") c.qk_norm = true;
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
      // Mixtures of experts (tests/data/configs/<name>.json; parsed and counted, no step yet).
      moe(m("mixtral-8x7b", 32000, 4096, 14336, 32, 32, 8, 32768, 1e-5, 1e6, false, bf16),
          "mixtral", 8, 2, 14336, 0, true),
      moe(m("qwen1.5-moe-a2.7b", 151936, 2048, 5632, 24, 16, 16, 8192, 1e-6, 1e6, false, bf16),
          "qwen2_moe", 60, 4, 1408, 5632, false),
      [&] {
        ModelConfig c =
            moe(m("qwen3-30b-a3b", 151936, 2048, 6144, 48, 32, 4, 40960, 1e-6, 1e6, false, bf16),
                "qwen3_moe", 128, 8, 768, 0, true);
        c.explicit_head_dim = 128;  // 2048 / 32 = 64 otherwise
        return c;
      }(),
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
      moe(m("tiny-mixtral", 97, 64, 88, 2, 4, 2, 256, 1e-5, 1e6, false, none), "mixtral", 5, 2, 88,
          0, true),
      [&] {
        ModelConfig c = moe(m("tiny-qwen2-moe", 101, 64, 120, 6, 4, 4, 256, 1e-6, 1e6, false, none),
                            "qwen2_moe", 6, 2, 40, 72, false);
        c.decoder_sparse_step = 2;
        c.mlp_only_layers = {3};
        return c;
      }(),
      [&] {
        ModelConfig c = moe(m("tiny-qwen3-moe", 103, 64, 112, 2, 4, 2, 256, 1e-6, 1e6, false, none),
                            "qwen3_moe", 8, 2, 36, 0, true);
        c.explicit_head_dim = 24;
        return c;
      }(),
      // Used by the step benchmark: big enough that GEMMs dominate, small enough for a CPU.
      m("small-256", 2048, 256, 688, 4, 4, 4, 1024, 1e-5, 1e4, false, none),
  };
}

const std::vector<ModelConfig>& presets() {
  static const std::vector<ModelConfig> all = make_presets();
  return all;
}

}  // namespace

// ------------------------------------------------------------------ ModelConfig

bool ModelConfig::is_moe_layer(std::int64_t l) const {
  if (!moe()) return false;
  if (std::binary_search(mlp_only_layers.begin(), mlp_only_layers.end(), l)) return false;
  return (l + 1) % decoder_sparse_step == 0;
}

std::int64_t ModelConfig::moe_layer_count() const {
  std::int64_t n = 0;
  for (std::int64_t l = 0; l < layers && moe(); ++l) n += is_moe_layer(l);
  return n;
}

void require_dense(const ModelConfig& m, const std::string& what) {
  if (!m.moe()) return;
  std::string count;
  try {
    count = ", " + std::to_string(m.param_count()) + " parameters";
  } catch (const Error&) {
  }
  throw InputError("model_type " + m.family + " (" + label(m) + "): a mixture of experts (" +
                   std::to_string(m.experts) + " experts, top " +
                   std::to_string(m.experts_per_token) + ", " +
                   std::to_string(m.moe_layer_count()) + " of " + std::to_string(m.layers) +
                   " layers" + count + "); " + what +
                   " models dense layers only: of trainmem's profiles hf-eager and hf-sdpa model "
                   "the MoE classes, and native (one GPU) trainmem's own MoE layer "
                   "(`trainmem estimate`; docs/formulas.md, \"Mixture of experts\")");
}

namespace {
constexpr std::int64_t kInt32Max = 2147483647;
}  // namespace

void require_native_moe(const ModelConfig& m, const TrainConfig& t, const std::string& what) {
  if (!m.moe()) return;
  auto refuse = [&](const std::string& why) {
    throw InputError(what + ": " + m.name + " (model_type " + m.family + ", " +
                     std::to_string(m.experts) + " experts, top " +
                     std::to_string(m.experts_per_token) + ") " + why +
                     "; trainmem's own MoE layer models a router, routed experts and a shared "
                     "expert, trained in full (docs/native-plan.md, \"Mixture of experts\"); the "
                     "hf-eager and hf-sdpa profiles model this model (`trainmem estimate`)");
  };
  if (t.lora())
    refuse(
        "with --finetune lora|qlora: adapters on experts are not modelled in the native step "
        "yet");
  if (t.optimizer == Optimizer::lomo)
    refuse("with --optimizer lomo: not modelled for MoE layers yet");
  if (t.offload_activations) refuse("with --offload-activations: not modelled for MoE layers yet");
  // The routing's indices are int32: one row per token and choice.
  if (t.batch > 0 && t.seq > 0 &&
      (t.batch > kInt32Max / t.seq || t.batch * t.seq > kInt32Max / m.experts_per_token))
    throw InputError("--batch " + std::to_string(t.batch) + " x --seq " + std::to_string(t.seq) +
                     " x num_experts_per_tok " + std::to_string(m.experts_per_token) +
                     ": the routed rows exceed 2^31 - 1, the int32 indices of " + what);
  if (t.batch > 0 && t.seq > 0) (void)moe_rows(m, t);  // the capacity's rows fit int32 too
}

std::int64_t moe_capacity_of(const ModelConfig& m, double capacity_factor, std::int64_t tokens) {
  if (!m.moe() || capacity_factor <= 0.0) return 0;
  // Megatron's get_capacity: ceil((num_tokens / num_experts) * capacity_factor), num_tokens the
  // tokens·K choices, in double.
  const double rows = std::ceil((double(tokens) * double(m.experts_per_token) / double(m.experts)) *
                                capacity_factor);
  if (!(rows * double(m.experts) <= double(kInt32Max)))
    throw InputError("--capacity-factor " + number_text(capacity_factor) + ": " +
                     std::to_string(m.experts) + " experts x " + number_text(rows) +
                     " rows each exceed 2^31 - 1, the int32 indices of the expert-ordered rows");
  return static_cast<std::int64_t>(rows);
}

std::int64_t moe_capacity(const ModelConfig& m, const TrainConfig& t) {
  return moe_capacity_of(m, t.capacity_factor, t.batch * t.seq);
}

std::int64_t moe_rows_of(const ModelConfig& m, double capacity_factor, std::int64_t tokens) {
  const std::int64_t cap = moe_capacity_of(m, capacity_factor, tokens);
  return cap > 0 ? m.experts * cap : tokens * m.experts_per_token;
}

std::int64_t moe_rows(const ModelConfig& m, const TrainConfig& t) {
  return moe_rows_of(m, t.capacity_factor, t.batch * t.seq);
}

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
    // A MoE layer: the router (E, h), the experts' gate_up (E, 2·i_m, h) and down (E, h, i_m),
    // the shared expert's three (i_s, h) weights and its gate (1, h).
    const char* moe_name = "num_experts * moe_intermediate_size * hidden_size";
    std::uint64_t moe_mlp = 0;
    if (moe()) {
      const auto E = static_cast<std::uint64_t>(experts);
      const auto im = static_cast<std::uint64_t>(expert_intermediate);
      const auto is = static_cast<std::uint64_t>(shared_expert_intermediate);
      const std::uint64_t router = checked_mul(E, h, moe_name);
      const std::uint64_t routed = checked_product({3, E, im, h}, moe_name);
      const std::uint64_t shared =
          is > 0 ? checked_add(checked_product({3, is, h}, moe_name), h, moe_name) : 0;
      moe_mlp = checked_add(checked_add(router, routed, moe_name), shared, moe_name);
    }
    const std::uint64_t moe_layer =
        checked_add(checked_add(attn, moe_mlp, moe_name), 2 * h, moe_name);
    const auto Lm = static_cast<std::uint64_t>(moe_layer_count());
    std::uint64_t total = checked_add(
        checked_mul(
            L - Lm, per_layer,
            "num_hidden_layers * per-layer parameters (hidden_size, intermediate_size, head_dim)"),
        checked_mul(Lm, moe_layer, moe_name), "parameter count");
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
  if (moe())
    f.push_back("mixture of experts: " + std::to_string(experts) + " experts of width " +
                std::to_string(expert_intermediate) + ", top " + std::to_string(experts_per_token) +
                (norm_topk_prob ? " renormalised" : "") +
                (shared_expert_intermediate > 0
                     ? ", a shared expert of width " + std::to_string(shared_expert_intermediate)
                     : std::string()) +
                ", in " + std::to_string(moe_layer_count()) + " of " + std::to_string(layers) +
                " layers" + (output_router_logits ? ", router logits returned" : ""));
  if (rope_scaling.kind == RopeScalingKind::llama3)
    f.push_back("rope scaling llama3 (factor " + number_text(rope_scaling.factor) +
                ", low_freq_factor " + number_text(rope_scaling.low_freq_factor) +
                ", high_freq_factor " + number_text(rope_scaling.high_freq_factor) +
                ", original_max_position_embeddings " +
                std::to_string(rope_scaling.original_max_positions) + ")");
  return f;
}

// ------------------------------------------------------------------ enums

const char* quant_name(Quant q) {
  switch (q) {
    case Quant::none:
      return "none";
    case Quant::nf4:
      return "nf4";
    case Quant::fp4:
      return "fp4";
    case Quant::int8:
      return "int8";
  }
  return "?";
}

std::optional<Quant> parse_quant(const std::string& name) {
  for (Quant q : {Quant::none, Quant::nf4, Quant::fp4, Quant::int8})
    if (name == quant_name(q)) return q;
  return std::nullopt;
}

void check_quant_blocksize(std::int64_t bs) {
  if (bs < 64 || bs > 4096 || (bs & (bs - 1)) != 0)
    throw InputError("--quant-blocksize " + std::to_string(bs) +
                     ": bitsandbytes' 4-bit blocksizes are 64, 128, 256, 512, 1024, 2048, 4096");
}

const char* optimizer_name(Optimizer o) {
  switch (o) {
    case Optimizer::adamw:
      return "adamw";
    case Optimizer::sgd:
      return "sgd";
    case Optimizer::lomo:
      return "lomo";
    case Optimizer::adamw8bit:
      return "adamw8bit";
    case Optimizer::paged_adamw:
      return "paged-adamw";
    case Optimizer::paged_adamw8bit:
      return "paged-adamw8bit";
  }
  return "?";
}
const char* checkpointing_name(Checkpointing c) {
  switch (c) {
    case Checkpointing::none:
      return "none";
    case Checkpointing::full:
      return "full";
    case Checkpointing::selective:
      return "selective";
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
  if (s == "adamw8bit") return Optimizer::adamw8bit;
  if (s == "paged-adamw") return Optimizer::paged_adamw;
  if (s == "paged-adamw8bit") return Optimizer::paged_adamw8bit;
  return std::nullopt;
}
std::optional<Checkpointing> parse_checkpointing(const std::string& s) {
  if (s == "none") return Checkpointing::none;
  if (s == "full") return Checkpointing::full;
  if (s == "selective") return Checkpointing::selective;
  return std::nullopt;
}
std::optional<Attention> parse_attention(const std::string& s) {
  if (s == "eager") return Attention::eager;
  if (s == "flash") return Attention::flash;
  return std::nullopt;
}

bool TrainConfig::checkpointed(std::int64_t layer) const {
  if (checkpointing != Checkpointing::full) return false;
  const auto& l = checkpoint_layers.list;
  return l.empty() || std::binary_search(l.begin(), l.end(), layer);
}

std::int64_t TrainConfig::checkpointed_count(std::int64_t first, std::int64_t count) const {
  std::int64_t n = 0;
  for (std::int64_t j = first; j < first + count; ++j) n += checkpointed(j) ? 1 : 0;
  return n;
}

void TrainConfig::check_checkpoint_resolved(const std::string& where) const {
  if (checkpoint_layers.budget != 0)
    throw InputError("--checkpointing " + checkpoint_layers.spec + ": " + where +
                     " cannot pick the layers for a budget; give every:K or layers:LIST");
}

std::string layer_list_text(const std::vector<std::int64_t>& layers) {
  std::string out;
  for (std::size_t j = 0; j < layers.size();) {
    std::size_t e = j;
    while (e + 1 < layers.size() && layers[e + 1] == layers[e] + 1) ++e;
    if (!out.empty()) out += ",";
    if (e >= j + 2) {
      out += std::to_string(layers[j]) + "-" + std::to_string(layers[e]);
    } else {
      for (std::size_t k = j; k <= e; ++k) out += (k > j ? "," : "") + std::to_string(layers[k]);
    }
    j = e + 1;
  }
  return out;
}

std::string checkpointing_name(const TrainConfig& t) {
  const CheckpointLayers& c = t.checkpoint_layers;
  if (c.spec.empty()) return checkpointing_name(t.checkpointing);
  if (c.spec.rfind("budget:", 0) != 0) return c.spec;
  if (t.checkpointing == Checkpointing::none) return c.spec + " (no layer)";
  if (c.list.empty()) return c.spec + " (every layer)";
  return c.spec + " (layers " + layer_list_text(c.list) + ")";
}

void TrainConfig::validate() const {
  if (batch < 1) throw InputError("--batch must be >= 1, got " + std::to_string(batch));
  if (seq < 2)
    throw InputError("--seq must be >= 2 (the loss predicts the next token), got " +
                     std::to_string(seq));
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16)
    throw InputError(std::string("--dtype must be one of bf16, fp16, fp32, got ") +
                     dtype_name(dtype));
  if (lora_rank < 0 || lora_rank > (1 << 16))
    throw InputError("--lora-rank must be 1 to 65536, got " + std::to_string(lora_rank));
  if (lora_rank > 0 && (lora_targets == 0 || (lora_targets & ~0x7fu) != 0))
    throw InputError("--lora-targets: the LoRA step needs one or more of the seven projections");
  if (lora_rank > 0 && optimizer == Optimizer::lomo)
    throw InputError(
        "--optimizer lomo with --finetune lora: LOMO updates every weight inside the backward; "
        "the adapters train with adamw or sgd");
  if (lora_rank > 0 && offload_activations)
    throw InputError(
        "--offload-activations with --finetune lora: the LoRA step is not modelled with "
        "activation offload yet");
  if (!(capacity_factor == 0.0 || (std::isfinite(capacity_factor) && capacity_factor > 0.0)))
    throw InputError(
        "--capacity-factor must be a number C > 0 (rows per expert ⌈(b·s·K/E)·C⌉), "
        "got " +
        number_text(capacity_factor));
  if (!(lora_dropout >= 0.0 && lora_dropout < 1.0))
    throw InputError("--lora-dropout must be a number p with 0 <= p < 1, got " +
                     std::to_string(lora_dropout));
  if (float(lora_dropout) >= 1.0f)  // the mask compares in float: p would drop everything
    throw InputError("--lora-dropout must be below 1 in float, got " +
                     std::to_string(lora_dropout));
  if (lora_dropout > 0.0 && lora_rank == 0)
    throw InputError(
        "--lora-dropout: dropout applies to LoRA adapters; give --finetune lora|qlora");
  if (quant != Quant::none && lora_rank == 0)
    throw InputError(
        "--quant: a quantized base is frozen and trains through LoRA adapters only; give "
        "--finetune qlora (a 4-bit base) or --finetune lora --quant int8");
  if (quant4()) check_quant_blocksize(quant_blocksize);
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

}  // namespace trainmem
