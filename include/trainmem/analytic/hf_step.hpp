// The whole HuggingFace training step as PyTorch runs it, allocation by allocation (issue 31,
// points 0-2; docs/hf-step.md): the forward of transformers 5.25's LlamaForCausalLM family
// (llama, mistral, qwen2, qwen3) with eager or SDPA attention, with or without gradient
// checkpointing, its loss, autograd's backward (each node's gradient outputs, the saved tensors
// it releases, accumulation into `.grad`, checkpoint recompute), AdamW's step and
// zero_grad(set_to_none=True), under one precision recipe. One walk over the sequence gives the
// step's true high-water mark, its instant and its category breakdown, which the HF profiles'
// "sum of category maxima" only bounds.
//
// Proven against the real step on the CPU (tools/hf_step_events.py, tests/data/hf_step/, checked
// by tests/test_hf_step.cpp). The sequence models a GPU step: what only the CPU's kernels
// allocate (bf16 GEMM scratch, the temporary upcast inside a mixed-dtype elementwise op, the CPU
// RNG state a checkpoint keeps) is left out unless HfStepOptions::cpu_kernels asks for it.
// Tensors under 1 KiB that never decide a peak (index vectors, 0-dim scalars, a norm's (b, s, 1)
// statistics are kept) are left out; docs/hf-step.md states their sum.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/categories.hpp"
#include "trainmem/base/config.hpp"

namespace trainmem {

enum class HfStepPhase : std::uint8_t {
  forward,
  loss,
  backward,
  optimizer,
  zero_grad,
  autocast_exit
};
constexpr int kHfStepPhases = 6;
const char* hf_step_phase_name(HfStepPhase p);  // "forward", "loss", ..., "autocast_exit"

// What a tensor of the step is (the goldens' categories): `activation` a forward tensor still
// alive when backward begins, `temporary` one freed before (and every backward or optimizer
// temporary).
enum class HfStepKind : std::uint8_t {
  parameter,
  gradient,
  optimizer_state,
  activation,
  temporary,
  autocast_cache,
  master_param,
  master_grad,
  input,
  buffer,
  // FSDP2's collective buffers: a unit's all-gather output, each parameter's unsharded copy,
  // the reduce-scatter input.
  communication,
};
constexpr int kHfStepKinds = 11;
const char* hf_step_kind_name(HfStepKind k);  // "parameter", ..., "buffer", "communication"
// The report's category of a kind: parameter -> params; gradient (the .grad tensors) ->
// gradients; optimizer_state, master_param -> optimizer_states (trainmem counts the fp32 master
// copy as optimizer state); activation, autocast_cache, buffer -> activations; temporary (what a
// forward op, autograd or AdamW frees again within the step) and master_grad (mixed's fp32
// gradients, made for the optimizer step, freed by zero_grad) -> workspace; input -> inputs;
// communication -> communication.
Category hf_step_category(HfStepKind k);
// Bytes per kind summed into the report's categories (hf_step_category of each kind).
CategoryBytes hf_step_categories(const std::array<std::uint64_t, kHfStepKinds>& by_kind);

struct HfStepTensor {
  std::string name;  // e.g. "layers.0.self_attn.q_proj.out", "grad.lm_head.weight"
  int layer = -1;    // decoder layer, -1 outside them
  std::uint64_t bytes = 0;
  HfStepKind kind = HfStepKind::activation;
};
struct HfStepEvent {
  bool alloc = true;
  std::uint32_t tensor = 0;  // index into HfStep::tensors
  HfStepPhase phase = HfStepPhase::forward;
};

struct HfStepOptions {
  bool sdpa = false;  // hf-sdpa (the flash kernel's saved set) or hf-eager
  int step = 2;       // 1: AdamW's state created inside opt.step(); 2: a steady step
  // Add what only the CPU's kernels allocate (see the header comment): the tests' comparison
  // with CPU goldens.
  bool cpu_kernels = false;
  // PyTorch FSDP2 (docs/hf-step.md, "Per rank under FSDP2"): fully_shard(layer) on every
  // decoder layer, then fully_shard(model) (the root: embeddings, final norm, lm_head), over
  // fsdp_world ranks, the step as rank fsdp_rank runs it; 1: no sharding. The pure recipe (no
  // MixedPrecisionPolicy: gathers and reductions in the parameters' dtype) or mixed, FSDP2's
  // way: an fp32 model under MixedPrecisionPolicy(param_dtype=--dtype, reduce_dtype=float32).
  int fsdp_world = 1;
  int fsdp_rank = 0;
  bool reshard_after_forward = true;  // the layers' (the root stays gathered after forward)
};

struct HfStep {
  std::vector<HfStepTensor> tensors;
  std::vector<HfStepEvent> events;  // the step's events (live_at_start is before the first)
  // tensors[0, first_step_tensor) are those alive when the step begins (no event allocates
  // them); the others are allocated by an event of the step.
  std::size_t first_step_tensor = 0;
  std::uint64_t live_at_start = 0;
  std::array<std::uint64_t, kHfStepKinds> start_by_kind{};
  std::uint64_t peak = 0;      // live bytes after the event peak_event
  std::size_t peak_event = 0;  // first event reaching the peak
  HfStepPhase peak_phase = HfStepPhase::forward;
  std::array<std::uint64_t, kHfStepKinds> by_kind_at_peak{};
  // The largest live bytes after an event of each phase (0 and phase_seen false where none).
  std::array<std::uint64_t, kHfStepPhases> phase_max{};
  std::array<bool, kHfStepPhases> phase_seen{};
  std::array<std::array<std::uint64_t, kHfStepKinds>, kHfStepPhases> phase_by_kind{};
  // Bytes of kind activation alive when backward begins (autograd's saved tensors, the model's
  // outputs the loop holds, the RoPE tables) and the most bytes of forward tensors (activation,
  // temporary before backward, autocast_cache) alive at once.
  std::uint64_t activations_at_backward = 0;
  std::uint64_t live_at_end = 0;
  std::string recipe;  // one line: the loop, the recipe and the optimizer modelled
};

// The step of `model` (a dense llama, mistral, qwen2 or qwen3 config, transformers 5.25 era) at
// train.batch x train.seq in train.dtype (the 16-bit dtype under amp), checkpointing none or
// full (non-reentrant, every layer), with hf.loop hf-model-loss, hf.use_cache (HF 5 builds a
// DynamicCache in training when config.use_cache is true; off under checkpointing), the recipe
// hf.recipe() and AdamW hf.adamw_impl.
// InputError naming the flag for what is not modelled (another era, family or loop, MoE, a
// sliding window, selective checkpointing, an optimizer other than AdamW).
// Each category's most bytes alive at once over the step (the live bytes per category, event by
// event from the start's).
CategoryBytes hf_step_category_maxima(const HfStep& st);

HfStep hf_step(const ModelConfig& model, const TrainConfig& train, const HfOptions& hf,
               const HfStepOptions& opts);
// Every rank's step under FSDP2 over o.fsdp_world ranks (o.fsdp_rank is ignored): ranks whose
// shards have the same shapes (every parameter's own rows the same) run the same step, which is
// computed once for the group. Such ranks are contiguous (a rank owns whole chunks of a
// parameter, then one rank the remainder, then none): groups are rank ranges, in rank order,
// found from the chunk boundaries (a handful, however many ranks).
struct HfStepRankGroup {
  int first = 0, last = 0;  // ranks first..last
  HfStep step;
};
std::vector<HfStepRankGroup> hf_step_fsdp2_ranks(const ModelConfig& model, const TrainConfig& train,
                                                 const HfOptions& hf, HfStepOptions o);
// Why hf_step() refuses this configuration (a message naming the flag), or "" when it models it.
std::string hf_step_unsupported(const ModelConfig& model, const TrainConfig& train,
                                const HfOptions& hf);

}  // namespace trainmem
