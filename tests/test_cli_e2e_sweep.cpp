// End to end: `trainmem sweep --fit` recovers the native coefficients (checked against the
// native plan's coefficients written out here, within 0.5% as the issue asks, and in fact to
// the byte), and `trainmem maxbatch`'s answer fits while one more does not (checked by
// tracing both on the meta backend through sweep, and under a budget-limited allocator).
#include <gtest/gtest.h>

#include <cmath>

#include "test_cli_e2e_helpers.hpp"

namespace trainmem::e2e {
namespace {

TEST(CliE2ESweep, OneModelFitRecoversTheFoldedNativeCoefficients) {
  // LLaMA-7B on meta (predicted, exact trace), fp16, eager: per layer
  // 16·sbh + 6·sbi + 2·as²b + 8·sb, i.e. sbh' = 16 + 6·11008/4096 + 8/4096 and as2b = 2.
  const Result r = trainmem(
      "sweep --model llama-7b --dtype fp16 --backend meta --batch 1,2,8 --seq 128,512 --fit "
      "--format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  ASSERT_EQ(j["runs"].size(), 6u);
  const json& fit = j["fit"]["ledger"];
  const double want_sbh = 16.0 + 6.0 * 11008.0 / 4096.0 + 8.0 / 4096.0;
  // 0.5%: the tool's own "within 0.5%" criterion (cmd_sweep.cpp's table); exact data must also
  // meet the 1e-6 below (byte counts ~1e9 solved in long double: ~1e-9 per coefficient).
  EXPECT_NEAR(fit["coefficients"]["sbh"].get<double>(), want_sbh, 0.005 * want_sbh);
  EXPECT_NEAR(fit["coefficients"]["as2b"].get<double>(), 2.0, 0.005 * 2.0);
  // Exact data fits exactly: to a millionth of a byte per unit, residuals under a byte.
  EXPECT_NEAR(fit["coefficients"]["sbh"].get<double>(), want_sbh, 1e-6);
  EXPECT_NEAR(fit["analytic"]["sbh"].get<double>(), want_sbh, 1e-9);
  EXPECT_EQ(fit["terms"], "one_model");
  EXPECT_EQ(fit["coefficients"].size(), 2u);
  // 1 - SSres/SStot with residuals of a few ulps of ~1e9 B: SSres/SStot ~ 1e-20, 1e-12 is slack.
  EXPECT_NEAR(fit["r2"].get<double>(), 1.0, 1e-12);
  ASSERT_EQ(fit["residuals"].size(), 6u);
  for (const auto& res : fit["residuals"]) EXPECT_LT(std::fabs(res.get<double>()), 1.0);
  // Device sources cannot give the figure without a device; each says why.
  for (const char* src : {"pool", "cupti", "memgetinfo"}) {
    EXPECT_TRUE(j["fit_unavailable"].contains(src)) << src;
    ASSERT_TRUE(j["fit"].contains(src)) << src;
    EXPECT_EQ(j["fit"][src]["unavailable"], j["fit_unavailable"][src]) << src;
    EXPECT_FALSE(j["fit"][src].contains("coefficients")) << src;
  }
}

TEST(CliE2ESweep, SeveralWidthsOnCpuSeparateTheFourCoefficients) {
  // GQA (tiny-gqa: 6 heads, 2 kv heads): k and v add 2w·k/a per sbh.
  const Result r = trainmem(
      "sweep --model tiny-gqa --backend cpu --steps 1 --dtype fp32 --batch 1,2 --seq 8,12 "
      "--hidden 36,48 --intermediate 40,72 --heads 3,6 --fit --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  const json& m0 = j["runs"][0]["model"];
  const double ratio = m0["kv_heads"].get<double>() / m0["heads"].get<double>();
  const json& c = j["fit"]["ledger"]["coefficients"];
  const double w = 4;  // fp32
  const struct {
    const char* name;
    double want;
  } expect[] = {{"sbh", 6 * w + 2 * w * ratio}, {"sbi", 3 * w}, {"as2b", w}, {"sb", 8}};
  for (const auto& e : expect) {
    // As above: the tool's 0.5%; the analytic coefficients are closed forms in double (1e-9 slack).
    EXPECT_NEAR(c[e.name].get<double>(), e.want, 0.005 * e.want) << e.name;
    EXPECT_NEAR(j["fit"]["ledger"]["analytic"][e.name].get<double>(), e.want, 1e-9) << e.name;
  }
  EXPECT_EQ(j["fit"]["ledger"]["terms"], "separate");
  EXPECT_EQ(j["runs"].size(), 2u * 2 * 2 * 2 * 2);
  // The variants keep the model's kv-head ratio.
  for (const auto& run : j["runs"])
    EXPECT_EQ(run["model"]["kv_heads"].get<double>() / run["model"]["heads"].get<double>(), ratio);
}

TEST(CliE2ESweep, TableShowsTheFitBesideTheAnalyticCoefficients) {
  const Result r = trainmem("sweep --model tiny --backend meta --batch 1,3 --seq 16,40 --fit");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto rows = text_table(r.out, "coefficient");
  ASSERT_EQ(rows.size(), 3u) << r.out;
  for (std::size_t k = 1; k < rows.size(); ++k) {
    const auto cells = split_columns(rows[k]);
    ASSERT_EQ(cells.size(), 5u) << rows[k];
    // Fit and closed form are printed with 6 decimals (cmd_sweep.cpp, report::fixed(v, 6)); on
    // exact data they agree to ~1e-9, so in print to the last digit: 1e-6 is one unit of it.
    EXPECT_NEAR(std::stod(cells[1]), std::stod(cells[2]), 1e-6) << rows[k];
    EXPECT_EQ(cells[4], "yes");
  }
  EXPECT_NE(r.out.find("R² = 1.000000000"), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.find('\r') == std::string::npos) << "progress bar drawn on a non-terminal";
}

// The meta peak of one configuration, through a one-point sweep (a separate run path from
// maxbatch's search).
std::uint64_t meta_peak(const std::string& args) {
  const Result r = trainmem("sweep --backend meta --format json " + args);
  EXPECT_EQ(r.code, 0) << args << "\n" << r.err;
  return r.code == 0 ? r.j()["runs"][0]["measured"]["ledger"]["peak"].get<std::uint64_t>() : 0;
}

TEST(CliE2EMaxbatch, AnswerFitsAndOneMoreDoesNot) {
  const std::string budget = "140GiB";
  const std::uint64_t budget_bytes = 140ull << 30;
  const Result r = trainmem("maxbatch --model llama-7b --seq 512 --dtype fp16 --budget " + budget +
                            " --overhead 512MiB --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  EXPECT_EQ(j["schema"], "trainmem/1");
  EXPECT_EQ(j["vary"], "batch");
  EXPECT_EQ(j["budget"], budget_bytes);
  EXPECT_EQ(j["seq"], 512);
  const std::int64_t b = j["batch"];
  ASSERT_GT(b, 0);
  const std::uint64_t overhead = 512ull << 20;
  // Independently: trace the answer and one more on meta.
  const std::string common = "--model llama-7b --seq 512 --dtype fp16 --batch ";
  const std::uint64_t peak = meta_peak(common + std::to_string(b));
  const std::uint64_t next = meta_peak(common + std::to_string(b + 1));
  EXPECT_EQ(j["peak"].get<std::uint64_t>(), peak);
  EXPECT_EQ(j["next_peak"].get<std::uint64_t>(), next);
  EXPECT_LE(peak + overhead, budget_bytes);
  EXPECT_GT(next + overhead, budget_bytes);
  EXPECT_EQ(j["margin"].get<std::int64_t>(), std::int64_t(budget_bytes - peak - overhead));
}

TEST(CliE2EMaxbatch, LongestSequenceUnderABudgetLimitedAllocator) {
  // --vary seq in steps of 8 on the tiny model; then run the answer and one more step under
  // --device-budget: the first completes, the second runs out of memory.
  const Result r =
      trainmem("maxbatch --model tiny --batch 2 --budget 40MiB --vary seq --step 8 --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  const std::int64_t s = j["seq"];
  ASSERT_GT(s, 0);
  EXPECT_EQ(s % 8, 0);
  EXPECT_EQ(j["batch"], 2);
  const Result both = trainmem(
      "sweep --model tiny --batch 2 --backend meta --device-budget 40MiB "
      "--format json --seq " +
      std::to_string(s) + "," + std::to_string(s + 8));
  EXPECT_EQ(both.code, 3) << both.err;
  const json bj = both.j();
  ASSERT_EQ(bj["runs"].size(), 2u);
  EXPECT_FALSE(bj["runs"][0].contains("error")) << "the answer fits the budget";
  EXPECT_EQ(bj["runs"][1]["error"]["kind"], "out_of_memory") << "one more step does not";
  EXPECT_EQ(bj["runs"][0]["measured"]["ledger"]["peak"], j["peak"]);
}

TEST(CliE2EMaxbatch, TableNamesTheAnswerAndTheMargin) {
  const Result r = trainmem("maxbatch --model tiny --seq 64 --budget 48MiB");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("largest batch that fits: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("margin"), std::string::npos);
  const auto rows = text_table(r.out, "batch");
  ASSERT_EQ(rows.size(), 3u) << r.out;
  EXPECT_EQ(split_columns(rows[1]).back(), "yes");
  EXPECT_EQ(split_columns(rows[2]).back(), "NO");
  EXPECT_EQ(std::stoll(split_columns(rows[2])[0]), std::stoll(split_columns(rows[1])[0]) + 1);
}

}  // namespace
}  // namespace trainmem::e2e
