// The run and the command line's helpers: SIZE parsing, the largest-fitting search behind
// maxbatch, report text and colour.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "cli/cli.hpp"
#include "cli/size.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/run/maxbatch.hpp"
#include "trainmem/run/run.hpp"

namespace trainmem {
namespace {

using cli::parse_size;

TEST(ParseSize, UnitsBinaryAndDecimal) {
  EXPECT_EQ(parse_size("80GiB", "--budget"), 80ull * 1024 * 1024 * 1024);
  EXPECT_EQ(parse_size("24GB", "--budget"), 24'000'000'000ull);
  EXPECT_EQ(parse_size("24gb", "--budget"), 24'000'000'000ull);
  EXPECT_EQ(parse_size("512MiB", "--budget"), 512ull << 20);
  EXPECT_EQ(parse_size("1.5GiB", "--budget"), 3ull << 29);
  EXPECT_EQ(parse_size("2T", "--budget"), 2ull << 40);
  EXPECT_EQ(parse_size("4096", "--budget"), 4096u);
  EXPECT_EQ(parse_size("10 KB", "--budget"), 10000u);
  EXPECT_EQ(parse_size("7b", "--budget"), 7u);
}

TEST(ParseSize, BadSizesNameTheFlag) {
  for (const char* bad : {"", "GiB", "-5GiB", "1.2.3GB", "12 parsecs", "99999999999TiB", "."}) {
    try {
      parse_size(bad, "--device-budget");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--device-budget"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("GiB"), std::string::npos) << e.what();
    }
  }
}

// A monotone "peak" with a known threshold; counts the probes and checks none repeats.
struct Oracle {
  std::int64_t limit;
  std::map<std::int64_t, int> seen;
  Probe operator()(std::int64_t v) {
    ++seen[v];
    return {v <= limit, std::uint64_t(v) * 1000};
  }
};

TEST(FindLargestFitting, FindsTheThresholdForManyLimits) {
  for (std::int64_t limit : {1, 2, 3, 7, 8, 9, 100, 1023, 1024, 1025, 99999}) {
    Oracle o{limit, {}};
    const SearchResult r =
        find_largest_fitting(1, 1 << 20, 1, [&](std::int64_t v) { return o(v); });
    EXPECT_EQ(r.best, limit);
    EXPECT_TRUE(r.at_best.fits);
    EXPECT_EQ(r.at_best.peak, std::uint64_t(limit) * 1000);
    EXPECT_FALSE(r.at_next.fits);
    EXPECT_EQ(r.at_next.peak, std::uint64_t(limit + 1) * 1000);
    for (auto& [v, n] : o.seen) EXPECT_EQ(n, 1) << "probed " << v << " twice";
    EXPECT_LE(r.probes, 2 * 21 + 2) << "limit " << limit;  // log2 growth + bisection
  }
}

TEST(FindLargestFitting, StepsAndRangeEnds) {
  // Sequence lengths in steps of 64 from 64: the largest multiple of 64 <= 1000 is 960.
  Oracle o{1000, {}};
  SearchResult r = find_largest_fitting(64, 1 << 16, 64, [&](std::int64_t v) { return o(v); });
  EXPECT_EQ(r.best, 960);
  EXPECT_EQ(r.at_next.peak, 1024u * 1000);
  // Nothing fits.
  Oracle none{0, {}};
  r = find_largest_fitting(1, 100, 1, [&](std::int64_t v) { return none(v); });
  EXPECT_EQ(r.best, 0);
  EXPECT_FALSE(r.at_next.fits);
  EXPECT_EQ(r.probes, 1);
  // Everything up to the top fits: best is the top, next is one past it.
  Oracle all{1000, {}};
  r = find_largest_fitting(1, 37, 1, [&](std::int64_t v) { return all(v); });
  EXPECT_EQ(r.best, 37);
  EXPECT_TRUE(r.at_next.fits);
  EXPECT_EQ(r.at_next.peak, 38000u);
  EXPECT_THROW(find_largest_fitting(0, 10, 1, [&](std::int64_t v) { return all(v); }), Error);
}

}  // namespace
}  // namespace trainmem

namespace trainmem {
namespace {

TEST(LedgerPhaseListener, SeesEveryPushAndPopInOrder) {
  MetaAllocator meta;
  Ledger ledger(meta);
  std::vector<std::pair<Phase, bool>> seen;
  ledger.set_phase_listener([&](Phase p, bool entering) {
    seen.emplace_back(p, entering);
    // On pop the phase is still the current one; on push it already is.
    EXPECT_EQ(ledger.phase(), p);
  });
  {
    auto fwd = ledger.scope(Phase::forward);
    auto rc = ledger.scope(Phase::recompute);
  }
  ledger.push_phase(Phase::optimizer);
  ledger.pop_phase();
  const std::vector<std::pair<Phase, bool>> want = {
      {Phase::forward, true},  {Phase::recompute, true}, {Phase::recompute, false},
      {Phase::forward, false}, {Phase::optimizer, true}, {Phase::optimizer, false}};
  EXPECT_EQ(seen, want);
  ledger.set_phase_listener(nullptr);
  ledger.push_phase(Phase::backward);
  ledger.pop_phase();
  EXPECT_EQ(seen.size(), want.size());
}

}  // namespace
}  // namespace trainmem

namespace trainmem {
namespace {

// A run as execute_run would leave it on cuda, built by hand: 4 layers of 1000 bytes of
// activations each, 300 bytes outside the layers.
RunResult synthetic_cuda_run() {
  RunResult r;
  r.model.layers = 4;
  r.train.checkpointing = Checkpointing::none;
  r.activations_by_layer = {300, 1000, 1000, 1000, 1000};
  r.phase_peaks[static_cast<int>(Phase::forward)] = 50000;
  r.cupti.available = true;
  r.cupti.figures.peak[static_cast<int>(Category::activations)] = 4300 + 4 * 24;
  r.pool.available = true;
  r.pool.phases = {{Phase::forward, 50000 + 4 * 512, 0}, {Phase::backward, 60000, 0}};
  r.memgetinfo.available = true;
  return r;
}

TEST(PerLayerBySource, DeviceSourcesSpreadTheirExcessOverTheLayers) {
  const PerLayerBySource by = per_layer_activations_by_source(synthetic_cuda_run());
  EXPECT_EQ(by.bytes.at("ledger"), 1000.0);
  EXPECT_EQ(by.bytes.at("cupti"), 1024.0);  // (4396 - 300) / 4
  EXPECT_EQ(by.bytes.at("pool"), 1512.0);   // 1000 + 2048 / 4
  EXPECT_EQ(by.bytes.count("memgetinfo"), 0u);
  EXPECT_NE(by.unavailable.at("memgetinfo").find("reserved"), std::string::npos);
}

TEST(PerLayerBySource, UnavailableSourcesCarryTheirReason) {
  RunResult r = synthetic_cuda_run();
  r.cupti.available = false;
  r.cupti.reason = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED";
  r.pool.phases.clear();
  PerLayerBySource by = per_layer_activations_by_source(r);
  EXPECT_EQ(by.unavailable.at("cupti"), "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED");
  EXPECT_EQ(by.unavailable.at("pool"), "no forward window was read");
  EXPECT_EQ(by.bytes.size(), 1u);
  // With checkpointing CUPTI's activation peak is not the end-of-forward figure.
  r = synthetic_cuda_run();
  r.train.checkpointing = Checkpointing::full;
  by = per_layer_activations_by_source(r);
  EXPECT_EQ(by.bytes.count("cupti"), 0u);
  EXPECT_NE(by.unavailable.at("cupti").find("checkpointing"), std::string::npos);
  // A run that ran out of memory gives no figure at all.
  r = synthetic_cuda_run();
  r.failure = RunFailure{};
  by = per_layer_activations_by_source(r);
  EXPECT_TRUE(by.bytes.empty());
}

TEST(RunText, ColourOnlyChangesWhatIsInvisible) {
  // A report written once, rendered with colour off and on.
  auto write = [](report::ReportWriter& w) {
    w.title("Title");
    w.heading("Heading");
    report::Table t({{"row", report::Align::left}, {"n"}, {"ok", report::Align::left}});
    t.add_row({"row", "1", report::check_cell(true)});
    t.add_row({"row", "2", report::check_cell(false)});
    t.add_row({"row yes", "3", "OOM"});  // a neutral cell, whatever its text
    w.table(t);
    w.line("plain line");
    w.line("OUT OF MEMORY in step 1", report::Tone::fail);
  };
  report::TextWriter off_w(report::Colour::off), on_w(report::Colour::on);
  write(off_w);
  write(on_w);
  const std::string& off = off_w.str();
  const std::string& on = on_w.str();
  EXPECT_EQ(off,
            "Title\n\nHeading\nrow      n  ok\n---------------\nrow      1  yes\nrow      2  NO\n"
            "row yes  3  OOM\nplain line\nOUT OF MEMORY in step 1\n");
  EXPECT_NE(on.find("\033[32myes\033[0m"), std::string::npos) << on;
  EXPECT_NE(on.find("\033[1;31mNO\033[0m"), std::string::npos) << on;
  EXPECT_NE(on.find("\033[1mHeading\033[0m"), std::string::npos) << on;
  EXPECT_NE(on.find("\033[1;31mOUT OF MEMORY in step 1\033[0m"), std::string::npos) << on;
  EXPECT_EQ(on.find("\033[32myes\033[0m  3"), std::string::npos) << on;  // neutral stays plain
  // Stripping the escape codes gives back the plain text, so alignment is unchanged.
  std::string stripped;
  for (std::size_t i = 0; i < on.size(); ++i) {
    if (on[i] == '\033') {
      i = on.find('m', i);
      continue;
    }
    stripped += on[i];
  }
  EXPECT_EQ(stripped, off);
  EXPECT_EQ(cli::stdout_colour("report.txt"), report::Colour::off);
  setenv("NO_COLOR", "1", 1);
  EXPECT_EQ(cli::stdout_colour(""), report::Colour::off);
  unsetenv("NO_COLOR");
}

TEST(RunText, UnitsAndPaths) {
  EXPECT_STREQ(table_unit(std::uint64_t(1) << 30).name, "GiB");
  EXPECT_STREQ(table_unit((std::uint64_t(1) << 30) - 1).name, "MiB");
  EXPECT_EQ(format_bytes(3ull << 29, table_unit(1ull << 31)), "1.50");
  EXPECT_EQ(format_signed_bytes(-(3ll << 19), kMiB), "-1.50");
  EXPECT_EQ(format_bytes_with_unit(3ull << 29, kGiB), "1.50 GiB");
  EXPECT_EQ(cli::suffixed_path("out/t.svg", "ckpt-full"), "out/t-ckpt-full.svg");
  EXPECT_EQ(cli::suffixed_path("dir.v1/trace", "ckpt-none"), "dir.v1/trace-ckpt-none");
}

// No device: none in the cpu-only build; on a GPU machine TRAINMEM_FORCE_NO_DEVICE makes the
// device probe report none (src/backends/cuda/device.cpp), so this runs everywhere.
TEST(RunBackend, AutoWithoutADeviceIsMetaWithANote) {
  setenv("TRAINMEM_FORCE_NO_DEVICE", "1", 1);
  struct Unset {
    ~Unset() { unsetenv("TRAINMEM_FORCE_NO_DEVICE"); }
  } unset;
  EXPECT_FALSE(cuda_unavailable_reason().empty());
  const ChosenBackend c = choose_backend("auto", DType::bf16);
  EXPECT_EQ(c.backend->kind(), BackendKind::meta);
  EXPECT_NE(c.note.find("no usable CUDA device"), std::string::npos);
  EXPECT_NE(c.note.find("predicted"), std::string::npos);
  EXPECT_TRUE(choose_backend("cpu", DType::f32).note.empty());
  EXPECT_THROW(choose_backend("gpu", DType::f32), InputError);
  EXPECT_THROW(choose_backend("cuda", DType::f32), DeviceError);
}

}  // namespace
}  // namespace trainmem
