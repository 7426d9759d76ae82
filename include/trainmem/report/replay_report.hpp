// `trainmem replay`'s report, in every format: what PyTorch's caching allocator (the model of
// analytic/caching_allocator.hpp) would allocate and reserve for a sequence of allocations and
// frees, its segments at the reserved peak, the cache's unused bytes there, and the
// out-of-memory PyTorch would raise under the budget, with its message.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "trainmem/analytic/caching_allocator.hpp"
#include "trainmem/base/bytes.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/run/allocator_model.hpp"

namespace trainmem::report {

// The configuration in words: "pytorch (max_split_size unlimited, ...)".
std::string describe_allocator(const CachingAllocatorConfig& c);
// {"name": "pytorch", "max_split_size": ..., ...}
nlohmann::json allocator_config_json(const CachingAllocatorConfig& c);
// The statistics: allocated/reserved/requested/segments {current, peak}, the figures at the
// reserved peak and the cudaMalloc counts.
nlohmann::json allocator_stats_json(const CachingAllocatorStats& s,
                                    const std::vector<std::uint64_t>& segments_at_reserved_peak);
// A run's --allocator figures: the statistics, "spec", "config", "run_reserved_peak",
// "run_allocated_peak"; with `shadows`, the shadows' the same way under "shadows".
nlohmann::json allocator_model_json(const AllocatorModelResult& a,
                                    const std::vector<AllocatorModelResult>* shadows = nullptr);
// What was held at the reserved peak, the segments then, the cudaMalloc counts: three lines.
std::vector<std::string> allocator_peak_lines(
    const CachingAllocatorStats& s, const std::vector<std::uint64_t>& segments_at_reserved_peak,
    ByteUnit u);

// `source`: the events file; `budget_source`: "--budget 40GiB", or "" (unlimited).
void write_replay(ReportWriter& w, const ReplayResult& r, const std::string& source,
                  const std::string& budget_source);

}  // namespace trainmem::report
