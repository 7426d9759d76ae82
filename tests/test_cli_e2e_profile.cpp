// End to end: `trainmem profile` on the cpu and meta backends. The measured activations equal
// the analytic native profile and the native plan's bytes written out here; the table shows
// every part of the report; an out-of-memory under a budget-limited allocator exits 3 with the
// partial report written; every output format is parsed back against the JSON; --output;
// --timeline (Perfetto JSON replayed to the measured peak, SVG labelled with it).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "test_cli_e2e_helpers.hpp"

namespace trainmem::e2e {
namespace {

const std::string kProfile = "profile --model tiny --batch 2 --seq 24 --backend cpu --seed 3 ";

std::string mib2(std::uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", double(bytes) / 1048576.0);
  return buf;
}

const char* kCategories[] = {"params",
                             "gradients",
                             "optimizer_states",
                             "activations",
                             "activations_peak",
                             "workspace",
                             "inputs",
                             "sum",
                             "peak"};

TEST(CliE2EProfile, MeasuredActivationsEqualAnalyticNativeOnCpuAndMeta) {
  for (const char* backend : {"cpu", "meta"})
    for (const char* attention : {"eager", "flash"}) {
      SCOPED_TRACE(std::string(backend) + " " + attention);
      const Result r =
          trainmem(std::string("profile --model tiny-gqa --batch 3 --seq 24 ") + "--backend " +
                   backend + " --attention " + attention + " --format json");
      ASSERT_EQ(r.code, 0) << r.err;
      const json j = r.j();
      EXPECT_EQ(j["run"]["backend"], backend);
      EXPECT_EQ(j["run"]["predicted"], std::string(backend) == "meta");
      EXPECT_EQ(j["run"]["steps_done"], 2);
      const json& led = j["measured"]["ledger"];
      const json& nat = j["analytic"]["native"];
      for (const char* k : kCategories) EXPECT_EQ(led[k], nat[k]) << k;
      // Per layer, against the plan written out independently (bf16: w = 2).
      const bool eager = std::string(attention) == "eager";
      EXPECT_EQ(led["per_layer_activations"].get<std::uint64_t>(),
                native_layer_bytes(j["model"], 3, 24, 2, eager));
      for (const auto& v : led["per_layer_activations_by_layer"])
        EXPECT_EQ(v, led["per_layer_activations"]);
      // Every reconciliation row is exact and says so.
      ASSERT_EQ(j["reconciliation"].size(), 9u);
      for (const auto& row : j["reconciliation"]) {
        EXPECT_EQ(row["difference"], 0) << row.dump();
        EXPECT_TRUE(row["ok"].get<bool>()) << row.dump();
      }
      // Device sources are unavailable with a reason, not silently absent.
      for (const char* src : {"pool", "cupti", "memgetinfo"}) {
        EXPECT_TRUE(j["measured"][src].is_null());
        EXPECT_NE(j["measured"]["unavailable"][src].get<std::string>().find("no device"),
                  std::string::npos);
      }
      // The peak's breakdown adds up to the peak.
      std::uint64_t sum = 0;
      for (auto& [k, v] : led["peak_breakdown"].items()) sum += v.get<std::uint64_t>();
      EXPECT_EQ(sum, led["peak"].get<std::uint64_t>());
    }
}

TEST(CliE2EProfile, TableShowsEveryPart) {
  const Result r = trainmem("profile --model tiny --batch 2 --seq 16 --backend cpu");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* part :
       {"Reconciliation: measured (ledger) vs analytic (native)", "Device sources vs the ledger",
        "pool: unavailable: the cpu backend has no device", "overhead (device used",
        "True peak:", "category at the peak", "Reference profiles", "hf-eager", "megatron", "zero",
        "loss: step 1", "figures from step 2 (steady state)"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
  EXPECT_EQ(r.out.find(" NO"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\033'), std::string::npos) << "colour written to a file";
  EXPECT_EQ(r.out.find("## "), std::string::npos) << "heading markers left in plain text";
}

// No device: none in the cpu-only build; forced on a GPU machine (TRAINMEM_FORCE_NO_DEVICE).
TEST(CliE2EProfile, AutoBackendWithoutDeviceUsesMetaAndSaysPredicted) {
  const Result r =
      trainmem_env("TRAINMEM_FORCE_NO_DEVICE=1", "profile --model tiny --batch 2 --seq 16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("backend meta — PREDICTED"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("no usable CUDA device"), std::string::npos) << r.err;
}

TEST(CliE2EProfile, OutOfMemoryUnderABudgetExitsThreeWithAPartialReport) {
  // tiny b2 s16 peaks at 35,596,032 bytes; setup alone needs 35,427,584.
  const Result r = trainmem(
      "profile --model tiny --batch 2 --seq 16 --backend cpu "
      "--device-budget 35500000 --format json");
  EXPECT_EQ(r.code, 3) << r.err;
  const json j = r.j();
  ASSERT_TRUE(j.contains("error")) << r.out;
  EXPECT_EQ(j["error"]["kind"], "out_of_memory");
  EXPECT_EQ(j["error"]["step"], 1);
  EXPECT_EQ(j["run"]["steps_done"], 0);
  EXPECT_EQ(j["run"]["device_budget"], 35500000);
  const std::uint64_t live = j["error"]["live_bytes"], req = j["error"]["requested_bytes"];
  EXPECT_GT(live + req, 35500000u);
  EXPECT_LE(live, 35500000u);
  // What was measured up to the failure: the persistent state is there, the peak is below
  // the budget, and the largest live tensor is the 32 MiB GEMM workspace.
  EXPECT_EQ(j["measured"]["ledger"]["params"], j["analytic"]["native"]["params"]);
  EXPECT_LE(j["measured"]["ledger"]["peak"].get<std::uint64_t>(), 35500000u);
  EXPECT_EQ(j["error"]["live_tensors"][0]["name"], "cublas_workspace");
  EXPECT_NE(r.err.find("out of memory in step 1"), std::string::npos) << r.err;
  // Forward never ended, so activations (alive at the end of forward) read 0 against the
  // native prediction: the rows are reported but not judged.
  ASSERT_EQ(j["reconciliation"].size(), 9u);
  for (const auto& row : j["reconciliation"]) {
    EXPECT_TRUE(row["ok"].is_null()) << row.dump();
    EXPECT_NE(row["tolerance"].get<std::string>().find("not judged"), std::string::npos);
  }

  // The same in a table, and an out-of-memory in setup.
  const Result t = trainmem(
      "profile --model tiny --batch 2 --seq 16 --backend meta "
      "--device-budget 33MiB");
  EXPECT_EQ(t.code, 3);
  EXPECT_NE(t.out.find("OUT OF MEMORY in setup"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("Reconciliation"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("- (OOM)"), std::string::npos) << t.out;
  EXPECT_EQ(t.out.find(" NO"), std::string::npos) << "an unjudged row shown as a failure:\n"
                                                  << t.out;
  // A budget the step fits in changes nothing.
  const Result ok = trainmem(
      "profile --model tiny --batch 2 --seq 16 --backend meta "
      "--device-budget 35596032 --format json");
  EXPECT_EQ(ok.code, 0) << ok.err;
}

TEST(CliE2EProfile, BadFlagsExitTwoNamingTheFlag) {
  const struct {
    const char* args;
    const char* message;
  } cases[] = {
      {"profile --model tiny --backend gpu", "--backend"},
      {"profile --model tiny --device-budget 12parsecs", "--device-budget"},
      {"profile --model tiny --timeline out.png", "--timeline"},
      {"profile --model tiny --steps 0", "--steps"},
      {"profile --model nope", "--model"},
  };
  for (const auto& c : cases) {
    const Result r = trainmem(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args << " wrote a report: " << r.out;
  }
}

TEST(CliE2EProfile, UnwritableTimelineIsBadInputLikeAnUnwritableOutput) {
  const Result t = trainmem(
      "profile --model tiny --batch 2 --seq 16 --backend meta "
      "--timeline /nonexistent-dir/t.json");
  EXPECT_EQ(t.code, 2) << t.err;
  EXPECT_NE(t.err.find("--timeline: cannot open"), std::string::npos) << t.err;
  const Result o =
      trainmem("estimate --model tiny --batch 2 --seq 16 --output /nonexistent-dir/e.json");
  EXPECT_EQ(o.code, 2) << o.err;
  EXPECT_NE(o.err.find("--output"), std::string::npos) << o.err;
}

TEST(CliE2EProfile, CsvMarkdownAndTableAgreeWithJson) {
  const Result rj = trainmem(kProfile + "--format json");
  ASSERT_EQ(rj.code, 0) << rj.err;
  const json j = rj.j();
  std::map<std::string, json> rec;
  for (const auto& row : j["reconciliation"]) rec[row["category"]] = row;
  ASSERT_EQ(rec.size(), 9u);

  // CSV: exact bytes.
  const Result rc = trainmem(kProfile + "--format csv");
  ASSERT_EQ(rc.code, 0) << rc.err;
  const auto csv = parse_csv(rc.out);
  ASSERT_EQ(csv.size(), 10u) << rc.out;
  EXPECT_EQ(csv[0], (std::vector<std::string>{"category", "measured", "analytic", "difference",
                                              "rel_error", "ok"}));
  for (std::size_t k = 1; k < csv.size(); ++k) {
    ASSERT_EQ(csv[k].size(), 6u);
    const json& want = rec.at(csv[k][0]);
    EXPECT_EQ(std::stoull(csv[k][1]), want["measured"].get<std::uint64_t>()) << csv[k][0];
    EXPECT_EQ(std::stoull(csv[k][2]), want["analytic"].get<std::uint64_t>()) << csv[k][0];
    EXPECT_EQ(std::stoll(csv[k][3]), want["difference"].get<std::int64_t>());
    EXPECT_EQ(csv[k][5], "true");
  }

  // Markdown: every table well formed; the reconciliation in MiB with two decimals.
  const Result rm = trainmem(kProfile + "--format markdown");
  ASSERT_EQ(rm.code, 0) << rm.err;
  const auto tables = parse_markdown_tables(rm.out);
  ASSERT_GE(tables.size(), 3u) << rm.out;
  const auto& t0 = tables[0];
  ASSERT_EQ(t0.size(), 10u);
  EXPECT_EQ(t0[0][0], "category");
  EXPECT_EQ(t0[0][1], "measured (MiB)");
  for (std::size_t k = 1; k < t0.size(); ++k) {
    EXPECT_EQ(t0[k][1], mib2(rec.at(t0[k][0])["measured"])) << t0[k][0];
    EXPECT_EQ(t0[k][5], "yes");
  }

  // Text: the same table, aligned into columns.
  const Result rt = trainmem(kProfile);
  ASSERT_EQ(rt.code, 0) << rt.err;
  const auto lines = text_table(rt.out, "category          measured");
  ASSERT_EQ(lines.size(), 10u) << rt.out;
  // Rows are padded to one width (the header's last cell is not padded); the last column
  // starts at the same offset everywhere.
  const std::size_t width = lines[1].size(), ok_at = lines[0].rfind("ok");
  for (std::size_t k = 1; k < lines.size(); ++k) {
    EXPECT_EQ(lines[k].size(), width) << "misaligned: " << lines[k];
    EXPECT_EQ(lines[k].rfind("yes"), ok_at) << lines[k];
    const auto cells = split_columns(lines[k]);
    ASSERT_EQ(cells.size(), 6u) << lines[k];
    EXPECT_EQ(cells[1], mib2(rec.at(cells[0])["measured"]));
    EXPECT_EQ(cells[2], mib2(rec.at(cells[0])["analytic"]));
  }
  // The peak line names the phase and tensor the JSON names.
  const json& at = j["measured"]["ledger"]["peak_at"];
  EXPECT_NE(rt.out.find("in " + at["phase"].get<std::string>()), std::string::npos);
  EXPECT_NE(rt.out.find("at the allocation of " + at["tensor"].get<std::string>()),
            std::string::npos);
}

TEST(CliE2EProfile, OutputFileHoldsWhatStdoutWould) {
  const std::string path = temp_path("report.json");
  const Result a = trainmem(kProfile + "--format json --output " + path);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_TRUE(a.out.empty());
  const json from_file = json::parse(slurp(path));
  const json from_stdout = trainmem(kProfile + "--format json").j();
  EXPECT_EQ(from_file["measured"]["ledger"]["peak"], from_stdout["measured"]["ledger"]["peak"]);
  EXPECT_EQ(from_file["run"]["losses"], from_stdout["run"]["losses"]) << "same seed, same loss";
  std::remove(path.c_str());
}

TEST(CliE2EProfile, PerfettoTimelineReplaysToTheMeasuredPeak) {
  const std::string path = temp_path("timeline.json");
  const Result r = trainmem(kProfile + "--format json --timeline " + path);
  ASSERT_EQ(r.code, 0) << r.err;
  const json prof = r.j();
  const json t = json::parse(slurp(path));
  std::uint64_t max_total = 0, max_act = 0;
  int peaks = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "C" && e["name"] == "live total")
      max_total = std::max<std::uint64_t>(max_total, e["args"]["bytes"]);
    if (e["ph"] == "C" && e["name"] == "live activations")
      max_act = std::max<std::uint64_t>(max_act, e["args"]["bytes"]);
    if (e["ph"] == "i" && e["cat"] == "peak") {
      ++peaks;
      EXPECT_EQ(e["args"]["tensor"], prof["measured"]["ledger"]["peak_at"]["tensor"]);
      EXPECT_EQ(e["args"]["bytes"], prof["measured"]["ledger"]["peak"]);
    }
  }
  EXPECT_EQ(peaks, 1);
  EXPECT_EQ(max_total, prof["measured"]["ledger"]["peak"].get<std::uint64_t>());
  EXPECT_EQ(max_act, prof["measured"]["ledger"]["activations_peak"].get<std::uint64_t>());
  EXPECT_EQ(t["otherData"]["time_axis"], "wall");
  std::remove(path.c_str());
}

// estimate --timeline: the HF step's event sequence, replayed to the profile's peak with the
// peak event named as the report names it; one HF step per file, or exit 2.
TEST(CliE2EProfile, HfStepTimelineReplaysToTheEstimatesPeak) {
  const std::string path = temp_path("hf-timeline.json");
  const std::string est =
      "estimate --model tiny-gqa --batch 2 --seq 32 --profile hf-sdpa "
      "--precision pure --format json";
  const Result r = trainmem(est + " --timeline " + path);
  ASSERT_EQ(r.code, 0) << r.err;
  const json doc = r.j();
  const json& e = doc["analytic"]["hf-sdpa"];
  const json t = json::parse(slurp(path));
  std::uint64_t max_total = 0;
  int peaks = 0;
  for (const auto& ev : t["traceEvents"]) {
    if (ev["ph"] == "C" && ev["name"] == "live total")
      max_total = std::max<std::uint64_t>(max_total, ev["args"]["bytes"]);
    if (ev["ph"] == "i" && ev["cat"] == "peak") {
      ++peaks;
      EXPECT_EQ(ev["args"]["bytes"], e["peak"]);
      // "optimizer: adamw.sqrt.lm_head.weight allocated" names the same tensor
      EXPECT_NE(e["peak_instant"].get<std::string>().find(ev["args"]["tensor"].get<std::string>()),
                std::string::npos);
    }
  }
  EXPECT_EQ(peaks, 1);
  EXPECT_EQ(max_total, e["peak"].get<std::uint64_t>());
  EXPECT_EQ(t["otherData"]["time_axis"], "event_index");
  std::remove(path.c_str());
  for (const std::string& bad :
       {std::string("estimate --model tiny-gqa --profile hf-sdpa,hf-eager --hf-version 5.25"),
        std::string("estimate --model tiny-gqa --profile hf-eager"),
        std::string("estimate --model tiny-gqa --profile hf-sdpa --checkpointing both")}) {
    const Result b = trainmem(bad + " --timeline " + path);
    EXPECT_EQ(b.code, 2) << bad;
    EXPECT_NE(b.err.find("--timeline: draws one HF step"), std::string::npos) << b.err;
  }
}

TEST(CliE2EProfile, SvgTimelinesForProfileAndCompare) {
  const std::string svg = temp_path("timeline.svg");
  const Result r = trainmem(kProfile + "--format json --timeline " + svg);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string text = slurp(svg);
  EXPECT_EQ(text.rfind("<svg ", 0), 0u);
  EXPECT_NE(text.find("</svg>"), std::string::npos);
  const std::uint64_t peak = r.j()["measured"]["ledger"]["peak"];
  EXPECT_NE(text.find("peak " + mib2(peak) + " MiB"), std::string::npos);
  for (const char* phase : {"forward", "backward"})
    EXPECT_NE(text.find(std::string("data-phase=\"") + phase + "\""), std::string::npos);
  std::remove(svg.c_str());

  const std::string base = temp_path("cmp.svg");
  const Result c =
      trainmem("compare --model tiny --batch 2 --seq 16 --backend meta --timeline " + base);
  ASSERT_EQ(c.code, 0) << c.err;
  for (const char* mode : {"none", "full"}) {
    const std::string p = temp_path(std::string("cmp-ckpt-") + mode + ".svg");
    const std::string s = slurp(p);
    EXPECT_EQ(s.rfind("<svg ", 0), 0u) << p;
    if (std::string(mode) == "full") {
      EXPECT_NE(s.find("data-phase=\"recompute\""), std::string::npos);
    }
    std::remove(p.c_str());
  }
}

}  // namespace
}  // namespace trainmem::e2e
