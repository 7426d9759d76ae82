// The LLaMA training step (see include/trainmem/model.hpp).
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
//             (include/trainmem/model_acts.hpp), which also
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
//
// Any change here is a change to docs/native-plan.md first (and to the analytic profile).
#include "trainmem/model.hpp"

#include <spdlog/spdlog.h>

#include <cmath>
#include <limits>

#include "trainmem/checked.hpp"
#include "trainmem/error.hpp"

namespace trainmem {

namespace {

using LA = LayerAct;
constexpr DType f32 = DType::f32;
constexpr DType i32 = DType::i32;

// Per-layer parameter slots, in setup order (docs/native-plan.md, Setup 1). The biases exist
// when ModelConfig::qkv_bias, q_norm and k_norm when qk_norm (LlamaModel::layer_slot_).
enum LayerParam : int {
  kInNorm = 0,
  kQ,
  kQBias,
  kK,
  kKBias,
  kV,
  kVBias,
  kO,
  kQNorm,
  kKNorm,
  kPostNorm,
  kGate,
  kUp,
  kDown,
  kLayerParams
};

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
      opt_(optimizer, backend, ledger) {
  cfg_.validate();
  train_.validate();
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
  layers_.resize(std::size_t(cfg_.layers));

  auto setup = ledger_.scope(Phase::setup);

  // 1. params, D, in HF order.
  auto add = [&](std::string name, int layer, std::vector<std::int64_t> shape) {
    Parameter p;
    p.name = std::move(name);
    p.layer = layer;
    p.shape = std::move(shape);
    p.value = ledger_.allocate(p.name, Category::params, layer, p.shape, D_);
    params_.push_back(std::move(p));
  };
  const std::int64_t ad = a_ * d_, kd = k_ * d_;
  // A layer's parameters, in setup order: (slot, HF name after "model.layers.N.", shape).
  struct LayerParamSpec {
    int slot;
    const char* name;
    std::vector<std::int64_t> shape;
  };
  std::vector<LayerParamSpec> layer_specs = {{kInNorm, "input_layernorm.weight", {h_}},
                                             {kQ, "self_attn.q_proj.weight", {ad, h_}}};
  if (cfg_.qkv_bias) layer_specs.push_back({kQBias, "self_attn.q_proj.bias", {ad}});
  layer_specs.push_back({kK, "self_attn.k_proj.weight", {kd, h_}});
  if (cfg_.qkv_bias) layer_specs.push_back({kKBias, "self_attn.k_proj.bias", {kd}});
  layer_specs.push_back({kV, "self_attn.v_proj.weight", {kd, h_}});
  if (cfg_.qkv_bias) layer_specs.push_back({kVBias, "self_attn.v_proj.bias", {kd}});
  layer_specs.push_back({kO, "self_attn.o_proj.weight", {h_, ad}});
  if (cfg_.qk_norm) {
    layer_specs.push_back({kQNorm, "self_attn.q_norm.weight", {d_}});
    layer_specs.push_back({kKNorm, "self_attn.k_norm.weight", {d_}});
  }
  layer_specs.push_back({kPostNorm, "post_attention_layernorm.weight", {h_}});
  layer_specs.push_back({kGate, "mlp.gate_proj.weight", {i_, h_}});
  layer_specs.push_back({kUp, "mlp.up_proj.weight", {i_, h_}});
  layer_specs.push_back({kDown, "mlp.down_proj.weight", {h_, i_}});
  layer_slot_.assign(kLayerParams, -1);
  for (std::size_t j = 0; j < layer_specs.size(); ++j)
    layer_slot_[std::size_t(layer_specs[j].slot)] = int(j);
  per_layer_params_ = layer_specs.size();

  add("model.embed_tokens.weight", -1, {V_, h_});
  for (int l = 0; l < cfg_.layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    for (const auto& spec : layer_specs) add(pre + spec.name, l, spec.shape);
  }
  add("model.norm.weight", -1, {h_});
  if (!cfg_.tied_embeddings) add("lm_head.weight", -1, {V_, h_});

  // 2. gradients, D, persistent (AdamW/SGD). LOMO allocates them during backward.
  if (opt_.holds_gradients())
    for (auto& p : params_)
      p.grad = ledger_.allocate(p.name + ".grad", Category::gradients, p.layer, p.shape, D_);

  // 3. optimizer states, f32, per parameter in order.
  for (auto& p : params_) p.opt_index = opt_.add_parameter(p.name, p.layer, p.shape);

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
  std::vector<unsigned char> raw(p.value.bytes());
  be_.download(raw.data(), p.value.data(), raw.size());
  std::vector<float> out(p.numel());
  for (std::size_t e = 0; e < out.size(); ++e) out[e] = load_as_f32(raw.data(), e, D_);
  return out;
}

Tensor LlamaModel::act(const char* name, int layer, std::vector<std::int64_t> shape, DType dt) {
  return ledger_.allocate(name, Category::activations, layer, std::move(shape), dt);
}
Tensor LlamaModel::ws(const char* name, int layer, std::vector<std::int64_t> shape, DType dt) {
  return ledger_.allocate(name, Category::workspace, layer, std::move(shape), dt);
}

// ------------------------------------------------------------------------------ weights, tokens

void LlamaModel::init_random(std::uint64_t seed) {
  // Norm weights 1 and biases 0 (HF's _init_weights: RMSNorm weight ones, nn.Linear bias
  // zeros), every other weight 0.02 * N(0,1) from its own stream (the parameter's index + 1),
  // computed by the backend (on the device for cuda: include/trainmem/param_init.hpp).
  if (be_.computes()) {
    for (std::size_t pi = 0; pi < params_.size(); ++pi) {
      auto& p = params_[pi];
      ParamInit init;
      if (p.shape.size() == 1) {
        const std::string bias = ".bias";
        const bool is_bias = p.name.size() > bias.size() &&
                             p.name.compare(p.name.size() - bias.size(), bias.size(), bias) == 0;
        init.kind = ParamInit::Kind::constant;
        init.value = is_bias ? 0.0f : 1.0f;
      } else {
        init.kind = ParamInit::Kind::normal;
        init.scale = 0.02f;
        init.seed = seed;
        init.stream = pi + 1;
      }
      be_.init_param(p.value.data(), opt_.master(p.opt_index), p.numel(), init);
    }
  }
  weights_set_ = true;
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
  forward();
  backward(capture);
  {
    auto ph = ledger_.scope(Phase::optimizer);
    if (opt_.holds_gradients())
      for (auto& p : params_)
        opt_.update(p.opt_index, p.value.data(), p.grad.data(), step_, 1.0f / loss_scale_);
  }
  return loss_;
}

// Forward of layer l from its input x_l (b,s,h). Allocates kLayerActs' rows in table order,
// each group right before the op that writes it; the recompute stops before `out`.
void LlamaModel::layer_forward(int l, const void* x, LayerActs& A, ActPass pass) {
  const std::int64_t ad = a_ * d_, kd = k_ * d_;
  const float eps = float(cfg_.rms_eps);
  auto W = [&](int j) { return params_[layer_param(l, j)].value.data(); };
  auto at = [&](LA row) { return A[row].data(); };
  auto at_f32 = [&](LA row) { return A[row].as<float>(); };
  int next = 0;  // the table's next row
  auto through = [&](LA last) { return allocate_acts_through(l, A, pass, last, next); };

  through(LA::xn1);  // rstd1, xn1
  be_.rmsnorm_forward(at(LA::xn1), at_f32(LA::rstd1), x, W(kInNorm), n_, h_, eps);
  through(LA::v);  // (q_norm: q_pre, k_pre, q_rstd, k_rstd), q, k, v
  // The projections (q and k into q_pre and k_pre when they are normed), each bias added in
  // place right after its GEMM.
  const bool qkn = cfg_.qk_norm;
  void* q_proj = qkn ? at(LA::q_pre) : at(LA::q);
  void* k_proj = qkn ? at(LA::k_pre) : at(LA::k);
  auto project = [&](void* out, int weight, int bias, std::int64_t width) {
    be_.matmul(out, at(LA::xn1), W(weight), n_, width, h_, Trans::no, Trans::yes, 1.f, 0.f);
    if (cfg_.qkv_bias) be_.bias_forward(out, W(bias), n_, width);
  };
  project(q_proj, kQ, kQBias, ad);
  project(k_proj, kK, kKBias, kd);
  project(at(LA::v), kV, kVBias, kd);
  if (qkn) {  // RMSNorm over each head: n·a (n·k) rows of width d, before RoPE (as HF)
    be_.rmsnorm_forward(at(LA::q), at_f32(LA::q_rstd), q_proj, W(kQNorm), n_ * a_, d_, eps);
    be_.rmsnorm_forward(at(LA::k), at_f32(LA::k_rstd), k_proj, W(kKNorm), n_ * k_, d_, eps);
  }
  be_.rope_forward(at(LA::q), at(LA::k), b_, s_, a_, k_, d_, cfg_.rope());  // in place
  through(LA::attn_out);  // probs (eager) | lse (flash), attn_out
  be_.attention_forward(at(LA::attn_out), at(LA::probs), at_f32(LA::lse), at(LA::q), at(LA::k),
                        at(LA::v), b_, s_, a_, k_, d_, cfg_.window_of(l), train_.attention);
  // h_mid = x + attn_out · W_oᵀ: copy then GEMM with beta 1 (no transient).
  through(LA::h_mid);
  be_.copy(at(LA::h_mid), x, A[LA::h_mid].bytes());
  be_.matmul(at(LA::h_mid), at(LA::attn_out), W(kO), n_, h_, ad, Trans::no, Trans::yes, 1.f, 1.f);
  through(LA::xn2);  // rstd2, xn2
  be_.rmsnorm_forward(at(LA::xn2), at_f32(LA::rstd2), at(LA::h_mid), W(kPostNorm), n_, h_, eps);
  through(LA::up);  // gate, up
  be_.matmul(at(LA::gate), at(LA::xn2), W(kGate), n_, i_, h_, Trans::no, Trans::yes, 1.f, 0.f);
  be_.matmul(at(LA::up), at(LA::xn2), W(kUp), n_, i_, h_, Trans::no, Trans::yes, 1.f, 0.f);
  through(LA::act);  // silu(gate) · up
  be_.swiglu_forward(at(LA::act), at(LA::gate), at(LA::up), n_ * i_);
  if (!through(LA::out)) return;  // the recompute
  // out = h_mid + act · W_downᵀ; it is x_{l+1}.
  be_.copy(at(LA::out), at(LA::h_mid), A[LA::out].bytes());
  be_.matmul(at(LA::out), at(LA::act), W(kDown), n_, h_, i_, Trans::no, Trans::yes, 1.f, 1.f);
}

bool LlamaModel::allocate_acts_through(int l, LayerActs& A, ActPass pass, LayerAct last,
                                       int& next) {
  const ActDims dims{b_, s_, h_, i_, a_, k_, d_};
  bool allocated = false;
  for (; next <= static_cast<int>(last); ++next) {
    const LayerActSpec& row = kLayerActs[next];
    allocated = allocated_in(row, cfg_, train_.attention, pass);
    if (allocated)
      A[row.id] = ledger_.allocate(row.name, row.category, l, act_shape(row.shape, dims),
                                   act_dtype(row.dtype, D_));
  }
  return allocated;
}

void LlamaModel::free_acts_for_checkpointing(LayerActs& A) {
  for (int r = kNumLayerActs - 1; r >= 0; --r)
    if (kLayerActs[r].checkpointing == UnderCheckpointing::recomputed) A[kLayerActs[r].id].reset();
}

void LlamaModel::free_acts_at_backward_step(LayerActs& A, int step) {
  for (LayerAct row : kBackwardFreeOrder)
    if (layer_act(row).freed_at_step == step) A[row].reset();
}

void LlamaModel::forward() {
  auto ph = ledger_.scope(Phase::forward);
  embed_out_ = act("embed_out", -1, {b_, s_, h_}, D_);  // x_0
  be_.embedding_forward(embed_out_.data(), tokens_.as<std::int32_t>(), params_[0].value.data(), b_,
                        s_, h_, V_);
  const void* x = embed_out_.data();
  for (int l = 0; l < cfg_.layers; ++l) {
    LayerActs& A = layers_[std::size_t(l)];
    layer_forward(l, x, A, ActPass::forward);
    if (train_.checkpointing == Checkpointing::full) free_acts_for_checkpointing(A);
    x = A[LA::out].data();
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
      loss_ = float(sum / double(b_ * (s_ - 1)));
    } else {
      loss_ = std::numeric_limits<float>::quiet_NaN();
    }
  }
  ledger_.mark_end_of_forward();
  act_by_layer_.assign(std::size_t(cfg_.layers) + 1, 0);
  for (const TensorRecord* r : ledger_.live_tensors())
    if (r->category == Category::activations && r->layer >= -1 && r->layer < cfg_.layers)
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
  if (!capture || !be_.computes()) return;
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
  if (!checks_finite()) return;
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
    for (auto& p : params_) be_.fill_zero(p.grad.data(), p.grad.bytes());
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
  void* dW_head = begin_grad(head);
  be_.matmul(d_fno.data(), logits_.data(), params_[head].value.data(), n_, h_, V_, Trans::no,
             Trans::no, 1.f, 0.f);
  be_.matmul(dW_head, logits_.data(), final_norm_out_.data(), V_, h_, n_, Trans::yes, Trans::no,
             1.f, 1.f);
  if (!cfg_.tied_embeddings) end_grad(head, capture);
  logits_.reset();
  // 3. final norm; d_residual carries dL/dx from here down to the embedding.
  Tensor d_res = ws("d_residual", -1, {b_, s_, h_}, D_);  // accumulates
  be_.fill_zero(d_res.data(), d_res.bytes());
  be_.rmsnorm_backward(d_res.data(), begin_grad(fnorm), d_fno.data(), x_L,
                       params_[fnorm].value.data(), final_rstd_.as<float>(), n_, h_);
  end_grad(fnorm, capture);
  d_fno.reset();
  final_norm_out_.reset();
  final_rstd_.reset();
  if (cfg_.layers > 0) layers_.back()[LA::out].reset();

  for (int l = int(cfg_.layers) - 1; l >= 0; --l) layer_backward(l, d_res, capture);

  // Embedding (x_0 = embed_out was freed by layer 0).
  be_.embedding_backward(begin_grad(0), d_res.data(), tokens_.as<std::int32_t>(), b_, s_, h_, V_);
  end_grad(0, capture);
  d_res.reset();

  if (opt_.holds_gradients())
    for (std::size_t pi = 0; pi < params_.size(); ++pi) {
      check_grad_finite(pi);
      capture_grad(pi, capture);
    }
  report_nonfinite_grads();
}

void LlamaModel::layer_backward(int l, Tensor& d_res, const GradientCapture& capture) {
  const std::int64_t ad = a_ * d_, kd = k_ * d_;
  LayerActs& A = layers_[std::size_t(l)];
  Tensor& x = l == 0 ? embed_out_ : layers_[std::size_t(l) - 1][LA::out];  // x_l
  auto Wp = [&](int j) { return params_[layer_param(l, j)].value.data(); };
  auto G = [&](int j) { return begin_grad(layer_param(l, j)); };
  auto done = [&](int j) { end_grad(layer_param(l, j), capture); };
  auto at = [&](LA row) { return A[row].data(); };
  auto at_f32 = [&](LA row) { return A[row].as<float>(); };
  // Backward of a projection y = x·Wᵀ, W (out_f, in_f): dx = dy·W (dx_beta 1: +=) and
  // dW += dyᵀ·x. Under LOMO the gradient lives only around these two GEMMs.
  auto linear_backward = [&](int j, void* dx, const void* dy, const void* xin, std::int64_t out_f,
                             std::int64_t in_f, float dx_beta) {
    void* g = G(j);
    be_.matmul(dx, dy, Wp(j), n_, in_f, out_f, Trans::no, Trans::no, 1.f, dx_beta);
    be_.matmul(g, dy, xin, out_f, in_f, n_, Trans::yes, Trans::no, 1.f, 1.f);
    done(j);
  };

  // 0. recompute the layer from its checkpointed input.
  if (train_.checkpointing == Checkpointing::full) {
    auto rc = ledger_.scope(Phase::recompute);
    layer_forward(l, x.data(), A, ActPass::recompute);
  }
  // 1. down_proj.
  Tensor d_act = ws("d_act", l, {b_, s_, i_}, D_);
  linear_backward(kDown, d_act.data(), d_res.data(), at(LA::act), h_, i_, 0.f);
  free_acts_at_backward_step(A, 1);  // act
  // 2. SwiGLU.
  Tensor d_gate = ws("d_gate", l, {b_, s_, i_}, D_);
  Tensor d_up = ws("d_up", l, {b_, s_, i_}, D_);
  be_.swiglu_backward(d_gate.data(), d_up.data(), d_act.data(), at(LA::gate), at(LA::up), n_ * i_);
  d_act.reset();
  free_acts_at_backward_step(A, 2);  // gate, up
  // 3. gate_proj, up_proj.
  Tensor d_xn2 = ws("d_xn2", l, {b_, s_, h_}, D_);
  linear_backward(kGate, d_xn2.data(), d_gate.data(), at(LA::xn2), i_, h_, 0.f);
  linear_backward(kUp, d_xn2.data(), d_up.data(), at(LA::xn2), i_, h_, 1.f);
  d_gate.reset();
  d_up.reset();
  free_acts_at_backward_step(A, 3);  // xn2
  // 4. post-attention RMSNorm: d_residual += ..., through h_mid.
  be_.rmsnorm_backward(d_res.data(), G(kPostNorm), d_xn2.data(), at(LA::h_mid), Wp(kPostNorm),
                       at_f32(LA::rstd2), n_, h_);
  done(kPostNorm);
  d_xn2.reset();
  free_acts_at_backward_step(A, 4);  // h_mid, rstd2
  // 5. o_proj.
  Tensor d_ao = ws("d_attn_out", l, {b_, s_, ad}, D_);
  linear_backward(kO, d_ao.data(), d_res.data(), at(LA::attn_out), h_, ad, 0.f);
  // 6. attention.
  Tensor d_q = ws("d_q", l, {b_, s_, ad}, D_);
  Tensor d_k = ws("d_k", l, {b_, s_, kd}, D_);
  Tensor d_v = ws("d_v", l, {b_, s_, kd}, D_);
  Tensor scratch = train_.attention == Attention::eager ? ws("d_probs", l, {b_, a_, s_, s_}, D_)
                                                        : ws("attn_delta", l, {b_, a_, s_}, f32);
  const bool eager = train_.attention == Attention::eager;
  be_.attention_backward(d_q.data(), d_k.data(), d_v.data(), eager ? scratch.data() : nullptr,
                         eager ? nullptr : scratch.as<float>(), d_ao.data(), at(LA::q), at(LA::k),
                         at(LA::v), at(LA::attn_out), at(LA::probs), at_f32(LA::lse), b_, s_, a_,
                         k_, d_, cfg_.window_of(l), train_.attention);
  scratch.reset();
  d_ao.reset();
  free_acts_at_backward_step(A, 6);  // attn_out, probs | lse
  // 7. RoPE backward in place; q_norm: the per-head RMSNorm backward into the projections'
  // gradients d_q_pre, d_k_pre (zero-filled: the op accumulates), which replace d_q and d_k.
  be_.rope_backward(d_q.data(), d_k.data(), b_, s_, a_, k_, d_, cfg_.rope());
  if (cfg_.qk_norm) {
    Tensor d_q_pre = ws("d_q_pre", l, {b_, s_, ad}, D_);
    be_.fill_zero(d_q_pre.data(), d_q_pre.bytes());
    be_.rmsnorm_backward(d_q_pre.data(), G(kQNorm), d_q.data(), at(LA::q_pre), Wp(kQNorm),
                         at_f32(LA::q_rstd), n_ * a_, d_);
    done(kQNorm);
    Tensor d_k_pre = ws("d_k_pre", l, {b_, s_, kd}, D_);
    be_.fill_zero(d_k_pre.data(), d_k_pre.bytes());
    be_.rmsnorm_backward(d_k_pre.data(), G(kKNorm), d_k.data(), at(LA::k_pre), Wp(kKNorm),
                         at_f32(LA::k_rstd), n_ * k_, d_);
    done(kKNorm);
    d_q.reset();
    d_k.reset();
    free_acts_at_backward_step(A, 7);  // q_pre, q_rstd, k_pre, k_rstd
    d_q = std::move(d_q_pre);
    d_k = std::move(d_k_pre);
  }
  // 8. q_proj, k_proj, v_proj, each bias right after its weight.
  Tensor d_xn1 = ws("d_xn1", l, {b_, s_, h_}, D_);
  auto bias_backward = [&](int j, const void* dy, std::int64_t width) {
    if (!cfg_.qkv_bias) return;
    be_.bias_backward(G(j), dy, n_, width);
    done(j);
  };
  linear_backward(kQ, d_xn1.data(), d_q.data(), at(LA::xn1), ad, h_, 0.f);
  bias_backward(kQBias, d_q.data(), ad);
  linear_backward(kK, d_xn1.data(), d_k.data(), at(LA::xn1), kd, h_, 1.f);
  bias_backward(kKBias, d_k.data(), kd);
  linear_backward(kV, d_xn1.data(), d_v.data(), at(LA::xn1), kd, h_, 1.f);
  bias_backward(kVBias, d_v.data(), kd);
  d_q.reset();
  d_k.reset();
  d_v.reset();
  free_acts_at_backward_step(A, 8);  // q, k, v, xn1
  // 9. input RMSNorm: d_residual += ..., through x_l; then x_l is no longer needed.
  be_.rmsnorm_backward(d_res.data(), G(kInNorm), d_xn1.data(), x.data(), Wp(kInNorm),
                       at_f32(LA::rstd1), n_, h_);
  done(kInNorm);
  d_xn1.reset();
  free_acts_at_backward_step(A, 9);  // rstd1
  x.reset();
  for (const LayerActSpec& row : kLayerActs)
    if (A[row.id])
      throw Error("model: layer " + std::to_string(l) + "'s backward left activation '" + row.name +
                  "' alive (kLayerActs' freed_at_step)");
}

}  // namespace trainmem
