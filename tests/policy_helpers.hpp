// Helpers of the checkpointing-policy and activation-offload tests: a preset with another layer
// count, and a training configuration with a --checkpointing policy applied as the CLI applies it.
#pragma once
#include <string>

#include "cli/cli.hpp"
#include "family_configs.hpp"

namespace trainmem::test {

// A preset with its layer count changed (the per-layer policies need more than two layers).
inline ModelConfig with_layers(const std::string& name, std::int64_t layers) {
  ModelConfig m = any_config(name);
  m.layers = layers;
  m.name = name + "-" + std::to_string(layers) + "l";
  return m;
}

// `t` under --checkpointing `policy` for a model of `layers` layers.
inline TrainConfig with_policy(TrainConfig t, const std::string& policy, std::int64_t layers) {
  cli::parse_checkpoint_policies(policy, layers, false).front().apply(t);
  return t;
}

}  // namespace trainmem::test
