// HuggingFace config.json loading: real configs, every error naming its field, and a
// fuzz-style sweep (truncations, byte flips, random field values) asserting "a clear
// InputError or a valid config, never anything else".
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

using json = nlohmann::json;

std::string data_file(const std::string& rel) {
  return std::string(TRAINMEM_TEST_DATA_DIR) + "/" + rel;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A small valid LLaMA config (tiny-gqa's shape), as HF writes one.
json base_config() {
  return json{{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"vocab_size", 96},
              {"hidden_size", 48},
              {"intermediate_size", 128},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 6},
              {"num_key_value_heads", 2},
              {"max_position_embeddings", 256},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 10000.0},
              {"tie_word_embeddings", false},
              {"torch_dtype", "bfloat16"},
              {"hidden_act", "silu"}};
}

// The InputError message of parsing `j`, or "" (with a failure) when it parsed.
std::string error_of(const json& j) {
  try {
    parse_hf_config(j.dump(), "cfg.json");
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << j.dump();
  return "";
}

void expect_error_naming(const json& j, const std::string& needle) {
  const std::string m = error_of(j);
  EXPECT_NE(m.find(needle), std::string::npos) << "message: " << m << "\nshould name: " << needle;
  EXPECT_EQ(m.rfind("cfg.json: ", 0), 0u) << "message should start with the source: " << m;
}

TEST(HfConfig, Llama2SevenBMatchesPreset) {
  const ModelConfig c = load_hf_config(data_file("configs/llama2-7b.json"));
  const ModelConfig p = *find_preset("llama2-7b");
  EXPECT_EQ(c.name, data_file("configs/llama2-7b.json"));
  EXPECT_EQ(c.vocab, p.vocab);
  EXPECT_EQ(c.hidden, p.hidden);
  EXPECT_EQ(c.intermediate, p.intermediate);
  EXPECT_EQ(c.layers, p.layers);
  EXPECT_EQ(c.heads, p.heads);
  EXPECT_EQ(c.kv_heads, p.kv_heads);
  EXPECT_EQ(c.max_positions, 4096);
  EXPECT_DOUBLE_EQ(c.rms_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);  // absent in the file: HF's default
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.torch_dtype, DType::f16);
  EXPECT_EQ(c.param_count(), 6'738'415'616ull);
}

TEST(HfConfig, Llama3EightB) {
  const ModelConfig c = resolve_model(data_file("configs/llama3-8b.json"));
  EXPECT_EQ(c.vocab, 128256);
  EXPECT_EQ(c.kv_heads, 8);
  EXPECT_EQ(c.max_positions, 8192);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.torch_dtype, DType::bf16);
  EXPECT_EQ(c.param_count(), 8'030'261'248ull);
}

// The published config.json of each family's preset (tests/data/configs/<preset>.json, as
// released on the Hub), and the tiny presets' files: each loads to exactly its preset.
void expect_loads_to_preset(const std::string& dir);

TEST(HfConfig, FamilyConfigsLoadToTheirPresets) {
  expect_loads_to_preset("configs/");
}

// The same configs as transformers 5.24 saves them (tools/hf_param_counts.py --write-tf5):
// rope_parameters holding rope_theta, dtype, layer_types, null token ids.
TEST(HfConfig, TransformersFiveSavedConfigsLoadToTheirPresets) {
  expect_loads_to_preset("configs/tf5/");
}

void expect_loads_to_preset(const std::string& dir) {
  for (const char* name : {"llama2-7b", "llama3-8b", "llama3.2-1b", "mistral-7b", "qwen2-7b",
                           "qwen2.5-0.5b", "qwen2.5-7b", "qwen3-0.6b", "qwen3-8b", "tiny-mistral",
                           "tiny-qwen2", "tiny-qwen3", "tiny-llama3"}) {
    SCOPED_TRACE(name);
    const ModelConfig c = load_hf_config(data_file(dir + name + ".json"));
    const ModelConfig p = *find_preset(name);
    EXPECT_EQ(c.family, p.family);
    EXPECT_EQ(c.vocab, p.vocab);
    EXPECT_EQ(c.hidden, p.hidden);
    EXPECT_EQ(c.intermediate, p.intermediate);
    EXPECT_EQ(c.layers, p.layers);
    EXPECT_EQ(c.heads, p.heads);
    EXPECT_EQ(c.kv_heads, p.kv_heads);
    EXPECT_EQ(c.max_positions, p.max_positions);
    EXPECT_DOUBLE_EQ(c.rms_eps, p.rms_eps);
    EXPECT_DOUBLE_EQ(c.rope_theta, p.rope_theta);
    EXPECT_EQ(c.tied_embeddings, p.tied_embeddings);
    EXPECT_EQ(c.torch_dtype, p.torch_dtype);
    EXPECT_EQ(c.explicit_head_dim, p.explicit_head_dim);
    EXPECT_EQ(c.head_dim(), p.head_dim());
    EXPECT_EQ(c.qkv_bias, p.qkv_bias);
    EXPECT_EQ(c.qk_norm, p.qk_norm);
    EXPECT_EQ(c.sliding_window, p.sliding_window);
    EXPECT_EQ(c.window_from_layer, p.window_from_layer);
    EXPECT_EQ(c.rope_scaling.kind, p.rope_scaling.kind);
    EXPECT_DOUBLE_EQ(c.rope_scaling.factor, p.rope_scaling.factor);
    EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, p.rope_scaling.low_freq_factor);
    EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, p.rope_scaling.high_freq_factor);
    EXPECT_EQ(c.rope_scaling.original_max_positions, p.rope_scaling.original_max_positions);
    EXPECT_EQ(c.param_count(), p.param_count());
    for (const auto& f : c.ignored_fields)
      EXPECT_EQ(f.find("unrecognised"), std::string::npos) << f;
  }
}

// Each family's fields, read from its real config.json, spelled out (not via the preset).
TEST(HfConfig, Mistral7BReadsTheWindow) {
  const ModelConfig c = load_hf_config(data_file("configs/mistral-7b.json"));
  EXPECT_EQ(c.family, "mistral");
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.window_from_layer, 0);
  EXPECT_EQ(c.window_of(31), 4096);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.kv_heads, 8);
  EXPECT_EQ(c.param_count(), 7'241'732'096ull);
}

TEST(HfConfig, Qwen2SevenBHasBiasesAndNoWindow) {
  const ModelConfig c = load_hf_config(data_file("configs/qwen2-7b.json"));
  EXPECT_EQ(c.family, "qwen2");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window: false
  EXPECT_EQ(c.vocab, 152064);
  EXPECT_EQ(c.kv_heads, 4);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  // The keys that do not change a training step, the window's included (it is off).
  for (const char* k :
       {"architectures", "bos_token_id", "eos_token_id", "initializer_range",
        "transformers_version", "use_cache", "torch_dtype", "sliding_window", "max_window_layers"})
    EXPECT_NE(std::find(c.ignored_fields.begin(), c.ignored_fields.end(), k),
              c.ignored_fields.end())
        << k;
  for (const char* k : {"hidden_size", "use_sliding_window", "vocab_size", "rope_theta"})
    EXPECT_EQ(std::find(c.ignored_fields.begin(), c.ignored_fields.end(), k),
              c.ignored_fields.end())
        << k;
}

TEST(HfConfig, Qwen3HasDecoupledHeadDimAndQkNorm) {
  const ModelConfig small = load_hf_config(data_file("configs/qwen3-0.6b.json"));
  EXPECT_EQ(small.family, "qwen3");
  EXPECT_EQ(small.explicit_head_dim, 128);  // hidden 1024 / 16 heads = 64
  EXPECT_EQ(small.head_dim(), 128);
  EXPECT_EQ(small.q_dim(), 2048);
  EXPECT_TRUE(small.qk_norm);
  EXPECT_FALSE(small.qkv_bias);
  EXPECT_TRUE(small.tied_embeddings);
  EXPECT_EQ(small.param_count(), 596'049'920ull);
  const ModelConfig big = load_hf_config(data_file("configs/qwen3-8b.json"));
  EXPECT_EQ(big.head_dim(), 128);  // = 4096 / 32: not decoupled
  EXPECT_EQ(big.explicit_head_dim, 0);
  EXPECT_EQ(big.param_count(), 8'190'735'360ull);
}

TEST(HfConfig, Llama32ReadsRopeScalingAndHeadDim) {
  const ModelConfig c = load_hf_config(data_file("configs/llama3.2-1b.json"));
  EXPECT_EQ(c.family, "llama");
  EXPECT_EQ(c.head_dim(), 64);
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::llama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_positions, 8192);
  EXPECT_DOUBLE_EQ(c.rope().theta, 500000.0);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.param_count(), 1'235'814'400ull);
}

// Each preset's count equals PyTorch's: tools/hf_param_counts.py instantiates the real HF
// class of each tests/data/configs/<preset>.json on the meta device and sums p.numel()
// (tests/data/hf_param_counts.json, with the versions it ran).
TEST(HfConfig, ParamCountsEqualTheRealHfClasses) {
  const json doc = json::parse(read_text(data_file("hf_param_counts.json")));
  ASSERT_TRUE(doc.contains("counts")) << doc.dump();
  int checked = 0;
  for (const auto& item : doc.at("counts").items()) {
    SCOPED_TRACE(item.key());
    const auto p = find_preset(item.key());
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->param_count(), item.value().get<std::uint64_t>());
    EXPECT_EQ(load_hf_config(data_file("configs/" + item.key() + ".json")).param_count(),
              item.value().get<std::uint64_t>());
    ++checked;
  }
  EXPECT_GE(checked, 11);
}

TEST(HfConfig, DefaultsAsTransformersLlamaConfig) {
  json j = base_config();
  for (const char* f : {"num_key_value_heads", "max_position_embeddings", "rms_norm_eps",
                        "rope_theta", "tie_word_embeddings", "torch_dtype", "hidden_act"})
    j.erase(f);
  const ModelConfig c = parse_hf_config(j.dump(), "cfg.json");
  EXPECT_EQ(c.kv_heads, 6);  // = num_attention_heads
  EXPECT_EQ(c.max_positions, 2048);
  EXPECT_DOUBLE_EQ(c.rms_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_FALSE(c.torch_dtype.has_value());

  j["num_key_value_heads"] = nullptr;  // HF writes null for "same as heads"
  j["tie_word_embeddings"] = true;
  const ModelConfig d = parse_hf_config(j.dump(), "cfg.json");
  EXPECT_EQ(d.kv_heads, 6);
  EXPECT_TRUE(d.tied_embeddings);
}

TEST(HfConfig, MissingRequiredFields) {
  for (const char* f : {"model_type", "vocab_size", "hidden_size", "intermediate_size",
                        "num_hidden_layers", "num_attention_heads"}) {
    SCOPED_TRACE(f);
    json j = base_config();
    j.erase(f);
    expect_error_naming(j, std::string("missing required field ") + f);
  }
}

TEST(HfConfig, BadValuesNameTheField) {
  const char* ints[] = {
      "vocab_size",          "hidden_size",         "intermediate_size",      "num_hidden_layers",
      "num_attention_heads", "num_key_value_heads", "max_position_embeddings"};
  const json bad[] = {0, -1, -4096, "4096", 4096.5, 48.0, true, json::array({48}), json::object()};
  for (const char* f : ints) {
    for (const json& v : bad) {
      SCOPED_TRACE(std::string(f) + " = " + v.dump());
      json j = base_config();
      j[f] = v;
      expect_error_naming(j, f);
    }
  }
  for (const char* f : {"rms_norm_eps", "rope_theta"}) {
    for (const json& v : {json(0), json(-1e-5), json("1e-5"), json(false)}) {
      SCOPED_TRACE(std::string(f) + " = " + v.dump());
      json j = base_config();
      j[f] = v;
      expect_error_naming(j, f);
    }
  }
  json j = base_config();
  j["tie_word_embeddings"] = "false";
  expect_error_naming(j, "tie_word_embeddings");
  j = base_config();
  j["torch_dtype"] = "float64";
  expect_error_naming(j, "torch_dtype must be one of float32, float16, bfloat16");
  j = base_config();
  j["model_type"] = 7;
  expect_error_naming(j, "model_type");
  j = base_config();
  j["hidden_act"] = "gelu";
  expect_error_naming(j, "hidden_act");
  j = base_config();
  j["attention_bias"] = true;
  expect_error_naming(j, "attention_bias");
  j = base_config();
  for (const json& v : {json(0), json(-8), json(15), json("16"), json(16.0), json(true)}) {
    SCOPED_TRACE("head_dim = " + v.dump());
    j["head_dim"] = v;
    expect_error_naming(j, "head_dim must be a positive even integer");
  }
  j["head_dim"] = 16;  // 48 / 6 = 8: decoupled, as Qwen3 does
  EXPECT_EQ(parse_hf_config(j.dump(), "cfg.json").explicit_head_dim, 16);
  EXPECT_EQ(parse_hf_config(j.dump(), "cfg.json").head_dim(), 16);
  j["head_dim"] = 8;  // = 48 / 6
  EXPECT_EQ(parse_hf_config(j.dump(), "cfg.json").explicit_head_dim, 0);
  EXPECT_EQ(parse_hf_config(j.dump(), "cfg.json").head_dim(), 8);
}

TEST(HfConfig, DivisibilityNamesBothFields) {
  json j = base_config();
  j["num_attention_heads"] = 5;
  j["num_key_value_heads"] = 5;
  expect_error_naming(j, "num_attention_heads (5) must divide hidden_size (48)");
  j = base_config();
  j["num_key_value_heads"] = 4;
  expect_error_naming(j, "num_key_value_heads (4) must divide num_attention_heads (6)");
}

TEST(HfConfig, OverflowNamesTheFields) {
  json j = base_config();
  j["vocab_size"] = 1ull << 62;
  expect_error_naming(j, "vocab_size * hidden_size");
  j = base_config();
  j["num_hidden_layers"] = 1ull << 60;
  expect_error_naming(j, "num_hidden_layers");
  j = base_config();
  j["vocab_size"] = 18446744073709551615ull;  // UINT64_MAX: not even an int64
  expect_error_naming(j, "vocab_size");
  j = base_config();
  j["intermediate_size"] = 1ull << 61;
  expect_error_naming(j, "intermediate_size");
}

TEST(HfConfig, ParseErrorsGiveThePosition) {
  try {
    parse_hf_config("{\"model_type\": \"llama\",, }", "cfg.json");
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cfg.json: not valid JSON at byte 24"), std::string::npos) << m;
    EXPECT_NE(m.find("line 1, column 24"), std::string::npos) << m;
  }
  EXPECT_THROW(parse_hf_config("", "cfg.json"), InputError);
  EXPECT_THROW(parse_hf_config("[1, 2]", "cfg.json"), InputError);
  EXPECT_THROW(parse_hf_config("\"llama\"", "cfg.json"), InputError);
}

// ---------------------------------------------------------------- families (issue 16)

json family_config(const std::string& family) {
  json j = base_config();
  j["model_type"] = family;
  return j;
}

bool lists(const ModelConfig& c, const std::string& entry) {
  return std::find(c.ignored_fields.begin(), c.ignored_fields.end(), entry) !=
         c.ignored_fields.end();
}

ModelConfig parse(const json& j) {
  return parse_hf_config(j.dump(), "cfg.json");
}

TEST(HfFamilies, HeadDimNeedsNoDivisibility) {
  json j = family_config("qwen3");
  j["num_attention_heads"] = 5;  // 48 % 5 != 0: fine with an explicit head_dim
  j["num_key_value_heads"] = 1;
  j["head_dim"] = 16;
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.head_dim(), 16);
  EXPECT_EQ(c.q_dim(), 80);
  j.erase("head_dim");  // Qwen3Config's default head_dim: 128
  EXPECT_EQ(parse(j).head_dim(), 128);
  j = family_config("llama");
  j["num_attention_heads"] = 5;
  j["num_key_value_heads"] = 1;
  expect_error_naming(j, "num_attention_heads (5) must divide hidden_size (48)");
}

TEST(HfFamilies, MistralWindow) {
  json j = family_config("mistral");
  j["sliding_window"] = 5;
  ModelConfig c = parse(j);
  EXPECT_EQ(c.sliding_window, 5);
  EXPECT_EQ(c.window_from_layer, 0);
  j["sliding_window"] = nullptr;  // no window
  EXPECT_EQ(parse(j).sliding_window, 0);
  j.erase("sliding_window");  // MistralConfig's default
  EXPECT_EQ(parse(j).sliding_window, 4096);
  for (const json& v : {json(0), json(-4096), json("4096"), json(4096.5), json(true)}) {
    SCOPED_TRACE("sliding_window = " + v.dump());
    j["sliding_window"] = v;
    expect_error_naming(j, "sliding_window");
  }
}

TEST(HfFamilies, QwenWindowFromMaxWindowLayers) {
  for (const char* family : {"qwen2", "qwen3"}) {
    SCOPED_TRACE(family);
    json j = family_config(family);
    j["head_dim"] = 8;
    j["sliding_window"] = 6;
    j["max_window_layers"] = 1;
    j["use_sliding_window"] = false;  // the window is off: its keys are ignored
    ModelConfig c = parse(j);
    EXPECT_EQ(c.sliding_window, 0);
    EXPECT_TRUE(lists(c, "sliding_window"));
    EXPECT_TRUE(lists(c, "max_window_layers"));
    j["use_sliding_window"] = true;  // layers l >= max_window_layers slide (Qwen2Config)
    c = parse(j);
    EXPECT_EQ(c.sliding_window, 6);
    EXPECT_EQ(c.window_from_layer, 1);
    EXPECT_EQ(c.window_of(0), 0);
    EXPECT_EQ(c.window_of(1), 6);
    EXPECT_FALSE(lists(c, "sliding_window"));
    j["max_window_layers"] = 0;
    EXPECT_EQ(parse(j).window_of(0), 6);
    j["max_window_layers"] = 2;  // = num_hidden_layers: no layer slides
    EXPECT_EQ(parse(j).sliding_window, 0);
    j.erase("max_window_layers");  // default 28
    EXPECT_EQ(parse(j).sliding_window, 0);
    j["max_window_layers"] = -1;
    expect_error_naming(j, "max_window_layers");
    j["max_window_layers"] = 1;
    j["sliding_window"] = 0;
    expect_error_naming(j, "sliding_window");
    j["sliding_window"] = -3;
    j["use_sliding_window"] = false;  // refused even when off
    expect_error_naming(j, "sliding_window");
    j["sliding_window"] = 6;
    j["use_sliding_window"] = "true";
    expect_error_naming(j, "use_sliding_window must be true or false");
  }
}

TEST(HfFamilies, QwenLayerTypes) {
  json j = family_config("qwen2");
  j["use_sliding_window"] = true;
  j["sliding_window"] = 6;
  j["max_window_layers"] = 0;  // layer_types wins, as in transformers
  j["layer_types"] = {"full_attention", "sliding_attention"};
  ModelConfig c = parse(j);
  EXPECT_EQ(c.sliding_window, 6);
  EXPECT_EQ(c.window_from_layer, 1);
  j["layer_types"] = {"full_attention", "full_attention"};
  EXPECT_EQ(parse(j).sliding_window, 0);
  j["layer_types"] = {"sliding_attention", "sliding_attention"};
  EXPECT_EQ(parse(j).window_from_layer, 0);
  const json bad[] = {json({"sliding_attention", "full_attention"}),  // sliding first
                      json({"full_attention"}),                       // too short
                      json({"full_attention", "chunked_attention"}),
                      json({"full_attention", 1}),
                      json("full_attention"),
                      json(7)};
  for (const json& v : bad) {
    SCOPED_TRACE("layer_types = " + v.dump());
    j["layer_types"] = v;
    expect_error_naming(j, "layer_types");
  }
  j["layer_types"] = {"full_attention", "sliding_attention"};
  j["use_sliding_window"] = false;  // a sliding layer without a window
  expect_error_naming(j, "layer_types");
}

TEST(HfFamilies, Biases) {
  // Qwen2: q/k/v biases always (Qwen2Attention), attention_bias is not its key.
  json j = family_config("qwen2");
  ModelConfig c = parse(j);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.param_count() - parse(base_config()).param_count(), 2u * (48 + 16 + 16));
  j["attention_bias"] = true;
  EXPECT_TRUE(parse(j).qkv_bias);
  EXPECT_TRUE(lists(parse(j), "attention_bias"));
  // LLaMA, Mistral, Qwen3: attention_bias puts a bias on o_proj too: refused.
  for (const char* family : {"llama", "mistral", "qwen3"}) {
    SCOPED_TRACE(family);
    j = family_config(family);
    j["head_dim"] = 8;
    j["attention_bias"] = false;
    EXPECT_FALSE(parse(j).qkv_bias);
    j["attention_bias"] = true;
    expect_error_naming(j, "attention_bias = true is not supported");
    expect_error_naming(j, "o_proj");
  }
  for (const char* family : {"llama", "mistral", "qwen2", "qwen3"}) {
    SCOPED_TRACE(family);
    j = family_config(family);
    j["mlp_bias"] = true;
    expect_error_naming(j, "mlp_bias");
    for (const char* flag : {"attention_bias", "mlp_bias"})
      for (const json& v : {json("false"), json(0), json(1), json::array()}) {
        j = family_config(family);
        j[flag] = v;
        expect_error_naming(j, std::string(flag) + " must be true or false");
      }
  }
}

TEST(HfFamilies, QkNormIsQwen3s) {
  for (const char* family : {"llama", "mistral", "qwen2"}) {
    json j = family_config(family);
    EXPECT_FALSE(parse(j).qk_norm) << family;
  }
  json j = family_config("qwen3");
  j["head_dim"] = 8;
  const ModelConfig c = parse(j);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.param_count() - parse(base_config()).param_count(), 2u * 2 * 8);
}

TEST(HfFamilies, RopeScaling) {
  json j = base_config();
  for (const json& none :
       {json(nullptr), json({{"rope_type", "default"}}), json({{"type", "default"}})}) {
    j["rope_scaling"] = none;
    EXPECT_EQ(parse(j).rope_scaling.kind, RopeScalingKind::none) << none.dump();
  }
  const json llama3 = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 16}};
  j["rope_scaling"] = llama3;
  ModelConfig c = parse(j);
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::llama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.original_max_positions, 16);
  json t = llama3;
  t.erase("rope_type");
  t["type"] = "llama3";  // the older spelling
  j["rope_scaling"] = t;
  EXPECT_EQ(parse(j).rope_scaling.kind, RopeScalingKind::llama3);
  t.erase("original_max_position_embeddings");  // transformers: max_position_embeddings
  j["rope_scaling"] = t;
  EXPECT_EQ(parse(j).rope_scaling.original_max_positions, 256);

  for (const char* type : {"linear", "dynamic", "yarn", "longrope", "su", "mrope"}) {
    SCOPED_TRACE(type);
    j["rope_scaling"] = {{"rope_type", type}, {"factor", 2.0}};
    expect_error_naming(j, std::string("rope_scaling.rope_type \"") + type + "\" is not supported");
    expect_error_naming(j, "llama3");
  }
  struct Bad {
    const char* key;
    json value;
    const char* names;
  } bad[] = {{"factor", nullptr, "rope_scaling.factor"},
             {"factor", 0.5, "rope_scaling.factor"},
             {"factor", "8", "rope_scaling.factor"},
             {"low_freq_factor", 0, "rope_scaling.low_freq_factor"},
             {"low_freq_factor", true, "rope_scaling.low_freq_factor"},
             {"high_freq_factor", 1.0, "rope_scaling.high_freq_factor"},
             {"original_max_position_embeddings", "8192", "original_max_position_embeddings"},
             {"original_max_position_embeddings", 0, "original_max_position_embeddings"},
             {"attention_factor", 1.0, "rope_scaling.attention_factor"},
             {"rope_type", 3, "rope_scaling.rope_type"}};
  for (const auto& b : bad) {
    SCOPED_TRACE(std::string(b.key) + " = " + b.value.dump());
    json r = llama3;
    if (b.value.is_null())
      r.erase(b.key);
    else
      r[b.key] = b.value;
    j["rope_scaling"] = r;
    expect_error_naming(j, b.names);
  }
  j["rope_scaling"] = "llama3";
  expect_error_naming(j, "rope_scaling must be an object");
  j["rope_scaling"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
  expect_error_naming(j, "partial_rotary_factor");
}

// transformers 5.x writes rope_parameters (with rope_theta) and dtype.
TEST(HfFamilies, TransformersFiveRopeParameters) {
  json j = family_config("qwen3");
  j.erase("rope_theta");
  j.erase("torch_dtype");
  j["dtype"] = "bfloat16";
  j["head_dim"] = 16;
  j["rope_parameters"] = {{"rope_theta", 1000000.0}, {"rope_type", "default"}};
  ModelConfig c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::none);
  EXPECT_EQ(c.torch_dtype, DType::bf16);
  EXPECT_TRUE(lists(c, "dtype"));
  j["rope_parameters"] = {{"rope_theta", 500000.0},  {"rope_type", "llama3"},
                          {"factor", 32.0},          {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::llama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  j["rope_theta"] = 500000.0;  // both places, agreeing
  EXPECT_NO_THROW(parse(j));
  j["rope_theta"] = 10000.0;
  expect_error_naming(j, "rope_theta");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_theta", 1e4}, {"rope_type", "yarn"}, {"factor", 4.0}};
  expect_error_naming(j, "rope_parameters.rope_type \"yarn\" is not supported");
  j["rope_parameters"] = {{"rope_theta", -1.0}, {"rope_type", "default"}};
  expect_error_naming(j, "rope_parameters.rope_theta");
  // Per-layer-type rope parameters (a nested dict): not modelled.
  j["rope_parameters"] = {{"full_attention", {{"rope_theta", 1e4}, {"rope_type", "default"}}}};
  expect_error_naming(j, "rope_parameters.full_attention");
}

// The three MoE families load (issue 29, point 1): each published and tiny config.json to its
// preset, field by field (tests/data/configs/<name>.json).
TEST(HfMoe, ConfigsLoadToTheirPresets) {
  for (const char* name : {"mixtral-8x7b", "qwen1.5-moe-a2.7b", "qwen3-30b-a3b", "tiny-mixtral",
                           "tiny-qwen2-moe", "tiny-qwen3-moe"}) {
    SCOPED_TRACE(name);
    const ModelConfig c = load_hf_config(data_file(std::string("configs/") + name + ".json"));
    const ModelConfig p = *find_preset(name);
    EXPECT_EQ(c.family, p.family);
    for (auto [got, want] : {std::pair{c.vocab, p.vocab},
                             {c.hidden, p.hidden},
                             {c.intermediate, p.intermediate},
                             {c.layers, p.layers},
                             {c.heads, p.heads},
                             {c.kv_heads, p.kv_heads},
                             {c.max_positions, p.max_positions},
                             {c.head_dim(), p.head_dim()},
                             {c.sliding_window, p.sliding_window},
                             {c.experts, p.experts},
                             {c.experts_per_token, p.experts_per_token},
                             {c.expert_intermediate, p.expert_intermediate},
                             {c.shared_expert_intermediate, p.shared_expert_intermediate},
                             {c.decoder_sparse_step, p.decoder_sparse_step}})
      EXPECT_EQ(got, want);
    EXPECT_EQ(c.qkv_bias, p.qkv_bias);
    EXPECT_EQ(c.qk_norm, p.qk_norm);
    EXPECT_EQ(c.norm_topk_prob, p.norm_topk_prob);
    EXPECT_EQ(c.mlp_only_layers, p.mlp_only_layers);
    EXPECT_EQ(c.output_router_logits, false);
    EXPECT_DOUBLE_EQ(c.rms_eps, p.rms_eps);
    EXPECT_DOUBLE_EQ(c.rope_theta, p.rope_theta);
    EXPECT_EQ(c.tied_embeddings, p.tied_embeddings);
    EXPECT_EQ(c.torch_dtype, p.torch_dtype);
    EXPECT_TRUE(c.moe());
    EXPECT_EQ(c.param_count(), p.param_count());
    for (const auto& f : c.ignored_fields)
      EXPECT_EQ(f.find("unrecognised"), std::string::npos) << f;
  }
  // router_aux_loss_coef only scales the load-balancing loss: without output_router_logits it
  // changes nothing (read, listed as ignored); with it, the native step's loss weighs it.
  EXPECT_TRUE(
      lists(load_hf_config(data_file("configs/mixtral-8x7b.json")), "router_aux_loss_coef"));
  std::ifstream in(data_file("configs/mixtral-8x7b.json"));
  json j = json::parse(in);
  j["output_router_logits"] = true;
  j["router_aux_loss_coef"] = 0.25;
  const ModelConfig aux = parse_hf_config(j.dump(), "cfg.json");
  EXPECT_TRUE(aux.output_router_logits);
  EXPECT_EQ(aux.router_aux_loss_coef, 0.25);
  EXPECT_FALSE(lists(aux, "router_aux_loss_coef"));
  j.erase("router_aux_loss_coef");
  EXPECT_EQ(parse_hf_config(j.dump(), "cfg.json").router_aux_loss_coef, 0.001);  // the default
  for (const json& bad : {json(-0.5), json("0.1")}) {
    j["router_aux_loss_coef"] = bad;
    expect_error_naming(j, "router_aux_loss_coef must be a number >= 0, got " + bad.dump());
  }
}

// PyTorch's own count of the real classes (transformers 5.25 on the meta device,
// tests/data/hf_moe/counts.json, tools/hf_moe_facts.py): the totals, which layers are MoE, and
// every tensor of each kind of layer by name and shape, against parameter_specs.
TEST(HfMoe, ParametersEqualTheRealHfClasses) {
  const json doc = json::parse(read_text(data_file("hf_moe/counts.json")));
  int checked = 0;
  for (const auto& [name, want] : doc.at("counts").items()) {
    SCOPED_TRACE(name);
    const ModelConfig m = *find_preset(name);
    EXPECT_EQ(m.param_count(), want.at("total").get<std::uint64_t>());
    const auto specs = parameter_specs(m);
    EXPECT_EQ(parameter_count(specs), want.at("total").get<std::uint64_t>());
    const json& kinds = want.at("layer_kinds");
    ASSERT_EQ(std::int64_t(kinds.size()), m.layers);
    EXPECT_EQ(m.moe_layer_count(), want.at("moe_layers").get<std::int64_t>());
    for (std::int64_t l = 0; l < m.layers; ++l) {
      const std::string kind = kinds[std::size_t(l)];
      EXPECT_EQ(m.is_moe_layer(l), kind == "moe") << "layer " << l;
      // The layer's tensors, by name within the layer.
      std::map<std::string, std::vector<std::int64_t>> got;
      const std::string pre = "model.layers." + std::to_string(l) + ".";
      for (const ParamSpec& p : specs)
        if (p.name.rfind(pre, 0) == 0) got[p.name.substr(pre.size())] = p.shape;
      const json& by_name = want.at("per_layer").at(kind).at("by_name");
      EXPECT_EQ(got.size(), by_name.size()) << "layer " << l;
      for (const auto& [tensor, entry] : by_name.items()) {
        ASSERT_TRUE(got.count(tensor)) << "layer " << l << " lacks " << tensor;
        EXPECT_EQ(got.at(tensor), entry.at(0).get<std::vector<std::int64_t>>()) << tensor;
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 6);
}

// Errors name the field: a MoE key in a dense family, another MoE design's keys, jitter noise,
// a top-k above the experts, layer lists out of range, a windowed MoE model.
TEST(HfMoe, BadConfigsNameTheField) {
  const std::pair<const char*, json> fields[] = {{"num_experts", 64},
                                                 {"num_local_experts", 8},
                                                 {"num_experts_per_tok", 2},
                                                 {"moe_intermediate_size", 1408},
                                                 {"shared_expert_intermediate_size", 5632},
                                                 {"decoder_sparse_step", 1},
                                                 {"mlp_only_layers", json::array()},
                                                 {"norm_topk_prob", false},
                                                 {"output_router_logits", false},
                                                 {"router_aux_loss_coef", 0.001}};
  for (const char* family : {"llama", "mistral", "qwen2", "qwen3"})
    for (const auto& [key, value] : fields) {
      SCOPED_TRACE(std::string(family) + " " + key);
      json j = family_config(family);
      j[key] = value;
      expect_error_naming(j, std::string(key) + " is a mixture-of-experts field, but model_type " +
                                 family + " is dense");
    }
  const json mixtral = json::parse(read_text(data_file("configs/tiny-mixtral.json")));
  const json qwen2 = json::parse(read_text(data_file("configs/tiny-qwen2-moe.json")));
  for (const char* key : {"n_routed_experts", "n_shared_experts", "first_k_dense_replace"}) {
    json j = mixtral;
    j[key] = 2;
    expect_error_naming(j, std::string(key) + " belongs to another mixture-of-experts design");
  }
  struct Bad {
    json base;
    const char* key;
    json value;
    const char* needle;
  };
  for (const Bad& b :
       {Bad{mixtral, "router_jitter_noise", 0.01, "router_jitter_noise = 0.01"},
        Bad{mixtral, "num_experts_per_tok", 6,
            "num_experts_per_tok (6) must be at most the number of experts (5)"},
        Bad{mixtral, "num_local_experts", 0, "num_local_experts must be a positive"},
        Bad{qwen2, "moe_intermediate_size", -4, "moe_intermediate_size must be"},
        Bad{qwen2, "mlp_only_layers", json::array({6}),
            "mlp_only_layers entries must be layer indices 0 to 5, got 6"},
        Bad{qwen2, "mlp_only_layers", "3", "mlp_only_layers must be a list"},
        Bad{qwen2, "decoder_sparse_step", 0, "decoder_sparse_step must be a positive"},
        Bad{qwen2, "use_sliding_window", true,
            "use_sliding_window = true is not supported for model_type qwen2_moe"},
        Bad{qwen2, "norm_topk_prob", "yes", "norm_topk_prob must be true or false"}}) {
    SCOPED_TRACE(std::string(b.key) + " = " + b.value.dump());
    json j = b.base;
    j[b.key] = b.value;
    expect_error_naming(j, b.needle);
  }
  // Mixtral's num_experts is an alias of num_local_experts: both must agree.
  json j = mixtral;
  j["num_experts"] = 4;
  expect_error_naming(j, "num_experts and num_local_experts disagree");
  j["num_experts"] = 5;
  EXPECT_EQ(parse_hf_config(j.dump(), "cfg.json").experts, 5);
}

// Absent keys take transformers' defaults (MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig 5.25).
// The counts are PyTorch's: each class built on the meta device from its config class with
// vocab_size 96, hidden_size 256, intermediate_size 128, num_hidden_layers 2 and
// num_attention_heads 16 given and the rest defaulted (transformers 5.25.0, torch 2.15.0,
// 2026-12-06).
TEST(HfMoe, DefaultsAsTransformersConfigClasses) {
  struct Want {
    const char* type;
    std::int64_t E, k, im, is, kv;
    bool norm;
    std::uint64_t count;
  };
  for (const Want& w : {Want{"mixtral", 8, 2, 128, 0, 8, true, 2020608},
                        Want{"qwen2_moe", 60, 4, 1408, 5632, 16, false, 139019520},
                        Want{"qwen3_moe", 128, 8, 768, 0, 4, false, 151438656}}) {
    SCOPED_TRACE(w.type);
    json j = base_config();
    j["model_type"] = w.type;
    j["num_attention_heads"] = 16;
    j["hidden_size"] = 256;
    j.erase("num_key_value_heads");
    const ModelConfig c = parse_hf_config(j.dump(), "cfg.json");
    EXPECT_EQ(c.experts, w.E);
    EXPECT_EQ(c.experts_per_token, w.k);
    EXPECT_EQ(c.expert_intermediate, w.im);  // Mixtral: intermediate_size (128 here)
    EXPECT_EQ(c.shared_expert_intermediate, w.is);
    EXPECT_EQ(c.kv_heads, w.kv);
    EXPECT_EQ(c.norm_topk_prob, w.norm);
    EXPECT_EQ(c.head_dim(), 16);  // no default head_dim: h / a
    EXPECT_EQ(c.sliding_window, 0);
    EXPECT_EQ(c.moe_layer_count(), 2);
    EXPECT_EQ(c.param_count(), w.count);
  }
}

TEST(HfFamilies, DropoutAndOtherRefusals) {
  json j = base_config();
  j["attention_dropout"] = 0.0;
  EXPECT_TRUE(lists(parse(j), "attention_dropout"));
  j["attention_dropout"] = 0;
  EXPECT_NO_THROW(parse(j));
  for (const json& v : {json(0.1), json(1), json("0.0"), json(false)}) {
    j["attention_dropout"] = v;
    expect_error_naming(j, "attention_dropout");
  }
  j = base_config();
  j["pretraining_tp"] = 1;
  EXPECT_TRUE(lists(parse(j), "pretraining_tp"));
  j["pretraining_tp"] = 2;
  expect_error_naming(j, "pretraining_tp");
  j = family_config("qwen2");
  j["use_mrope"] = false;
  EXPECT_TRUE(lists(parse(j), "use_mrope"));
  j["use_mrope"] = true;
  expect_error_naming(j, "use_mrope");
  j = base_config();
  j["quantization_config"] = {{"quant_method", "gptq"}};
  expect_error_naming(j, "quantization_config");
  j = base_config();
  j["sliding_window"] = 4096;  // LlamaAttention has no window: not guessed
  expect_error_naming(j, "sliding_window");
  j = base_config();
  j["model_type"] = "gemma";
  expect_error_naming(j, "supported: llama, mistral, qwen2, qwen3");
}

TEST(HfFamilies, IgnoredAndUnrecognisedKeys) {
  json j = base_config();
  j["bos_token_id"] = 1;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["flux_capacitor"] = 88;
  const ModelConfig c = parse(j);
  for (const char* k : {"architectures", "bos_token_id", "initializer_range", "use_cache",
                        "torch_dtype", "flux_capacitor (unrecognised)"})
    EXPECT_TRUE(lists(c, k)) << k;
  for (const char* k :
       {"vocab_size", "hidden_size", "rope_theta", "hidden_act", "model_type", "flux_capacitor"})
    EXPECT_FALSE(lists(c, k)) << k;
  EXPECT_EQ(c.ignored_fields.size(), 6u);
}

// ---------------------------------------------------------------- fuzz-style

// Parsing either throws InputError whose message starts with the source, or returns a config
// that validates. Anything else is a failure (a crash fails the whole binary).
void expect_clear_error_or_valid(const std::string& text, const std::string& what) {
  try {
    const ModelConfig c = parse_hf_config(text, "fuzz");
    EXPECT_NO_THROW(c.validate()) << what;
    EXPECT_GT(c.param_count(), 0u) << what;
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("fuzz: ", 0), 0u) << what << "\n" << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": unexpected exception " << typeid(e).name() << ": " << e.what();
  } catch (...) {
    ADD_FAILURE() << what << ": unexpected non-std exception";
  }
}

TEST(HfConfigFuzz, EveryTruncation) {
  const std::string text = read_text(data_file("configs/llama3-8b.json"));
  ASSERT_GT(text.size(), 100u);
  // Every prefix that lacks the closing brace is invalid JSON; longer ones are the config.
  const std::size_t close = text.rfind('}');
  int accepted = 0;
  for (std::size_t n = 0; n < text.size(); ++n) {
    const std::string cut = text.substr(0, n);
    try {
      parse_hf_config(cut, "fuzz");
      if (n <= close) ++accepted;
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("fuzz: ", 0), 0u) << e.what();
    } catch (...) {
      ADD_FAILURE() << "truncation at " << n << ": not an InputError";
    }
  }
  EXPECT_EQ(accepted, 0) << "a truncation before byte " << close << " parsed";
}

TEST(HfConfigFuzz, RandomByteFlips) {
  const std::string text = base_config().dump(2);
  std::mt19937_64 rng(20230601);
  std::uniform_int_distribution<std::size_t> pos(0, text.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> count(1, 4);
  for (int it = 0; it < 3000; ++it) {
    std::string t = text;
    const int n = count(rng);
    for (int k = 0; k < n; ++k) t[pos(rng)] = static_cast<char>(byte(rng));
    expect_clear_error_or_valid(t, "flip iteration " + std::to_string(it));
    if (HasFailure()) return;
  }
}

// Random values, one field at a time (the error must then name that field) and several at
// once (clear error or valid config).
TEST(HfConfigFuzz, RandomFieldValues) {
  const std::vector<std::string> fields = {
      "model_type",        "vocab_size",          "hidden_size",         "intermediate_size",
      "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
      "rms_norm_eps",      "rope_theta",          "tie_word_embeddings", "torch_dtype",
      "head_dim",          "hidden_act"};
  std::mt19937_64 rng(42);
  auto pick = [&](std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
  };
  auto random_value = [&]() -> json {
    switch (pick(14)) {
      case 0:
        return -static_cast<std::int64_t>(pick(1u << 20)) - 1;  // negative
      case 1:
        return 0;
      case 2:
        return std::uniform_int_distribution<std::uint64_t>()(rng);  // huge unsigned
      case 3:
        return std::uint64_t{1} << pick(64);  // powers of two
      case 4:
        return static_cast<std::int64_t>(pick(300)) + 1;  // small positive
      case 5:
        return std::uniform_real_distribution<double>(-1e6, 1e6)(rng);
      case 6:
        return 1e308;
      case 7:
        return "4096";
      case 8:
        return nullptr;
      case 9:
        return json::array({1, 2});
      case 10:
        return json::object({{"a", 1}});
      case 11:
        return pick(2) == 0;
      case 12:
        return std::string(pick(100), 'x');
      default:
        return -1e-9;
    }
  };
  for (int it = 0; it < 3000; ++it) {
    json j = base_config();
    const bool single = it % 2 == 0;
    const std::size_t nfields = single ? 1 : 1 + pick(4);
    std::string changed;
    for (std::size_t k = 0; k < nfields; ++k) {
      const std::string& f = fields[pick(fields.size())];
      if (pick(8) == 0)
        j.erase(f);
      else
        j[f] = random_value();
      changed += f + "=" + (j.contains(f) ? j[f].dump() : "<erased>") + " ";
    }
    const std::string what = "iteration " + std::to_string(it) + ": " + changed;
    expect_clear_error_or_valid(j.dump(), what);
    if (single) {
      try {
        parse_hf_config(j.dump(), "fuzz");
      } catch (const InputError& e) {
        const std::string f = changed.substr(0, changed.find('='));
        EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << what << "\n" << e.what();
      }
    }
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace trainmem
