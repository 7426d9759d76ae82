// A measured multi-rank profile's report, and a measured rank's partial report after an
// out-of-memory (include/trainmem/report/layout_report.hpp).
#include <algorithm>
#include <optional>
#include <set>

#include "layout_internal.hpp"
#include "trainmem/base/bytes.hpp"
#include "trainmem/base/checked.hpp"
#include "trainmem/report/layout_report.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/report/run_report.hpp"

namespace trainmem::report {

using nlohmann::json;
using namespace layout_detail;

namespace {

// Every rank of a measured job: its books at its peak, and whether they equal its stage's meta
// trace and analytic profile.
report::Table measured_table(const MeasuredLayout& ml, ByteUnit u, bool exact) {
  std::vector<report::Table::Column> cols = {{"rank"}, {"stage"}};
  const char* names[] = {"params",      "gradients",     "optimizer",
                         "activations", "communication", "peak"};
  for (const char* n : names)
    cols.push_back({exact ? std::string(n) : std::string(n) + " (" + u.name + ")"});
  cols.push_back({exact ? "step_seconds" : "step (s)"});
  cols.push_back({"= trace", report::Align::left});
  cols.push_back({"= analytic", report::Align::left});
  report::Table t(cols);
  auto cell = [&](std::uint64_t b) { return exact ? std::to_string(b) : format_bytes(b, u); };
  for (const MeasuredRank& r : ml.ranks) {
    const auto& pk = r.ledger.peak_breakdown;
    char secs[32];
    std::snprintf(secs, sizeof secs, exact ? "%.6f" : "%.3f", r.step_seconds);
    auto yes = [&](bool ok) {
      return exact ? std::string(ok ? "yes" : "NO") : report::check_cell(ok);
    };
    t.add_row({std::to_string(r.rank), std::to_string(r.stage), cell(pk[int(Category::params)]),
               cell(pk[int(Category::gradients)]), cell(pk[int(Category::optimizer_states)]),
               cell(pk[int(Category::activations)]), cell(pk[int(Category::communication)]),
               cell(r.ledger.peak), secs, yes(r.trace_differences.empty()),
               yes(r.analytic_differences.empty())});
  }
  return t;
}

}  // namespace

std::string render_measured_layout(const MeasuredLayout& ml, Format format, report::Colour colour) {
  const LayoutEstimate& le = ml.predicted.analytic;
  const ByteUnit u = layout_unit(le);
  auto w = report::make_writer(format, colour);
  const std::string n = std::to_string(ml.ranks.size());
  describe_layout(*w, le, u,
                  "trainmem profile (MEASURED on " + ml.backend + ", " + n + " ranks over " +
                      ml.collective + ")");
  w->heading("Every rank measured (" + std::to_string(ml.steps) +
             " steps, the last one's ledger) against its meta trace and the per-rank analytic "
             "profile");
  w->table(measured_table(ml, u, false));
  w->paragraph_break();
  std::size_t worst = 0;
  for (std::size_t r = 0; r < ml.ranks.size(); ++r)
    if (ml.ranks[r].ledger.peak > ml.ranks[worst].ledger.peak) worst = r;
  std::set<std::vector<std::uint64_t>> distinct;
  for (const auto& r : ml.ranks)
    distinct.insert({r.ledger.params, r.ledger.gradients, r.ledger.optimizer_states,
                     r.ledger.activations_peak, r.ledger.workspace, r.ledger.peak});
  w->line(ml.all_match() ? "every rank's measured ledger equals its meta trace and the analytic "
                           "profile byte for byte"
                         : "MISMATCH: see the rows marked NO and the differences below",
          ml.all_match() ? report::Tone::ok : report::Tone::fail);
  if (!ml.ranks.empty() && ml.ranks.front().routed)
    w->line(
        "expert parallelism: each rank's meta trace is its own, given the rows its experts "
        "received in the last step (its measured routing); the analytic assumes balanced "
        "routing and is compared on the model states (params, gradients, optimizer states, "
        "inputs) only");
  if (le.layout.offload != Offload::none) {
    std::string host;
    for (const auto& r : ml.ranks)
      host += (host.empty() ? "" : ", ") + std::to_string(r.rank) + ": " +
              format_bytes_with_unit(r.host_bytes, u);
    w->item("host memory per rank (--offload " + std::string(offload_name(le.layout.offload)) +
            "; the analytic's host bytes, compared above): " + host);
  }
  w->item("worst rank: " + std::to_string(ml.ranks[worst].rank) + ", peak " +
          format_bytes_with_unit(ml.ranks[worst].ledger.peak, u) +
          "; distinct books: " + std::to_string(distinct.size()) + " of " + n + " ranks");
  std::string losses;
  for (float l : ml.losses) {
    char b[32];
    std::snprintf(b, sizeof b, "%.6f", double(l));
    losses += (losses.empty() ? "" : ", ") +
              (std::isfinite(l) ? std::string(b)
                                : std::string(std::isnan(l) ? "NaN" : "Inf") + " (not finite)");
  }
  const std::string seed = "of --seed " + std::to_string(ml.seed);
  w->item("loss of the global batch (" + std::to_string(le.global_batch) + " rows; weights " +
          (ml.weights.empty() ? "random " + seed : ml.weights) + ", tokens " +
          (ml.tokens.empty() ? "random " + seed : ml.tokens) + ") per step: " + losses);
  for (const auto& r : ml.ranks) {
    for (const auto& d : r.trace_differences)
      w->line("rank " + std::to_string(r.rank) + ": " + d, report::Tone::fail);
    for (const auto& d : r.analytic_differences)
      w->line("rank " + std::to_string(r.rank) + ": " + d, report::Tone::fail);
  }
  if (ml.backend == "cuda") {
    // The device sources per rank: what the GPU used beyond the ledger (CUDA context, cuBLAS,
    // NCCL's own buffers, the pool's rounding) beside plan's stated estimate of it.
    const auto& o = le.overheads;
    report::Table t({{"rank"},
                     {"ledger peak (" + std::string(u.name) + ")"},
                     {"pool used high (" + std::string(u.name) + ")"},
                     {"cudaMemGetInfo peak (" + std::string(u.name) + ")"},
                     {"overhead = device - ledger (" + std::string(u.name) + ")"},
                     {"estimate: context + NCCL (" + std::string(u.name) + ")"}});
    bool any = false;
    for (const auto& r : ml.ranks) {
      if (!r.device_sources) continue;
      any = true;
      const std::int64_t over = std::int64_t(r.device_used_peak) - std::int64_t(r.ledger.peak);
      t.add_row({std::to_string(r.rank), format_bytes(r.ledger.peak, u),
                 format_bytes(r.pool_used_peak, u), format_bytes(r.device_used_peak, u),
                 format_signed_bytes(over, u), format_bytes(o.total(), u)});
    }
    if (any) {
      w->heading("Device sources per rank (the last step)");
      w->table(t);
      w->line("estimate: CUDA context " + o.cuda_context_source + "; NCCL " + o.nccl_source);
      if (ml.collective == "nccl") {
        w->line(
            "not in the estimate: the fp32 work buffer of 16-bit NCCL sums (4 bytes x the largest "
            "count one communicator reduces, kept) and, with groups, the world communicator "
            "beside the group ones");
        if (le.layout.pp > 1)
          w->line(
              "in the estimate but not in this run: the pipeline's NCCL communicator (the "
              "measured stages send through host memory over MPI)");
      } else {
        w->line(
            "--collectives mpi: no NCCL in this run (the estimate's NCCL buffers are absent); "
            "ranks sharing a GPU each see the others' memory in cudaMemGetInfo, while the pool's "
            "high-water is the rank's own");
      }
    } else {
      w->item("device sources: unavailable on rank 0 (" + ml.device_reason + ")");
    }
  }
  if (!ml.ranks.empty() && ml.ranks.front().allocator_modelled) {
    // --allocator: each rank's reserve under the model, beside its meta trace's (the same
    // allocations in the same order: equal, else a difference line above).
    report::Table t({{"rank"},
                     {"ledger peak (" + std::string(u.name) + ")"},
                     {"allocated (" + std::string(u.name) + ")"},
                     {"reserved (" + std::string(u.name) + ")"},
                     {"whole run reserved (" + std::string(u.name) + ")"}});
    for (const auto& r : ml.ranks)
      t.add_row({std::to_string(r.rank), format_bytes(r.ledger.peak, u),
                 format_bytes(r.allocator_allocated_peak, u),
                 format_bytes(r.allocator_reserved_peak, u),
                 format_bytes(r.allocator_run_reserved_peak, u)});
    w->heading(
        "What PyTorch's caching allocator would reserve on each rank (a model; the last "
        "step's peaks; docs/allocator.md)");
    w->table(t);
  }
  w->paragraph_break();
  w->csv_table(measured_table(ml, u, true));
  w->document([&] {
    json doc = layout_document(le);
    doc["run"] = report::run_json(le.train, ml.backend, ml.steps);
    doc["measured"] = true;
    doc["collective"] = ml.collective;
    doc["seed"] = ml.seed;
    doc["weights"] = ml.weights.empty() ? json(nullptr) : json(ml.weights);
    doc["tokens"] = ml.tokens.empty() ? json(nullptr) : json(ml.tokens);
    json losses = json::array();  // a NaN or Inf loss says so (JSON has no NaN)
    for (float l : ml.losses) losses.push_back(std::isfinite(l) ? json(l) : json("non_finite"));
    doc["losses"] = losses;
    json ranks = json::array();
    for (const auto& r : ml.ranks) {
      json j = {{"rank", r.rank},
                {"stage", r.stage},
                {"ledger", report::figures_json(r.ledger, true)},
                {"ledger_communication_peak", r.communication_peak},
                {"ledger_tensors_at_peak", r.tensors_at_peak},
                {"step_seconds", r.step_seconds},
                {"host_bytes", r.host_bytes},
                {"device_sources", r.device_sources},
                {"device_used_peak", r.device_sources ? json(r.device_used_peak) : json(nullptr)},
                {"pool_used_peak", r.device_sources ? json(r.pool_used_peak) : json(nullptr)},
                {"matches_trace", r.trace_differences.empty()},
                {"matches_analytic", r.analytic_differences.empty()},
                {"differences", json::array()}};
      if (r.routed) {  // expert parallelism: the trace given the rank's measured routing
        j["routed_trace"] = report::figures_json(r.routed_trace, true);
        j["analytic_compared"] = "model states (balanced routing)";
      }
      if (r.allocator_modelled)
        j["allocator_model"] = {{"allocated_peak", r.allocator_allocated_peak},
                                {"reserved_peak", r.allocator_reserved_peak},
                                {"run_reserved_peak", r.allocator_run_reserved_peak}};
      for (const auto& d : r.trace_differences) j["differences"].push_back(d);
      for (const auto& d : r.analytic_differences) j["differences"].push_back(d);
      ranks.push_back(std::move(j));
    }
    doc["measured_ranks"] = ranks;
    doc["worst_measured_rank"] = ml.ranks[worst].rank;
    doc["all_ranks_match"] = ml.all_match();
    return doc;
  });
  return w->str();
}

std::string render_failed_rank(const MeasuredLayout& ml, const std::optional<std::uint64_t>& budget,
                               const std::string& command, Format format, report::Colour colour) {
  const LayoutEstimate& le = ml.predicted.analytic;
  const ByteUnit u = layout_unit(le);
  const MeasuredRank& r = ml.ranks.front();
  const RunFailure& f = *ml.failure;
  auto w = report::make_writer(format, colour);
  const std::string who =
      "rank " + std::to_string(r.rank) + " of " + std::to_string(le.layout.world);
  describe_layout(*w, le, u,
                  "trainmem " + command + " (MEASURED on " + ml.backend + ", " + who +
                      " OUT OF MEMORY: partial)");
  w->alert(failure_lines(f, budget, u));
  std::size_t k = 0;
  while (k + 1 < ml.predicted.ranks.size() && ml.predicted.ranks[k].stage != r.stage) ++k;
  const MemoryFigures& want = ml.predicted.ranks[k].ledger;
  w->heading("The " + who + " (stage " + std::to_string(r.stage) +
             ") up to the failure, beside its stage's meta trace of a whole step (" +
             std::string(u.name) + ")");
  report::Table t(
      {{"figure", report::Align::left}, {"measured up to the failure"}, {"trace (whole step)"}});
  const std::pair<const char*, std::uint64_t MemoryFigures::*> rows[] = {
      {"params", &MemoryFigures::params},
      {"gradients", &MemoryFigures::gradients},
      {"optimizer states", &MemoryFigures::optimizer_states},
      {"activations peak", &MemoryFigures::activations_peak},
      {"workspace", &MemoryFigures::workspace},
      {"peak", &MemoryFigures::peak}};
  for (const auto& [name, field] : rows)
    t.add_row({name, format_bytes(r.ledger.*field, u), format_bytes(want.*field, u)});
  w->table(t);
  w->line(
      "the other ranks' books are not in this report: when one rank fails the others may be "
      "waiting in a collective it left, so nothing is gathered (docs/distributed.md, "
      "\"Failure handling\")");
  w->document([&] {
    json doc = layout_document(le);
    doc["run"] = report::run_json(le.train, ml.backend, ml.steps);
    doc["measured"] = true;
    doc["complete"] = false;
    doc["collective"] = ml.collective;
    doc["seed"] = ml.seed;
    doc["rank"] = r.rank;
    doc["stage"] = r.stage;
    doc["ledger"] = report::figures_json(r.ledger, true);
    doc["trace_ledger"] = report::figures_json(want, true);
    doc["error"] = failure_json(f);
    return doc;
  });
  return w->str();
}

}  // namespace trainmem::report
