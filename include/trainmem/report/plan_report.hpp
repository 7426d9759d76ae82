// plan's report, described once for every format (--format):
//   table     the inputs, the best --top K layouts with per-rank memory, the rejected families;
//   markdown  the same as Markdown (the report is described once, on a ReportWriter);
//   csv       the best layouts, one row each, exact figures (bytes, seconds);
//   json      schema "trainmem/1": {"schema", "command": "plan", "model", "inputs",
//             "cost_model", "counts", "candidates", "rejected", "timing"}.
#pragma once
#include "trainmem/analytic/plan.hpp"
#include "trainmem/report/report_writer.hpp"

namespace trainmem::report {

void write_plan(ReportWriter& w, const PlanResult& r);

}  // namespace trainmem::report
