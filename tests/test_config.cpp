// Presets, exact parameter counts against published numbers, validation, enum names.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "trainmem/base/config.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

ModelConfig preset(const std::string& name) {
  auto p = find_preset(name);
  EXPECT_TRUE(p.has_value()) << name;
  return p.value_or(ModelConfig{});
}

struct Shape {
  const char* name;
  std::int64_t V, h, i, L, a, k, max;
  double eps, theta;
  bool tied;
};

// The published configurations (HuggingFace config.json of each model).
const Shape kShapes[] = {
    {"llama-7b", 32000, 4096, 11008, 32, 32, 32, 2048, 1e-6, 1e4, false},
    {"llama-13b", 32000, 5120, 13824, 40, 40, 40, 2048, 1e-6, 1e4, false},
    {"llama-33b", 32000, 6656, 17920, 60, 52, 52, 2048, 1e-6, 1e4, false},
    {"llama-65b", 32000, 8192, 22016, 80, 64, 64, 2048, 1e-5, 1e4, false},
    {"llama2-7b", 32000, 4096, 11008, 32, 32, 32, 4096, 1e-5, 1e4, false},
    {"llama2-13b", 32000, 5120, 13824, 40, 40, 40, 4096, 1e-5, 1e4, false},
    {"llama2-70b", 32000, 8192, 28672, 80, 64, 8, 4096, 1e-5, 1e4, false},
    {"llama3-8b", 128256, 4096, 14336, 32, 32, 8, 8192, 1e-5, 500000.0, false},
    {"llama3.2-1b", 128256, 2048, 8192, 16, 32, 8, 131072, 1e-5, 500000.0, true},
    {"mistral-7b", 32000, 4096, 14336, 32, 32, 8, 32768, 1e-5, 1e4, false},
    {"qwen2-7b", 152064, 3584, 18944, 28, 28, 4, 131072, 1e-6, 1e6, false},
    {"qwen2.5-0.5b", 151936, 896, 4864, 24, 14, 2, 32768, 1e-6, 1e6, true},
    {"qwen2.5-7b", 152064, 3584, 18944, 28, 28, 4, 131072, 1e-6, 1e6, false},
    {"qwen3-0.6b", 151936, 1024, 3072, 28, 16, 8, 40960, 1e-6, 1e6, true},
    {"qwen3-8b", 151936, 4096, 12288, 36, 32, 8, 40960, 1e-6, 1e6, false},
    {"tiny", 128, 64, 176, 2, 4, 4, 256, 1e-5, 1e4, false},
    {"tiny-gqa", 96, 48, 128, 2, 6, 2, 256, 1e-5, 1e4, false},
    {"tiny-tied", 64, 32, 96, 2, 2, 2, 128, 1e-5, 1e4, true},
    {"tiny-awkward", 71, 40, 104, 3, 5, 1, 128, 1e-5, 1e4, false},
    {"tiny-mistral", 96, 48, 128, 2, 6, 2, 256, 1e-5, 1e4, false},
    {"tiny-qwen2", 96, 48, 128, 2, 6, 2, 256, 1e-6, 1e6, true},
    {"tiny-qwen3", 96, 48, 128, 2, 4, 2, 256, 1e-6, 1e6, false},
    {"tiny-llama3", 96, 48, 128, 2, 6, 2, 256, 1e-5, 5e5, true},
    {"small-256", 2048, 256, 688, 4, 4, 4, 1024, 1e-5, 1e4, false},
    {"mixtral-8x7b", 32000, 4096, 14336, 32, 32, 8, 32768, 1e-5, 1e6, false},
    {"qwen1.5-moe-a2.7b", 151936, 2048, 5632, 24, 16, 16, 8192, 1e-6, 1e6, false},
    {"qwen3-30b-a3b", 151936, 2048, 6144, 48, 32, 4, 40960, 1e-6, 1e6, false},
    {"tiny-mixtral", 97, 64, 88, 2, 4, 2, 256, 1e-5, 1e6, false},
    {"tiny-qwen2-moe", 101, 64, 120, 6, 4, 4, 256, 1e-6, 1e6, false},
    {"tiny-qwen3-moe", 103, 64, 112, 2, 4, 2, 256, 1e-6, 1e6, false},
};

// The family features of each preset (the published configs; the tiny ones as issue 16
// fixed them): family, head_dim, q/k/v biases, q/k norm, window and its first layer, and
// llama3 rope scaling (factor, low, high, original; factor 0: none).
struct Family {
  const char* name;
  const char* family;
  std::int64_t head_dim;
  bool qkv_bias, qk_norm;
  std::int64_t window, from;
  double factor, low, high;
  std::int64_t original;
};
const Family kFamilies[] = {
    {"llama3-8b", "llama", 128, false, false, 0, 0, 0, 0, 0, 0},
    {"llama3.2-1b", "llama", 64, false, false, 0, 0, 32, 1, 4, 8192},
    {"mistral-7b", "mistral", 128, false, false, 4096, 0, 0, 0, 0, 0},
    {"qwen2-7b", "qwen2", 128, true, false, 0, 0, 0, 0, 0, 0},
    {"qwen2.5-0.5b", "qwen2", 64, true, false, 0, 0, 0, 0, 0, 0},
    {"qwen2.5-7b", "qwen2", 128, true, false, 0, 0, 0, 0, 0, 0},
    {"qwen3-0.6b", "qwen3", 128, false, true, 0, 0, 0, 0, 0, 0},
    {"qwen3-8b", "qwen3", 128, false, true, 0, 0, 0, 0, 0, 0},
    {"tiny-mistral", "mistral", 8, false, false, 5, 0, 0, 0, 0, 0},
    {"tiny-qwen2", "qwen2", 8, true, false, 6, 1, 0, 0, 0, 0},
    {"tiny-qwen3", "qwen3", 16, false, true, 0, 0, 0, 0, 0, 0},
    {"tiny-llama3", "llama", 8, false, false, 0, 0, 8, 1, 4, 16},
    {"mixtral-8x7b", "mixtral", 128, false, false, 0, 0, 0, 0, 0, 0},
    {"qwen1.5-moe-a2.7b", "qwen2_moe", 128, true, false, 0, 0, 0, 0, 0, 0},
    {"qwen3-30b-a3b", "qwen3_moe", 128, false, true, 0, 0, 0, 0, 0, 0},
    {"tiny-mixtral", "mixtral", 16, false, false, 0, 0, 0, 0, 0, 0},
    {"tiny-qwen2-moe", "qwen2_moe", 16, true, false, 0, 0, 0, 0, 0, 0},
    {"tiny-qwen3-moe", "qwen3_moe", 24, false, true, 0, 0, 0, 0, 0, 0},
};

TEST(Presets, FamilyFeatures) {
  for (const Family& f : kFamilies) {
    SCOPED_TRACE(f.name);
    const ModelConfig c = preset(f.name);
    EXPECT_EQ(c.family, f.family);
    EXPECT_EQ(c.head_dim(), f.head_dim);
    EXPECT_EQ(c.qkv_bias, f.qkv_bias);
    EXPECT_EQ(c.qk_norm, f.qk_norm);
    EXPECT_EQ(c.sliding_window, f.window);
    EXPECT_EQ(c.window_from_layer, f.from);
    if (f.factor == 0) {
      EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::none);
    } else {
      EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::llama3);
      EXPECT_DOUBLE_EQ(c.rope_scaling.factor, f.factor);
      EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, f.low);
      EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, f.high);
      EXPECT_EQ(c.rope_scaling.original_max_positions, f.original);
    }
    EXPECT_TRUE(c.ignored_fields.empty());
  }
  // Every preset not listed is a plain LLaMA.
  for (const auto& name : preset_names()) {
    bool listed = false;
    for (const Family& f : kFamilies) listed |= name == f.name;
    if (listed) continue;
    SCOPED_TRACE(name);
    const ModelConfig c = preset(name);
    EXPECT_EQ(c.family, "llama");
    EXPECT_TRUE(c.features().empty());
  }
}

TEST(Presets, WindowOfEachLayer) {
  const ModelConfig m = preset("tiny-mistral");
  EXPECT_EQ(m.window_of(0), 5);
  EXPECT_EQ(m.window_of(1), 5);
  const ModelConfig q = preset("tiny-qwen2");
  EXPECT_EQ(q.window_of(0), 0);
  EXPECT_EQ(q.window_of(1), 6);
  EXPECT_EQ(preset("qwen2-7b").window_of(27), 0);
  EXPECT_EQ(preset("tiny-qwen3").q_dim(), 64);  // 4 heads of 16, hidden 48
  EXPECT_EQ(preset("tiny-qwen3").kv_dim(), 32);
  EXPECT_EQ(preset("qwen3-0.6b").q_dim(), 2048);  // hidden 1024
}

TEST(Presets, FeaturesDescribeWhatIsOn) {
  auto joined = [](const ModelConfig& c) {
    std::string s;
    for (const auto& f : c.features()) s += f + "; ";
    return s;
  };
  EXPECT_EQ(joined(preset("tiny-mistral")), "sliding window 5 in every layer; ");
  EXPECT_EQ(joined(preset("tiny-qwen2")), "q/k/v biases; sliding window 6 from layer 1; ");
  EXPECT_EQ(joined(preset("qwen2-7b")), "q/k/v biases; ");
  EXPECT_EQ(joined(preset("tiny-qwen3")),
            "head_dim 16 (hidden_size / num_attention_heads = 12); q/k RMSNorm per head (q_norm, "
            "k_norm); ");
  EXPECT_EQ(joined(preset("llama3.2-1b")),
            "rope scaling llama3 (factor 32, low_freq_factor 1, high_freq_factor 4, "
            "original_max_position_embeddings 8192); ");
  EXPECT_EQ(joined(preset("llama3-8b")), "");
}

TEST(Presets, EveryPresetHasItsPublishedShape) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(s.name);
    const ModelConfig c = preset(s.name);
    EXPECT_EQ(c.name, s.name);
    EXPECT_EQ(c.vocab, s.V);
    EXPECT_EQ(c.hidden, s.h);
    EXPECT_EQ(c.intermediate, s.i);
    EXPECT_EQ(c.layers, s.L);
    EXPECT_EQ(c.heads, s.a);
    EXPECT_EQ(c.kv_heads, s.k);
    EXPECT_EQ(c.max_positions, s.max);
    EXPECT_DOUBLE_EQ(c.rms_eps, s.eps);
    EXPECT_DOUBLE_EQ(c.rope_theta, s.theta);
    EXPECT_EQ(c.tied_embeddings, s.tied);
    EXPECT_NO_THROW(c.validate());
  }
}

TEST(Presets, NamesListsExactlyThePresets) {
  std::set<std::string> expected;
  for (const Shape& s : kShapes) expected.insert(s.name);
  const auto names = preset_names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected);
  EXPECT_EQ(names.size(), expected.size()) << "duplicate preset names";
  EXPECT_FALSE(find_preset("llama-8b").has_value());
  EXPECT_FALSE(find_preset("").has_value());
}

TEST(Presets, HeadDims) {
  EXPECT_EQ(preset("llama-7b").head_dim(), 128);
  EXPECT_EQ(preset("llama-33b").head_dim(), 128);
  EXPECT_EQ(preset("llama2-70b").kv_dim(), 1024);
  EXPECT_EQ(preset("llama3-8b").kv_dim(), 1024);
  EXPECT_EQ(preset("tiny-awkward").head_dim(), 8);
  EXPECT_EQ(preset("tiny-awkward").kv_dim(), 8);
}

// Published parameter counts (the model cards / HF safetensors index), as literals.
TEST(ParamCount, MatchesPublishedCounts) {
  EXPECT_EQ(preset("llama-7b").param_count(), 6'738'415'616ull);
  EXPECT_EQ(preset("llama-13b").param_count(), 13'015'864'320ull);
  EXPECT_EQ(preset("llama-33b").param_count(), 32'528'943'616ull);
  EXPECT_EQ(preset("llama-65b").param_count(), 65'285'660'672ull);
  EXPECT_EQ(preset("llama2-7b").param_count(), 6'738'415'616ull);
  EXPECT_EQ(preset("llama2-13b").param_count(), 13'015'864'320ull);
  EXPECT_EQ(preset("llama2-70b").param_count(), 68'976'648'192ull);
  EXPECT_EQ(preset("llama3-8b").param_count(), 8'030'261'248ull);
}

// The rounded figures the model cards publish, to within their last digit (a cross-check of the
// exact counts, which tests/test_config_hf.cpp compares with PyTorch's count of the real HF
// classes).
TEST(ParamCount, MatchesModelCardFigures) {
  auto billions = [](const char* name) {
    return static_cast<double>(preset(name).param_count()) / 1e9;
  };
  // Published counts are quoted to 2 decimals (0.6 and 8.2 to 1): ±0.005 of rounding for ours;
  // 0.01 is one unit of the last quoted digit (the 1-decimal ones are met to 0.01 all the same).
  EXPECT_NEAR(billions("mistral-7b"), 7.24, 0.01);    // Mistral-7B-v0.1: 7.24B
  EXPECT_NEAR(billions("qwen2.5-7b"), 7.61, 0.01);    // Qwen2.5-7B: 7.61B
  EXPECT_NEAR(billions("qwen2.5-0.5b"), 0.49, 0.01);  // Qwen2.5-0.5B: 0.49B
  EXPECT_NEAR(billions("qwen3-0.6b"), 0.6, 0.01);     // Qwen3-0.6B: 0.6B
  EXPECT_NEAR(billions("qwen3-8b"), 8.2, 0.01);       // Qwen3-8B: 8.2B
  EXPECT_NEAR(billions("llama3.2-1b"), 1.23, 0.01);   // Llama 3.2 1B: 1.23B
  // Qwen2-7B and Qwen2.5-7B share their shape.
  EXPECT_EQ(preset("qwen2-7b").param_count(), preset("qwen2.5-7b").param_count());
  // Non-embedding figures the Qwen cards state: Qwen3-0.6B 0.44B, Qwen3-8B 6.95B,
  // Qwen2.5-0.5B 0.36B, Qwen2.5-7B 6.53B.
  auto non_embedding = [](const char* name) {
    const ModelConfig c = preset(name);
    const auto embed = static_cast<std::uint64_t>(c.vocab * c.hidden);
    return static_cast<double>(c.param_count() - (c.tied_embeddings ? 1 : 2) * embed) / 1e9;
  };
  // Quoted to 2 decimals: half a unit of the last digit.
  EXPECT_NEAR(non_embedding("qwen3-0.6b"), 0.44, 0.005);
  EXPECT_NEAR(non_embedding("qwen3-8b"), 6.95, 0.005);
  EXPECT_NEAR(non_embedding("qwen2.5-0.5b"), 0.36, 0.005);
  EXPECT_NEAR(non_embedding("qwen2.5-7b"), 6.53, 0.005);
}

// Tiny presets: summed by hand, tensor by tensor (embed, per layer q k v o gate up down and
// two norms, final norm, lm_head unless tied).
TEST(ParamCount, TinyPresetsTensorByTensor) {
  EXPECT_EQ(preset("tiny").param_count(),
            128u * 64 + 2 * (64 * 64 + 64 * 64 + 64 * 64 + 64 * 64 + 3 * 176 * 64 + 2 * 64) + 64 +
                128 * 64);
  // d = 8, kv width = 2 * 8 = 16
  EXPECT_EQ(preset("tiny-gqa").param_count(),
            96u * 48 + 2 * (48 * 48 + 16 * 48 + 16 * 48 + 48 * 48 + 3 * 128 * 48 + 2 * 48) + 48 +
                96 * 48);
  // tied: no lm_head
  EXPECT_EQ(preset("tiny-tied").param_count(),
            64u * 32 + 2 * (32 * 32 + 32 * 32 + 32 * 32 + 32 * 32 + 3 * 96 * 32 + 2 * 32) + 32);
  // d = 8, one kv head: kv width 8
  EXPECT_EQ(
      preset("tiny-awkward").param_count(),
      71u * 40 + 3 * (40 * 40 + 8 * 40 + 8 * 40 + 40 * 40 + 3 * 104 * 40 + 2 * 40) + 40 + 71 * 40);
  // tiny-mistral: tiny-gqa's tensors (the window adds none)
  EXPECT_EQ(preset("tiny-mistral").param_count(), preset("tiny-gqa").param_count());
  // tiny-qwen2: + q, k, v biases (48 + 16 + 16 per layer), tied
  EXPECT_EQ(preset("tiny-qwen2").param_count(),
            96u * 48 +
                2 * (48 * 48 + 16 * 48 + 16 * 48 + 48 * 48 + 48 + 16 + 16 + 3 * 128 * 48 + 2 * 48) +
                48);
  // tiny-qwen3: d = 16: q_proj (64, 48), k/v (32, 48), o_proj (48, 64), q_norm and k_norm (16)
  EXPECT_EQ(preset("tiny-qwen3").param_count(),
            96u * 48 +
                2 * (64 * 48 + 32 * 48 + 32 * 48 + 48 * 64 + 16 + 16 + 3 * 128 * 48 + 2 * 48) + 48 +
                96 * 48);
  // tiny-llama3: tiny-gqa tied (rope scaling adds no tensor)
  EXPECT_EQ(preset("tiny-llama3").param_count(), preset("tiny-gqa").param_count() - 96u * 48);
  EXPECT_EQ(preset("tiny").param_count(), 117056u);
  EXPECT_EQ(preset("tiny-tied").param_count(), 28832u);
}

TEST(ParamCount, TyingRemovesExactlyTheLmHead) {
  ModelConfig c = preset("llama-7b");
  const auto untied = c.param_count();
  c.tied_embeddings = true;
  EXPECT_EQ(untied - c.param_count(), 32000ull * 4096);
}

// ---- validation: each error names the field ----

void expect_invalid(ModelConfig c, const std::string& field) {
  try {
    c.validate();
    ADD_FAILURE() << "expected InputError naming " << field;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos)
        << "message: " << e.what() << "\nshould name: " << field;
  }
}

TEST(Validate, NonPositiveSizesNameTheField) {
  const ModelConfig base = preset("tiny");
  struct Case {
    std::int64_t ModelConfig::*member;
    const char* field;
  } cases[] = {{&ModelConfig::vocab, "vocab_size"},
               {&ModelConfig::hidden, "hidden_size"},
               {&ModelConfig::intermediate, "intermediate_size"},
               {&ModelConfig::layers, "num_hidden_layers"},
               {&ModelConfig::heads, "num_attention_heads"},
               {&ModelConfig::kv_heads, "num_key_value_heads"},
               {&ModelConfig::max_positions, "max_position_embeddings"}};
  for (const auto& cs : cases) {
    for (std::int64_t bad : {0, -1, -4096}) {
      ModelConfig c = base;
      c.*cs.member = bad;
      SCOPED_TRACE(std::string(cs.field) + " = " + std::to_string(bad));
      expect_invalid(c, cs.field);
      EXPECT_THROW(c.param_count(), InputError);
    }
  }
}

TEST(Validate, Divisibility) {
  ModelConfig c = preset("tiny");  // h 64, a 4, k 4
  c.heads = 5;
  c.kv_heads = 5;
  expect_invalid(c, "num_attention_heads (5) must divide hidden_size (64)");
  c = preset("tiny");
  c.kv_heads = 3;
  expect_invalid(c, "num_key_value_heads (3) must divide num_attention_heads (4)");
  c = preset("tiny");
  c.heads = 64;  // head dim 1: RoPE's rotate-half needs an even head dim
  c.kv_heads = 64;
  expect_invalid(c, "must be even");
}

TEST(Validate, ExplicitHeadDim) {
  ModelConfig c = preset("tiny-qwen3");  // h 48, a 4: 48 / 4 = 12, head_dim 16
  EXPECT_NO_THROW(c.validate());
  c.heads = 5;  // 5 does not divide 48: allowed, head_dim is explicit
  c.kv_heads = 5;
  EXPECT_NO_THROW(c.validate());
  c = preset("tiny-qwen3");
  c.explicit_head_dim = 15;
  expect_invalid(c, "head_dim (15) must be a positive even integer");
  c.explicit_head_dim = -2;
  expect_invalid(c, "head_dim");
  c = preset("tiny-qwen3");
  c.kv_heads = 3;
  expect_invalid(c, "num_key_value_heads (3) must divide num_attention_heads (4)");
}

TEST(Validate, WindowAndRopeScaling) {
  ModelConfig c = preset("tiny-mistral");
  c.sliding_window = -1;
  expect_invalid(c, "sliding_window");
  c = preset("tiny-qwen2");
  c.window_from_layer = -1;
  expect_invalid(c, "max_window_layers");
  struct Case {
    double RopeScaling::*member;
    double value;
    const char* field;
  } cases[] = {{&RopeScaling::factor, 0.5, "rope_scaling.factor"},
               {&RopeScaling::factor, NAN, "rope_scaling.factor"},
               {&RopeScaling::low_freq_factor, 0, "rope_scaling.low_freq_factor"},
               {&RopeScaling::high_freq_factor, 1, "rope_scaling.high_freq_factor"}};
  for (const auto& cs : cases) {
    SCOPED_TRACE(cs.field);
    c = preset("tiny-llama3");
    c.rope_scaling.*cs.member = cs.value;
    expect_invalid(c, cs.field);
  }
  c = preset("tiny-llama3");
  c.rope_scaling.original_max_positions = 0;
  expect_invalid(c, "rope_scaling.original_max_position_embeddings");
}

TEST(Validate, EpsAndTheta) {
  ModelConfig c = preset("tiny");
  c.rms_eps = 0;
  expect_invalid(c, "rms_norm_eps");
  c = preset("tiny");
  c.rope_theta = -1;
  expect_invalid(c, "rope_theta");
}

TEST(Validate, OverflowingProductsNameTheFields) {
  ModelConfig c = preset("tiny");
  c.vocab = std::int64_t{1} << 40;
  c.hidden = std::int64_t{1} << 30;  // V * h = 2^70
  c.heads = 1;
  c.kv_heads = 1;
  expect_invalid(c, "vocab_size * hidden_size");
  EXPECT_THROW(c.validate(), OverflowError);

  // A layer count past kMaxLayers is refused before any product is formed (every command's
  // time is linear in it).
  c = preset("tiny");
  c.layers = std::int64_t{1} << 62;
  expect_invalid(c, "num_hidden_layers must be at most 16384, got 4611686018427387904");
  c.layers = 16385;
  expect_invalid(c, "num_hidden_layers must be at most 16384");
  c.layers = 16384;
  EXPECT_NO_THROW(c.validate());

  // Fits in 64 bits as a count, but 16 bytes per parameter does not fit in 63 bits: embedding
  // and lm_head are 2 * 2^40 * 2^20 = 2^61 parameters, the layers ~2^45 more.
  c = preset("tiny");
  c.vocab = std::int64_t{1} << 40;
  c.hidden = std::int64_t{1} << 20;
  c.heads = 1;
  c.kv_heads = 1;
  ASSERT_FALSE(c.tied_embeddings);
  EXPECT_NO_THROW(c.param_count());
  EXPECT_GT(c.param_count(), std::uint64_t{1} << 61);
  EXPECT_THROW(c.validate(), OverflowError);
  expect_invalid(c, "16 bytes per parameter");
}

// ---- TrainConfig and enum names ----

TEST(TrainConfig, DefaultsFollowTheDesign) {
  TrainConfig t;
  EXPECT_EQ(t.batch, 8);
  EXPECT_EQ(t.seq, 512);
  EXPECT_EQ(t.dtype, DType::bf16);
  EXPECT_EQ(t.optimizer, Optimizer::adamw);
  EXPECT_EQ(t.checkpointing, Checkpointing::none);
  EXPECT_EQ(t.attention, Attention::eager);
  EXPECT_NO_THROW(t.validate());
}

TEST(TrainConfig, Validate) {
  TrainConfig t;
  t.batch = 0;
  EXPECT_THROW(t.validate(), InputError);
  t.batch = 1;
  t.seq = 1;
  try {
    t.validate();
    ADD_FAILURE() << "seq 1 accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--seq"), std::string::npos) << e.what();
  }
  t.seq = 2;
  EXPECT_NO_THROW(t.validate());
  t.dtype = DType::i32;
  EXPECT_THROW(t.validate(), InputError);
}

TEST(Enums, NamesRoundTrip) {
  for (auto o : {Optimizer::adamw, Optimizer::sgd, Optimizer::lomo, Optimizer::adamw8bit,
                 Optimizer::paged_adamw, Optimizer::paged_adamw8bit})
    EXPECT_EQ(parse_optimizer(optimizer_name(o)), o);
  EXPECT_STREQ(optimizer_name(Optimizer::paged_adamw), "paged-adamw");  // bitsandbytes' spelling
  EXPECT_STREQ(optimizer_name(Optimizer::paged_adamw8bit), "paged-adamw8bit");
  for (auto c : {Checkpointing::none, Checkpointing::full, Checkpointing::selective})
    EXPECT_EQ(parse_checkpointing(checkpointing_name(c)), c);
  for (auto a : {Attention::eager, Attention::flash})
    EXPECT_EQ(parse_attention(attention_name(a)), a);
  EXPECT_STREQ(optimizer_name(Optimizer::adamw), "adamw");
  EXPECT_STREQ(checkpointing_name(Checkpointing::full), "full");
  EXPECT_STREQ(attention_name(Attention::flash), "flash");
  EXPECT_FALSE(parse_optimizer("adam").has_value());
  EXPECT_FALSE(parse_checkpointing("partial").has_value());
  EXPECT_FALSE(parse_attention("sdpa").has_value());
}

// ---- resolve_model ----

TEST(ResolveModel, PresetsAndUnknownNames) {
  EXPECT_EQ(resolve_model("llama2-70b").kv_heads, 8);
  try {
    resolve_model("llama-8b");
    ADD_FAILURE() << "unknown model accepted";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--model"), std::string::npos) << m;
    EXPECT_NE(m.find("llama-8b"), std::string::npos) << m;
    for (const Shape& s : kShapes) EXPECT_NE(m.find(s.name), std::string::npos) << s.name;
  }
}

TEST(ResolveModel, MissingJsonFileNamesThePath) {
  try {
    resolve_model("/nonexistent/dir/config.json");
    ADD_FAILURE() << "missing file accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/config.json"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace trainmem
