// `trainmem estimate` end to end through run_cli: the table, --explain, every --format, the
// 3 × 2 table, --output, and bad input exiting 2 with a message naming the flag.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli.hpp"
#include "cli_in_process.hpp"

namespace trainmem::cli {
namespace {

using nlohmann::json;

using testing_in_process::Result;

Result run(std::vector<std::string> args) {
  args.insert(args.begin(), "estimate");
  return testing_in_process::run_trainmem(std::move(args));
}

bool has(const std::string& hay, const std::string& needle) {
  return testing_in_process::contains(hay, needle);
}

TEST(EstimateCli, PaperTableForLlama7b) {
  const Result r = run({"--model", "llama-7b", "--dtype", "fp16"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* h : {"Params", "Gradients", "Optimizer States", "Activations", "Total", "Peak"})
    EXPECT_TRUE(has(r.out, h)) << h;
  // The LOMO paper's AdamW row: params 12.55, gradients 12.55, states 75.31 (GiB).
  EXPECT_TRUE(has(r.out, "12.55      12.55             75.31")) << r.out;
  // ZeRO's 12·hbs: 12.00 GiB; Korthikanti: 27.00 GiB.
  EXPECT_TRUE(has(r.out, "zero ")) << r.out;
  EXPECT_TRUE(has(r.out, "12.00")) << r.out;
  EXPECT_TRUE(has(r.out, "27.00")) << r.out;
  // hf-eager: 47.25 GiB saved by autograd + 0.24 GiB of returned logits the loop holds.
  EXPECT_TRUE(has(r.out, "47.50")) << r.out;
}

TEST(EstimateCli, ExplainAnswersWhyNotTwelve) {
  const Result r = run({"--dtype", "fp16", "--explain"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "Why these activations?")) << r.out;
  EXPECT_TRUE(has(r.out, "40·sbh + 8·sbi + 8·as²b + 8·sb")) << r.out;  // hf-eager per layer
  EXPECT_TRUE(has(r.out, "34·sbh + 5·as²b")) << r.out;
  EXPECT_TRUE(has(r.out, "softmax_f32")) << r.out;
  EXPECT_TRUE(has(r.out, "x_squared_f32")) << r.out;
  EXPECT_TRUE(has(r.out, "i/h = 2.6875")) << r.out;
}

TEST(EstimateCli, AllOptimizersBothModesGiveSixGroups) {
  const Result r = run(
      {"--optimizer", "all", "--checkpointing", "both", "--profile", "native", "--format", "csv"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream in(r.out);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  ASSERT_EQ(lines.size(), 7u) << r.out;
  EXPECT_EQ(lines[0],
            "optimizer,checkpointing,profile,params,gradients,optimizer_states,activations,"
            "activations_peak,workspace,inputs,sum,peak");
  EXPECT_EQ(lines[1].rfind("adamw,none,native,", 0), 0u);
  EXPECT_EQ(lines[6].rfind("lomo,full,native,", 0), 0u);
}

TEST(EstimateCli, JsonSingleRunFollowsTheSchema) {
  const Result r = run({"--model", "tiny", "--batch", "2", "--seq", "16", "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j.at("schema"), "trainmem/1");
  for (const char* k : {"model", "run", "analytic"}) EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_FALSE(j.contains("measured"));
  EXPECT_FALSE(j.contains("reconciliation"));
  EXPECT_EQ(j.at("run").at("batch"), 2);
  EXPECT_EQ(j.at("run").at("seq"), 16);
  for (const char* p : {"native", "hf-eager", "megatron", "zero"}) {
    const json& a = j.at("analytic").at(p);
    for (const char* k :
         {"params", "gradients", "optimizer_states", "activations", "activations_peak", "workspace",
          "sum", "peak", "per_layer_activations", "coefficients"})
      EXPECT_TRUE(a.contains(k)) << p << "." << k;
  }
}

TEST(EstimateCli, JsonSeveralRunsUseRuns) {
  const Result r = run({"--model", "tiny", "--format", "json", "--checkpointing", "both"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j.at("runs").size(), 2u);
  EXPECT_EQ(j.at("runs")[1].at("run").at("checkpointing"), "full");
  EXPECT_LE(j.at("runs")[1].at("analytic").at("native").at("activations").get<std::uint64_t>(),
            j.at("runs")[0].at("analytic").at("native").at("activations").get<std::uint64_t>());
}

TEST(EstimateCli, BareCheckpointingFlagMeansFull) {
  const Result r = run({"--model", "tiny", "--format", "json", "--checkpointing"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out).at("run").at("checkpointing"), "full");
}

TEST(EstimateCli, MarkdownAndOutputFile) {
  const std::string path = ::testing::TempDir() + "/trainmem_estimate.md";
  const Result r = run({"--model", "tiny", "--format", "markdown", "--explain", "--output", path});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_TRUE(has(ss.str(), "| Profile | Params |")) << ss.str();
  EXPECT_TRUE(has(ss.str(), "#### native")) << ss.str();
  std::remove(path.c_str());
}

TEST(EstimateCli, ExplainCsvListsTensors) {
  const Result r = run({"--model", "tiny", "--profile", "native", "--format", "csv", "--explain"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("checkpointing,profile,group,name,shape,dtype,bytes,", 0), 0u) << r.out;
  EXPECT_TRUE(has(r.out, "none,native,layer,probs,\"(b,a,s,s)\",bf16,")) << r.out;
}

TEST(EstimateCli, BadInputExitsTwoNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    const char* names;
  };
  const std::vector<Case> cases = {
      {{"--batch", "0"}, "--batch"},
      {{"--seq", "1"}, "--seq"},
      {{"--dtype", "fp8"}, "--dtype"},
      {{"--optimizer", "adam"}, "--optimizer"},
      {{"--checkpointing", "half"}, "--checkpointing"},
      {{"--attention", "sparse"}, "--attention"},
      {{"--profile", "gpt"}, "--profile"},
      {{"--format", "xml"}, "--format"},
      {{"--model", "llama-1000b"}, "--model"},
      {{"--batch", "many"}, "--batch"},
      {{"--hf-version", "4.40"}, "--hf-version"},
      {{"--hf-version", "five"}, "--hf-version"},
      {{"--torch-version", "2.16"}, "--torch-version"},
      {{"--loop", "sft"}, "--loop"},
      {{"--profile", "hf-sdpa", "--hf-version", "4.30"}, "--hf-version"},
      {{"--hf-version", "5.25", "--torch-version", "2.4"}, "--torch-version"},
      {{"--paper", "zero"}, "--paper"},
      {{"--paper", "lomo"}, "--paper"},  // the default model is llama-7b but bf16
  };
  for (const auto& c : cases) {
    const Result r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args[0] << " " << c.args[1];
    EXPECT_TRUE(has(r.err, c.names)) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

TEST(EstimateCli, UnknownHfVersionNamesTheKnownEras) {
  const Result r = run({"--profile", "hf-eager", "--hf-version", "4.36.2"});
  EXPECT_EQ(r.code, 2);
  for (const char* era : {"4.28 (4.28.0-4.29.x)", "4.30 (4.30.x)", "4.31 (4.31.0-4.34.x)",
                          "4.35 (4.35.x)", "5.25 (5.25.x)"})
    EXPECT_TRUE(has(r.err, era)) << r.err;
}

// Release numbers map to their era: every 4.31-4.34 release prints the same figures.
TEST(EstimateCli, ReleasesOfOneEraGiveOneEstimate) {
  const auto acts = [](const std::string& v) {
    const Result r = run({"--profile", "hf-eager", "--hf-version", v, "--format", "json"});
    EXPECT_EQ(r.code, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["analytic"]["hf-eager"]["hf"]["transformers_version"], v);
    return j["analytic"]["hf-eager"]["activations"].get<std::uint64_t>();
  };
  EXPECT_EQ(acts("4.31.0"), acts("4.34.1"));
  EXPECT_NE(acts("4.30.2"), acts("4.31.0"));
  EXPECT_EQ(acts("4.28.1"), acts("4.29"));
}

// docs/faq.md's command for the LOMO paper's Table 1 (4.28/4.29 era, PyTorch < 2.2, the
// caller's shift + CrossEntropyLoss on fp16 logits, no KV cache, reentrant per-layer
// checkpointing): its activations are the by-hand sums of HfEagerByHand.LomoPaperSetup and it
// prints the paper's figures with the differences.
TEST(EstimateCli, LomoPaperTableCommand) {
  const std::vector<std::string> cmd = {
      "--model",   "llama-7b", "--batch",      "8",    "--seq",           "512",
      "--dtype",   "fp16",     "--optimizer",  "all",  "--checkpointing", "both",
      "--profile", "hf-eager", "--hf-version", "4.29", "--torch-version", "2.0",
      "--loop",    "shift-ce"};
  auto with_paper = cmd;
  with_paper.insert(with_paper.end(), {"--paper", "lomo"});
  const Result r = run(with_paper);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out,
                  "adamw      none           hf-eager        45.47  45.61  -0.14  145.88  "
                  "147.02  -1.14         146.02"))
      << r.out;
  EXPECT_TRUE(has(r.out,
                  "lomo       full           hf-eager         1.71   1.79  -0.08   14.51   "
                  "14.58  -0.07          14.58"))
      << r.out;
  auto json_cmd = cmd;
  json_cmd.insert(json_cmd.end(), {"--format", "json"});
  const Result j = run(json_cmd);
  ASSERT_EQ(j.code, 0) << j.err;
  const std::uint64_t b = 8, s = 512, h = 4096, i = 11008, a = 32, V = 32000, d = 128, L = 32;
  const std::uint64_t layer =
      36 * s * b * h + 8 * s * b * i + 8 * a * s * s * b + 8 * s * b + 4 * s * d + 4;
  const std::uint64_t head = 14 * s * b * h + 4 * s * b + 2 * b * (s - 1) * V + 8 * b * (s - 1) + 2;
  const json doc = json::parse(j.out);
  const auto& none = doc["runs"][0]["analytic"]["hf-eager"];
  EXPECT_EQ(none["activations"].get<std::uint64_t>(), L * layer + head + 2 * b * s * V);
  EXPECT_EQ(none["hf"]["loop"], "shift-ce");
  EXPECT_EQ(none["hf"]["transformers_era"], "4.28");
}

TEST(EstimateCli, OverflowIsBadInput) {
  const Result r = run({"--model", "llama-65b", "--batch", "1000000000", "--seq", "1000000"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "overflow")) << r.err;
}

}  // namespace
}  // namespace trainmem::cli
