// The LLaMA decoder and its training step, on any backend (cpu, meta, cuda).
//
// Dimension letters, here, in model_acts.hpp and in src/model*.cpp, are the project's
// (docs/architecture.md, "Dimension letters"): b batch, s sequence, h hidden, i intermediate,
// a heads, k kv heads, d head dim (a·d = h unless the config sets head_dim), V vocab, L layers,
// and n = b·s rows for the GEMMs.
// The kernels and backends use the same letters, spelling the kv heads `kv` (k is the key
// tensor there).
//
// Architecture (HuggingFace LlamaForCausalLM): token embedding; L layers of
//   x = x + o_proj(attention(rope(q_proj(rmsnorm(x))), rope(k_proj(..)), v_proj(..)))
//   x = x + down_proj(silu(gate_proj(rmsnorm(x))) * up_proj(rmsnorm(x)))
// then a final RMSNorm and the LM head (its own weight, or the embedding's when tied).
// Attention is causal with GQA (a query heads share k kv heads), eager (probabilities
// materialised) or flash-style (only the row log-sum-exp kept). RoPE is HF's rotate-half.
// The families (issue 16) on the same code path: q/k/v projection biases (Qwen2: q_proj.bias
// etc., added after each GEMM), per-head RMSNorm of q and k before RoPE (Qwen3: q_norm,
// k_norm, weights (d) over rows of width d), a head dim d apart from h/a (q, attn_out and
// o_proj are a·d wide), sliding-window attention per layer (ModelConfig::window_of) and RoPE
// scaling (ModelConfig::rope()).
//
// Memory: every allocation goes through the Ledger with its category, tensor name, layer and
// phase, exactly in the order of docs/native-plan.md (the contract with the analytic
// `native` profile). Activation checkpointing (full) keeps each layer's input and recomputes
// one layer at a time during backward.
//
// Loss: the HuggingFace causal-LM loss, the mean cross-entropy of token t+1 given positions
// <= t over the b·(s−1) predicted positions.
//
// fp16 loss scale: an fp16 run back-propagates the loss multiplied by a static S = b·(s−1)
// (loss_scale below): the cross-entropy gradient is then p − onehot, in [−1, 1], where the
// mean's p/(b·(s−1)) would be below fp16's smallest subnormal for a realistic vocabulary and
// batch. Every stored gradient carries the factor S; the optimizers multiply by 1/S in fp32
// before using them, gradient captures (--dump) are divided by S, the reported loss is the
// plain mean. bf16 and fp32 use S = 1 (fp32's exponent range; their arithmetic is unchanged).
// fp16 gradients are checked for inf/NaN each step (a warning names them): S-times gradients
// overflow fp16's 65504 where a true gradient element exceeds 65504/S. docs/decisions.md.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainmem/backends/backend.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/base/safetensors.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/activation_offload.hpp"
#include "trainmem/model/decoder_layer.hpp"
#include "trainmem/model/model_acts.hpp"
#include "trainmem/model/optimizer.hpp"
#include "trainmem/model/quant_param.hpp"

namespace trainmem {

// One trainable weight, in setup order. `grad` is persistent under AdamW/SGD and exists only
// while its gradient is being produced under LOMO.
struct Parameter {
  std::string name;  // HuggingFace name, e.g. model.layers.0.self_attn.q_proj.weight
  int layer = -1;    // -1 for embeddings, final norm and head
  std::vector<std::int64_t> shape;
  Tensor value;  // D
  Tensor grad;   // D
  // False for a frozen weight (LoRA's base): no gradient, no optimizer states, never updated.
  bool trainable = true;
  std::size_t opt_index = kNoOptimizerState;
  // QLoRA: the index of its 4-bit storage (value is then the packed pairs, u8, and shape stays
  // the weight's); -1 for a dense parameter.
  int quant = -1;
  std::uint64_t numel() const;
};

// Receives a parameter's complete gradient (fp32 host copy, divided by the loss scale, so the
// gradient of the mean loss for every dtype) during the step it is passed to: after backward
// under AdamW/SGD, right before the update and free under LOMO.
using GradientCapture = std::function<void(const Parameter& param, const std::vector<float>&)>;

// The static loss scale S of a run in dtype `d` with `positions` = b·(s−1) predicted positions:
// S = positions (as float) for fp16, 1 for bf16 and fp32. Backward multiplies the mean loss's
// gradient by S; the optimizer and the gradient captures divide it out.
float loss_scale(DType d, std::int64_t positions);

// The ids LlamaModel::random_tokens(seed) sets: n ids in [0, vocab), id j from the counter-based
// generator keyed by (seed, the token stream, j); a prefix does not depend on n.
std::vector<std::int32_t> random_token_ids(std::uint64_t seed, std::int64_t n, std::int64_t vocab);

// Test hook: sees the head's (rows, vocab) buffer in D during backward, in backend memory (read
// it with Backend::download; never called on meta): first with what = "logits", right before
// the cross-entropy backward, then with what = "dlogits", the gradient written in their place.
using HeadObserver =
    std::function<void(const char* what, const void* data, std::int64_t rows, std::int64_t vocab)>;

// The single-rank step: the world-size-1 case of the decoder layer (decoder_layer.hpp), which
// this class hosts (weights, gradients; no tensor-parallel group).
class LlamaModel : private LayerHost {
 public:
  // Validates the configs and allocates, in phase `setup`: params, gradients (AdamW/SGD),
  // optimizer states, inputs (tokens, targets) and the 32 MiB GEMM workspace. Weights are
  // unset until init_random() or load_weights(); tokens until set_tokens()/random_tokens().
  LlamaModel(const ModelConfig& model, const TrainConfig& train, Backend& backend, Ledger& ledger,
             const OptimizerSettings& optimizer);
  // Hands the backend its default GEMM workspace back before the model's own is released
  // (the backend may outlive the model).
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  // HF's initialisation: normal(0, 0.02) for embeddings and linear weights, 1 for RMSNorm
  // weights (q_norm and k_norm included), 0 for the projection biases, drawn from a counter-based
  // generator keyed by (seed, parameter, element).
  void init_random(std::uint64_t seed);
  // Loads every parameter by its HF name (any stored float dtype converted). Errors
  // (InputError) name the file and the tensor: missing tensors, shape mismatches. Tensors the
  // model does not use are ignored with a note; lm_head.weight is ignored when tied. On the
  // meta backend only the files' headers are checked. A path named like an HF shard,
  // <stem>-00001-of-00003.safetensors, loads all the shards of that checkpoint
  // (weight_files in model_io.hpp). Defined in src/model/model_io.cpp.
  void load_weights(const std::string& path);
  void load_weights(const SafeTensorsReader& file);
  void load_weights(const std::vector<const SafeTensorsReader*>& files);
  // The --weights tensors that held NaN or Inf values, "name (N of M)" each (a warning was
  // logged when they were read); empty when every value was finite or nothing was read.
  const std::vector<std::string>& non_finite_weights() const { return non_finite_weights_; }
  // b·s ids, row-major (batch, seq); each in [0, vocab) (InputError naming `source`).
  void set_tokens(const std::vector<std::int32_t>& ids, const std::string& source = "tokens");
  void random_tokens(std::uint64_t seed);

  // One training step: ledger.begin_step, forward (marks the end of forward), backward (with
  // recomputation when checkpointing), optimizer. Returns the loss (NaN on meta).
  // `capture`, when set, receives every parameter gradient of this step.
  float train_step(const GradientCapture& capture = nullptr);
  int steps_done() const { return step_; }
  // LoRA dropout: the key of the next step's masks (seed, step); each step then advances the
  // step. A run sets it from --seed; a test holds the masks of one step fixed by setting it
  // again before each step.
  void set_dropout_key(std::uint64_t seed, std::uint64_t step) {
    dropout_seed_ = seed;
    dropout_step_ = step;
  }

  // loss_scale(dtype, b·(s−1)): the factor every stored gradient of this run carries.
  float loss_scale() const { return loss_scale_; }
  // The scale the cross-entropy backward applies: loss_scale() / (b·(s−1)), in float.
  float cross_entropy_scale() const;
  // fp16 runs: whether a gradient of the last step held an inf or NaN (a warning said so), and
  // which parameters' (AdamW/SGD; LOMO frees them before the check is read, so it names none).
  // bf16/fp32 runs are not checked: false and empty.
  bool gradients_nonfinite() const { return grads_nonfinite_; }
  const std::vector<std::string>& nonfinite_gradients() const { return nonfinite_grads_; }
  void set_head_observer(HeadObserver observer) { head_observer_ = std::move(observer); }

  const ModelConfig& model_config() const { return cfg_; }
  const TrainConfig& train_config() const { return train_; }
  const std::vector<Parameter>& parameters() const { return params_; }
  const Parameter& parameter(const std::string& hf_name) const;
  // Current values of a parameter as fp32 (downloads; not on meta). Error for a 4-bit weight:
  // quant4_weight gives its storage.
  std::vector<float> parameter_values(const std::string& hf_name) const;
  // QLoRA: the 4-bit storage of a base projection (backend memory), nullptr for a dense one.
  const Quant4View* quant4_weight(const std::string& hf_name) const;
  // Sets a parameter (and its fp32 master, when it has one) from fp32 values, rounded to D; the
  // size must be the parameter's (Error otherwise). Tests use it (LoRA's B starts at zero).
  void set_parameter_values(const std::string& hf_name, const std::vector<float>& values);
  const std::vector<std::int32_t>& tokens() const { return host_tokens_; }
  // Activation bytes alive at the end of the last forward, by layer: [0] outside the layers
  // (embedding output, head), [l + 1] layer l.
  // (Under --offload-activations both places count: device and host.)
  const std::vector<std::uint64_t>& activations_by_layer() const { return act_by_layer_; }
  // A mixture of experts (issue 29, point 3): each layer's routing in the last forward, as the
  // backend computed it (cpu and cuda; empty on meta, which routes nothing): the tokens each
  // expert received (b·s·K in all) and a fingerprint of every (token, choice)'s expert (FNV-1a
  // over topk_idx), which tells two routings apart without keeping them.
  // Under --capacity-factor, `dropped` of the choices found their expert full (tokens_per_expert
  // counts them, routed; the expert computed min(routed, capacity) rows).
  struct LayerRouting {
    std::vector<std::int64_t> tokens_per_expert;
    std::int64_t dropped = 0;
    std::uint64_t fingerprint = 0;
  };
  const std::vector<LayerRouting>& routing() const { return routing_; }
  ParameterOptimizer& optimizer() { return opt_; }
  // --offload-activations: the host ledger the offloaded copies live in (nullptr otherwise; its
  // peaks restart with each step), and the bytes copied each way in the last step (device to host
  // in forward, host to device in backward: each equals the host peak).
  const Ledger* host_ledger() const { return offload_ ? &offload_->host() : nullptr; }
  std::uint64_t offload_transfer_bytes() const { return offload_ ? offload_->transfer_bytes() : 0; }
  // --optimizer paged-adamw|paged-adamw8bit: the ledger of the states taken from managed memory
  // (allocated at setup, alive for the run); nullptr for the other optimizers.
  const Ledger* managed_ledger() const { return managed_ledger_.get(); }

 private:
  Parameter& P(std::size_t i) { return params_[i]; }
  // Per-layer parameter j (LayerParam slots, decoder_layer.hpp: norms, projections, biases,
  // q/k norms, router and experts) of layer l; only for the slots layer l has.
  std::size_t layer_param(int l, int j) const {
    const int kind = cfg_.is_moe_layer(l) ? 1 : 0;
    return layer_first_[std::size_t(l)] + std::size_t(layer_slot_[kind][std::size_t(j)]);
  }
  std::size_t final_norm_index() const { return layer_first_.back(); }
  std::size_t head_index() const;  // embed (0) when tied
  Tensor act(const char* name, int layer, std::vector<std::int64_t> shape, DType dt);
  Tensor ws(const char* name, int layer, std::vector<std::int64_t> shape, DType dt);

  // The initial value of parameter `pi` from `seed` (init_random's rule).
  void init_parameter(std::size_t pi, std::uint64_t seed);
  // Sets parameter `index` from fp32 values that `fill(dst, first, count)` writes in chunks
  // (rounded to D; its master too). A 4-bit weight is quantized from the rounded values.
  void write_parameter(std::size_t index,
                       const std::function<void(float*, std::uint64_t, std::uint64_t)>& fill);
  // QLoRA: quantizes 4-bit weight `pi` from its dense values, which `fill` writes (D, on the
  // backend; not called on meta) into a transient workspace copy (docs/native-plan.md, "QLoRA").
  void quantize_parameter(std::size_t pi, const std::function<void(void*)>& fill);
  void upload_inputs();
  void forward();
  void backward(const GradientCapture& capture);
  // The decoder layer's view of this run (world size 1) and its LayerHost side.
  LayerRank layer_rank();
  const void* weight(std::int64_t l, int slot) override;
  const Quant4View* quant4(std::int64_t l, int slot) override;
  void* grad(std::int64_t l, int slot) override;
  void grad_done(std::int64_t l, int slot) override;
  void moe_routed(int g, const std::vector<std::int32_t>& offsets, const Tensor& topk_idx,
                  const Tensor& probs) override;
  const float* moe_aux_grad() override;
  // The load-balancing loss's share of the loss, coef·aux, from this step's statistics; fills
  // aux_grad_ (0 without output_router_logits).
  double router_aux_loss();
  // Gradient bookkeeping: AdamW/SGD use the persistent buffer; LOMO allocates it zeroed here.
  void* begin_grad(std::size_t index);
  // LOMO: capture, update and free now. AdamW/SGD: nothing (captured after backward).
  void end_grad(std::size_t index, const GradientCapture& capture);
  void capture_grad(std::size_t index, const GradientCapture& capture);
  // fp16 (on backends that compute): each complete gradient is queued for the backend's
  // non-finite check; at the end of backward one wait reads the result, and a warning names
  // the parameters concerned.
  bool checks_finite() const;
  void check_grad_finite(std::size_t index);
  void report_nonfinite_grads();

  ModelConfig cfg_;
  TrainConfig train_;
  Backend& be_;
  Ledger& ledger_;
  DType D_;
  std::int64_t b_, s_, h_, i_, a_, k_, d_, V_, n_;  // n = b*s rows
  std::vector<Parameter> params_;
  // QLoRA: each 4-bit weight's other tensors (bitsandbytes' QuantState), by Parameter::quant
  // (its packed pairs are the Parameter's value).
  std::vector<QuantParam> quant_;
  std::vector<LayerRouting> routing_;  // per layer, the last forward's (MoE, computing backends)
  // The load-balancing loss (ModelConfig::output_router_logits): per expert, over every layer of
  // this step's forward, the (token, choice) pairs routed to it and the sum of its probabilities
  // (double, tokens in order), and the gradient of the scaled loss by each probability.
  std::vector<double> aux_counts_, aux_prob_sums_;
  std::vector<float> aux_grad_;
  // Where layer l's parameters start in params_ ([layers]: the final norm), and each slot's place
  // among them in a dense layer [0] and a mixture-of-experts layer [1] (-1: the kind has no such
  // slot).
  std::vector<std::size_t> layer_first_;
  std::vector<int> layer_slot_[2];
  // A paged optimizer's large states (managed memory; null for the other optimizers). Declared
  // before opt_, whose tensors it holds.
  std::unique_ptr<Ledger> managed_ledger_;
  ParameterOptimizer opt_;
  Tensor tokens_, targets_;  // (b,s) int32, inputs
  Tensor gemm_workspace_;    // 32 MiB, workspace
  std::vector<std::int32_t> host_tokens_;
  bool weights_set_ = false, tokens_set_ = false;
  std::vector<std::string> non_finite_weights_;
  int step_ = 0;
  std::uint64_t dropout_seed_ = 0, dropout_step_ = 0;
  float loss_ = 0.0f;
  float loss_scale_ = 1.0f;
  bool grads_nonfinite_ = false;
  std::vector<std::string> nonfinite_grads_;
  HeadObserver head_observer_;
  const GradientCapture* capture_ = nullptr;  // backward's, for grad_done
  std::vector<std::uint64_t> act_by_layer_;

  // --offload-activations (include/trainmem/model/activation_offload.hpp); null otherwise.
  std::unique_ptr<ActivationOffload> offload_;

  // Forward state kept for backward.
  Tensor embed_out_;
  std::vector<LayerActs> layers_;
  Tensor final_norm_out_, final_rstd_, logits_, ce_lse_;
};

// The 32 MiB GEMM workspace every backend allocates (cuBLAS's recommendation for Hopper).
constexpr std::uint64_t kGemmWorkspaceBytes = 32ull << 20;

}  // namespace trainmem
