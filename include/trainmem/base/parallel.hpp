// The parallel layout of a training job spread over several GPUs (docs/distributed.md): data
// parallelism with ZeRO stages 0-3, tensor parallelism (with or without sequence parallelism),
// pipeline parallelism with the 1F1B schedule, CPU offload, and the collective buffers' sizes.
// context parallelism (the sequence split over cp ranks, ring attention).
// Letters: N world size, dp/tp/pp/cp the degrees (dp·tp·pp·cp = N), M micro-batches per step.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "trainmem/base/config.hpp"

namespace trainmem {

enum class Offload { none, optimizer, optimizer_params };
const char* offload_name(Offload o);  // "none", "optimizer", "optimizer+params"
std::optional<Offload> parse_offload(const std::string& s);

// How ZeRO-3 splits the parameters, gradients and optimizer states over the gradient group
// (docs/distributed.md, "FSDP2: per-parameter sharding"). flat: one flat vector of every
// parameter padded at its end and cut into equal slices (DeepSpeed, FSDP1). per_parameter: each
// parameter split on dim 0 as PyTorch FSDP2's fully_shard does (--sharding per-parameter,
// --fsdp2): rank k owns rows [k·c, min((k+1)·c, r)) of a parameter of r rows, c = ceil(r/N),
// stores every parameter and gradient padded to c rows, and its optimizer states unpadded.
enum class Sharding { flat, per_parameter };
const char* sharding_name(Sharding s);  // "flat", "per-parameter"
std::optional<Sharding> parse_sharding(const std::string& s);
// FSDP2's dim-0 chunks (torch.chunk): the padded rows every rank stores, ceil(rows/n), and the
// rows rank k owns, max(0, min(c, rows − k·c)) (the last ranks may own none).
std::uint64_t shard_chunk_rows(std::uint64_t rows, std::uint64_t n);
std::uint64_t shard_owned_rows(std::uint64_t rows, std::uint64_t n, std::uint64_t k);

// DeepSpeed's default (deepspeed/runtime/zero/config.py), in elements. Its allgather bucket
// costs no bytes here: the sharded step gathers updated parameters in place.
constexpr std::uint64_t kDefaultReduceBucket = 500000000;  // reduce_bucket_size 5e8

// --microbatches' upper bound (the traces walk every micro-batch of the 1F1B schedule).
constexpr std::int64_t kMaxMicrobatches = 16384;

struct ParallelConfig {
  std::int64_t world = 1;  // N (--world-size)
  std::int64_t dp = 1;     // data-parallel degree (--dp; default N / (tp·pp))
  std::int64_t tp = 1;     // tensor-parallel degree (--tp)
  std::int64_t pp = 1;     // pipeline stages (--pp)
  std::int64_t cp = 1;     // context-parallel degree (--cp): the sequence split cp ways
  // Expert parallelism (a mixture of experts only; docs/distributed.md, "Mixture of experts per
  // rank"): --ep places E/ep whole routed experts on each rank, --etp splits each expert's width
  // etp ways. Both are carved from the dp·tp·cp ranks of a stage, as Megatron's expert groups
  // are; the rest, edp = dp·tp·cp/(ep·etp), is the expert-data-parallel group that sums the
  // experts' gradients and over which ZeRO shards their states.
  std::int64_t ep = 1;
  std::int64_t etp = 1;
  int zero = 0;                   // --zero 0|1|2|3 (FSDP: SHARD_GRAD_OP = 2, FULL_SHARD = 3)
  bool sp = false;                // --sp: sequence parallelism inside the tensor-parallel group
  std::int64_t microbatches = 1;  // M (--microbatches): per optimizer step, per pipeline
  Offload offload = Offload::none;
  std::uint64_t reduce_bucket = kDefaultReduceBucket;  // --reduce-bucket (elements)
  bool overlap_comm = false;  // --overlap-comm: a second reduce bucket (DeepSpeed overlap_comm)
  std::int64_t prefetch = 1;  // --prefetch: ZeRO-3 units gathered ahead of the one computing
  Sharding sharding = Sharding::flat;  // --sharding (ZeRO-3 only for per_parameter)
  // Per-parameter sharding: FSDP2's reshard_after_forward on the layers (--fsdp2 --zero
  // SHARD_GRAD_OP sets it false: a layer stays gathered from its forward to its backward).
  bool reshard_after_forward = true;
  bool per_parameter() const { return sharding == Sharding::per_parameter; }

  bool distributed() const { return world > 1; }
  // The ranks that hold the same parameters and sum their gradients: the data-parallel ranks
  // times the context-parallel ones (each holds other tokens of the batch). ZeRO shards over
  // them, as Megatron's distributed optimizer shards over its data-parallel-with-cp group.
  std::int64_t grad_ranks() const { return dp * cp; }
  // The expert-data-parallel degree: the ranks of a stage that hold the same experts.
  std::int64_t edp() const { return dp * tp * cp / (ep * etp); }
  // The sequence rows one rank holds: s/cp (s when cp is 1).
  std::int64_t local_seq(std::int64_t seq) const { return seq / cp; }
  // Fills dp from world / (tp·pp·cp) when `dp_given` is false, then checks the layout against
  // the model and the run. InputError naming the flag (--world-size, --dp, --tp, --pp, --cp,
  // --zero, --sp, --microbatches, --offload, --prefetch, --reduce-bucket, --sharding) and what is
  // allowed.
  void resolve(bool dp_given, const ModelConfig& model, const TrainConfig& train);
  // "dp 2 × tp 4 × pp 1, ZeRO-3, sp, M 1, offload none" ("× cp 2" after pp when cp > 1, and
  // "× ep 2 × etp 1 (edp 2)" after them when ep·etp > 1)
  std::string describe() const;
};

// LoRA under a parallel layout (docs/distributed.md, "LoRA per rank"): InputError naming the
// flags for what the sharded step does not model (a 4-bit base, ZeRO-3, sp, dropout under tp);
// nothing on one GPU. resolve() calls it; so do the sharded step and the per-rank profile.
void check_lora_layout(const ParallelConfig& layout, const TrainConfig& train);

// A mixture of experts under a parallel layout: InputError naming the flags for what the sharded
// step does not model yet (tensor parallelism, ZeRO-3 and FSDP2, offload, a capacity factor, the
// load-balancing loss, expert parallelism itself, --ep/--etp above 1) and for --ep/--etp on a
// dense model or degrees that do not divide the experts, their width or the stage's ranks.
// resolve() calls it; so do the sharded step and the per-rank profile.
void check_moe_layout(const ParallelConfig& layout, const ModelConfig& model,
                      const TrainConfig& train);

// "1" / "2" / "3" / "0", or FSDP's names: "FULL_SHARD" (3), "SHARD_GRAD_OP" (2), "NO_SHARD" (0).
std::optional<int> parse_zero(const std::string& s);

}  // namespace trainmem
