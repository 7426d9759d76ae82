// The reports of one run (include/trainmem/run.hpp): the per-run JSON object of docs/design.md,
// the title and backend lines every run report starts with, and profile's report in each
// human-readable format. Its tables are described once (report::Table of cells) and
// rendered per format; compare and sweep build their reports from the same pieces.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "trainmem/config.hpp"
#include "trainmem/report.hpp"
#include "trainmem/run.hpp"

namespace trainmem {

// The per-run object of docs/design.md ("JSON output"): schema, model, run, analytic, measured,
// reconciliation, tensors; plus device_checks and, after an out-of-memory, error.
nlohmann::json run_result_json(const RunResult& r);

// "llama-7b  b=8 s=512 fp16 adamw  checkpointing=none attention=eager"
std::string run_title(const ModelConfig& m, const TrainConfig& t);
// "backend meta — PREDICTED: allocations traced, no arithmetic (...)" or "backend cpu ...".
std::string backend_line(const RunResult& r);
// The "native" cell of compare's and sweep's tables: "OOM" when the run failed, else whether
// the ledger equals the analytic native profile in every category.
report::Cell native_cell(const RunResult& r);

// profile's report: the reconciliation table, the device sources and overhead, the true peak
// with its breakdown and where it happened, the reference profiles. The text form (a
// terminal's, coloured when `colour` is on) also gives the steps, losses and overhead; the
// Markdown form the same tables under shorter headings; CSV the reconciliation rows in bytes.
std::string profile_text(const RunResult& r, report::Colour colour);
std::string profile_markdown(const RunResult& r);
std::string profile_csv(const RunResult& r);

}  // namespace trainmem
