// Phases that allocate nothing (AdamW's optimizer phase) still appear on the timeline: the
// ledger keeps phase marks, and the timeline turns an enter/exit pair with no event between
// them into a slice.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "trainmem/ledger/ledger.hpp"
#include "trainmem/run/timeline.hpp"

namespace trainmem {
namespace {

TEST(TimelineQuietPhase, OptimizerPhaseWithoutAllocationsIsASlice) {
  MetaAllocator meta;
  Ledger ledger(meta);
  ledger.begin_step(1);
  Tensor t;
  {
    auto s = ledger.scope(Phase::forward);
    t = ledger.allocate("x", Category::activations, 0, {4, 8}, DType::f32);
  }
  {
    auto s = ledger.scope(Phase::backward);
    t.reset();
  }
  { auto s = ledger.scope(Phase::optimizer); }  // no allocation

  ASSERT_EQ(ledger.phase_marks().size(), 6u);
  EXPECT_TRUE(ledger.phase_marks()[4].enter);
  EXPECT_EQ(ledger.phase_marks()[4].phase, Phase::optimizer);
  EXPECT_EQ(ledger.phase_marks()[4].after_seq, 2u);
  EXPECT_EQ(ledger.phase_marks()[5].after_seq, 2u);

  const TimelineData with = build_timeline(ledger.timeline(), ledger.tensors(), 1,
                                           TimeAxis::event_index, "t", 0, ledger.phase_marks());
  ASSERT_EQ(with.quiet_phases.size(), 1u);
  EXPECT_EQ(with.quiet_phases[0].phase, Phase::optimizer);
  EXPECT_EQ(with.quiet_phases[0].before, 2u);  // after both events
  ASSERT_EQ(with.phases.size(), 2u);           // forward, backward: from the events

  const auto trace = nlohmann::json::parse(timeline_trace_json(with));
  int optimizer_slices = 0;
  for (const auto& e : trace["traceEvents"])
    if (e.value("cat", "") == "phase" && e["name"] == "optimizer") ++optimizer_slices;
  EXPECT_EQ(optimizer_slices, 1);
  EXPECT_NE(timeline_svg(with).find("data-phase=\"optimizer\""), std::string::npos);

  // Without the marks there is nothing to tell the optimizer phase ran.
  const TimelineData without =
      build_timeline(ledger.timeline(), ledger.tensors(), 1, TimeAxis::event_index, "t", 0);
  EXPECT_TRUE(without.quiet_phases.empty());
  EXPECT_EQ(timeline_svg(without).find("data-phase=\"optimizer\""), std::string::npos);
}

TEST(TimelineQuietPhase, ThePreviousStepsOptimizerIsOutsideTheWindow) {
  MetaAllocator meta;
  Ledger ledger(meta);
  std::uint64_t step2_first_seq = 0;
  for (int step = 1; step <= 2; ++step) {
    ledger.begin_step(step);
    Tensor t;
    {
      auto s = ledger.scope(Phase::forward);
      t = ledger.allocate("x", Category::activations, 0, {8}, DType::f32);
      if (step == 2) step2_first_seq = ledger.timeline().back().seq;
    }
    {
      auto s = ledger.scope(Phase::backward);
      t.reset();
    }
    { auto s = ledger.scope(Phase::optimizer); }
  }
  const TimelineData d = build_timeline(ledger.timeline(), ledger.tensors(), step2_first_seq,
                                        TimeAxis::wall, "t", 0, ledger.phase_marks());
  ASSERT_EQ(d.quiet_phases.size(), 1u);
  EXPECT_EQ(d.quiet_phases[0].before, 2u);
  EXPECT_GE(d.quiet_phases[0].start_ns, 0);
}

TEST(TimelineQuietPhase, PhasesWithEventsAreNotQuiet) {
  MetaAllocator meta;
  Ledger ledger(meta);
  Tensor a;
  {
    auto s = ledger.scope(Phase::forward);
    a = ledger.allocate("a", Category::activations, 0, {16}, DType::f32);
  }
  {
    auto s = ledger.scope(Phase::optimizer);
    a.reset();
  }
  const TimelineData d = build_timeline(ledger.timeline(), ledger.tensors(), 1,
                                        TimeAxis::event_index, "t", 0, ledger.phase_marks());
  EXPECT_TRUE(d.quiet_phases.empty());
  ASSERT_EQ(d.phases.size(), 2u);
  EXPECT_EQ(d.phases[1].phase, Phase::optimizer);
}

}  // namespace
}  // namespace trainmem
