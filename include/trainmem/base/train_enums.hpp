// The training choices as plain enums (their names and parsing stay in config.hpp): optimizer,
// activation checkpointing, attention variant. Split from config.hpp so the kernels can take an
// Attention without including the configuration.
#pragma once

namespace trainmem {

enum class Optimizer { adamw, sgd, lomo };
enum class Checkpointing { none, full };
enum class Attention { eager, flash };

}  // namespace trainmem
