// End to end: every output format of compare, sweep and maxbatch parsed back and checked
// against the JSON of the same run, and compare's --timeline files (profile's formats:
// test_cli_e2e_profile.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "test_cli_e2e_helpers.hpp"

namespace trainmem::e2e {
namespace {

TEST(CliE2EFormats, CompareSweepMaxbatchCsvAndMarkdownParse) {
  const std::string cmp = "compare --model tiny --batch 2 --seq 16 --backend meta --optimizer all ";
  const json cj = trainmem(cmp + "--format json").j();
  const auto ccsv = parse_csv(trainmem(cmp + "--format csv").out);
  ASSERT_EQ(ccsv.size(), 7u);
  EXPECT_EQ(ccsv[0][0], "optimizer");
  for (std::size_t k = 1; k < ccsv.size(); ++k) {
    ASSERT_EQ(ccsv[k].size(), ccsv[0].size());
    const json& run = cj["runs"][k - 1];
    EXPECT_EQ(ccsv[k][0], run["run"]["optimizer"]);
    EXPECT_EQ(ccsv[k][1], run["run"]["checkpointing"]);
    EXPECT_EQ(std::stoull(ccsv[k][5]),
              run["measured"]["ledger"]["activations"].get<std::uint64_t>());
    EXPECT_EQ(std::stoull(ccsv[k][10]), run["measured"]["ledger"]["peak"].get<std::uint64_t>());
  }
  const auto cmd = parse_markdown_tables(trainmem(cmp + "--format markdown").out);
  ASSERT_GE(cmd.size(), 2u);
  EXPECT_EQ(cmd[0].size(), 7u);

  const std::string sw = "sweep --model tiny --backend meta --batch 1,2 --seq 16,24 --fit ";
  const json sj = trainmem(sw + "--format json").j();
  const auto scsv = parse_csv(trainmem(sw + "--format csv").out);
  ASSERT_EQ(scsv.size(), 5u);
  for (std::size_t k = 1; k < scsv.size(); ++k) {
    const json& run = sj["runs"][k - 1];
    EXPECT_EQ(std::stoll(scsv[k][4]), run["run"]["batch"].get<std::int64_t>());
    EXPECT_EQ(std::stoll(scsv[k][5]), run["run"]["seq"].get<std::int64_t>());
    EXPECT_EQ(std::stoull(scsv[k][7]),
              run["measured"]["ledger"]["per_layer_activations"].get<std::uint64_t>());
  }
  const auto smd = parse_markdown_tables(trainmem(sw + "--format markdown").out);
  ASSERT_EQ(smd.size(), 2u);  // the runs and the ledger's fit
  EXPECT_EQ(smd[1][0][0], "coefficient");
  EXPECT_EQ(smd[1].size(), 3u);

  const std::string mb = "maxbatch --model tiny --seq 32 --budget 40MiB ";
  const json mj = trainmem(mb + "--format json").j();
  for (const char* k : {"schema", "budget", "vary", "batch", "seq", "peak", "next_peak", "margin"})
    EXPECT_TRUE(mj.contains(k)) << k;
  const auto mcsv = parse_csv(trainmem(mb + "--format csv").out);
  ASSERT_EQ(mcsv.size(), 3u);
  EXPECT_EQ(std::stoll(mcsv[1][0]), mj["batch"].get<std::int64_t>());
  EXPECT_EQ(mcsv[0][0], "batch");
  EXPECT_EQ(std::stoull(mcsv[1][1]), mj["peak"].get<std::uint64_t>());
  EXPECT_EQ(std::stoull(mcsv[2][1]), mj["next_peak"].get<std::uint64_t>());
  EXPECT_EQ(std::stoll(mcsv[1][4]), mj["margin"].get<std::int64_t>());
  EXPECT_EQ(mcsv[1].back(), "yes");
  EXPECT_EQ(mcsv[2].back(), "NO");
  const auto mmd = parse_markdown_tables(trainmem(mb + "--format markdown").out);
  ASSERT_EQ(mmd.size(), 1u);
  EXPECT_EQ(mmd[0].size(), 3u);
}

TEST(CliE2EFormats, CompareWritesOneTimelinePerRun) {
  const std::string base = temp_path("cmp.json");
  const Result c = trainmem(
      "compare --model tiny --batch 2 --seq 16 --backend meta --format json "
      "--timeline " +
      base);
  ASSERT_EQ(c.code, 0) << c.err;
  const json cj = c.j();
  for (int k = 0; k < 2; ++k) {
    const std::string mode = cj["runs"][k]["run"]["checkpointing"];
    const std::string p = temp_path("cmp-ckpt-" + mode + ".json");
    const json t = json::parse(slurp(p));
    std::uint64_t max_total = 0;
    bool recompute = false;
    for (const auto& e : t["traceEvents"]) {
      if (e["ph"] == "C" && e["name"] == "live total")
        max_total = std::max<std::uint64_t>(max_total, e["args"]["bytes"]);
      if (e["ph"] == "X" && e["name"] == "recompute") recompute = true;
    }
    EXPECT_EQ(max_total, cj["runs"][k]["measured"]["ledger"]["peak"].get<std::uint64_t>()) << mode;
    EXPECT_EQ(recompute, mode == "full") << mode;
    EXPECT_EQ(t["otherData"]["time_axis"], "event_index") << "meta does no work to time";
    std::remove(p.c_str());
  }
}

}  // namespace
}  // namespace trainmem::e2e
