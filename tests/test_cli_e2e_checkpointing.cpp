// End to end: the per-layer checkpointing policies as a user types them (issue 30, point 1):
// every:K, layers:LIST and budget:SIZE on estimate, profile and compare, the lists compare
// takes, and the errors. What is asserted follows from what a policy is: a checkpointed layer
// keeps its (b, s, h) output instead of its whole set, so each one saves the difference; the
// budget's choice fits it and one layer fewer does not.
#include <gtest/gtest.h>

#include "test_cli_e2e_helpers.hpp"

namespace trainmem::e2e {
namespace {

std::uint64_t u64(const json& j) {
  return j.get<std::uint64_t>();
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(CliE2ECheckpointing, EveryKSavesOneLayerSetPerCheckpointedLayer) {
  const std::string base = "estimate --model llama-7b --batch 2 --seq 256 --format json";
  const Result none = trainmem(base + " --checkpointing none");
  const Result every = trainmem(base + " --checkpointing every:4");
  ASSERT_EQ(none.code, 0) << none.err;
  ASSERT_EQ(every.code, 0) << every.err;
  const json n = none.j(), e = every.j();
  EXPECT_EQ(e["run"]["checkpointing"], "every:4");
  const std::uint64_t X = 2 * 256 * 4096 * 2;  // a layer's output (b, s, h) in bf16
  for (const std::string profile : {"native", "megatron", "zero", "hf-eager"}) {
    SCOPED_TRACE(profile);
    const json& pn = n["analytic"][profile];
    const json& pe = e["analytic"][profile];
    EXPECT_EQ(u64(pe["checkpointed_layers"]), 8u);  // layers 3, 7, ..., 31 of 32
    EXPECT_EQ(u64(pn["checkpointed_layers"]), 0u);
    // Each of the 8 keeps X instead of its whole set (the plain run's per-layer bytes), plus
    // what checkpointing keeps once for all layers (HF: the checkpoints' shared mask and
    // position ids; none elsewhere).
    const std::uint64_t S = u64(pn["per_layer_activations"]);
    const std::uint64_t shared = u64(pe["shared_activations"]) - u64(pn["shared_activations"]);
    if (profile != "hf-eager") {
      EXPECT_EQ(shared, 0u);
    }
    EXPECT_EQ(u64(pe["activations"]), u64(pn["activations"]) - 8 * (S - X) + shared);
    std::uint64_t in_group = 0;
    for (const auto& t : pe["tensors"])
      if (t["group"] == "layer_checkpointed") in_group += u64(t["bytes"]);
    EXPECT_EQ(in_group, X);
  }
  // The text report names the policy.
  const Result text = trainmem("estimate --model llama-7b --checkpointing every:4");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_TRUE(has(text.out, "checkpointing every:4")) << text.out;
}

TEST(CliE2ECheckpointing, ProfileRunsTheListedLayersAndMatchesTheNativeProfile) {
  const Result r = trainmem(
      "profile --model tiny-awkward --batch 2 --seq 24 --backend cpu --checkpointing layers:1 "
      "--format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  EXPECT_EQ(j["run"]["checkpointing"], "layers:1");
  const json& ledger = j["measured"]["ledger"];
  const json& native = j["analytic"]["native"];
  for (const char* k : {"activations", "activations_peak", "workspace", "peak"})
    EXPECT_EQ(u64(ledger[k]), u64(native[k])) << k;
  // One layer's rows are recomputed in backward (phase recompute), the others' are not.
  int recomputed = 0;
  for (const auto& t : j["tensors"])
    if (t["phase"] == "recompute") {
      EXPECT_EQ(t["layer"], 1) << t.dump();
      ++recomputed;
    }
  EXPECT_GT(recomputed, 0);
}

TEST(CliE2ECheckpointing, BudgetPicksTheFewestFirstLayersThatFit) {
  const std::string base = "profile --model small-256 --batch 4 --seq 128 --backend meta";
  // The peaks with the first layer checkpointed, and with none.
  const Result one = trainmem(base + " --checkpointing layers:0 --format json");
  const Result none = trainmem(base + " --format json");
  ASSERT_EQ(one.code, 0) << one.err;
  ASSERT_EQ(none.code, 0) << none.err;
  const std::uint64_t p1 = u64(one.j()["measured"]["ledger"]["peak"]);
  const std::uint64_t p0 = u64(none.j()["measured"]["ledger"]["peak"]);
  ASSERT_LT(p1, p0);
  const Result r =
      trainmem(base + " --checkpointing budget:" + std::to_string(p1) + " --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["run"]["checkpointing"], "budget:" + std::to_string(p1) + " (layers 0)");
  EXPECT_EQ(u64(r.j()["measured"]["ledger"]["peak"]), p1);
  // A budget the plain step fits needs no layer.
  const Result all_fit =
      trainmem(base + " --checkpointing budget:" + std::to_string(p0) + " --format json");
  ASSERT_EQ(all_fit.code, 0) << all_fit.err;
  EXPECT_EQ(all_fit.j()["run"]["checkpointing"], "budget:" + std::to_string(p0) + " (no layer)");
  // Below every choice: exit 2, with the best peak there is.
  const Result tight = trainmem(base + " --checkpointing budget:1MiB");
  EXPECT_EQ(tight.code, 2);
  EXPECT_TRUE(has(tight.err, "budget:1MiB: no choice fits")) << tight.err;
}

// budget:SIZE is resolved per optimizer: AdamW's states need layers checkpointed where SGD's and
// LOMO's step already fits.
TEST(CliE2ECheckpointing, BudgetPicksLayersForEachOptimizer) {
  const Result r = trainmem(
      "estimate --model llama-7b --batch 8 --seq 512 --optimizer all --checkpointing "
      "budget:110GiB --profile native --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json runs = r.j()["runs"];
  ASSERT_EQ(runs.size(), 3u);
  for (const auto& run : runs) {
    const std::string opt = run["run"]["optimizer"];
    const std::string name = run["run"]["checkpointing"];
    EXPECT_LE(u64(run["analytic"]["native"]["peak"]), 110ull << 30) << opt;
    if (opt == "adamw") {
      EXPECT_TRUE(has(name, "budget:110GiB (layers 0-")) << name;
    } else {
      EXPECT_EQ(name, "budget:110GiB (no layer)") << opt;
    }
  }
}

TEST(CliE2ECheckpointing, CompareTakesAListOfPolicies) {
  const Result r = trainmem(
      "compare --model tiny-awkward --batch 2 --seq 24 --backend meta "
      "--checkpointing none,layers:0,2,full --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  ASSERT_EQ(j["runs"].size(), 3u);
  EXPECT_EQ(j["runs"][0]["run"]["checkpointing"], "none");
  EXPECT_EQ(j["runs"][1]["run"]["checkpointing"], "layers:0,2");
  EXPECT_EQ(j["runs"][2]["run"]["checkpointing"], "full");
  ASSERT_EQ(j["comparisons"].size(), 2u);
  EXPECT_EQ(j["comparisons"][0]["checkpointing"], "layers:0,2");
  EXPECT_EQ(j["comparisons"][1]["checkpointing"], "full");
  for (const auto& c : j["comparisons"]) EXPECT_EQ(c["activations_saved_ok"], true) << c.dump();
  // Two of three layers save less than three.
  EXPECT_LT(j["comparisons"][0]["activations_saved"].get<std::int64_t>(),
            j["comparisons"][1]["activations_saved"].get<std::int64_t>());
  const Result text = trainmem(
      "compare --model tiny-awkward --batch 2 --seq 24 --backend meta --checkpointing every:2");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_TRUE(has(text.out, "one extra forward of 1 of the 3 layers")) << text.out;
}

TEST(CliE2ECheckpointing, SelectiveRecomputesTheProbabilitiesOnly) {
  // tiny-gqa: 2 layers, 6 heads; b 2, s 32 in bf16: each layer's probs is 2·6·32·32·2 B.
  const std::string base =
      "profile --model tiny-gqa --batch 2 --seq 32 --backend cpu --format json";
  const Result none = trainmem(base);
  const Result sel = trainmem(base + " --checkpointing selective");
  ASSERT_EQ(none.code, 0) << none.err;
  ASSERT_EQ(sel.code, 0) << sel.err;
  const json n = none.j(), j = sel.j();
  EXPECT_EQ(j["run"]["checkpointing"], "selective");
  for (const char* k : {"activations", "activations_peak", "workspace", "peak"})
    EXPECT_EQ(u64(j["measured"]["ledger"][k]), u64(j["analytic"]["native"][k])) << k;
  const std::uint64_t probs = 2 * 6 * 32 * 32 * 2;
  EXPECT_EQ(u64(j["measured"]["ledger"]["activations"]),
            u64(n["measured"]["ledger"]["activations"]) - 2 * probs);
  const Result cmp = trainmem(
      "compare --model tiny-gqa --batch 2 --seq 32 --backend meta --checkpointing "
      "none,selective,full");
  ASSERT_EQ(cmp.code, 0) << cmp.err;
  EXPECT_TRUE(has(cmp.out, "AdamW, selective: activations")) << cmp.out;
  EXPECT_TRUE(has(cmp.out, "the attention core (scores, softmax, the product with v)")) << cmp.out;
}

TEST(CliE2ECheckpointing, BadPoliciesExitTwoNamingTheFlag) {
  struct Case {
    std::string args, message;
  };
  for (const Case& c : std::vector<Case>{
           {"profile --model tiny --backend meta --checkpointing layers:9",
            "layer 9 is out of range; the model has 2 layers (0-1)"},
           {"estimate --model tiny --checkpointing every:0", "K must be an integer from 1"},
           {"profile --model tiny --backend meta --checkpointing none,full", "runs one policy"},
           {"maxbatch --model tiny --seq 64 --budget 1GiB --checkpointing budget:100MiB",
            "cannot pick the layers for a budget"},
           {"compare --model tiny --backend meta --checkpointing none",
            "compare runs checkpointing none against other policies"},
           {"estimate --model tiny --checkpointing sometimes", "unknown policy 'sometimes'"}}) {
    SCOPED_TRACE(c.args);
    const Result r = trainmem(c.args);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_TRUE(has(r.err, "--checkpointing")) << r.err;
    EXPECT_TRUE(has(r.err, c.message)) << r.err;
  }
}

// maxbatch with a list of policies: one search per policy, each the answer maxbatch gives for
// that policy alone, with the recompute FLOPs of the native step at that size; one GPU and a
// layout of several.
TEST(CliE2ECheckpointing, MaxbatchSearchesEachPolicyOfAList) {
  // One GPU (no device: no overhead added) and two ranks (the stated per-GPU overheads added).
  for (const std::string layout : {" --budget 256MiB", " --budget 1GiB --world-size 2 --zero 3"}) {
    SCOPED_TRACE(layout);
    const std::string base =
        "maxbatch --model small-256 --batch 2 --vary seq --step 64 --format json" + layout;
    const Result all = trainmem(base + " --checkpointing none,selective,every:2,full");
    ASSERT_EQ(all.code, 0) << all.err;
    const json j = all.j();
    ASSERT_EQ(j["policies"].size(), 4u);
    std::int64_t none_best = 0;
    for (const auto& p : j["policies"]) {
      const std::string name = p["checkpointing"].get<std::string>();
      const Result one = trainmem(base + " --checkpointing " + name);
      ASSERT_EQ(one.code, 0) << one.err;
      const json o = one.j();
      const std::int64_t alone =
          (layout.find("world") == std::string::npos ? o["seq"] : o["best"]).get<std::int64_t>();
      ASSERT_GT(alone, 0) << name << ": the budget is meant to fit every policy";
      EXPECT_EQ(p["best"].get<std::int64_t>(), alone) << name;
      if (name == "none") {
        none_best = p["best"].get<std::int64_t>();
        EXPECT_EQ(p["recompute_flops"].get<double>(), 0.0);
      } else {
        EXPECT_GE(p["best"].get<std::int64_t>(), none_best) << name;
        EXPECT_GT(p["recompute_flops"].get<double>(), 0.0) << name;
      }
    }
  }
  const Result text = trainmem(
      "maxbatch --model small-256 --batch 2 --vary seq --step 64 --budget 256MiB "
      "--checkpointing none,full");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_TRUE(has(text.out, "maxbatch per checkpointing policy")) << text.out;
}

}  // namespace
}  // namespace trainmem::e2e
