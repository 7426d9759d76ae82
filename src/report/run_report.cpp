// profile's report, described once for every format, and the title and backend lines every run
// report starts with (see include/trainmem/run/run_report.hpp). The per-run JSON: run_json.cpp.
#include "trainmem/report/run_report.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "trainmem/report/replay_report.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/report/svg_chart.hpp"
#include "trainmem/run/timeline.hpp"

namespace trainmem {

using report::Cell;

std::string backend_line(const RunResult& r) {
  std::string s = "backend " + r.backend;
  if (!r.computes)
    s += " — PREDICTED: the exact allocation trace of the step, no arithmetic";
  else if (r.backend == "cpu")
    s += " — measured: real arithmetic on the CPU, the bytes a GPU run allocates";
  else
    s += " — measured on the GPU";
  if (!r.backend_note.empty()) s += "\n  note: " + r.backend_note;
  return s;
}

report::Cell native_cell(const RunResult& r) {
  if (r.failure) return "OOM";
  bool ok = true;
  for (const auto& row : reconcile_ledger_native(r)) ok &= row.ok;
  return report::check_cell(ok);
}

namespace {

std::string signed_bytes(std::int64_t v) {
  if (v == 0) return "0";
  return (v > 0 ? "+" : "-") + report::with_commas(std::uint64_t(v > 0 ? v : -v));
}

std::string percent(double f) {
  return report::fixed(100.0 * f, 2) + "%";
}

std::string where_text(const PeakInfo& p) {
  std::string s = std::string("in ") + phase_name(p.phase);
  if (p.layer >= 0) s += ", layer " + std::to_string(p.layer);
  if (!p.tensor.empty()) s += ", at the allocation of " + p.tensor;
  if (p.seq) s += " (ledger event " + std::to_string(p.seq) + ")";
  return s;
}

std::uint64_t max_figure(const MemoryFigures& f) {
  return std::max({f.params, f.gradients, f.optimizer_states, f.activations, f.activations_peak,
                   f.workspace, f.inputs, f.sum, f.peak});
}

// The unit of every figure of profile's report.
ByteUnit profile_unit(const RunResult& r) {
  return table_unit(std::max(max_figure(r.ledger), max_figure(r.native().figures)));
}

// ---------------------------------------------------------------- profile's tables

report::Table reconciliation_table(const RunResult& r, ByteUnit u) {
  report::Table t({{"category", report::Align::left},
                   {std::string("measured (") + u.name + ")"},
                   {std::string("analytic (") + u.name + ")"},
                   {"difference (B)"},
                   {"rel error"},
                   {"ok", report::Align::left}});
  for (const auto& row : reconcile_ledger_native(r)) {
    if (row.category == "sum") t.add_rule();
    t.add_row({row.category, format_bytes(row.measured, u), format_bytes(row.analytic, u),
               signed_bytes(row.difference), percent(row.rel_error),
               row.judged ? report::check_cell(row.ok) : Cell("- (OOM)")});
  }
  return t;
}

report::Table device_table(const RunResult& r, ByteUnit u) {
  report::Table t({{"source", report::Align::left},
                   {"figure", report::Align::left},
                   {std::string("ledger (") + u.name + ")"},
                   {std::string("device (") + u.name + ")"},
                   {"difference (B)"},
                   {"ok", report::Align::left},
                   {"bound", report::Align::left}});
  for (const auto& c : r.device_checks)
    t.add_row({c.source, c.what, format_bytes(c.ledger, u), format_bytes(c.device, u),
               signed_bytes(c.difference), report::check_cell(c.ok), c.bound});
  return t;
}

report::Table breakdown_table(const RunResult& r, ByteUnit u) {
  report::Table t({{"category at the peak", report::Align::left},
                   {std::string("live (") + u.name + ")"},
                   {"share"}});
  for (Category c : all_categories()) {
    const std::uint64_t b = r.peak.breakdown[static_cast<int>(c)];
    t.add_row({category_name(c), format_bytes(b, u),
               r.peak.bytes ? percent(double(b) / double(r.peak.bytes)) : "-"});
  }
  t.add_rule();
  t.add_row({"total", format_bytes(r.peak.bytes, u), r.peak.bytes ? "100.00%" : "-"});
  return t;
}

report::Table references_table(const RunResult& r, ByteUnit u) {
  report::Table t({{"profile", report::Align::left},
                   {"Params"},
                   {"Gradients"},
                   {"Optimizer States"},
                   {"Activations"},
                   {"Total"},
                   {"Peak"},
                   {"per layer", report::Align::left}});
  auto row = [&](const std::string& name, const MemoryFigures& f, const std::string& formula) {
    t.add_row({name, format_bytes(f.params, u), format_bytes(f.gradients, u),
               format_bytes(f.optimizer_states, u), format_bytes(f.activations, u),
               format_bytes(f.sum, u), format_bytes(f.peak, u), formula});
  };
  row(std::string("measured (") + r.backend + (r.computes ? "" : ", predicted") + ")", r.ledger,
      "");
  t.add_rule();
  for (const Estimate& e : r.estimates)
    row(profile_name(e.profile), e.figures, report::per_layer_formula(e));
  return t;
}

// The reconciliation rows in bytes (profile --format csv).
report::Table reconciliation_bytes_table(const RunResult& r) {
  report::Table t({{"category", report::Align::left},
                   {"measured"},
                   {"analytic"},
                   {"difference"},
                   {"rel_error"},
                   {"ok", report::Align::left}});
  for (const auto& row : reconcile_ledger_native(r))
    t.add_row({row.category, std::to_string(row.measured), std::to_string(row.analytic),
               std::to_string(row.difference), report::fixed(row.rel_error, 9),
               !row.judged ? ""
               : row.ok    ? "true"
                           : "false"});
  return t;
}

// ---------------------------------------------------------------- profile's lines

// "pool: unavailable: <reason>" for each device source the run could not read.
std::vector<std::string> unavailable_sources(const RunResult& r) {
  std::vector<std::string> out;
  auto source = [&](const char* name, bool available, const std::string& reason) {
    if (!available) out.push_back(std::string(name) + ": unavailable: " + reason);
  };
  source("pool", r.pool.available, r.pool.reason);
  source("cupti", r.cupti.available, r.cupti.reason);
  source("memgetinfo", r.memgetinfo.available, r.memgetinfo.reason);
  return out;
}

// Overhead = device used − ledger live, at the last memgetinfo snapshot that has both.
std::optional<std::pair<std::string, std::int64_t>> overhead_of(const RunResult& r) {
  if (!r.memgetinfo.available) return std::nullopt;
  for (auto it = r.memgetinfo.snapshots.rbegin(); it != r.memgetinfo.snapshots.rend(); ++it)
    if (it->has_ledger)
      return std::make_pair(it->name, std::int64_t(it->used) - std::int64_t(it->ledger_live));
  return std::nullopt;
}

std::string losses_text(const RunResult& r) {
  std::string s;
  for (std::size_t i = 0; i < r.losses.size(); ++i)
    if (std::isfinite(r.losses[i]))
      s += (s.empty() ? "" : ", ") + std::string("step ") + std::to_string(i + 1) + " " +
           report::fixed(r.losses[i], 4);
    else if (r.computes)  // a computed loss that is NaN or Inf is shown, not dropped
      s += (s.empty() ? "" : ", ") + std::string("step ") + std::to_string(i + 1) + " " +
           (std::isnan(r.losses[i]) ? "NaN" : "Inf") + " (not finite)";
  if (!r.non_finite_weights.empty())
    s += "; --weights holds NaN or Inf values in " + std::to_string(r.non_finite_weights.size()) +
         " tensor(s)";
  return s;
}

// "2 of 2 step(s) run; figures from step 2 (steady state)"
std::string steps_line(const RunResult& r) {
  std::ostringstream o;
  o << r.steps_done << " of " << r.steps_requested << " step(s) run; figures from "
    << (r.failure && r.failure->step == 0
            ? std::string("setup")
            : "step " + std::to_string(r.failure ? r.failure->step : r.steps_done))
    << (r.failure ? (r.failure->step ? " up to the failure"
                                     : " (setup: what it allocated "
                                       "was released while unwinding; "
                                       "the peak stands)")
                  : (r.steps_done >= 2 ? " (steady state)" : ""));
  return o.str();
}

std::string true_peak_heading(const RunResult& r, ByteUnit u) {
  return "True peak: " + format_bytes_with_unit(r.peak.bytes, u) + " " + where_text(r.peak);
}

// --allocator: the model's figures beside the ledger's peak.
void write_allocator_model(report::ReportWriter& w, const RunResult& r, ByteUnit u) {
  if (!r.allocator_model) return;
  const AllocatorModelResult& a = *r.allocator_model;
  const CachingAllocatorStats& s = a.step;
  w.heading("What PyTorch's caching allocator would reserve (a model; --allocator " + a.spec +
                "; the last step, its peaks reset at the step's start)",
            "PyTorch's caching allocator (model)");
  report::Table t({{"", report::Align::left},
                   {std::string("step peak (") + u.name + ")"},
                   {std::string("over the ledger's peak (") + u.name + ")"}});
  const std::uint64_t ledger = r.ledger.peak;
  auto row = [&](const std::string& name, std::uint64_t v) {
    const std::string over =
        v >= ledger ? "+" + format_bytes(v - ledger, u) : "-" + format_bytes(ledger - v, u);
    t.add_row({name, format_bytes(v, u), over});
  };
  row("the ledger's peak (live tensor bytes)", ledger);
  row("requested (the same tensors, as PyTorch counts them)", s.requested.peak);
  row("allocated (memory_allocated: blocks of 512 B multiples)", s.allocated.peak);
  row("reserved (memory_reserved: the segments held)", s.reserved.peak);
  w.table(t);
  w.paragraph_break();
  w.line("allocator: " + report::describe_allocator(a.config) + "; docs/allocator.md");
  for (const std::string& line : report::allocator_peak_lines(s, a.segments_at_reserved_peak, u))
    w.line(line);
  w.line("over the whole run (setup and every step, no reset): reserved peak " +
         format_bytes_with_unit(a.run_reserved_peak, u) + ", allocated peak " +
         format_bytes_with_unit(a.run_allocated_peak, u));
}

}  // namespace

// ---------------------------------------------------------------- the per-layer chart

std::string per_layer_chart_html(const std::vector<const RunResult*>& runs,
                                 const std::vector<std::string>& series, const std::string& id) {
  report::BarChart c;
  c.id = id;
  c.title = "Per-layer activation bytes, profile by profile";
  c.axis_label = "activation bytes per transformer layer (end of forward)";
  c.series = series;
  auto measured_name = [](const RunResult& r) {
    return std::string("measured (") + r.backend + (r.computes ? "" : ", predicted") + ")";
  };
  report::BarGroup measured{measured_name(*runs.front()), {}};
  for (std::size_t k = 0; k < runs.size(); ++k)
    measured.bars.push_back(report::measured_per_layer_bar(
        runs[k]->per_layer_activations(),
        measured.label + (k < series.size() ? ", " + series[k] : std::string())));
  c.groups.push_back(std::move(measured));
  for (std::size_t e = 0; e < runs.front()->estimates.size(); ++e) {
    report::BarGroup g{profile_name(runs.front()->estimates[e].profile), {}};
    for (std::size_t k = 0; k < runs.size(); ++k)
      if (e < runs[k]->estimates.size())
        g.bars.push_back(
            report::per_layer_bar(runs[k]->estimates[e], k < series.size() ? series[k] : ""));
    c.groups.push_back(std::move(g));
  }
  return "<h2>Per-layer activations, profile by profile</h2>\n" + report::bar_chart_svg(c) +
         "<figcaption>Bytes one transformer layer keeps for backward (the ledger's, measured, "
         "and each analytic profile's); hover a bar for the exact bytes, the formula and its "
         "s·b·h coefficient.</figcaption>\n";
}

// ---------------------------------------------------------------- profile's report

void write_profile(report::ReportWriter& w, const RunResult& r) {
  const ByteUnit u = profile_unit(r);
  w.document([&] { return run_result_json(r); });
  w.csv_table(reconciliation_bytes_table(r));

  w.title("trainmem profile: " + run_title(r.model, r.train));
  w.paragraph_break();
  const std::string family = report::family_line(r.model);
  if (!family.empty()) w.paragraph(family);
  w.banner(backend_line(r));
  w.detail(steps_line(r));
  if (!r.estimates.empty())
    if (const std::string rc = report::recompute_text(r.native()); !rc.empty())
      w.detail("recompute (checkpointing " + checkpointing_name(r.train) + "): " + rc);
  if (!r.estimates.empty())
    if (const std::string off = report::offload_text(r.native()); !off.empty())
      w.detail("activation offload (native): " + off + "; measured: host peak " +
               format_bytes_with_unit(r.offload_host_peak, u) + ", copied " +
               format_bytes_with_unit(r.offload_transfer_bytes, u));
  if (const std::string pg = report::managed_text(r.train.optimizer, r.optimizer_states_managed);
      !pg.empty())
    w.detail("managed memory, " + pg);
  const std::string losses = losses_text(r);
  if (!losses.empty()) w.detail("loss: " + losses);
  if (r.failure) w.alert(failure_lines(*r.failure, r.device_budget, u));
  if (!r.routing.empty()) {
    const std::int64_t cap = moe_capacity(r.model, r.train);
    const bool measured = r.routing_source == "measured";
    w.detail(
        "routing (" +
        (measured ? std::string("last step's forward")
                  : "given to the meta trace, " + r.routing_source +
                        (r.routing_source == "balanced" ? " (the default; --routing FILE)" : "")) +
        ", tokens per expert, experts 0.." + std::to_string(r.model.experts - 1) +
        "): no byte of the step depends on it, every " +
        (cap > 0 ? "expert buffer holds E·capacity = " + std::to_string(r.model.experts) + "·" +
                       std::to_string(cap) + " rows (--capacity-factor " +
                       number_text(r.train.capacity_factor) + "; an expert computes at most " +
                       std::to_string(cap) + " of the choices routed to it, in token order)"
                 : "expert buffer holds b·s·K = " +
                       std::to_string(r.train.batch * r.train.seq * r.model.experts_per_token) +
                       " rows"));
    for (const LayerRoutingRecord& rec : r.routing) {
      std::string line = "  layer " + std::to_string(rec.layer) + ":";
      for (std::int64_t c : rec.tokens_per_expert) line += " " + std::to_string(c);
      if (cap > 0) line += "  (dropped " + std::to_string(rec.dropped) + ")";
      w.detail(line);
    }
  }

  w.heading("Reconciliation: measured (ledger) vs analytic (native), ok = exact",
            "Reconciliation: measured (ledger) vs analytic (native)");
  w.table(reconciliation_table(r, u));

  w.heading("Device sources vs the ledger", "Device sources");
  if (!r.device_checks.empty()) {
    w.table(device_table(r, u));
    w.paragraph_break();
  }
  w.list(unavailable_sources(r));
  if (auto oh = overhead_of(r))
    w.detail("overhead (cudaMemGetInfo used − ledger live, " + oh->first + "): " +
             format_bytes_with_unit(std::uint64_t(std::max<std::int64_t>(oh->second, 0)), u) +
             " (CUDA context, cuBLAS workspace and modules, pool slack)");
  else
    w.detail("overhead (device used − ledger live): unavailable: " + r.memgetinfo.reason);

  w.heading(true_peak_heading(r, u));
  w.table(breakdown_table(r, u));
  write_allocator_model(w, r, u);
  // The page's timeline (the HTML form only; the run keeps one for it).
  if (r.timeline)
    w.figure([&] {
      return "<h2>Timeline of the step: live bytes by category</h2>\n" +
             timeline_html(*r.timeline, r.tensors);
    });

  w.heading(std::string("Reference profiles (analytic, for context; ") + u.name +
                "; Total = params + gradients + optimizer states + activations)",
            std::string("Reference profiles (") + u.name + ")");
  w.table(references_table(r, u));
  if (!r.estimates.empty())
    w.figure([&] { return per_layer_chart_html({&r}, {}, "per-layer-chart"); });
  for (const Estimate& e : r.estimates)
    if (e.profile == Profile::megatron || e.profile == Profile::zero) {
      w.detail(
          "megatron and zero are GPT-style reference formulas (Korthikanti et al. 2022; "
          "ZeRO), not LLaMA's.");
      break;
    }
}

std::vector<std::string> failure_lines(const RunFailure& f,
                                       const std::optional<std::uint64_t>& device_budget,
                                       ByteUnit u) {
  std::vector<std::string> out;
  out.push_back("OUT OF MEMORY " + (f.step ? "in step " + std::to_string(f.step) : "in setup") +
                ": " + f.message);
  if (device_budget)
    out.push_back("  (--device-budget " + report::with_commas(*device_budget) +
                  " B: a budget-limited allocator; figures below are up to the failure)");
  out.push_back("  largest tensors alive at the failure:");
  for (std::size_t i = 0; i < f.live_tensors.size() && i < 5; ++i)
    out.push_back("    " + f.live_tensors[i].name + " (" +
                  category_name(f.live_tensors[i].category) + ") " +
                  format_bytes_with_unit(f.live_tensors[i].bytes, u));
  return out;
}

}  // namespace trainmem
