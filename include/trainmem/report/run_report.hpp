// The reports of one run (include/trainmem/run/run.hpp), built in the report layer: the per-run
// JSON object of docs/design.md, the title and backend lines every run report starts with, and
// profile's report in each format, described once on a report writer; compare and sweep build their
// reports from the same pieces.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "trainmem/base/config.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/run/run.hpp"
#include "trainmem/run/timeline.hpp"

namespace trainmem {

// The per-run object of docs/design.md ("JSON output"): schema, model, run, analytic, measured,
// reconciliation, tensors; plus device_checks and, after an out-of-memory, error.
nlohmann::json run_result_json(const RunResult& r);
// A mixture of experts' measured routing (RunResult::routing; `measured.routing` of the JSON
// report and the file --dump-routing writes): the model, batch, sequence, experts, top-K and
// per layer the tokens each expert received in the last step's forward, with a note that no
// byte depends on it.
nlohmann::json routing_json(const RunResult& r);
// An out-of-memory as the "error" object of the JSON report (kind, message, requested bytes,
// category, tensor, live bytes, step, the tensors alive, largest first).
nlohmann::json failure_json(const RunFailure& f);
// The same as the report's alert lines: what failed, the budget, the five largest tensors alive.
std::vector<std::string> failure_lines(const RunFailure& f,
                                       const std::optional<std::uint64_t>& device_budget,
                                       ByteUnit u);

// "backend meta — PREDICTED: allocations traced, no arithmetic (...)" or "backend cpu ...".
std::string backend_line(const RunResult& r);
// The "native" cell of compare's and sweep's tables: "OOM" when the run failed, else whether
// the ledger equals the analytic native profile in every category.
report::Cell native_cell(const RunResult& r);

// profile's report, described once on `w` (report_writer.hpp): the reconciliation table, the
// device sources, the true peak with its breakdown and where it happened, the reference
// profiles. The text form (a terminal's) also gives the steps, losses and overhead and the
// headings in full; Markdown the same tables under brief headings; CSV the reconciliation
// rows in bytes; JSON run_result_json.
void write_profile(report::ReportWriter& w, const RunResult& r);

// The page's chart of per-layer activations (HTML; report/svg_chart.hpp): a row per profile
// (the measured ledger first, then each analytic profile of the first run), a bar per run of
// `runs` (series named by `series`), each bar's data-v the JSON report's
// per_layer_activations of that profile and run.
std::string per_layer_chart_html(const std::vector<const RunResult*>& runs,
                                 const std::vector<std::string>& series, const std::string& id);

// The profile page's timeline (HTML; src/report/timeline_html.cpp): the SVG with up to
// `max_instants` instants (evenly spread, the peak always one), each listing in its tooltip the
// live total and the tensors live after it; the tensors live at the peak as a table (readable
// without JavaScript, sortable and filtered with it); the data a small inline script needs to
// list the live tensors (name, layer, category, bytes, phase) of the instant hovered or
// clicked: the window's tensor records once, with their allocation and release events.
// `tensors`: the run's records (setup and the step shown).
std::string timeline_html(const TimelineData& data, const std::vector<TensorRecord>& tensors,
                          std::size_t max_instants = 300);

}  // namespace trainmem
