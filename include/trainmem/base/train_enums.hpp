// The training choices as plain enums (their names and parsing stay in config.hpp): optimizer,
// activation checkpointing, attention variant. Split from config.hpp so the kernels can take an
// Attention without including the configuration.
#pragma once

namespace trainmem {

enum class Optimizer { adamw, sgd, lomo };
// selective: Megatron's selective recompute, the attention core's s² tensors recomputed
// (docs/decisions.md, "Which layers are checkpointed, and selective recompute").
enum class Checkpointing { none, full, selective };
enum class Attention { eager, flash };

}  // namespace trainmem
