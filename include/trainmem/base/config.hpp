// Model and training-run configuration: LLaMA-family presets, HuggingFace config.json
// loading, and validation. Dimension letters used project-wide:
//   b batch, s sequence, h hidden, i intermediate (SwiGLU width), a heads, k kv heads,
//   d head dim (h / a unless config.json sets head_dim), L layers, V vocab, P parameters.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainmem/base/dtype.hpp"
#include "trainmem/base/op_types.hpp"
#include "trainmem/base/train_enums.hpp"

namespace trainmem {

// The most decoder layers a model may have (config.json, presets, --layers): run times are
// linear in it.
constexpr std::int64_t kMaxLayers = 16384;

struct ModelConfig {
  std::string name;                // preset name or the config.json path
  std::string family = "llama";    // config.json model_type: llama, mistral, qwen2, qwen3
  std::int64_t vocab = 0;          // V
  std::int64_t hidden = 0;         // h
  std::int64_t intermediate = 0;   // i
  std::int64_t layers = 0;         // L
  std::int64_t heads = 0;          // a
  std::int64_t kv_heads = 0;       // k (== a without GQA)
  std::int64_t max_positions = 0;  // longest sequence the model was trained for
  double rms_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tied_embeddings = false;      // lm_head shares embed_tokens
  std::optional<DType> torch_dtype;  // what config.json says the checkpoint is stored in

  // The families' departures from LLaMA (docs/formulas.md, "Model families"):
  std::int64_t explicit_head_dim = 0;  // d when config.json sets head_dim apart from h/a (Qwen3)
  bool qkv_bias = false;               // biases on q_proj, k_proj and v_proj (Qwen2)
  bool qk_norm =
      false;  // RMSNorm over each head of q and k before RoPE (Qwen3): q_norm, k_norm (d)
  // Sliding-window attention: a query at position t sees the keys at t−W+1..t (HF's
  // `kv_idx > q_idx − sliding_window`), in the layers l >= window_from_layer (Mistral: 0;
  // Qwen2/3 with use_sliding_window: max_window_layers). 0: every layer attends to all of 0..t.
  std::int64_t sliding_window = 0;
  std::int64_t window_from_layer = 0;
  RopeScaling rope_scaling;  // rope_scaling of config.json (none or llama3)
  // Mixture of experts (model_type mixtral, qwen2_moe, qwen3_moe; docs/moe-plan.md); experts is
  // 0 for a dense model. A MoE layer's MLP is a router `mlp.gate` (E, h), E experts of width
  // expert_intermediate stored as `mlp.experts.gate_up_proj` (E, 2·i_m, h) and
  // `mlp.experts.down_proj` (E, h, i_m) (transformers 5.x), and under qwen2_moe a shared expert
  // of width shared_expert_intermediate with its sigmoid gate (1, h). Qwen's other layers
  // (is_moe_layer false) keep the dense MLP of width `intermediate`. Parsed and counted only so
  // far by the hf-eager and hf-sdpa profiles only (require_dense guards the others).
  std::int64_t experts = 0;                     // E: num_local_experts / num_experts
  std::int64_t experts_per_token = 0;           // top-k: num_experts_per_tok
  std::int64_t expert_intermediate = 0;         // i_m (Mixtral: intermediate_size)
  std::int64_t shared_expert_intermediate = 0;  // i_s: shared_expert_intermediate_size (qwen2_moe)
  bool norm_topk_prob = false;                  // renormalise the top-k weights (Mixtral: always)
  std::int64_t decoder_sparse_step = 1;         // Qwen: layer l is MoE when (l + 1) % step == 0
  std::vector<std::int64_t> mlp_only_layers;    // Qwen: layers kept dense, ascending
  bool output_router_logits = false;            // the load-balancing loss's tensors
  double router_aux_loss_coef = 0.001;          // its weight in the loss (router_aux_loss_coef)
  // config.json keys that were read and do not change a training step's computation or memory
  // (listed by --explain); keys the loader does not know end in " (unrecognised)".
  std::vector<std::string> ignored_fields;

  std::int64_t head_dim() const {
    return explicit_head_dim > 0 ? explicit_head_dim : hidden / heads;
  }
  std::int64_t q_dim() const { return heads * head_dim(); }  // a·d (== h unless head_dim is set)
  std::int64_t kv_dim() const { return kv_heads * head_dim(); }
  // The window of layer l: sliding_window when the layer uses it, else 0 (full causal).
  std::int64_t window_of(std::int64_t layer) const {
    return sliding_window > 0 && layer >= window_from_layer ? sliding_window : 0;
  }
  RopeSpec rope() const { return RopeSpec{rope_theta, rope_scaling}; }
  bool moe() const { return experts > 0; }
  // Whether layer l's MLP is the experts' (HF's rule: every layer for Mixtral; for Qwen, not in
  // mlp_only_layers and (l + 1) % decoder_sparse_step == 0).
  bool is_moe_layer(std::int64_t l) const;
  std::int64_t moe_layer_count() const;
  // The family features that are on, one phrase each, for the reports' model description
  // (e.g. "q/k/v biases", "sliding window 4096 from layer 28"); empty for a plain LLaMA.
  std::vector<std::string> features() const;
  // Exact parameter count (checked arithmetic; a MoE layer's MLP as above): embeddings, per
  // layer q_proj (a·d, h),
  // k_proj and v_proj (k·d, h), o_proj (h, a·d) with d = head_dim(), their biases when
  // qkv_bias (a·d + 2·k·d), q_norm and k_norm when qk_norm (2·d), gate/up/down, two RMSNorm
  // weights, final norm, and lm_head unless tied.
  std::uint64_t param_count() const;
  // Throws InputError naming the field: sizes > 0, heads | hidden (only when head_dim is not
  // explicit), kv_heads | heads, head_dim even, sliding_window >= 0, window_from_layer >= 0,
  // rope_scaling's parameters in range, sizes whose byte counts would overflow 64 bits.
  void validate() const;
};

// The guard of every step and profile that does not model a MoE layer (all but the HF ones):
// InputError for a mixture-of-experts model, naming its model_type, its experts and parameter
// count, and `what` (the command or profile that refused it). No-op for a dense model.
void require_dense(const ModelConfig& m, const std::string& what);

const char* optimizer_name(Optimizer o);
const char* checkpointing_name(Checkpointing c);
const char* attention_name(Attention a);
std::optional<Optimizer> parse_optimizer(const std::string& s);
std::optional<Checkpointing> parse_checkpointing(const std::string& s);
std::optional<Attention> parse_attention(const std::string& s);
const char* quant_name(Quant q);                            // "none", "nf4", "fp4"
std::optional<Quant> parse_quant(const std::string& name);  // by quant_name
// bitsandbytes' 4-bit blocksizes (64, 128, ..., 4096); InputError naming --quant-blocksize else.
void check_quant_blocksize(std::int64_t blocksize);

// Which layers `checkpointing full` applies to (issue 30; docs/decisions.md, "Which layers are
// checkpointed"): every layer (an empty list), or the listed global layer indices. `spec` is the
// policy as the user wrote it ("every:2", "layers:0,3", "budget:24GiB"), empty for plain "full";
// the CLI resolves it to `list` against the model (and a budget against the analytic peak)
// before anything runs.
struct CheckpointLayers {
  std::vector<std::int64_t> list;  // sorted, unique, < layers; empty: every layer
  std::string spec;
  std::uint64_t budget = 0;  // budget:SIZE not yet resolved to `list` (0: resolved)
  bool operator==(const CheckpointLayers& o) const {
    return list == o.list && spec == o.spec && budget == o.budget;
  }
};

struct TrainConfig {
  std::int64_t batch = 8;  // b
  std::int64_t seq = 512;  // s
  DType dtype = DType::bf16;
  Optimizer optimizer = Optimizer::adamw;
  Checkpointing checkpointing = Checkpointing::none;
  CheckpointLayers checkpoint_layers;  // which layers, under checkpointing full
  Attention attention = Attention::eager;
  // --offload-activations (issue 30; docs/native-plan.md, "Activation offload"): what each layer
  // but the last saves for its backward is copied to host memory after the next layer's forward
  // and prefetched one layer ahead in backward. trainmem's own step (one GPU) only.
  bool offload_activations = false;
  // LoRA in trainmem's own step (issue 28; docs/native-plan.md, "LoRA"): rank 0 trains every
  // weight; rank r >= 1 freezes the base and trains an adapter pair A (r, in), B (out, r) on each
  // projection of `lora_targets` (LoraTarget bits, lora.hpp), y = x·Wᵀ + (alpha/r)·(x·Aᵀ)·Bᵀ.
  std::int64_t lora_rank = 0;
  unsigned lora_targets = 0;
  float lora_alpha = 8.0f;  // peft's LoraConfig default
  constexpr bool lora() const { return lora_rank > 0; }
  float lora_scaling() const { return lora_rank > 0 ? lora_alpha / float(lora_rank) : 0.0f; }
  // LoRA dropout p (peft's lora_dropout, 0 <= p < 1): each adapter's input is dropped with
  // probability p and scaled by 1/(1 − p) before A (docs/native-plan.md, "LoRA dropout"). The
  // mask bits are drawn from (the run's seed, the step, the layer, the target, the element).
  double lora_dropout = 0.0;
  constexpr bool lora_dropped() const { return lora_rank > 0 && lora_dropout > 0.0; }
  // QLoRA in trainmem's own step (docs/native-plan.md, "QLoRA"): under LoRA, the seven
  // projections of every layer stored 4-bit as bitsandbytes stores them (packed pairs, an absmax
  // per `quant_blocksize` elements, under double quantization that absmax in 8 bits with an fp32
  // absmax per 256 of them and one fp32 offset), each dequantized into workspace around every
  // GEMM that reads it. none: the base in the training dtype.
  Quant quant = Quant::none;
  bool double_quant = true;
  std::int64_t quant_blocksize = 64;
  constexpr bool quantized() const { return quant != Quant::none; }
  // The 4-bit base (QLoRA: nf4, fp4) or the 8-bit one (--quant int8: int8 weights with an fp32
  // absmax per row, docs/native-plan.md, "8-bit base").
  constexpr bool quant4() const { return quant == Quant::nf4 || quant == Quant::fp4; }
  constexpr bool quant8() const { return quant == Quant::int8; }
  // --capacity-factor C (a mixture of experts in trainmem's own step; docs/native-plan.md,
  // "Capacity"): each expert takes at most ⌈(b·s·K / E)·C⌉ rows, GShard's token dropping; 0: no
  // capacity, every choice kept.
  double capacity_factor = 0.0;
  void validate() const;  // batch >= 1, seq >= 2 (the loss needs a next token)
  // Whether global layer `layer` keeps only its input and is recomputed in backward.
  bool checkpointed(std::int64_t layer) const;
  // How many of the global layers [first, first + count) are checkpointed.
  std::int64_t checkpointed_count(std::int64_t first, std::int64_t count) const;
  // InputError when a budget:SIZE policy reaches a step or a profile unresolved (a command
  // that cannot pick layers for it: the message names `where`).
  void check_checkpoint_resolved(const std::string& where) const;
};

// The guard of trainmem's own step and its `native` profile (one GPU) for a mixture of experts
// (docs/native-plan.md, "Mixture of experts"): what the native MoE layer does not model yet
// exits 2 naming the field or flag: LoRA/QLoRA (--finetune), LOMO (--optimizer lomo),
// --offload-activations, and int32 overflow of the routed rows. `what` names the command or
// profile. No-op for a dense model.
void require_native_moe(const ModelConfig& m, const TrainConfig& t, const std::string& what);
// The rows each expert may take under --capacity-factor, ⌈(b·s·K / E)·C⌉ computed in double as
// Megatron's get_capacity does; 0 without a capacity factor or for a dense model.
std::int64_t moe_capacity(const ModelConfig& m, const TrainConfig& t);
// The same over `tokens` routed tokens (a rank's own under a layout: b·s/cp, /tp under sp, as
// Megatron computes it over each rank's local tokens).
std::int64_t moe_capacity_of(const ModelConfig& m, double capacity_factor, std::int64_t tokens);
// The rows of the expert-ordered buffers: E·capacity under a capacity factor, b·s·K otherwise.
std::int64_t moe_rows(const ModelConfig& m, const TrainConfig& t);
// The same over `tokens` routed tokens.
std::int64_t moe_rows_of(const ModelConfig& m, double capacity_factor, std::int64_t tokens);

// A number as %g writes it (32, 0.5, 1e-05): flag values in messages and reports.
std::string number_text(double v);

// The checkpointing policy in words: "none", "full", or the per-layer spec ("every:2",
// "layers:0,3", "budget:24GiB (layers 0-5)").
std::string checkpointing_name(const TrainConfig& t);
// "0-5", "1,3,5", "0-2,7": a sorted layer list, runs of three or more collapsed.
std::string layer_list_text(const std::vector<std::int64_t>& layers);

// Presets: llama-7b, llama-13b, llama-33b, llama-65b, llama2-7b, llama2-13b, llama2-70b,
// llama3-8b, llama3.2-1b, mistral-7b, qwen2-7b, qwen2.5-0.5b, qwen2.5-7b, qwen3-0.6b,
// qwen3-8b, and small ones for tests and benchmarks (tiny, tiny-gqa, tiny-tied, tiny-awkward,
// tiny-mistral, tiny-qwen2, tiny-qwen3, tiny-llama3, small-256).
std::vector<std::string> preset_names();
std::optional<ModelConfig> find_preset(const std::string& name);

// Parses a HuggingFace config.json (text) of model_type llama, mistral, qwen2 or qwen3
// (docs/decisions.md, "Model families (issue 16)"). Errors name the field. `source` labels
// messages and becomes ModelConfig::name. Keys that do not change a training step go to
// ignored_fields; unknown keys too, marked " (unrecognised)", with a warning logged.
ModelConfig parse_hf_config(const std::string& json_text, const std::string& source);
ModelConfig load_hf_config(const std::string& path);

// --model NAME|path/config.json: a preset, else a file path ending in .json, else an
// InputError listing the presets.
ModelConfig resolve_model(const std::string& name_or_path);

}  // namespace trainmem
