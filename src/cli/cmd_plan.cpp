// trainmem plan — the cheapest parallel layout that fits: every layout of --gpus N GPUs
// (dp·tp·pp, ZeRO stage, sp, checkpointing, attention, optimizer, micro-batch size, offload)
// whose worst rank fits --gpu-memory less --margin, ranked by an estimated step time
// (include/trainmem/analytic/plan.hpp; the cost model: docs/plan.md). Exit 3 when nothing fits (the
// report, with each rejected family's reason, is still written).
// Its report: include/trainmem/report/plan_report.hpp.
#include <algorithm>
#include <memory>
#include <string>

#include "cli.hpp"
#include "layout.hpp"
#include "size.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/analytic/hf_step.hpp"
#include "trainmem/analytic/plan.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/report/plan_report.hpp"
#include "trainmem/report/report_writer.hpp"

namespace trainmem::cli {
namespace {

struct PlanFlags {
  std::string model = "llama-7b";
  std::int64_t gpus = 0;  // required
  CLI::Option* gpus_given = nullptr;
  std::string gpu_memory;
  std::string host_memory;  // "" = no limit
  std::int64_t seq = 512;
  std::int64_t global_batch = 0;  // required
  CLI::Option* global_batch_given = nullptr;
  std::string dtype = "bf16";
  std::string optimizer = "adamw";
  std::string checkpointing = "none,selective,every:2,full,budget";
  std::string activation_offload = "both";  // off|on|both (on: one GPU only)
  std::string cp = "auto";                  // context-parallel degrees: auto or a comma list
  std::string sharding;                     // ZeRO-3's split: flat | per-parameter ("": flat)
  bool fsdp2 = false;  // only FSDP2's layouts: per-parameter FULL_SHARD and SHARD_GRAD_OP
  std::string profile = "native";  // native | hf-eager | hf-sdpa (the HF step under FSDP2)
  std::string precision;           // the HF step's recipe: pure (default) | mixed
  double margin = 0.05;
  std::int64_t top = 10;
  double tflops = CostModel{}.tflops;
  double link_gbps = CostModel{}.link_gbps;
  double pcie_gbps = CostModel{}.pcie_gbps;
  std::string cuda_context;
  std::string nccl_memory;
  std::int64_t nccl_channels = OverheadOptions{}.nccl_channels;
  std::string format = "table";
  std::string output;
  std::string log_level = "info";
  // --finetune and the LoRA flags (add_finetune_flags): the recipe every layout trains.
  CommonFlags finetune;
};

std::string str(std::int64_t v) {
  return std::to_string(v);
}

// The HF step per rank under FSDP2 as plan's estimator: every distinct rank's step
// (hf_step_fsdp2_ranks), its peak and the categories at it.
LayoutEstimate hf_step_layout(const ModelConfig& m, const TrainConfig& t, const ParallelConfig& lay,
                              const OverheadOptions& ov, const HfOptions& hf, bool sdpa) {
  if (const std::string why = hf_step_unsupported(m, t, hf); !why.empty()) throw InputError(why);
  HfStepOptions so;
  so.sdpa = sdpa;
  so.fsdp_world = static_cast<int>(lay.world);
  so.reshard_after_forward = lay.reshard_after_forward;
  LayoutEstimate e;
  e.layout = lay;
  e.model = m;
  e.train = t;
  e.global_batch = static_cast<std::uint64_t>(t.batch * lay.microbatches * lay.dp);
  for (const HfStepRankGroup& g : hf_step_fsdp2_ranks(m, t, hf, so)) {
    RankEstimate r;
    r.role = "only";
    r.ranks = g.last - g.first + 1;
    r.layers = m.layers;
    r.grad_rank = g.first;
    MemoryFigures& f = r.est.figures;
    f.peak = g.step.peak;
    f.peak_breakdown = hf_step_categories(g.step.by_kind_at_peak);
    // As estimate's HF step figures (analytic_hf.cpp): the states as the step starts, the
    // others each category's most bytes at once.
    const CategoryBytes start = hf_step_categories(g.step.start_by_kind),
                        most = hf_step_category_maxima(g.step);
    auto at = [](const CategoryBytes& c, Category k) { return c[static_cast<std::size_t>(k)]; };
    f.params = at(start, Category::params);
    f.optimizer_states = at(start, Category::optimizer_states);
    f.inputs = at(start, Category::inputs);
    f.gradients = at(most, Category::gradients);
    f.activations = g.step.activations_at_backward;
    f.activations_peak = at(most, Category::activations);
    f.workspace = at(most, Category::workspace);
    f.sum = f.params + f.gradients + f.optimizer_states + f.activations;
    e.ranks.push_back(std::move(r));
  }
  for (std::size_t k = 1; k < e.ranks.size(); ++k)
    if (e.ranks[k].est.figures.peak > e.ranks[std::size_t(e.worst)].est.figures.peak)
      e.worst = static_cast<int>(k);
  e.overheads = estimate_overheads(lay, ov, m.moe());
  return e;
}

int run_plan(const PlanFlags& flags) {
  if (flags.gpus_given && !flags.gpus_given->count())
    throw InputError("--gpus is required: the number of GPUs N (>= 1), e.g. --gpus 8");
  if (flags.gpu_memory.empty())
    throw InputError("--gpu-memory is required: a SIZE (80GiB, 24GB, 512MiB)");
  if (flags.global_batch_given && !flags.global_batch_given->count())
    throw InputError("--global-batch is required: sequences per optimizer step (>= 1)");
  // The model, --seq, --dtype, --optimizer, --format and --output as every command checks them.
  CommonFlags cf = flags.finetune;  // --finetune and the LoRA flags
  cf.model = flags.model;
  cf.batch = 1;
  cf.seq = flags.seq;
  cf.dtype = flags.dtype;
  cf.optimizer = flags.optimizer;
  // --profile hf-eager|hf-sdpa: the HF step per rank under FSDP2 (docs/plan.md, "The HF step").
  const bool hf = flags.profile != "native";
  if (hf && flags.profile != "hf-eager" && flags.profile != "hf-sdpa")
    throw InputError("--profile " + flags.profile +
                     ": plan searches with native (trainmem's own step, the default) or one of "
                     "hf-eager, hf-sdpa (the HF step per rank under FSDP2, transformers 5.25)");
  if (!hf && !flags.precision.empty())
    throw InputError("--precision " + flags.precision +
                     ": plan applies it to the HF step (--profile hf-eager or hf-sdpa)");
  cf.profile = hf ? flags.profile : "native";
  cf.precision = flags.precision;
  cf.format = flags.format;
  cf.output = flags.output;
  const Common c = resolve_common(cf, true, false, /*allow_finetune=*/false,
                                  /*native_lora=*/true);
  if (c.train.lora() && flags.activation_offload == "on")
    throw InputError("--activation-offload on with --finetune " + cf.finetune +
                     ": the LoRA step is not modelled with activation offload");
  // plan searches parallel layouts: the per-rank step models a mixture of experts as
  // check_moe_layout allows (docs/distributed.md, "Mixture of experts per rank").
  require_native_moe(c.model, c.train, "plan (the per-rank sharded step)");
  if (bnb_optimizer(c.train.optimizer))
    throw InputError(std::string("--optimizer ") + flags.optimizer +
                     ": plan searches parallel layouts, and bitsandbytes' optimizers are "
                     "modelled on one GPU only (the sharded step shards AdamW's and SGD's fp32 "
                     "states); `trainmem maxbatch --optimizer " +
                     flags.optimizer + "` answers for one GPU");

  HfOptions hf_options = c.hf;
  if (hf) {
    auto refuse = [&](const std::string& what) {
      throw InputError(what + " with --profile " + flags.profile +
                       ": plan's HF step is the HF step per rank under FSDP2 over data "
                       "parallelism alone, one micro-batch of G/N sequences per rank, AdamW, "
                       "checkpointing none or full, as `estimate --profile " +
                       flags.profile + " --world-size N --fsdp2` models it");
    };
    if (flags.gpus == 1)
      refuse("--gpus 1 (`maxbatch --profile " + flags.profile + "` answers for one GPU)");
    if (!flags.sharding.empty() && flags.sharding != "per-parameter")
      refuse("--sharding " + flags.sharding);
    if (c.train.lora()) refuse("--finetune " + cf.finetune);
    for (Optimizer opt : c.optimizers)
      if (opt != Optimizer::adamw) refuse("--optimizer " + flags.optimizer);
    if (flags.activation_offload == "on") refuse("--activation-offload on");
    if (flags.cp != "auto" && flags.cp != "1") refuse("--cp " + flags.cp);
    if (!hf_options.precision) hf_options.precision = Precision::pure;
    if (*hf_options.precision == Precision::amp)
      throw InputError("--precision amp with --profile " + flags.profile +
                       ": the HF step under FSDP2 models pure (the model in --dtype, no "
                       "MixedPrecisionPolicy) and mixed (an fp32 model under "
                       "MixedPrecisionPolicy(param_dtype=--dtype, reduce_dtype=float32)); "
                       "allowed: pure, mixed");
    if (const std::string why = hf_step_unsupported(c.model, c.train, hf_options); !why.empty())
      throw InputError(why);
  }

  PlanOptions o;
  o.gpus = flags.gpus;
  o.gpu_memory = parse_size(flags.gpu_memory, "--gpu-memory");
  if (!flags.host_memory.empty()) o.host_memory = parse_size(flags.host_memory, "--host-memory");
  o.margin = flags.margin;
  o.seq = c.train.seq;
  o.global_batch = flags.global_batch;
  o.dtype = c.train.dtype;
  o.optimizers = c.optimizers;
  o.finetune = c.train;  // its LoRA and quantization fields
  o.policies = parse_plan_policies(
      hf && flags.checkpointing == PlanFlags{}.checkpointing ? "none,full" : flags.checkpointing);
  for (const PlanPolicy& pol : o.policies)
    if (hf && pol.kind != PlanPolicy::Kind::none && pol.kind != PlanPolicy::Kind::full)
      throw InputError("--checkpointing " + pol.name() + " with --profile " + flags.profile +
                       ": the HF step models none and full (every decoder layer, "
                       "non-reentrant); allowed: none, full");
  if (flags.activation_offload == "off")
    o.activation_offload = {false};
  else if (flags.activation_offload == "on")
    o.activation_offload = {true};
  else if (flags.activation_offload == "both")
    o.activation_offload = {false, true};
  else
    throw InputError("--activation-offload: unknown '" + flags.activation_offload +
                     "'; allowed: off, on, both (on: the layouts of one GPU only)");
  o.cp_degrees.clear();
  if (o.gpus < 1 || o.gpus > kMaxPlanGpus) {
    o.cp_degrees = {1};             // validate() names --gpus
  } else if (flags.cp == "auto") {  // every divisor of N (an N out of bounds is --gpus' error)
    for (std::int64_t c = 1; c <= std::min(o.gpus, kMaxPlanGpus); ++c)
      if (o.gpus % c == 0) o.cp_degrees.push_back(c);
    if (o.cp_degrees.empty()) o.cp_degrees.push_back(1);
  } else {
    for (const std::string& item : split_commas(flags.cp)) {
      const bool digits = !item.empty() && item.size() <= 9 &&
                          item.find_first_not_of("0123456789") == std::string::npos;
      const std::int64_t c = digits ? std::stoll(item) : 0;
      if (c < 1 || o.gpus % c != 0)
        throw InputError("--cp: '" + item + "' is not a context-parallel degree of --gpus " +
                         str(o.gpus) +
                         "; allowed: auto (every divisor of --gpus) or a comma list of divisors");
      if (std::find(o.cp_degrees.begin(), o.cp_degrees.end(), c) != o.cp_degrees.end())
        throw InputError("--cp: " + item + " is listed twice");
      o.cp_degrees.push_back(c);
    }
  }
  o.sharding = resolve_sharding(flags.sharding, flags.fsdp2 || hf);
  // FSDP2's layouts only: SHARD_GRAD_OP (stage 2 under per-parameter sharding) and FULL_SHARD
  if (flags.fsdp2 || hf) o.zero_stages = {2, 3};
  if (hf) {
    o.cp_degrees = {1};
    o.activation_offload = {false};
    o.offloads = {Offload::none};
    // One attention per profile; "flash" in the layout column for SDPA's memory-efficient
    // kernel, whose saved set the HF step models (docs/hf-step.md).
    o.attention = {flags.profile == "hf-sdpa" ? Attention::flash : Attention::eager};
    o.step_profile = flags.profile;
    o.step = "the HF step per rank under FSDP2 (--profile " + flags.profile +
             ", transformers 5.25, precision " + precision_name(*hf_options.precision) +
             ", AdamW " + adamw_impl_name(hf_options.adamw_impl) +
             "): data parallelism over every GPU, one micro-batch of G/N sequences per rank, "
             "FULL_SHARD and SHARD_GRAD_OP, checkpointing none or full (docs/plan.md)";
  }
  if (flags.top < 1) throw InputError("--top must be at least 1, got " + str(flags.top));
  o.top = static_cast<std::size_t>(flags.top);
  o.cost.tflops = flags.tflops;
  o.cost.link_gbps = flags.link_gbps;
  o.cost.pcie_gbps = flags.pcie_gbps;
  if (!flags.cuda_context.empty())
    o.overheads.cuda_context = parse_size(flags.cuda_context, "--cuda-context");
  if (!flags.nccl_memory.empty()) o.overheads.nccl = parse_size(flags.nccl_memory, "--nccl-memory");
  if (flags.nccl_channels < 1)
    throw InputError("--nccl-channels must be at least 1, got " + str(flags.nccl_channels));
  o.overheads.nccl_channels = flags.nccl_channels;
  const PlanResult r =
      hf ? plan(c.model, o,
                [&](const ModelConfig& m, const TrainConfig& t, const ParallelConfig& lay,
                    const OverheadOptions& ov) {
                  return hf_step_layout(m, t, lay, ov, hf_options, flags.profile == "hf-sdpa");
                })
         : plan(c.model, o);

  const auto w = report::make_writer(c.format, stdout_colour(c.output));
  report::write_plan(*w, r);
  write_output(c.output, w->str());
  return r.candidates.empty() ? 3 : 0;
}

}  // namespace

Runner register_plan(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "plan",
      "The fastest parallel layouts (dp/tp/pp, ZeRO, sp, checkpointing, micro-batch, "
      "offload) whose worst rank fits --gpu-memory");
  auto flags = std::make_shared<PlanFlags>();
  PlanFlags& f = *flags;
  cmd->add_option(
         "--model", f.model,
         "A preset (" +
             [] {
               std::string s;
               for (const auto& n : preset_names()) s += (s.empty() ? "" : ", ") + n;
               return s;
             }() +
             ") or a HuggingFace config.json path")
      ->capture_default_str();
  f.gpus_given =
      cmd->add_option("--gpus", f.gpus, "Number of GPUs N = dp·tp·pp·cp (required, >= 1)")
          ->check(integer_check<std::int64_t>("an integer; allowed: an integer >= 1"));
  cmd->add_option("--host-memory", f.host_memory,
                  "Host memory one rank may use for offloaded states and activations, a SIZE "
                  "(default: no limit)");
  cmd->add_option("--gpu-memory", f.gpu_memory,
                  "Memory of one GPU: a SIZE (80GiB, 24GB; required)");
  cmd->add_option("--seq", f.seq, "Sequence length s (>= 2)")
      ->check(integer_check<std::int64_t>("an integer; allowed: an integer >= 2"))
      ->capture_default_str();
  f.global_batch_given =
      cmd->add_option("--global-batch", f.global_batch,
                      "Sequences per optimizer step G = b·M·dp (required, >= 1)")
          ->check(integer_check<std::int64_t>("an integer; allowed: an integer >= 1"));
  cmd->add_option("--dtype", f.dtype, "Training dtype: bf16|fp16|fp32")->capture_default_str();
  cmd->add_option("--optimizer", f.optimizer, "The optimizer of every layout: adamw|sgd|lomo|all")
      ->capture_default_str();
  cmd->add_option("--checkpointing", f.checkpointing,
                  "The policies enumerated: a comma list of none, selective, every:K, full, "
                  "budget (the fewest first layers of every stage that fit, per layout)")
      ->capture_default_str();
  cmd->add_option("--activation-offload", f.activation_offload,
                  "off|on|both: layouts with --offload-activations (one GPU only)")
      ->capture_default_str();
  cmd->add_option("--cp", f.cp,
                  "Context-parallel degrees searched: auto (every divisor of --gpus) or a comma "
                  "list; cp > 1 with flash attention")
      ->capture_default_str();
  cmd->add_option("--sharding", f.sharding,
                  "How the ZeRO-3 layouts shard: flat (DeepSpeed, FSDP1; the default) or "
                  "per-parameter (PyTorch FSDP2)");
  cmd->add_option("--profile", f.profile,
                  "The step each layout runs: native (trainmem's own, the default) or hf-eager, "
                  "hf-sdpa (the HF step per rank under FSDP2: dp = --gpus, one micro-batch)")
      ->capture_default_str();
  cmd->add_option("--precision", f.precision,
                  "With --profile hf-eager|hf-sdpa: pure (the default: the model and AdamW's "
                  "moments in --dtype) or mixed (an fp32 model under MixedPrecisionPolicy)");
  cmd->add_flag("--fsdp2", f.fsdp2,
                "Only PyTorch FSDP2's layouts, sharded per parameter: FULL_SHARD and "
                "SHARD_GRAD_OP (reshard_after_forward=False)");
  cmd->add_option("--margin", f.margin,
                  "Fraction of --gpu-memory kept back: a layout fits within gpu-memory × (1 − "
                  "margin)")
      ->capture_default_str();
  cmd->add_option("--top", f.top, "How many of the fastest fitting layouts to show")
      ->check(integer_check<std::int64_t>("an integer; allowed: an integer >= 1"))
      ->capture_default_str();
  cmd->add_option("--tflops", f.tflops, "Achieved dense TFLOP/s per GPU (the cost model)")
      ->capture_default_str();
  cmd->add_option("--link-gbps", f.link_gbps,
                  "Gb/s per GPU for collectives and pipeline transfers (the cost model)")
      ->capture_default_str();
  cmd->add_option("--pcie-gbps", f.pcie_gbps, "Gb/s host <-> device for offload (the cost model)")
      ->capture_default_str();
  cmd->add_option("--cuda-context", f.cuda_context,
                  "Per-rank CUDA context bytes, a SIZE (default: the stated estimate)");
  cmd->add_option("--nccl-memory", f.nccl_memory,
                  "Per-rank NCCL buffer bytes, a SIZE (default: channels × peers × NCCL_BUFFSIZE)");
  cmd->add_option("--nccl-channels", f.nccl_channels,
                  "NCCL channels per communicator, for the NCCL buffer estimate")
      ->check(integer_check<std::int64_t>("an integer; allowed: an integer >= 1"))
      ->capture_default_str();
  add_finetune_flags(*cmd, f.finetune);
  cmd->add_option("--format", f.format, "table|json|csv|markdown")->capture_default_str();
  cmd->add_option("--output", f.output, "Write the report to FILE instead of stdout");
  add_log_level_flag(*cmd, f.log_level);
  return [flags] { return run_plan(*flags); };
}

}  // namespace trainmem::cli
