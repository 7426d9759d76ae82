// Presets, exact parameter counts against published numbers, validation, enum names.
#include <gtest/gtest.h>

#include <set>

#include "trainmem/config.hpp"
#include "trainmem/error.hpp"

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
    {"tiny", 128, 64, 176, 2, 4, 4, 256, 1e-5, 1e4, false},
    {"tiny-gqa", 96, 48, 128, 2, 6, 2, 256, 1e-5, 1e4, false},
    {"tiny-tied", 64, 32, 96, 2, 2, 2, 128, 1e-5, 1e4, true},
    {"tiny-awkward", 71, 40, 104, 3, 5, 1, 128, 1e-5, 1e4, false},
    {"small-256", 2048, 256, 688, 4, 4, 4, 1024, 1e-5, 1e4, false},
};

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

  c = preset("tiny");
  c.layers = std::int64_t{1} << 62;  // L * per-layer params overflows
  expect_invalid(c, "num_hidden_layers");

  // Fits in 64 bits as a count, but 16 bytes per parameter does not fit in 63 bits.
  c = preset("tiny");
  c.layers = std::int64_t{1} << 50;  // 50304 params per layer: ~2^65.6 parameters
  EXPECT_THROW(c.validate(), OverflowError);
  c = preset("tiny");
  c.layers = (std::int64_t{1} << 60) / 50304;  // ~2^60 parameters: * 16 bytes > 2^63
  EXPECT_NO_THROW(c.param_count());
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
  for (auto o : {Optimizer::adamw, Optimizer::sgd, Optimizer::lomo})
    EXPECT_EQ(parse_optimizer(optimizer_name(o)), o);
  for (auto c : {Checkpointing::none, Checkpointing::full})
    EXPECT_EQ(parse_checkpointing(checkpointing_name(c)), c);
  for (auto a : {Attention::eager, Attention::flash})
    EXPECT_EQ(parse_attention(attention_name(a)), a);
  EXPECT_STREQ(optimizer_name(Optimizer::adamw), "adamw");
  EXPECT_STREQ(checkpointing_name(Checkpointing::full), "full");
  EXPECT_STREQ(attention_name(Attention::flash), "flash");
  EXPECT_FALSE(parse_optimizer("adam").has_value());
  EXPECT_FALSE(parse_checkpointing("selective").has_value());
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
