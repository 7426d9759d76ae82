// maxbatch's report, in every format: the largest batch (or sequence) that fits the budget, the
// candidate past it, the budget and the overheads with their sources, how many were traced; for
// a layout of several GPUs, per rank (the worst rank) with the overheads outside the books.
#pragma once
#include <string>
#include <vector>

#include "trainmem/report/report_writer.hpp"
#include "trainmem/run/maxbatch.hpp"

namespace trainmem::report {

// `budget_source`: "--budget 80GiB" or the device's; `overhead_source`: one GPU's overhead's
// ("stated with --overhead 1GiB", measured, ...), unused for a layout (its overheads say theirs).
std::string render_maxbatch(const MaxbatchRequest& rq, const MaxbatchResult& m,
                            const std::string& budget_source, const std::string& overhead_source,
                            Format format, Colour colour);

// One search per --checkpointing policy (a list, e.g. none,selective,every:2,full): each policy's
// largest batch or sequence, its peak and margin, and the recompute it costs there (FLOPs per
// step of the native step at that size; a layout's worst rank's). `runs` hold each policy's
// request (rq with that policy) and result, in the order given.
struct MaxbatchPolicyRun {
  MaxbatchRequest request;
  MaxbatchResult result;
};
std::string render_maxbatch_policies(const std::vector<MaxbatchPolicyRun>& runs,
                                     const std::string& budget_source,
                                     const std::string& overhead_source, Format format,
                                     Colour colour);

}  // namespace trainmem::report
