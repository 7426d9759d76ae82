// The training choices as plain enums (their names and parsing stay in config.hpp): optimizer,
// activation checkpointing, attention variant. Split from config.hpp so the kernels can take an
// Attention without including the configuration.
#pragma once

namespace trainmem {

// adamw8bit: bitsandbytes' AdamW8bit (uint8 moments with an fp32 absmax per 256-element block,
// fp32 moments for tensors under 4,096 elements, the weights updated in place without a master
// copy); docs/formulas.md, "8-bit AdamW in the native step". paged_adamw, paged_adamw8bit:
// bitsandbytes' PagedAdamW (its 32-bit blockwise Adam: fp32 moments, no master copy) and
// PagedAdamW8bit, whose moments of a tensor of 100,000 elements or more live in CUDA managed
// memory (docs/formulas.md, "Paged optimizers in the native step").
enum class Optimizer { adamw, sgd, lomo, adamw8bit, paged_adamw, paged_adamw8bit };
// bitsandbytes' optimizers: its arithmetic, no master copy.
constexpr bool bnb_optimizer(Optimizer o) {
  return o == Optimizer::adamw8bit || o == Optimizer::paged_adamw ||
         o == Optimizer::paged_adamw8bit;
}
// Those that keep 8-bit moments for tensors of kBnbMin8BitSize elements or more.
constexpr bool eight_bit_optimizer(Optimizer o) {
  return o == Optimizer::adamw8bit || o == Optimizer::paged_adamw8bit;
}
// Those that take the moments of a tensor of kBnbPagedMinSize elements or more from managed memory.
constexpr bool paged_optimizer(Optimizer o) {
  return o == Optimizer::paged_adamw || o == Optimizer::paged_adamw8bit;
}
// selective: Megatron's selective recompute, the attention core's s² tensors recomputed
// (docs/decisions.md, "Which layers are checkpointed, and selective recompute").
enum class Checkpointing { none, full, selective };
enum class Attention { eager, flash };
// bitsandbytes' storage of a frozen base's linear weights (QLoRA: nf4; int8: LLM.int8's
// row-wise 8-bit weight, load_in_8bit): none keeps them in the training dtype.
enum class Quant { none, nf4, fp4, int8 };

}  // namespace trainmem
