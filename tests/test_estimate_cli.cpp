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
  EXPECT_TRUE(has(r.out, "47.25")) << r.out;  // hf-eager
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
  };
  for (const auto& c : cases) {
    const Result r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args[0] << " " << c.args[1];
    EXPECT_TRUE(has(r.err, c.names)) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

TEST(EstimateCli, OverflowIsBadInput) {
  const Result r = run({"--model", "llama-65b", "--batch", "1000000000", "--seq", "1000000"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "overflow")) << r.err;
}

}  // namespace
}  // namespace trainmem::cli
