// DeepSpeed ZeRO-3's per-rank model states against trainmem's flat ZeRO-3: the goldens in
// tests/data/deepspeed_zero3/ were written by tools/deepspeed_zero3_states.py, which ran real
// DeepSpeed 0.19.8 (stage 3, no offload, torch.optim.AdamW) with PyTorch 2.15.0 and
// transformers 5.25.0 in 2, 3 and 4 gloo processes on the CPU (LLaMA at the even and odd shapes
// of tools/fsdp2_states.py, bf16 and fp32) and recorded every rank's partitions and states
// (docs/distributed.md, "DeepSpeed ZeRO-3, measured"). No DeepSpeed here: the goldens' figures
// are checked against DeepSpeed's rule written here and against trainmem's per-rank estimate.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/base/parallel.hpp"

namespace trainmem {
namespace {

using nlohmann::json;
using u64 = std::uint64_t;

struct Golden {
  std::string name;
  json j;
  ModelConfig model;  // LlamaConfig(**config.llama) with transformers' defaults, as config.json
};

const std::vector<Golden>& goldens() {
  static const std::vector<Golden> all = [] {
    std::vector<Golden> v;
    const std::string dir = std::string(TRAINMEM_TEST_DATA_DIR) + "/deepspeed_zero3";
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.path().extension() != ".json") continue;
      std::ifstream in(e.path());
      Golden g;
      g.name = e.path().filename().string();
      g.j = json::parse(in);
      json cfg = g.j["config"]["llama"];
      cfg["model_type"] = "llama";
      cfg["max_position_embeddings"] = 2048;  // LlamaConfig's defaults
      cfg["rms_norm_eps"] = 1e-6;
      cfg["rope_theta"] = 10000.0;
      g.model = parse_hf_config(cfg.dump(), g.name);
      v.push_back(std::move(g));
    }
    std::sort(v.begin(), v.end(), [](const Golden& a, const Golden& b) { return a.name < b.name; });
    return v;
  }();
  return all;
}

u64 ceil_div(u64 a, u64 b) {
  return (a + b - 1) / b;
}

// DeepSpeed's rule, rank by rank: each parameter is partitioned alone, ceil(numel / N) elements
// per rank (the last rank's partition padded), one flat bf16/fp32 buffer of the partitions; the
// gradient partitions, the fp32 master and both AdamW moments cover the same elements; one fp32
// `step`.
TEST(DeepSpeedZero3, EveryRankHoldsEachParametersCeilingShare) {
  ASSERT_EQ(goldens().size(), 12u);
  for (const auto& g : goldens()) {
    const u64 n = g.j["nprocs"];
    for (const json& r : g.j["ranks"]) {
      SCOPED_TRACE(g.name + " rank " + r["rank"].dump());
      u64 want = 0;
      for (const json& p : r["params"]) {
        EXPECT_EQ(p["ds_numel"].get<u64>(), ceil_div(p["numel"], n)) << p["name"];
        want += ceil_div(p["numel"], n);
      }
      const json& t = r["totals"];
      const u64 e = t["params"]["dtype"] == "bfloat16" ? 2 : 4;
      EXPECT_EQ(t["params"]["numel"].get<u64>(), want);
      EXPECT_EQ(t["params"]["bytes"].get<u64>(), e * want);
      EXPECT_EQ(t["grad_partitions"]["bytes"].get<u64>(), e * want);
      EXPECT_EQ(t["fp32_master"]["bytes"].get<u64>(), 4 * want);
      EXPECT_EQ(t["exp_avg"]["bytes"].get<u64>(), 4 * want);
      EXPECT_EQ(t["exp_avg_sq"]["bytes"].get<u64>(), 4 * want);
      EXPECT_EQ(t["step"]["bytes"].get<u64>(), 4u);
    }
  }
}

// trainmem's flat ZeRO-3 (--zero 3, --sharding flat) pads one flat vector once: where every
// parameter's numel divides by N (here on 2 and 4 ranks: every numel is a multiple of 128) its
// shard is DeepSpeed's
// partition element for element; otherwise DeepSpeed's per-parameter padding makes its
// partition larger by less than one element per parameter. The bytes per element: parameters
// and gradients w each; the optimizer states 12 with a 16-bit model (fp32 master, m, v: DeepSpeed
// the same, plus its 4-byte step) and 8 in fp32 (m, v), where DeepSpeed 0.19.8 with torch 2.15
// keeps a separate fp32 master copy too (12 per element).
TEST(DeepSpeedZero3, TrainmemsFlatShardAgainstDeepSpeedsPartitions) {
  int exact = 0;
  for (const auto& g : goldens()) {
    SCOPED_TRACE(g.name);
    const json& r = g.j["ranks"][0];
    const u64 n = g.j["nprocs"];
    const bool bf16 = r["totals"]["params"]["dtype"] == "bfloat16";
    const u64 w = bf16 ? 2 : 4;
    u64 total = 0, ds = 0, params = 0;
    bool divides = true;
    for (const json& p : r["params"]) {
      total += p["numel"].get<u64>();
      ds += ceil_div(p["numel"], n);
      divides = divides && p["numel"].get<u64>() % n == 0;
      ++params;
    }
    TrainConfig t;
    t.batch = 2;
    t.seq = 16;
    t.dtype = bf16 ? DType::bf16 : DType::f32;
    ParallelConfig par;
    par.world = static_cast<std::int64_t>(n);
    par.zero = 3;
    par.resolve(false, g.model, t);
    const LayoutEstimate le = estimate_layout(g.model, t, par);
    ASSERT_EQ(le.ranks.size(), 1u);
    const RankEstimate& rk = le.ranks[0];
    EXPECT_EQ(rk.local_params, total);
    EXPECT_EQ(rk.shard_elements, ceil_div(total, n));
    if (divides) {
      EXPECT_EQ(rk.shard_elements, ds);
      ++exact;
    } else {
      EXPECT_GT(ds, rk.shard_elements);
      EXPECT_LT(ds - rk.shard_elements, params);
    }
    EXPECT_EQ(rk.est.figures.params, w * rk.shard_elements);
    EXPECT_EQ(r["totals"]["params"]["bytes"].get<u64>(), w * ds);
    const u64 ds_states = r["totals"]["fp32_master"]["bytes"].get<u64>() +
                          r["totals"]["exp_avg"]["bytes"].get<u64>() +
                          r["totals"]["exp_avg_sq"]["bytes"].get<u64>() +
                          r["totals"]["step"]["bytes"].get<u64>();
    EXPECT_EQ(ds_states, 12 * ds + 4);
    EXPECT_EQ(rk.est.figures.optimizer_states, (bf16 ? 12 : 8) * rk.shard_elements);
  }
  EXPECT_EQ(exact, 8);  // both shapes and dtypes on 2 and 4 ranks; none on 3
}

}  // namespace
}  // namespace trainmem
