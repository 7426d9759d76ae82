// The parallel-layout flags and the per-rank report of `estimate` (src/cli/layout.hpp).
#include "layout.hpp"

#include <cmath>

#include "size.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem::cli {

using nlohmann::json;

void add_layout_flags(CLI::App& cmd, LayoutFlags& f) {
  cmd.add_option("--world-size", f.world,
                 "GPUs the step is spread over, N = dp·tp·pp·cp (default 1)")
      ->check(integer_check<std::int64_t>("a whole number of GPUs"));
  cmd.add_option("--dp", f.dp, "Data-parallel degree (default N / (tp·pp·cp))")
      ->check(integer_check<std::int64_t>("a whole number"));
  cmd.add_option("--tp", f.tp, "Tensor-parallel degree (default 1)")
      ->check(integer_check<std::int64_t>("a whole number"));
  cmd.add_option("--pp", f.pp, "Pipeline stages, 1F1B schedule (default 1)")
      ->check(integer_check<std::int64_t>("a whole number"));
  cmd.add_option("--cp", f.cp,
                 "Context-parallel degree: the sequence split over cp ranks, ring attention "
                 "(default 1; needs --attention flash)")
      ->check(integer_check<std::int64_t>("a whole number"));
  cmd.add_option("--ep", f.ep,
                 "Expert-parallel degree of a mixture of experts: E/ep whole experts per rank "
                 "(default 1)")
      ->check(integer_check<std::int64_t>("a whole number"));
  cmd.add_option("--etp", f.etp,
                 "Expert tensor-parallel degree: each expert's width split etp ways (default 1)")
      ->check(integer_check<std::int64_t>("a whole number"));
  cmd.add_option(
      "--zero", f.zero,
      "ZeRO stage over the data-parallel (× context-parallel) ranks: 0, 1 (optimizer states), 2 (+ "
      "gradients; FSDP SHARD_GRAD_OP; with --fsdp2: reshard_after_forward=False), 3 (+ "
      "parameters; FSDP FULL_SHARD)");
  cmd.add_flag("--sp", f.sp, "Sequence parallelism inside the tensor-parallel group (needs --tp)");
  cmd.add_option("--microbatches", f.microbatches,
                 "Micro-batches per optimizer step (M; the pipeline's in-flight count)")
      ->check(integer_check<std::int64_t>("a whole number"));
  cmd.add_option("--offload", f.offload,
                 "none | optimizer (ZeRO >= 1) | optimizer+params (ZeRO-3): kept in host memory");
  cmd.add_option(
      "--reduce-bucket", f.reduce_bucket,
      "ZeRO-2/3 reduce bucket in elements (DeepSpeed's reduce_bucket_size, default 5e8)");
  cmd.add_flag("--overlap-comm", f.overlap_comm, "A second reduce bucket (DeepSpeed overlap_comm)");
  cmd.add_option("--prefetch", f.prefetch,
                 "ZeRO-3: units (layers) gathered ahead of the one computing (default 1)")
      ->check(integer_check<std::int64_t>("a whole number"));
  cmd.add_option("--sharding", f.sharding,
                 "ZeRO-3's split: flat (one padded flat vector, DeepSpeed / FSDP1; the default) or "
                 "per-parameter (each parameter on dim 0, PyTorch FSDP2's fully_shard)");
  cmd.add_flag("--fsdp2", f.fsdp2,
               "PyTorch FSDP2 (fully_shard): --sharding per-parameter with --zero 3 (FULL_SHARD)");
  cmd.add_option("--cuda-context", f.cuda_context,
                 "CUDA context per GPU, outside the books (default estimate 512MiB)");
  cmd.add_option("--nccl-memory", f.nccl_memory,
                 "NCCL buffers per GPU, outside the books (default: communicators × channels × "
                 "2 × NCCL_BUFFSIZE)");
  cmd.add_option("--nccl-channels", f.nccl_channels, "NCCL channels per communicator (default 16)")
      ->check(integer_check<std::int64_t>("a whole number"));
}

namespace {

std::uint64_t parse_elements(const std::string& text, const char* flag) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(v >= 1) || v > 1e18 ||
      std::floor(v) != v)
    throw InputError(std::string(flag) + ": '" + text +
                     "' is not a whole number of elements (e.g. 500000000 or 5e8)");
  return static_cast<std::uint64_t>(v);
}

}  // namespace

Sharding resolve_sharding(const std::string& sharding, bool fsdp2) {
  Sharding out = Sharding::flat;
  if (!sharding.empty()) {
    const auto sh = parse_sharding(sharding);
    if (!sh)
      throw InputError("--sharding: '" + sharding +
                       "' is not allowed; allowed: flat, per-parameter (FSDP2)");
    out = *sh;
  }
  if (fsdp2 && !sharding.empty() && out != Sharding::per_parameter)
    throw InputError("--fsdp2 with --sharding " + sharding +
                     ": FSDP2 shards per parameter; drop one of the two");
  return fsdp2 ? Sharding::per_parameter : out;
}

ParallelConfig resolve_layout(const LayoutFlags& f, const ModelConfig& model,
                              const TrainConfig& train) {
  ParallelConfig p;
  p.world = f.world;
  p.dp = f.dp;
  p.tp = f.tp;
  p.pp = f.pp;
  p.cp = f.cp;
  p.ep = f.ep;
  p.etp = f.etp;
  const auto zero = parse_zero(f.zero);
  if (!zero)
    throw InputError("--zero: '" + f.zero +
                     "' is not a stage; allowed: 0, 1, 2, 3 (or FSDP's NO_SHARD, SHARD_GRAD_OP, "
                     "FULL_SHARD)");
  p.zero = *zero;
  p.sp = f.sp;
  p.microbatches = f.microbatches;
  const auto off = parse_offload(f.offload);
  if (!off)
    throw InputError("--offload: '" + f.offload +
                     "' is not allowed; allowed: none, optimizer, "
                     "optimizer+params");
  p.offload = *off;
  if (!f.reduce_bucket.empty())
    p.reduce_bucket = parse_elements(f.reduce_bucket, "--reduce-bucket");
  p.overlap_comm = f.overlap_comm;
  p.prefetch = f.prefetch;
  p.sharding = resolve_sharding(f.sharding, f.fsdp2);
  if (f.fsdp2) {
    if (f.zero != "0" && p.zero != 3 && p.zero != 2)
      throw InputError("--fsdp2 with --zero " + f.zero +
                       ": FSDP2 shards the parameters: FULL_SHARD (--zero 3, the default) or "
                       "SHARD_GRAD_OP (--zero 2: reshard_after_forward=False)");
    if (p.zero != 2) p.zero = 3;
  }
  // FSDP2's SHARD_GRAD_OP: the parameters sharded at rest, a layer kept gathered from its forward
  // to its backward (fully_shard(layer, reshard_after_forward=False)).
  if (p.per_parameter() && p.zero == 2) {
    p.zero = 3;
    p.reshard_after_forward = false;
  }
  if (f.nccl_channels < 1)
    throw InputError("--nccl-channels must be at least 1, got " + std::to_string(f.nccl_channels));
  p.resolve(f.dp != 0, model, train);
  return p;
}

OverheadOptions resolve_overheads(const LayoutFlags& f) {
  OverheadOptions o;
  if (!f.cuda_context.empty()) o.cuda_context = parse_size(f.cuda_context, "--cuda-context");
  if (!f.nccl_memory.empty()) o.nccl = parse_size(f.nccl_memory, "--nccl-memory");
  o.nccl_channels = f.nccl_channels;
  return o;
}

void check_hf_fsdp2_layout(const std::string& profile, const ParallelConfig& par) {
  constexpr std::int64_t kMaxRanks = 1 << 20;
  if (par.world > kMaxRanks)
    throw InputError("--world-size: the HF step per rank under FSDP2 models up to " +
                     std::to_string(kMaxRanks) + " ranks; got " + std::to_string(par.world));
  // DeepSpeed's knobs and the native step's prefetch window: FSDP2's recipe has none of them.
  const char* knob = par.prefetch != 1                           ? "--prefetch"
                     : par.reduce_bucket != kDefaultReduceBucket ? "--reduce-bucket"
                     : par.overlap_comm                          ? "--overlap-comm"
                                                                 : nullptr;
  if (knob)
    throw InputError(std::string(knob) + " with --profile " + profile +
                     ": the HF step under FSDP2 runs fully_shard's own schedule (one unit "
                     "prefetched in backward, no reduce bucket); not a setting it takes");
  if (!par.per_parameter() || par.zero != 3 || par.tp != 1 || par.pp != 1 || par.cp != 1 ||
      par.offload != Offload::none || par.microbatches != 1 || par.dp != par.world)
    throw InputError("--profile " + profile +
                     ": with --world-size above 1 the HF step is modelled per rank under "
                     "PyTorch FSDP2 over data parallelism alone: --fsdp2 (FULL_SHARD), or "
                     "--fsdp2 --zero 2 (reshard_after_forward=False), no --tp/--pp/--cp, "
                     "--offload or --microbatches; got " +
                     par.describe());
}

void check_layout_request(const Common& c, bool explain, bool paper, bool policy_list) {
  if (c.optimizers.size() != 1)
    throw InputError(
        "--optimizer all: with --world-size above 1 give one optimizer (adamw or sgd)");
  if (c.checkpointing_modes.size() != 1 && !policy_list)
    throw InputError(
        "--checkpointing: with --world-size above 1 give one policy (none, full, every:K, "
        "layers:LIST or budget:SIZE), not a list");
  for (const auto& p : c.profiles)
    if (p != "native" && p != "hf-eager" && p != "megatron" && p != "zero" &&
        // LoRA's and a mixture of experts' "all": per rank, native alone.
        !((p == "hf-peft" || p == "hf-sdpa") && c.profiles_all))
      throw InputError("--profile " + p +
                       ": with --world-size above 1 the per-rank profile is "
                       "native (the default)");
  if (c.profiles.size() == 1 && c.profiles.front() != "native")
    throw InputError("--profile " + c.profiles.front() +
                     ": with --world-size above 1 the per-rank profile is native (the default)");
  if (c.train.lora()) {
    // The flags that key only the hf-peft profile, which models one GPU.
    const PeftOptions& pf = c.hf.peft;
    const char* only_hf = !pf.peft_version.empty()  ? "--peft-version"
                          : !pf.bnb_version.empty() ? "--bnb-version"
                          : !pf.adapters_fp32       ? "--lora-dtype model"
                          : !pf.kbit_prepare        ? "--kbit-prepare off"
                                                    : nullptr;
    if (only_hf)
      throw InputError(std::string(only_hf) +
                       ": it keys the hf-peft profile, which models one GPU; with --world-size "
                       "above 1 the per-rank profile is trainmem's own LoRA step (native)");
  }
  if (explain) throw InputError("--explain: not yet available with --world-size above 1");
  if (paper) throw InputError("--paper: a single-GPU table; not with --world-size above 1");
}

}  // namespace trainmem::cli
