// trainmem compare — the same configuration with activation checkpointing off and on (and,
// with --optimizer all, for AdamW, SGD and LOMO), laid out like a paper's memory table. On a
// backend that computes it adds the measured recompute cost: the extra step time the
// recomputed forward costs, as a fraction of the step without checkpointing.
#include <spdlog/spdlog.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli/cli.hpp"
#include "trainmem/error.hpp"
#include "trainmem/report.hpp"
#include "trainmem/run.hpp"

namespace trainmem::cli {
namespace {

using nlohmann::json;

struct CompareFlags {
  CommonFlags common;
  RunFlags run;
  std::string device_budget;
};

// One optimizer's pair of runs.
struct Pair {
  Optimizer optimizer;
  const RunResult* none = nullptr;
  const RunResult* full = nullptr;
};

std::string display_optimizer(Optimizer o) {
  switch (o) {
    case Optimizer::adamw:
      return "AdamW";
    case Optimizer::sgd:
      return "SGD";
    case Optimizer::lomo:
      return "LOMO";
  }
  return "?";
}

// Extra step time of the checkpointed run as a fraction of the plain one (NaN when the
// backend does not compute: no time passes on meta).
double recompute_cost(const Pair& p) {
  if (!p.none->computes || p.none->failure || p.full->failure) return NAN;
  const double t0 = p.none->steady_step_seconds(), t1 = p.full->steady_step_seconds();
  return t0 > 0 ? (t1 - t0) / t0 : NAN;
}

std::int64_t saved(std::uint64_t before, std::uint64_t after) {
  return std::int64_t(before) - std::int64_t(after);
}

// "none" or "full" (or both): the runs of the pair that ran out of memory; "" when neither.
std::string failed_modes(const Pair& p) {
  if (p.none->failure && p.full->failure) return "both runs";
  if (p.none->failure) return "the run without checkpointing";
  if (p.full->failure) return "the run with checkpointing";
  return "";
}

json comparison_json(const Pair& p) {
  if (!failed_modes(p).empty()) {
    // A run that ran out of memory has figures up to the failure only: no saving to report.
    return json{{"optimizer", optimizer_name(p.optimizer)},
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

std::string signed_in_unit(std::int64_t v, TableUnit u) {
  return (v < 0 ? "-" : "") + in_unit(std::uint64_t(v < 0 ? -v : v), u);
}

std::string compare_text(const std::vector<Pair>& pairs, const std::vector<RunResult>& runs,
                         Format format, Colour colour) {
  std::uint64_t max_bytes = 0;
  for (const auto& r : runs) max_bytes = std::max({max_bytes, r.ledger.sum, r.ledger.peak});
  const TableUnit u = table_unit(max_bytes);
  const bool timed = runs.front().computes;
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
    if (k) t.add_rule();
    for (const RunResult* r : {pairs[k].none, pairs[k].full}) {
      const MemoryFigures& f = r->ledger;
      bool ok = true;
      for (const auto& row : reconcile_ledger_native(*r)) ok &= row.ok;
      std::vector<std::string> cells = {display_optimizer(pairs[k].optimizer),
                                        checkpointing_name(r->train.checkpointing),
                                        in_unit(f.params, u),
                                        in_unit(f.gradients, u),
                                        in_unit(f.optimizer_states, u),
                                        in_unit(f.activations, u),
                                        in_unit(f.sum, u),
                                        in_unit(f.peak, u),
                                        r->failure ? "OOM" : (ok ? "yes" : "NO")};
      if (timed) {
        cells.push_back(r->failure ? "-" : report::fixed(r->steady_step_seconds(), 3));
        const double cost = recompute_cost(pairs[k]);
        cells.push_back(r == pairs[k].full && !std::isnan(cost)
                            ? (cost >= 0 ? "+" : "") + report::fixed(100 * cost, 1) + "%"
                            : "");
      }
      t.add_row(cells);
    }
  }
  if (format == Format::csv) {
    report::Table b({{"optimizer", report::Align::left},
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
    for (const auto& p : pairs)
      for (const RunResult* r : {p.none, p.full}) {
        const MemoryFigures& f = r->ledger;
        const double cost = recompute_cost(p);
        b.add_row({optimizer_name(p.optimizer), checkpointing_name(r->train.checkpointing),
                   std::to_string(f.params), std::to_string(f.gradients),
                   std::to_string(f.optimizer_states), std::to_string(f.activations),
                   std::to_string(f.activations_peak), std::to_string(f.workspace),
                   std::to_string(f.inputs), std::to_string(f.sum), std::to_string(f.peak),
                   r->computes ? report::fixed(r->steady_step_seconds(), 6) : "",
                   r == p.full && !std::isnan(cost) ? report::fixed(cost, 6) : "",
                   r->failure ? "true" : "false"});
      }
    return b.csv();
  }

  const RunResult& first = runs.front();
  std::ostringstream o;
  const bool md = format == Format::markdown;
  TrainConfig shown = first.train;
  o << (md ? "### " : "## ") << "trainmem compare: " << first.model.name << "  b=" << shown.batch
    << " s=" << shown.seq << " " << dtype_name(shown.dtype)
    << "  attention=" << attention_name(shown.attention) << "\n";
  o << backend_line(first) << (md ? "\n\n" : "\n");
  if (!first.computes)
    o << "These figures are PREDICTED: the meta backend runs the model's exact allocation "
         "sequence without arithmetic; on a GPU the same step allocates exactly these bytes.\n"
      << (md ? "\n" : "");
  o << (md ? "#### " : "\n## ") << "Memory of one training step (" << u.name
    << "; Total = params + gradients + optimizer states + activations; Peak = true "
       "high-water mark; native = the ledger equals the analytic native profile)"
    << (md ? "\n\n" : "\n");
  o << (md ? t.markdown() : t.text());
  o << (md ? "\n#### " : "\n## ") << "What checkpointing saves and what it costs"
    << (md ? "\n\n" : "\n");
  for (const auto& p : pairs) {
    const auto& n = p.none->ledger;
    const auto& f = p.full->ledger;
    if (!failed_modes(p).empty()) {
      o << (md ? "- " : "") << display_optimizer(p.optimizer)
        << ": not compared: " << failed_modes(p)
        << " ran out of memory (figures up to the failure only); native "
        << "predicts activations " << in_unit(p.none->native().figures.activations, u) << " -> "
        << in_unit(p.full->native().figures.activations, u) << " " << u.name << ", peak "
        << in_unit(p.none->native().figures.peak, u) << " -> "
        << in_unit(p.full->native().figures.peak, u) << " " << u.name << "\n";
      continue;
    }
    const std::int64_t act = saved(n.activations, f.activations);
    const std::int64_t act_pred =
        saved(p.none->native().figures.activations, p.full->native().figures.activations);
    o << (md ? "- " : "") << display_optimizer(p.optimizer) << ": activations "
      << in_unit(n.activations, u) << " -> " << in_unit(f.activations, u) << " " << u.name
      << " (saves " << signed_in_unit(act, u) << " " << u.name << "; native predicts "
      << signed_in_unit(act_pred, u) << ": " << (act == act_pred ? "yes" : "NO") << "), peak "
      << in_unit(n.peak, u) << " -> " << in_unit(f.peak, u) << " " << u.name << "; ";
    const double cost = recompute_cost(p);
    if (!std::isnan(cost)) {
      o << "measured cost: step " << report::fixed(p.none->steady_step_seconds(), 3) << " s -> "
        << report::fixed(p.full->steady_step_seconds(), 3) << " s (" << (cost >= 0 ? "+" : "")
        << report::fixed(100 * cost, 1) << "%: one extra forward of every layer during backward)\n";
    } else if (!p.none->computes) {
      o << "cost: one extra forward of every layer during backward (not timed: the meta "
           "backend does no arithmetic)\n";
    } else {
      o << "cost: not measured (a run failed)\n";
    }
  }
  // The reference profiles' activations for the same pair (they do not depend on the
  // optimizer), so the measured figure can be read against what other stacks keep.
  const Pair& p0 = pairs.front();
  if (p0.none->estimates.size() > 1) {
    report::Table ref({{"Profile", report::Align::left},
                       {"Activations, none"},
                       {"Activations, full"},
                       {"saves"},
                       {"per layer (none)", report::Align::left}});
    for (std::size_t e = 0; e < p0.none->estimates.size(); ++e) {
      const Estimate& en = p0.none->estimates[e];
      const Estimate& ef = p0.full->estimates[e];
      ref.add_row({profile_name(en.profile), in_unit(en.figures.activations, u),
                   in_unit(ef.figures.activations, u),
                   signed_in_unit(saved(en.figures.activations, ef.figures.activations), u),
                   report::per_layer_formula(en)});
    }
    o << (md ? "\n#### " : "\n## ") << "Activations in the analytic profiles (" << u.name
      << "; hf-eager = HuggingFace transformers 4.30 eager attention, PyTorch 2.0; megatron "
         "and zero are GPT-style reference formulas)"
      << (md ? "\n\n" : "\n") << (md ? ref.markdown() : ref.text());
  }
  for (const auto& r : runs)
    if (r.failure)
      o << "OUT OF MEMORY in " << optimizer_name(r.train.optimizer) << "/"
        << checkpointing_name(r.train.checkpointing) << ": " << r.failure->message << "\n";
  return md ? o.str() : colourize(o.str(), colour);
}

int run_compare(const CompareFlags& flags) {
  const Common c = resolve_common(flags.common, true, true);
  if (!flags.run.timeline.empty()) validate_timeline_path(flags.run.timeline);
  if (!flags.run.dump.empty())
    throw InputError("--dump: compare runs several steps; use trainmem profile --dump");

  std::optional<std::uint64_t> budget;
  if (!flags.device_budget.empty()) budget = parse_size(flags.device_budget, "--device-budget");
  // Every request first, checked before the first one runs.
  std::vector<RunRequest> requests;
  for (Optimizer o : c.optimizers) {
    for (Checkpointing mode : {Checkpointing::none, Checkpointing::full}) {
      RunRequest rq;
      rq.model = c.model;
      rq.train = c.train;
      rq.train.optimizer = o;
      rq.train.checkpointing = mode;
      rq.backend = flags.run.backend;
      rq.steps = flags.run.steps;
      rq.seed = flags.run.seed;
      rq.weights = flags.run.weights;
      rq.tokens = flags.run.tokens;
      rq.device_budget = budget;
      for (const auto& name : c.profiles) rq.profiles.push_back(*parse_profile(name));
      rq.keep_timeline = !flags.run.timeline.empty();
      check_run_can_start(rq);
      requests.push_back(std::move(rq));
    }
  }
  auto timeline_path = [&](const TrainConfig& t) {
    std::string suffix = std::string("ckpt-") + checkpointing_name(t.checkpointing);
    if (c.optimizers.size() > 1) suffix = std::string(optimizer_name(t.optimizer)) + "-" + suffix;
    return suffixed_path(flags.run.timeline, suffix);
  };
  if (!flags.run.timeline.empty())
    for (const auto& rq : requests) check_writable(timeline_path(rq.train), "--timeline");

  std::vector<RunResult> runs;
  runs.reserve(requests.size());
  ProgressBar progress("compare", requests.size());
  for (const auto& rq : requests) {
    progress.step(std::string(optimizer_name(rq.train.optimizer)) +
                  " checkpointing=" + checkpointing_name(rq.train.checkpointing));
    runs.push_back(execute_run(rq));
    if (runs.size() == 1 && !runs.front().backend_note.empty())
      spdlog::warn("{}", runs.front().backend_note);
    if (runs.back().timeline) {
      const std::string path = timeline_path(rq.train);
      write_timeline(path, *runs.back().timeline);
      spdlog::info("wrote {}", path);
    }
  }
  progress.done();

  std::vector<Pair> pairs;
  for (std::size_t k = 0; k < c.optimizers.size(); ++k)
    pairs.push_back({c.optimizers[k], &runs[2 * k], &runs[2 * k + 1]});

  std::string text;
  if (c.format == Format::json) {
    json j;
    j["schema"] = report::kSchema;
    j["runs"] = json::array();
    for (const auto& r : runs) j["runs"].push_back(run_result_json(r));
    j["comparisons"] = json::array();
    for (const auto& p : pairs) j["comparisons"].push_back(comparison_json(p));
    text = j.dump(2) + "\n";
  } else {
    text = compare_text(pairs, runs, c.format, stdout_colour(c.output));
  }
  write_output(c.output, text);
  for (const auto& r : runs)
    if (r.failure) return 3;
  return 0;
}

}  // namespace

Runner register_compare(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "compare", "Checkpointing off vs on (and --optimizer all), measured, in a paper-style table");
  auto flags = std::make_shared<CompareFlags>();
  add_common_flags(*cmd, flags->common);
  add_run_flags(*cmd, flags->run);
  cmd->add_option("--device-budget", flags->device_budget,
                  "Refuse allocations past SIZE live bytes in every run (out-of-memory: exit 3)");
  return [flags, cmd] {
    // compare always runs both modes: a --checkpointing value is not silently dropped.
    if (cmd->count("--checkpointing") > 0 && flags->common.checkpointing != "both")
      spdlog::warn(
          "--checkpointing {}: compare always runs checkpointing none and full side by side; "
          "use trainmem profile for one mode",
          flags->common.checkpointing.empty() ? "(bare)" : flags->common.checkpointing);
    return run_compare(*flags);
  };
}

}  // namespace trainmem::cli
