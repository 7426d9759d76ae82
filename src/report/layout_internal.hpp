// Internals shared by the per-rank reports (layout_report.cpp, layout_measured_report.cpp).
// Not a public header.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/base/bytes.hpp"
#include "trainmem/report/report_writer.hpp"

namespace trainmem::report::layout_detail {

// The unit of a layout's tables: the worst rank with its overheads, or the largest host bytes.
ByteUnit layout_unit(const LayoutEstimate& le);
// The prose and tables of the per-rank figures (text and Markdown), under `title`.
void describe_layout(ReportWriter& w, const LayoutEstimate& le, ByteUnit u,
                     const std::string& title);
// The "layout" object of the JSON documents (world_size, dp, tp, pp, zero, ...).
nlohmann::json layout_json(const ParallelConfig& p);
// The "trainmem/1" document of the per-rank estimate.
nlohmann::json layout_document(const LayoutEstimate& le);

}  // namespace trainmem::report::layout_detail
