// End to end: the built `trainmem` binary on the cpu and meta backends. compare's
// checkpointing saves exactly what the native plan (written out here) predicts; compare,
// sweep and maxbatch exit 3 after an out-of-memory with the report written; bad flags exit 2
// naming the flag. (profile: test_cli_e2e_profile.cpp.)
#include <gtest/gtest.h>

#include "test_cli_e2e_helpers.hpp"

namespace trainmem::e2e {
namespace {

TEST(CliE2E, CompareCheckpointingSavesWhatThePlanPredicts) {
  for (const char* backend : {"cpu", "meta"}) {
    SCOPED_TRACE(backend);
    const Result r = trainmem(std::string("compare --model tiny --batch 2 --seq 32 --backend ") +
                              backend + " --format json");
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = r.j();
    ASSERT_EQ(j["runs"].size(), 2u);
    const json& none = j["runs"][0];
    const json& full = j["runs"][1];
    EXPECT_EQ(none["run"]["checkpointing"], "none");
    EXPECT_EQ(full["run"]["checkpointing"], "full");
    const std::uint64_t a0 = none["measured"]["ledger"]["activations"];
    const std::uint64_t a1 = full["measured"]["ledger"]["activations"];
    // With full checkpointing each layer keeps only its output x_{l+1} (w·s·b·h) instead of
    // everything it keeps for backward: the saving is L·(per-layer − w·s·b·h).
    const std::uint64_t L = none["model"]["layers"], h = none["model"]["hidden"];
    const std::uint64_t per_layer = native_layer_bytes(none["model"], 2, 32, 2, true);
    EXPECT_EQ(a0 - a1, L * (per_layer - 2 * 32 * 2 * h));
    EXPECT_EQ(a0 - a1, none["analytic"]["native"]["activations"].get<std::uint64_t>() -
                           full["analytic"]["native"]["activations"].get<std::uint64_t>());
    const json& cmp = j["comparisons"][0];
    EXPECT_EQ(cmp["activations_saved"].get<std::int64_t>(), std::int64_t(a0 - a1));
    EXPECT_TRUE(cmp["activations_saved_ok"].get<bool>());
    // Checkpointing recomputes one layer during backward: its activation peak stays above
    // the end-of-forward figure by about one layer.
    EXPECT_GT(full["measured"]["ledger"]["activations_peak"].get<std::uint64_t>(), a1);
    if (std::string(backend) == "cpu") {
      EXPECT_TRUE(cmp["recompute_cost"].is_number()) << cmp.dump();
      EXPECT_GT(cmp["step_seconds_none"].get<double>(), 0.0);
    } else {
      EXPECT_TRUE(cmp["recompute_cost"].is_null()) << "meta does no work to time";
    }
  }
}

TEST(CliE2E, CompareAllOptimizersIsAPaperTable) {
  const Result r = trainmem(
      "compare --model tiny --batch 2 --seq 16 --backend meta "
      "--optimizer all");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto rows = text_table(r.out, "Optimizer  Checkpointing");
  ASSERT_EQ(rows.size(), 7u) << r.out;  // header + 3 optimizers × 2 modes
  const auto header = split_columns(rows[0]);
  EXPECT_EQ(header[2], "Params");
  EXPECT_EQ(header[6], "Total");
  const char* expect[][2] = {{"AdamW", "none"}, {"AdamW", "full"}, {"SGD", "none"},
                             {"SGD", "full"},   {"LOMO", "none"},  {"LOMO", "full"}};
  for (int k = 0; k < 6; ++k) {
    const auto cells = split_columns(rows[k + 1]);
    ASSERT_EQ(cells.size(), header.size()) << rows[k + 1];
    EXPECT_EQ(cells[0], expect[k][0]);
    EXPECT_EQ(cells[1], expect[k][1]);
    EXPECT_EQ(cells.back(), "yes");
  }
  EXPECT_NE(r.out.find("PREDICTED"), std::string::npos);
  EXPECT_NE(r.out.find("What checkpointing saves and what it costs"), std::string::npos);
}

TEST(CliE2E, CompareSweepAndMaxbatchOutOfMemoryExitThree) {
  // compare: the plain run (peak 35,596,032 B) does not fit, the checkpointed one
  // (35,529,216 B) does; both are reported.
  const Result c = trainmem(
      "compare --model tiny --batch 2 --seq 16 --backend meta "
      "--format json --device-budget 35550000");
  EXPECT_EQ(c.code, 3) << c.err;
  const json cj = c.j();
  ASSERT_EQ(cj["runs"].size(), 2u);
  EXPECT_TRUE(cj["runs"][0].contains("error"));
  EXPECT_FALSE(cj["runs"][1].contains("error")) << "checkpointing makes it fit";
  const Result s = trainmem(
      "sweep --model tiny --batch 1,2 --seq 16 --backend meta "
      "--format json --device-budget 35500000");
  EXPECT_EQ(s.code, 3) << s.err;
  EXPECT_EQ(s.j()["runs"].size(), 2u);
  const Result m = trainmem("maxbatch --model tiny --seq 16 --budget 1MiB --format json");
  EXPECT_EQ(m.code, 3) << "nothing fits";
  EXPECT_EQ(m.j()["batch"], 0);
}

struct BadFlag {
  const char* args;
  const char* message;
};

TEST(CliE2E, BadFlagsExitTwoNamingTheFlag) {
  const BadFlag cases[] = {
      {"compare --model tiny --optimizer adam", "--optimizer"},
      {"compare --model tiny --backend meta --dump x.safetensors", "--dump"},
      {"sweep --model tiny --batch 1,x", "--batch"},
      {"sweep --model tiny --seq 1", "--seq"},
      {"sweep --model tiny --hidden 63 --heads 4 --fit", "--hidden"},
      {"sweep --model tiny --batch 1,2 --seq 16 --fit", "as2b needs at least two --seq"},
      {"sweep --model tiny --batch 1,2 --seq 16,32 --hidden 64,96 --fit",
       "the grid cannot identify"},
      {"sweep --model tiny --timeline t.svg", "--timeline"},
      {"sweep --model tiny --attention flash --heads 2,4 --seq 16,32 --fit", "--heads"},
      {"maxbatch --model tiny", "--budget is required"},
      {"maxbatch --model tiny --budget 10GiB --vary width", "--vary"},
      {"maxbatch --model tiny --budget lots", "--budget"},
      {"maxbatch --model tiny --budget 1GiB --overhead -3", "--overhead"},
      {"maxbatch --model tiny --budget 1GiB --step 0", "--step"},
  };
  for (const auto& c : cases) {
    const Result r = trainmem(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args << " wrote a report: " << r.out;
  }
}

// No device: none in the cpu-only build; forced on a GPU machine (TRAINMEM_FORCE_NO_DEVICE).
TEST(CliE2E, BudgetDeviceWithoutAGpuIsBadInput) {
  const Result r =
      trainmem_env("TRAINMEM_FORCE_NO_DEVICE=1", "maxbatch --model tiny --budget device");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--budget device: no usable CUDA device"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace trainmem::e2e
