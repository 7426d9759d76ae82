// Per-rank REFERENCE profiles: what the published distributed-memory estimators say one GPU
// needs, computed exactly as their current sources compute them (docs/distributed-references.md).
// They are printed beside trainmem's own per-rank figures so that a reader can see, term by
// term, what each estimator counts and what it leaves out. Nothing here is trainmem's own model.
//
//   deepspeed  estimate_zero2_model_states_mem_needs (deepspeed/runtime/zero/stage_1_and_2.py)
//              and estimate_zero3_model_states_mem_needs (deepspeed/runtime/zero/stage3.py):
//              model states only, ZeRO-2 and ZeRO-3, with and without CPU offload.
//   megatron   compute_weight_and_optimizer_memory + compute_activation_memory[_without_sp]
//              (megatron/training/theoretical_memory_usage.py): the most loaded rank, which is
//              the first pipeline stage.
//   mbridge    ISEEKYAN/mbridge memory_estimator (estimate_013.report_memory_usage_one_pp_rank
//              over moe_mem_estimator's layer classes, what its web UI runs): every pipeline
//              rank's parameters, weight/gradient/optimizer bytes and activations; the first
//              rank is the one reported (the others in its notes).
//
// The estimators compute in Python floats; the functions here follow their evaluation order in
// IEEE doubles and round where the source does (int() truncation in DeepSpeed; Megatron returns
// float bytes, rounded here to the nearest byte). Integer sub-expressions use checked 64-bit
// arithmetic (trainmem/base/checked.hpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trainmem/base/config.hpp"
#include "trainmem/base/parallel.hpp"

namespace trainmem {

// One term the estimator adds. `host` terms are CPU memory (DeepSpeed offload figures); the
// others add up to ReferenceRank::gpu_total.
struct ReferenceTerm {
  std::string name;  // e.g. "model states"
  std::uint64_t bytes = 0;
  std::string formula;  // in the estimator's letters, e.g. "4·Lmax + int(18P/N)"
  bool host = false;    // a CPU-memory term (adds up to host_total)
};

struct ReferenceRank {
  std::string profile;  // "deepspeed" or "megatron"
  std::string source;   // repository, file and function the formula is taken from
  bool covers = false;  // false: the estimator has no formula for this layout
  std::string why_not;  // when !covers: which part of the layout it has no formula for
  // Per GPU where the estimator itself splits them; 0 otherwise (the whole is in `terms`).
  // DeepSpeed splits nothing (one model-states figure); Megatron splits activations from
  // "weight and optimizer" (which it does not split further).
  std::uint64_t params = 0, gradients = 0, optimizer_states = 0, activations = 0;
  bool activations_counted = false;  // the estimator has an activation term (`activations`)
  std::uint64_t gpu_total = 0;       // what the estimator says one GPU needs (sum of GPU terms)
  std::uint64_t host_total = 0;      // CPU memory it states (DeepSpeed), 0 otherwise
  std::vector<ReferenceTerm> terms;  // every term it adds
  std::vector<std::string> notes;    // what it assumes and what it does not count
};

// DeepSpeed's per-GPU model-states estimate for ZeRO-2 / ZeRO-3 (no activations, no buffers).
// N = parallel.dp (the ZeRO data-parallel group) = num_gpus_per_node × num_nodes with
// num_gpus_per_node = min(dp, gpus_per_node) and num_nodes = dp / that; covers = false when
// gpus_per_node does not divide a dp above it, for ZeRO-0/1 (no estimator), for tp or pp > 1
// (the estimators take no model-parallel degree), and for offload optimizer+params with ZeRO-2.
// InputError when gpus_per_node < 1. Validates the model (InputError naming the field).
ReferenceRank deepspeed_reference(const ModelConfig& model, const TrainConfig& train,
                                  const ParallelConfig& parallel, std::int64_t gpus_per_node = 8);

// Megatron-LM's theoretical memory of the most loaded rank (the first pipeline stage):
// weights + optimizer at 18 B/param, or 6 + 12/dp with the distributed optimizer (used here
// for --zero >= 1), plus activations. The activation branch follows report_theoretical_memory:
// the sequence-parallel formula only when sequence_parallel and recompute_granularity ==
// 'selective', the without-SP formula otherwise. Our --checkpointing maps to
// recompute_granularity (none -> None, full and the per-layer policies -> 'full', selective ->
// 'selective'); `selective_recompute` opts in to the selective branch whatever the policy
// (InputError with a full policy: Megatron takes one granularity). covers = false with CPU
// offload (no term for it). Validates the model.
ReferenceRank megatron_reference(const ModelConfig& model, const TrainConfig& train,
                                 const ParallelConfig& parallel, bool selective_recompute = false);

// mbridge's memory estimator for pipeline rank 0 (docs/distributed-references.md, "mbridge"):
// weights, gradients and optimizer at 18 B/param, or with the distributed optimizer (--zero >= 1)
// 6 + 12/(dp·cp) for the dense parameters and 6 + 12/(world/(pp·ep·etp)) for the routed experts
// (when ep·etp > 1); activations of n = pp − pp_rank micro-batches at 2 B an element, / cp.
// --checkpointing none -> recompute "none", full (and per-layer policies) -> "full" uniform over
// 1 layer, selective -> "selective" (core attention dropped). covers = false for LoRA, offload,
// and a vocabulary tp does not divide (the estimator asserts it). Validates the model.
ReferenceRank mbridge_reference(const ModelConfig& model, const TrainConfig& train,
                                const ParallelConfig& parallel);

// Largest single module's own parameters, as DeepSpeed's model_to_params (stage3.py) finds
// them for a HuggingFace LlamaForCausalLM: max over modules of the sum of the module's direct
// parameters (recurse=False). For LLaMA the candidates are embed_tokens / lm_head (V·h), the
// MLP projections (h·i), q_proj / o_proj (h²), k_proj / v_proj (h·k·d) and the norms (h).
std::uint64_t deepspeed_largest_layer_params(const ModelConfig& model);

// Megatron's padded vocabulary (_vocab_size_with_padding, make_vocab_size_divisible_by = 128):
// V rounded up to a multiple of 128·tp.
std::uint64_t megatron_padded_vocab(const ModelConfig& model, std::int64_t tp);

}  // namespace trainmem
