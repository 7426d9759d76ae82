// One decoder layer of one rank, written once: its parameters (slots, HF names, shapes), its
// forward, the recompute under checkpointing and its backward, with every activation and
// workspace buffer allocated through the ledger at the instant docs/native-plan.md gives.
//
// The single-rank model (LlamaModel) is the world-size-1 case: one rank holding every head,
// every column of the MLP and the whole sequence. The sharded step (ShardedStep) runs the same
// code with the rank's slice of the layer: a/tp heads, i/tp MLP columns, and under sequence
// parallelism s/tp rows of the norms and the residual, gathered around the tensor-parallel
// GEMMs. What differs between them is behind LayerHost: where a weight is read from (the
// parameter, or ZeRO-3's gathered unit), where a gradient goes (the parameter's buffer, LOMO's
// short-lived one, the ZeRO-2/3 reduce bucket) and the tensor-parallel collectives.
//
// kLayerActs (model_acts.hpp) drives the activations: the forward allocates its rows in table
// order, checkpointing frees and recomputes the rows the table marks, and the backward frees
// them in kBackwardFreeOrder.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "trainmem/backends/backend.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/model_acts.hpp"

namespace trainmem {

// A layer's parameter slots, in setup order (docs/native-plan.md, Setup 1). The biases exist
// when ModelConfig::qkv_bias, q_norm and k_norm when qk_norm.
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
  // A mixture-of-experts layer (ModelConfig::moe()) has these in place of gate, up and down: the
  // router `mlp.gate` (E, h), the experts' `gate_up_proj` (E, 2·m, h: each expert's gate rows,
  // then its up rows) and `down_proj` (E, h, m), as transformers 5.x stores them.
  kRouter,
  kExpertsGateUp,
  kExpertsDown,
  // Qwen2-MoE's shared expert (ModelConfig::shared_expert_intermediate > 0): a dense SwiGLU of
  // width m_s, `mlp.shared_expert.{gate,up,down}_proj` ((m_s, h), (m_s, h), (h, m_s)), and its
  // sigmoid gate `mlp.shared_expert_gate` (1, h).
  kSharedGate,
  kSharedUp,
  kSharedDown,
  kSharedExpertGate,
  // LoRA adapters (TrainConfig::lora_rank > 0): A (r, in) and B (out, r) of each target, in
  // LoraTarget order (q, k, v, o, gate, up, down); lora_a_slot / lora_b_slot.
  kLoraFirst,
  kLayerParams = kLoraFirst + 14
};
// The projection a LoRA target index t (0 q, 1 k, 2 v, 3 o, 4 gate, 5 up, 6 down; its
// LoraTarget bit is 1 << t) adapts, and its adapter's slots.
constexpr int kLoraBase[7] = {kQ, kK, kV, kO, kGate, kUp, kDown};
constexpr int lora_a_slot(int t) {
  return kLoraFirst + 2 * t;
}
constexpr int lora_b_slot(int t) {
  return kLoraFirst + 2 * t + 1;
}
// Whether the slot is a LoRA adapter (trainable under LoRA; every other slot is then frozen).
constexpr bool is_lora_slot(int slot) {
  return slot >= kLoraFirst && slot < kLayerParams;
}

// QLoRA (TrainConfig::quantized()): the seven base projections are frozen 4-bit weights, stored
// as bitsandbytes stores them (docs/native-plan.md, "QLoRA"). Whether slot is one of them.
constexpr bool is_quantizable_slot(int slot) {
  return slot == kQ || slot == kK || slot == kV || slot == kO || slot == kGate || slot == kUp ||
         slot == kDown;
}
// Double quantization quantizes the fp32 absmax in 8-bit blocks of this many entries.
constexpr std::int64_t kQuantNestedBlock = 256;
inline Quant4Type quant4_type(Quant q) {  // nf4 or fp4 (TrainConfig::quant4)
  return q == Quant::fp4 ? Quant4Type::fp4 : Quant4Type::nf4;
}
// A 4-bit weight (out, in) as a GEMM's reader sees it, in backend memory: the packed pairs, the
// absmax per block (u8 under double quantization, with its fp32 nested absmax per 256, the
// nested code and the offset; f32 otherwise).
// (--quant int8: packed is CB (out·in int8 bytes), absmax SCB (out f32); the rest unused.)
struct Quant4View {
  const std::uint8_t* packed = nullptr;
  const void* absmax = nullptr;
  const float* nested_absmax = nullptr;
  const float* nested_code = nullptr;
  float offset = 0.0f;
  std::int64_t out = 0, in = 0;
};

// One parameter of a layer as a rank holds it.
struct LayerParamSpec {
  LayerParam slot;
  const char* name;                 // the HF name after "model.layers.N."
  std::vector<std::int64_t> shape;  // the rank's slice
};
// The parameters `model` gives a layer, in setup order, with the shapes of `dims` (the whole
// layer at tp 1; the rank's heads and MLP columns under tensor parallelism). Under LoRA (dims.r,
// dims.lora) each target's lora_A and lora_B follow its weight (and bias), as peft lists them.
// `moe_layer` (ModelConfig::is_moe_layer): the router and experts in place of gate/up/down.
std::vector<LayerParamSpec> layer_param_specs(const ModelConfig& model, const ActDims& dims,
                                              bool moe_layer);
// Whether the slot is the same on every tensor-parallel rank (the norms, the router, the shared
// expert's gate), rather than a block of rows (column-parallel q/k/v with their biases, gate, up,
// the shared expert's gate and up) or of columns (row-parallel o_proj, down_proj, the shared
// expert's down_proj). LoRA (docs/native-plan.md, "LoRA per rank"): a column-parallel target's A is
// replicated and its B a block of rows; a row-parallel target's A a block of columns and its B
// replicated.
bool layer_param_replicated(int slot);
bool layer_param_row_parallel(int slot);
// A replicated slot whose gradient each rank computes as a partial sum over the group (the A of
// a column-parallel LoRA target).
bool layer_param_tp_partial_grad(int slot);

// Activations of one layer: one tensor per row of kLayerActs, empty while not allocated.
struct LayerActs {
  std::array<Tensor, kNumLayerActs> rows;
  Tensor& operator[](LayerAct x) { return rows[static_cast<std::size_t>(x)]; }
  const Tensor& operator[](LayerAct x) const { return rows[static_cast<std::size_t>(x)]; }
};

// Expert parallelism: one MoE layer's dispatch on a rank (LayerHost::moe_dispatch). `rows` is
// what the rank's experts compute (R), `a` what the ep all-to-all brings it (A; R at etp 1);
// send_rows[p] the rank's own rows for ep peer p's experts and recv_rows[p] the rows from ep
// peer p (rows of h, in peer order, each peer's in expert order). Under expert tensor
// parallelism (etp > 1) gather_rows[t] is etp peer t's A, the rows the etp all-gather brings
// from it (and the reduce-scatter returns to it), peer after peer. chunk[(t·ep + p)·El + e]:
// the rows etp peer t received from its ep peer p for local expert e (t 0 alone at etp 1), in
// the order they sit in expert_in. A trace fills `rows` and `a` only.
struct MoeDispatch {
  std::int64_t rows = 0, a = 0;
  std::vector<std::size_t> send_rows, recv_rows, gather_rows;
  std::vector<std::int64_t> chunk;
};

// What a layer needs from the step that runs it. `l` is the rank's local layer index.
class LayerHost {
 public:
  virtual ~LayerHost() = default;
  // The weight of `slot` as the op about to read it sees it.
  virtual const void* weight(std::int64_t l, int slot) = 0;
  // The 4-bit storage of `slot` when it is a quantized projection (the layer then dequantizes it
  // around each GEMM instead of calling weight()); nullptr otherwise.
  virtual const Quant4View* quant4(std::int64_t /*l*/, int /*slot*/) { return nullptr; }
  // The buffer the op about to produce the gradient of `slot` accumulates into (+=); then
  // grad_done once it is complete for this step (or micro-batch). A trace without a backend
  // may return nullptr: nothing is computed.
  virtual void* grad(std::int64_t l, int slot) = 0;
  virtual void grad_done(std::int64_t l, int slot) = 0;
  // Tensor parallelism (measured, tp > 1; never called at tp 1): the partial sums of x (n
  // elements) over the group, in place; y summed over the group, then + x (a row-parallel
  // GEMM's output and its residual).
  virtual void tp_sum(const Tensor& x, std::uint64_t n);
  virtual void tp_sum_add(const Tensor& y, const void* x);
  // Sequence parallelism: the rank's rows (b, s/tp, width) of every rank gathered into
  // (b, s, width); (b, s, h) partial sums reduced over the group and scattered by sequence into
  // the rank's (b, s/tp, h), then + x when x is given.
  virtual void sp_gather(const Tensor& local, const Tensor& full, std::int64_t width);
  virtual void sp_reduce_scatter(const Tensor& partial, const Tensor& out, const void* x);
  // Context parallelism (measured, cp > 1): `send` (count elements of t) to the next rank of the
  // ring, and the previous rank's into `recv`.
  virtual void cp_pass(const void* send, void* recv, std::uint64_t count, DType t);
  // A mixture-of-experts layer's routing in the forward proper (not the recompute, which routes
  // the same way), right after the router computed it: where each expert's rows start (E + 1,
  // host memory, as the layer read them), topk_idx (b, s, K) int32 and router_probs (b, s, E)
  // f32 in backend memory. The host may record them (LlamaModel::routing) and sum them for the
  // load-balancing loss.
  virtual void moe_routed(int /*g*/, const std::vector<std::int32_t>& /*offsets*/,
                          const Tensor& /*topk_idx*/, const Tensor& /*probs*/) {}
  // The load-balancing loss's gradient of every token's router probabilities (E floats in host
  // memory, the same for every layer and token, loss scale included) when ModelConfig::
  // output_router_logits adds the loss; nullptr otherwise.
  virtual const float* moe_aux_grad() { return nullptr; }
  // Expert parallelism (LayerRank::ep; never called otherwise): layer g's dispatch from the
  // rank's own rows per global expert (`offsets`, E + 1 on the host; empty in a trace), the
  // counts exchanged with the ep group in a measured run; the rows' all-to-all over the ep group
  // (rows of `row` elements of the training dtype, on the backend's buffers).
  virtual MoeDispatch moe_dispatch(int g, const std::vector<std::int32_t>& offsets);
  virtual void ep_all_to_all(const void* send, const std::vector<std::size_t>& send_rows,
                             void* recv, const std::vector<std::size_t>& recv_rows,
                             std::int64_t row);
  // Expert tensor parallelism: `rows` rows of `row` D elements gathered from every etp peer t
  // (peer_rows[t] each, in peer order) into recv; the (Σ peer_rows, row) partials in `send`
  // summed over the group, peer t receiving its block of peer_rows[t] rows.
  virtual void etp_gather_v(const void* send, std::size_t rows, void* recv,
                            const std::vector<std::size_t>& peer_rows, std::int64_t row);
  virtual void etp_reduce_scatter_v(const void* send, const std::vector<std::size_t>& peer_rows,
                                    void* recv, std::int64_t row);
};

// How a rank runs its layers.
struct LayerRank {
  const ModelConfig& model;
  const TrainConfig& train;
  Ledger& ledger;
  Backend* backend;  // nullptr: a trace (allocations only, no arithmetic)
  LayerHost& host;
  ActDims dims;     // the rank's: a, k, i per rank; sr the rank's sequence rows
  bool sp = false;  // sequence parallelism (sr = s/tp)
  bool tp = false;  // a measured run with tp > 1: partial sums go through the host's collectives
  // Context parallelism: the rank's dims.s rows are its two chunks of the whole sequence `seq`
  // (SeqPositions::of_rank), and attention is ring attention over the cp ranks (cp 1: none).
  std::int64_t cp = 1;
  std::int64_t cp_rank = 0;
  std::int64_t seq = 0;  // the whole sequence (cp > 1)
  // Expert parallelism (ParallelConfig::ep > 1; docs/distributed.md, "Expert parallelism"): a MoE
  // layer's nk rows leave through `dispatch.send` to the ranks of their experts, which compute
  // dims.er rows of their dims.El experts and return them through `combine.send` (all-to-all
  // over the ep group); the backward's gradients travel alike. Expert tensor parallelism
  // (`etp`, ParallelConfig::etp > 1; "Expert tensor parallelism"): the rows an etp group's ranks
  // received gathered on each (every rank computes all of them over its dims.m = m/etp columns),
  // the down projections' partial outputs reduce-scattered back to the ranks that received them.
  bool ep = false;
  bool etp = false;
  bool dispatch() const { return ep || etp; }
  // LoRA dropout (TrainConfig::lora_dropped): the key of this step's masks. The mask of target t
  // in global layer g is drawn from (dropout_seed, dropout_stream(dropout_step, g, t)), so the
  // recompute draws the same bits.
  std::uint64_t dropout_seed = 0;
  std::uint64_t dropout_step = 0;
  SeqPositions positions(std::int64_t rank) const { return SeqPositions::of_rank(seq, cp, rank); }
};

// The generator stream of LoRA dropout's mask of target t (0..6, q k v o gate up down) in global
// layer g at step `step`; the top bit keeps it apart from the parameters' streams (their index).
constexpr std::uint64_t dropout_stream(std::uint64_t step, std::uint64_t g, std::uint64_t t) {
  return (1ull << 63) | (step << 24) | (g << 3) | t;
}

// Forward of local layer l (global index g: the ledger's layer, the sliding window) from its
// input x (b, sr, h). `pass` recompute (a checkpointed layer, in backward) allocates the
// recomputed rows again and stops before `out`; the forward proper frees them right after `out`
// when the layer is checkpointed (TrainConfig::checkpointed(g)).
void decoder_layer_forward(const LayerRank& rank, std::int64_t l, int g, LayerActs& acts,
                           ActPass pass, const void* x);
// Backward of local layer l (recompute first when it is checkpointed). d_res (b, sr, h)
// carries dL/d(residual) in and out (accumulated); x is the layer's input, freed at the end.
// Throws Error if a row of the layer is still alive after its last step.
void decoder_layer_backward(const LayerRank& rank, std::int64_t l, int g, LayerActs& acts,
                            Tensor& x, Tensor& d_res);

}  // namespace trainmem
