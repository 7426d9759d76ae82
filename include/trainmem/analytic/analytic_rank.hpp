// The native profile per rank when a training step is spread over several GPUs: the figures of
// each distinct rank of a parallel layout (include/trainmem/base/parallel.hpp), in closed form,
// from docs/distributed.md ("The sharded step") only. Ranks of one pipeline stage have identical
// books (tensor-parallel ranks hold equal shards; ZeRO pads the flat shard so every data-parallel
// rank holds the same count), so the distinct ranks are the pipeline stages.
//
// Beside the traced figures: what lives on the host under --offload, and the overheads outside
// every tensor book (CUDA context, NCCL buffers) as stated, overridable estimates.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/parallel.hpp"

namespace trainmem {

// Overheads outside the books (docs/distributed.md, "Outside the books").
struct OverheadOptions {
  std::optional<std::uint64_t> cuda_context;  // --cuda-context BYTES (default kCudaContextBytes)
  std::optional<std::uint64_t> nccl;          // --nccl-memory BYTES (default: the formula)
  std::uint64_t nccl_buffsize = 4194304;      // NCCL_BUFFSIZE (4 MiB default)
  std::int64_t nccl_channels = 16;            // --nccl-channels (channels per communicator)
  // The ranks run on the cpu backend (measured over MPI on host memory): no CUDA context, no
  // NCCL buffers, and the reports speak of ranks, not GPUs.
  bool host_ranks = false;
};
constexpr std::uint64_t kCudaContextBytes = 536870912;  // 512 MiB (0.3-0.55 GB reported)

struct Overheads {
  std::uint64_t cuda_context = 0;
  std::uint64_t nccl = 0;
  std::uint64_t total() const;
  std::string cuda_context_source;  // "default estimate (...)" or "--cuda-context"
  std::string nccl_source;          // the formula with its numbers, or "--nccl-memory"
  bool host_ranks = false;          // OverheadOptions::host_ranks: both 0
  // "GPUs", or "ranks" for host ranks (the reports' word for the layout's processes).
  const char* unit_word() const { return host_ranks ? "ranks" : "GPUs"; }
};
// The overheads of one rank of `layout` (0 NCCL bytes for a single GPU); `moe`: the model is a
// mixture of experts (under tp its experts' gradients have a group of their own even at ep 1).
Overheads estimate_overheads(const ParallelConfig& layout, const OverheadOptions& opts,
                             bool moe = false);

// The figures of one distinct rank (a pipeline stage; every dp and tp rank of it is identical).
struct RankEstimate {
  std::int64_t stage = 0;              // pipeline stage (0 = first)
  std::string role;                    // "only", "first", "middle", "last"
  std::int64_t ranks = 0;              // ranks with these figures (dp·tp)
  std::int64_t layers = 0;             // layers on this stage (L/pp)
  std::int64_t in_flight = 1;          // micro-batches whose activations are alive at the peak
  std::uint64_t local_params = 0;      // parameters the stage holds before ZeRO (TP-sharded)
  std::uint64_t shard_elements = 0;    // the ZeRO flat shard, padded (= local_params when zero 0)
  std::uint64_t padding_elements = 0;  // shard·dp − local_params
  // The elements the optimizer states cover: the shard (flat ZeRO >= 1; every rank alike), or
  // under per-parameter sharding the rows this rank owns, unpadded (rank `grad_rank` of the
  // gradient group; rank 0 owns the most).
  std::uint64_t owned_elements = 0;
  // A mixture of experts: the routed experts' parameters in a flat vector of their own, sharded
  // by ZeRO >= 1 over the expert-data-parallel ranks (docs/distributed.md, "Mixture of experts
  // per rank"); local_params counts them too, shard_elements and padding_elements are the other
  // parameters' vector. 0 for a dense model.
  std::uint64_t expert_params = 0;
  std::uint64_t expert_shard_elements = 0;    // padded (= expert_params when zero 0)
  std::uint64_t expert_padding_elements = 0;  // expert shard·edp − expert_params
  std::int64_t grad_rank = 0;
  Estimate est;  // figures per category (communication included), instants
  std::vector<TensorEntry> communication;  // the collective buffers the stage allocates
  std::uint64_t host_bytes = 0;            // --offload: what the rank keeps in host memory
  std::vector<TensorEntry> host;           // what those host bytes are
};

struct LayoutEstimate {
  ParallelConfig layout;
  ModelConfig model;
  TrainConfig train;                // batch = micro-batch size b
  std::uint64_t global_batch = 0;   // b · M · dp
  std::vector<RankEstimate> ranks;  // distinct ranks, stage order
  int worst = 0;                    // index of the rank with the largest peak (first on ties)
  Overheads overheads;
  std::uint64_t worst_total() const;  // worst rank's peak + overheads
};

// The native per-rank profile of `layout` (already resolved: ParallelConfig::resolve).
// A layout of one GPU is estimate(Profile::native, ...): the same code (analytic_native.cpp).
// Under per-parameter sharding the ranks of a stage differ in their optimizer states:
// estimate_layout's books are gradient-group rank 0's (it owns the most rows: the worst), and
// estimate_layout_of_rank's rank `grad_rank`'s.
LayoutEstimate estimate_layout(const ModelConfig& model, const TrainConfig& train,
                               const ParallelConfig& layout, const OverheadOptions& overheads = {});
LayoutEstimate estimate_layout_of_rank(const ModelConfig& model, const TrainConfig& train,
                                       const ParallelConfig& layout, std::int64_t grad_rank,
                                       const OverheadOptions& overheads = {});

}  // namespace trainmem
