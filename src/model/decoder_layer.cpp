// One decoder layer of one rank (include/trainmem/model/decoder_layer.hpp), written from
// docs/native-plan.md ("Forward", "Backward", "Layer l") and docs/distributed.md ("The sharded
// step"). Every buffer is allocated right before the op that writes it and freed right after
// its last reader, so that the ledger's books are the plan's.
#include "trainmem/model/decoder_layer.hpp"

#include <algorithm>
#include <array>
#include <functional>
#include <string>

#include "trainmem/base/error.hpp"

namespace trainmem {

namespace {
using LA = LayerAct;
using Shape = std::vector<std::int64_t>;
constexpr DType f32 = DType::f32;

[[noreturn]] void no_group(const char* what) {
  throw Error(std::string("decoder layer: ") + what +
              " called on a rank without tensor parallelism");
}
}  // namespace

std::vector<LayerParamSpec> layer_param_specs(const ModelConfig& model, const ActDims& dims,
                                              bool moe_layer) {
  const std::int64_t h = dims.h, i = dims.i, d = dims.d, ad = dims.a * d, kd = dims.k * d;
  const bool bias = model.qkv_bias;
  std::vector<LayerParamSpec> v;
  v.push_back({kInNorm, "input_layernorm.weight", {h}});
  // Column-parallel q/k/v: each bias split with its projection's output columns.
  v.push_back({kQ, "self_attn.q_proj.weight", {ad, h}});
  if (bias) v.push_back({kQBias, "self_attn.q_proj.bias", {ad}});
  v.push_back({kK, "self_attn.k_proj.weight", {kd, h}});
  if (bias) v.push_back({kKBias, "self_attn.k_proj.bias", {kd}});
  v.push_back({kV, "self_attn.v_proj.weight", {kd, h}});
  if (bias) v.push_back({kVBias, "self_attn.v_proj.bias", {kd}});
  v.push_back({kO, "self_attn.o_proj.weight", {h, ad}});
  if (model.qk_norm) {  // per-head norms: the same (d) weights on every tensor-parallel rank
    v.push_back({kQNorm, "self_attn.q_norm.weight", {d}});
    v.push_back({kKNorm, "self_attn.k_norm.weight", {d}});
  }
  v.push_back({kPostNorm, "post_attention_layernorm.weight", {h}});
  if (moe_layer) {
    v.push_back({kRouter, "mlp.gate.weight", {dims.E, h}});
    // The rank's El experts (E/ep under expert parallelism); the router scores all E.
    v.push_back({kExpertsGateUp, "mlp.experts.gate_up_proj", {dims.El, 2 * dims.m, h}});
    v.push_back({kExpertsDown, "mlp.experts.down_proj", {dims.El, h, dims.m}});
    if (dims.ms > 0) {
      v.push_back({kSharedGate, "mlp.shared_expert.gate_proj.weight", {dims.ms, h}});
      v.push_back({kSharedUp, "mlp.shared_expert.up_proj.weight", {dims.ms, h}});
      v.push_back({kSharedDown, "mlp.shared_expert.down_proj.weight", {h, dims.ms}});
      v.push_back({kSharedExpertGate, "mlp.shared_expert_gate.weight", {1, h}});
    }
  } else {
    v.push_back({kGate, "mlp.gate_proj.weight", {i, h}});
    v.push_back({kUp, "mlp.up_proj.weight", {i, h}});
    v.push_back({kDown, "mlp.down_proj.weight", {h, i}});
  }
  if (dims.r <= 0 || dims.lora == 0) return v;
  // LoRA: each target's A (r, in) and B (out, r) right after its weight and bias.
  static constexpr const char* kNames[7][2] = {
      {"self_attn.q_proj.lora_A.weight", "self_attn.q_proj.lora_B.weight"},
      {"self_attn.k_proj.lora_A.weight", "self_attn.k_proj.lora_B.weight"},
      {"self_attn.v_proj.lora_A.weight", "self_attn.v_proj.lora_B.weight"},
      {"self_attn.o_proj.lora_A.weight", "self_attn.o_proj.lora_B.weight"},
      {"mlp.gate_proj.lora_A.weight", "mlp.gate_proj.lora_B.weight"},
      {"mlp.up_proj.lora_A.weight", "mlp.up_proj.lora_B.weight"},
      {"mlp.down_proj.lora_A.weight", "mlp.down_proj.lora_B.weight"}};
  // The projection whose adapter follows `slot` (its weight, or its bias when it has one).
  auto adapter_after = [&](int slot) {
    switch (slot) {
      case kQ:
      case kK:
      case kV:
        return bias ? -1 : slot;
      case kQBias:
        return int(kQ);
      case kKBias:
        return int(kK);
      case kVBias:
        return int(kV);
      case kO:
      case kGate:
      case kUp:
      case kDown:
        return slot;
      default:
        return -1;
    }
  };
  std::vector<LayerParamSpec> out;
  for (const LayerParamSpec& spec : v) {
    out.push_back(spec);
    const int base = adapter_after(spec.slot);
    for (int t = 0; t < 7; ++t) {
      if (base < 0 || kLoraBase[t] != base || !(dims.lora & (1u << t))) continue;
      for (const LayerParamSpec& w : v)  // the projection's (out, in)
        if (w.slot == base) {
          out.push_back({LayerParam(lora_a_slot(t)), kNames[t][0], {dims.r, w.shape[1]}});
          out.push_back({LayerParam(lora_b_slot(t)), kNames[t][1], {w.shape[0], dims.r}});
        }
    }
  }
  return out;
}

namespace {
// LoRA under tensor parallelism (docs/native-plan.md, "LoRA per rank"): the adapter of a
// row-parallel target (o_proj, down_proj) reads the rank's columns of its input.
bool lora_on_row_parallel(int slot) {
  const int t = (slot - kLoraFirst) / 2;
  return kLoraBase[t] == kO || kLoraBase[t] == kDown;
}
}  // namespace

bool layer_param_replicated(int slot) {
  if (is_lora_slot(slot))  // A of a column-parallel target, B of a row-parallel one
    return (slot == lora_a_slot((slot - kLoraFirst) / 2)) != lora_on_row_parallel(slot);
  return slot == kInNorm || slot == kPostNorm || slot == kQNorm || slot == kKNorm ||
         slot == kRouter || slot == kSharedExpertGate;
}
bool layer_param_row_parallel(int slot) {
  if (is_lora_slot(slot))  // A of a row-parallel target: a block of its columns
    return slot == lora_a_slot((slot - kLoraFirst) / 2) && lora_on_row_parallel(slot);
  return slot == kO || slot == kDown || slot == kSharedDown;
}
bool layer_param_tp_partial_grad(int slot) {
  // A of a column-parallel target: every rank reads the whole input and the same A, its gradient
  // d_aᵀ·x a partial (d_a = dy·B over the rank's output columns).
  return is_lora_slot(slot) && slot == lora_a_slot((slot - kLoraFirst) / 2) &&
         !lora_on_row_parallel(slot);
}

void LayerHost::tp_sum(const Tensor&, std::uint64_t) {
  no_group("tp_sum");
}
void LayerHost::tp_sum_add(const Tensor&, const void*) {
  no_group("tp_sum_add");
}
void LayerHost::sp_gather(const Tensor&, const Tensor&, std::int64_t) {
  no_group("sp_gather");
}
void LayerHost::sp_reduce_scatter(const Tensor&, const Tensor&, const void*) {
  no_group("sp_reduce_scatter");
}
void LayerHost::cp_pass(const void*, void*, std::uint64_t, DType) {
  throw Error("decoder layer: cp_pass called on a rank without context parallelism");
}
MoeDispatch LayerHost::moe_dispatch(int, const std::vector<std::int32_t>&) {
  throw Error("decoder layer: moe_dispatch called on a rank without expert parallelism");
}
void LayerHost::ep_all_to_all(const void*, const std::vector<std::size_t>&, void*,
                              const std::vector<std::size_t>&, std::int64_t) {
  throw Error("decoder layer: ep_all_to_all called on a rank without expert parallelism");
}
void LayerHost::etp_gather_v(const void*, std::size_t, void*, const std::vector<std::size_t>&,
                             std::int64_t) {
  throw Error("decoder layer: etp_gather_v called on a rank without expert tensor parallelism");
}
void LayerHost::etp_reduce_scatter_v(const void*, const std::vector<std::size_t>&, void*,
                                     std::int64_t) {
  throw Error(
      "decoder layer: etp_reduce_scatter_v called on a rank without expert tensor parallelism");
}

namespace {

// Ring attention (cp > 1; docs/distributed.md, "Context parallelism"): the rank's queries meet
// every rank's key/value block in turn, its own first; after each block the block goes on to the
// next rank and the previous rank's arrives in a receive buffer (two alternate when cp > 2).
// Step j holds the block of rank (cp_rank - j) mod cp.
struct Ring {
  const LayerRank& R;
  int g;
  std::int64_t b, s, k, d, cp;
  std::uint64_t kv_n;        // elements of one k or v block (b, s, kv, d)
  std::array<Tensor, 2> kv;  // receive buffers (2, b, s, kv, d) D: k then v

  Ring(const LayerRank& rank, int layer)
      : R(rank),
        g(layer),
        b(rank.dims.b),
        s(rank.dims.s),
        k(rank.dims.k),
        d(rank.dims.d),
        cp(rank.cp),
        kv_n(std::uint64_t(b * s * k * d)) {
    for (std::int64_t j = 0; j < std::min<std::int64_t>(cp - 1, 2); ++j)
      kv[std::size_t(j)] =
          R.ledger.allocate(j == 0 ? "ring.kv.0" : "ring.kv.1", Category::communication, g,
                            {2, b, s, k * d}, R.train.dtype);
  }
  std::int64_t source(std::int64_t j) const { return (R.cp_rank - j + cp) % cp; }
  // After step j (j + 1 < cp): the block (kc, vc) sent on, the next one received; (kc, vc)
  // becomes it.
  void pass(std::int64_t j, const void*& kc, const void*& vc) {
    Tensor& nb = kv[std::size_t(j % 2)];
    char* nk = static_cast<char*>(nb.data());
    char* nv = nk + kv_n * dtype_size(R.train.dtype);
    R.host.cp_pass(kc, nk, kv_n, R.train.dtype);
    R.host.cp_pass(vc, nv, kv_n, R.train.dtype);
    kc = nk;
    vc = nv;
  }
};

// The forward: attn_out and lse (allocated) from q, k, v through an fp32 accumulator.
void ring_forward(const LayerRank& R, int g, LayerActs& A) {
  const ActDims& dm = R.dims;
  const std::int64_t b = dm.b, s = dm.s, a = dm.a, k = dm.k, d = dm.d;
  Tensor acc = R.ledger.allocate("attn_out.ring_acc", Category::workspace, g, {b, s, a * d}, f32);
  Ring ring(R, g);
  Backend* be = R.backend;
  if (!be) return;
  const void* kc = A[LayerAct::k].data();
  const void* vc = A[LayerAct::v].data();
  const SeqPositions mine = R.positions(R.cp_rank);
  for (std::int64_t j = 0; j < R.cp; ++j) {
    be->attention_ring_forward(acc.as<float>(), A[LayerAct::lse].as<float>(), A[LayerAct::q].data(),
                               kc, vc, b, s, s, a, k, d, R.model.window_of(g), mine,
                               R.positions(ring.source(j)), j == 0);
    if (j + 1 < R.cp) ring.pass(j, kc, vc);
  }
  be->round_from_f32(A[LayerAct::attn_out].data(), acc.as<float>(), b * s * a * d);
}

// The backward into d_q, d_k, d_v (D) from d_attn_out: the queries' gradient in an fp32
// accumulator, each key/value block's in an fp32 accumulator that travels with the block and
// reaches its owner after the last step; delta (b, a, s) f32 written at the first step.
void ring_backward(const LayerRank& R, int g, LayerActs& A, const Tensor& d_ao, Tensor& d_q,
                   Tensor& d_k, Tensor& d_v, const Tensor& delta) {
  const ActDims& dm = R.dims;
  const std::int64_t b = dm.b, s = dm.s, a = dm.a, k = dm.k, d = dm.d;
  Tensor dq = R.ledger.allocate("d_q.ring_acc", Category::workspace, g, {b, s, a * d}, f32);
  Ring ring(R, g);
  std::array<Tensor, 2> dkv;  // (2, b, s, kv, d) f32: dk then dv of the block held
  for (int j = 0; j < 2; ++j)
    dkv[std::size_t(j)] = R.ledger.allocate(j == 0 ? "ring.dkv.0" : "ring.dkv.1",
                                            Category::communication, g, {2, b, s, k * d}, f32);
  Backend* be = R.backend;
  if (!be) return;
  be->fill_zero(dq.data(), dq.bytes());
  be->fill_zero(dkv[0].data(), dkv[0].bytes());
  const void* kc = A[LayerAct::k].data();
  const void* vc = A[LayerAct::v].data();
  const SeqPositions mine = R.positions(R.cp_rank);
  std::size_t cur = 0;
  for (std::int64_t j = 0; j < R.cp; ++j) {
    float* dk = dkv[cur].as<float>();
    be->attention_ring_backward(dq.as<float>(), dk, dk + ring.kv_n, delta.as<float>(), d_ao.data(),
                                A[LayerAct::q].data(), kc, vc, A[LayerAct::attn_out].data(),
                                A[LayerAct::lse].as<float>(), b, s, s, a, k, d,
                                R.model.window_of(g), mine, R.positions(ring.source(j)), j == 0);
    if (j + 1 < R.cp) ring.pass(j, kc, vc);
    // The block's accumulator goes on with it; after the last step the one received is the
    // gradient of this rank's own block, summed over every rank's queries.
    R.host.cp_pass(dk, dkv[1 - cur].data(), 2 * ring.kv_n, f32);
    cur = 1 - cur;
  }
  be->round_from_f32(d_q.data(), dq.as<float>(), b * s * a * d);
  const float* own = dkv[cur].as<float>();
  be->round_from_f32(d_k.data(), own, std::int64_t(ring.kv_n));
  be->round_from_f32(d_v.data(), own + ring.kv_n, std::int64_t(ring.kv_n));
}

// LoRA's row of each target index t (decoder_layer.hpp's kLoraBase order).
constexpr LayerAct kLoraRow[7] = {LayerAct::lora_q,   LayerAct::lora_k,    LayerAct::lora_v,
                                  LayerAct::lora_o,   LayerAct::lora_gate, LayerAct::lora_up,
                                  LayerAct::lora_down};
// Its dropout mask's row (TrainConfig::lora_dropped).
constexpr LayerAct kMaskRow[7] = {LayerAct::mask_q,   LayerAct::mask_k,    LayerAct::mask_v,
                                  LayerAct::mask_o,   LayerAct::mask_gate, LayerAct::mask_up,
                                  LayerAct::mask_down};
constexpr const char* kProj[7] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                  "gate_proj", "up_proj", "down_proj"};
// The target index of a projection slot, -1 for any other slot.
int lora_index(int slot) {
  for (int t = 0; t < 7; ++t)
    if (kLoraBase[t] == slot) return t;
  return -1;
}
// 1/(1 − p), the scale of a kept element.
float keep_scale(double p) {
  return float(1.0 / (1.0 - p));
}
// Whether the rank's step trains an adapter on target t.
bool has_lora(const LayerRank& R, int t) {
  return t >= 0 && R.train.lora() && (R.train.lora_targets & (1u << t)) != 0;
}

// The weight one GEMM of base projection `slot` reads: its parameter, or for a quantized weight
// (QLoRA) or an 8-bit one (--quant int8) a copy dequantized into workspace, `dequant.<proj>`
// (out, in) D, freed with this object, right after the GEMM. Under double quantization the fp32
// absmax is dequantized first into `dequant.<proj>.absmax` (workspace, ceil(n / blocksize) f32),
// freed as soon as the weight is written (docs/native-plan.md, "QLoRA").
struct GemmWeight {
  Tensor copy;
  const void* ptr = nullptr;
};
GemmWeight gemm_weight(const LayerRank& R, std::int64_t l, int g, int slot) {
  const Quant4View* q = R.host.quant4(l, slot);
  if (!q) return GemmWeight{Tensor{}, R.host.weight(l, slot)};
  const std::string name = std::string("dequant.") + kProj[lora_index(slot)];
  const std::int64_t n = q->out * q->in, bs = R.train.quant_blocksize, nb = (n + bs - 1) / bs;
  Backend* be = R.backend;
  if (R.train.quant8()) {  // LLM.int8: CB · (SCB / 127) per row, no absmax transient
    GemmWeight w;
    w.copy = R.ledger.allocate(name, Category::workspace, g, {q->out, q->in}, R.train.dtype);
    w.ptr = w.copy.data();
    if (be)
      be->dequantize_int8(w.copy.data(), reinterpret_cast<const std::int8_t*>(q->packed),
                          static_cast<const float*>(q->absmax), q->out, q->in);
    return w;
  }
  Tensor absmax;
  const float* am = static_cast<const float*>(q->absmax);
  if (R.train.double_quant) {
    absmax = R.ledger.allocate(name + ".absmax", Category::workspace, g, {nb}, DType::f32);
    if (be)
      be->dequantize_blockwise8(absmax.as<float>(), static_cast<const std::uint8_t*>(q->absmax),
                                q->nested_absmax, q->nested_code, nb, kQuantNestedBlock, q->offset);
    am = absmax.as<float>();
  }
  GemmWeight w;
  w.copy = R.ledger.allocate(name, Category::workspace, g, {q->out, q->in}, R.train.dtype);
  w.ptr = w.copy.data();
  // bitsandbytes' CPU kernel reads FP4's nibble 8 as -0.0 when the last dimension is even.
  if (be)
    be->dequantize_4bit(w.copy.data(), q->packed, am, n, bs, quant4_type(R.train.quant),
                        q->in % 2 == 0);
  return w;
}

// LoRA dropout (docs/native-plan.md, "LoRA dropout"): target t's input xin (n, in_f) D
// dropped by its mask row into the workspace `lora_drop.<proj>` (n, in_f) D, x ⊙ mask / (1 − p);
// the caller frees it. `draw`: fill the mask first (the forward and the recompute draw the same
// bits from the step's key).
Tensor dropped_input(const LayerRank& R, LayerActs& A, int g, int t, const void* xin,
                     std::int64_t n, std::int64_t in_f, bool draw) {
  Tensor drop = R.ledger.allocate(std::string("lora_drop.") + kProj[t], Category::workspace, g,
                                  {R.dims.b, R.dims.s, in_f}, R.train.dtype);
  if (Backend* be = R.backend) {
    std::uint8_t* mask = A[kMaskRow[t]].as<std::uint8_t>();
    const double p = R.train.lora_dropout;
    if (draw)
      be->dropout_mask(mask, n * in_f, float(p), R.dropout_seed,
                       dropout_stream(R.dropout_step, std::uint64_t(g), std::uint64_t(t)));
    be->dropout_apply(drop.data(), xin, mask, n * in_f, keep_scale(p), false);
  }
  return drop;
}

// ------------------------------------------------------------------------------ experts
// A mixture-of-experts MLP (docs/native-plan.md, "Mixture of experts"): the router's logits
// (a workspace transient) into its fp32 softmax and top-K, the tokens' rows in expert order, each
// expert's SwiGLU over its rows (one GEMM per expert and projection: the experts' row counts come
// from the routing), and the weighted combine onto the residual. On one rank every buffer holds
// all n·K rows at once (E·capacity under --capacity-factor), so the bytes do not depend on the
// routing; only the GEMMs' shapes do. Under expert (tensor) parallelism the experts' buffers hold
// the rows received (each source's kept choices), which do.

// Where each expert's rows start (E + 1 entries) as the backend computed them (a cuda backend
// waits for the routing).
std::vector<std::int32_t> expert_offsets(const LayerRank& R, const LayerActs& A) {
  std::vector<std::int32_t> off(std::size_t(R.dims.E + 1));
  R.backend->download(off.data(), A[LayerAct::expert_offsets].data(), off.size() * sizeof off[0]);
  return off;
}
// Expert e's `rows` rows from row r0 of a (rows, width) D buffer, and its slice of a (E, ...) D
// weight of `per` elements per expert.
char* moe_rows(const Tensor& t, std::int64_t r0, std::int64_t width, DType D) {
  return static_cast<char*>(t.data()) + std::size_t(r0 * width) * dtype_size(D);
}
const char* moe_expert(const void* w, std::int64_t e, std::int64_t per, DType D) {
  return static_cast<const char*>(w) + std::size_t(e * per) * dtype_size(D);
}
char* moe_expert(void* w, std::int64_t e, std::int64_t per, DType D) {
  return static_cast<char*>(w) + std::size_t(e * per) * dtype_size(D);
}

// f(e, r0, c) for every non-empty chunk of the experts' rows, in order: c rows from r0 through
// expert e. One GPU (`dsp` null): expert e's rows [off[e], off[e + 1]). Expert parallelism: the
// received rows (peer p's rows for local expert e, p ascending, then e; El local experts).
template <class F>
void each_expert_chunk(const std::vector<std::int32_t>& off, const MoeDispatch* dsp,
                       std::int64_t El, F&& f) {
  if (!dsp) {
    for (std::size_t e = 0; e + 1 < off.size(); ++e) {
      const std::int64_t r0 = off[e], c = off[e + 1] - r0;
      if (c > 0) f(std::int64_t(e), r0, c);
    }
    return;
  }
  std::int64_t r0 = 0;
  for (std::size_t k = 0; k < dsp->chunk.size(); ++k) {
    const std::int64_t c = dsp->chunk[k];
    if (c > 0) f(std::int64_t(k) % El, r0, c);
    r0 += c;
  }
}

// The forward from xn2 to `out` (its recompute up to expert_out; false then: the caller stops).
// Under expert parallelism `er` (the forward's ActDims::er, which `through` allocates by) becomes
// the rows this rank's experts receive.
template <class Through>
bool moe_mlp_forward(const LayerRank& R, std::int64_t l, int g, LayerActs& A, ActPass pass,
                     const void* xn2, Through&& through, std::int64_t& er) {
  const ActDims& dm = R.dims;
  // The rank's rows: b·(s/tp) under sequence parallelism (s = sr otherwise).
  const std::int64_t b = dm.b, s = dm.sr, h = dm.h, n = b * s, E = dm.E, K = dm.K, mw = dm.m;
  const DType D = R.train.dtype;
  Backend* be = R.backend;
  LayerHost& H = R.host;
  std::vector<std::int32_t> off;  // where each expert's rows start, on the host
  {
    Tensor logits = R.ledger.allocate("router_logits", Category::workspace, g, {b, s, E}, D);
    if (be)
      be->matmul(logits.data(), xn2, H.weight(l, kRouter), n, E, h, Trans::no, Trans::yes, 1.f,
                 0.f);
    through(LayerAct::expert_offsets);  // router_probs, topk_idx, topk_weight, expert_pos, offsets
    if (be)
      be->moe_route(A[LayerAct::router_probs].as<float>(), A[LayerAct::topk_idx].as<std::int32_t>(),
                    A[LayerAct::topk_weight].as<float>(),
                    A[LayerAct::expert_pos].as<std::int32_t>(),
                    A[LayerAct::expert_offsets].as<std::int32_t>(), logits.data(), n, E, K, dm.cap,
                    R.model.norm_topk_prob);
    if (be) off = expert_offsets(R, A);
    if (pass == ActPass::forward)
      H.moe_routed(g, off, A[LayerAct::topk_idx], A[LayerAct::router_probs]);
  }
  // The experts on rows in expert chunks (each_chunk(f) calls f(e, r0, c): c rows from r0 for
  // local expert e): gate and up from expert_in, SwiGLU over the `rows` kept, down into `out`.
  auto run_experts = [&](auto&& each_chunk, std::int64_t rows, const Tensor& out) {
    const void* gu = H.weight(l, kExpertsGateUp);
    const void* dn = H.weight(l, kExpertsDown);
    each_chunk([&](std::int64_t e, std::int64_t r0, std::int64_t c) {
      const char* wg = moe_expert(gu, e, 2 * mw * h, D);
      const char* wu = wg + std::size_t(mw * h) * dtype_size(D);
      const char* xin = moe_rows(A[LayerAct::expert_in], r0, h, D);
      be->matmul(moe_rows(A[LayerAct::expert_gate], r0, mw, D), xin, wg, c, mw, h, Trans::no,
                 Trans::yes, 1.f, 0.f);
      be->matmul(moe_rows(A[LayerAct::expert_up], r0, mw, D), xin, wu, c, mw, h, Trans::no,
                 Trans::yes, 1.f, 0.f);
    });
    be->swiglu_forward(A[LayerAct::expert_act].data(), A[LayerAct::expert_gate].data(),
                       A[LayerAct::expert_up].data(), rows * mw);
    each_chunk([&](std::int64_t e, std::int64_t r0, std::int64_t c) {
      be->matmul(moe_rows(out, r0, h, D), moe_rows(A[LayerAct::expert_act], r0, mw, D),
                 moe_expert(dn, e, h * mw, D), c, h, mw, Trans::no, Trans::yes, 1.f, 0.f);
    });
  };
  if (R.dispatch()) {
    // Expert parallelism: xn2's rows in expert order into the dispatch buffer, sent to their
    // experts' ranks (all-to-all) into expert_in (the R rows this rank's experts take, each
    // peer's in expert order); each (peer, local expert) chunk through its expert; the down
    // outputs into the combine buffer, returned into expert_out (the home rows, expert order).
    // Expert tensor parallelism: the A rows received (a2a.recv; at ep 1 the rank's own, from
    // dispatch.send) gathered from the etp group into expert_in (R = Σ A), the down outputs
    // partial sums over the group's columns (combine.partial), reduce-scattered back to the
    // A rows of each rank (combine.send; at ep 1 straight into expert_out).
    const MoeDispatch dsp = H.moe_dispatch(g, off);
    er = dsp.rows;
    auto comm = [&](const char* name, std::int64_t rows) {  // none for no rows
      return rows > 0 ? R.ledger.allocate(name, Category::communication, g, {rows, h}, D)
                      : Tensor{};
    };
    Tensor send = comm("dispatch.send", dm.nk);
    if (be) be->moe_permute(send.data(), xn2, A[LayerAct::expert_pos].as<std::int32_t>(), n, K, h);
    Tensor recv;
    if (R.ep && R.etp) {
      recv = comm("a2a.recv", dsp.a);
      if (be) H.ep_all_to_all(send.data(), dsp.send_rows, recv.data(), dsp.recv_rows, h);
      send.reset();
    }
    through(LayerAct::expert_in);
    if (be && !R.etp)
      H.ep_all_to_all(send.data(), dsp.send_rows, A[LayerAct::expert_in].data(), dsp.recv_rows, h);
    else if (be)
      H.etp_gather_v(R.ep ? recv.data() : send.data(), std::size_t(dsp.a),
                     A[LayerAct::expert_in].data(), dsp.gather_rows, h);
    recv.reset();
    send.reset();
    through(LayerAct::expert_act);  // expert_gate, expert_up, expert_act
    Tensor partial = R.etp ? comm("combine.partial", er) : Tensor{};
    Tensor back = R.etp ? Tensor{} : comm("combine.send", er);
    if (be && er > 0)
      run_experts([&](auto&& f) { each_expert_chunk(off, &dsp, dm.El, f); }, er,
                  R.etp ? partial : back);
    if (R.etp && R.ep) {
      back = comm("combine.send", dsp.a);
      if (be) H.etp_reduce_scatter_v(partial.data(), dsp.gather_rows, back.data(), h);
      partial.reset();
    }
    through(LayerAct::expert_out);
    if (be && R.ep)
      H.ep_all_to_all(back.data(), dsp.recv_rows, A[LayerAct::expert_out].data(), dsp.send_rows, h);
    else if (be)
      H.etp_reduce_scatter_v(partial.data(), dsp.gather_rows, A[LayerAct::expert_out].data(), h);
    partial.reset();
    back.reset();
  } else {
    through(LayerAct::expert_out);  // expert_in, expert_gate, expert_up, expert_act, expert_out
  }
  if (be && !R.dispatch()) {
    be->moe_permute(A[LayerAct::expert_in].data(), xn2, A[LayerAct::expert_pos].as<std::int32_t>(),
                    n, K, h);
    // The kept rows, off[E] (b·s·K without a capacity; the rows past them are never read).
    run_experts([&](auto&& f) { each_expert_chunk(off, nullptr, dm.El, f); }, off[std::size_t(E)],
                A[LayerAct::expert_out]);
  }
  // Qwen2-MoE's shared expert: a dense SwiGLU of width m_s over every token, and its gate's
  // logit xn2·W_sgᵀ (b, s) D. Under sequence parallelism it is split like the dense MLP
  // (Megatron's SharedExpertMLP on the tensor-parallel group): xn2 gathered for gate and up (the
  // rank's m_s/tp columns of every sequence row), down's partial product reduce-scattered into
  // the rank's rows of shared_out; the gate's logit from the rank's own rows.
  if (const std::int64_t ms = dm.ms; ms > 0) {
    auto at = [&](LayerAct row) { return A[row].data(); };
    const std::int64_t na = b * dm.s;  // every sequence row (the rank's own without sp)
    Tensor gath;
    if (R.sp) gath = R.ledger.allocate("xn2.gathered", Category::communication, g, {b, dm.s, h}, D);
    if (be && R.sp) H.sp_gather(A[LayerAct::xn2], gath, h);
    const void* xin = R.sp ? gath.data() : xn2;
    through(LayerAct::shared_up);  // shared_gate, shared_up
    if (be) {
      be->matmul(at(LayerAct::shared_gate), xin, H.weight(l, kSharedGate), na, ms, h, Trans::no,
                 Trans::yes, 1.f, 0.f);
      be->matmul(at(LayerAct::shared_up), xin, H.weight(l, kSharedUp), na, ms, h, Trans::no,
                 Trans::yes, 1.f, 0.f);
    }
    gath.reset();
    through(LayerAct::shared_act);
    if (be)
      be->swiglu_forward(at(LayerAct::shared_act), at(LayerAct::shared_gate),
                         at(LayerAct::shared_up), na * ms);
    Tensor partial;
    if (R.sp)
      partial =
          R.ledger.allocate("shared_down.partial", Category::communication, g, {b, dm.s, h}, D);
    through(LayerAct::shared_out);
    if (be) {
      be->matmul(R.sp ? partial.data() : at(LayerAct::shared_out), at(LayerAct::shared_act),
                 H.weight(l, kSharedDown), na, h, ms, Trans::no, Trans::yes, 1.f, 0.f);
      if (R.sp) H.sp_reduce_scatter(partial, A[LayerAct::shared_out], nullptr);
    }
    partial.reset();
    through(LayerAct::shared_score);
    if (be)
      be->matmul(at(LayerAct::shared_score), xn2, H.weight(l, kSharedExpertGate), n, 1, h,
                 Trans::no, Trans::yes, 1.f, 0.f);
  }
  if (pass == ActPass::recompute) return false;
  // out = h_mid + Σ_j weight_j · expert_out[pos_j] (+ σ(score)·shared_out): x_{l+1}.
  through(LayerAct::out);
  if (be) {
    be->moe_combine(A[LayerAct::out].data(), A[LayerAct::h_mid].data(),
                    A[LayerAct::expert_out].data(), A[LayerAct::topk_weight].as<float>(),
                    A[LayerAct::expert_pos].as<std::int32_t>(), n, K, h);
    if (dm.ms > 0)
      be->moe_gate_add(A[LayerAct::out].data(), A[LayerAct::shared_out].data(),
                       A[LayerAct::shared_score].data(), n, h);
  }
  return true;
}

// The backward from d_residual (the MLP's output gradient) to d_xn2 (returned, workspace
// (b, s, h) D), steps 1 to 3 of docs/native-plan.md's "Mixture of experts"; `free_step(k)` frees
// the rows of step k.
template <class FreeStep>
Tensor moe_mlp_backward(const LayerRank& R, std::int64_t l, int g, LayerActs& A,
                        const Tensor& d_res, FreeStep&& free_step) {
  const ActDims& dm = R.dims;
  // The rank's rows (b, sr, h): d_res and d_xn2 are its own under sequence parallelism.
  const std::int64_t b = dm.b, s = dm.sr, h = dm.h, n = b * s, E = dm.E, K = dm.K, mw = dm.m;
  const std::int64_t nk = dm.nk;  // the expert-ordered rows (E·capacity under a capacity factor)
  const DType D = R.train.dtype;
  Backend* be = R.backend;
  LayerHost& H = R.host;
  // (Expert parallelism: none of the rows of experts that receive no row.)
  auto ws = [&](const char* name, std::vector<std::int64_t> shape, DType dt) {
    return shape.front() > 0 ? R.ledger.allocate(name, Category::workspace, g, std::move(shape), dt)
                             : Tensor{};
  };
  const std::int32_t* pos = A[LayerAct::expert_pos].as<std::int32_t>();
  std::vector<std::int32_t> off;
  if (be) off = expert_offsets(R, A);
  // Expert parallelism: the forward's dispatch again (the routing is kept), its received rows
  // er; one GPU: the nk rows.
  MoeDispatch dsp;
  if (R.dispatch()) dsp = H.moe_dispatch(g, off);
  const std::int64_t er = R.dispatch() ? dsp.rows : nk;
  // Each expert's rows (each_expert_chunk): the rank's own, or under expert parallelism the
  // received ones.
  auto each_expert = [&](auto&& f) {
    if (be) each_expert_chunk(off, R.dispatch() ? &dsp : nullptr, dm.El, f);
  };
  // 1. the combine's backward, then each expert's down_proj.
  Tensor d_out = ws("d_expert_out", {nk, h}, D);
  Tensor d_weight = ws("d_topk_weight", {b, s, K}, DType::f32);
  if (be)
    be->moe_combine_backward(d_out.data(), d_weight.as<float>(), d_res.data(),
                             A[LayerAct::expert_out].data(), A[LayerAct::topk_weight].as<float>(),
                             pos, n, K, h);
  // Expert parallelism: the gradients of the home rows sent to the experts' ranks (R rows);
  // under etp the A rows received (d_expert_rows.recv; at ep 1 the rank's own) gathered from the
  // etp group, as the forward's rows were.
  Tensor d_rows;
  if (R.dispatch()) {
    Tensor recv;
    if (R.ep && R.etp) {
      recv = ws("d_expert_rows.recv", {dsp.a, h}, D);
      if (be) H.ep_all_to_all(d_out.data(), dsp.send_rows, recv.data(), dsp.recv_rows, h);
      d_out.reset();
    }
    d_rows = ws("d_expert_rows", {er, h}, D);
    if (be && !R.etp)
      H.ep_all_to_all(d_out.data(), dsp.send_rows, d_rows.data(), dsp.recv_rows, h);
    else if (be)
      H.etp_gather_v(R.ep ? recv.data() : d_out.data(), std::size_t(dsp.a), d_rows.data(),
                     dsp.gather_rows, h);
    recv.reset();
    d_out.reset();
  }
  const Tensor& d_y = R.dispatch() ? d_rows : d_out;
  Tensor d_act = ws("d_expert_act", {er, mw}, D);
  void* dWd = H.grad(l, kExpertsDown);
  const void* Wd = H.weight(l, kExpertsDown);
  each_expert([&](std::int64_t e, std::int64_t r0, std::int64_t c) {
    const char* dy = moe_rows(d_y, r0, h, D);
    be->matmul(moe_rows(d_act, r0, mw, D), dy, moe_expert(Wd, e, h * mw, D), c, mw, h, Trans::no,
               Trans::no, 1.f, 0.f);
    be->matmul(moe_expert(dWd, e, h * mw, D), dy, moe_rows(A[LayerAct::expert_act], r0, mw, D), h,
               mw, c, Trans::yes, Trans::no, 1.f, 1.f);
  });
  H.grad_done(l, kExpertsDown);
  d_out.reset();
  d_rows.reset();
  free_step(1);  // expert_out, expert_act
  // 2. SwiGLU.
  Tensor d_gate = ws("d_expert_gate", {er, mw}, D);
  Tensor d_up = ws("d_expert_up", {er, mw}, D);
  const std::int64_t kept = R.dispatch() ? er : (be ? off[std::size_t(E)] : 0);
  if (be && kept > 0)
    be->swiglu_backward(d_gate.data(), d_up.data(), d_act.data(), A[LayerAct::expert_gate].data(),
                        A[LayerAct::expert_up].data(), kept * mw);
  d_act.reset();
  free_step(2);  // expert_gate, expert_up
  // 3. each expert's gate and up, the rows summed back per token, the router.
  Tensor d_in = ws(R.dispatch() ? "d_expert_rows_in" : "d_expert_in", {er, h}, D);
  void* dWgu = H.grad(l, kExpertsGateUp);
  const void* Wgu = H.weight(l, kExpertsGateUp);
  const std::size_t half = std::size_t(mw * h) * dtype_size(D);
  each_expert([&](std::int64_t e, std::int64_t r0, std::int64_t c) {
    const char* wg = moe_expert(Wgu, e, 2 * mw * h, D);
    char* dwg = moe_expert(dWgu, e, 2 * mw * h, D);
    const char* dg = moe_rows(d_gate, r0, mw, D);
    const char* du = moe_rows(d_up, r0, mw, D);
    const char* xin = moe_rows(A[LayerAct::expert_in], r0, h, D);
    char* dx = moe_rows(d_in, r0, h, D);
    be->matmul(dx, dg, wg, c, h, mw, Trans::no, Trans::no, 1.f, 0.f);
    be->matmul(dx, du, wg + half, c, h, mw, Trans::no, Trans::no, 1.f, 1.f);
    be->matmul(dwg, dg, xin, mw, h, c, Trans::yes, Trans::no, 1.f, 1.f);
    be->matmul(dwg + half, du, xin, mw, h, c, Trans::yes, Trans::no, 1.f, 1.f);
  });
  H.grad_done(l, kExpertsGateUp);
  d_gate.reset();
  d_up.reset();
  // The rows' input gradients back from the experts' ranks, into the home rows; under etp the
  // partials summed over the etp group first (d_expert_rows_in.scattered; at ep 1 straight home).
  if (R.dispatch()) {
    Tensor scattered;
    if (R.ep && R.etp) {
      scattered = ws("d_expert_rows_in.scattered", {dsp.a, h}, D);
      if (be) H.etp_reduce_scatter_v(d_in.data(), dsp.gather_rows, scattered.data(), h);
      d_in.reset();
    }
    Tensor home = ws("d_expert_in", {nk, h}, D);
    if (be && R.ep)
      H.ep_all_to_all(R.etp ? scattered.data() : d_in.data(), dsp.recv_rows, home.data(),
                      dsp.send_rows, h);
    else if (be)
      H.etp_reduce_scatter_v(d_in.data(), dsp.gather_rows, home.data(), h);
    d_in = std::move(home);
    scattered.reset();
  }
  Tensor d_xn2 = ws("d_xn2", {b, s, h}, D);
  if (be) be->moe_combine(d_xn2.data(), nullptr, d_in.data(), nullptr, pos, n, K, h);
  d_in.reset();
  // The load-balancing loss (output_router_logits): its gradient of the probabilities, the same
  // E values for every token, uploaded beside the router's backward.
  Tensor aux;
  if (const float* host_aux = H.moe_aux_grad()) {
    aux = ws("router_aux_grad", {E}, DType::f32);
    if (be) be->upload(aux.data(), host_aux, aux.bytes());
  }
  Tensor d_logits = ws("d_router_logits", {b, s, E}, D);
  if (be)
    be->moe_route_backward(d_logits.data(), d_weight.as<float>(),
                           A[LayerAct::router_probs].as<float>(),
                           A[LayerAct::topk_idx].as<std::int32_t>(),
                           aux ? aux.as<float>() : nullptr, n, E, K, R.model.norm_topk_prob);
  aux.reset();
  d_weight.reset();
  void* dWr = H.grad(l, kRouter);
  if (be) {
    be->matmul(d_xn2.data(), d_logits.data(), H.weight(l, kRouter), n, h, E, Trans::no, Trans::no,
               1.f, 1.f);
    be->matmul(dWr, d_logits.data(), A[LayerAct::xn2].data(), E, h, n, Trans::yes, Trans::no, 1.f,
               1.f);
  }
  H.grad_done(l, kRouter);
  d_logits.reset();
  // Qwen2-MoE's shared expert: its gate's backward, then the dense SwiGLU's, into d_xn2. Under
  // sequence parallelism (the forward's split) d_shared_out is gathered for the down projection,
  // xn2 gathered again for gate and up's weight gradients, and their input gradient, a (b, s, h)
  // partial, reduce-scattered and added to the routed experts' d_xn2 as a new d_xn2.
  if (const std::int64_t ms = dm.ms; ms > 0) {
    auto at = [&](LayerAct row) { return A[row].data(); };
    const std::int64_t na = b * dm.s;  // every sequence row (the rank's own without sp)
    auto comm = [&](const char* name) {
      return R.ledger.allocate(name, Category::communication, g, {b, dm.s, h}, D);
    };
    Tensor d_sh = ws("d_shared_out", {b, s, h}, D);
    Tensor d_score = ws("d_shared_score", {b, s}, D);
    if (be)
      be->moe_gate_backward(d_sh.data(), d_score.data(), d_res.data(), at(LayerAct::shared_out),
                            at(LayerAct::shared_score), n, h);
    Tensor gath;
    if (R.sp) gath = comm("d_shared_out.gathered");
    if (be && R.sp) H.sp_gather(d_sh, gath, h);
    const void* dy = R.sp ? gath.data() : d_sh.data();
    Tensor d_sact = ws("d_shared_act", {b, dm.s, ms}, D);
    void* dWsd = H.grad(l, kSharedDown);
    if (be) {
      be->matmul(d_sact.data(), dy, H.weight(l, kSharedDown), na, ms, h, Trans::no, Trans::no, 1.f,
                 0.f);
      be->matmul(dWsd, dy, at(LayerAct::shared_act), h, ms, na, Trans::yes, Trans::no, 1.f, 1.f);
    }
    H.grad_done(l, kSharedDown);
    gath.reset();
    d_sh.reset();
    Tensor d_sg = ws("d_shared_gate", {b, dm.s, ms}, D);
    Tensor d_su = ws("d_shared_up", {b, dm.s, ms}, D);
    if (be)
      be->swiglu_backward(d_sg.data(), d_su.data(), d_sact.data(), at(LayerAct::shared_gate),
                          at(LayerAct::shared_up), na * ms);
    d_sact.reset();
    Tensor partial;
    if (R.sp) {
      gath = comm("xn2.gathered");
      if (be) H.sp_gather(A[LayerAct::xn2], gath, h);
      partial = ws("d_shared_in.partial", {b, dm.s, h}, D);
    }
    // dx (+)= dy·W, dW += dyᵀ·x for the shared gate and up projections and the gate's logit.
    auto input_and_weight = [&](int slot, const Tensor& d, std::int64_t rows, std::int64_t width,
                                const void* x, void* dx, float beta) {
      void* dW = H.grad(l, slot);
      if (be) {
        be->matmul(dx, d.data(), H.weight(l, slot), rows, h, width, Trans::no, Trans::no, 1.f,
                   beta);
        be->matmul(dW, d.data(), x, width, h, rows, Trans::yes, Trans::no, 1.f, 1.f);
      }
      H.grad_done(l, slot);
    };
    const void* x_all = R.sp ? gath.data() : at(LayerAct::xn2);
    void* dx_all = R.sp ? partial.data() : d_xn2.data();
    input_and_weight(kSharedGate, d_sg, na, ms, x_all, dx_all, R.sp ? 0.f : 1.f);
    input_and_weight(kSharedUp, d_su, na, ms, x_all, dx_all, 1.f);
    gath.reset();
    d_sg.reset();
    d_su.reset();
    if (R.sp) {
      Tensor sum = ws("d_xn2", {b, s, h}, D);
      if (be) H.sp_reduce_scatter(partial, sum, d_xn2.data());
      d_xn2 = std::move(sum);
      partial.reset();
    }
    input_and_weight(kSharedExpertGate, d_score, n, 1, at(LayerAct::xn2), d_xn2.data(), 1.f);
  }
  free_step(3);  // xn2, expert_in, the routing and the shared expert's rows
  return d_xn2;
}

}  // namespace

// ------------------------------------------------------------------------------ forward

void decoder_layer_forward(const LayerRank& R, std::int64_t l, int g, LayerActs& A, ActPass pass,
                           const void* x) {
  // A copy: under expert parallelism the experts' rows (er) are this layer's dispatch's.
  ActDims dm = R.dims;
  const std::int64_t b = dm.b, s = dm.s, h = dm.h, i = dm.i, a = dm.a, k = dm.k, d = dm.d;
  // n: rows of the GEMMs (the whole sequence); nr: the rank's rows of the norms and the residual.
  const std::int64_t n = b * s, nr = b * dm.sr, ad = a * d, kd = k * d;
  const ModelConfig& m = R.model;
  const DType D = R.train.dtype;
  const bool eager = R.train.attention == Attention::eager, qkn = m.qk_norm, sp = R.sp;
  const float eps = float(m.rms_eps);
  Backend* be = R.backend;
  const bool run = be != nullptr;
  LayerHost& H = R.host;
  RopeSpec rope = m.rope();
  rope.positions = R.positions(R.cp_rank);
  const bool moe_layer = m.is_moe_layer(g);  // Qwen: dense layers among the MoE ones
  auto W = [&](int slot) { return H.weight(l, slot); };
  auto at = [&](LA row) { return A[row].data(); };
  auto at_f = [&](LA row) { return A[row].as<float>(); };
  // LoRA on projection `slot` (when it is a target): its row a = xin·Aᵀ (n, r), then, once the
  // projection y = xin·Wᵀ exists, y += (alpha/r)·a·Bᵀ.
  const std::int64_t r = dm.r;
  const float scaling = R.train.lora_scaling();
  // Under LoRA dropout the adapter reads its input dropped (dropped_input), a transient.
  auto lora_a = [&](int slot, const void* xin, std::int64_t in_f) {
    const int t = lora_index(slot);
    if (!has_lora(R, t)) return;
    Tensor drop;
    if (R.train.lora_dropped()) drop = dropped_input(R, A, g, t, xin, n, in_f, true);
    if (!run) return;
    be->matmul(at(kLoraRow[t]), drop ? drop.data() : xin, W(lora_a_slot(t)), n, r, in_f, Trans::no,
               Trans::yes, 1.f, 0.f);
    // A row-parallel target's row is a partial (the rank's input columns): summed over the group
    // at once, so that every rank adds the whole c·a·Bᵀ to the summed output and dB reads the
    // whole row, in the forward and in the recompute (which stops before down_proj's B).
    if (R.tp && layer_param_row_parallel(slot)) H.tp_sum(A[kLoraRow[t]], std::uint64_t(n * r));
  };
  auto lora_b = [&](int slot, void* y, std::int64_t out_f) {
    const int t = lora_index(slot);
    if (!run || !has_lora(R, t)) return;
    be->matmul(y, at(kLoraRow[t]), W(lora_b_slot(t)), n, out_f, r, Trans::no, Trans::yes, scaling,
               1.f);
  };
  // The table's rows from `next` up to and including `last` that this pass allocates; returns
  // whether `last` itself was.
  int next = 0;
  auto through = [&](LA last) {
    bool allocated = false;
    for (; next <= static_cast<int>(last); ++next) {
      const LayerActSpec& row = kLayerActs[next];
      allocated = allocated_in(row, m, R.train, pass, moe_layer);
      if (!allocated) continue;
      std::vector<std::int64_t> shape = act_shape(row.shape, dm);
      // Expert parallelism: a rank whose experts receive no row holds none of their rows (an
      // empty tensor takes no memory); every other row has elements.
      if (std::find(shape.begin(), shape.end(), 0) == shape.end())
        A[row.id] =
            R.ledger.allocate(row.name, row.category, g, std::move(shape), act_dtype(row.dtype, D));
    }
    return allocated;
  };
  // Sequence parallelism: a (b, s, h) buffer of the group's rows.
  auto comm = [&](const char* name) {
    return R.ledger.allocate(name, Category::communication, g, {b, s, h}, D);
  };
  // A row-parallel GEMM into `out` with its residual `res` (b, sr, h): out = res + in·Wᵀ, on one
  // rank a copy then a GEMM with beta 1 (no transient); under tensor parallelism the partial
  // product summed over the group, then + res (sp: reduce-scattered into the rank's rows through
  // `partial`).
  auto residual_gemm = [&](LA out, const Tensor& partial, const void* res, LA in, int slot,
                           std::int64_t width) {
    const GemmWeight w = gemm_weight(R, l, g, slot);  // booked by every host, run or not
    if (!run) return;
    if (!R.tp) {
      be->copy(at(out), res, A[out].bytes());
      be->matmul(at(out), at(in), w.ptr, n, h, width, Trans::no, Trans::yes, 1.f, 1.f);
    } else if (!sp) {
      be->matmul(at(out), at(in), w.ptr, n, h, width, Trans::no, Trans::yes, 1.f, 0.f);
      H.tp_sum_add(A[out], res);
    } else {
      be->matmul(partial.data(), at(in), w.ptr, n, h, width, Trans::no, Trans::yes, 1.f, 0.f);
      H.sp_reduce_scatter(partial, A[out], res);
    }
  };
  // y = xin·Wᵀ of base projection `slot` (a quantized weight's dequantized copy freed right after);
  // the allocations happen on every host, the arithmetic when the layer runs.
  auto project_into = [&](void* y, const void* xin, int slot, std::int64_t out_f,
                          std::int64_t in_f) {
    const GemmWeight w = gemm_weight(R, l, g, slot);
    if (run) be->matmul(y, xin, w.ptr, n, out_f, in_f, Trans::no, Trans::yes, 1.f, 0.f);
  };

  through(LA::xn1);  // rstd1, xn1
  if (run) be->rmsnorm_forward(at(LA::xn1), at_f(LA::rstd1), x, W(kInNorm), nr, h, eps);
  Tensor gath;
  if (sp) gath = comm("xn1.gathered");
  if (sp && run) H.sp_gather(A[LA::xn1], gath, h);
  const void* xn1_all = sp ? gath.data() : at(LA::xn1);  // the projections' input
  through(LA::lora_v);  // (qk_norm: q_pre, k_pre, q_rstd, k_rstd), q, k, v (LoRA: their rows)
  // The projections (q and k into q_pre and k_pre when they are normed), each bias added in
  // place right after its GEMM, then its adapter's share.
  void* q_proj = qkn ? at(LA::q_pre) : at(LA::q);
  void* k_proj = qkn ? at(LA::k_pre) : at(LA::k);
  auto project = [&](void* out, int weight, int bias, std::int64_t width) {
    project_into(out, xn1_all, weight, width, h);
    if (run && m.qkv_bias) be->bias_forward(out, W(bias), n, width);
    lora_a(weight, xn1_all, h);
    lora_b(weight, out, width);
  };
  project(q_proj, kQ, kQBias, ad);
  project(k_proj, kK, kKBias, kd);
  project(at(LA::v), kV, kVBias, kd);
  if (run) {
    if (qkn) {  // RMSNorm over each head: n·a (n·k) rows of width d, before RoPE (as HF)
      be->rmsnorm_forward(at(LA::q), at_f(LA::q_rstd), q_proj, W(kQNorm), n * a, d, eps);
      be->rmsnorm_forward(at(LA::k), at_f(LA::k_rstd), k_proj, W(kKNorm), n * k, d, eps);
    }
    be->rope_forward(at(LA::q), at(LA::k), b, s, a, k, d, rope);  // in place
  }
  gath.reset();
  through(LA::attn_out);  // probs (eager) | lse (flash), attn_out
  if (R.cp > 1)
    ring_forward(R, g, A);
  else if (run)
    be->attention_forward(at(LA::attn_out), eager ? at(LA::probs) : nullptr,
                          eager ? nullptr : at_f(LA::lse), at(LA::q), at(LA::k), at(LA::v), b, s, a,
                          k, d, m.window_of(g), R.train.attention);
  // Selective recompute: the attention core's probabilities go as soon as its output exists
  // (step 6 of the backward computes them again).
  if (pass == ActPass::forward && selective_probs(R.train)) A[LA::probs].reset();
  // h_mid = x + attn_out·W_oᵀ.
  if (sp) gath = comm("o_proj.partial");
  through(LA::h_mid);  // (LoRA on o: its row), h_mid
  lora_a(kO, at(LA::attn_out), ad);
  residual_gemm(LA::h_mid, gath, x, LA::attn_out, kO, ad);
  lora_b(kO, at(LA::h_mid), h);
  gath.reset();
  through(LA::xn2);  // rstd2, xn2
  if (run)
    be->rmsnorm_forward(at(LA::xn2), at_f(LA::rstd2), at(LA::h_mid), W(kPostNorm), nr, h, eps);
  // A MoE layer routes the rank's own rows (b, sr, h): under sp no gather (each tensor-parallel
  // rank routes its s/tp tokens, whole experts: check_moe_layout).
  if (sp && !moe_layer) gath = comm("xn2.gathered");
  if (sp && !moe_layer && run) H.sp_gather(A[LA::xn2], gath, h);
  const void* xn2_all = sp && !moe_layer ? gath.data() : at(LA::xn2);
  if (moe_layer) {
    if (!moe_mlp_forward(R, l, g, A, pass, xn2_all, through, dm.er)) return;  // the recompute stops
  } else {
    through(LA::lora_up);  // gate, up (LoRA: their rows)
    project_into(at(LA::gate), xn2_all, kGate, i, h);
    lora_a(kGate, xn2_all, h);
    lora_b(kGate, at(LA::gate), i);
    project_into(at(LA::up), xn2_all, kUp, i, h);
    lora_a(kUp, xn2_all, h);
    lora_b(kUp, at(LA::up), i);
    gath.reset();
    through(LA::act);  // silu(gate) · up
    if (run) be->swiglu_forward(at(LA::act), at(LA::gate), at(LA::up), n * i);
    through(LA::lora_down);  // LoRA on down: its row, recomputed too (dB_down reads it)
    lora_a(kDown, at(LA::act), i);
    if (pass == ActPass::recompute) return;  // it stops before `out`
    // out = h_mid + act·W_downᵀ; it is x_{l+1}.
    if (sp) gath = comm("down_proj.partial");
    through(LA::out);
    residual_gemm(LA::out, gath, at(LA::h_mid), LA::act, kDown, i);
    lora_b(kDown, at(LA::out), h);
    gath.reset();
  }
  // A checkpointed layer: every recomputed row freed right after `out`, in reverse allocation
  // order.
  if (R.train.checkpointed(g))
    for (int r = kNumLayerActs - 1; r >= 0; --r)
      if (kLayerActs[r].checkpointing == UnderCheckpointing::recomputed)
        A[kLayerActs[r].id].reset();
}

// ------------------------------------------------------------------------------ backward

void decoder_layer_backward(const LayerRank& R, std::int64_t l, int g, LayerActs& A, Tensor& x,
                            Tensor& d_res) {
  const ActDims& dm = R.dims;
  const std::int64_t b = dm.b, s = dm.s, sr = dm.sr, h = dm.h, i = dm.i, a = dm.a, k = dm.k,
                     d = dm.d;
  const std::int64_t n = b * s, nr = b * sr, ad = a * d, kd = k * d;
  const ModelConfig& m = R.model;
  const DType D = R.train.dtype;
  const bool eager = R.train.attention == Attention::eager, sp = R.sp;
  Backend* be = R.backend;
  const bool run = be != nullptr;
  LayerHost& H = R.host;
  auto W = [&](int slot) { return H.weight(l, slot); };
  auto at = [&](LA row) { return A[row].data(); };
  auto at_f = [&](LA row) { return A[row].as<float>(); };
  auto ws = [&](const std::string& name, Shape shape, DType dt) {
    return R.ledger.allocate(name, Category::workspace, g, std::move(shape), dt);
  };
  auto comm = [&](const char* name) {
    return R.ledger.allocate(name, Category::communication, g, {b, s, h}, D);
  };
  // The rows the backward frees at `step` (docs/native-plan.md, "Layer l"), in kBackwardFreeOrder.
  auto free_step = [&](int step) {
    for (LA row : kBackwardFreeOrder)
      if (layer_act(row).freed_at_step == step) A[row].reset();
  };
  // LoRA (docs/native-plan.md, "LoRA"): every base weight is frozen (no gradient), the adapters
  // train.
  const bool frozen = R.train.lora();
  const std::int64_t r = dm.r;
  const float scaling = R.train.lora_scaling();
  // The adapter of projection `slot` (a target): with a its row (n, r) and c = alpha/r,
  // dB += c·dyᵀ·a, d_a = c·dy·B (workspace), dA += d_aᵀ·x, dx += d_a·A. Under LoRA dropout x is
  // the dropped input, made again from the mask into `lora_drop.<proj>` (workspace), which then
  // receives d_a·A, added to dx through the mask: dx += (d_a·A) ⊙ mask / (1 − p).
  auto lora_backward = [&](int slot, void* dx, const void* dy, const void* xin, std::int64_t out_f,
                           std::int64_t in_f) {
    const int t = lora_index(slot);
    if (!has_lora(R, t)) return;
    const void* a_row = at(kLoraRow[t]);
    void* dB = H.grad(l, lora_b_slot(t));
    if (run) be->matmul(dB, dy, a_row, out_f, r, n, Trans::yes, Trans::no, scaling, 1.f);
    H.grad_done(l, lora_b_slot(t));
    Tensor d_a = ws(std::string("d_") + kLayerActs[int(kLoraRow[t])].name, {b, s, r}, D);
    if (run)
      be->matmul(d_a.data(), dy, W(lora_b_slot(t)), n, r, out_f, Trans::no, Trans::no, scaling,
                 0.f);
    void* dA = H.grad(l, lora_a_slot(t));
    if (!R.train.lora_dropped()) {
      if (run) {
        be->matmul(dA, d_a.data(), xin, r, in_f, n, Trans::yes, Trans::no, 1.f, 1.f);
        be->matmul(dx, d_a.data(), W(lora_a_slot(t)), n, in_f, r, Trans::no, Trans::no, 1.f, 1.f);
      }
    } else {
      Tensor drop = dropped_input(R, A, g, t, xin, n, in_f, false);
      if (run) {
        be->matmul(dA, d_a.data(), drop.data(), r, in_f, n, Trans::yes, Trans::no, 1.f, 1.f);
        be->matmul(drop.data(), d_a.data(), W(lora_a_slot(t)), n, in_f, r, Trans::no, Trans::no,
                   1.f, 0.f);
        be->dropout_apply(dx, drop.data(), A[kMaskRow[t]].as<std::uint8_t>(), n * in_f,
                          keep_scale(R.train.lora_dropout), true);
      }
    }
    H.grad_done(l, lora_a_slot(t));
  };
  // y = x·Wᵀ with W (out_f, in_f): dx = dy·W (dx_beta 1: +=), dW += dyᵀ·x (a frozen W: none),
  // then the adapter's share. Under LOMO the gradient lives only around these two GEMMs.
  auto linear_backward = [&](int slot, void* dx, const void* dy, const void* xin,
                             std::int64_t out_f, std::int64_t in_f, float dx_beta) {
    if (frozen) {
      const GemmWeight w = gemm_weight(R, l, g, slot);  // booked by every host, run or not
      if (run) be->matmul(dx, dy, w.ptr, n, in_f, out_f, Trans::no, Trans::no, 1.f, dx_beta);
    } else {
      void* dW = H.grad(l, slot);
      if (run) {
        be->matmul(dx, dy, W(slot), n, in_f, out_f, Trans::no, Trans::no, 1.f, dx_beta);
        be->matmul(dW, dy, xin, out_f, in_f, n, Trans::yes, Trans::no, 1.f, 1.f);
      }
      H.grad_done(l, slot);
    }
    lora_backward(slot, dx, dy, xin, out_f, in_f);
  };
  auto bias_backward = [&](int slot, const void* dy, std::int64_t width) {
    if (!m.qkv_bias || frozen) return;
    void* db = H.grad(l, slot);
    if (run) be->bias_backward(db, dy, n, width);
    H.grad_done(l, slot);
  };
  auto norm_backward = [&](int slot, void* dinp, const void* dout, const void* inp,
                           const float* rstd, std::int64_t rows, std::int64_t width) {
    if (frozen) {
      if (run) be->rmsnorm_backward(dinp, nullptr, dout, inp, W(slot), rstd, rows, width);
      return;
    }
    void* dw = H.grad(l, slot);
    if (run) be->rmsnorm_backward(dinp, dw, dout, inp, W(slot), rstd, rows, width);
    H.grad_done(l, slot);
  };
  // The input gradient of a column-parallel GEMM group (gate/up, q/k/v): `compute(dx, xin)`
  // writes it into dx from the group's input xin. On one rank the (b,s,h) gradient itself; under
  // tensor parallelism without sp a partial, summed over the group in place; under sp the input
  // gathered again for dW, a (b,s,h) partial, the gather freed, then the (b,sr,h) gradient it is
  // reduce-scattered into, and the partial freed.
  auto input_grad = [&](const char* gathered, const std::string& grad, LA input,
                        const std::function<void(void*, const void*)>& compute) {
    Tensor gath;
    if (sp) gath = comm(gathered);
    if (sp && run) H.sp_gather(A[input], gath, h);
    Tensor t = ws(sp ? grad + ".partial" : grad, {b, s, h}, D);
    compute(t.data(), sp ? gath.data() : at(input));
    gath.reset();
    if (sp) {
      Tensor rs = ws(grad, {b, sr, h}, D);
      if (run) H.sp_reduce_scatter(t, rs, nullptr);
      t = std::move(rs);
    } else if (R.tp && run) {
      H.tp_sum(t, std::uint64_t(n * h));
    }
    return t;
  };
  // d_residual as the row-parallel GEMMs read it: gathered into `gath` under sp.
  auto d_res_all = [&](Tensor& gath) -> const void* {
    if (!sp) return d_res.data();
    gath = comm("d_residual.gathered");
    if (run) H.sp_gather(d_res, gath, h);
    return gath.data();
  };

  // 0. recompute the layer from its checkpointed input.
  if (R.train.checkpointed(g)) {
    auto rc = R.ledger.scope(Phase::recompute);
    decoder_layer_forward(R, l, g, A, ActPass::recompute, x.data());
  }
  Tensor gath;
  Tensor d_xn2;
  const void* dy = nullptr;
  if (m.is_moe_layer(g)) {
    d_xn2 = moe_mlp_backward(R, l, g, A, d_res, free_step);
  } else {
    // 1. down_proj.
    dy = d_res_all(gath);
    Tensor d_act = ws("d_act", {b, s, i}, D);
    linear_backward(kDown, d_act.data(), dy, at(LA::act), h, i, 0.f);
    free_step(1);  // act (LoRA on down: its row)
    gath.reset();
    // 2. SwiGLU.
    Tensor d_gate = ws("d_gate", {b, s, i}, D);
    Tensor d_up = ws("d_up", {b, s, i}, D);
    if (run)
      be->swiglu_backward(d_gate.data(), d_up.data(), d_act.data(), at(LA::gate), at(LA::up),
                          n * i);
    d_act.reset();
    free_step(2);  // gate, up
    // 3. gate_proj, up_proj.
    d_xn2 = input_grad("xn2.gathered", "d_xn2", LA::xn2, [&](void* dx, const void* xin) {
      linear_backward(kGate, dx, d_gate.data(), xin, i, h, 0.f);
      linear_backward(kUp, dx, d_up.data(), xin, i, h, 1.f);
    });
    d_gate.reset();
    d_up.reset();
    free_step(3);  // xn2 (LoRA on gate, up: their rows)
  }
  // 4. post-attention RMSNorm: d_residual += ..., through h_mid.
  norm_backward(kPostNorm, d_res.data(), d_xn2.data(), at(LA::h_mid), at_f(LA::rstd2), nr, h);
  d_xn2.reset();
  free_step(4);  // h_mid, rstd2
  // 5. o_proj.
  dy = d_res_all(gath);
  Tensor d_ao = ws("d_attn_out", {b, s, ad}, D);
  linear_backward(kO, d_ao.data(), dy, at(LA::attn_out), h, ad, 0.f);
  gath.reset();
  free_step(5);  // (LoRA on o: its row)
  // 6. attention, then RoPE backward in place. Under selective recompute the probabilities first
  // (phase recompute): the attention forward again from q, k, v, its output into a workspace
  // copy dropped at once (the kernel computes both; the kept attn_out is the same bits).
  if (selective_probs(R.train)) {
    auto rc = R.ledger.scope(Phase::recompute);
    const LayerActSpec& row = layer_act(LA::probs);
    A[LA::probs] = R.ledger.allocate(row.name, row.category, g, act_shape(row.shape, dm),
                                     act_dtype(row.dtype, D));
    Tensor again = ws("attn_out.recomputed", {b, s, ad}, D);
    if (run)
      be->attention_forward(again.data(), at(LA::probs), nullptr, at(LA::q), at(LA::k), at(LA::v),
                            b, s, a, k, d, m.window_of(g), R.train.attention);
  }
  Tensor d_q = ws("d_q", {b, s, ad}, D);
  Tensor d_k = ws("d_k", {b, s, kd}, D);
  Tensor d_v = ws("d_v", {b, s, kd}, D);
  Tensor scratch = eager ? ws("d_probs", {b, a, s, s}, D) : ws("attn_delta", {b, a, s}, f32);
  if (R.cp > 1) {
    ring_backward(R, g, A, d_ao, d_q, d_k, d_v, scratch);
    if (run) {
      RopeSpec rope = m.rope();
      rope.positions = R.positions(R.cp_rank);
      be->rope_backward(d_q.data(), d_k.data(), b, s, a, k, d, rope);
    }
  } else if (run) {
    be->attention_backward(d_q.data(), d_k.data(), d_v.data(), eager ? scratch.data() : nullptr,
                           eager ? nullptr : scratch.as<float>(), d_ao.data(), at(LA::q), at(LA::k),
                           at(LA::v), at(LA::attn_out), eager ? at(LA::probs) : nullptr,
                           eager ? nullptr : at_f(LA::lse), b, s, a, k, d, m.window_of(g),
                           R.train.attention);
    be->rope_backward(d_q.data(), d_k.data(), b, s, a, k, d, m.rope());
  }
  scratch.reset();
  d_ao.reset();
  free_step(6);  // attn_out, probs | lse
  // 7. qk_norm: the per-head RMSNorm backward into the projections' gradients d_q_pre, d_k_pre
  // (zero-filled: the op accumulates), which replace d_q and d_k.
  if (m.qk_norm) {
    Tensor d_q_pre = ws("d_q_pre", {b, s, ad}, D);
    if (run) be->fill_zero(d_q_pre.data(), d_q_pre.bytes());
    norm_backward(kQNorm, d_q_pre.data(), d_q.data(), at(LA::q_pre), at_f(LA::q_rstd), n * a, d);
    Tensor d_k_pre = ws("d_k_pre", {b, s, kd}, D);
    if (run) be->fill_zero(d_k_pre.data(), d_k_pre.bytes());
    norm_backward(kKNorm, d_k_pre.data(), d_k.data(), at(LA::k_pre), at_f(LA::k_rstd), n * k, d);
    d_q.reset();
    d_k.reset();
    free_step(7);  // q_pre, q_rstd, k_pre, k_rstd
    d_q = std::move(d_q_pre);
    d_k = std::move(d_k_pre);
  }
  // 8. q_proj, k_proj, v_proj, each bias right after its weight.
  Tensor d_xn1 = input_grad("xn1.gathered", "d_xn1", LA::xn1, [&](void* dx, const void* xin) {
    linear_backward(kQ, dx, d_q.data(), xin, ad, h, 0.f);
    bias_backward(kQBias, d_q.data(), ad);
    linear_backward(kK, dx, d_k.data(), xin, kd, h, 1.f);
    bias_backward(kKBias, d_k.data(), kd);
    linear_backward(kV, dx, d_v.data(), xin, kd, h, 1.f);
    bias_backward(kVBias, d_v.data(), kd);
  });
  d_q.reset();
  d_k.reset();
  d_v.reset();
  free_step(8);  // q, k, v (LoRA on q, k, v: their rows), xn1
  // 9. input RMSNorm: d_residual += ..., through x_l; then x_l is no longer needed.
  norm_backward(kInNorm, d_res.data(), d_xn1.data(), x.data(), at_f(LA::rstd1), nr, h);
  d_xn1.reset();
  free_step(9);  // rstd1
  x.reset();
  for (const LayerActSpec& row : kLayerActs)
    if (A[row.id])
      throw Error("decoder layer " + std::to_string(g) + ": the backward left activation '" +
                  row.name + "' alive (kLayerActs' freed_at_step)");
}

}  // namespace trainmem
