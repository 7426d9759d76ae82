// LoRA adapters on a decoder layer's linear projections, as peft's LoraConfig names them:
// which projections carry one, and how many trainable elements they add (docs/formulas.md,
// "LoRA adapters"). Groundwork of issue 28: the LoRA training step builds on these.
#pragma once
#include <cstdint>
#include <string>

#include "trainmem/base/config.hpp"

namespace trainmem {

// The seven projections of a LLaMA-family decoder layer, as bits of a target set.
enum LoraTarget : unsigned {
  kLoraQ = 1u << 0,     // self_attn.q_proj  (h -> a·d)
  kLoraK = 1u << 1,     // self_attn.k_proj  (h -> k·d)
  kLoraV = 1u << 2,     // self_attn.v_proj  (h -> k·d)
  kLoraO = 1u << 3,     // self_attn.o_proj  (a·d -> h)
  kLoraGate = 1u << 4,  // mlp.gate_proj     (h -> i)
  kLoraUp = 1u << 5,    // mlp.up_proj       (h -> i)
  kLoraDown = 1u << 6,  // mlp.down_proj     (i -> h)
};
// peft's "all-linear": every nn.Linear of the layers (lm_head excluded), the seven projections.
constexpr unsigned kLoraAllLinear = 0x7fu;
// peft's default for llama, mistral, qwen2 and qwen3 (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_
// MAPPING): q_proj and v_proj.
constexpr unsigned kLoraPeftDefault = kLoraQ | kLoraV;

// "q_proj,v_proj" (HF module names, any order, commas) or "all-linear". Throws InputError naming
// --lora-targets, the bad name and the allowed ones.
unsigned parse_lora_targets(const std::string& list);
// The names of a target set, in layer order ("q_proj,v_proj"; "all-linear" for all seven).
std::string lora_targets_name(unsigned targets);

// What the reports' title lines append for the training options past the common ones:
// "  lora r=16 q_proj,v_proj (base frozen)" for trainmem's own LoRA step (TrainConfig::lora()),
// then "  capacity factor 1.25" under --capacity-factor; "" for neither.
std::string train_title_extras(const TrainConfig& t);

// Trainable elements of the adapters over every layer: each target linear (in -> out) gets
// A (r, in) and B (out, r), r·(in + out) elements (peft's count, bias "none"). Checked
// arithmetic; rank >= 1.
std::uint64_t lora_trainable_count(const ModelConfig& m, std::int64_t rank, unsigned targets);

}  // namespace trainmem
