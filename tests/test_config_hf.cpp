// HuggingFace config.json loading: real configs, every error naming its field, and a
// fuzz-style sweep (truncations, byte flips, random field values) asserting "a clear
// InputError or a valid config, never anything else".
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "trainmem/config.hpp"
#include "trainmem/error.hpp"

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

TEST(HfConfig, MistralIsRefusedNamingModelType) {
  try {
    load_hf_config(data_file("configs/mistral-7b.json"));
    ADD_FAILURE() << "mistral accepted";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model_type"), std::string::npos) << m;
    EXPECT_NE(m.find("model_type \"mistral\" is not supported"), std::string::npos) << m;
    EXPECT_NE(m.find("supported: llama"), std::string::npos) << m;
  }
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
  j["head_dim"] = 16;  // 48 / 6 = 8
  expect_error_naming(j, "head_dim");
  j["head_dim"] = 8;
  EXPECT_NO_THROW(parse_hf_config(j.dump(), "cfg.json"));
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
