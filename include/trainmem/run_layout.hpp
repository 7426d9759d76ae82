// A parallel layout traced rank by rank on the meta backend (ShardedStep, sharded_step.hpp)
// beside the per-rank analytic profile (analytic_rank.hpp): for each distinct rank (pipeline
// stage) the ledger's figures of the steady-state step, and whether each equals the closed form.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trainmem/analytic_rank.hpp"
#include "trainmem/figures.hpp"

namespace trainmem {

struct RankTrace {
  std::int64_t stage = 0;
  MemoryFigures ledger;                  // measured_figures after the last step
  std::uint64_t communication_peak = 0;  // the ledger's peak of the communication category
  std::size_t tensors_at_peak = 0;       // allocations alive at the total peak
  bool matches = false;                  // every figure and the peak breakdown equal the analytic
  std::vector<std::string> differences;  // "activations_peak: ledger X, analytic Y"
};

struct LayoutTrace {
  LayoutEstimate analytic;
  std::vector<RankTrace> ranks;  // one per analytic rank, same order
  int steps = 0;
  double seconds = 0;  // wall time of the traces
  bool all_match() const;
};

// Traces `steps` (>= 1) steps of every distinct rank of `layout` (resolved) on meta.
LayoutTrace trace_layout(const ModelConfig& model, const TrainConfig& train,
                         const ParallelConfig& layout, const OverheadOptions& overheads, int steps);

}  // namespace trainmem
