// LoRA adapter targets and trainable counts (include/trainmem/base/lora.hpp) against peft's own
// count of the real HF classes (tools/peft_counts.py, tests/data/peft_counts.json: peft's
// get_nb_trainable_parameters() after get_peft_model on the meta device), and against the counts
// worked by hand in docs/lora-plan.md (section 2.8).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "trainmem/base/config.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/lora.hpp"

namespace trainmem {
namespace {

using json = nlohmann::json;

std::string read_data(const std::string& rel) {
  std::ifstream f(std::string(TRAINMEM_TEST_DATA_DIR) + "/" + rel);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(Lora, TrainableCountsEqualPeft) {
  const json doc = json::parse(read_data("peft_counts.json"));
  int checked = 0;
  for (const auto& item : doc.at("counts").items()) {
    SCOPED_TRACE(item.key());
    // "<preset>/<targets>/r<rank>"
    const std::string key = item.key();
    const auto a = key.find('/'), b = key.rfind('/');
    const std::string preset = key.substr(0, a), targets = key.substr(a + 1, b - a - 1);
    const std::int64_t rank = std::stoll(key.substr(b + 2));
    const ModelConfig m =
        load_hf_config(std::string(TRAINMEM_TEST_DATA_DIR) + "/configs/" + preset + ".json");
    const unsigned set = targets == "default" ? kLoraPeftDefault : parse_lora_targets(targets);
    // The modules peft wrapped are the ones we name.
    std::string wrapped;
    for (const auto& name : item.value().at("targets")) wrapped += name.get<std::string>() + " ";
    for (const char* name :
         {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
      EXPECT_EQ(wrapped.find(std::string(name) + " ") != std::string::npos,
                (set & parse_lora_targets(name)) != 0)
          << name << " in [" << wrapped << "]";
    EXPECT_EQ(lora_trainable_count(m, rank, set),
              item.value().at("trainable").get<std::uint64_t>());
    // peft's "all": the model's parameters plus the adapters.
    EXPECT_EQ(m.param_count() + lora_trainable_count(m, rank, set),
              item.value().at("all").get<std::uint64_t>());
    ++checked;
  }
  EXPECT_GE(checked, 72);
}

// docs/lora-plan.md 2.8, by hand: Llama-3-8B (h 4096, a·d 4096, k·d 1024, i 14336, 32 layers),
// r 16: all seven 16·(7h + 2·a·d + 2·k·d + 3i) = 1,310,720 per layer, 41,943,040 in all;
// q_proj and v_proj 16·(8,192 + 5,120)·32 = 6,815,744.
TEST(Lora, Llama3CountsWorkedByHand) {
  const ModelConfig m = *find_preset("llama3-8b");
  EXPECT_EQ(lora_trainable_count(m, 16, kLoraAllLinear), 41'943'040u);
  EXPECT_EQ(lora_trainable_count(m, 16, kLoraPeftDefault), 6'815'744u);
  EXPECT_EQ(lora_trainable_count(m, 16, kLoraDown), 16u * (14336 + 4096) * 32);
}

TEST(Lora, TargetListsParseAndName) {
  EXPECT_EQ(parse_lora_targets("all-linear"), kLoraAllLinear);
  EXPECT_EQ(parse_lora_targets("v_proj,q_proj"), kLoraPeftDefault);
  EXPECT_EQ(lora_targets_name(kLoraPeftDefault), "q_proj,v_proj");
  EXPECT_EQ(lora_targets_name(parse_lora_targets("down_proj,o_proj")), "o_proj,down_proj");
  EXPECT_EQ(lora_targets_name(kLoraAllLinear), "all-linear");
  EXPECT_EQ(parse_lora_targets(lora_targets_name(kLoraAllLinear)), kLoraAllLinear);
  auto message = [](const std::string& list) {
    try {
      parse_lora_targets(list);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("q_proj,lm_head").find("--lora-targets: unknown module 'lm_head'"),
            std::string::npos);
  EXPECT_NE(message("q_proj,lm_head").find("allowed: q_proj, k_proj"), std::string::npos);
  EXPECT_NE(message("q_proj,q_proj").find("listed twice"), std::string::npos);
  EXPECT_NE(message("").find("empty module name"), std::string::npos);
  EXPECT_NE(message("q_proj,").find("empty module name"), std::string::npos);
  EXPECT_NE(message("q_proj,,v_proj").find("unknown module ''"), std::string::npos);
  EXPECT_THROW(lora_trainable_count(*find_preset("llama3-8b"), 0, kLoraQ), InputError);
}

}  // namespace
}  // namespace trainmem
