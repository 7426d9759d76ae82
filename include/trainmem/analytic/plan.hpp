// `trainmem plan`: the cheapest parallel layout that fits. Enumerates the layouts of a training
// job over N GPUs (dp·tp·pp·cp = N, ZeRO stage, sequence parallelism, checkpointing, attention,
// optimizer, micro-batch size b with b·M·dp = G, offload), keeps those whose worst rank fits
// the GPU's memory less a margin (the per-rank figures of estimate_layout, analytic_rank.hpp),
// and ranks them by a simple, documented step-time model (docs/plan.md, "plan: the cost
// model"): compute at a stated TFLOP/s, communication over a stated link, PCIe for offload, no
// overlap.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/base/parallel.hpp"

namespace trainmem {

// The cost model's rates (docs/plan.md). Defaults are stated there.
struct CostModel {
  double tflops = 160.0;     // --tflops: achieved dense TFLOP/s per GPU (400 peak × 0.4)
  double link_gbps = 400.0;  // --link-gbps: Gb/s per GPU for every collective and p2p transfer
  double pcie_gbps = 256.0;  // --pcie-gbps: Gb/s host <-> device (offload), PCIe 4.0 x16
};

// The step time of one layout, term by term (docs/plan.md). Bytes are what one GPU sends
// per optimizer step; seconds are bytes / rate; total = compute + communication + pcie.
struct StepCost {
  double flops_per_gpu = 0;  // (6 + 2r)·P·T + (12 + 4r)·L·h·s·T, ÷ N (r = 1 under recompute;
                             // a mixture of experts: its active parameters in place of P)
  double bubble = 0;         // (pp − 1) / M
  double compute_seconds = 0;  // flops_per_gpu / tflops × (1 + bubble)
  double dp_bytes = 0;         // gradient reduction and ZeRO gathers
  double tp_bytes = 0;         // tensor-parallel all-reduces (or sp's reduce-scatter+all-gather)
  double pp_bytes = 0;         // pipeline p2p: activations forward, their gradients backward
  double cp_bytes = 0;         // context parallelism: ring attention's key/value blocks and
                               // their gradients
  double ep_bytes = 0;         // expert parallelism: the MoE layers' all-to-alls (dispatch and
                               // combine, forward, backward and recompute)
  double pcie_bytes = 0;       // offload: gradients down, parameters up (and ZeRO-3 fetches);
                               // activation offload: each micro-batch's sets out and back
  double communication_seconds = 0;  // (dp + tp + pp + cp + ep bytes) / link
  double pcie_seconds = 0;           // pcie_bytes / pcie link
  double total_seconds = 0;
};

// The cost of one layout: `train` carries b (train.batch), s, dtype and checkpointing;
// `layout` dp, tp, pp, cp, ZeRO stage, sp, M (microbatches) and offload.
StepCost step_cost(const ModelConfig& model, const TrainConfig& train, const ParallelConfig& layout,
                   const CostModel& cost);

// The per-rank memory of one layout: estimate_layout, or a stand-in in tests.
using LayoutEstimator = std::function<LayoutEstimate(
    const ModelConfig&, const TrainConfig&, const ParallelConfig&, const OverheadOptions&)>;

// Bounds that keep the search's run time bounded whatever the flags (docs/plan.md): the
// layouts are the divisors of --gpus, the micro-batch sizes those of --global-batch / dp.
constexpr std::int64_t kMaxPlanGpus = 65536;
constexpr std::int64_t kMaxPlanGlobalBatch = std::int64_t{1} << 24;

// One checkpointing policy plan enumerates (docs/plan.md, "Checkpointing policies"): none,
// selective, every:K, full, or budget: for each setting and micro-batch size, the fewest first
// layers of every pipeline stage whose worst rank fits (what `--checkpointing budget:SIZE`
// picks), so its recompute is the least any prefix of layers allows.
struct PlanPolicy {
  enum class Kind { none, selective, every, full, budget };
  Kind kind = Kind::none;
  std::int64_t k = 0;  // every:K
  static PlanPolicy every(std::int64_t k) { return {Kind::every, k}; }
  std::string name() const;  // "none", "selective", "every:2", "full", "budget"
  // Sets train's checkpointing to this policy for `model` split over `pp` stages. budget: the
  // first `first` layers of every stage (0: none, all of them: full), named after `budget`
  // bytes ("budget:76GiB (layers 0-5)"). Returns false when the policy checkpoints nothing
  // different from none or full (every:K with K above the layers: no layer).
  bool apply(TrainConfig& train, const ModelConfig& model, std::int64_t pp, std::int64_t first = 0,
             std::uint64_t budget = 0) const;
};

// --checkpointing for plan: a comma list of none, selective, every:K (K >= 2), full, budget
// (InputError naming the flag and what is allowed otherwise).
std::vector<PlanPolicy> parse_plan_policies(const std::string& text);

struct PlanOptions {
  std::int64_t gpus = 1;         // N (--gpus)
  std::uint64_t gpu_memory = 0;  // bytes per GPU (--gpu-memory)
  double margin = 0.05;          // --margin: kept back from gpu_memory
  // --host-memory: host bytes one rank may hold (ZeRO offload, activation offload); 0: no limit.
  std::uint64_t host_memory = 0;
  std::int64_t seq = 512;         // s (--seq)
  std::int64_t global_batch = 1;  // G (--global-batch): sequences per optimizer step
  DType dtype = DType::bf16;      // --dtype
  // The choices enumerated (the CLI fixes the optimizer with --optimizer; tests narrow others).
  std::vector<Optimizer> optimizers = {Optimizer::adamw};
  // The fine-tune every layout trains (--finetune and the LoRA flags): only its LoRA and
  // quantization fields are read (docs/distributed.md, "LoRA per rank"); a full fine-tune by
  // default.
  TrainConfig finetune;
  std::vector<int> zero_stages = {0, 1, 2, 3};
  // How the ZeRO-3 layouts shard (--sharding, --fsdp2): per_parameter as FSDP2 does, without
  // offload (docs/distributed.md, "FSDP2: per-parameter sharding").
  Sharding sharding = Sharding::flat;
  std::vector<PlanPolicy> policies = {{PlanPolicy::Kind::none},
                                      {PlanPolicy::Kind::selective},
                                      PlanPolicy::every(2),
                                      {PlanPolicy::Kind::full},
                                      {PlanPolicy::Kind::budget}};
  // --offload-activations off and on: on is enumerated without pipeline parallelism (pp 1).
  std::vector<bool> activation_offload = {false, true};
  std::vector<Attention> attention = {Attention::flash, Attention::eager};
  std::vector<Offload> offloads = {Offload::none, Offload::optimizer, Offload::optimizer_params};
  // The context-parallel degrees searched (those dividing N; cp > 1 with flash attention only).
  // {1}: none; the CLI's --cp auto is every divisor of N.
  std::vector<std::int64_t> cp_degrees = {1};
  // --profile hf-eager|hf-sdpa: the layouts the HF step per rank under FSDP2 models
  // (docs/plan.md, "The HF step"): data parallelism alone (dp = N, no tp, pp, cp or expert
  // parallelism) and one micro-batch (b = G/N); `step_profile` is its profile ("native" for
  // trainmem's own step) and `step` describes it in the report ("" for trainmem's own). The
  // estimator passed to plan() computes it.
  std::string step_profile = "native";
  std::string step;
  bool hf_step() const { return step_profile != "native"; }
  std::size_t top = 10;  // --top K: candidates whose memory is estimated and returned
  CostModel cost;
  OverheadOptions overheads;  // --cuda-context, --nccl-memory
  // Checks the options; InputError naming the flag (--gpus, --gpu-memory, --margin, --seq,
  // --global-batch, --top, --tflops, --link-gbps, --pcie-gbps).
  void validate() const;
  // gpu_memory × (1 − margin): gpu_memory less gpu_memory × margin rounded to the nearest
  // byte. A layout fits when its worst rank's peak + overheads is at most this.
  std::uint64_t budget() const;
};

// One layout, with its cost; `memory` is estimated for the returned candidates.
struct PlanCandidate {
  ParallelConfig layout;  // resolved: dp, tp, pp, zero, sp, microbatches M, offload
  TrainConfig train;      // batch = micro-batch size b; seq, dtype, optimizer, ckpt, attention
  StepCost cost;
  std::optional<LayoutEstimate> memory;
};

// A family of layouts (one dp × tp × pp × cp with one ZeRO stage) of which none fits.
struct RejectedFamily {
  std::int64_t dp = 1, tp = 1, pp = 1, cp = 1, ep = 1, etp = 1;
  int zero = 0;
  std::uint64_t layouts = 0;  // layouts of the family enumerated
  std::uint64_t invalid = 0;  // of which ParallelConfig::resolve (or the estimate) refused
  // Every layout invalid: the distinct messages, "does not divide the model: ..." (a
  // divisibility check failed) or "not supported: ..." (any other check).
  std::vector<std::string> messages;
  // Some layouts valid, none fitting: the smallest worst-rank peak + overheads among them and
  // the layout that has it (memory is monotone in b: it is each setting's smallest b).
  std::uint64_t smallest_worst_total = 0;
  std::optional<PlanCandidate> smallest;
  bool too_big() const { return invalid < layouts; }
};

struct PlanResult {
  PlanOptions options;
  ModelConfig model;
  std::uint64_t budget = 0;               // options.budget()
  std::vector<PlanCandidate> candidates;  // the best `top`, fastest first, memory estimated
  // Counts over the whole enumeration (layouts: one per setting and micro-batch size b).
  std::uint64_t enumerated = 0;
  std::uint64_t invalid = 0;  // refused by ParallelConfig::resolve or the estimate
  std::uint64_t fitting = 0;  // valid and fitting (all ranked; `candidates` are the first)
  std::uint64_t too_big = 0;  // valid, not fitting
  // Fitting budget layouts whose fewest layers are none or every layer: the none or full
  // layout, listed once under that policy (enumerated = fitting + too_big + invalid + this).
  std::uint64_t same_as_none_or_full = 0;
  std::uint64_t estimates = 0;           // calls of the estimator (the search skips most layouts)
  std::vector<RejectedFamily> rejected;  // enumeration order
  double estimate_seconds = 0;           // time inside the estimator
  double total_seconds = 0;
};

// Runs the enumeration (docs/plan.md, "What is enumerated"). Throws InputError naming the
// flag for invalid options, and naming --global-batch when no data-parallel degree possible
// for the model on N GPUs divides G. `estimator` defaults to estimate_layout.
PlanResult plan(const ModelConfig& model, const PlanOptions& options,
                const LayoutEstimator& estimator = estimate_layout);

// "dp 8 tp 1 pp 1 ZeRO-0" ("dp 4 tp 1 pp 1 cp 2 ZeRO-0" when cp > 1, "... ep 8 ZeRO-1" when
// ep > 1, "... ep 4 etp 2 ZeRO-1" when etp > 1)
std::string family_name(std::int64_t dp, std::int64_t tp, std::int64_t pp, int zero,
                        std::int64_t cp = 1, std::int64_t ep = 1, std::int64_t etp = 1);

}  // namespace trainmem
