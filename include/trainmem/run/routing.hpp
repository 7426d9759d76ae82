// A mixture of experts' routing as data (issue 29, point 3; docs/native-plan.md, "Routing as
// data"): the choices routed to each expert per layer, measured by a run that computes
// (RunResult::routing), or given to the meta trace: balanced, or a file `profile --dump-routing`
// wrote. No byte of trainmem's step depends on it; under --capacity-factor the choices each
// expert drops do (min(routed, capacity) kept, in token order).
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "trainmem/base/config.hpp"
#include "trainmem/base/parallel.hpp"
#include "trainmem/model/sharded_step.hpp"

namespace trainmem {

// One MoE layer's routing: its global index, the choices routed to each expert, and how many of
// them a capacity dropped.
struct LayerRoutingRecord {
  std::int64_t layer = 0;
  std::vector<std::int64_t> tokens_per_expert;
  std::int64_t dropped = 0;
  bool operator==(const LayerRoutingRecord& o) const {
    return layer == o.layer && tokens_per_expert == o.tokens_per_expert && dropped == o.dropped;
  }
};
using Routing = std::vector<LayerRoutingRecord>;  // the MoE layers, ascending

// The b·s·K choices of each MoE layer spread evenly: b·s·K / E each, the first (b·s·K mod E)
// experts one more; dropped as the capacity drops them.
Routing balanced_routing(const ModelConfig& m, const TrainConfig& t);

// A routing file as `profile --dump-routing` writes it (docs/output-formats.md), checked against
// the run it is given to: its experts, experts_per_token, batch and seq are the run's, one entry
// per MoE layer in order (its "layer" the global index), each expert's count an integer in
// [0, b·s] (a token picks K distinct experts) and each layer's sum b·s·K; dropped as the run's
// capacity drops them. InputError "--routing PATH: <field>: ..." otherwise.
Routing read_routing_file(const std::string& path, const ModelConfig& m, const TrainConfig& t);

// ---- per rank (expert parallelism, docs/distributed.md "Routing per rank")

// What one rank of a layout (a "source") routed in one micro-batch: the choices its b·s/cp
// tokens (b·s/(cp·tp) under sequence parallelism) sent to every global expert in each MoE layer of
// its pipeline stage.
struct SourceRouting {
  std::int64_t rank = 0;         // the global rank (Megatron's order)
  std::int64_t micro_batch = 0;  // 0 .. M-1
  Routing layers;                // its stage's MoE layers, ascending
};

// Every source of a layout, by (rank, micro_batch) ascending, or none (balanced routing).
struct LayoutRouting {
  std::string source = "balanced";  // "balanced", "file PATH", "measured"
  std::vector<SourceRouting> sources;
  bool given() const { return !sources.empty(); }
};

// A routing file for a layout (resolved; under tp each tensor-parallel rank is a source): the
// per-rank form a
// measured multi-rank `profile --dump-routing` writes (its "sources"; world_size, pp, cp and
// microbatches must be the layout's, its ep may differ: the choices a rank makes do not depend
// on where the experts live), or the one-rank form, applied to every rank and micro-batch when
// its batch and seq are a rank's (b and s/cp, s/(cp·tp) under sequence parallelism). InputError
// "--routing PATH: <field>: ...".
LayoutRouting read_layout_routing_file(const std::string& path, const ModelConfig& m,
                                       const TrainConfig& t, const ParallelConfig& layout);

// Balanced routing per rank: every source spreads its own b·(s/cp)·K choices (s/(cp·tp) under
// sequence parallelism) as
// balanced_routing does, in every micro-batch (what the analytic and a trace assume).
LayoutRouting balanced_layout_routing(const ModelConfig& m, const TrainConfig& t,
                                      const ParallelConfig& layout);

// The per-rank file's document (docs/output-formats.md "Routing per rank").
nlohmann::json layout_routing_json(const ModelConfig& m, const TrainConfig& t,
                                   const ParallelConfig& layout, const LayoutRouting& r, int step);

// The rows the experts of `rank` receive under `r`, by (micro-batch, global layer): `a` the
// choices of every rank of its expert-parallel group (the ep slots of its stage with its
// expert-data-parallel and expert-tensor-parallel indices) for its E/ep experts, `r` those of
// the ep·etp slots with its expert-data-parallel index (its etp group's a; r = a at etp 1).
// Under --capacity-factor each source sends at most `capacity` choices per expert (the
// rank's capacity, rank_capacity; 0: all of them). What ShardedStep::set_expert_rows takes.
ShardedStep::ExpertRows expert_rows_of(const LayoutRouting& r, const ModelConfig& m,
                                       const ParallelConfig& layout, std::int64_t rank,
                                       std::int64_t capacity);

// A rank's expert capacity under --capacity-factor, over its own b·s/cp tokens (/tp under
// sequence parallelism); 0 without one.
std::int64_t rank_capacity(const ModelConfig& m, const TrainConfig& t, const ParallelConfig& p);

// The choices past their expert's capacity: Σ_e max(0, routed_e − capacity); 0 without one.
std::int64_t dropped_choices(const std::vector<std::int64_t>& routed, std::int64_t capacity);

}  // namespace trainmem
