// Internals shared by the analytic profiles (src/analytic*.cpp). Not a public header.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trainmem/analytic/analytic.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/base/checked.hpp"

namespace trainmem::analytic_detail {

// The sizes every formula uses, as unsigned 64-bit numbers (validated > 0 before use).
struct Dims {
  std::uint64_t b, s, h, i, a, k, d, kd, V, L;
  std::uint64_t w;  // width of the training dtype in bytes (2 or 4)
  std::string dt;   // its name ("bf16", "fp16", "fp32")
};
Dims make_dims(const ModelConfig& m, const TrainConfig& t);

// Checked product of sizes, times a byte width.
inline std::uint64_t bytes_of(std::initializer_list<std::uint64_t> dims, std::uint64_t width) {
  return checked_mul(checked_product(dims, "activation size"), width, "activation size");
}

// Builds an entry; the coefficient is bytes / monomial(term) for the given dims.
TensorEntry entry(const Dims& d, std::string name, std::string shape, std::string dtype,
                  std::uint64_t bytes, Term term, std::string kept_by, std::string why);

// Fills the sums of an ActivationBreakdown (per_layer, *_bytes, total_bytes).
void finish(ActivationBreakdown& acts, std::int64_t layers);

// The per-layer lists of `acts` under train's checkpointing policy over the global layers
// [first, first + count): `saved` is what a layer keeps without checkpointing, `kept` what a
// checkpointed layer keeps and `recompute` what it re-creates in backward. No layer
// checkpointed: layer = saved. Every one: layer = kept, recompute. Some: layer = saved,
// layer_checkpointed = kept (checkpointed_layers of them), recompute. Returns how many are.
std::int64_t split_layers(ActivationBreakdown& acts, const TrainConfig& train, std::int64_t first,
                          std::int64_t count, std::vector<TensorEntry> saved,
                          std::vector<TensorEntry> kept, std::vector<TensorEntry> recompute);

// Profile builders. Each fills est.activations, figures.activations, activations_peak,
// workspace, inputs, peak (+ breakdown), instants and notes; est.figures.params, gradients and
// optimizer_states are already set from state_figures().
void build_native(Estimate& est);   // native_stage for the layout of one GPU
void build_hf(Estimate& est);       // hf-eager and hf-sdpa (est.hf set)
void build_hf_peft(Estimate& est);  // hf-peft (est.hf set, est.hf.peft a LoRA recipe)
void build_megatron(Estimate& est);
void build_zero(Estimate& est);

// The native profile of one pipeline stage of `layout` (resolved), the single GPU included
// (analytic_native.cpp).
// Per-parameter sharding: `grad_rank` is the rank in the gradient group (its owned rows).
RankEstimate native_stage(const ModelConfig& m, const TrainConfig& t, const ParallelConfig& layout,
                          std::int64_t stage, std::int64_t grad_rank = 0);

// bitsandbytes' bytes for one 4-bit weight of n elements (docs/formulas.md, "4-bit weights"):
// what the hf-peft profile and the native step's QLoRA both store.
std::uint64_t quant4_weight_bytes(std::uint64_t n, std::uint64_t blocksize, bool double_quant);
// A frozen base projection of `out` rows and n elements as `train` stores it: 4-bit
// (quant4_weight_bytes) or LLM.int8's n int8 bytes + one fp32 absmax per row (--quant int8).
std::uint64_t quantized_weight_bytes(std::uint64_t n, std::uint64_t out, const TrainConfig& train);
// bitsandbytes' optimizer states of `copies` tensors of n elements each, added to `device` and
// `managed` (docs/formulas.md, "8-bit AdamW in the native step", "Paged optimizers in the native
// step"): with `bits8`, uint8 state1/state2 and an fp32 absmax1/absmax2 per `block` elements from
// 4,096 elements on, else fp32 state1/state2; with `paged`, state1/state2 of n >= 100,000 in
// managed memory, the absmax on the device. `any8` is set when a tensor keeps 8-bit states (the
// shared maps are then the caller's to add).
void bnb_state_bytes(bool bits8, bool paged, std::uint64_t block, std::uint64_t n,
                     std::uint64_t copies, std::uint64_t& device, std::uint64_t& managed,
                     bool& any8);
// Whether an HF parameter name is a decoder layer's linear weight (`model.layers.N.*_proj.weight`):
// the weights bitsandbytes stores 4-bit.
bool is_layer_linear(const std::string& name);
std::uint64_t csum(std::initializer_list<std::uint64_t> xs, const char* what = "bytes");
// a - b, throwing Error when b > a (an internal accounting mistake, never user input).
std::uint64_t csub(std::uint64_t a, std::uint64_t b, const char* what);

}  // namespace trainmem::analytic_detail
