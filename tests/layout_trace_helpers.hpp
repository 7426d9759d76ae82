// The per-rank trace (ShardedStep on meta, two steps through the ledger) of every pipeline stage
// of a layout against the per-rank analytic profile (estimate_layout), byte for byte: the check
// the per-rank tests share.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/sharded_step.hpp"

namespace trainmem::test {

// Every stage of the resolved layout `p`; gtest failures name `what`, the stage and the analytic's
// peak instant. Returns the analytic layout for further checks. `grad_rank`: the rank's index in
// the gradient group, where ranks differ (per-parameter sharding's owned rows, an
// expert-parallel index's received rows).
inline LayoutEstimate expect_trace_equals_layout(const ModelConfig& m, const TrainConfig& t,
                                                 const ParallelConfig& p, const std::string& what,
                                                 std::int64_t grad_rank = 0) {
  LayoutEstimate le = estimate_layout_of_rank(m, t, p, grad_rank);
  EXPECT_EQ(le.ranks.size(), std::size_t(p.pp)) << what;
  for (std::int64_t k = 0; k < p.pp && k < std::int64_t(le.ranks.size()); ++k) {
    MetaAllocator alloc;
    Ledger ledger(alloc);
    ShardedStep step(m, t, p, k, ledger, nullptr, grad_rank);
    step.train_step();
    step.train_step();  // the steady-state step's figures
    const MemoryFigures got = measured_figures(ledger);
    const RankEstimate& r = le.ranks[std::size_t(k)];
    const MemoryFigures& want = r.est.figures;
    const std::string at = what + " stage " + std::to_string(k) + " (analytic peak at " +
                           r.est.instants[std::size_t(r.est.peak_instant)].name + ")";
    EXPECT_EQ(got.params, want.params) << at;
    EXPECT_EQ(got.gradients, want.gradients) << at;
    EXPECT_EQ(got.optimizer_states, want.optimizer_states) << at;
    EXPECT_EQ(got.activations, want.activations) << at;
    EXPECT_EQ(got.activations_peak, want.activations_peak) << at;
    EXPECT_EQ(got.workspace, want.workspace) << at;
    EXPECT_EQ(got.inputs, want.inputs) << at;
    EXPECT_EQ(got.peak, want.peak) << at;
    EXPECT_EQ(got.peak_breakdown, want.peak_breakdown) << at;
    // A trace holds no optimizer offload's host vectors; activation offload's host ledger it does.
    if (p.offload == Offload::none) {
      EXPECT_EQ(step.host_bytes(), r.host_bytes) << at;
    }
    if (::testing::Test::HasFailure()) break;
  }
  return le;
}

}  // namespace trainmem::test
