// sweep's report (include/trainmem/report/sweep_report.hpp): the grid's runs and, with --fit,
// each source's fitted coefficients beside the analytic ones (tables, and charts on the page).
#include "trainmem/report/sweep_report.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "trainmem/base/bytes.hpp"
#include "trainmem/base/lora.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/run_report.hpp"
#include "trainmem/report/schema.hpp"
#include "trainmem/report/svg_chart.hpp"

namespace trainmem::report {
namespace {

using nlohmann::json;

json fits_json(const SweepFits& f) {
  json j = json::object();
  for (const auto& s : f.fits) {
    json coefs = json::object(), an = json::object();
    for (const auto& [k, v] : s.fit.coefficients) coefs[k] = v;
    for (const auto& [k, v] : s.analytic) an[k] = v;
    j[s.source] = json{{"coefficients", coefs},
                       {"analytic", an},
                       {"residuals", s.fit.residuals},
                       {"r2", s.fit.r2},
                       {"terms", f.terms == FitTerms::one_model ? "one_model" : "separate"}};
  }
  return j;
}

report::Table runs_table(const std::vector<RunResult>& runs, bool several_models, ByteUnit u) {
  std::vector<report::Table::Column> cols;
  if (several_models) {
    cols.push_back({"h"});
    cols.push_back({"i"});
    cols.push_back({"a"});
  }
  for (const char* c : {"batch", "seq"}) cols.push_back({c});
  cols.push_back({std::string("Activations (") + u.name + ")"});
  cols.push_back({"per layer (B)"});
  cols.push_back({"native per layer (B)"});
  cols.push_back({std::string("Peak (") + u.name + ")"});
  const bool reserved = runs.front().allocator_model.has_value();  // --allocator
  if (reserved) cols.push_back({std::string("Reserved (") + u.name + ")"});
  cols.push_back({"native", report::Align::left});
  report::Table t(cols);
  for (const auto& r : runs) {
    std::vector<report::Cell> cells;
    if (several_models) {
      cells.emplace_back(std::to_string(r.model.hidden));
      cells.emplace_back(std::to_string(r.model.intermediate));
      cells.emplace_back(std::to_string(r.model.heads));
    }
    cells.emplace_back(std::to_string(r.train.batch));
    cells.emplace_back(std::to_string(r.train.seq));
    cells.emplace_back(format_bytes(r.ledger.activations, u));
    cells.emplace_back(report::with_commas(r.per_layer_activations()));
    cells.emplace_back(report::with_commas(r.native().activations.per_layer_bytes));
    cells.emplace_back(format_bytes(r.ledger.peak, u));
    if (reserved)
      cells.emplace_back(r.allocator_model ? format_bytes(r.allocator_model->step.reserved.peak, u)
                                           : std::string("-"));
    cells.push_back(native_cell(r));
    t.add_row(std::move(cells));
  }
  return t;
}

// The runs in bytes, for CSV.
report::Table runs_bytes_table(const std::vector<RunResult>& runs) {
  std::vector<report::Table::Column> cols = {{"model", report::Align::left},
                                             {"hidden"},
                                             {"intermediate"},
                                             {"heads"},
                                             {"batch"},
                                             {"seq"},
                                             {"activations"},
                                             {"per_layer_activations"},
                                             {"native_per_layer_activations"},
                                             {"activations_peak"},
                                             {"peak"}};
  const bool reserved = runs.front().allocator_model.has_value();  // --allocator: one more
  if (reserved) cols.push_back({"reserved_peak"});
  cols.push_back({"out_of_memory", report::Align::left});
  report::Table t(cols);
  for (const auto& r : runs) {
    std::vector<report::Cell> row;
    for (const std::string& cell :
         {r.model.name, std::to_string(r.model.hidden), std::to_string(r.model.intermediate),
          std::to_string(r.model.heads), std::to_string(r.train.batch), std::to_string(r.train.seq),
          std::to_string(r.ledger.activations), std::to_string(r.per_layer_activations()),
          std::to_string(r.native().activations.per_layer_bytes),
          std::to_string(r.ledger.activations_peak), std::to_string(r.ledger.peak)})
      row.emplace_back(cell);
    if (reserved)
      row.emplace_back(r.allocator_model ? std::to_string(r.allocator_model->step.reserved.peak)
                                         : std::string());
    row.emplace_back(std::string(r.failure ? "true" : "false"));
    t.add_row(std::move(row));
  }
  return t;
}

report::Table fit_table(const SweepFits& f, const SourceFit& s) {
  report::Table t({{"coefficient", report::Align::left},
                   {"fitted (B)"},
                   {"analytic native (B)"},
                   {"rel diff"},
                   {"within 0.5%", report::Align::left}});
  for (const auto& name : fit_term_names(f.terms)) {
    const double fit = s.fit.coefficients.at(name), an = s.analytic.at(name);
    const double rel = an != 0 ? (fit - an) / an : (std::fabs(fit) < 1e-9 ? 0 : INFINITY);
    t.add_row({name, report::fixed(fit, 6), report::fixed(an, 6),
               std::isfinite(rel) ? report::fixed(100 * rel, 4) + "%" : "-",
               report::check_cell(std::fabs(rel) <= 0.005)});
  }
  return t;
}

// A grid point's name in the charts: "b=2 s=16", with the widths when the grid varies them.
std::string point_name(const RunResult& r, bool several_models) {
  std::string s = "b=" + std::to_string(r.train.batch) + " s=" + std::to_string(r.train.seq);
  if (several_models)
    s = "h=" + std::to_string(r.model.hidden) + " i=" + std::to_string(r.model.intermediate) +
        " a=" + std::to_string(r.model.heads) + " " + s;
  return s;
}

// The page's charts of the fit: the measured per-layer bytes of every run against its tokens
// (b·s), the fitted lines (for one model and one s, every term is b times its value at b = 1,
// so the fit is a line through the origin in b·s), and the residuals, run by run.
std::string fit_charts_html(const SweepFits& f, const std::vector<RunResult>& runs,
                            bool several_models) {
  using report::exact_number;
  report::ScatterChart sc;
  sc.id = "fit-chart";
  sc.title = "Per-layer activation bytes: measured points and fitted lines";
  sc.x_label = "tokens per step (b·s)";
  sc.y_label = "activation bytes per layer";
  report::BarChart rc;
  rc.id = "residual-chart";
  rc.title = "Residuals of the fit, run by run (measured − fitted)";
  rc.axis_label = "residual = measured − fitted (bytes per layer)";
  rc.min_extent = 1;
  for (const auto& r : runs) rc.groups.push_back({point_name(r, several_models), {}});
  const auto names = fit_term_names(f.terms);
  for (std::size_t si = 0; si < f.fits.size(); ++si) {
    const SourceFit& s = f.fits[si];
    sc.series.push_back(s.source);
    rc.series.push_back(s.source);
    // The lines: one per (model, s), from the origin to the largest b·s of the grid there.
    std::map<std::pair<std::string, std::int64_t>, std::pair<const RunResult*, double>> lines;
    for (std::size_t k = 0; k < runs.size(); ++k) {
      const RunResult& r = runs[k];
      const double tokens = double(r.train.batch) * double(r.train.seq);
      const double measured = per_layer_activations_by_source(r).bytes.at(s.source);
      auto& line = lines[{r.model.name, r.train.seq}];
      if (!line.first || tokens > line.second) line = {&r, tokens};
      const double fitted = s.fit.fitted[k], residual = s.fit.residuals[k];
      report::ScatterPoint p;
      p.x = tokens;
      p.y = measured;
      p.series = si;
      p.data = {{"source", s.source},
                {"run", std::to_string(k)},
                {"batch", std::to_string(r.train.batch)},
                {"seq", std::to_string(r.train.seq)},
                {"y", exact_number(measured)},
                {"fitted", exact_number(fitted)},
                {"residual", exact_number(residual)}};
      p.tip = s.source + ", " + point_name(r, several_models) + " (" + exact_number(tokens) +
              " tokens): measured " + report::fixed(measured, 3) + " B per layer, fitted " +
              report::fixed(fitted, 3) + " B, residual " + report::fixed(residual, 3) + " B";
      sc.points.push_back(std::move(p));
      rc.groups[k].bars.push_back(
          {residual, exact_number(residual), report::fixed(residual, 3) + " B",
           s.source + ", " + point_name(r, several_models) + ": residual " +
               report::fixed(residual, 6) + " B (measured " + report::fixed(measured, 3) +
               " − fitted " + report::fixed(fitted, 3) + ")"});
    }
    for (const auto& [key, end] : lines) {
      const RunResult& r = *end.first;
      // Bytes per token: the fit at b = 1, divided by s.
      FitSample one{1, r.train.seq, r.model.hidden, r.model.intermediate, r.model.heads, 0};
      double at_one = 0;
      for (const auto& n : names)
        at_one += s.fit.coefficients.at(n) * double(fit_regressor(n, one));
      const double slope = at_one / double(r.train.seq);
      report::ScatterLine l;
      l.x1 = end.second;
      l.y1 = slope * end.second;
      l.series = si;
      l.label = several_models ? "h=" + std::to_string(r.model.hidden) +
                                     " i=" + std::to_string(r.model.intermediate) +
                                     " a=" + std::to_string(r.model.heads) +
                                     " s=" + std::to_string(r.train.seq)
                               : "s=" + std::to_string(r.train.seq);
      l.data = {{"source", s.source},
                {"seq", std::to_string(r.train.seq)},
                {"model", r.model.name},
                {"slope", exact_number(slope)}};
      l.tip = s.source + " fit, " + (several_models ? r.model.name + ", " : std::string()) +
              "s=" + std::to_string(r.train.seq) + ": " + report::fixed(slope, 4) +
              " B per token per layer (R² = " + report::fixed(s.fit.r2, 9) + ")";
      sc.lines.push_back(std::move(l));
    }
  }
  if (sc.series.size() < 2) {
    sc.series.clear();
    rc.series.clear();
  }
  return "<h2>The fit, drawn: measured points and fitted lines</h2>\n" +
         report::scatter_chart_svg(sc) +
         "<figcaption>Each point is one run's measured per-layer activation bytes; each dashed "
         "line the fitted coefficients at one sequence length (linear in b·s there). Hover for "
         "the exact figures.</figcaption>\n<h2>Residuals of the fit</h2>\n" +
         report::bar_chart_svg(rc) +
         "<figcaption>measured − fitted, bytes per layer, run by run.</figcaption>\n";
}

void write_fits(report::ReportWriter& w, const SweepFits& f, const std::vector<RunResult>& runs,
                bool several_models) {
  const std::size_t n_runs = runs.size();
  for (const auto& s : f.fits) {
    w.heading("Fit of per-layer activation bytes, source " + s.source + " (" +
              std::to_string(n_runs) + " runs; " +
              (f.terms == FitTerms::one_model
                   ? "one model: sbh = c_sbh + c_sbi·i/h + c_sb/h, all per-token bytes)"
                   : "several widths: separate coefficients)"));
    w.table(fit_table(f, s));
    double max_abs = 0;
    for (double r : s.fit.residuals) max_abs = std::max(max_abs, std::fabs(r));
    std::string residuals = "R² = " + report::fixed(s.fit.r2, 9) +
                            ", max |residual| = " + report::fixed(max_abs, 3) +
                            " B; residuals (B):";
    for (double r : s.fit.residuals) residuals += " " + report::fixed(r, 3);
    w.paragraph_break();
    w.line(residuals);
  }
  if (!f.fits.empty()) w.figure([&] { return fit_charts_html(f, runs, several_models); });
  for (const auto& [src, why] : f.unavailable) w.item("fit for " + src + ": unavailable: " + why);
  for (const auto& n : f.notes) w.item("note: " + n);
}

// {"schema", "runs": [...]} and, with --fit, "fit", "fit_unavailable", "fit_notes".
json sweep_json(const std::vector<RunResult>& runs, const std::optional<SweepFits>& fits) {
  json j;
  j[schema::kSchemaKey] = report::kSchema;
  j[schema::kRuns] = json::array();
  for (const auto& r : runs) j[schema::kRuns].push_back(run_result_json(r));
  if (fits) {
    j["fit"] = fits_json(*fits);
    // docs/design.md: one entry per measurement source; a source that could not give the
    // figure says why in its entry (and, as before, in fit_unavailable).
    for (const auto& [src, why] : fits->unavailable) j["fit"][src] = {{"unavailable", why}};
    j["fit_unavailable"] = fits->unavailable;
    j["fit_notes"] = fits->notes;
  }
  return j;
}

}  // namespace

// The report, described once for every format.
void write_sweep(ReportWriter& w, const ModelConfig& model, const TrainConfig& train,
                 const std::vector<RunResult>& runs, bool several_models,
                 const std::optional<SweepFits>& fits) {
  w.document([&] { return sweep_json(runs, fits); });
  w.csv_table(runs_bytes_table(runs));
  std::uint64_t max_bytes = 0;
  for (const auto& r : runs) max_bytes = std::max(max_bytes, r.ledger.peak);
  const ByteUnit u = table_unit(max_bytes);
  w.title("trainmem sweep: " + model.name + "  " + dtype_name(train.dtype) + " " +
          optimizer_name(train.optimizer) + "  checkpointing=" + checkpointing_name(train) +
          " attention=" + attention_name(train.attention) + train_title_extras(train));
  if (const std::string family = report::family_line(model); !family.empty()) w.paragraph(family);
  w.banner(backend_line(runs.front()));
  w.blank();
  w.table(runs_table(runs, several_models, u));
  for (std::size_t k = 0; k < runs.size(); ++k)  // once per model (the states are batch's)
    if (k == 0 || runs[k].model.name != runs[k - 1].model.name)
      if (const std::string pg =
              report::managed_text(runs[k].train.optimizer, runs[k].optimizer_states_managed);
          !pg.empty())
        w.detail("managed memory" + (several_models ? " (" + runs[k].model.name + ")" : "") + ", " +
                 pg);
  if (fits) write_fits(w, *fits, runs, several_models);
}

}  // namespace trainmem::report
