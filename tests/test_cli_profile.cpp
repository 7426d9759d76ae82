// `trainmem profile` end to end: the binary runs the step(s) on the cpu and meta backends and
// writes the JSON of docs/design.md; the measured ledger agrees with the analytic native profile;
// --weights/--tokens/--dump reproduce the PyTorch golden data; bad input exits 2 with a
// message naming the flag; an out-of-memory exits 3 with the report still written.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_cli_e2e_helpers.hpp"
#include "trainmem/base/safetensors.hpp"

using json = nlohmann::json;
using trainmem::SafeTensorsReader;

namespace {

std::string data(const std::string& leaf) {
  return std::string(TRAINMEM_TEST_DATA_DIR) + "/" + leaf;
}
using trainmem::e2e::Result;
using trainmem::e2e::slurp;
using trainmem::e2e::temp_path;

Result run_trainmem(const std::string& args) {
  return trainmem::e2e::trainmem(args);
}

const char* kFigureKeys[] = {"params",
                             "gradients",
                             "optimizer_states",
                             "activations",
                             "activations_peak",
                             "workspace",
                             "inputs",
                             "sum",
                             "peak"};

void check_profile_json(const json& j, const std::string& backend) {
  EXPECT_EQ(j.at("schema"), "trainmem/1");
  for (const char* k :
       {"name", "params", "layers", "hidden", "intermediate", "heads", "kv_heads", "vocab"})
    EXPECT_TRUE(j.at("model").contains(k)) << k;
  for (const char* k :
       {"batch", "seq", "dtype", "optimizer", "checkpointing", "attention", "backend", "steps"})
    EXPECT_TRUE(j.at("run").contains(k)) << k;
  EXPECT_EQ(j["run"]["backend"], backend);
  const json& led = j.at("measured").at("ledger");
  const json& nat = j.at("analytic").at("native");
  for (const char* k : kFigureKeys) {
    ASSERT_TRUE(led.contains(k)) << k;
    EXPECT_EQ(led[k].get<std::uint64_t>(), nat.at(k).get<std::uint64_t>()) << k;
  }
  EXPECT_GT(led["activations"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(led.at("peak_breakdown"), nat.at("peak_breakdown"));
  EXPECT_EQ(led.at("per_layer_activations"), nat.at("per_layer_activations"));
  for (const auto& r : j.at("reconciliation")) EXPECT_TRUE(r.at("ok").get<bool>()) << r.dump();
  ASSERT_FALSE(j.at("tensors").empty());
  std::uint64_t params_bytes = 0;
  for (const auto& t : j["tensors"]) {
    for (const char* k : {"name", "category", "layer", "shape", "dtype", "bytes"})
      ASSERT_TRUE(t.contains(k)) << k;
    if (t["category"] == "params") params_bytes += t["bytes"].get<std::uint64_t>();
  }
  EXPECT_EQ(params_bytes, led["params"].get<std::uint64_t>());
  for (const char* src : {"pool", "cupti", "memgetinfo"}) {
    EXPECT_TRUE(j["measured"][src].is_null());
    EXPECT_TRUE(j["measured"]["unavailable"].contains(src));
  }
}

}  // namespace

TEST(CliProfile, MetaAndCpuWriteJsonWhoseLedgerEqualsTheNativeProfile) {
  struct C {
    std::string backend, flags;
  };
  for (const C& c : {C{"meta", "--model tiny-gqa --batch 3 --seq 20 --optimizer lomo"},
                     C{"cpu", "--model tiny-tied --batch 2 --seq 9 --checkpointing"},
                     C{"cpu",
                       "--model tiny-awkward --batch 2 --seq 7 --attention flash "
                       "--optimizer sgd --dtype fp16 --steps 3"},
                     C{"meta", "--model llama-7b --batch 2 --seq 256 --checkpointing full"}}) {
    const Result r =
        run_trainmem("profile --backend " + c.backend + " " + c.flags + " --format json");
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = json::parse(r.out);
    SCOPED_TRACE(c.flags);
    check_profile_json(j, c.backend);
    const auto& losses = j["run"]["losses"];
    if (c.backend == "cpu") {
      ASSERT_EQ(losses.size(), std::size_t(j["run"]["steps"].get<int>()));
      for (const auto& l : losses) EXPECT_TRUE(l.is_number());
    } else {
      for (const auto& l : losses) EXPECT_TRUE(l.is_null());  // meta computes nothing
    }
  }
}

TEST(CliProfile, CheckpointingFlagAloneMeansFull) {
  const Result r = run_trainmem(
      "profile --backend meta --model tiny --batch 1 --seq 8 --checkpointing --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["run"]["checkpointing"], "full");
}

// No device: none in the cpu-only build; forced on a GPU machine (TRAINMEM_FORCE_NO_DEVICE).
TEST(CliProfile, AutoFallsBackToMetaAndSaysWhy) {
  setenv("TRAINMEM_FORCE_NO_DEVICE", "1", 1);
  const Result r = run_trainmem("profile --model tiny --batch 1 --seq 8 --format json");
  unsetenv("TRAINMEM_FORCE_NO_DEVICE");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["run"]["backend"], "meta");
  EXPECT_NE(r.err.find("no usable CUDA device"), std::string::npos) << r.err;
}

TEST(CliProfile, TableOutputShowsMeasuredBesideAnalytic) {
  const Result r = run_trainmem("profile --backend cpu --model tiny --batch 1 --seq 8");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("activations_peak"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("analytic (native)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(" NO"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("loss: step 1"), std::string::npos) << r.out;
}

TEST(CliProfile, WeightsTokensAndDumpReproduceThePyTorchGolden) {
  const std::string dump = temp_path("dump.safetensors");
  const Result r =
      run_trainmem("profile --backend cpu --model " + data("golden_tiny_gqa_config.json") +
                   " --dtype fp32 --batch 2 --seq 16 --steps 1 --weights " +
                   data("golden_tiny_gqa_weights.safetensors") + " --tokens " +
                   data("golden_tiny_gqa_tokens.bin") + " --dump " + dump + " --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  SafeTensorsReader got(dump), want(data("golden_tiny_gqa_expected.safetensors"));
  const float ref_loss = want.read_f32("loss")[0];
  // The golden tolerance of test_model_golden.cpp (stated there): the reference is PyTorch fp32,
  // itself ~2e-6 of max|ref| from float64; our fp32 sums in other orders add ~h·u ~ 1e-5 relative
  // at most to a loss, and 1e-4·|ref| + 2e-5·max|ref| to a gradient element.
  EXPECT_NEAR(got.read_f32("loss")[0], ref_loss, 1e-5 * ref_loss);
  EXPECT_NEAR(json::parse(r.out)["run"]["losses"][0].get<double>(), ref_loss, 1e-5 * ref_loss);
  ASSERT_EQ(got.tensors().size(), want.tensors().size());
  for (const auto& t : want.tensors()) {
    const auto g = got.read_f32(t.name), e = want.read_f32(t.name);
    ASSERT_EQ(g.size(), e.size()) << t.name;
    double mx = 0;
    for (float v : e) mx = std::max(mx, double(std::abs(v)));
    for (std::size_t i = 0; i < e.size(); ++i)
      ASSERT_NEAR(g[i], e[i], 1e-4 * std::abs(e[i]) + 2e-5 * mx) << t.name << " " << i;
  }
  std::remove(dump.c_str());
}

TEST(CliProfile, BadInputExitsTwoNamingTheFlag) {
  const std::string tokens = temp_path("short_tokens.bin");
  std::ofstream(tokens, std::ios::binary) << "12345678";  // 2 ids, the run needs 32
  const std::string golden = " --model " + data("golden_tiny_gqa_config.json") +
                             " --batch 2 --seq 16 --backend cpu --dtype fp32";
  Result r = run_trainmem("profile" + golden + " --tokens " + tokens);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--tokens " + tokens + ": file has 8 bytes"), std::string::npos) << r.err;

  // Ids out of range: 32 ids of 1000 with vocab 96.
  {
    std::ofstream f(tokens, std::ios::binary);
    for (int i = 0; i < 32; ++i) {
      const std::int32_t id = i == 5 ? 1000 : 1;
      f.write(reinterpret_cast<const char*>(&id), 4);
    }
  }
  r = run_trainmem("profile" + golden + " --tokens " + tokens);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("token id 1000 at position 5"), std::string::npos) << r.err;
  std::remove(tokens.c_str());

  // Weights for another model: tiny-tied's file lacks the tensors tiny-gqa needs.
  r = run_trainmem("profile" + golden + " --weights " +
                   data("golden_tiny_tied_weights.safetensors"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("golden_tiny_tied_weights.safetensors"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("has shape [64, 32], the model config needs [96, 48]"), std::string::npos)
      << r.err;

  // A file that is not safetensors.
  const std::string bad = temp_path("bad.safetensors");
  std::ofstream(bad, std::ios::binary) << "garbage!garbage!";
  r = run_trainmem("profile" + golden + " --weights " + bad);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("not a valid safetensors file"), std::string::npos) << r.err;
  std::remove(bad.c_str());

  r = run_trainmem("profile --backend meta --model tiny --dump " + temp_path("x.safetensors"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--dump needs a backend that computes"), std::string::npos) << r.err;

  r = run_trainmem("profile --backend tpu --model tiny");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--backend"), std::string::npos) << r.err;
}

TEST(CliProfile, OutOfMemoryExitsThreeAndStillWritesTheReport) {
  // 40 MiB holds the setup (32 MiB GEMM workspace + tiny's weights and states) but not the
  // activations of batch 64 x seq 256.
  const Result r = run_trainmem(
      "profile --backend meta --model tiny --batch 64 --seq 256 --device-budget 40MiB "
      "--format json");
  EXPECT_EQ(r.code, 3) << r.err;
  const json j = json::parse(r.out);
  ASSERT_TRUE(j.contains("error")) << r.out.substr(0, 2000);
  EXPECT_GT(j["measured"]["ledger"]["params"].get<std::uint64_t>(), 0u);
  EXPECT_NE(r.err.find("out of memory"), std::string::npos) << r.err;
}
