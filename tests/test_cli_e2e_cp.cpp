// End to end: --cp from the built binary. estimate's per-rank report books ring attention's
// buffers in communication (their bytes from the shapes, written here), profile on meta traces
// every rank equal to the analytic, maxbatch --vary seq finds the longest sequence a cp layout
// fits (a multiple of --step, 2·cp dividing it), and the refusals name their flags.
#include <gtest/gtest.h>

#include "test_cli_e2e_helpers.hpp"

namespace trainmem::e2e {
namespace {

// llama3-8b: kv heads 8, head dim 128.
TEST(CliE2ECp, EstimateBooksTheRingBuffersPerRank) {
  const Result r = trainmem(
      "estimate --model llama3-8b --world-size 8 --tp 2 --sp --cp 4 --zero 3 --batch 1 "
      "--seq 131072 --attention flash --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  EXPECT_EQ(j["layout"]["cp"].get<int>(), 4);
  EXPECT_EQ(j["layout"]["dp"].get<int>(), 1);
  const json& rank = j["ranks"][0];
  EXPECT_EQ(rank["ranks"].get<int>(), 8);
  std::uint64_t kv = 0, dkv = 0;
  for (const auto& e : rank["communication"]) {
    if (e["name"] == "ring.kv") kv = e["bytes"].get<std::uint64_t>();
    if (e["name"] == "ring.dkv") dkv = e["bytes"].get<std::uint64_t>();
  }
  // A block: (2, b, s/cp, kv/tp, d) = 2·1·32768·4·128 elements; two received (bf16), two fp32.
  const std::uint64_t block = 2ull * 32768 * 4 * 128;
  EXPECT_EQ(kv, 2 * block * 2);
  EXPECT_EQ(dkv, 2 * block * 4);
  // ZeRO-3 over the dp·cp = 4 ranks of the gradient group: the shard is a quarter of the
  // tensor-parallel rank's parameters.
  EXPECT_EQ(rank["shard_elements"].get<std::uint64_t>(),
            (rank["local_params"].get<std::uint64_t>() + 3) / 4);
}

TEST(CliE2ECp, ProfileOnMetaTracesEveryRankEqualToTheAnalytic) {
  const Result r = trainmem(
      "profile --backend meta --model tiny-qwen3 --world-size 8 --tp 2 --sp --cp 2 --zero 2 "
      "--batch 2 --seq 64 --attention flash --checkpointing full --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  EXPECT_TRUE(j["all_ranks_match"].get<bool>());
  for (const auto& rank : j["ranks"]) EXPECT_TRUE(rank["matches_analytic"].get<bool>());
}

TEST(CliE2ECp, MaxbatchVariesTheSequenceOfACpLayout) {
  const std::string base =
      "maxbatch --model llama3-8b --world-size 8 --tp 2 --sp --cp 4 --zero 3 --offload "
      "optimizer+params --attention flash --batch 1 --vary seq --budget 80GiB --format json";
  const Result r = trainmem(base + " --step 8192");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  const std::int64_t best = j["best"].get<std::int64_t>();
  EXPECT_GE(best, 131072) << "plan's worked example fits s 131072 in 76 GiB of 80";
  EXPECT_EQ(best % 8192, 0);
  const Result bad = trainmem(base + " --step 1004");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--step 1004 with --cp 4 and --vary seq: must be a multiple of 2·cp = 8"),
            std::string::npos)
      << bad.err;
}

TEST(CliE2ECp, RefusalsNameTheFlags) {
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {"estimate --model tiny --world-size 2 --cp 2 --seq 16", "--cp 2 needs --attention flash"},
      {"estimate --model tiny --world-size 4 --cp 2 --seq 18 --attention flash",
       "--cp 2: --seq 18 must be divisible by 2·cp = 4"},
      {"estimate --model tiny --world-size 6 --cp 4 --attention flash",
       "--world-size 6 is not divisible by --tp × --pp × --cp = 4"},
      {"estimate --model tiny --world-size 4 --cp 0 --attention flash", "--cp must be at least 1"},
      {"estimate --model tiny --world-size 4 --cp x", "--cp"},
  };
  for (const Case& c : cases) {
    const Result r = trainmem(c.args);
    EXPECT_EQ(r.code, 2) << c.args;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
  }
}

}  // namespace
}  // namespace trainmem::e2e
