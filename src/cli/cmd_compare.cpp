// trainmem compare — the same configuration with activation checkpointing off and on (and,
// with --optimizer all, for AdamW, SGD and LOMO), laid out like a paper's memory table. On a
// backend that computes it adds the measured recompute cost: the extra step time the
// recomputed forward costs, as a fraction of the step without checkpointing.
#include <spdlog/spdlog.h>

#include <memory>
#include <optional>

#include "cli.hpp"
#include "launch.hpp"
#include "layout.hpp"
#include "progress.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/report/compare_report.hpp"
#include "trainmem/report/layout_report.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/report/run_report.hpp"
#include "trainmem/run/compare.hpp"
#include "trainmem/run/run.hpp"
#include "trainmem/run/series.hpp"
#include "trainmem/run/timeline.hpp"

namespace trainmem::cli {
namespace {

struct CompareFlags {
  CommonFlags common;
  RunFlags run;
  LayoutFlags layout;
  LaunchFlags launch;
};

// --world-size above 1: checkpointing none and full per rank, traced on meta (one row per
// stage) or measured under MPI (one row per rank), each against the per-rank analytic profile.
int run_compare_layout(const Common& c, const CompareFlags& flags, const ParallelConfig& par) {
  if (c.optimizers.size() > 1)
    throw InputError(
        "--optimizer all: with --world-size above 1 give one optimizer (adamw or sgd)");
  Common one = c;  // what the per-rank profile supports, one mode at a time
  one.checkpointing_modes = {Checkpointing::none};
  one.train.checkpointing = Checkpointing::none;
  const OverheadOptions oo = resolve_overheads(flags.layout);
  const std::string& be = flags.run.backend;
  auto with_mode = [&](Checkpointing mode) {
    Common cm = one;
    cm.train.checkpointing = mode;
    return cm;
  };
  if (be == "cpu" || be == "cuda") {
    return run_ranked(
        one, flags.run, par, flags.launch,
        [&](Backend& backend, Collective& data, Collective& world) {
          check_layout_request(one, false, false);
          std::vector<MeasuredLayout> ml;
          for (Checkpointing mode : {Checkpointing::none, Checkpointing::full}) {
            RunFlags rf = flags.run;
            if (!rf.timeline.empty())
              rf.timeline =
                  suffixed_path(rf.timeline, std::string("ckpt-") + checkpointing_name(mode));
            ml.push_back(measure_layout_and_timeline(measure_request(with_mode(mode), rf, par, oo),
                                                     rf.timeline, backend, data, world));
            if (ml.back().failure)
              end_failed_rank(one, flags.run, ml.back(), world.rank(), "compare");
          }
          if (world.rank() != 0) return 0;
          const std::vector<CompareLayoutRow> rows = compare_rows(ml[0], ml[1]);
          const std::string source = "MEASURED on " + ml[0].backend + ", " +
                                     std::to_string(ml[0].ranks.size()) + " ranks over " +
                                     ml[0].collective;
          write_output(c.output, report::render_compare_layout(ml[0].predicted.analytic, rows,
                                                               source, ml[0].backend, ml[0].steps,
                                                               c.format, stdout_colour(c.output)));
          return 0;
        });
  }
  if (be != "meta" && be != "auto")
    throw InputError("--backend " + be + " with --world-size above 1: use meta, cpu or cuda");
  check_layout_request(one, false, false);
  if (auto p = traced_layout_problem(flags.run, par.world, command_line())) throw InputError(*p);
  std::optional<AllocatorSpec> allocator;
  if (!flags.run.allocator.empty()) allocator = parse_allocator(flags.run.allocator);
  const LayoutTrace none = trace_layout(c.model, with_mode(Checkpointing::none).train, par, oo,
                                        flags.run.steps, allocator);
  const LayoutTrace full = trace_layout(c.model, with_mode(Checkpointing::full).train, par, oo,
                                        flags.run.steps, allocator);
  const std::vector<CompareLayoutRow> rows = compare_rows(none, full);
  write_output(c.output,
               report::render_compare_layout(none.analytic, rows, "TRACED on meta", "meta",
                                             none.steps, c.format, stdout_colour(c.output)));
  return 0;
}

int run_compare(const CompareFlags& flags) {
  const Common c = resolve_common(flags.common, true, true);
  const ParallelConfig par = resolve_layout(flags.layout, c.model, c.train);
  const std::string& be = flags.run.backend;
  check_collectives_flag(flags.launch, par.distributed() && (be == "cpu" || be == "cuda"));
  if (par.distributed()) return run_compare_layout(c, flags, par);
  if (!flags.run.timeline.empty()) validate_timeline_path(flags.run.timeline);
  if (!flags.run.dump.empty())
    throw InputError("--dump: compare runs several steps; use trainmem profile --dump");

  // Every request first, checked before the first one runs.
  std::vector<RunRequest> requests;
  for (Optimizer o : c.optimizers) {
    for (Checkpointing mode : {Checkpointing::none, Checkpointing::full}) {
      RunRequest rq = run_request(c, flags.run);
      // --allocator: the reserve with expandable segments flipped too, from the same run.
      // (The spec's last expandable_segments= wins, as in PYTORCH_CUDA_ALLOC_CONF.)
      if (rq.allocator) {
        const std::string& spec = rq.allocator->spec;
        rq.allocator_shadows.push_back(parse_allocator(
            spec + (spec.find(':') == std::string::npos ? ":" : ",") + "expandable_segments=" +
            (rq.allocator->config.expandable_segments ? "false" : "true")));
      }
      rq.train.optimizer = o;
      rq.train.checkpointing = mode;
      rq.keep_timeline |= c.format == Format::html;  // the page shows every run's timeline
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

  ProgressBar progress("compare", requests.size());
  SeriesHooks hooks;
  hooks.before = [&](const RunRequest& rq) {
    progress.step(std::string(optimizer_name(rq.train.optimizer)) +
                  " checkpointing=" + checkpointing_name(rq.train.checkpointing));
  };
  hooks.after = [&](const RunRequest& rq, const RunResult& r) {
    if (r.timeline && !flags.run.timeline.empty()) {
      const std::string path = timeline_path(rq.train);
      write_timeline(path, *r.timeline);
      spdlog::info("wrote {}", path);
    }
  };
  const std::vector<RunResult> runs = run_series(requests, hooks);
  progress.done();

  std::vector<report::ComparePair> pairs;
  for (std::size_t k = 0; k < c.optimizers.size(); ++k)
    pairs.push_back({c.optimizers[k], &runs[2 * k], &runs[2 * k + 1]});

  const auto w = report::make_writer(c.format, stdout_colour(c.output));
  report::write_compare(*w, pairs, runs);
  write_output(c.output, w->str());
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
  add_run_flags(*cmd, flags->run, /*several_runs=*/true);
  add_layout_flags(*cmd, flags->layout);
  add_launch_flags(*cmd, flags->launch);
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
