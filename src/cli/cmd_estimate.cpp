// trainmem estimate — the analytic model only: no GPU, milliseconds. One row per requested
// (optimizer, checkpointing mode, profile); --explain adds the per-tensor lists and per-layer
// formulas that answer "why this many GB of activations?".
// Its report: include/trainmem/report/estimate_report.hpp.
#include <spdlog/spdlog.h>

#include <cmath>
#include <memory>
#include <sstream>

#include "cli.hpp"
#include "layout.hpp"
#include "trainmem/analytic/analytic.hpp"
#include "trainmem/analytic/caching_allocator.hpp"
#include "trainmem/analytic/hf_step.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/report/estimate_report.hpp"
#include "trainmem/report/hf_fsdp2_report.hpp"
#include "trainmem/report/layout_report.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/run/run.hpp"
#include "trainmem/run/run_layout.hpp"
#include "trainmem/run/timeline.hpp"

namespace trainmem::cli {
namespace {

using nlohmann::json;

// --timeline: the one HF step of the report, as a timeline file.
void write_hf_timeline(const std::string& path, const std::vector<report::EstimateRun>& runs) {
  std::vector<const Estimate*> steps;
  for (const auto& r : runs)
    for (const auto& e : r.estimates)
      if (e.hf_step_peak) steps.push_back(&e);
  if (steps.size() != 1)
    throw InputError(
        "--timeline: draws one HF step (--profile hf-eager or hf-sdpa in "
        "transformers 5.25, one --optimizer and --checkpointing mode); this report "
        "has " +
        std::to_string(steps.size()));
  const Estimate& e = *steps.front();
  HfStepOptions so;
  so.sdpa = e.profile == Profile::hf_sdpa;
  const HfStep st = hf_step(e.model, e.train, e.hf, so);
  write_timeline(
      path, hf_step_timeline(st, std::string(profile_name(e.profile)) + " step, " + e.model.name +
                                     ", precision " + precision_name(e.hf.recipe(e.train.dtype))));
}

std::vector<report::EstimateRun> compute(const Common& c, const std::string& allocator) {
  const bool html = c.format == Format::html;
  std::vector<Profile> profiles;
  for (const auto& name : c.profiles) {
    const auto p = parse_profile(name);
    if (!p) throw InputError("--profile: unknown profile '" + name + "'");
    profiles.push_back(*p);
  }
  std::vector<report::EstimateRun> runs;
  for (Optimizer o : c.optimizers)
    for (const CheckpointPolicy& m : c.checkpointing_modes) {
      report::EstimateRun r;
      r.train = c.train;
      r.train.optimizer = o;
      // budget:SIZE picks its layers for each optimizer (their states differ).
      resolve_checkpoint_budget(m, c.model, r.train, ParallelConfig{}).apply(r.train);
      for (Profile p : profiles) r.estimates.push_back(estimate(p, c.model, r.train, c.hf));
      if (!allocator.empty()) {
        // The native step's allocation sequence: its meta trace, fed to the model.
        RunRequest rq;
        rq.model = c.model;
        rq.train = r.train;
        rq.backend = "meta";
        rq.steps = 2;
        rq.probes = false;
        rq.allocator = parse_allocator(allocator);
        const RunResult traced = execute_run(rq);
        r.allocator_model = traced.allocator_model;
        r.traced_peak = traced.ledger.peak;
        for (const Estimate& e : r.estimates) {
          if (!e.hf_step_peak) continue;
          HfStepOptions so;
          so.sdpa = e.profile == Profile::hf_sdpa;
          const HfStep st = hf_step(e.model, e.train, e.hf, so);
          r.hf_allocator.push_back(
              {profile_name(e.profile), st.peak, replay_hf_step(st, parse_allocator(allocator))});
        }
      }
      if (html)  // the page draws each HF step's timeline
        for (const Estimate& e : r.estimates) {
          if (!e.hf_step_peak) continue;
          HfStepOptions so;
          so.sdpa = e.profile == Profile::hf_sdpa;
          report::EstimateRun::HfTimeline tl;
          tl.profile = profile_name(e.profile);
          tl.data = hf_step_timeline(hf_step(e.model, e.train, e.hf, so),
                                     tl.profile + " step, " + e.model.name + ", precision " +
                                         precision_name(e.hf.recipe(e.train.dtype)),
                                     &tl.tensors);
          r.hf_timelines.push_back(std::move(tl));
        }
      runs.push_back(std::move(r));
    }
  return runs;
}

// `--profile hf-eager|hf-sdpa --world-size N`: the HF step per rank under FSDP2 (docs/hf-step.md,
// "Per rank under FSDP2"). Data parallelism alone, per-parameter sharding (--fsdp2; --zero 2
// for reshard_after_forward=False); the precision recipe defaults to pure, as FSDP2 without a
// MixedPrecisionPolicy trains.
int estimate_hf_fsdp2(const Common& c, const ParallelConfig& par, const LayoutFlags& layout,
                      const std::string& allocator, bool explain, bool paper) {
  const std::string prof = c.profiles.front();
  check_hf_fsdp2_layout(prof, par);
  if (explain) throw InputError("--explain: not with the HF step per rank (--fsdp2)");
  if (paper) throw InputError("--paper: a single-GPU table; not with --world-size above 1");
  if (c.optimizers.size() != 1 || c.checkpointing_modes.size() != 1)
    throw InputError(
        "--optimizer/--checkpointing: the HF step per rank takes one optimizer (adamw) and one "
        "checkpointing mode (none or full)");
  report::HfFsdp2Report r;
  r.model = c.model;
  r.train = c.train;
  r.train.optimizer = c.optimizers.front();
  r.hf = c.hf;
  r.precision_defaulted = !r.hf.precision;
  if (r.precision_defaulted) r.hf.precision = Precision::pure;
  r.profile = prof;
  r.world = static_cast<int>(par.world);
  r.reshard_after_forward = par.reshard_after_forward;
  const std::string why = hf_step_unsupported(r.model, r.train, r.hf);
  if (!why.empty()) throw InputError(why);
  HfStepOptions o;
  o.sdpa = prof == "hf-sdpa";
  o.fsdp_world = r.world;
  o.reshard_after_forward = par.reshard_after_forward;
  r.groups = hf_step_fsdp2_ranks(r.model, r.train, r.hf, o);
  r.overheads = estimate_overheads(par, resolve_overheads(layout));
  if (!allocator.empty()) {
    const AllocatorSpec spec = parse_allocator(allocator);
    for (const auto& g : r.groups) r.reserved.push_back(replay_hf_step(g.step, spec));
  }
  const auto w = report::make_writer(c.format, stdout_colour(c.output));
  report::write_hf_fsdp2(*w, r);
  write_output(c.output, w->str());
  return 0;
}

}  // namespace

Runner register_estimate(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "estimate",
      "Closed-form memory of one training step (no GPU): params, gradients, optimizer states, "
      "activations, workspace, peak, per profile");
  auto flags = std::make_shared<CommonFlags>();
  auto explain = std::make_shared<bool>(false);
  auto paper = std::make_shared<std::string>();
  auto layout = std::make_shared<LayoutFlags>();
  auto allocator = std::make_shared<std::string>();
  auto timeline = std::make_shared<std::string>();
  add_common_flags(*cmd, *flags);
  cmd->add_option("--timeline", *timeline,
                  "The HF step's memory timeline (one profile hf-eager or hf-sdpa in "
                  "transformers 5.25, one optimizer and checkpointing mode): .json (Perfetto) "
                  "or .svg, its event sequence (docs/hf-step.md)");
  cmd->add_option("--allocator", *allocator,
                  "Also what PyTorch's CUDA caching allocator would reserve for the native step "
                  "and the HF step (hf-eager/hf-sdpa in transformers 5.25) "
                  "(its meta trace fed to a model): pytorch, or pytorch:KEY=VALUE,... "
                  "(docs/allocator.md)");
  add_layout_flags(*cmd, *layout);
  cmd->add_option("--paper", *paper,
                  "Print a published table beside the estimate: lomo (LOMO, Lv et al. 2023, "
                  "Table 1: LLaMA-7B, b 8, s 512, fp16), with the differences");
  cmd->add_flag("--explain", *explain,
                "Print the per-tensor lists and per-layer formulas with their coefficients");
  cmd->footer(
      "--optimizer all and --checkpointing both give the whole table (3 optimizers x 2 modes);\n"
      "--checkpointing also takes a list of policies (none,selective,every:2,full).\n"
      "Formulas and a worked LLaMA-7B example: docs/formulas.md.");
  return [flags, explain, paper, layout, allocator, timeline] {
    Common c = resolve_common(*flags, /*allow_all_optimizers=*/true,
                              /*allow_both_modes=*/true, /*allow_finetune=*/true,
                              /*native_lora=*/true);
    const ParallelConfig par = resolve_layout(*layout, c.model, c.train);
    if (c.hf.peft.finetune != Finetune::full) {
      // trainmem's own LoRA step runs per rank (docs/distributed.md, "LoRA per rank"; hf-peft,
      // one GPU's, is refused there by check_layout_request).
      const char* bad = !allocator->empty() ? "--allocator" : !paper->empty() ? "--paper" : nullptr;
      if (bad)
        throw InputError(std::string("--finetune ") + finetune_name(c.hf.peft.finetune) + " with " +
                         bad +
                         ": the LoRA step (hf-peft) is modelled on one GPU, without the "
                         "allocator replay or the paper's table");
    }
    if (!allocator->empty()) parse_allocator_spec(*allocator);  // bad specs before any trace
    if (!timeline->empty()) {
      validate_timeline_path(*timeline);
      check_writable(*timeline, "--timeline");
      if (par.distributed())
        throw InputError("--timeline: draws one GPU's HF step; not with a --world-size layout");
    }
    if (par.distributed()) {
      resolve_checkpointing(c, par);  // budget:SIZE picks its layers for this layout
      if (c.profiles.size() == 1 &&
          (c.profiles.front() == "hf-eager" || c.profiles.front() == "hf-sdpa"))
        return estimate_hf_fsdp2(c, par, *layout, *allocator, *explain, !paper->empty());
      check_layout_request(c, *explain, !paper->empty());
      if (!allocator->empty()) {
        // Every distinct rank's step traced on meta and fed to the model: the per-rank report
        // of profile's traced layout (the analytic per rank, then each rank's reserve).
        const LayoutTrace lt = trace_layout(c.model, c.train, par, resolve_overheads(*layout), 2,
                                            parse_allocator(*allocator));
        write_output(c.output,
                     report::render_layout_trace(lt, c.format, stdout_colour(c.output),
                                                 "trainmem estimate (per rank; each rank traced "
                                                 "on meta for --allocator)"));
        return 0;
      }
      const LayoutEstimate le = estimate_layout(c.model, c.train, par, resolve_overheads(*layout));
      write_output(c.output, report::render_layout(le, c.format, stdout_colour(c.output)));
      return 0;
    }
    const bool with_paper = !paper->empty();
    if (with_paper) {
      if (*paper != "lomo")
        throw InputError("--paper: unknown table '" + *paper + "'; allowed: lomo");
      const TrainConfig& t = c.train;
      if (c.model.name != "llama-7b" || t.batch != 8 || t.seq != 512 || t.dtype != DType::f16)
        throw InputError(
            "--paper lomo: the paper's Table 1 is --model llama-7b --batch 8 --seq 512 --dtype "
            "fp16; got --model " +
            c.model.name + " --batch " + std::to_string(t.batch) + " --seq " +
            std::to_string(t.seq) + " --dtype " + dtype_name(t.dtype));
      if (c.format != Format::table && c.format != Format::markdown && c.format != Format::html)
        throw InputError("--paper: allowed with --format table, markdown or html only");
    }
    std::vector<report::EstimateRun> runs = compute(c, *allocator);
    if (!timeline->empty()) write_hf_timeline(*timeline, runs);
    // The title shows the first run's configuration (its budget:SIZE resolved).
    const report::EstimateResult result{c.model, runs.front().train, std::move(runs)};
    // Colour off: estimate's report has no state to colour (and its title was never bold).
    const auto w = report::make_writer(c.format, report::Colour::off);
    report::write_estimate(*w, result, *explain, with_paper);
    write_output(c.output, w->str());
    return 0;
  };
}

}  // namespace trainmem::cli
