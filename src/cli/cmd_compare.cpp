// trainmem compare — the same configuration with activation checkpointing off and on (and,
// with --optimizer all, for AdamW, SGD and LOMO), laid out like a paper's memory table. On a
// backend that computes it adds the measured recompute cost: the extra step time the
// recomputed forward costs, as a fraction of the step without checkpointing.
#include <spdlog/spdlog.h>

#include <cctype>
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

// The policies compare runs, in order: none first (the baseline), then each policy of
// --checkpointing but none ("both", the default, is none and full; the bare flag is full).
std::vector<CheckpointPolicy> compared_policies(const Common& c) {
  std::vector<CheckpointPolicy> out = {CheckpointPolicy{}};
  for (const auto& p : c.checkpointing_modes)
    if (!(p.mode == Checkpointing::none && p.layers.spec.empty())) out.push_back(p);
  if (out.size() == 1)
    throw InputError(
        "--checkpointing none: compare runs checkpointing none against other policies; give "
        "them (e.g. full, or none,every:2,full)");
  return out;
}

// A policy's name as part of a file name ("every:2" -> "every-2").
std::string file_safe(std::string s) {
  for (char& ch : s)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '.' || ch == '_'))
      ch = '-';
  return s;
}

// --world-size above 1: checkpointing none and full per rank, traced on meta (one row per
// stage) or measured under MPI (one row per rank), each against the per-rank analytic profile.
int run_compare_layout(const Common& c, const CompareFlags& flags, const ParallelConfig& par) {
  if (c.optimizers.size() > 1)
    throw InputError(
        "--optimizer all: with --world-size above 1 give one optimizer (adamw or sgd)");
  auto with_policy = [](const CheckpointPolicy& p) {
    TrainConfig t;
    p.apply(t);
    return t;
  };
  const std::vector<CheckpointPolicy> policies = compared_policies(c);
  if (policies.size() != 2)
    throw InputError("--checkpointing " + flags.common.checkpointing +
                     ": with --world-size above 1 compare runs none against one policy");
  Common one = c;  // what the per-rank profile supports, one policy at a time
  one.checkpointing_modes = {CheckpointPolicy{}};
  CheckpointPolicy{}.apply(one.train);
  const OverheadOptions oo = resolve_overheads(flags.layout);
  const std::string& be = flags.run.backend;
  const std::string policy_name = checkpointing_name(with_policy(policies[1]));
  auto with_mode = [&](const CheckpointPolicy& policy) {
    Common cm = one;
    policy.apply(cm.train);
    return cm;
  };
  if (be == "cpu" || be == "cuda") {
    return run_ranked(
        one, flags.run, par, flags.launch,
        [&](Backend& backend, Collective& data, Collective& world) {
          check_layout_request(one, false, false);
          std::vector<MeasuredLayout> ml;
          for (const CheckpointPolicy& mode : policies) {
            RunFlags rf = flags.run;
            if (!rf.timeline.empty())
              rf.timeline = suffixed_path(
                  rf.timeline, "ckpt-" + file_safe(checkpointing_name(with_policy(mode))));
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
          write_output(c.output, report::render_compare_layout(
                                     ml[0].predicted.analytic, rows, source, ml[0].backend,
                                     ml[0].steps, c.format, stdout_colour(c.output), policy_name));
          return 0;
        });
  }
  if (be != "meta" && be != "auto")
    throw InputError("--backend " + be + " with --world-size above 1: use meta, cpu or cuda");
  check_layout_request(one, false, false);
  if (auto p = traced_layout_problem(flags.run, par.world, command_line())) throw InputError(*p);
  std::optional<AllocatorSpec> allocator;
  if (!flags.run.allocator.empty()) allocator = parse_allocator(flags.run.allocator);
  const LayoutTrace none =
      trace_layout(c.model, with_mode(policies[0]).train, par, oo, flags.run.steps, allocator);
  const LayoutTrace full =
      trace_layout(c.model, with_mode(policies[1]).train, par, oo, flags.run.steps, allocator);
  const std::vector<CompareLayoutRow> rows = compare_rows(none, full);
  write_output(c.output, report::render_compare_layout(none.analytic, rows, "TRACED on meta",
                                                       "meta", none.steps, c.format,
                                                       stdout_colour(c.output), policy_name));
  return 0;
}

int run_compare(const CompareFlags& flags) {
  Common c = resolve_common(flags.common, true, true, /*allow_finetune=*/false,
                            /*native_lora=*/true);
  const ParallelConfig par = resolve_layout(flags.layout, c.model, c.train);
  const std::string& be = flags.run.backend;
  check_collectives_flag(flags.launch, par.distributed() && (be == "cpu" || be == "cuda"));
  if (par.distributed()) {
    resolve_checkpointing(c, par);  // budget:SIZE picks its layers for this layout
    return run_compare_layout(c, flags, par);
  }
  if (!flags.run.timeline.empty()) validate_timeline_path(flags.run.timeline);
  if (!flags.run.dump.empty())
    throw InputError("--dump: compare runs several steps; use trainmem profile --dump");

  // Every request first, checked before the first one runs: per optimizer, checkpointing none,
  // then each policy of the list.
  const std::vector<CheckpointPolicy> policies = compared_policies(c);
  std::vector<RunRequest> requests;
  for (Optimizer o : c.optimizers) {
    for (const CheckpointPolicy& policy : policies) {
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
      // budget:SIZE picks its layers for each optimizer (their states differ).
      resolve_checkpoint_budget(policy, c.model, rq.train, par).apply(rq.train);
      rq.keep_timeline |= c.format == Format::html;  // the page shows every run's timeline
      check_run_can_start(rq);
      requests.push_back(std::move(rq));
    }
  }
  auto timeline_path = [&](const TrainConfig& t) {
    std::string suffix = "ckpt-" + file_safe(checkpointing_name(t));
    if (c.optimizers.size() > 1) suffix = std::string(optimizer_name(t.optimizer)) + "-" + suffix;
    return suffixed_path(flags.run.timeline, suffix);
  };
  if (!flags.run.timeline.empty())
    for (const auto& rq : requests) check_writable(timeline_path(rq.train), "--timeline");

  ProgressBar progress("compare", requests.size());
  SeriesHooks hooks;
  hooks.before = [&](const RunRequest& rq) {
    progress.step(std::string(optimizer_name(rq.train.optimizer)) +
                  " checkpointing=" + checkpointing_name(rq.train));
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
  const std::size_t per = policies.size();
  for (std::size_t k = 0; k < c.optimizers.size(); ++k)
    for (std::size_t j = 1; j < per; ++j)
      pairs.push_back({c.optimizers[k], &runs[per * k], &runs[per * k + j]});

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
    // Without --checkpointing: none against full.
    if (cmd->count("--checkpointing") == 0) flags->common.checkpointing = "both";
    return run_compare(*flags);
  };
}

}  // namespace trainmem::cli
