// The HF step goldens (tests/data/hf_step*/): every .json of a folder, parsed, with the model
// its config.json describes (as `--model config.json` reads it), sorted by file name.
#pragma once
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainmem/base/config.hpp"

namespace trainmem::test {

struct HfGolden {
  std::string name;
  nlohmann::json j;
  ModelConfig model;
};

inline std::vector<HfGolden> load_hf_goldens(const std::string& folder) {
  std::vector<HfGolden> v;
  const std::string dir = std::string(TRAINMEM_TEST_DATA_DIR) + "/" + folder;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".json") continue;
    std::ifstream in(e.path());
    HfGolden g;
    g.name = e.path().filename().string();
    g.j = nlohmann::json::parse(in);
    // transformers' generic config keys (chunk_size_feed_forward, ...) draw a warning each
    const auto level = spdlog::get_level();
    spdlog::set_level(spdlog::level::err);
    g.model = parse_hf_config(g.j["config"].dump(), g.name);
    spdlog::set_level(level);
    v.push_back(std::move(g));
  }
  std::sort(v.begin(), v.end(),
            [](const HfGolden& a, const HfGolden& b) { return a.name < b.name; });
  return v;
}

}  // namespace trainmem::test
