// `trainmem estimate --profile hf-eager|hf-sdpa --world-size N --fsdp2`: the HF step per rank
// under PyTorch FSDP2, as a user runs it (the sequence itself is proven against real FSDP2 in
// test_hf_step_fsdp2.cpp). The figures are checked against closed forms written here from
// FSDP2's sharding rule (docs/distributed.md, "FSDP2"), not read back from the code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "test_cli_e2e_helpers.hpp"

namespace trainmem::e2e {
namespace {

using u64 = std::uint64_t;

// tiny-awkward: vocabulary 71, hidden 40, intermediate 104, 3 layers, 5 heads of 8, 1 KV head.
// Its parameters' dim 0 and the product of the others, in model.parameters() order.
struct Shape {
  u64 rows, cols;
};
std::vector<Shape> awkward_shapes() {
  std::vector<Shape> s = {{71, 40}};
  for (int l = 0; l < 3; ++l)
    for (Shape p : {Shape{40, 40}, Shape{8, 40}, Shape{8, 40}, Shape{40, 40}, Shape{104, 40},
                    Shape{104, 40}, Shape{40, 104}, Shape{40, 1}, Shape{40, 1}})
      s.push_back(p);
  s.push_back({40, 1});
  s.push_back({71, 40});
  return s;
}

TEST(CliE2EHfFsdp2, EveryRankOnceWithItsShardAndStatesByHand) {
  const Result r = trainmem(
      "estimate --model tiny-awkward --profile hf-eager --world-size 4 --fsdp2 --batch 2 --seq 64 "
      "--format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  EXPECT_EQ(j["world_size"], 4);
  EXPECT_EQ(j["precision"], "pure");
  EXPECT_EQ(j["reshard_after_forward"], true);
  // Each rank holds every parameter's padded chunk of ceil(rows / 4) rows (bf16) and AdamW's
  // two bf16 moments over the rows it owns; over all ranks the owned rows are the model.
  u64 shard = 0, params = 0;
  for (const Shape& p : awkward_shapes()) {
    shard += 2 * ((p.rows + 3) / 4) * p.cols;
    params += p.rows * p.cols;
  }
  EXPECT_EQ(params, 54920u);
  std::set<int> seen;
  u64 states = 0, worst = 0;
  for (const json& g : j["rank_groups"]) {
    for (int k = g["first_rank"]; k <= g["last_rank"].get<int>(); ++k)
      EXPECT_TRUE(seen.insert(k).second) << k;
    EXPECT_EQ(g["live_at_start_by_category"]["params"].get<u64>(), shard);
    const u64 ranks = g["last_rank"].get<u64>() - g["first_rank"].get<u64>() + 1;
    states += ranks * g["live_at_start_by_category"]["optimizer_states"].get<u64>();
    EXPECT_GT(g["peak"].get<u64>(), g["live_at_start"].get<u64>());
    worst = std::max(worst, g["peak"].get<u64>());
    // the layers' gathered parameters are booked as communication at the peak
    EXPECT_GT(g["peak_by_category"]["communication"].get<u64>(), 0u);
  }
  EXPECT_EQ(seen, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(states, 2 * 2 * params);
  EXPECT_EQ(j["worst_peak"].get<u64>(), worst);

  // --precision mixed under FSDP2: an fp32 model under MixedPrecisionPolicy(bf16, fp32): the
  // shards and both moments in fp32, the gathers in bf16 (the same gathered bytes).
  const Result m = trainmem(
      "estimate --model tiny-awkward --profile hf-eager --world-size 4 --fsdp2 --batch 2 --seq 64 "
      "--format json --precision mixed");
  ASSERT_EQ(m.code, 0) << m.err;
  const json mj = m.j();
  EXPECT_EQ(mj["precision"], "mixed");
  u64 mixed_states = 0;
  for (const json& g : mj["rank_groups"]) {
    EXPECT_EQ(g["live_at_start_by_category"]["params"].get<u64>(), 2 * shard);
    mixed_states += (g["last_rank"].get<u64>() - g["first_rank"].get<u64>() + 1) *
                    g["live_at_start_by_category"]["optimizer_states"].get<u64>();
  }
  EXPECT_EQ(mixed_states, 2 * 4 * params);
}

// reshard_after_forward=False (--zero 2) keeps every layer gathered from its forward to its
// backward: never less at the peak than resharding after each layer.
TEST(CliE2EHfFsdp2, ShardGradOpHoldsTheLayersGathered) {
  auto peak = [](const std::string& extra) {
    const Result r = trainmem(
        "estimate --model tiny-gqa --profile hf-sdpa --world-size 2 --fsdp2 --batch 2 --seq 32 "
        "--format json" +
        extra);
    EXPECT_EQ(r.code, 0) << r.err;
    return r.j();
  };
  const json full = peak(""), grad_op = peak(" --zero 2");
  EXPECT_EQ(grad_op["reshard_after_forward"], false);
  EXPECT_GT(grad_op["worst_peak"].get<u64>(), full["worst_peak"].get<u64>());
  // the text form names the recipe and the rank groups
  const Result t = trainmem(
      "estimate --model tiny-gqa --profile hf-sdpa --world-size 2 --fsdp2 --batch 2 --seq 32");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("the HF step per rank under FSDP2"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("--precision pure, the default here"), std::string::npos) << t.out;
}

// maxbatch searches with the worst rank's HF step under FSDP2: the answer's step fits the budget
// in estimate's report of the same layout, one more does not.
TEST(CliE2EHfFsdp2, MaxbatchAnswersWithTheWorstRanksStep) {
  for (const std::string prof : {"hf-sdpa", "hf-eager"}) {
    SCOPED_TRACE(prof);
    const std::string layout = " --model tiny-gqa --profile " + prof +
                               " --world-size 2 --fsdp2 --seq 64 --cuda-context 0 --nccl-memory 0";
    const Result r = trainmem("maxbatch --budget 8MiB --format json" + layout);
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = r.j();
    EXPECT_EQ(j["profile"], prof);
    EXPECT_EQ(j["hf"]["precision"], "pure");
    const std::int64_t best = j["best"];
    ASSERT_GT(best, 0);
    auto worst_at = [&](std::int64_t b) {
      const Result e = trainmem("estimate --format json --batch " + std::to_string(b) + layout);
      EXPECT_EQ(e.code, 0) << e.err;
      return e.j()["worst_peak"].get<u64>();
    };
    EXPECT_EQ(j["worst_rank_peak"].get<u64>(), worst_at(best));
    EXPECT_LE(worst_at(best), 8u << 20);
    EXPECT_GT(worst_at(best + 1), 8u << 20);
  }
}

// Many ranks: a rank that owns no row of a parameter holds empty AdamW moments (no storage),
// which the allocator replay passes over as PyTorch's allocator never sees them; the groups are
// rank ranges covering every rank once, found without visiting each rank.
TEST(CliE2EHfFsdp2, ManyRanksAndRanksOwningNoRow) {
  const Result r = trainmem(
      "estimate --model tiny-awkward --profile hf-eager --world-size 100 --fsdp2 --batch 1 "
      "--seq 32 --allocator pytorch --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  EXPECT_EQ(j["peak_kind"], "reserved");
  int next = 0;
  for (const json& g : j["rank_groups"]) {
    EXPECT_EQ(g["first_rank"].get<int>(), next);
    next = g["last_rank"].get<int>() + 1;
    EXPECT_GE(g["allocator_model"]["run_reserved_peak"].get<u64>(), g["peak"].get<u64>());
  }
  EXPECT_EQ(next, 100);
  const Result big = trainmem(
      "estimate --model llama3-8b --profile hf-sdpa --world-size 1048576 --fsdp2 --batch 1 "
      "--seq 512 --format json");
  ASSERT_EQ(big.code, 0) << big.err;
  EXPECT_LT(big.out.size(), 200000u);  // a few groups, not a million ranks
  EXPECT_LE(big.j()["rank_groups"].size(), 13u);
}

TEST(CliE2EHfFsdp2, WhatItDoesNotModelExits2NamingTheFlag) {
  const std::string base = "estimate --model tiny --seq 32 --batch 1 --profile hf-eager ";
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"--world-size 2", "--fsdp2"},
           {"--world-size 4 --tp 2 --fsdp2", "--fsdp2"},
           {"--world-size 2 --zero 3", "--fsdp2"},
           {"--world-size 2 --fsdp2 --precision amp", "--precision amp"},
           {"--world-size 2 --fsdp2 --adamw-impl fused", "--adamw-impl fused"},
           {"--world-size 2 --fsdp2 --explain", "--explain"},
           {"--world-size 2 --fsdp2 --optimizer sgd", "--optimizer"},
           {"--world-size 2 --fsdp2 --prefetch 3", "--prefetch"},
           {"--world-size 2 --fsdp2 --reduce-bucket 1000", "--reduce-bucket"},
           {"--world-size 2 --fsdp2 --overlap-comm", "--overlap-comm"},
           {"--world-size 4294967298 --fsdp2", "--world-size"},
           {"--world-size 2000000 --fsdp2", "--world-size"}}) {
    const Result r = trainmem(base + args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.err.find(want), std::string::npos) << args << ": " << r.err;
  }
  const Result m =
      trainmem("maxbatch --model tiny --seq 32 --budget 1GiB --profile hf-eager --world-size 2");
  EXPECT_EQ(m.code, 2) << m.out;
  EXPECT_NE(m.err.find("--fsdp2"), std::string::npos) << m.err;
}

}  // namespace
}  // namespace trainmem::e2e
