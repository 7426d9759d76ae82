// The analytic memory model: closed-form figures for one training step, without a GPU.
//
// Written from docs/design.md and docs/native-plan.md only (never from the model's code), so that
// agreement with the measured ledger is a real check. Derivations and a worked LLaMA-7B
// example: docs/formulas.md.
//
// Profiles (what "activations" means differs between them):
//   native    exactly what trainmem's own step allocates (docs/native-plan.md), eager or flash
//             attention, checkpointing none or full; params..peak must equal the ledger byte
//             for byte.
//   hf-eager  the tensors PyTorch autograd saves for a HuggingFace LlamaForCausalLM training
//             step with eager attention, plus what the training loop holds (the returned
//             logits, past_key_values with --use-cache), for a named transformers era and
//             PyTorch series (HfOptions; default transformers 4.30, PyTorch 2.0), verified
//             against saved_tensors_hooks by tools/hf_saved_tensors.py.
//   hf-sdpa   the same for transformers 5.25's default SDPA attention (PyTorch's flash kernel).
//   hf-peft   the same SDPA step fine-tuned with peft's LoRA (frozen base weights, adapters on
//             the chosen projections), on a 16-bit or bitsandbytes 4-bit base (QLoRA, with
//             prepare_model_for_kbit_training's fp32 upcasts), transformers 5.25, peft 0.21,
//             bitsandbytes 0.50 (PeftOptions); verified by tools/peft_saved_tensors.py.
//   megatron  Korthikanti et al. 2022, sbh(34 + 5as/h) bytes per layer (GPT-style reference).
//   zero      the ZeRO paper's 12·h·b·s elements per layer × dtype width (GPT-style reference).
//
// Activation bytes of one layer are written as
//   c_sbh·sbh + c_sbi·sbi + c_as2b·a·s²·b + c_sb·sb (+ bytes that fit none of these)
// where s seq, b batch, h hidden, i intermediate, a heads. Every coefficient is the sum of the
// per-tensor entries below, so each figure can be traced to a tensor and the op that keeps it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainmem/base/bytes.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/base/figures.hpp"

namespace trainmem {

enum class Profile { native, hf_eager, megatron, zero, hf_sdpa, hf_peft };
constexpr int kNumProfiles = 6;

// "native", "hf-eager", "megatron", "zero", "hf-sdpa", "hf-peft"
const char* profile_name(Profile p);
std::optional<Profile> parse_profile(const std::string& s);
// The profiles of a full fine-tune, in the order above (hf-peft is the LoRA one: it is listed
// instead of them when --finetune is lora or qlora).
std::vector<Profile> all_profiles();

// ---------------------------------------------------------------- HF reference semantics
// The code era of a transformers release: the releases whose LLaMA training step saves the
// same tensors (tools/hf_saved_tensors.py checks each listed release against the first).
enum class HfEra {
  v4_28,  // 4.28.0-4.29.x: RMSNorm casts to the weight dtype before weight * y
  v4_30,  // 4.30.x: (weight * y).to(dtype): the multiply saves y in fp32
  v4_31,  // 4.31.0-4.34.x: fp32 upcast first, no torch.max clamp, fp32 logits, repeat_kv
  v4_35,  // 4.35.x: as 4.31, the causal mask a (s,s) storage expanded to (b,1,s,s)
  v5_25,  // 5.25.x: one RoPE table per model, the loss upcasts logits to fp32, SDPA default
};
// PyTorch series: before 2.2 `mean` saves its input (x^2 in RMSNorm); from 2.2 only sizes.
enum class TorchEra { before_2_2, from_2_2 };
// The training loop around the model call (what the caller holds at the end of forward).
enum class Loop {
  hf_model_loss,  // out = model(input_ids, labels=labels); out.loss.backward()
  shift_ce,       // logits = model(input_ids).logits; CrossEntropyLoss on the shifted copy
  none,           // logits = model(input_ids).logits, no loss
};
const char* hf_era_name(HfEra e);        // "4.28", "4.30", "4.31", "4.35", "5.25"
const char* hf_era_range(HfEra e);       // "4.28.0-4.29.x", ...
const char* torch_era_name(TorchEra t);  // "<2.2", ">=2.2"
const char* loop_name(Loop l);           // "hf-model-loss", "shift-ce", "none"
std::vector<HfEra> all_hf_eras();
std::optional<Loop> parse_loop(const std::string& s);

// ---------------------------------------------------------------- LoRA / QLoRA (hf-peft)
// What is trained: every weight (full), LoRA adapters on a frozen 16-bit base (lora), or on a
// frozen bitsandbytes 4-bit base (qlora: NF4 by default).
enum class Finetune { full, lora, qlora };
const char* finetune_name(Finetune f);                            // "full", "lora", "qlora"
std::optional<Finetune> parse_finetune(const std::string& name);  // by finetune_name

// bitsandbytes' optimizers for the adapters of hf-peft (PeftOptions::optimizer):
// bnb.optim.AdamW8bit, PagedAdamW, PagedAdamW8bit (bitsandbytes 0.50; docs/formulas.md, "Profile
// hf-peft"), for library callers; the CLI's `--optimizer` sets the same ones as TrainConfig
// optimizers, which hf-peft reads alike (TrainConfig::optimizer then stays adamw beside these).
enum class BnbOptimizer { none, adamw8bit, paged_adamw, paged_adamw8bit };
const char* bnb_optimizer_name(BnbOptimizer o);  // "adamw8bit", "paged-adamw", ...; "" for none

// bitsandbytes releases as far as they change what hf-peft counts (`--bnb-version`): the 8-bit
// optimizers' absmax covers 2,048 elements up to 0.43 and 256 from 0.44.0 (pull request #1365).
// Releases before 0.43 were not read.
enum class BnbEra { v0_43, v0_44 };
const char* bnb_era_name(BnbEra e);  // "0.43", "0.44-0.50"
// "--bnb-version X" -> its era; InputError naming --bnb-version and the known releases otherwise.
BnbEra parse_bnb_version(const std::string& version);

// peft releases as far as they change what hf-peft counts (`--peft-version`; docs/formulas.md,
// "peft eras"): the adapters' dtype. Up to 0.11.x they take the base weight's dtype (fp32 on a
// 4-bit base, whose weight is uint8), with no option; from 0.12 (pull request #1706,
// autocast_adapter_dtype) fp32 unless autocast_adapter_dtype=False, which a 4-bit base ignored
// until 0.19 (pull request #2893: then its compute dtype). Measured: 0.10.0, 0.11.1, 0.12.0,
// 0.18.1, 0.21.2.
enum class PeftEra { v0_10, v0_12, v0_19 };
const char* peft_era_name(PeftEra e);      // "0.10-0.11", "0.12-0.18", "0.19-0.21"
const char* peft_era_measured(PeftEra e);  // "0.10.0", "0.18.1", "0.21.2"
// "--peft-version X" -> its era; InputError naming --peft-version and the known releases.
PeftEra parse_peft_version(const std::string& version);

// The fine-tuning recipe of the hf-peft profile (docs/lora-plan.md; docs/formulas.md,
// "hf-peft"). Defaults are peft's and the QLoRA recipe's.
struct PeftOptions {
  Finetune finetune = Finetune::full;
  std::int64_t rank = 16;     // LoraConfig.r
  unsigned targets = 0x5;     // LoraTarget bits (lora.hpp); peft's default q_proj, v_proj
  double dropout = 0;         // LoraConfig.lora_dropout, in [0, 1)
  bool adapters_fp32 = true;  // peft's autocast_adapter_dtype: adapters in fp32 (see below)
  Quant quant = Quant::none;  // qlora: nf4 unless given
  bool double_quant = true;   // bnb_4bit_use_double_quant
  std::int64_t quant_blocksize = 64;
  // prepare_model_for_kbit_training (qlora): every non-4-bit weight upcast to fp32 (so the
  // residual stream and the activations are fp32), and, with checkpointing, the embedding's
  // output made to require a gradient.
  bool kbit_prepare = true;
  // The dropout mask as the CPU keeps it (in the dropped tensor's dtype, as the goldens were
  // measured) instead of CUDA's one-byte bool mask. Tests only.
  bool cpu_dropout_mask = false;
  BnbOptimizer optimizer = BnbOptimizer::none;  // none: TrainConfig::optimizer's torch optimizer
  BnbEra bnb_era = BnbEra::v0_44;               // --bnb-version (default: 0.50.2, measured)
  std::string bnb_version;                      // as given; "" when the default
  PeftEra peft_era = PeftEra::v0_19;            // --peft-version (default: 0.21.2, measured)
  std::string peft_version;                     // as given; "" when the default
  // Whether the adapters are fp32 in this era: adapters_fp32 (autocast_adapter_dtype) from
  // 0.19, and before it on a 16-bit base; always on a 4-bit base before 0.19; never on a 16-bit
  // base before 0.11.
  bool adapters_are_fp32() const;
  // trainmem's own step runs the same recipe: the rank, targets, dropout and 4-bit base into
  // `t` (the adapters' dtype and the peft era are hf-peft's alone).
  void apply_to(TrainConfig& t) const;
};

// The precision recipe of an HF step (`--precision`):
//   pure   the model in the training dtype, AdamW's moments in it too (torch AdamW on bf16
//          parameters);
//   amp    an fp32 model under torch.autocast(training dtype): fp32 parameters, gradients and
//          moments, autocast's cache of 16-bit weight copies, the activations as autocast casts
//          them (HF Trainer's bf16=True / fp16=True);
//   mixed  a 16-bit model with fp32 master weights and AdamW on them (DeepSpeed, Megatron,
//          LOMO's Table 1): `m.grad = p.grad.float()` before the step, `p.copy_(m)` after.
enum class Precision { pure, amp, mixed };
const char* precision_name(Precision p);  // "pure", "amp", "mixed"
std::optional<Precision> parse_precision(const std::string& s);

// torch.optim.AdamW's implementation (`--adamw-impl`): foreach (PyTorch's default on a GPU: one
// list of sqrt(exp_avg_sq) tensors alive through the update), fused (no temporaries), forloop
// (one parameter at a time: sqrt and the division's result).
enum class AdamwImpl { foreach_, fused, forloop };
const char* adamw_impl_name(AdamwImpl a);  // "foreach", "fused", "forloop"
std::optional<AdamwImpl> parse_adamw_impl(const std::string& s);

// The HF profiles' options. Unset era/torch: the profile's default (hf-eager: transformers 4.30
// with PyTorch 2.0; hf-sdpa: transformers 5.25 with PyTorch 2.15).
struct HfOptions {
  std::optional<HfEra> era;
  std::string hf_version;  // as given (e.g. "4.29.2"); "" when the default
  std::optional<TorchEra> torch;
  std::string torch_version;             // as given; "" when the default
  int torch_major = 0, torch_minor = 0;  // parsed torch_version (0.0 when not given)
  Loop loop = Loop::hf_model_loss;
  bool use_cache = false;  // the model returns past_key_values (off under checkpointing)
  PeftOptions peft;        // hf-peft only
  // hf-eager on a mixture of experts (`--experts-impl`): transformers 5.25's experts
  // implementation, "grouped_mm" (its default where torch._grouped_mm dispatches: the tokens
  // sorted by expert, one grouped GEMM per projection) or "eager" (a loop over the experts hit);
  // docs/formulas.md, "Mixture of experts".
  bool experts_grouped_mm = true;
  // The precision recipe (`--precision`) and torch AdamW's implementation (`--adamw-impl`), which
  // the step's event sequence (hf_step.hpp) models. Unset: recipe(dtype) below.
  std::optional<Precision> precision;
  AdamwImpl adamw_impl = AdamwImpl::foreach_;
  // The recipe in force: `precision` when given; otherwise mixed for a 16-bit dtype (the 16-bit
  // model with fp32 master weights and AdamW states these profiles have always counted, as
  // trainmem's own step runs it) and pure for fp32 (nothing to cast).
  Precision recipe(DType dtype) const;
};
// "--hf-version X" -> its era; InputError naming --hf-version and the known eras otherwise.
HfEra parse_hf_version(const std::string& version);
// "--torch-version X" -> its series (and major/minor into `opts`); InputError naming
// --torch-version and the known series otherwise.
TorchEra parse_torch_version(const std::string& version, HfOptions* opts = nullptr);
// Checks the combination for one profile (hf-sdpa needs the 5.25 era; 5.25 needs PyTorch >= 2.6):
// InputError naming the flag otherwise. No-op for non-HF profiles.
void check_hf_options(Profile profile, const HfOptions& opts);
// The era the HF profiles use for this model: opts.era when set, else the profile's default
// (hf-eager 4.30, hf-sdpa 5.25), except that a model the older eras cannot express (a family
// other than llama, an explicit head_dim, q/k/v biases, q/k norms, a sliding window, rope
// scaling) defaults to 5.25, the one era whose classes were measured for them, and so does a
// --precision other than mixed (the step's event sequence models 5.25).
HfEra hf_era_for(Profile profile, const HfOptions& opts, const ModelConfig& model);
// The model against the era: InputError naming --hf-version (or the config field when no era
// was given) for a family or feature whose HF class was not measured in that era by
// tools/hf_saved_tensors.py (tests/data/hf_golden/<family>-<era>*.json). No-op for non-HF
// profiles.
void check_hf_model(Profile profile, const HfOptions& opts, const ModelConfig& model);
// A mixture of experts under `--experts-impl grouped_mm` (transformers 5.x's default): why
// torch._grouped_mm would refuse the experts' rows (not a multiple of 16 bytes in `dtype`), or ""
// when it runs (or the model is dense, or opts say eager).
std::string grouped_mm_problem(const ModelConfig& model, DType dtype, const HfOptions& opts);

// The monomial one activation tensor's bytes are proportional to.
//   sbh: s·b·h   sbi: s·b·i   as2b: a·s²·b   sb: s·b   other: none of these (fixed bytes for
//   the given configuration, e.g. a (b, s-1, V) head tensor or a 0-dim constant)
enum class Term { sbh, sbi, as2b, sb, other };
const char* term_name(Term t);  // "sbh", "sbi", "as2b", "sb", "other"

// One tensor kept (or transiently allocated) by a profile.
struct TensorEntry {
  std::string name;   // e.g. "probs", "input_layernorm.x_f32"
  std::string shape;  // shape expression in the project's letters, e.g. "(b,a,s,s)"
  std::string dtype;  // "fp16", "bf16", "fp32", "int64", "int8" (1-byte masks)
  std::uint64_t bytes = 0;
  Term term = Term::other;
  double coefficient = 0;  // bytes = coefficient · monomial(term); for `other`, = bytes
  std::string kept_by;     // the op (or plan step) that keeps it
  std::string why;         // why it is needed
};

// Per-layer coefficients (bytes per unit of each monomial). `other_bytes` holds what fits no
// monomial (per layer, for this configuration).
struct Coefficients {
  double sbh = 0;
  double sbi = 0;
  double as2b = 0;
  double sb = 0;
  std::uint64_t other_bytes = 0;
};

// Sums entries' coefficients (checked byte sum in `other_bytes` only for Term::other).
Coefficients sum_coefficients(const std::vector<TensorEntry>& entries);
std::uint64_t sum_bytes(const std::vector<TensorEntry>& entries);

// The activation books of one profile for one configuration.
struct ActivationBreakdown {
  // Alive at the end of forward:
  std::vector<TensorEntry> embedding;  // before layer 0 (once)
  std::vector<TensorEntry> layer;      // what ONE layer keeps (identical for every layer)
  std::vector<TensorEntry> shared;     // kept once for all layers (e.g. HF checkpointing's mask)
  std::vector<TensorEntry> head;       // final norm, lm_head, loss (once)
  // What the training loop holds at the end of forward beyond the saved tensors (HF
  // profiles: the returned logits, past_key_values with use_cache); counted in activations.
  std::vector<TensorEntry> loop;
  // Models whose windowed layers keep a different list from the full-causal ones (HF SDPA
  // with a sliding window in some layers only, e.g. Qwen2 with use_sliding_window from
  // max_window_layers: the mask and k, v repeated to all heads): what ONE windowed layer keeps,
  // and how many layers do; `layer` is then the other layers' list. Empty and 0 otherwise
  // (when every layer keeps the same list, it is `layer`).
  std::vector<TensorEntry> layer_windowed;
  std::int64_t windowed_layers = 0;
  std::uint64_t layer_windowed_bytes = 0;
  // A mixture of experts whose layers are not all MoE (Qwen's decoder_sparse_step,
  // mlp_only_layers): what ONE dense layer keeps, and how many do; `layer` is then the MoE
  // layers' list. Empty and 0 otherwise. (native under a per-layer checkpointing policy: the
  // dense layers not checkpointed; a checkpointed layer of either kind is in
  // layer_checkpointed.)
  std::vector<TensorEntry> layer_dense;
  std::int64_t dense_layers = 0;
  std::uint64_t layer_dense_bytes = 0;
  // A per-layer checkpointing policy that checkpoints some layers but not all (every:K,
  // layers:LIST, budget:SIZE): what ONE checkpointed layer keeps, and how many do; `layer` is
  // then what each of the others keeps. Empty and 0 when every layer keeps the same list (with
  // every layer checkpointed, `layer` is the checkpointed layer's list).
  std::vector<TensorEntry> layer_checkpointed;
  std::int64_t checkpointed_layers = 0;
  std::uint64_t layer_checkpointed_bytes = 0;
  // Checkpointing: what one checkpointed layer re-creates during its backward (empty otherwise).
  std::vector<TensorEntry> recompute;
  // Inputs (token ids, labels), reported as `inputs`, not as activations.
  std::vector<TensorEntry> inputs;

  Coefficients per_layer;             // of `layer`
  std::uint64_t per_layer_bytes = 0;  // sum of `layer`
  std::uint64_t embedding_bytes = 0;
  std::uint64_t shared_bytes = 0;
  std::uint64_t head_bytes = 0;
  std::uint64_t loop_bytes = 0;
  std::uint64_t recompute_bytes = 0;
  std::int64_t layers = 0;
  // embedding + (layers − windowed_layers − dense_layers − checkpointed_layers)·per_layer
  // + windowed_layers·layer_windowed + dense_layers·layer_dense
  // + checkpointed_layers·layer_checkpointed + shared + head
  // + loop − offloaded (= MemoryFigures::activations: what is on the device)
  std::uint64_t total_bytes = 0;
  // --offload-activations (native): what the layers but the last keep in host memory at the end
  // of forward, their inputs included (docs/formulas.md, "Activation offload"); 0 otherwise.
  std::uint64_t offloaded_bytes = 0;
  // What layer 0 keeps when it differs from the others (hf-peft without checkpointing: the
  // frozen embedding's output needs no gradient, so layer 0's first norm saves nothing); empty
  // otherwise. `layer` is then what each of layers 1..L-1 keeps.
  std::vector<TensorEntry> first_layer;
  std::uint64_t first_layer_bytes = 0;
};

// One parameter tensor (HuggingFace name, shape, element count).
struct ParamSpec {
  std::string name;  // e.g. "model.layers.3.mlp.down_proj.weight"
  std::vector<std::int64_t> shape;
  std::uint64_t elements = 0;
};
// All parameters in setup order (docs/native-plan.md, Setup 1). lm_head omitted when tied.
std::vector<ParamSpec> parameter_specs(const ModelConfig& m);
std::uint64_t parameter_count(const std::vector<ParamSpec>& specs);

// One instant of the step the native peak is taken over (in chronological order).
struct Instant {
  std::string name;       // e.g. "backward layer L-1 step 6 (attention backward)"
  CategoryBytes bytes{};  // live bytes per category at that instant
  std::uint64_t total() const;
};

struct Estimate {
  Profile profile = Profile::native;
  std::string label;  // what the profile is (shown in tables and JSON)
  ModelConfig model;
  TrainConfig train;
  MemoryFigures figures;
  ActivationBreakdown activations;
  std::uint64_t param_count = 0;
  // Elements that receive a gradient and optimizer states (every parameter, except under
  // hf-peft: the adapters only).
  std::uint64_t trainable_params = 0;
  std::uint64_t largest_gradient_bytes = 0;  // largest single gradient tensor
  std::string largest_gradient_name;
  // native: the floating-point operations the checkpointing policy re-runs in backward per
  // optimizer step on this rank (docs/formulas.md, "Per-layer policies"); 0 without recompute.
  double recompute_flops = 0;
  // native, --offload-activations: the host bytes the offloaded activations peak at (the end of
  // forward), and the bytes copied per optimizer step, device to host and back (2 × that).
  std::uint64_t offload_host_bytes = 0;
  std::uint64_t offload_transfer_bytes = 0;
  // native: the candidate instants, chronological, and the index of the peak one.
  std::vector<Instant> instants;
  int peak_instant = -1;
  // HF profiles: the options in force (era and torch resolved to the defaults when unset) and
  // what use_cache=True adds (or would add) to the loop: past_key_values beyond the saved
  // tensors (0 under checkpointing, where HF turns the cache off).
  HfOptions hf;
  std::uint64_t use_cache_bytes = 0;
  // hf-eager/hf-sdpa in transformers 5.25: peak, workspace and instants come from the step's
  // event sequence (hf_step.hpp) under the precision recipe hf.recipe(train.dtype).
  bool hf_step_peak = false;
  // A paged bitsandbytes optimizer (hf-peft, and every profile of `--optimizer paged-adamw|
  // paged-adamw8bit`): the state tensors it allocates as CUDA managed memory (cudaMallocManaged:
  // outside PyTorch's allocator and trainmem's pool, migrated on demand and evicted under
  // pressure). Not in figures.optimizer_states nor in the peak.
  std::uint64_t optimizer_states_managed = 0;
  // Plain-language notes: what the profile assumes, what it ignores, how peak is defined.
  std::vector<std::string> notes;
};

// The closed-form estimate. Validates model and train (InputError naming the field).
// Sizes use checked 64-bit arithmetic (OverflowError when they do not fit).
// `hf` applies to the HF profiles only (hf-eager, hf-sdpa); check_hf_options() is called.
Estimate estimate(Profile profile, const ModelConfig& model, const TrainConfig& train,
                  const HfOptions& hf = {});

// The rules shared by every profile (docs/design.md "Optimizer states"), in bytes:
// params P·w; gradients P·w (AdamW, SGD) or the largest single gradient (LOMO; plus the
// embedding gradient when embeddings are tied, which stays alive through the backward);
// optimizer states: AdamW 12 B/param (8 when the training dtype is fp32: no master copy),
// SGD 4 B/param (0 in fp32), LOMO 0.
struct StateFigures {
  std::uint64_t params = 0;     // bytes (QLoRA: the 4-bit weights' storage)
  std::uint64_t elements = 0;   // every parameter's elements, the adapters' included
  std::uint64_t trainable = 0;  // elements: every parameter, or LoRA's adapters (train.lora())
  std::uint64_t gradients = 0;
  std::uint64_t optimizer_states = 0;
  // A paged bitsandbytes optimizer's states in managed memory (not in optimizer_states).
  std::uint64_t optimizer_states_managed = 0;
  std::uint64_t largest_gradient_bytes = 0;
  std::string largest_gradient_name;
};
// Under LoRA (train.lora(), trainmem's own step) the params hold the adapters too, and only the
// adapters have gradients and states (docs/native-plan.md, "LoRA").
StateFigures state_figures(const ModelConfig& model, const TrainConfig& train);

// The cuBLAS workspace the native plan allocates at setup (32 MiB).
constexpr std::uint64_t kCublasWorkspaceBytes = 33554432;

}  // namespace trainmem
