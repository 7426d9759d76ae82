// The LLaMA training step (see include/trainmem/model/model.hpp).
//
// THE PLAN. What this file allocates, in which order, with which names, categories, layers
// and phases is specified by docs/native-plan.md, and nothing else: the analytic `native`
// profile (src/analytic*) reproduces the same figures in closed form from that page, and the
// tests compare the two byte for byte. Summary (b batch, s seq, h hidden, i intermediate,
// a heads, k kv heads, d head dim, V vocab, D training dtype):
//
//   setup     params (HF names) -> gradients (AdamW/SGD) -> optimizer states per parameter
//             (.master when D != fp32, .exp_avg, .exp_avg_sq) -> inputs tokens, targets
//             -> ws cublas_workspace (32 MiB)
//   forward   embed_out; per layer rstd1 xn1 (q_pre k_pre q_rstd k_rstd: qk_norm) q k v
//             probs|lse attn_out h_mid rstd2 xn2 gate up act out, the rows of kLayerActs
//             (include/trainmem/model/model_acts.hpp), which also
//             says what checkpointing frees and recomputes and which backward step frees each
//             (checkpointing full: all but `out` freed right after `out`);
//             final_norm_out final_rstd logits ce_lse, ws ce_losses (freed)
//   backward  head: dlogits in place of logits, ws d_final_norm_out, ws d_residual;
//             per layer (recompute first when checkpointing) ws d_act, d_gate, d_up, d_xn2,
//             d_attn_out, d_q, d_k, d_v, d_probs|attn_delta, (d_q_pre, d_k_pre: qk_norm),
//             d_xn1; embedding. Biases (qkv_bias): their gradients right after their weights'.
//             LOMO: each gradient allocated right before the op producing it, then the update
//             and the free (tied: the embedding gradient lives from the head to the end).
//   optimizer AdamW/SGD over all parameters in setup order; no allocations.
//   LoRA      (TrainConfig::lora_rank > 0) each target's lora_A, lora_B after its weight; only
//             they have gradients and states; each target's row lora_a.<proj> (b,s,r) and, in
//             backward, ws d_lora_a.<proj> (b,s,r) around its adapter's GEMMs ("LoRA").
//   offload   --offload-activations: each layer but the last sends its input and kept rows to
//             a host ledger after the next layer's forward and gets them back before the layer
//             above it runs its backward ("Activation offload").
//
// The layers' part of the plan (forward, recompute, backward) is src/model/decoder_layer.cpp,
// shared with every rank of the sharded step; this file is the world-size-1 host of it.
//
// Any change here is a change to docs/native-plan.md first (and to the analytic profile).
#include "trainmem/model/model.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {

namespace {

using LA = LayerAct;
constexpr DType f32 = DType::f32;
constexpr DType i32 = DType::i32;

constexpr std::uint64_t kTokenStream = 0x746f6b656e73ull;  // "tokens"

}  // namespace

float loss_scale(DType d, std::int64_t positions) {
  // b·(s−1) makes the cross-entropy backward's scale exactly 1 (see cross_entropy_scale). Past
  // 2^24 positions float(positions) is rounded, which only makes S a slightly different
  // constant: the same float S scales the loss and is divided out.
  return d == DType::f16 ? float(positions) : 1.0f;
}

std::uint64_t Parameter::numel() const {
  std::uint64_t n = 1;
  for (auto d : shape) n = checked_mul(n, std::uint64_t(d), "parameter size");
  return n;
}

// ------------------------------------------------------------------------------ setup

LlamaModel::LlamaModel(const ModelConfig& model, const TrainConfig& train, Backend& backend,
                       Ledger& ledger, const OptimizerSettings& optimizer)
    : cfg_(model),
      train_(train),
      be_(backend),
      ledger_(ledger),
      D_(backend.dtype()),
      managed_ledger_(paged_optimizer(optimizer.kind)
                          ? std::make_unique<Ledger>(backend.managed_allocator())
                          : nullptr),
      opt_(optimizer, backend, ledger, managed_ledger_.get()) {
  cfg_.validate();
  train_.validate();
  require_native_moe(cfg_, train_, "trainmem's own step");
  train_.check_checkpoint_resolved("this command");
  if (train_.dtype != be_.dtype())
    throw Error(std::string("model: training dtype ") + dtype_name(train_.dtype) +
                " differs from the backend's " + dtype_name(be_.dtype()));
  if (optimizer.kind != train_.optimizer)
    throw Error(std::string("model: optimizer settings are for ") + optimizer_name(optimizer.kind) +
                ", the run asks for " + optimizer_name(train_.optimizer));
  b_ = train_.batch;
  s_ = train_.seq;
  h_ = cfg_.hidden;
  i_ = cfg_.intermediate;
  a_ = cfg_.heads;
  k_ = cfg_.kv_heads;
  d_ = cfg_.head_dim();
  V_ = cfg_.vocab;
  n_ = std::int64_t(checked_mul(std::uint64_t(b_), std::uint64_t(s_), "batch x seq"));
  loss_scale_ = trainmem::loss_scale(D_, b_ * (s_ - 1));
  // Every buffer's byte count must fit: the largest are logits (b,s,V) and probs (b,a,s,s).
  checked_product({std::uint64_t(n_), std::uint64_t(V_), 4}, "logits bytes");
  checked_product({std::uint64_t(n_), std::uint64_t(a_), std::uint64_t(s_), 4}, "probs bytes");
  checked_product({std::uint64_t(n_), std::uint64_t(i_), 4}, "intermediate activation bytes");
  if (cfg_.moe())  // the experts' rows: n·K of width h and of width m
    checked_product(
        {std::uint64_t(n_), std::uint64_t(cfg_.experts_per_token),
         std::uint64_t(std::max({h_, cfg_.expert_intermediate, cfg_.shared_expert_intermediate})),
         4},
        "experts' activation bytes");
  layers_.resize(std::size_t(cfg_.layers));
  if (train_.offload_activations) offload_ = std::make_unique<ActivationOffload>(&be_, cfg_.layers);

  auto setup = ledger_.scope(Phase::setup);

  // 1. params, D, in HF order. QLoRA: each base projection as bitsandbytes' 4-bit tensors
  // (docs/native-plan.md, "QLoRA"): the packed pairs under the weight's name, then its absmax,
  // code, and under double quantization the nested absmax, nested code and offset.
  auto add = [&](std::string name, int layer, std::vector<std::int64_t> shape, bool quantized) {
    Parameter p;
    // LoRA: only the adapters train (docs/native-plan.md, "LoRA").
    p.trainable = !train_.lora() || name.find(".lora_") != std::string::npos;
    p.name = std::move(name);
    p.layer = layer;
    p.shape = std::move(shape);
    if (!quantized) {
      p.value = ledger_.allocate(p.name, Category::params, layer, p.shape, D_);
      params_.push_back(std::move(p));
      return;
    }
    QuantParam q = allocate_quantized(ledger_, p.name, layer, p.shape, train_);
    p.value = std::move(q.packed);  // the packed pairs, under the weight's name
    p.quant = int(quant_.size());
    quant_.push_back(std::move(q));
    params_.push_back(std::move(p));
  };
  // A layer's parameters, in setup order (decoder_layer.hpp): slot, HF name after
  // "model.layers.N.", shape; a dense layer's [0] and a mixture-of-experts layer's [1] (Qwen
  // keeps dense layers among MoE ones).
  const ActDims dims = ActDims::of(cfg_, train_);
  const std::vector<LayerParamSpec> layer_specs[2] = {layer_param_specs(cfg_, dims, false),
                                                      layer_param_specs(cfg_, dims, true)};
  for (int kind = 0; kind < 2; ++kind) {
    layer_slot_[kind].assign(kLayerParams, -1);
    for (std::size_t j = 0; j < layer_specs[kind].size(); ++j)
      layer_slot_[kind][std::size_t(layer_specs[kind][j].slot)] = int(j);
  }

  add("model.embed_tokens.weight", -1, {V_, h_}, false);
  for (int l = 0; l < cfg_.layers; ++l) {
    layer_first_.push_back(params_.size());
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    for (const auto& spec : layer_specs[cfg_.is_moe_layer(l) ? 1 : 0])
      add(pre + spec.name, l, spec.shape, train_.quantized() && is_quantizable_slot(spec.slot));
  }
  layer_first_.push_back(params_.size());
  add("model.norm.weight", -1, {h_}, false);
  if (!cfg_.tied_embeddings) add("lm_head.weight", -1, {V_, h_}, false);

  // 2. gradients, D, persistent (AdamW/SGD). LOMO allocates them during backward.
  if (opt_.holds_gradients())
    for (auto& p : params_)
      if (p.trainable)
        p.grad = ledger_.allocate(p.name + ".grad", Category::gradients, p.layer, p.shape, D_);

  // 3. optimizer states, f32, per trainable parameter in order.
  for (auto& p : params_)
    if (p.trainable) p.opt_index = opt_.add_parameter(p.name, p.layer, p.shape);

  // 4. inputs.
  tokens_ = ledger_.allocate("tokens", Category::inputs, -1, {b_, s_}, i32);
  targets_ = ledger_.allocate("targets", Category::inputs, -1, {b_, s_}, i32);

  // 5. the GEMM workspace (cuBLAS's 32 MiB; allocated on every backend so that the ledgers
  // agree). Held as 8 Mi fp32 elements.
  gemm_workspace_ = ledger_.allocate("cublas_workspace", Category::workspace, -1,
                                     {std::int64_t(kGemmWorkspaceBytes / 4)}, f32);
  be_.set_gemm_workspace(gemm_workspace_.data(), gemm_workspace_.bytes());
}

LlamaModel::~LlamaModel() {
  try {
    be_.set_gemm_workspace(nullptr, 0);
  } catch (const std::exception& e) {
    spdlog::warn("model: could not hand the backend its default GEMM workspace back: {}", e.what());
  }
}

float LlamaModel::cross_entropy_scale() const {
  // With S = 1 this is 1.0f / float(b·(s−1)), the mean loss's scale, bit for bit.
  return loss_scale_ / float(b_ * (s_ - 1));
}

std::size_t LlamaModel::head_index() const {
  return cfg_.tied_embeddings ? 0 : final_norm_index() + 1;
}

const Parameter& LlamaModel::parameter(const std::string& hf_name) const {
  for (const auto& p : params_)
    if (p.name == hf_name) return p;
  throw InputError("model: no parameter named '" + hf_name + "'");
}

std::vector<float> LlamaModel::parameter_values(const std::string& hf_name) const {
  const auto& p = parameter(hf_name);
  if (!be_.computes()) throw Error("model: parameter values are not available on this backend");
  if (p.quant >= 0)
    throw Error("model: " + hf_name +
                " is a quantized (4-bit or int8) weight; quant4_weight() gives its storage");
  std::vector<unsigned char> raw(p.value.bytes());
  be_.download(raw.data(), p.value.data(), raw.size());
  std::vector<float> out(p.numel());
  for (std::size_t e = 0; e < out.size(); ++e) out[e] = load_as_f32(raw.data(), e, D_);
  return out;
}

const Quant4View* LlamaModel::quant4_weight(const std::string& hf_name) const {
  const auto& p = parameter(hf_name);
  return p.quant >= 0 ? &quant_[std::size_t(p.quant)].view : nullptr;
}

Tensor LlamaModel::act(const char* name, int layer, std::vector<std::int64_t> shape, DType dt) {
  return ledger_.allocate(name, Category::activations, layer, std::move(shape), dt);
}
Tensor LlamaModel::ws(const char* name, int layer, std::vector<std::int64_t> shape, DType dt) {
  return ledger_.allocate(name, Category::workspace, layer, std::move(shape), dt);
}

// ------------------------------------------------------------------------------ weights, tokens

void LlamaModel::init_random(std::uint64_t seed) {
  // A 4-bit weight's quantization allocates on every backend (the meta trace books it too).
  for (std::size_t pi = 0; pi < params_.size(); ++pi)
    if (be_.computes() || params_[pi].quant >= 0) init_parameter(pi, seed);
  weights_set_ = true;
}

void LlamaModel::init_parameter(std::size_t pi, std::uint64_t seed) {
  // Norm weights 1 and biases 0 (HF's _init_weights: RMSNorm weight ones, nn.Linear bias
  // zeros), LoRA's B 0 (peft: the adapter starts as the identity), every other weight
  // 0.02 * N(0,1) from its own stream (the parameter's index + 1), computed by the backend (on the
  // device for cuda: include/trainmem/base/param_init.hpp). LoRA's A is drawn like the other
  // weights (peft's kaiming-uniform draw changes no byte).
  auto& p = params_[pi];
  auto ends_with = [&](const std::string& tail) {
    return p.name.size() > tail.size() &&
           p.name.compare(p.name.size() - tail.size(), tail.size(), tail) == 0;
  };
  ParamInit init;
  if (p.shape.size() == 1 || ends_with(".lora_B.weight")) {
    init.kind = ParamInit::Kind::constant;
    init.value = p.shape.size() == 1 && !ends_with(".bias") ? 1.0f : 0.0f;
  } else {
    init.kind = ParamInit::Kind::normal;
    init.scale = 0.02f;
    init.seed = seed;
    init.stream = pi + 1;
  }
  if (p.quant >= 0) {
    quantize_parameter(pi, [&](void* dense) { be_.init_param(dense, nullptr, p.numel(), init); });
    return;
  }
  be_.init_param(p.value.data(), opt_.master(p.opt_index), p.numel(), init);
}

void LlamaModel::quantize_parameter(std::size_t pi, const std::function<void(void*)>& fill) {
  Parameter& p = params_[pi];
  quantize_base(ledger_, &be_, p.value.as<std::uint8_t>(), quant_[std::size_t(p.quant)], p.layer,
                p.shape, train_, fill);
}

void LlamaModel::set_parameter_values(const std::string& hf_name,
                                      const std::vector<float>& values) {
  for (std::size_t pi = 0; pi < params_.size(); ++pi) {
    if (params_[pi].name != hf_name) continue;
    if (values.size() != params_[pi].numel())
      throw Error("model: set_parameter_values(" + hf_name + "): " + std::to_string(values.size()) +
                  " values for " + std::to_string(params_[pi].numel()) + " elements");
    if (!be_.computes()) return;
    write_parameter(pi, [&](float* dst, std::uint64_t first, std::uint64_t count) {
      std::copy(values.begin() + std::ptrdiff_t(first),
                values.begin() + std::ptrdiff_t(first + count), dst);
    });
    return;
  }
  throw InputError("model: no parameter named '" + hf_name + "'");
}

void LlamaModel::set_tokens(const std::vector<std::int32_t>& ids, const std::string& source) {
  if (std::int64_t(ids.size()) != n_)
    throw InputError(source + ": " + std::to_string(ids.size()) +
                     " token ids, expected batch x seq = " + std::to_string(b_) + " x " +
                     std::to_string(s_) + " = " + std::to_string(n_));
  for (std::size_t j = 0; j < ids.size(); ++j)
    if (ids[j] < 0 || ids[j] >= V_)
      throw InputError(source + ": token id " + std::to_string(ids[j]) + " at position " +
                       std::to_string(j) + " (row " + std::to_string(j / std::size_t(s_)) +
                       ", column " + std::to_string(j % std::size_t(s_)) +
                       ") is outside the vocabulary [0, " + std::to_string(V_) + ")");
  host_tokens_ = ids;
  upload_inputs();
  tokens_set_ = true;
}

std::vector<std::int32_t> random_token_ids(std::uint64_t seed, std::int64_t n, std::int64_t vocab) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (std::size_t j = 0; j < ids.size(); ++j)
    ids[j] = std::int32_t(random_bits(seed, kTokenStream, j) % std::uint64_t(vocab));
  return ids;
}

void LlamaModel::random_tokens(std::uint64_t seed) {
  set_tokens(random_token_ids(seed, n_, V_), "random tokens");
}

void LlamaModel::upload_inputs() {
  // targets[t] = tokens[t+1] within a row, -1 (ignored) at the last position: the shifted
  // HF causal-LM loss over b·(s−1) positions.
  std::vector<std::int32_t> targets(host_tokens_.size());
  for (std::int64_t r = 0; r < b_; ++r)
    for (std::int64_t t = 0; t < s_; ++t)
      targets[std::size_t(r * s_ + t)] =
          t + 1 < s_ ? host_tokens_[std::size_t(r * s_ + t + 1)] : -1;
  if (be_.computes()) {
    be_.upload(tokens_.data(), host_tokens_.data(), tokens_.bytes());
    be_.upload(targets_.data(), targets.data(), targets_.bytes());
  }
}

// ------------------------------------------------------------------------------ the step

float LlamaModel::train_step(const GradientCapture& capture) {
  if (be_.computes() && !weights_set_)
    throw Error("model: train_step before init_random() or load_weights()");
  if (be_.computes() && !tokens_set_)
    throw Error("model: train_step before set_tokens() or random_tokens()");
  ++step_;
  ledger_.begin_step(step_);
  if (offload_) offload_->begin_step(step_);
  forward();
  backward(capture);
  {
    auto ph = ledger_.scope(Phase::optimizer);
    if (opt_.holds_gradients())
      for (auto& p : params_)
        if (p.trainable)
          opt_.update(p.opt_index, p.value.data(), p.grad.data(), step_, 1.0f / loss_scale_);
  }
  ++dropout_step_;
  return loss_;
}

LayerRank LlamaModel::layer_rank() {
  LayerRank R{cfg_, train_, ledger_, &be_, *this, ActDims::of(cfg_, train_)};
  R.dropout_seed = dropout_seed_;
  R.dropout_step = dropout_step_;
  return R;
}
const void* LlamaModel::weight(std::int64_t l, int slot) {
  const Parameter& p = params_[layer_param(int(l), slot)];
  if (p.quant >= 0)
    throw Error("model: " + p.name + " is a quantized weight; the layer dequantizes it (quant4)");
  return p.value.data();
}
const Quant4View* LlamaModel::quant4(std::int64_t l, int slot) {
  const Parameter& p = params_[layer_param(int(l), slot)];
  return p.quant >= 0 ? &quant_[std::size_t(p.quant)].view : nullptr;
}
void* LlamaModel::grad(std::int64_t l, int slot) {
  return begin_grad(layer_param(int(l), slot));
}
double LlamaModel::router_aux_loss() {
  // No router, no loss (a MoE config whose every layer is dense: mlp_only_layers).
  if (!cfg_.output_router_logits || cfg_.moe_layer_count() == 0) return 0.0;
  // HF's load_balancing_loss_func over every MoE layer's T = b·s tokens: with C_e the (token,
  // choice) pairs routed to expert e and P_e the sum of its probabilities, both over the L
  // layers, aux = E·Σ_e (C_e / LT)·(P_e / LT); the loss adds coef·aux. Its gradient by each
  // probability is coef·E·C_e / (LT)², whatever the token (the counts are constants), times the
  // loss scale as the cross-entropy's gradient is.
  // L counts the MoE layers (HF concatenates the routers' logits; a dense layer has none).
  const double E = double(cfg_.experts), LT = double(cfg_.moe_layer_count()) * double(n_);
  const double coef = cfg_.router_aux_loss_coef;
  double aux = 0.0;
  for (std::size_t e = 0; e < aux_counts_.size(); ++e) {
    aux += (aux_counts_[e] / LT) * (aux_prob_sums_[e] / LT);
    aux_grad_[e] = float(double(loss_scale_) * coef * E * aux_counts_[e] / (LT * LT));
  }
  return coef * E * aux;
}

void LlamaModel::moe_routed(int g, const std::vector<std::int32_t>& off, const Tensor& topk_idx,
                            const Tensor& probs) {
  if (!be_.computes()) return;
  routing_.resize(std::size_t(cfg_.layers));
  LayerRouting& r = routing_[std::size_t(g)];
  std::vector<std::int32_t> idx(std::size_t(topk_idx.bytes() / sizeof(std::int32_t)));
  be_.download(idx.data(), topk_idx.data(), topk_idx.bytes());
  // The choices routed to each expert (before a capacity drops any: the load-balancing loss counts
  // them so, as Megatron's does); the offsets count the kept rows.
  r.tokens_per_expert.assign(off.size() - 1, 0);
  for (std::int32_t e : idx) ++r.tokens_per_expert[std::size_t(e)];
  r.dropped = std::int64_t(idx.size()) - off.back();
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a, 64-bit, over the indices' bytes
  for (std::int32_t v : idx)
    for (int k = 0; k < 4; ++k) {
      h ^= (std::uint32_t(v) >> (8 * k)) & 0xffu;
      h *= 1099511628211ull;
    }
  r.fingerprint = h;
  if (!cfg_.output_router_logits) return;
  // The load-balancing loss's statistics (docs/formulas.md, "The load-balancing loss").
  const std::size_t E = std::size_t(cfg_.experts);
  std::vector<float> p(std::size_t(probs.bytes() / sizeof(float)));
  be_.download(p.data(), probs.data(), probs.bytes());
  for (std::size_t e = 0; e < E; ++e) aux_counts_[e] += double(r.tokens_per_expert[e]);
  for (std::size_t t = 0; t * E < p.size(); ++t)
    for (std::size_t e = 0; e < E; ++e) aux_prob_sums_[e] += double(p[t * E + e]);
}

const float* LlamaModel::moe_aux_grad() {
  return cfg_.output_router_logits ? aux_grad_.data() : nullptr;
}

void LlamaModel::grad_done(std::int64_t l, int slot) {
  end_grad(layer_param(int(l), slot), *capture_);
}

void LlamaModel::forward() {
  auto ph = ledger_.scope(Phase::forward);
  if (cfg_.output_router_logits) {  // this step's load-balancing statistics start afresh
    aux_counts_.assign(std::size_t(cfg_.experts), 0.0);
    aux_prob_sums_.assign(std::size_t(cfg_.experts), 0.0);
    aux_grad_.assign(std::size_t(cfg_.experts), 0.0f);
  }
  embed_out_ = act("embed_out", -1, {b_, s_, h_}, D_);  // x_0
  be_.embedding_forward(embed_out_.data(), tokens_.as<std::int32_t>(), params_[0].value.data(), b_,
                        s_, h_, V_);
  const void* x = embed_out_.data();
  for (int l = 0; l < cfg_.layers; ++l) {
    LayerActs& A = layers_[std::size_t(l)];
    decoder_layer_forward(layer_rank(), l, l, A, ActPass::forward, x);  // frees under checkpointing
    x = A[LA::out].data();
    // Offload: the previous layer's set has reached the host while this layer ran; this one's
    // starts now (double-buffered: two layers' sets at most on the device).
    if (offload_)
      offload_->after_forward(l, l == 0 ? embed_out_ : layers_[std::size_t(l) - 1][LA::out],
                              l == 0 ? "embed_out" : layer_act(LA::out).name, l - 1, A, l);
  }
  // Head.
  final_norm_out_ = act("final_norm_out", -1, {b_, s_, h_}, D_);
  final_rstd_ = act("final_rstd", -1, {b_, s_}, f32);
  be_.rmsnorm_forward(final_norm_out_.data(), final_rstd_.as<float>(), x,
                      params_[final_norm_index()].value.data(), n_, h_, float(cfg_.rms_eps));
  logits_ = act("logits", -1, {b_, s_, V_}, D_);
  be_.matmul(logits_.data(), final_norm_out_.data(), params_[head_index()].value.data(), n_, V_, h_,
             Trans::no, Trans::yes, 1.f, 0.f);
  ce_lse_ = act("ce_lse", -1, {b_, s_}, f32);
  {
    Tensor losses = ws("ce_losses", -1, {b_, s_}, f32);  // 0 at ignored positions
    be_.cross_entropy_forward(losses.as<float>(), ce_lse_.as<float>(), logits_.data(),
                              targets_.as<std::int32_t>(), n_, V_);
    if (be_.computes()) {
      std::vector<float> host(static_cast<std::size_t>(n_));
      be_.download(host.data(), losses.data(), losses.bytes());
      double sum = 0.0;
      for (float v : host) sum += v;
      loss_ = float(sum / double(b_ * (s_ - 1)) + router_aux_loss());
    } else {
      loss_ = std::numeric_limits<float>::quiet_NaN();
    }
  }
  ledger_.mark_end_of_forward();
  act_by_layer_.assign(std::size_t(cfg_.layers) + 1, 0);
  for (const TensorRecord* r : ledger_.live_tensors())
    if (r->category == Category::activations && r->layer >= -1 && r->layer < cfg_.layers)
      act_by_layer_[std::size_t(r->layer + 1)] += r->bytes;
  if (offload_)  // what each layer saved, wherever it is kept
    for (const TensorRecord* r : offload_->host().live_tensors())
      if (r->layer >= -1 && r->layer < cfg_.layers)
        act_by_layer_[std::size_t(r->layer + 1)] += r->bytes;
}

void* LlamaModel::begin_grad(std::size_t index) {
  auto& p = params_[index];
  if (!p.grad) {  // LOMO (AdamW/SGD hold theirs from setup)
    p.grad = ledger_.allocate(p.name + ".grad", Category::gradients, p.layer, p.shape, D_);
    be_.fill_zero(p.grad.data(), p.grad.bytes());
  }
  return p.grad.data();
}

void LlamaModel::capture_grad(std::size_t index, const GradientCapture& capture) {
  if (!capture || !be_.computes() || !params_[index].trainable) return;
  const auto& p = params_[index];
  std::vector<unsigned char> raw(p.grad.bytes());
  be_.download(raw.data(), p.grad.data(), raw.size());
  std::vector<float> g(p.numel());
  // Unscaled: the stored value / S, rounded once (S = 1: the stored value, exactly).
  const double S = loss_scale_;
  for (std::size_t e = 0; e < g.size(); ++e)
    g[e] = float(double(load_as_f32(raw.data(), e, D_)) / S);
  capture(p, g);
}

bool LlamaModel::checks_finite() const {
  return D_ == DType::f16 && be_.computes();
}

void LlamaModel::check_grad_finite(std::size_t index) {
  if (!checks_finite() || !params_[index].trainable) return;
  const auto& p = params_[index];
  be_.check_finite(p.grad.data(), std::int64_t(p.numel()));
}

void LlamaModel::report_nonfinite_grads() {
  if (!checks_finite() || !be_.take_nonfinite()) return;
  grads_nonfinite_ = true;
  // Name them where the gradients are still held (AdamW/SGD); each check waits once, but this
  // only runs on a step that went wrong.
  std::string names;
  if (opt_.holds_gradients()) {
    for (std::size_t pi = 0; pi < params_.size(); ++pi) {
      if (!params_[pi].trainable) continue;
      check_grad_finite(pi);
      if (be_.take_nonfinite()) nonfinite_grads_.push_back(params_[pi].name);
    }
    for (std::size_t j = 0; j < nonfinite_grads_.size() && j < 5; ++j)
      names += (j ? ", " : "") + nonfinite_grads_[j];
    if (nonfinite_grads_.size() > 5) names += ", ...";
    names = std::to_string(nonfinite_grads_.size()) + " of " + std::to_string(params_.size()) +
            " parameters: " + names;
  } else {
    names = "not named under LOMO: each gradient is freed once used";
  }
  spdlog::warn(
      "step {}: gradients hold inf or NaN ({}). fp16 runs scale the loss by S = b·(s−1) = {} "
      "so that the cross-entropy gradient does not underflow; a gradient element overflows "
      "fp16's 65504 where its true value exceeds 65504/S = {:.3g}, unless the step diverged. "
      "The optimizer applied them as they are: this step's numbers mean nothing (its memory "
      "figures are unaffected). bf16 has fp32's range.",
      step_, names, loss_scale_, 65504.0 / double(loss_scale_));
}

void LlamaModel::end_grad(std::size_t index, const GradientCapture& capture) {
  if (opt_.holds_gradients()) return;
  auto& p = params_[index];
  check_grad_finite(index);
  capture_grad(index, capture);
  opt_.update(p.opt_index, p.value.data(), p.grad.data(), step_, 1.0f / loss_scale_);
  p.grad.reset();
}

void LlamaModel::backward(const GradientCapture& capture) {
  auto ph = ledger_.scope(Phase::backward);
  if (opt_.holds_gradients())
    for (auto& p : params_)
      if (p.trainable) be_.fill_zero(p.grad.data(), p.grad.bytes());
  nonfinite_grads_.clear();
  grads_nonfinite_ = false;
  const std::size_t head = head_index(), fnorm = final_norm_index();
  const void* x_L = cfg_.layers > 0 ? layers_.back()[LA::out].data() : embed_out_.data();
  const bool observe = head_observer_ && be_.computes();

  // 1. dlogits in place of logits: the gradient of S·(mean loss), S the loss scale.
  if (observe) head_observer_("logits", logits_.data(), n_, V_);
  be_.cross_entropy_backward(logits_.data(), logits_.data(), ce_lse_.as<float>(),
                             targets_.as<std::int32_t>(), n_, V_, cross_entropy_scale());
  if (observe) head_observer_("dlogits", logits_.data(), n_, V_);
  ce_lse_.reset();
  // 2. through the head. Tied: the embedding gradient, kept until the embedding backward.
  Tensor d_fno = ws("d_final_norm_out", -1, {b_, s_, h_}, D_);
  const bool head_trains = params_[head].trainable;  // LoRA: frozen
  void* dW_head = head_trains ? begin_grad(head) : nullptr;
  be_.matmul(d_fno.data(), logits_.data(), params_[head].value.data(), n_, h_, V_, Trans::no,
             Trans::no, 1.f, 0.f);
  if (head_trains) {
    be_.matmul(dW_head, logits_.data(), final_norm_out_.data(), V_, h_, n_, Trans::yes, Trans::no,
               1.f, 1.f);
    if (!cfg_.tied_embeddings) end_grad(head, capture);
  }
  logits_.reset();
  // 3. final norm; d_residual carries dL/dx from here down to the embedding.
  Tensor d_res = ws("d_residual", -1, {b_, s_, h_}, D_);  // accumulates
  be_.fill_zero(d_res.data(), d_res.bytes());
  const bool fnorm_trains = params_[fnorm].trainable;
  be_.rmsnorm_backward(d_res.data(), fnorm_trains ? begin_grad(fnorm) : nullptr, d_fno.data(), x_L,
                       params_[fnorm].value.data(), final_rstd_.as<float>(), n_, h_);
  if (fnorm_trains) end_grad(fnorm, capture);
  d_fno.reset();
  final_norm_out_.reset();
  final_rstd_.reset();
  if (cfg_.layers > 0) layers_.back()[LA::out].reset();

  capture_ = &capture;
  const LayerRank rank = layer_rank();
  for (int l = int(cfg_.layers) - 1; l >= 0; --l) {
    // Offload: the layer below comes back while this one's backward runs.
    if (offload_) offload_->before_backward(l, ledger_);
    Tensor& x = l == 0 ? embed_out_ : layers_[std::size_t(l) - 1][LayerAct::out];  // x_l
    decoder_layer_backward(rank, l, l, layers_[std::size_t(l)], x, d_res);
    if (offload_) offload_->after_backward(l);
  }
  capture_ = nullptr;

  // Embedding (x_0 = embed_out was freed by layer 0).
  if (params_[0].trainable) {
    be_.embedding_backward(begin_grad(0), d_res.data(), tokens_.as<std::int32_t>(), b_, s_, h_, V_);
    end_grad(0, capture);
  }
  d_res.reset();

  if (opt_.holds_gradients())
    for (std::size_t pi = 0; pi < params_.size(); ++pi) {
      check_grad_finite(pi);
      capture_grad(pi, capture);
    }
  report_nonfinite_grads();
}

}  // namespace trainmem
