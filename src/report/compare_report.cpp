// compare's report for one GPU (include/trainmem/report/compare_report.hpp): the runs with
// checkpointing off and on per optimizer, laid out like a paper's memory table, with what
// checkpointing saves and costs, the analytic profiles beside, and (HTML) the timelines.
#include "trainmem/report/compare_report.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trainmem/base/bytes.hpp"
#include "trainmem/base/lora.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/run_report.hpp"
#include "trainmem/report/schema.hpp"
#include "trainmem/run/timeline.hpp"

namespace trainmem::report {
namespace {

using nlohmann::json;

std::string display_optimizer(Optimizer o) {
  switch (o) {
    case Optimizer::adamw:
      return "AdamW";
    case Optimizer::sgd:
      return "SGD";
    case Optimizer::lomo:
      return "LOMO";
    case Optimizer::adamw8bit:
      return "AdamW8bit";
    case Optimizer::paged_adamw:
      return "PagedAdamW";
    case Optimizer::paged_adamw8bit:
      return "PagedAdamW8bit";
  }
  return "?";
}

// Extra step time of the checkpointed run as a fraction of the plain one (NaN when the
// backend does not compute: no time passes on meta).
double recompute_cost(const ComparePair& p) {
  if (!p.none->computes || p.none->failure || p.full->failure) return NAN;
  const double t0 = p.none->steady_step_seconds(), t1 = p.full->steady_step_seconds();
  return t0 > 0 ? (t1 - t0) / t0 : NAN;
}

std::int64_t saved(std::uint64_t before, std::uint64_t after) {
  return std::int64_t(before) - std::int64_t(after);
}

// "none" or "full" (or both): the runs of the pair that ran out of memory; "" when neither.
std::string failed_modes(const ComparePair& p) {
  if (p.none->failure && p.full->failure) return "both runs";
  if (p.none->failure) return "the run without checkpointing";
  if (p.full->failure) return "the run with checkpointing";
  return "";
}

json comparison_json(const ComparePair& p) {
  if (!failed_modes(p).empty()) {
    // A run that ran out of memory has figures up to the failure only: no saving to report.
    return json{{"optimizer", optimizer_name(p.optimizer)},
                {"checkpointing", checkpointing_name(p.full->train)},
                {"activations_saved", nullptr},
                {"activations_saved_predicted",
                 saved(p.none->native().figures.activations, p.full->native().figures.activations)},
                {"activations_saved_ok", nullptr},
                {"peak_saved", nullptr},
                {"peak_saved_predicted",
                 saved(p.none->native().figures.peak, p.full->native().figures.peak)},
                {"step_seconds_none", nullptr},
                {"step_seconds_full", nullptr},
                {"recompute_cost", nullptr},
                {"out_of_memory", failed_modes(p)}};
  }
  const double cost = recompute_cost(p);
  const auto& n = p.none->ledger;
  const auto& f = p.full->ledger;
  const auto& an = p.none->native().figures;
  const auto& af = p.full->native().figures;
  return json{
      {"optimizer", optimizer_name(p.optimizer)},
      {"checkpointing", checkpointing_name(p.full->train)},
      {"activations_saved", saved(n.activations, f.activations)},
      {"activations_saved_predicted", saved(an.activations, af.activations)},
      {"activations_saved_ok",
       saved(n.activations, f.activations) == saved(an.activations, af.activations)},
      {"peak_saved", saved(n.peak, f.peak)},
      {"peak_saved_predicted", saved(an.peak, af.peak)},
      {"step_seconds_none", p.none->computes ? json(p.none->steady_step_seconds()) : json(nullptr)},
      {"step_seconds_full", p.full->computes ? json(p.full->steady_step_seconds()) : json(nullptr)},
      {"recompute_cost", std::isnan(cost) ? json(nullptr) : json(cost)}};
}

// Compare's memory table, in the unit `u`: one row per run, the pairs separated by rules; the
// step time and recompute cost when the backend computes.
report::Table memory_table(const std::vector<ComparePair>& pairs, ByteUnit u, bool timed) {
  std::vector<report::Table::Column> cols = {{"Optimizer", report::Align::left},
                                             {"Checkpointing", report::Align::left},
                                             {"Params"},
                                             {"Gradients"},
                                             {"Optimizer States"},
                                             {"Activations"},
                                             {"Total"},
                                             {"Peak"},
                                             {"native", report::Align::left}};
  if (timed) {
    cols.push_back({"step (s)"});
    cols.push_back({"recompute cost"});
  }
  report::Table t(cols);
  for (std::size_t k = 0; k < pairs.size(); ++k) {
    const bool same_baseline = k > 0 && pairs[k - 1].none == pairs[k].none;
    if (k && !same_baseline) t.add_rule();
    for (const RunResult* r : {pairs[k].none, pairs[k].full}) {
      if (same_baseline && r == pairs[k].none) continue;  // one baseline row per optimizer
      const MemoryFigures& f = r->ledger;
      std::vector<report::Cell> cells = {display_optimizer(pairs[k].optimizer),
                                         checkpointing_name(r->train),
                                         format_bytes(f.params, u),
                                         format_bytes(f.gradients, u),
                                         format_bytes(f.optimizer_states, u),
                                         format_bytes(f.activations, u),
                                         format_bytes(f.sum, u),
                                         format_bytes(f.peak, u),
                                         native_cell(*r)};
      if (timed) {
        cells.emplace_back(r->failure ? "-" : report::fixed(r->steady_step_seconds(), 3));
        const double cost = recompute_cost(pairs[k]);
        cells.emplace_back(r == pairs[k].full && !std::isnan(cost)
                               ? (cost >= 0 ? "+" : "") + report::fixed(100 * cost, 1) + "%"
                               : "");
      }
      t.add_row(std::move(cells));
    }
  }
  return t;
}

// The same runs in bytes, for CSV.
report::Table memory_bytes_table(const std::vector<ComparePair>& pairs) {
  report::Table t({{"optimizer", report::Align::left},
                   {"checkpointing", report::Align::left},
                   {"params"},
                   {"gradients"},
                   {"optimizer_states"},
                   {"activations"},
                   {"activations_peak"},
                   {"workspace"},
                   {"inputs"},
                   {"sum"},
                   {"peak"},
                   {"step_seconds"},
                   {"recompute_cost"},
                   {"out_of_memory", report::Align::left}});
  for (std::size_t k = 0; k < pairs.size(); ++k)
    for (const RunResult* r : {pairs[k].none, pairs[k].full}) {
      const ComparePair& p = pairs[k];
      if (k > 0 && pairs[k - 1].none == p.none && r == p.none) continue;  // baseline once
      const MemoryFigures& f = r->ledger;
      const double cost = recompute_cost(p);
      t.add_row({optimizer_name(p.optimizer), checkpointing_name(r->train),
                 std::to_string(f.params), std::to_string(f.gradients),
                 std::to_string(f.optimizer_states), std::to_string(f.activations),
                 std::to_string(f.activations_peak), std::to_string(f.workspace),
                 std::to_string(f.inputs), std::to_string(f.sum), std::to_string(f.peak),
                 r->computes ? report::fixed(r->steady_step_seconds(), 6) : "",
                 r == p.full && !std::isnan(cost) ? report::fixed(cost, 6) : "",
                 r->failure ? "true" : "false"});
    }
  return t;
}

// The reference profiles' activations for the pair (they do not depend on the optimizer), so
// the measured figure can be read against what other stacks keep.
// `pairs`: the first optimizer's (one baseline, each policy against it).
report::Table references_table(const std::vector<ComparePair>& pairs, ByteUnit u) {
  std::vector<report::Table::Column> cols = {
      {"Profile", report::Align::left},
      {"Activations, " + checkpointing_name(pairs.front().none->train)}};
  for (const auto& p : pairs) {
    cols.push_back({"Activations, " + checkpointing_name(p.full->train)});
    cols.push_back({"saves"});
  }
  cols.push_back(
      {"per layer (" + checkpointing_name(pairs.front().none->train) + ")", report::Align::left});
  report::Table t(cols);
  for (std::size_t e = 0; e < pairs.front().none->estimates.size(); ++e) {
    const Estimate& en = pairs.front().none->estimates[e];
    std::vector<report::Cell> row = {profile_name(en.profile),
                                     format_bytes(en.figures.activations, u)};
    for (const auto& p : pairs) {
      const Estimate& ef = p.full->estimates[e];
      row.emplace_back(format_bytes(ef.figures.activations, u));
      row.emplace_back(
          format_signed_bytes(saved(en.figures.activations, ef.figures.activations), u));
    }
    row.emplace_back(report::per_layer_formula(en));
    t.add_row(std::move(row));
  }
  return t;
}

// One pair's line of "What checkpointing saves and what it costs".
std::string saving_line(const ComparePair& p, ByteUnit u) {
  std::ostringstream o;
  const auto& n = p.none->ledger;
  const auto& f = p.full->ledger;
  const auto& an = p.none->native().figures;
  const auto& af = p.full->native().figures;
  if (!failed_modes(p).empty()) {
    o << display_optimizer(p.optimizer) << ", " << checkpointing_name(p.full->train)
      << ": not compared: " << failed_modes(p)
      << " ran out of memory (figures up to the failure only); native "
      << "predicts activations " << format_bytes(an.activations, u) << " -> "
      << format_bytes_with_unit(af.activations, u) << ", peak " << format_bytes(an.peak, u)
      << " -> " << format_bytes_with_unit(af.peak, u);
    return o.str();
  }
  const std::int64_t act = saved(n.activations, f.activations);
  const std::int64_t act_pred = saved(an.activations, af.activations);
  o << display_optimizer(p.optimizer) << ", " << checkpointing_name(p.full->train)
    << ": activations " << format_bytes(n.activations, u) << " -> "
    << format_bytes_with_unit(f.activations, u) << " (saves " << format_signed_bytes(act, u) << " "
    << u.name << "; native predicts " << format_signed_bytes(act_pred, u) << ": "
    << (act == act_pred ? "yes" : "NO") << "), peak " << format_bytes(n.peak, u) << " -> "
    << format_bytes_with_unit(f.peak, u) << "; ";
  const double cost = recompute_cost(p);
  if (!std::isnan(cost)) {
    o << "measured cost: step " << report::fixed(p.none->steady_step_seconds(), 3) << " s -> "
      << report::fixed(p.full->steady_step_seconds(), 3) << " s (" << (cost >= 0 ? "+" : "")
      << report::fixed(100 * cost, 1) << "%: " << report::recompute_text(p.full->native()) << ")";
  } else if (!p.none->computes) {
    o << "cost: " << report::recompute_text(p.full->native())
      << " (not timed: the meta backend does no arithmetic)";
  } else {
    o << "cost: not measured (a run failed)";
  }
  return o.str();
}

// {"schema", "runs": [...], "comparisons": [...]}
json compare_json(const std::vector<ComparePair>& pairs, const std::vector<RunResult>& runs) {
  json j;
  j[schema::kSchemaKey] = report::kSchema;
  j[schema::kRuns] = json::array();
  for (const auto& r : runs) j[schema::kRuns].push_back(run_result_json(r));
  j["comparisons"] = json::array();
  for (const auto& p : pairs) j["comparisons"].push_back(comparison_json(p));
  return j;
}

}  // namespace

// The report, described once for every format.
// --allocator: each run's reserve under the given configuration and under the other setting of
// expandable segments (a shadow model fed the same run).
void write_allocator_table(report::ReportWriter& w, const std::vector<RunResult>& runs,
                           ByteUnit u) {
  const RunResult& first = runs.front();
  if (!first.allocator_model) return;
  const std::string spec = first.allocator_model->spec;
  const std::string other =
      first.allocator_shadows.empty() ? std::string() : first.allocator_shadows.front().spec;
  w.heading(std::string("What PyTorch's caching allocator would reserve (a model; ") + u.name +
                "; the last step's peaks; reserved under --allocator " + spec +
                (other.empty() ? "" : " and under " + other) + ")",
            "PyTorch's caching allocator (model)");
  std::vector<report::Table::Column> cols = {{"optimizer", report::Align::left},
                                             {"checkpointing", report::Align::left},
                                             {"ledger peak"},
                                             {"allocated"},
                                             {"reserved"}};
  if (!other.empty()) cols.push_back({"reserved (" + other + ")"});
  report::Table t(cols);
  for (const RunResult& r : runs) {
    if (!r.allocator_model) continue;
    std::vector<report::Cell> row;
    for (const std::string& cell :
         {std::string(optimizer_name(r.train.optimizer)), std::string(checkpointing_name(r.train)),
          format_bytes(r.ledger.peak, u), format_bytes(r.allocator_model->step.allocated.peak, u),
          format_bytes(r.allocator_model->step.reserved.peak, u)})
      row.emplace_back(cell);
    if (!other.empty())
      row.emplace_back(r.allocator_shadows.empty()
                           ? std::string("-")
                           : format_bytes(r.allocator_shadows.front().step.reserved.peak, u));
    t.add_row(std::move(row));
  }
  w.table(t);
  if (!other.empty())
    w.detail(
        "the second reserve comes from a model fed the same run without a device limit "
        "(docs/allocator.md)");
}

void write_compare(report::ReportWriter& w, const std::vector<ComparePair>& pairs,
                   const std::vector<RunResult>& runs) {
  w.document([&] { return compare_json(pairs, runs); });
  w.csv_table(memory_bytes_table(pairs));
  std::uint64_t max_bytes = 0;
  for (const auto& r : runs) max_bytes = std::max({max_bytes, r.ledger.sum, r.ledger.peak});
  const ByteUnit u = table_unit(max_bytes);
  const RunResult& first = runs.front();
  const TrainConfig& shown = first.train;
  std::ostringstream title;
  title << "trainmem compare: " << first.model.name << "  b=" << shown.batch << " s=" << shown.seq
        << " " << dtype_name(shown.dtype) << "  attention=" << attention_name(shown.attention)
        << train_title_extras(shown);
  w.title(title.str());
  if (const std::string family = report::family_line(first.model); !family.empty())
    w.paragraph(family);
  w.banner(backend_line(first));
  if (!first.computes)
    w.paragraph(
        "These figures are PREDICTED: the meta backend runs the model's exact allocation "
        "sequence without arithmetic; on a GPU the same step allocates exactly these bytes.");
  w.heading(std::string("Memory of one training step (") + u.name +
            "; Total = params + gradients + optimizer states + activations; Peak = true "
            "high-water mark; native = the ledger equals the analytic native profile)");
  w.table(memory_table(pairs, u, first.computes));
  for (const auto& p : pairs)
    if (const std::string pg = report::managed_text(p.optimizer, p.none->optimizer_states_managed);
        !pg.empty())
      w.detail("managed memory, " + pg);
  std::vector<ComparePair> first_optimizer;
  for (const auto& p : pairs)
    if (p.optimizer == pairs.front().optimizer) first_optimizer.push_back(p);
  w.heading("What checkpointing saves and what it costs");
  for (const auto& p : pairs) w.item(saving_line(p, u));
  write_allocator_table(w, runs, u);
  // The page: each optimizer's two steps side by side, checkpointing none | full (the HTML
  // form only; the runs keep their timelines for it).
  bool timelines = false;
  for (const auto& r : runs) timelines |= r.timeline.has_value();
  if (timelines)
    w.figure([&] {
      std::string html = "<h2>Timelines of the step: checkpointing " +
                         checkpointing_name(pairs.front().none->train);
      for (const auto& p : pairs)
        if (p.optimizer == pairs.front().optimizer)
          html += " | " + checkpointing_name(p.full->train);
      html += "</h2>\n<div class=\"side-by-side\">\n";
      for (const RunResult& r : runs)
        html += "<div>" + (r.timeline ? timeline_svg(*r.timeline) : std::string()) + "</div>\n";
      return html + "</div>\n";
    });
  if (pairs.front().none->estimates.size() > 1) {
    w.heading(std::string("Activations in the analytic profiles (") + u.name +
              "; hf-eager = HuggingFace transformers 4.30 eager attention, PyTorch 2.0; megatron "
              "and zero are GPT-style reference formulas)");
    w.table(references_table(first_optimizer, u));
  }
  // The page: the per-layer activations of every profile, the policies side by side (they do
  // not depend on the optimizer: the first optimizer's runs).
  w.figure([&] {
    std::vector<const RunResult*> shown_runs = {first_optimizer.front().none};
    std::vector<std::string> names = {"checkpointing " +
                                      checkpointing_name(first_optimizer.front().none->train)};
    for (const auto& p : first_optimizer) {
      shown_runs.push_back(p.full);
      names.push_back("checkpointing " + checkpointing_name(p.full->train));
    }
    return per_layer_chart_html(shown_runs, names, "per-layer-chart");
  });
  for (const auto& r : runs)
    if (r.failure)
      w.line(std::string("OUT OF MEMORY in ") + optimizer_name(r.train.optimizer) + "/" +
                 checkpointing_name(r.train) + ": " + r.failure->message,
             report::Tone::fail);
}

}  // namespace trainmem::report
