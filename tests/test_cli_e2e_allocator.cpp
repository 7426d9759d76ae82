// End to end: `--allocator pytorch[:...]` on a run (profile) and on maxbatch: every allocation of
// the step mirrored in the model of PyTorch's caching allocator (docs/allocator.md). What is
// asserted follows from what the allocator is, not from our code: it is asked for exactly the
// ledger's tensors (requested == the ledger's peak); it hands out blocks of at least the request
// (allocated >= requested) carved from what it reserves (reserved >= allocated); under a device
// budget it raises when the *reserved* bytes cannot grow, which can happen while the live bytes
// are still under the budget; and a batch that fits what PyTorch reserves fits the live bytes.
#include <gtest/gtest.h>

#include <sstream>

#include "test_cli_e2e_helpers.hpp"

namespace trainmem::e2e {
namespace {

constexpr std::uint64_t MiB = 1048576;
const std::string kRun = "profile --model tiny --seq 128 --batch 4 --backend meta --format json";

std::uint64_t u64(const json& j) {
  return j.get<std::uint64_t>();
}

TEST(CliE2EAllocator, ProfileReportsWhatPyTorchWouldReserve) {
  for (const std::string& spec :
       {std::string("pytorch"), std::string("pytorch:expandable_segments=true")}) {
    SCOPED_TRACE(spec);
    const Result r = trainmem(kRun + " --allocator " + spec);
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = r.j();
    const json& a = j["allocator_model"];
    ASSERT_TRUE(a.is_object());
    EXPECT_EQ(a["spec"], spec);
    EXPECT_EQ(a["config"]["expandable_segments"], spec != "pytorch");
    const std::uint64_t ledger_peak = u64(j["measured"]["ledger"]["peak"]);
    EXPECT_EQ(u64(a["requested"]["peak"]), ledger_peak);  // the same tensors, the same instant
    EXPECT_GE(u64(a["allocated"]["peak"]), ledger_peak);
    EXPECT_GE(u64(a["reserved"]["peak"]), u64(a["allocated"]["peak"]));
    EXPECT_GE(u64(a["run_reserved_peak"]), u64(a["reserved"]["peak"]));
    EXPECT_LE(u64(a["allocated_at_reserved_peak"]), u64(a["reserved"]["peak"]));
    // Reserved is made of whole segments (multiples of 2 MiB in both modes: 2 MiB, 20 MiB or a
    // large request rounded up to 2 MiB; pages of 2 MiB or 20 MiB).
    EXPECT_EQ(u64(a["reserved"]["peak"]) % (2 * MiB), 0u);
    std::uint64_t at_peak = 0;
    for (const auto& s : a["segments_at_reserved_peak"]) at_peak += u64(s);
    EXPECT_EQ(at_peak, u64(a["reserved"]["peak"]));
    // A run without --allocator says so.
    if (spec == "pytorch") {
      const Result plain = trainmem(kRun);
      ASSERT_EQ(plain.code, 0) << plain.err;
      EXPECT_TRUE(plain.j()["allocator_model"].is_null());
      EXPECT_EQ(u64(plain.j()["measured"]["ledger"]["peak"]), ledger_peak);
    }
  }
  const Result text =
      trainmem("profile --model tiny --seq 128 --batch 4 --backend meta --allocator pytorch");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("What PyTorch's caching allocator would reserve"), std::string::npos);
  EXPECT_NE(text.out.find("reserved (memory_reserved"), std::string::npos);
}

TEST(CliE2EAllocator, UnderABudgetPyTorchRunsOutOfReservedMemoryFirst) {
  const Result free_run = trainmem(kRun + " --allocator pytorch");
  ASSERT_EQ(free_run.code, 0) << free_run.err;
  const json fj = free_run.j();
  const json& a = fj["allocator_model"];
  const std::uint64_t live = u64(fj["measured"]["ledger"]["peak"]);
  const std::uint64_t reserved = u64(a["run_reserved_peak"]);
  ASSERT_GT(reserved, live + 1) << "the tiny step's cache should hold more than its live bytes";
  // A budget between the live peak and the reserved peak: the live bytes fit it (the plain
  // budget allocator passes); PyTorch's allocator, reserving more, has to run out unless its
  // release-and-retry saves it, and then it never reserves more than the budget.
  const std::string budget = std::to_string(live + (reserved - live) / 2) + "B";
  const Result plain = trainmem(kRun + " --device-budget " + budget);
  EXPECT_EQ(plain.code, 0) << plain.err;
  const Result modelled = trainmem(kRun + " --allocator pytorch --device-budget " + budget);
  if (modelled.code == 0) {
    EXPECT_LE(u64(modelled.j()["allocator_model"]["run_reserved_peak"]),
              live + (reserved - live) / 2);
    EXPECT_GT(u64(modelled.j()["allocator_model"]["alloc_retries"]), 0u);
  } else {
    ASSERT_EQ(modelled.code, 3) << modelled.err;
    EXPECT_NE(modelled.err.find("PyTorch's caching allocator (pytorch) would raise: CUDA out of "
                                "memory. Tried to allocate"),
              std::string::npos)
        << modelled.err;
    const json j = modelled.j();  // the partial report is still written
    EXPECT_FALSE(j["error"].is_null());
    EXPECT_LE(u64(j["allocator_model"]["run_reserved_peak"]), live + (reserved - live) / 2);
  }
  // Far below the live peak, both refuse.
  const Result tight = trainmem(kRun + " --allocator pytorch --device-budget 1MiB");
  EXPECT_EQ(tight.code, 3) << tight.err;
}

TEST(CliE2EAllocator, MaxbatchAnswersWithReservedMemory) {
  const std::string base =
      "maxbatch --model tiny --seq 128 --budget 256MiB --overhead 0 --format json";
  const Result plain = trainmem(base);
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.j()["peak_kind"], "allocated");
  for (const std::string& spec :
       {std::string("pytorch"), std::string("pytorch:expandable_segments=true")}) {
    SCOPED_TRACE(spec);
    const Result r = trainmem(base + " --allocator " + spec);
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = r.j();
    EXPECT_EQ(j["peak_kind"], "reserved");
    EXPECT_EQ(j["allocator"], spec);
    // What fits PyTorch's reserve fits the live bytes: never a larger batch than without it.
    const std::int64_t best = j["batch"].get<std::int64_t>();
    EXPECT_GT(best, 0);
    EXPECT_LE(best, plain.j()["batch"].get<std::int64_t>());
    EXPECT_LE(u64(j["peak"]), 256 * MiB);
    EXPECT_GT(u64(j["next_peak"]), 256 * MiB);
    // The answer agrees with a profile run under the same budget: the best batch runs, the next
    // one raises PyTorch's out-of-memory.
    const std::string run =
        "profile --model tiny --seq 128 --backend meta --format json "
        "--device-budget 256MiB --allocator " +
        spec + " --batch ";
    EXPECT_EQ(trainmem(run + std::to_string(best)).code, 0);
    EXPECT_EQ(trainmem(run + std::to_string(best + 1)).code, 3);
  }
  // The overhead alone fills the budget: nothing fits, and the report still says what the
  // smallest candidate would reserve.
  const Result full = trainmem(
      "maxbatch --model tiny --seq 128 --budget 64MiB --overhead 64MiB --format json "
      "--allocator pytorch");
  ASSERT_EQ(full.code, 3) << full.err;
  ASSERT_FALSE(full.j()["next_peak"].is_null());
  EXPECT_GT(u64(full.j()["next_peak"]), 0u);
}

// maxbatch --profile hf-sdpa: the HF step's event sequence decides; the answer is the largest
// batch whose estimate peak fits (estimate computes the same sequence independently of the
// search), and the reserve-based answer is never larger.
TEST(CliE2EAllocator, MaxbatchSearchesTheHfStep) {
  const std::string base =
      "maxbatch --model tiny-gqa --seq 64 --budget 8MiB --overhead 0 --profile hf-sdpa "
      "--precision pure --format json";
  const Result plain = trainmem(base);
  ASSERT_EQ(plain.code, 0) << plain.err;
  const json j = plain.j();
  EXPECT_EQ(j["profile"], "hf-sdpa");
  EXPECT_EQ(j["hf"]["precision"], "pure");
  const std::int64_t best = j["batch"].get<std::int64_t>();
  ASSERT_GT(best, 0);
  auto peak_at = [](std::int64_t b) {
    const Result e = trainmem(
        "estimate --model tiny-gqa --seq 64 --profile hf-sdpa --precision "
        "pure --format json --batch " +
        std::to_string(b));
    EXPECT_EQ(e.code, 0) << e.err;
    return u64(e.j()["analytic"]["hf-sdpa"]["peak"]);
  };
  EXPECT_EQ(u64(j["peak"]), peak_at(best));
  EXPECT_LE(peak_at(best), 8 * MiB);
  EXPECT_GT(peak_at(best + 1), 8 * MiB);
  const Result reserved = trainmem(base + " --allocator pytorch");
  ASSERT_EQ(reserved.code, 0) << reserved.err;
  EXPECT_EQ(reserved.j()["peak_kind"], "reserved");
  EXPECT_LE(reserved.j()["batch"].get<std::int64_t>(), best);
  EXPECT_LE(u64(reserved.j()["peak"]), 8 * MiB);
  // hf-eager without --hf-version: the step's own era, 5.25 (hf-eager's default era for a LLaMA,
  // 4.30, is the saved-tensor profile's; it was refused here, naming --hf-version though none
  // was given): the same answer and peak as with --hf-version 5.25; an explicit other era is
  // refused below.
  const std::string eager_base =
      "maxbatch --model tiny-gqa --seq 64 --budget 8MiB --overhead 0 --profile hf-eager "
      "--format json";
  const Result eager = trainmem(eager_base);
  ASSERT_EQ(eager.code, 0) << eager.err;
  const Result era = trainmem(eager_base + " --hf-version 5.25");
  ASSERT_EQ(era.code, 0) << era.err;
  EXPECT_GT(eager.j()["batch"].get<std::int64_t>(), 0);
  EXPECT_EQ(eager.j()["batch"], era.j()["batch"]);
  EXPECT_EQ(eager.j()["peak"], era.j()["peak"]);
  // What it does not search with is refused, naming the flag.
  for (const std::string& bad :
       {std::string("maxbatch --model tiny-gqa --budget 8MiB --profile megatron"),
        std::string("maxbatch --model tiny-gqa --budget 8MiB --precision pure"),
        std::string("maxbatch --model tiny-gqa --budget 8MiB --profile hf-eager --hf-version "
                    "4.30"),
        std::string("maxbatch --model tiny-gqa --budget 8MiB --profile hf-sdpa --world-size 2")}) {
    const Result b = trainmem(bad);
    EXPECT_EQ(b.code, 2) << bad << "\n" << b.err;
    EXPECT_NE(b.err.find("--"), std::string::npos) << b.err;
  }
}

TEST(CliE2EAllocator, BadSpecsExit2NamingTheFlag) {
  for (const std::string& cmd :
       {kRun, std::string("maxbatch --model tiny --budget 1GiB"), std::string("estimate"),
        std::string("compare --model tiny --backend meta"),
        std::string("sweep --model tiny --backend meta --batch 1 --seq 16")}) {
    const Result bad = trainmem(cmd + " --allocator pytorch:expandable_segments=yes");
    EXPECT_EQ(bad.code, 2) << cmd;
    EXPECT_NE(bad.err.find("--allocator: expandable_segments=yes"), std::string::npos)
        << cmd << ": " << bad.err;
  }
}

TEST(CliE2EAllocator, CompareShowsExpandableSegmentsOffAndOnFromOneRun) {
  for (const std::string& spec :
       {std::string("pytorch"), std::string("pytorch:expandable_segments=true")}) {
    SCOPED_TRACE(spec);
    const Result r = trainmem(
        "compare --model tiny --seq 128 --batch 4 --backend meta --format json --allocator " +
        spec);
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = r.j();
    ASSERT_EQ(j["runs"].size(), 2u);  // checkpointing none, full
    for (const json& run : j["runs"]) {
      const json& a = run["allocator_model"];
      ASSERT_TRUE(a.is_object());
      const bool expandable = a["config"]["expandable_segments"].get<bool>();
      EXPECT_EQ(expandable, spec != "pytorch");
      ASSERT_EQ(a["shadows"].size(), 1u);
      const json& other = a["shadows"][0];
      EXPECT_EQ(other["config"]["expandable_segments"].get<bool>(), !expandable);
      // The same tensors were asked of both: the same requested peak, the ledger's.
      EXPECT_EQ(u64(other["requested"]["peak"]), u64(a["requested"]["peak"]));
      EXPECT_EQ(u64(a["requested"]["peak"]), u64(run["measured"]["ledger"]["peak"]));
      EXPECT_GE(u64(other["reserved"]["peak"]), u64(other["allocated"]["peak"]));
      // The shadow is the model the flipped spec builds: a profile with it reserves the same.
      const Result alone = trainmem(
          "profile --model tiny --seq 128 --batch 4 --backend meta --format json --checkpointing " +
          run["run"]["checkpointing"].get<std::string>() + " --allocator " +
          other["spec"].get<std::string>());
      ASSERT_EQ(alone.code, 0) << alone.err;
      EXPECT_EQ(u64(alone.j()["allocator_model"]["reserved"]["peak"]),
                u64(other["reserved"]["peak"]));
    }
  }
  const Result text =
      trainmem("compare --model tiny --seq 128 --batch 4 --backend meta --allocator pytorch");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("reserved (pytorch:expandable_segments=true)"), std::string::npos)
      << text.out;
}

TEST(CliE2EAllocator, SweepAddsTheReservedPeakPerPoint) {
  const Result r = trainmem(
      "sweep --model tiny --backend meta --batch 1,4 --seq 64,128 --format csv --allocator "
      "pytorch");
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream in(r.out);
  std::string header, line;
  std::getline(in, header);
  EXPECT_NE(header.find(",peak,reserved_peak,out_of_memory"), std::string::npos) << header;
  int rows = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::vector<std::string> f;
    std::stringstream ls(line);
    std::string cell;
    while (std::getline(ls, cell, ',')) f.push_back(cell);
    ASSERT_EQ(f.size(), 13u) << line;
    EXPECT_GE(std::stoull(f[11]), std::stoull(f[10])) << line;  // reserved >= the live peak
    EXPECT_EQ(std::stoull(f[11]) % (2 * MiB), 0u) << line;      // whole segments
    ++rows;
  }
  EXPECT_EQ(rows, 4);
  const Result plain =
      trainmem("sweep --model tiny --backend meta --batch 1 --seq 64 --format csv");
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.out.find("reserved_peak"), std::string::npos);
}

TEST(CliE2EAllocator, EstimateFeedsTheNativeStepsTraceToTheModel) {
  const Result r = trainmem(
      "estimate --model tiny --seq 128 --batch 4 --optimizer all --checkpointing both --format "
      "json --allocator pytorch:expandable_segments=true");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  ASSERT_EQ(j["runs"].size(), 6u);
  for (const json& run : j["runs"]) {
    const json& a = run["allocator_model"];
    ASSERT_TRUE(a.is_object());
    // The trace is the native step: its peak is the closed form's, and the model was asked for
    // exactly those bytes at the peak.
    EXPECT_EQ(u64(a["traced_peak"]), u64(run["analytic"]["native"]["peak"]));
    EXPECT_EQ(u64(a["requested"]["peak"]), u64(a["traced_peak"]));
    EXPECT_GE(u64(a["reserved"]["peak"]), u64(a["allocated"]["peak"]));
    // Blocks are at least the request.
    EXPECT_GE(u64(a["allocated"]["peak"]), u64(a["requested"]["peak"]));
  }
  const Result plain = trainmem("estimate --model tiny --format json");
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_FALSE(plain.j().contains("allocator_model"));
  const Result bad = trainmem("estimate --model tiny --allocator pytorch:max_split_size_mb=1");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("max_split_size_mb must be at least 20"), std::string::npos) << bad.err;
}

// The HF step's event sequence (hf-sdpa, transformers 5.25) through the same model: asked for
// exactly the sequence's tensors (requested peak == the profile's peak), every block at least
// its request and within its 512-byte rounding, reserved made of whole segments.
TEST(CliE2EAllocator, EstimateFeedsTheHfStepsSequenceToTheModel) {
  for (const std::string recipe : {"pure", "amp", "mixed"}) {
    SCOPED_TRACE(recipe);
    const Result r = trainmem(
        "estimate --model tiny-qwen3 --seq 64 --batch 2 --profile hf-sdpa "
        "--checkpointing full --format json --allocator pytorch --precision " +
        recipe);
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = r.j();
    const json& e = j["analytic"]["hf-sdpa"];
    EXPECT_EQ(e["hf"]["precision"], recipe);
    EXPECT_TRUE(e["hf"]["peak_from_event_sequence"].get<bool>());
    const json& a = j["hf_allocator_model"]["hf-sdpa"];
    ASSERT_TRUE(a.is_object());
    EXPECT_EQ(u64(a["step_peak"]), u64(e["peak"]));
    EXPECT_EQ(u64(a["requested"]["peak"]), u64(e["peak"]));
    EXPECT_GE(u64(a["allocated"]["peak"]), u64(a["requested"]["peak"]));
    EXPECT_GE(u64(a["reserved"]["peak"]), u64(a["allocated"]["peak"]));
    EXPECT_EQ(u64(a["reserved"]["peak"]) % (2 * MiB), 0u);
  }
  // Without the sequence (hf-eager's default era, 4.30) there is nothing to replay for it.
  const Result old =
      trainmem("estimate --model tiny --profile hf-eager --format json --allocator pytorch");
  ASSERT_EQ(old.code, 0) << old.err;
  EXPECT_FALSE(old.j().contains("hf_allocator_model"));
  EXPECT_FALSE(old.j()["analytic"]["hf-eager"]["hf"]["peak_from_event_sequence"].get<bool>());
}

TEST(CliE2EAllocator, EveryTracedRankIsFedToTheModel) {
  const std::string layout =
      " --model tiny --seq 64 --batch 2 --world-size 4 --pp 2 --zero 1 --microbatches 2";
  const Result r = trainmem("profile --backend meta --format json --allocator pytorch" + layout);
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  ASSERT_EQ(j["ranks"].size(), 2u);  // one per pipeline stage
  for (const json& rank : j["ranks"]) {
    const json& a = rank["allocator_model"];
    ASSERT_TRUE(a.is_object());
    EXPECT_EQ(u64(a["requested"]["peak"]), u64(rank["ledger"]["peak"]));
    EXPECT_GE(u64(a["allocated"]["peak"]), u64(a["requested"]["peak"]));
    EXPECT_GE(u64(a["reserved"]["peak"]), u64(a["allocated"]["peak"]));
  }
  // estimate and compare per rank trace the same ranks: the same reserve per stage.
  const Result est = trainmem("estimate --format json --allocator pytorch" + layout);
  ASSERT_EQ(est.code, 0) << est.err;
  const Result cmp = trainmem("compare --backend meta --format json --allocator pytorch" + layout);
  ASSERT_EQ(cmp.code, 0) << cmp.err;
  const json ej = est.j(), cj = cmp.j();
  ASSERT_EQ(ej["ranks"].size(), 2u);
  ASSERT_EQ(cj["rows"].size(), 2u);
  for (std::size_t k = 0; k < 2; ++k) {
    const std::uint64_t reserved = u64(j["ranks"][k]["allocator_model"]["reserved"]["peak"]);
    EXPECT_EQ(u64(ej["ranks"][k]["allocator_model"]["reserved"]["peak"]), reserved);
    EXPECT_EQ(u64(cj["rows"][k]["reserved_none"]), reserved);
    EXPECT_GE(u64(cj["rows"][k]["reserved_full"]), u64(cj["rows"][k]["full"]["peak"]));
  }
  // maxbatch over the layout: the worst rank's reserve; never more than without the model.
  const std::string mb =
      "maxbatch --format json --budget 512MiB --cuda-context 0 --nccl-memory 0" + layout;
  const Result plain = trainmem(mb);
  const Result modelled = trainmem(mb + " --allocator pytorch");
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(modelled.code, 0) << modelled.err;
  EXPECT_EQ(modelled.j()["peak_kind"], "reserved");
  EXPECT_LE(modelled.j()["best"].get<std::int64_t>(), plain.j()["best"].get<std::int64_t>());
  EXPECT_LE(u64(modelled.j()["worst_rank_peak"]), 512 * MiB);
}

}  // namespace
}  // namespace trainmem::e2e
