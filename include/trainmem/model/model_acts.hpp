// A decoder layer's activations, described once as data (docs/native-plan.md, "Forward").
//
// kLayerActs is the model's side of the plan for one layer: what the forward allocates, in
// which order, with which names, shapes, dtypes and categories; which attention variant and
// which models (ForModel: Qwen3's q/k norm rows) allocate it; what checkpointing does with it;
// and which step of the layer's backward frees it. The decoder layer (decoder_layer.hpp: the
// single-rank model and every rank of the sharded step) allocates exactly these rows in this
// order (it says only up to which row it needs tensors before each op), the checkpointing free
// and the recompute are loops over it, the backward frees follow kBackwardFreeOrder, and
// layer_activation_plan() lists it for a configuration. So the forward, the free lists and a
// listing cannot drift apart.
//
// The analytic `native` profile (src/analytic*) does not read this table: it is written from
// docs/native-plan.md on its own, and the tests comparing it with the ledger are a real check.
//
// Dimension letters (docs/design.md): b batch, s sequence, h hidden, i intermediate, a heads, k kv
// heads, d head dim; D is the training dtype.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "trainmem/base/config.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/ledger/ledger.hpp"

namespace trainmem {

// The rows, in allocation order.
enum class LayerAct : std::uint8_t {
  rstd1,
  xn1,
  q_pre,
  k_pre,
  q_rstd,
  k_rstd,
  q,
  k,
  v,
  mask_q,
  lora_q,
  mask_k,
  lora_k,
  mask_v,
  lora_v,
  probs,
  lse,
  attn_out,
  mask_o,
  lora_o,
  h_mid,
  rstd2,
  xn2,
  router_probs,
  topk_idx,
  topk_weight,
  expert_pos,
  expert_offsets,
  expert_in,
  expert_gate,
  expert_up,
  expert_act,
  expert_out,
  shared_gate,
  shared_up,
  shared_act,
  shared_out,
  shared_score,
  gate,
  up,
  mask_gate,
  lora_gate,
  mask_up,
  lora_up,
  act,
  mask_down,
  lora_down,
  out,
};
constexpr int kNumLayerActs = 48;

// One extent of an activation's shape: a single dimension, or the products a·d and k·d. `sr`
// is the sequence rows a rank holds of the rows outside the tensor-parallel region (the norms
// and the residual stream): s, or s/tp under sequence parallelism. Listings are of one rank
// without it and write it "s". `r` is the LoRA rank. A mixture of experts adds E (experts), E1
// (E + 1), K (experts per token), m (an expert's width), nk (the rows in expert order: b·s·K, one
// per token and choice, or E·capacity under --capacity-factor; ActDims::nk), ms (Qwen2-MoE's
// shared expert's width) and er (the rows this rank's experts compute, written R: nk on one GPU,
// under expert parallelism the rows the ep group's ranks send to its E/ep experts; ActDims::er).
enum class Extent : std::uint8_t { b, s, sr, h, i, a, k, ad, kd, r, E, E1, K, m, nk, ms, er };

struct ActShape {
  std::uint8_t rank;
  std::array<Extent, 4> extents;  // the first `rank`
};

// The dtype of a row: the training dtype D, fp32 whatever D is, one byte (a dropout mask) or
// int32 (the routing's indices).
enum class ActDType : std::uint8_t { D, f32, u8, i32 };
// Which attention variant allocates a row.
enum class ForAttention : std::uint8_t { both, eager, flash };
// Which models allocate a row: all of them, only those with per-head q/k RMSNorm
// (ModelConfig::qk_norm, Qwen3), or only a LoRA step whose targets include that projection
// (TrainConfig::lora_targets: the adapter's x·Aᵀ, read by dB), or only a dense or only a
// mixture-of-experts MLP (the layer's kind: ModelConfig::is_moe_layer; Qwen's dense layers
// among MoE ones take the dense rows), or only a LoRA step with dropout
// on that projection (TrainConfig::lora_dropped: the adapter's mask). A row a configuration does
// not allocate is absent from every pass and from the backward's frees, as a row of the other
// attention variant is.
enum class ForModel : std::uint8_t {
  all,
  qk_norm,
  dense,   // a dense MLP's rows (gate, up, act): not in a mixture-of-experts layer
  moe,     // a mixture-of-experts layer's rows (ModelConfig::is_moe_layer)
  shared,  // a MoE layer's shared expert's rows (ModelConfig::shared_expert_intermediate > 0)
  lora_q,
  lora_k,
  lora_v,
  lora_o,
  lora_gate,
  lora_up,
  lora_down,
  drop_q,
  drop_k,
  drop_v,
  drop_o,
  drop_gate,
  drop_up,
  drop_down
};
// Whether a row is a dropout mask (drop_*).
constexpr bool dropout_row(ForModel m) {
  return m >= ForModel::drop_q;
}
// The LoraTarget bit (lora.hpp) of a lora_* or drop_* value; 0 for all and qk_norm.
constexpr unsigned lora_target_of(ForModel m) {
  return dropout_row(m)          ? 1u << (static_cast<int>(m) - static_cast<int>(ForModel::drop_q))
         : m >= ForModel::lora_q ? 1u << (static_cast<int>(m) - static_cast<int>(ForModel::lora_q))
                                 : 0u;
}
// Under checkpointing full: `recomputed` rows are freed right after the layer's `out` is
// computed (in reverse allocation order) and allocated again by the recompute in backward;
// the `kept` row is the layer's output, the next layer's checkpointed input.
enum class UnderCheckpointing : std::uint8_t { recomputed, kept };

// The passes of a layer's forward: the forward proper, and the recompute (checkpointing full),
// which allocates every `recomputed` row and stops before `out`.
enum class ActPass : std::uint8_t { forward, recompute };

struct LayerActSpec {
  LayerAct id;
  const char* name;  // ledger tensor name (the layer index is the ledger's layer field)
  ActShape shape;
  ActDType dtype;
  Category category;
  ForAttention attention;
  ForModel model;
  UnderCheckpointing checkpointing;
  // The step of the layer's own backward (docs/native-plan.md, "Layer l", 1..9) that frees
  // it; 0: freed by its consumer, as x_{l+1}: step 9 of layer l+1's backward, or head step 3
  // for the last layer.
  int freed_at_step;
  const char* holds;  // one line, for listings
};

namespace act_shapes {
constexpr ActShape bs{2, {Extent::b, Extent::sr}};
constexpr ActShape bsh{3, {Extent::b, Extent::sr, Extent::h}};
constexpr ActShape bsh_all{3, {Extent::b, Extent::s, Extent::h}};  // every sequence row
constexpr ActShape bsi{3, {Extent::b, Extent::s, Extent::i}};
constexpr ActShape bsad{3, {Extent::b, Extent::s, Extent::ad}};
constexpr ActShape bskd{3, {Extent::b, Extent::s, Extent::kd}};
constexpr ActShape bas{3, {Extent::b, Extent::a, Extent::s}};
constexpr ActShape bsa{3, {Extent::b, Extent::s, Extent::a}};
constexpr ActShape bsk{3, {Extent::b, Extent::s, Extent::k}};
constexpr ActShape bass{4, {Extent::b, Extent::a, Extent::s, Extent::s}};
constexpr ActShape bsr{3, {Extent::b, Extent::s, Extent::r}};
// A MoE layer routes the rank's own rows: b·(s/tp) under sequence parallelism (no gather).
constexpr ActShape bsE{3, {Extent::b, Extent::sr, Extent::E}};
constexpr ActShape bsK{3, {Extent::b, Extent::sr, Extent::K}};
constexpr ActShape E1{1, {Extent::E1}};
constexpr ActShape nkh{2, {Extent::nk, Extent::h}};
constexpr ActShape nkm{2, {Extent::nk, Extent::m}};
constexpr ActShape erh{2, {Extent::er, Extent::h}};
constexpr ActShape erm{2, {Extent::er, Extent::m}};
// Qwen2-MoE's shared expert: its gate, up and act over every sequence row (gathered under sp, of
// the rank's m_s/tp columns), its output and gate logit on the rank's own rows.
constexpr ActShape bsms{3, {Extent::b, Extent::s, Extent::ms}};
}  // namespace act_shapes

// clang-format off
inline constexpr LayerActSpec kLayerActs[kNumLayerActs] = {
    // id                name        shape             dtype          category               attention            model              checkpointing                   step holds
    {LayerAct::rstd1,    "rstd1",    act_shapes::bs,   ActDType::f32, Category::activations, ForAttention::both,  ForModel::all,     UnderCheckpointing::recomputed, 9, "1/rms of each row of x_l (input RMSNorm)"},
    {LayerAct::xn1,      "xn1",      act_shapes::bsh,  ActDType::D,   Category::activations, ForAttention::both,  ForModel::all,     UnderCheckpointing::recomputed, 8, "rmsnorm(x_l)"},
    {LayerAct::q_pre,    "q_pre",    act_shapes::bsad, ActDType::D,   Category::activations, ForAttention::both,  ForModel::qk_norm, UnderCheckpointing::recomputed, 7, "xn1·W_qᵀ (+ bias), the input of q_norm"},
    {LayerAct::k_pre,    "k_pre",    act_shapes::bskd, ActDType::D,   Category::activations, ForAttention::both,  ForModel::qk_norm, UnderCheckpointing::recomputed, 7, "xn1·W_kᵀ (+ bias), the input of k_norm"},
    {LayerAct::q_rstd,   "q_rstd",   act_shapes::bsa,  ActDType::f32, Category::activations, ForAttention::both,  ForModel::qk_norm, UnderCheckpointing::recomputed, 7, "1/rms of each head of q_pre (q_norm)"},
    {LayerAct::k_rstd,   "k_rstd",   act_shapes::bsk,  ActDType::f32, Category::activations, ForAttention::both,  ForModel::qk_norm, UnderCheckpointing::recomputed, 7, "1/rms of each head of k_pre (k_norm)"},
    {LayerAct::q,        "q",        act_shapes::bsad, ActDType::D,   Category::activations, ForAttention::both,  ForModel::all,     UnderCheckpointing::recomputed, 8, "xn1·W_qᵀ (+ bias; q_norm of q_pre), RoPE in place"},
    {LayerAct::k,        "k",        act_shapes::bskd, ActDType::D,   Category::activations, ForAttention::both,  ForModel::all,     UnderCheckpointing::recomputed, 8, "xn1·W_kᵀ (+ bias; k_norm of k_pre), RoPE in place"},
    {LayerAct::v,        "v",        act_shapes::bskd, ActDType::D,   Category::activations, ForAttention::both,  ForModel::all,     UnderCheckpointing::recomputed, 8, "xn1·W_vᵀ (+ bias)"},
    {LayerAct::mask_q, "lora_mask.q_proj", act_shapes::bsh_all, ActDType::u8, Category::activations, ForAttention::both, ForModel::drop_q, UnderCheckpointing::recomputed, 8, "the dropout mask of q_proj's adapter input (xn1): its backward drops the same elements"},
    {LayerAct::lora_q, "lora_a.q_proj", act_shapes::bsr, ActDType::D, Category::activations, ForAttention::both, ForModel::lora_q, UnderCheckpointing::recomputed, 8, "xn1·A_qᵀ (LoRA on q_proj): dB_q reads it"},
    {LayerAct::mask_k, "lora_mask.k_proj", act_shapes::bsh_all, ActDType::u8, Category::activations, ForAttention::both, ForModel::drop_k, UnderCheckpointing::recomputed, 8, "the dropout mask of k_proj's adapter input (xn1): its backward drops the same elements"},
    {LayerAct::lora_k, "lora_a.k_proj", act_shapes::bsr, ActDType::D, Category::activations, ForAttention::both, ForModel::lora_k, UnderCheckpointing::recomputed, 8, "xn1·A_kᵀ (LoRA on k_proj): dB_k reads it"},
    {LayerAct::mask_v, "lora_mask.v_proj", act_shapes::bsh_all, ActDType::u8, Category::activations, ForAttention::both, ForModel::drop_v, UnderCheckpointing::recomputed, 8, "the dropout mask of v_proj's adapter input (xn1): its backward drops the same elements"},
    {LayerAct::lora_v, "lora_a.v_proj", act_shapes::bsr, ActDType::D, Category::activations, ForAttention::both, ForModel::lora_v, UnderCheckpointing::recomputed, 8, "xn1·A_vᵀ (LoRA on v_proj): dB_v reads it"},
    {LayerAct::probs,    "probs",    act_shapes::bass, ActDType::D,   Category::activations, ForAttention::eager, ForModel::all,     UnderCheckpointing::recomputed, 6, "causal softmax of the scores"},
    {LayerAct::lse,      "lse",      act_shapes::bas,  ActDType::f32, Category::activations, ForAttention::flash, ForModel::all,     UnderCheckpointing::recomputed, 6, "log-sum-exp of each score row"},
    {LayerAct::attn_out, "attn_out", act_shapes::bsad, ActDType::D,   Category::activations, ForAttention::both,  ForModel::all,     UnderCheckpointing::recomputed, 6, "attention output, heads side by side"},
    {LayerAct::mask_o, "lora_mask.o_proj", act_shapes::bsad, ActDType::u8, Category::activations, ForAttention::both, ForModel::drop_o, UnderCheckpointing::recomputed, 5, "the dropout mask of o_proj's adapter input (attn_out): its backward drops the same elements"},
    {LayerAct::lora_o, "lora_a.o_proj", act_shapes::bsr, ActDType::D, Category::activations, ForAttention::both, ForModel::lora_o, UnderCheckpointing::recomputed, 5, "attn_out·A_oᵀ (LoRA on o_proj): dB_o reads it"},
    {LayerAct::h_mid,    "h_mid",    act_shapes::bsh,  ActDType::D,   Category::activations, ForAttention::both,  ForModel::all,     UnderCheckpointing::recomputed, 4, "x_l + attn_out·W_oᵀ"},
    {LayerAct::rstd2,    "rstd2",    act_shapes::bs,   ActDType::f32, Category::activations, ForAttention::both,  ForModel::all,     UnderCheckpointing::recomputed, 4, "1/rms of each row of h_mid (post-attention RMSNorm)"},
    {LayerAct::xn2,      "xn2",      act_shapes::bsh,  ActDType::D,   Category::activations, ForAttention::both,  ForModel::all,     UnderCheckpointing::recomputed, 3, "rmsnorm(h_mid)"},
    {LayerAct::router_probs, "router_probs", act_shapes::bsE, ActDType::f32, Category::activations, ForAttention::both, ForModel::moe, UnderCheckpointing::recomputed, 3, "softmax of the router logits xn2·W_routerᵀ in fp32 (its backward)"},
    {LayerAct::topk_idx, "topk_idx", act_shapes::bsK, ActDType::i32, Category::activations, ForAttention::both, ForModel::moe, UnderCheckpointing::recomputed, 3, "the K experts each token is routed to"},
    {LayerAct::topk_weight, "topk_weight", act_shapes::bsK, ActDType::f32, Category::activations, ForAttention::both, ForModel::moe, UnderCheckpointing::recomputed, 3, "their routing weights (renormalised: Mixtral, norm_topk_prob)"},
    {LayerAct::expert_pos, "expert_pos", act_shapes::bsK, ActDType::i32, Category::activations, ForAttention::both, ForModel::moe, UnderCheckpointing::recomputed, 3, "the row of each (token, choice) in expert order"},
    {LayerAct::expert_offsets, "expert_offsets", act_shapes::E1, ActDType::i32, Category::activations, ForAttention::both, ForModel::moe, UnderCheckpointing::recomputed, 3, "where each expert's rows start (the routing's histogram)"},
    {LayerAct::expert_in, "expert_in", act_shapes::erh, ActDType::D, Category::activations, ForAttention::both, ForModel::moe, UnderCheckpointing::recomputed, 3, "xn2's rows in expert order, one per (token, choice): the experts' gate/up input"},
    {LayerAct::expert_gate, "expert_gate", act_shapes::erm, ActDType::D, Category::activations, ForAttention::both, ForModel::moe, UnderCheckpointing::recomputed, 2, "each expert's rows · W_gateᵀ"},
    {LayerAct::expert_up, "expert_up", act_shapes::erm, ActDType::D, Category::activations, ForAttention::both, ForModel::moe, UnderCheckpointing::recomputed, 2, "each expert's rows · W_upᵀ"},
    {LayerAct::expert_act, "expert_act", act_shapes::erm, ActDType::D, Category::activations, ForAttention::both, ForModel::moe, UnderCheckpointing::recomputed, 1, "silu(expert_gate)·expert_up: the down GEMMs' input"},
    {LayerAct::expert_out, "expert_out", act_shapes::nkh, ActDType::D, Category::activations, ForAttention::both, ForModel::moe, UnderCheckpointing::recomputed, 1, "each expert's output before its routing weight (the weight's gradient)"},
    {LayerAct::shared_gate, "shared_gate", act_shapes::bsms, ActDType::D, Category::activations, ForAttention::both, ForModel::shared, UnderCheckpointing::recomputed, 3, "xn2·W_shared_gateᵀ (Qwen2-MoE's shared expert)"},
    {LayerAct::shared_up, "shared_up", act_shapes::bsms, ActDType::D, Category::activations, ForAttention::both, ForModel::shared, UnderCheckpointing::recomputed, 3, "xn2·W_shared_upᵀ"},
    {LayerAct::shared_act, "shared_act", act_shapes::bsms, ActDType::D, Category::activations, ForAttention::both, ForModel::shared, UnderCheckpointing::recomputed, 3, "silu(shared_gate)·shared_up: the shared down GEMM's input"},
    {LayerAct::shared_out, "shared_out", act_shapes::bsh, ActDType::D, Category::activations, ForAttention::both, ForModel::shared, UnderCheckpointing::recomputed, 3, "the shared expert's output before its sigmoid gate"},
    {LayerAct::shared_score, "shared_score", act_shapes::bs, ActDType::D, Category::activations, ForAttention::both, ForModel::shared, UnderCheckpointing::recomputed, 3, "xn2·W_shared_expert_gateᵀ, the gate's logit (σ' in backward)"},
    {LayerAct::gate,     "gate",     act_shapes::bsi,  ActDType::D,   Category::activations, ForAttention::both,  ForModel::dense,     UnderCheckpointing::recomputed, 2, "xn2·W_gateᵀ"},
    {LayerAct::up,       "up",       act_shapes::bsi,  ActDType::D,   Category::activations, ForAttention::both,  ForModel::dense,     UnderCheckpointing::recomputed, 2, "xn2·W_upᵀ"},
    {LayerAct::mask_gate, "lora_mask.gate_proj", act_shapes::bsh_all, ActDType::u8, Category::activations, ForAttention::both, ForModel::drop_gate, UnderCheckpointing::recomputed, 3, "the dropout mask of gate_proj's adapter input (xn2): its backward drops the same elements"},
    {LayerAct::lora_gate, "lora_a.gate_proj", act_shapes::bsr, ActDType::D, Category::activations, ForAttention::both, ForModel::lora_gate, UnderCheckpointing::recomputed, 3, "xn2·A_gateᵀ (LoRA on gate_proj): dB_gate reads it"},
    {LayerAct::mask_up, "lora_mask.up_proj", act_shapes::bsh_all, ActDType::u8, Category::activations, ForAttention::both, ForModel::drop_up, UnderCheckpointing::recomputed, 3, "the dropout mask of up_proj's adapter input (xn2): its backward drops the same elements"},
    {LayerAct::lora_up, "lora_a.up_proj", act_shapes::bsr, ActDType::D, Category::activations, ForAttention::both, ForModel::lora_up, UnderCheckpointing::recomputed, 3, "xn2·A_upᵀ (LoRA on up_proj): dB_up reads it"},
    {LayerAct::act,      "act",      act_shapes::bsi,  ActDType::D,   Category::activations, ForAttention::both,  ForModel::dense,     UnderCheckpointing::recomputed, 1, "silu(gate)·up"},
    {LayerAct::mask_down, "lora_mask.down_proj", act_shapes::bsi, ActDType::u8, Category::activations, ForAttention::both, ForModel::drop_down, UnderCheckpointing::recomputed, 1, "the dropout mask of down_proj's adapter input (act): its backward drops the same elements"},
    {LayerAct::lora_down, "lora_a.down_proj", act_shapes::bsr, ActDType::D, Category::activations, ForAttention::both, ForModel::lora_down, UnderCheckpointing::recomputed, 1, "act·A_downᵀ (LoRA on down_proj): dB_down reads it"},
    {LayerAct::out,      "out",      act_shapes::bsh,  ActDType::D,   Category::activations, ForAttention::both,  ForModel::all,     UnderCheckpointing::kept,       0, "h_mid + act·W_downᵀ = x_{l+1}"},
};
// clang-format on

// The order in which the layer's backward frees its rows: by step, and within a step as
// docs/native-plan.md lists them (after the step's own workspace buffers). `out` is not in it
// (its consumer frees it).
inline constexpr LayerAct kBackwardFreeOrder[] = {
    LayerAct::act,
    LayerAct::lora_down,
    LayerAct::mask_down,
    LayerAct::expert_out,
    LayerAct::expert_act,
    LayerAct::gate,
    LayerAct::up,
    LayerAct::expert_gate,
    LayerAct::expert_up,
    LayerAct::xn2,
    LayerAct::lora_gate,
    LayerAct::mask_gate,
    LayerAct::lora_up,
    LayerAct::mask_up,
    LayerAct::expert_in,
    LayerAct::router_probs,
    LayerAct::topk_idx,
    LayerAct::topk_weight,
    LayerAct::expert_pos,
    LayerAct::expert_offsets,
    LayerAct::shared_gate,
    LayerAct::shared_up,
    LayerAct::shared_act,
    LayerAct::shared_out,
    LayerAct::shared_score,
    LayerAct::h_mid,
    LayerAct::rstd2,
    LayerAct::lora_o,
    LayerAct::mask_o,
    LayerAct::attn_out,
    LayerAct::probs,
    LayerAct::lse,
    LayerAct::q_pre,
    LayerAct::q_rstd,
    LayerAct::k_pre,
    LayerAct::k_rstd,
    LayerAct::q,
    LayerAct::k,
    LayerAct::v,
    LayerAct::lora_q,
    LayerAct::mask_q,
    LayerAct::lora_k,
    LayerAct::mask_k,
    LayerAct::lora_v,
    LayerAct::mask_v,
    LayerAct::xn1,
    LayerAct::rstd1,
};

constexpr const LayerActSpec& layer_act(LayerAct x) {
  return kLayerActs[static_cast<int>(x)];
}

namespace detail {
constexpr bool layer_acts_consistent() {
  for (int r = 0; r < kNumLayerActs; ++r) {
    if (static_cast<int>(kLayerActs[r].id) != r) return false;  // rows in enum order
    // Only the kept row is freed by its consumer.
    if ((kLayerActs[r].freed_at_step == 0) !=
        (kLayerActs[r].checkpointing == UnderCheckpointing::kept))
      return false;
    if (kLayerActs[r].freed_at_step < 0 || kLayerActs[r].freed_at_step > 9) return false;
  }
  // kBackwardFreeOrder: every row the backward frees, once, with non-decreasing steps.
  int freed_rows = 0, last_step = 0;
  for (int r = 0; r < kNumLayerActs; ++r) freed_rows += kLayerActs[r].freed_at_step > 0;
  constexpr int n = sizeof(kBackwardFreeOrder) / sizeof(kBackwardFreeOrder[0]);
  if (n != freed_rows) return false;
  for (int j = 0; j < n; ++j) {
    const LayerActSpec& row = layer_act(kBackwardFreeOrder[j]);
    if (row.freed_at_step < last_step || row.freed_at_step == 0) return false;
    last_step = row.freed_at_step;
    for (int e = 0; e < j; ++e)
      if (kBackwardFreeOrder[e] == kBackwardFreeOrder[j]) return false;
  }
  return true;
}
}  // namespace detail
static_assert(detail::layer_acts_consistent(),
              "kLayerActs / kBackwardFreeOrder: rows out of order, or free steps inconsistent");

// Selective recompute (Megatron's: the attention core's s² tensors recomputed) drops the eager
// `probs` row right after the attention forward and recomputes it at step 6 of the backward;
// flash keeps no s² tensor, so there it changes nothing (docs/decisions.md).
constexpr bool selective_probs(const TrainConfig& train) {
  return train.checkpointing == Checkpointing::selective && train.attention == Attention::eager;
}

// Whether `pass` allocates the row for `model` under `train` (its attention variant and LoRA
// targets) in a layer whose MLP is a mixture of experts (`moe_layer`: ModelConfig::is_moe_layer)
// or dense.
constexpr bool allocated_in(const LayerActSpec& row, const ModelConfig& model,
                            const TrainConfig& train, ActPass pass, bool moe_layer) {
  const Attention attention = train.attention;
  if (row.model == ForModel::qk_norm && !model.qk_norm) return false;
  if (row.model == ForModel::dense && moe_layer) return false;
  if (row.model == ForModel::moe && !moe_layer) return false;
  if (row.model == ForModel::shared && (!moe_layer || model.shared_expert_intermediate == 0))
    return false;
  if (lora_target_of(row.model) != 0 &&
      (!train.lora() || (train.lora_targets & lora_target_of(row.model)) == 0))
    return false;
  if (dropout_row(row.model) && !train.lora_dropped()) return false;
  if (row.attention == ForAttention::eager && attention != Attention::eager) return false;
  if (row.attention == ForAttention::flash && attention != Attention::flash) return false;
  return pass == ActPass::forward || row.checkpointing == UnderCheckpointing::recomputed;
}

// The dimensions the shapes are made of.
// One rank's: under tensor parallelism a, k and i are the rank's heads and MLP columns, and sr
// its sequence rows (module note of Extent). ActDims::of is the whole layer (sr = s).
struct ActDims {
  std::int64_t b, s, h, i, a, k, d, sr;
  std::int64_t r = 0;  // LoRA rank (0: no adapters)
  unsigned lora = 0;   // LoRA targets (LoraTarget bits)
  // A mixture of experts: experts, experts per token, an expert's width (0 for a dense model).
  std::int64_t E = 0, K = 0, m = 0;
  std::int64_t ms = 0;  // the shared expert's width (0: none)
  // The rows in expert order (Extent::nk): b·s·K, or E·capacity under --capacity-factor
  // (moe_rows); cap the capacity (0: none).
  std::int64_t nk = 0, cap = 0;
  // Expert parallelism (ParallelConfig::ep): the rank's El = E/ep experts (E on one GPU) and the
  // rows er they compute (Extent::er; nk on one GPU).
  std::int64_t El = 0, er = 0;
  static ActDims of(const ModelConfig& model, const TrainConfig& train);
};
std::vector<std::int64_t> act_shape(const ActShape& shape, const ActDims& dims);
DType act_dtype(ActDType dtype, DType training);
// "(b,s,a·d)"
std::string act_shape_letters(const ActShape& shape);
// When the row is freed under `checkpointing`, in words, e.g. "after out (checkpointing);
// recomputed; backward step 6".
std::string act_freed_when(const LayerActSpec& row, Checkpointing checkpointing);

// One row as a configuration makes it.
struct PlannedActivation {
  const LayerActSpec* row;
  std::string name;
  std::vector<std::int64_t> shape;
  DType dtype;
  Category category;
  std::uint64_t bytes;
};
// What one layer's `pass` allocates under (model, train), in allocation order (the recompute:
// nothing unless train.checkpointing is full).
std::vector<PlannedActivation> layer_activation_plan(const ModelConfig& model,
                                                     const TrainConfig& train, ActPass pass,
                                                     bool moe_layer);

}  // namespace trainmem
