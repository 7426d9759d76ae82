// A mixture of experts' routing as data (issue 29, point 3; docs/native-plan.md, "Routing as
// data"): the choices routed to each expert per layer, measured by a run that computes
// (RunResult::routing), or given to the meta trace: balanced, or a file `profile --dump-routing`
// wrote. No byte of trainmem's step depends on it; under --capacity-factor the choices each
// expert drops do (min(routed, capacity) kept, in token order).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trainmem/base/config.hpp"

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

// The choices past their expert's capacity: Σ_e max(0, routed_e − capacity); 0 without one.
std::int64_t dropped_choices(const std::vector<std::int64_t>& routed, std::int64_t capacity);

}  // namespace trainmem
