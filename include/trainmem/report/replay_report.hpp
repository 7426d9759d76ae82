// `trainmem replay`'s report, in every format: what PyTorch's caching allocator (the model of
// analytic/caching_allocator.hpp) would allocate and reserve for a sequence of allocations and
// frees, its segments at the reserved peak, the cache's unused bytes there, and the
// out-of-memory PyTorch would raise under the budget, with its message.
#pragma once
#include <optional>
#include <string>

#include "trainmem/analytic/caching_allocator.hpp"
#include "trainmem/report/report_writer.hpp"

namespace trainmem::report {

// `source`: the events file; `budget_source`: "--budget 40GiB", or "" (unlimited).
void write_replay(ReportWriter& w, const ReplayResult& r, const std::string& source,
                  const std::string& budget_source);

}  // namespace trainmem::report
