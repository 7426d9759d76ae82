// End to end (issue 16): the families' config.json files and presets through the CLI. The
// report header states the features that depart from LLaMA in every format, --explain lists
// the config.json keys that change nothing, and a config trainmem does not model (mixture of
// experts, an unsupported rope_scaling) exits 2 naming the field.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>

#include "test_cli_e2e_helpers.hpp"

namespace trainmem::e2e {
namespace {

bool has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

std::string config(const std::string& name) {
  return std::string(TRAINMEM_TEST_DATA_DIR) + "/configs/" + name + ".json";
}

// A copy of a data config with some keys changed, in a temporary file.
std::string modified_config(const std::string& name, const json& changes, const std::string& leaf) {
  json j = json::parse(slurp(config(name)));
  for (const auto& item : changes.items()) j[item.key()] = item.value();
  const std::string path = temp_path(leaf);
  std::ofstream(path) << j.dump(2);
  return path;
}

TEST(CliE2EFamilies, EstimateLoadsQwen2ConfigAndExplainListsIgnoredKeys) {
  const std::string args = "estimate --model " + config("qwen2-7b") + " --batch 1 --seq 512";
  Result r = trainmem(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "(7.62 B params)")) << r.out;
  EXPECT_TRUE(has(r.out, "model family qwen2: q/k/v biases")) << r.out;
  EXPECT_FALSE(has(r.out, "config.json keys ignored")) << "listed without --explain";

  r = trainmem(args + " --explain");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(
      has(r.out,
          "config.json keys ignored (no effect on a training step): "
          "architectures, attention_dropout, bos_token_id, eos_token_id, initializer_range, "
          "max_window_layers, sliding_window, torch_dtype, transformers_version, "
          "use_cache"))
      << r.out;
  EXPECT_FALSE(has(r.err, "unrecognised")) << r.err;

  r = trainmem(args + " --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json m = r.j().at("model");
  EXPECT_EQ(m.at("family"), "qwen2");
  EXPECT_EQ(m.at("head_dim"), 128);
  EXPECT_EQ(m.at("qkv_bias"), true);
  EXPECT_EQ(m.at("qk_norm"), false);
  EXPECT_EQ(m.at("sliding_window"), 0);
  EXPECT_TRUE(m.at("rope_scaling").is_null());
  EXPECT_EQ(m.at("ignored_fields").size(), 10u) << m.dump();
}

TEST(CliE2EFamilies, FeaturesInEveryFormat) {
  const std::string base = "estimate --model tiny-qwen2 --batch 1 --seq 16";
  const std::string line = "model family qwen2: q/k/v biases; sliding window 6 from layer 1";
  for (const char* format : {"table", "markdown", "html"}) {
    const Result r = trainmem(base + " --format " + format);
    ASSERT_EQ(r.code, 0) << format << "\n" << r.err;
    EXPECT_TRUE(has(r.out, line)) << format << "\n" << r.out;
  }
  Result r = trainmem(base + " --format csv");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto rows = parse_csv(r.out);
  ASSERT_GE(rows.size(), 2u);
  EXPECT_EQ(rows[0][3], "family");
  EXPECT_EQ(rows[0][4], "features");
  EXPECT_EQ(rows[1][3], "qwen2");
  EXPECT_EQ(rows[1][4], "q/k/v biases; sliding window 6 from layer 1");
  r = trainmem(base + " --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json m = r.j().at("model");
  EXPECT_EQ(m.at("sliding_window"), 6);
  EXPECT_EQ(m.at("window_from_layer"), 1);
  EXPECT_EQ(m.at("features").size(), 2u);

  r = trainmem("estimate --model tiny-llama3 --batch 1 --seq 16 --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json s = r.j().at("model").at("rope_scaling");
  EXPECT_EQ(s.at("rope_type"), "llama3");
  EXPECT_EQ(s.at("factor"), 8.0);
  EXPECT_EQ(s.at("original_max_position_embeddings"), 16);
  r = trainmem("estimate --model tiny-qwen3 --batch 1 --seq 16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out,
                  "model family qwen3: head_dim 16 (hidden_size / num_attention_heads = "
                  "12); q/k RMSNorm per head (q_norm, k_norm)"))
      << r.out;
  // A LLaMA states nothing more than before.
  r = trainmem("estimate --model tiny-gqa --batch 1 --seq 16 --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(r.j().at("model").contains("family"));
  r = trainmem("estimate --model tiny-gqa --batch 1 --seq 16");
  EXPECT_FALSE(has(r.out, "model family")) << r.out;
}

TEST(CliE2EFamilies, EveryFamilyConfigEstimates) {
  for (const char* name :
       {"mistral-7b", "qwen2.5-0.5b", "qwen2.5-7b", "qwen3-0.6b", "qwen3-8b", "llama3.2-1b"}) {
    const Result r = trainmem("estimate --model " + config(name) + " --batch 1 --seq 256");
    EXPECT_EQ(r.code, 0) << name << "\n" << r.err;
  }
}

TEST(CliE2EFamilies, RefusedConfigsExitTwoNamingTheField) {
  struct Case {
    std::string path;
    std::vector<std::string> message;
  } cases[] = {
      {modified_config(
           "qwen2-7b",
           {{"model_type", "qwen2_moe"}, {"num_experts", 60}, {"use_sliding_window", true}},
           "moe1.json"),
       {"use_sliding_window = true is not supported for model_type qwen2_moe"}},
      {modified_config("qwen3-8b", {{"num_experts", 128}, {"num_experts_per_tok", 8}}, "moe2.json"),
       {"num_experts is a mixture-of-experts field, but model_type qwen3 is dense"}},
      {modified_config("mistral-7b", {{"num_local_experts", 8}}, "moe3.json"),
       {"num_local_experts"}},
      {modified_config("llama3.2-1b", {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}},
                       "yarn.json"),
       {"rope_scaling.rope_type \"yarn\" is not supported", "llama3"}},
      {modified_config("mistral-7b", {{"sliding_window", 0}}, "window.json"),
       {"sliding_window must be a positive integer"}},
      {modified_config("qwen3-0.6b", {{"head_dim", 127}}, "hd.json"),
       {"head_dim must be a positive even integer"}},
      {modified_config("qwen3-0.6b", {{"attention_bias", "no"}}, "bias.json"),
       {"attention_bias must be true or false"}},
  };
  for (const auto& c : cases) {
    const Result r = trainmem("estimate --model " + c.path + " --batch 1 --seq 64");
    EXPECT_EQ(r.code, 2) << c.path << "\n" << r.err;
    for (const auto& m : c.message) EXPECT_TRUE(has(r.err, m)) << c.path << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    std::remove(c.path.c_str());
  }
}

// The MoE families load (presets and config.json files). estimate answers with hf-eager,
// hf-sdpa and native (trainmem's own MoE layer: router, routed experts, Qwen1.5-MoE's shared
// expert; a warning names what answers), profile and the per-rank plan run them; megatron and
// hf-peft refuse them with exit 2, naming the model_type, the experts and the count; nothing is
// printed on stdout then. tiny-qwen2-moe mixes dense and MoE layers (native, hf-eager and hf-sdpa
// all count its dense layers apart).
TEST(CliE2EFamilies, MoeModelsEstimateWithHfAndNativeProfilesAndTheRestRefusesThem) {
  struct Case {
    std::string model, type, count;
    bool mixed;
  };
  for (const Case& c : {Case{"mixtral-8x7b", "mixtral", "46702792704", false},
                        Case{config("qwen1.5-moe-a2.7b"), "qwen2_moe", "14315784192", false},
                        Case{"qwen3-30b-a3b", "qwen3_moe", "30532122624", false},
                        Case{"tiny-qwen2-moe", "qwen2_moe", "326080", true}}) {
    SCOPED_TRACE(c.model);
    const bool native = true;
    const Result e = trainmem("estimate --model " + c.model + " --batch 1 --seq 64 --format json");
    ASSERT_EQ(e.code, 0) << e.err;
    EXPECT_TRUE(has(e.err, "only native, hf-eager, hf-sdpa model it")) << e.err;
    EXPECT_FALSE(has(e.err, "native left out")) << e.err;
    const json j = e.j();
    ASSERT_EQ(j["analytic"].size(), 3u) << j["analytic"];
    for (const auto& [name, a] : j["analytic"].items()) {
      EXPECT_EQ(a["params"].get<std::uint64_t>(), 2 * std::stoull(c.count)) << name;  // bf16
      EXPECT_EQ(a.value("dense_layers", 0), c.mixed ? 4 : 0) << name;
    }
    EXPECT_EQ(j["model"]["moe"]["moe_layers"] == j["model"]["layers"], !c.mixed);
    EXPECT_EQ(j["analytic"]["hf-eager"]["hf"]["experts_implementation"], "grouped_mm");
    // --experts-impl eager: the loop's list (2·T·k·h more per layer, less 8·T·k and 4·E).
    const Result l = trainmem("estimate --model " + c.model +
                              " --batch 1 --seq 64 --experts-impl eager --format json");
    ASSERT_EQ(l.code, 0) << l.err;
    EXPECT_EQ(l.j()["analytic"]["hf-eager"]["hf"]["experts_implementation"], "eager");
    EXPECT_GT(l.j()["analytic"]["hf-eager"]["per_layer_activations"].get<std::uint64_t>(),
              j["analytic"]["hf-eager"]["per_layer_activations"].get<std::uint64_t>());
    for (const std::string cmd : {"estimate --profile hf-peft --finetune lora --batch 1 --seq 64",
                                  "estimate --profile megatron --batch 1 --seq 64",
                                  "plan --gpus 8 --gpu-memory 80GiB --global-batch 8 --seq 64",
                                  "estimate --profile native --batch 1 --seq 64",
                                  "profile --backend meta --batch 1 --seq 64"}) {
      SCOPED_TRACE(cmd);
      const std::string sub = cmd.substr(0, cmd.find(' '));
      // plan searches the per-rank native step's layouts (docs/distributed.md, "Mixture of
      // experts per rank").
      const bool runs_native =
          cmd.find("native") != std::string::npos || sub == "profile" || sub == "plan";
      const Result r = trainmem(sub + " --model " + c.model + cmd.substr(cmd.find(' ')) +
                                (native && runs_native ? " --format json" : ""));
      if (native && runs_native) {
        // Mixtral-8x7B's AdamW states alone exceed 8 × 80 GB; plan fits it with the optimizer
        // offloaded to the host (docs/distributed.md, "Expert parallelism").
        ASSERT_EQ(r.code, 0) << r.err;
        if (sub == "plan" && c.model == "mixtral-8x7b") {
          const auto plan = r.j();
          const auto best = plan["candidates"][0]["layout"];
          EXPECT_EQ(best["offload"], "optimizer") << best.dump();
          EXPECT_EQ(best["ep"], 8) << best.dump();
        }
        EXPECT_TRUE(r.j().contains(sub == "profile" ? "measured"
                                   : sub == "plan"  ? "candidates"
                                                    : "analytic"))
            << r.out;
        continue;
      }
      EXPECT_EQ(r.code, 2) << r.err;
      EXPECT_TRUE(has(r.err, "model_type " + c.type)) << r.err;
      EXPECT_TRUE(has(r.err, c.count + " parameters") && has(r.err, "models dense layers only"))
          << r.err;
      EXPECT_TRUE(r.out.empty()) << r.out;
    }
  }
}

// --experts-impl is a MoE model's: on a dense model, or with an unknown name, exit 2.
TEST(CliE2EFamilies, ExpertsImplIsRefusedWhereItMeansNothing) {
  const Result d = trainmem("estimate --model tiny --experts-impl eager");
  EXPECT_EQ(d.code, 2);
  EXPECT_TRUE(has(d.err, "--experts-impl eager: tiny is not a mixture of experts")) << d.err;
  const Result u = trainmem("estimate --model tiny-mixtral --experts-impl loop");
  EXPECT_EQ(u.code, 2);
  EXPECT_TRUE(
      has(u.err, "--experts-impl: unknown implementation 'loop'; allowed: grouped_mm, eager"))
      << u.err;
}

TEST(CliE2EFamilies, UnrecognisedKeyWarnsAndIsListed) {
  const std::string path = modified_config("tiny-mistral", {{"flux_capacitor", 88}}, "unk.json");
  const Result r = trainmem("estimate --model " + path + " --batch 1 --seq 16 --explain");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "flux_capacitor")) << r.err;
  EXPECT_TRUE(has(r.out, "flux_capacitor (unrecognised)")) << r.out;
  std::remove(path.c_str());
}

// --profile all on a MoE model whose experts' rows torch._grouped_mm refuses (tiny-qwen3-moe:
// 36 bf16 values, 72 bytes): the HF profiles are left out with the reason (the real class raises
// under the default grouped_mm), native answers; under --experts-impl eager all three do.
TEST(CliE2EFamilies, ProfileAllLeavesOutHfWhereGroupedMmWouldRaise) {
  const Result r = trainmem("estimate --model tiny-qwen3-moe --batch 1 --seq 8 --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err,
                  "hf-eager and hf-sdpa left out under --experts-impl grouped_mm: "
                  "torch._grouped_mm needs rows of a multiple of 16 bytes"))
      << r.err;
  EXPECT_EQ(r.j()["analytic"].size(), 1u);
  EXPECT_TRUE(r.j()["analytic"].contains("native"));
  const Result e = trainmem(
      "estimate --model tiny-qwen3-moe --batch 1 --seq 8 --experts-impl eager --format json");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_EQ(e.j()["analytic"].size(), 3u);
}

// --dump-routing (issue 29, point 3): the cpu run of a MoE model writes the tokens each expert
// received per layer, the same as the report's measured.ledger.routing;
// the golden's routing is the real MixtralForCausalLM's (its metadata, routing_l<l>). A dense
// model, or the meta backend (which routes nothing), exits 2 naming the flag.
TEST(CliE2EFamilies, DumpRoutingWritesTheMeasuredHistogram) {
  const std::string path = temp_path("routing.json");
  const std::string data = std::string(TRAINMEM_TEST_DATA_DIR) + "/golden_tiny_mixtral_";
  const Result r = trainmem("profile --model " + data + "config.json --weights " + data +
                            "weights.safetensors --tokens " + data +
                            "tokens.bin --batch 2 --seq 16 --dtype fp32 --steps 1 --backend cpu "
                            "--optimizer sgd --format json --dump-routing " +
                            path);
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(path);
  const json d = json::parse(in);
  EXPECT_EQ(d["experts"], 4);
  EXPECT_EQ(d["experts_per_token"], 2);
  ASSERT_EQ(d["layers"].size(), 2u);
  EXPECT_EQ(d["layers"][0]["tokens_per_expert"], json({13, 24, 3, 24}));
  EXPECT_EQ(d["layers"][1]["tokens_per_expert"], json({21, 13, 12, 18}));
  EXPECT_EQ(r.j()["measured"]["ledger"]["routing"]["layers"], d["layers"]);
  std::remove(path.c_str());
  for (const std::string& bad :
       {std::string("profile --model tiny --backend cpu --dump-routing ") + path,
        std::string("profile --model tiny-mixtral --backend meta --dump-routing ") + path}) {
    const Result e = trainmem(bad + " --batch 1 --seq 8");
    EXPECT_EQ(e.code, 2) << bad;
    EXPECT_TRUE(has(e.err, "--dump-routing " + path)) << e.err;
    EXPECT_TRUE(e.out.empty());
  }
}

// --capacity-factor 0.75 on the same run: ⌈(32·2/4)·0.75⌉ = 12 rows per expert. Layer 0 routes
// the embeddings as the real MixtralForCausalLM did (13, 24, 3, 24), so it drops 1 + 12 + 12 =
// 25 choices; every layer drops what its histogram has past 12. The bad values and the profiles
// that model no capacity exit 2 naming the flag.
TEST(CliE2EFamilies, CapacityFactorDropsWhatEachExpertHasPastItsCapacity) {
  const std::string data = std::string(TRAINMEM_TEST_DATA_DIR) + "/golden_tiny_mixtral_";
  const Result r = trainmem("profile --model " + data + "config.json --weights " + data +
                            "weights.safetensors --tokens " + data +
                            "tokens.bin --batch 2 --seq 16 --dtype fp32 --steps 1 --backend cpu "
                            "--optimizer sgd --format json --capacity-factor 0.75");
  ASSERT_EQ(r.code, 0) << r.err;
  const json routing = r.j()["measured"]["ledger"]["routing"];
  EXPECT_EQ(r.j()["run"]["capacity_factor"], 0.75);
  EXPECT_EQ(routing["capacity"], 12);
  EXPECT_EQ(routing["capacity_factor"], 0.75);
  ASSERT_EQ(routing["layers"].size(), 2u);
  EXPECT_EQ(routing["layers"][0]["tokens_per_expert"], json({13, 24, 3, 24}));
  EXPECT_EQ(routing["layers"][0]["dropped"], 25);
  for (const json& layer : routing["layers"]) {
    std::int64_t past = 0, total = 0;
    for (const json& c : layer["tokens_per_expert"]) {
      past += std::max<std::int64_t>(0, c.get<std::int64_t>() - 12);
      total += c.get<std::int64_t>();
    }
    EXPECT_EQ(total, 64);
    EXPECT_EQ(layer["dropped"], past);
  }
  // The ledger holds 4·12 expert rows per layer, as the native profile counts them.
  ASSERT_FALSE(r.j()["reconciliation"].empty());
  for (const json& row : r.j()["reconciliation"]) EXPECT_EQ(row["difference"], 0) << row.dump();
  for (const auto& [cmd, needle] : std::vector<std::pair<std::string, std::string>>{
           {"estimate --model tiny --capacity-factor 1", "tiny is not a mixture of experts"},
           {"estimate --model tiny-mixtral --capacity-factor 0", "--capacity-factor: '0'"},
           {"estimate --model tiny-mixtral --capacity-factor 1x", "--capacity-factor: '1x'"},
           {"estimate --model tiny-mixtral --capacity-factor 1 --profile hf-eager",
            "--profile hf-eager with --capacity-factor 1"},
           {"estimate --model tiny-mixtral --capacity-factor 1e12",
            "--capacity-factor 1e+12: 5 experts"}}) {
    const Result e = trainmem(cmd + " --batch 1 --seq 8");
    EXPECT_EQ(e.code, 2) << cmd;
    EXPECT_TRUE(has(e.err, needle)) << cmd << ": " << e.err;
    EXPECT_TRUE(e.out.empty()) << cmd;
  }
}

// The cpu run of golden `name` (its weights and tokens; b 2, s 16, fp32, sgd, one step, `extra`
// flags) dumps its routing, then the meta trace is given that file: both measured ledgers.
std::pair<json, json> cpu_then_meta_given_its_routing(const std::string& name,
                                                      const std::string& extra) {
  const std::string path = temp_path(name + "_routing.json");
  const std::string data = std::string(TRAINMEM_TEST_DATA_DIR) + "/golden_" + name + "_";
  const std::string common = "profile --model " + data +
                             "config.json --batch 2 --seq 16 --dtype fp32 --steps 1 --optimizer "
                             "sgd --format json " +
                             extra + " ";
  const Result cpu =
      trainmem(common + "--backend cpu --weights " + data + "weights.safetensors --tokens " + data +
               "tokens.bin --dump-routing " + path);
  EXPECT_EQ(cpu.code, 0) << cpu.err;
  const Result meta = trainmem(common + "--backend meta --routing " + path);
  EXPECT_EQ(meta.code, 0) << meta.err;
  std::remove(path.c_str());
  if (cpu.code != 0 || meta.code != 0) return {};
  for (const json& row : cpu.j()["reconciliation"]) EXPECT_EQ(row["difference"], 0) << row.dump();
  EXPECT_EQ(meta.j()["measured"]["ledger"]["routing"]["source"], "file " + path);
  return {cpu.j()["measured"]["ledger"], meta.j()["measured"]["ledger"]};
}

// Routing as data (issue 29, point 3): the cpu run of the real Mixtral's weights and tokens,
// under a capacity, dumps its routing; the meta trace given that file reports the same
// histograms and dropped choices (each expert keeps min(routed, 12)), and its ledger is the cpu
// run's figure for figure. Without a file the meta trace says it assumed balanced routing.
TEST(CliE2EFamilies, MetaGivenTheDumpedRoutingReproducesTheCpuRun) {
  auto [lc, lm] = cpu_then_meta_given_its_routing("tiny_mixtral", "--capacity-factor 0.75");
  ASSERT_FALSE(lc.is_null());
  EXPECT_EQ(lc["routing"]["source"], "measured");
  EXPECT_EQ(lm["routing"]["layers"], lc["routing"]["layers"]);  // counts and drops
  lc.erase("routing");
  lm.erase("routing");
  EXPECT_EQ(lm, lc);
  const std::string data = std::string(TRAINMEM_TEST_DATA_DIR) + "/golden_tiny_mixtral_";
  const Result balanced = trainmem("profile --model " + data +
                                   "config.json --batch 2 --seq 16 --dtype fp32 --steps 1 "
                                   "--optimizer sgd --format json --capacity-factor 0.75 "
                                   "--backend meta");
  ASSERT_EQ(balanced.code, 0) << balanced.err;
  const json b = balanced.j()["measured"]["ledger"]["routing"];
  EXPECT_EQ(b["source"], "balanced");
  for (const json& layer : b["layers"]) {
    EXPECT_EQ(layer["tokens_per_expert"], json({16, 16, 16, 16}));
    EXPECT_EQ(layer["dropped"], 16);  // 4 past 12 at each expert
  }
}

// Qwen2-MoE with a dense layer between two MoE ones (the real class's weights and tokens): the
// routing lists layers 0 and 2 with the real Qwen2MoeForCausalLM's histograms, and the meta trace
// given it reproduces the cpu run's ledger (the dense layer's rows and the MoE layers' alike).
TEST(CliE2EFamilies, MixedDenseAndMoeLayersRouteAndTraceLayerByLayer) {
  auto [lc, lm] = cpu_then_meta_given_its_routing("tiny_qwen2_moe_mixed", "");
  ASSERT_FALSE(lc.is_null());
  EXPECT_EQ(lc["routing"]["layers"],
            json::parse(R"([{"layer": 0, "tokens_per_expert": [22, 6, 4, 5, 17, 10]},
                            {"layer": 2, "tokens_per_expert": [7, 12, 3, 8, 20, 14]}])"));
  EXPECT_EQ(lm["routing"]["layers"], lc["routing"]["layers"]);
  lc.erase("routing");
  lm.erase("routing");
  EXPECT_EQ(lm, lc);
  // tiny-qwen2-moe's layer 0 is dense: the measured per-layer figure is its first MoE layer's
  // (layer 1), as the native profile's per-layer list is a MoE layer's (its dense layers apart).
  const Result q = trainmem(
      "profile --model tiny-qwen2-moe --batch 1 --seq 64 --backend cpu "
      "--steps 1 --format json");
  ASSERT_EQ(q.code, 0) << q.err;
  const json qj = q.j();
  const json& by_layer = qj["measured"]["ledger"]["per_layer_activations_by_layer"];
  EXPECT_EQ(qj["measured"]["ledger"]["per_layer_activations"], by_layer[1]);
  EXPECT_NE(by_layer[0], by_layer[1]);
  EXPECT_EQ(qj["measured"]["ledger"]["per_layer_activations"],
            qj["analytic"]["native"]["per_layer_activations"]);
}

// A routing file that is not this run's is refused naming the field: every check of
// read_routing_file, on files written here.
TEST(CliE2EFamilies, RoutingFilesThatDoNotFitTheRunAreRefusedNamingTheField) {
  const std::string path = temp_path("bad_routing.json");
  // tiny-mixtral: 5 experts, top 2, 2 layers; b 1, s 8: 16 choices per layer.
  const json good = {{"experts", 5},
                     {"experts_per_token", 2},
                     {"batch", 1},
                     {"seq", 8},
                     {"layers",
                      {{{"layer", 0}, {"tokens_per_expert", {4, 4, 4, 2, 2}}},
                       {{"layer", 1}, {"tokens_per_expert", {8, 8, 0, 0, 0}}}}}};
  auto with = [&](const std::function<void(json&)>& f) {
    json d = good;
    f(d);
    return d;
  };
  const std::string run =
      "profile --model tiny-mixtral --batch 1 --seq 8 --backend meta --routing ";
  {
    std::ofstream(path) << good.dump();
    const Result ok = trainmem(run + path + " --format json");
    ASSERT_EQ(ok.code, 0) << ok.err;
    EXPECT_EQ(ok.j()["measured"]["ledger"]["routing"]["layers"], good["layers"]);
  }
  for (const auto& [doc, needle] : std::vector<std::pair<json, std::string>>{
           {with([](json& d) { d["experts"] = 8; }), "experts: 8, but this run has"},
           {with([](json& d) { d["experts_per_token"] = 1; }), "experts_per_token: 1"},
           {with([](json& d) { d["batch"] = 2; }), "batch: 2, but this run has --batch 1"},
           {with([](json& d) { d.erase("seq"); }), "seq: missing"},
           {with([](json& d) { d["layers"].erase(1); }), "layers: 1 entries, but tiny-mixtral"},
           {with([](json& d) { d["layers"][1]["layer"] = 0; }), "layers[1].layer: 0, expected 1"},
           {with([](json& d) {
              d["layers"][0]["tokens_per_expert"] = {4, 4, 4, 4};
            }),
            "layers[0].tokens_per_expert: not an array of 5 counts"},
           {with([](json& d) {
              d["layers"][0]["tokens_per_expert"] = {9, 3, 4, 0, 0};
            }),
            "layers[0].tokens_per_expert[0]: 9 is outside [0, b·s = 8]"},
           {with([](json& d) {
              d["layers"][0]["tokens_per_expert"] = {4, 4, 4, 2, 1};
            }),
            "layers[0].tokens_per_expert: sums to 15, but b·s·K = 16"},
           {with([](json& d) { d["layers"][0]["tokens_per_expert"][2] = 4.5; }),
            "layers[0].tokens_per_expert[2]: not an integer"},
           {json::array(), "the document: not a JSON object"}}) {
    std::ofstream(path) << doc.dump();
    const Result e = trainmem(run + path);
    EXPECT_EQ(e.code, 2) << needle;
    EXPECT_TRUE(has(e.err, "--routing " + path + ": " + needle)) << e.err;
    EXPECT_TRUE(e.out.empty());
  }
  for (const auto& [cmd, needle] : std::vector<std::pair<std::string, std::string>>{
           {"profile --model tiny --backend meta --routing balanced", "tiny is not a mixture"},
           {"profile --model tiny --world-size 2 --backend meta --routing balanced",
            "--routing balanced: tiny is not a mixture"},
           {"profile --model tiny-mixtral --backend cpu --routing balanced", "add --backend meta"},
           {"profile --model tiny-mixtral --backend meta --routing /nonexistent.json",
            "/nonexistent.json"}}) {
    const Result e = trainmem(cmd + " --batch 1 --seq 8");
    EXPECT_EQ(e.code, 2) << cmd;
    EXPECT_TRUE(has(e.err, needle)) << cmd << ": " << e.err;
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace trainmem::e2e
