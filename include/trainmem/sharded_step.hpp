// One rank's sharded training step, traced on the meta backend: every tensor the rank would
// allocate (its share of the parameters, the ZeRO shards, the activations of its pipeline
// stage's micro-batches in the 1F1B order, the collective buffers) goes through the ledger in
// the order of docs/distributed.md ("The sharded step"); collectives are ops that allocate their
// buffers and move no data. The per-rank analytic profile (analytic_rank.hpp) must equal the
// ledger's figures byte for byte.
//
// Names: parameters use their HuggingFace names with the rank's shapes (q_proj (a/t·d, h), ...);
// the ZeRO flat tensors are `params.shard`, `grads.shard`, `shard.master`, `shard.exp_avg`,
// `shard.exp_avg_sq`; collective buffers (category communication) are `reduce_bucket`,
// `gathered.<unit>`, and under sp `<tensor>.gathered` / `<tensor>.partial`.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "trainmem/config.hpp"
#include "trainmem/ledger.hpp"
#include "trainmem/parallel.hpp"

namespace trainmem {

class ShardedStep {
 public:
  // Allocates the setup of pipeline stage `stage` of `layout` (resolved) in phase setup.
  ShardedStep(const ModelConfig& model, const TrainConfig& train, const ParallelConfig& layout,
              std::int64_t stage, Ledger& ledger);
  ~ShardedStep();
  ShardedStep(const ShardedStep&) = delete;
  ShardedStep& operator=(const ShardedStep&) = delete;

  // One optimizer step: ledger.begin_step, the stage's micro-batches in 1F1B order (the end of
  // forward is marked after the forward that precedes the first backward), the optimizer.
  void train_step();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainmem
