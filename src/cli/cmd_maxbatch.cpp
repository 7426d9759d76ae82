// trainmem maxbatch — the largest batch (or, with --vary seq, the longest sequence) whose
// training step fits a memory budget. Each candidate is traced on the meta backend, whose
// peak is the exact high-water mark of the step's allocations (the same bytes a GPU run
// allocates); the overhead no tensor owns (CUDA context, cuBLAS modules, pool slack) is added
// on top: measured on the GPU when one is usable, else stated with --overhead (default 0).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.hpp"
#include "layout.hpp"
#include "size.hpp"
#include "trainmem/analytic/hf_step.hpp"
#include "trainmem/backends/backend.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/report/maxbatch_report.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/run/maxbatch.hpp"

namespace trainmem::cli {
namespace {

using nlohmann::json;

struct MaxbatchFlags {
  CommonFlags common;
  std::string budget;
  std::string vary = "batch";
  std::string overhead = "auto";
  std::int64_t step = 1;
  std::string allocator;  // --allocator pytorch[:...], or ""
  LayoutFlags layout;
};

struct Budget {
  std::uint64_t bytes = 0;
  std::string source;  // "--budget 80GiB" or "device: total memory of ..."
};

// The device's total memory, from cudaMemGetInfo (needs a usable device).
Budget device_budget() {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty())
    throw InputError("--budget device: no usable CUDA device (" + why +
                     "); give a size instead, e.g. --budget 80GiB");
  std::string reason;
  const std::uint64_t total = cuda_device_total_bytes(&reason);
  if (total == 0)
    throw InputError("--budget device: cudaMemGetInfo unavailable (" + reason +
                     "); give a size instead, e.g. --budget 80GiB");
  return {total, "device: total memory reported by cudaMemGetInfo"};
}

struct Overhead {
  std::uint64_t bytes = 0;
  std::string source;
};

Overhead measure_overhead(DType dtype) {
  return {measure_cuda_overhead(dtype),
          "measured on the GPU: cudaMemGetInfo used − ledger live in a tiny cuda run"};
}

Overhead resolve_overhead(const std::string& flag, DType dtype) {
  if (flag == "auto") {
    if (!cuda_unavailable_reason().empty())
      return {0,
              "stated: 0 (no usable CUDA device to measure it; a GPU run adds the CUDA "
              "context, cuBLAS modules and pool slack, typically 0.5-1 GiB: pass --overhead)"};
    return measure_overhead(dtype);
  }
  if (flag == "measure") {
    const std::string why = cuda_unavailable_reason();
    if (!why.empty())
      throw InputError("--overhead measure: no usable CUDA device (" + why +
                       "); state it instead, e.g. --overhead 1GiB, or use --overhead auto");
    return measure_overhead(dtype);
  }
  return {parse_size(flag, "--overhead"), "stated with --overhead " + flag};
}

int run_maxbatch(const MaxbatchFlags& flags) {
  if (flags.vary != "batch" && flags.vary != "seq")
    throw InputError("--vary: unknown '" + flags.vary + "'; allowed: batch, seq");
  // With --vary seq the --seq flag plays no part (nor its warning past the model's
  // positions): validate the rest at the shortest sequence.
  CommonFlags common = flags.common;
  if (flags.vary == "seq") common.seq = 2;
  // A list of policies (--checkpointing none,selective,full) searches each.
  // --finetune lora on a 16-bit base with adamw or sgd: c.train.lora() (trainmem's own step runs
  // it too, and each policy gets its answer beside hf-peft's; docs/native-plan.md, "LoRA").
  const Common c = resolve_common(common, false, true, /*allow_finetune=*/true,
                                  /*native_lora=*/true);
  const bool lora = c.hf.peft.finetune != Finetune::full;
  if (flags.budget.empty())
    throw InputError("--budget is required: a SIZE (80GiB, 24GB, 512MiB) or 'device'");
  const std::int64_t step_max = maxbatch_step_max(flags.vary == "batch");
  if (flags.step < 1 || flags.step > step_max)
    throw InputError("--step must be between 1 and " + std::to_string(step_max) + " for --vary " +
                     flags.vary + ", got " + std::to_string(flags.step));
  const Budget budget = flags.budget == "device" ? device_budget()
                                                 : Budget{parse_size(flags.budget, "--budget"),
                                                          "--budget " + flags.budget};
  const bool vary_batch = flags.vary == "batch";
  // The layout flags are checked as every subcommand checks them (--tp 2 or --zero 3 without
  // --world-size is refused here as by estimate, never silently ignored).
  // --vary seq: the layout is checked at a sequence every layout of these degrees divides (2·cp
  // chunks, s/cp rows split by tp under sp); --step's divisibility is find_max's check.
  TrainConfig layout_train = c.train;
  if (!vary_batch && flags.layout.cp >= 1 && flags.layout.cp <= 65536 && flags.layout.tp >= 1 &&
      flags.layout.tp <= 65536)
    layout_train.seq = 2 * flags.layout.cp * flags.layout.tp;
  const ParallelConfig par = resolve_layout(flags.layout, c.model, layout_train);
  MaxbatchRequest rq;
  rq.model = c.model;
  rq.train = c.train;
  rq.vary_batch = vary_batch;
  rq.step = flags.step;
  rq.budget = budget.bytes;
  if (!flags.allocator.empty()) {
    if (lora)
      throw InputError("--allocator with --finetune " + common.finetune +
                       ": the allocator model is not built for the LoRA searches yet");
    rq.allocator = parse_allocator(flags.allocator);
  }
  // --profile: trainmem's own step (native, the default) or the HF step's event sequence.
  const std::string& prof = flags.common.profile;
  if (!lora && prof != "all" && prof != "native") {
    if (prof != "hf-eager" && prof != "hf-sdpa")
      throw InputError("--profile " + prof +
                       ": maxbatch searches with native (trainmem's own step, the default) or "
                       "one of hf-eager, hf-sdpa (the HF step's event sequence, transformers "
                       "5.25)");
    const Profile p = *parse_profile(prof);
    rq.hf_step = p;
    rq.hf = c.hf;
    if (par.distributed()) {  // every rank's step under FSDP2 (pure unless --precision says)
      check_hf_fsdp2_layout(prof, par);
      if (!rq.hf.precision) rq.hf.precision = Precision::pure;
    }
    // The step models transformers 5.25: an era is checked only when --hf-version gives one
    // (hf_era_for's default, 4.30 for hf-eager on LLaMA, is the saved-tensor profile's).
    const std::string why = hf_step_unsupported(c.model, c.train, rq.hf);
    if (!why.empty()) throw InputError(why);
  }
  if (!rq.hf_step && (!common.precision.empty() || !common.adamw_impl.empty()))
    throw InputError(std::string(common.precision.empty() ? "--adamw-impl" : "--precision") +
                     ": maxbatch applies it to the HF step (--profile hf-eager or hf-sdpa)");
  // LoRA under a parallel layout: the native step's search per rank alone (docs/distributed.md,
  // "LoRA per rank"); hf-peft models one GPU.
  const bool per_rank = flags.layout.world != 1 || par.distributed();
  if (lora && !per_rank && !c.train.quant8()) {
    // The hf-peft profile's search (one GPU), and below the native step's for a 16-bit base
    // (hf-peft does not model the 8-bit base: the native step's search alone).
    if (!vary_batch)
      for (std::int64_t l = 0; l < c.model.layers; ++l)
        if (c.model.window_of(l) > 0)
          throw InputError("--vary seq with --finetune " + common.finetune + ": " + c.model.name +
                           " has a sliding window (" + std::to_string(c.model.window_of(l)) +
                           ") that hf-peft does not model once the sequence reaches it; "
                           "use --vary batch with --seq below it");
    rq.hf_peft = c.hf;
  }
  const bool native_lora = c.train.lora();
  std::string overhead_source;
  if (flags.layout.world != 1) {
    if (flags.overhead != "auto")
      throw InputError(
          "--overhead with --world-size above 1: state the overheads per GPU with "
          "--cuda-context and --nccl-memory");
    if (!rq.hf_step) check_layout_request(c, false, false, /*policy_list=*/true);
    rq.layout = par;
    rq.overheads = resolve_overheads(flags.layout);
  } else {
    const Overhead overhead = resolve_overhead(flags.overhead, c.train.dtype);
    rq.overhead = overhead.bytes;
    overhead_source = overhead.source;
  }
  std::vector<report::MaxbatchPolicyRun> runs;
  for (const CheckpointPolicy& policy : c.checkpointing_modes) {
    MaxbatchRequest one = rq;
    policy.apply(one.train);
    const MaxbatchResult m = find_max(one);
    if (!one.layout && !vary_batch && m.search.best > c.model.max_positions)
      spdlog::warn("--vary seq{}: {} is longer than {}'s max_position_embeddings {}",
                   c.checkpointing_modes.size() > 1 ? " (" + checkpointing_name(one.train) + ")"
                                                    : std::string(),
                   m.search.best, c.model.name, c.model.max_positions);
    runs.push_back({std::move(one), m});
  }
  if (native_lora && rq.hf_peft)  // one GPU: the native step's answers beside hf-peft's
    for (const CheckpointPolicy& policy : c.checkpointing_modes) {
      MaxbatchRequest one = rq;
      one.hf_peft.reset();
      policy.apply(one.train);
      const MaxbatchResult m = find_max(one);
      runs.push_back({std::move(one), m});
    }
  bool any = false;
  for (const auto& r : runs) any = any || r.result.search.best > 0;
  if (runs.size() == 1)
    write_output(c.output,
                 report::render_maxbatch(runs.front().request, runs.front().result, budget.source,
                                         overhead_source, c.format, stdout_colour(c.output)));
  else
    write_output(c.output, report::render_maxbatch_policies(runs, budget.source, overhead_source,
                                                            c.format, stdout_colour(c.output)));
  return any ? 0 : 3;
}

}  // namespace

Runner register_maxbatch(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "maxbatch", "Largest batch (or --vary seq: longest sequence) whose step fits --budget");
  auto flags = std::make_shared<MaxbatchFlags>();
  add_common_flags(*cmd, flags->common);
  cmd->add_option("--budget", flags->budget,
                  "Memory budget: a SIZE (80GiB, 24GB, 512MiB) or 'device' (the GPU's total)");
  cmd->add_option("--vary", flags->vary, "What to maximise: batch|seq")->capture_default_str();
  cmd->add_option("--overhead", flags->overhead,
                  "Bytes no tensor owns, added to each peak: a SIZE, 'measure' (on the GPU), "
                  "or 'auto' (measure when a GPU is usable, else 0)")
      ->capture_default_str();
  cmd->add_option("--allocator", flags->allocator,
                  "Answer with what PyTorch's CUDA caching allocator would reserve (a model): "
                  "pytorch, or pytorch:KEY=VALUE,... (docs/allocator.md)");
  cmd->add_option("--step", flags->step, "Granularity of the answer (e.g. 64 for --vary seq)")
      ->check(integer_check<std::int64_t>("an integer; allowed: an integer >= 1"))
      ->capture_default_str();
  add_layout_flags(*cmd, flags->layout);
  return [flags, cmd] {
    // A LoRA / QLoRA search without --checkpointing answers with and without it: peft's
    // prepare_model_for_kbit_training turns checkpointing on by default, a plain LoRA loop
    // leaves it off (docs/decisions.md, "maxbatch for LoRA and QLoRA").
    if (cmd->count("--checkpointing") == 0 &&
        (flags->common.finetune == "lora" || flags->common.finetune == "qlora"))
      flags->common.checkpointing = "none,full";
    return run_maxbatch(*flags);
  };
}

}  // namespace trainmem::cli
