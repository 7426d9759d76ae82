// compare's report for one GPU: each optimizer's pair of runs (checkpointing none, full), in
// every format (docs/design.md, "compare").
#pragma once
#include <vector>

#include "trainmem/report/report_writer.hpp"
#include "trainmem/run/run.hpp"

namespace trainmem::report {

// One optimizer's pair of runs.
// One policy against the baseline of its optimizer: `none` ran without checkpointing, `full`
// under the policy (full, or a per-layer one: every:K, layers:LIST, budget:SIZE). The pairs of
// one optimizer share their `none` run.
struct ComparePair {
  Optimizer optimizer;
  const RunResult* none = nullptr;
  const RunResult* full = nullptr;
};

// The report, described once for every format on `w`: `pairs` point into `runs` (every run, in
// order, for the JSON document's "runs").
void write_compare(ReportWriter& w, const std::vector<ComparePair>& pairs,
                   const std::vector<RunResult>& runs);

}  // namespace trainmem::report
