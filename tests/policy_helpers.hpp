// Helpers of the checkpointing-policy and activation-offload tests: a preset with another layer
// count, and a training configuration with a --checkpointing policy applied as the CLI applies it.
#pragma once
#include <string>

#include "cli/cli.hpp"
#include "family_configs.hpp"
#include "model_helpers.hpp"
#include "trainmem/analytic/analytic.hpp"

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

// Two steps of (m, t) on `kind` in `run` (cpu: random weights and tokens); its ledger's figures
// against the native profile, byte for byte. Returns the profile for further checks.
inline Estimate expect_ledger_equals_native(ModelRun& run, const ModelConfig& m,
                                            const TrainConfig& t, const std::string& what,
                                            BackendKind kind) {
  if (kind == BackendKind::cpu) {
    run.model->init_random(3);
    run.model->random_tokens(4);
  }
  run.model->train_step();
  run.model->train_step();
  const MemoryFigures got = measured_figures(*run.ledger);
  Estimate e = estimate(Profile::native, m, t);
  const MemoryFigures& want = e.figures;
  EXPECT_EQ(got.activations, want.activations) << what;
  EXPECT_EQ(got.activations_peak, want.activations_peak) << what;
  EXPECT_EQ(got.workspace, want.workspace) << what;
  EXPECT_EQ(got.peak, want.peak) << what << " (analytic peak at "
                                 << e.instants[std::size_t(e.peak_instant)].name << ")";
  EXPECT_EQ(got.peak_breakdown, want.peak_breakdown) << what;
  return e;
}

}  // namespace trainmem::test
