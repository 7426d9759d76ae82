// The sharded step's state (ShardedStep::Impl), shared by the files that define it, each one
// phase of the step: src/model/sharded_setup.cpp (the rank's parameters, their flat offsets and
// setup's allocations), src/model/sharded_data.cpp (measured runs: the values a rank holds,
// --weights and --tokens, the collectives, gradients into their buffers, the optimizer and
// ZeRO-3's gathers) and src/model/sharded_step.cpp (forward, backward, the 1F1B schedule and
// ShardedStep's interface). The layers themselves are the decoder layer (decoder_layer.hpp),
// which this struct hosts. Private to the model layer.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>

#include "trainmem/base/checked.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/param_init.hpp"
#include "trainmem/model/activation_offload.hpp"
#include "trainmem/model/decoder_layer.hpp"
#include "trainmem/model/model.hpp"
#include "trainmem/model/quant_param.hpp"
#include "trainmem/model/sharded_step.hpp"

namespace trainmem {

struct ShardedStep::Impl : LayerHost {
  using Shape = std::vector<std::int64_t>;
  static constexpr DType f32 = DType::f32;
  static constexpr DType i32 = DType::i32;

  ModelConfig m;
  TrainConfig t;
  ParallelConfig p;
  std::int64_t stage;
  Ledger& ledger;
  DType D;
  bool first, last, sp, eager, tied_here, bias, qkn;
  std::int64_t b, s, sr, h, d, a, k, i, V, Ls, M;
  // Context parallelism: s is the rank's s_full/cp rows of the whole sequence s_full, at the
  // positions of its two chunks (SeqPositions::of_rank of cp index cr).
  std::int64_t s_full, cp;
  std::uint64_t Pk = 0;  // the stage's trainable parameter elements (the flat vector's)
  int step = 0;

  // Measured runs.
  const ShardedExecution* X = nullptr;
  Backend* be = nullptr;
  bool run = false;
  int r = 0;                     // this rank in the gradient group (dp·cp ranks)
  int cr = 0;                    // its context-parallel index (r mod cp)
  std::uint64_t shard = 0;       // elements per rank of the flat vectors
  std::uint64_t lo = 0, hi = 0;  // the flat range this rank owns
  // Per-parameter sharding (FSDP2, ZeRO-3 only): `shard` is every parameter's ceil(rows/N) rows
  // (ParamShape::off its offset in every rank's shard), `own` the rows this rank owns
  // (ParamShape::st the first of parameter q's in the optimizer states); lo and hi are unused.
  bool per_param = false;
  std::uint64_t own = 0;
  // LoRA under ZeRO-3: the frozen base's own flat vector (ParamShape::off of a frozen parameter),
  // sharded alike into `frozen_shard` (docs/distributed.md, "LoRA per rank").
  std::uint64_t Fk = 0, fshard = 0, flo = 0, fhi = 0;
  // A mixture of experts: the routed experts' parameters in a flat vector of their own (as
  // Megatron's expert buffers and DeepSpeed's MoE parameter groups keep them; ParamShape::expert),
  // Ek elements sharded over the expert-data-parallel ranks (ParallelConfig::edp), eshard each,
  // this rank owning [elo, ehi) as index edp_i() of the group (with ep = etp = tp = 1 the expert
  // group is the gradient group, else the stage's slots with the rank's j mod (ep·etp);
  // docs/distributed.md, "Mixture of experts per rank").
  std::uint64_t Ek = 0, eshard = 0, elo = 0, ehi = 0;
  // Expert parallelism (measured, ep > 1): the ep group on the backend's buffers and on host
  // buffers, the expert-data-parallel group (null at ep 1: the gradient group serves); expert
  // tensor parallelism (etp > 1): the etp group on both.
  Collective* EPc = nullptr;
  Collective* EPH = nullptr;
  Collective* EDP = nullptr;
  Collective* ETP = nullptr;
  Collective* ETPH = nullptr;
  std::int64_t cur_mb = 0;  // the micro-batch in forward or backward (the dispatch's key)
  ShardedStep::ExpertRows given_rows, seen_rows;
  ShardedStep::SourceCounts routed;  // measured: this rank's choices per global expert
  // output_router_logits: per micro-batch, the sums of the router's probabilities per expert over
  // the rank's tokens and every MoE layer (the choices are `routed`'s), and the load-balancing
  // loss's gradient of each probability (a trace: zeros, the buffer's bytes alone matter).
  std::map<std::int64_t, std::vector<double>> aux_probs;
  std::map<std::int64_t, std::vector<float>> aux_grad;
  double router_aux_loss(std::int64_t mb);
  // The flat vector's group of parameter q (the experts': the expert-data-parallel ranks), this
  // rank's index in it (the owner pieces() names) and its size.
  Collective& group_of(std::size_t q) const { return P[q].expert && EDP ? *EDP : X->data; }
  int index_of(std::size_t q) const { return P[q].expert ? int(edp_i()) : r; }
  std::int64_t ranks_of(std::size_t q) const { return P[q].expert ? p.edp() : p.grad_ranks(); }
  std::size_t es = 4;         // bytes of D
  float S = 1, ce_scale = 1;  // the loss scale and the cross-entropy backward's scale
  double loss_sum = 0;        // this rank's summed token losses of the step
  std::vector<std::int32_t> global_tokens;
  // Tensor parallelism (tpx: a measured run with tp > 1): the group, this rank's index in it,
  // its vocabulary rows [V_lo, V_lo + V), and the micro-batch's rows whose token (target) lies
  // in another rank's rows, with the targets' global ids.
  Collective* T = nullptr;
  Collective* TH = nullptr;
  bool tpx = false;
  int tr = 0;
  std::int64_t V_lo = 0;
  std::vector<std::int64_t> foreign_tok, foreign_tgt;
  std::vector<std::int32_t> mb_targets;  // the micro-batch's global targets
  // Pipeline parallelism (ppx: a measured run with pp > 1): the group (rank = stage) and, with
  // tied embeddings, the group of the first and last stage that sums their copies' gradients.
  Collective* PPc = nullptr;
  std::unique_ptr<Collective> tie_group;
  bool ppx = false;
  std::vector<unsigned char> pp_stage;  // the host copy a pipeline message travels in
  std::vector<std::size_t> gidx;        // each parameter's index in the whole model's setup order
  // Context parallelism (a measured run with cp > 1): the ring of the cp ranks, on host buffers.
  Collective* CPc = nullptr;

  // Setup's tensors the arithmetic never reads itself: the GEMM workspace (handed to the
  // backend) and, with --overlap-comm, the second reduce bucket.
  std::vector<Tensor> persistent;
  // Setup's tensors the arithmetic uses (empty where the layout has none).
  std::vector<Tensor> value, grads;  // per parameter (ZeRO < 3, ZeRO < 2)
  struct States {
    Tensor master, m, v;
  };
  std::vector<States> states;  // per parameter (ZeRO 0)
  States shard_states;         // ZeRO >= 1
  States expert_states;        // ZeRO >= 1, the experts' flat vector
  Tensor params_shard, grads_shard, tokens, targets, bucket;
  Tensor expert_grads_shard;   // ZeRO-2/3, the experts' flat vector
  Tensor expert_params_shard;  // ZeRO-3, the experts' flat vector
  Tensor frozen_shard;         // LoRA under ZeRO-3: the rank's slice of the frozen base
  // --offload (measured): what DeepSpeed keeps in host memory, each (shard) elements: the
  // optimizer states (fp32 master when D is 16-bit, m, v), the fp32 gradient shard the host
  // optimizer reads, and under optimizer+params the D parameter shard; the host update runs on a
  // cpu backend of fp32.
  bool offx = false;
  std::unique_ptr<Backend> host_be;
  std::vector<float> h_master, h_m, h_v, h_grad;
  std::vector<unsigned char> h_params;
  // --offload-activations (one stage): the copies' host ledger; its peak counts as host bytes.
  std::unique_ptr<ActivationOffload> offload;
  // Per-parameter sharding with AdamW: torch's per-parameter fp32 `step` scalars (host memory).
  std::uint64_t step_scalars = 0;
  std::uint64_t host_bytes() const {
    return (h_master.size() + h_m.size() + h_v.size() + h_grad.size()) * 4 + h_params.size() +
           (offload ? offload->host_peak() : 0) + step_scalars * 4;
  }

  // ZeRO-3: unit positions and the gathered units alive. Per-parameter sharding (FSDP2): the
  // root unit 0 holds the embedding, the final norm and lm_head, gathered at the first position
  // and kept until the end of the backward (fully_shard does not reshard the root after
  // forward), so the head's position is unit 0's.
  int head_unit() const { return per_param ? 0 : int(Ls) + 1; }
  // FSDP2's gradient path (per-parameter sharding; docs/distributed.md, "FSDP2: per-parameter
  // sharding"): each parameter's unsharded gradient (autograd's .grad) from the op that makes it
  // to its unit's post-backward; there the previous unit's reduce-scatter input is released, the
  // unit's own (N·S_u, padded) allocated and filled, the unsharded gradients freed, and the
  // unit's sharded gradient (S_u, the reduce-scatter output) allocated, kept until the optimizer
  // step has run (zero_grad(set_to_none)); the input is held until the next unit's.
  std::map<int, Tensor> ugrad;            // by parameter, while its unit is in backward
  std::vector<Tensor> unit_grad;          // by unit: its sharded gradient
  std::vector<std::uint64_t> unit_shard;  // by unit: S_u elements
  std::vector<std::uint64_t> goff;        // by parameter: its chunk's offset in its unit
  std::vector<int> unit_of;               // by parameter
  Tensor rs_held;
  void reduce_unit(int u);
  // The gradient buffer of parameter q for the op about to produce it: per-parameter sharding
  // allocates (and books) it whether or not the step computes; else G(q) on a computing run.
  void* grad_buffer(int q) { return per_param || run ? G(q) : nullptr; }
  std::vector<int> seq;  // unit per position (0 embedding, 1+l layer, Ls+1 head)
  std::vector<std::uint64_t> unit_elems;
  std::map<int, Tensor> gathered;

  // Activations of one micro-batch in flight.
  struct MicroBatch {
    Tensor input;  // embed_out or stage_input (x_0)
    std::vector<LayerActs> layers;
    Tensor final_norm_out, final_rstd, logits, ce_lse;
  };
  std::map<std::int64_t, MicroBatch> in_flight;

  Impl(const ModelConfig& model, const TrainConfig& train, const ParallelConfig& layout,
       std::int64_t st, Ledger& l);

  Tensor alloc(const std::string& name, Category c, int layer, Shape shape, DType dt) {
    return ledger.allocate(name, c, layer, std::move(shape), dt);
  }
  Tensor act(const std::string& name, int layer, Shape shape, DType dt) {
    return alloc(name, Category::activations, layer, std::move(shape), dt);
  }
  Tensor ws(const std::string& name, int layer, Shape shape, DType dt) {
    return alloc(name, Category::workspace, layer, std::move(shape), dt);
  }
  Tensor comm(const std::string& name, int layer, Shape shape, DType dt) {
    return alloc(name, Category::communication, layer, std::move(shape), dt);
  }
  int global_layer(std::int64_t l) const { return static_cast<int>(stage * Ls + l); }

  // ---------------------------------------------------------------- setup
  struct ParamShape {
    std::string name;
    int layer;
    Shape shape;
    int slot = -1;          // Slot of a layer parameter, -1 otherwise
    std::uint64_t off = 0;  // first element in the flat vector (trainable parameters only)
    std::uint64_t st = 0;   // per-parameter sharding: its owned rows' first state element
    std::uint64_t n = 0;    // elements
    // LoRA: only the adapters train; a frozen parameter has no gradient, no optimizer state and
    // no place in the flat vector (docs/distributed.md, "LoRA per rank").
    bool trainable = true;
    int quant = -1;       // QLoRA: its index in `quant` (a frozen 4-bit base projection), else -1
    bool expert = false;  // a routed expert's (gate_up_proj, down_proj): the experts' flat vector
  };
  // QLoRA: each 4-bit weight's tensors but the packed pairs (its `value`), by ParamShape::quant.
  std::vector<QuantParam> quant;
  std::vector<ParamShape> P;
  std::vector<std::array<int, kLayerParams>>
      lidx;                                    // [local layer][slot] -> index in P, -1 if absent
  int embed_i = -1, norm_i = -1, head_i = -1;  // head_i: lm_head, or the embedding when tied
  std::vector<std::vector<std::pair<int, std::uint64_t>>> members;  // ZeRO-3 unit: (param, pos)
  std::vector<ParamShape> param_shapes() const;

  static std::uint64_t numel(const Shape& sh);

  void setup();

  // ---------------------------------------------------------------- measured runs: data
  char* elem_ptr(const Tensor& x, std::uint64_t elem) const {
    return static_cast<char*>(x.data()) + elem * es;
  }
  // The flat vector parameter q lives in: its elements per rank, the range this rank owns, the
  // ZeRO-2 gradient shard and the ZeRO >= 1 states (the experts' or the others').
  std::uint64_t shard_of(std::size_t q) const {
    return !P[q].trainable ? fshard : P[q].expert ? eshard : shard;
  }
  std::uint64_t lo_of(std::size_t q) const { return P[q].expert ? elo : lo; }
  // --offload: where parameter q's flat vector starts in the host's vectors (the dense shard's
  // elements, then the experts' shard's).
  std::uint64_t host_base(std::size_t q) const { return P[q].expert ? shard : 0; }
  std::uint64_t hi_of(std::size_t q) const { return P[q].expert ? ehi : hi; }
  Tensor& grads_shard_of(std::size_t q) { return P[q].expert ? expert_grads_shard : grads_shard; }
  const States& states_of(std::size_t q) const {
    return P[q].expert ? expert_states : shard_states;
  }
  // The ranks' owned ranges of a flat vector of `per` elements per rank over `ranks` ranks
  // (the gradient group's, the frozen base's under LoRA; the experts' over their group)
  // overlapping [from, to): f(owner, first, end).
  template <class F>
  void by_owner_of(std::uint64_t per, std::uint64_t from, std::uint64_t to, F&& f,
                   std::int64_t ranks) const {
    if (per == 0) return;
    for (std::uint64_t q = from / per; q < std::uint64_t(ranks) && q * per < to; ++q)
      f(int(q), std::max(from, q * per), std::min(to, (q + 1) * per));
  }
  // Where parameter q's elements live among the gradient group's shards: f(owner, a, z, at),
  // elements [a, z) of the parameter (row-major) in `owner`'s shard from element `at`. Flat: its
  // range of the flat vector (the frozen base's under LoRA) by owner; per-parameter: rows in
  // chunks of ceil(rows/N), each owner's piece at the parameter's offset in every shard.
  template <class F>
  void pieces(std::size_t q, F&& f) const {
    const ParamShape& pq = P[q];
    if (!per_param || !pq.trainable) {
      const std::uint64_t per = shard_of(q);
      by_owner_of(
          per, pq.off, pq.off + pq.n,
          [&](int o, std::uint64_t A, std::uint64_t Z) {
            f(o, A - pq.off, Z - pq.off, A - std::uint64_t(o) * per);
          },
          ranks_of(q));
      return;
    }
    const std::uint64_t rows = std::uint64_t(pq.shape.at(0)), cols = rows ? pq.n / rows : 0;
    const std::uint64_t N = std::uint64_t(p.grad_ranks()), c = shard_chunk_rows(rows, N);
    for (std::uint64_t o = 0; o < N && o * c < rows; ++o)
      f(int(o), o * c * cols, std::min(rows, (o + 1) * c) * cols, pq.off);
  }
  // The states' offset of this rank's piece of parameter q that starts at `at` in its shard.
  std::uint64_t state_at(std::size_t q, std::uint64_t at) const { return per_param ? P[q].st : at; }
  ParamInit init_of(std::size_t q) const;
  // The parameter's index in the whole model's setup order (LlamaModel's): with pp = 1 the
  // rank's own order.
  std::size_t global_index(std::size_t q) const { return gidx.empty() ? q : gidx[q]; }
  // Where local element e of parameter q sits in the whole parameter (row-major): column-parallel
  // weights and biases (q/k/v, gate/up, the vocabulary rows of the embedding and lm_head) hold a
  // block of rows, row-parallel weights (o_proj, down_proj) a block of columns, norms all.
  // Under expert parallelism the routed experts hold experts [ep_i·El, (ep_i + 1)·El): a block
  // of rows of dim 0; under expert tensor parallelism each expert's block etp_i of m/etp columns
  // (gate_up_proj: those gate rows, then the same up rows; down_proj: those columns); at
  // ep = etp = 1 they are whole, as the router is.
  bool ep_block(std::size_t q) const { return P[q].expert && (p.ep > 1 || p.etp > 1); }
  bool replicated(std::size_t q) const {
    if (P[q].expert) return p.ep == 1 && p.etp == 1;  // whole experts on every rank
    const int sl = P[q].slot;
    return p.tp == 1 || (sl >= 0 && layer_param_replicated(sl)) || (sl < 0 && int(q) == norm_i);
  }
  std::uint64_t global_elem(std::size_t q, std::uint64_t e) const;

  // --weights: the file's name of parameter q (a tied lm_head on the last stage is the
  // embedding's copy) and the whole parameter's shape in the single-rank model.
  std::string file_name(std::size_t q) const {
    return m.tied_embeddings && int(q) == head_i ? "model.embed_tokens.weight" : P[q].name;
  }
  Shape whole_shape(std::size_t q) const;
  // Checks every parameter's tensor in the files before anything is read (InputError).
  const SafeTensorsReader* weights_file(std::size_t q) const;
  // The rank's P[q].n values of parameter q as fp32: its elements (global_elem) of the file's
  // tensor, or of the random initialisation.
  std::vector<float> rank_values(std::size_t q) const;

  void initialise();
  // ZeRO-3 of a mixture of experts (measured): the expert shards of this rank's expert-data-
  // parallel group, by its index (eshard elements of D each), gathered on host buffers.
  std::vector<unsigned char> expert_group_shards();
  std::vector<States*> all_states();

  // Micro-batch mb's rows of the global batch into tokens and targets (targets: the next
  // token within a row, -1 at the last position).
  void upload_batch(std::int64_t mb);
  // Rows `rows` of x (rows of h elements in D) set to zero.
  void zero_rows(const Tensor& x, const std::vector<std::int64_t>& rows) {
    for (std::int64_t row : rows)
      be->fill_zero(elem_ptr(x, std::uint64_t(row * h)), std::uint64_t(h) * es);
  }
  // Pipeline parallelism: messages between stages travel in host memory over the pipeline
  // group's MPI (docs/distributed.md, "Pipeline messages"): the backend's buffer is downloaded
  // (after its work is done) and sent, or received and uploaded, on every backend alike. On cuda
  // no device transport buffer exists outside the ledger, and the staged MPI send returns before
  // the peer receives, so 1F1B's crossing sends (stage s sends forward while s+1 sends backward)
  // cannot wait on each other as NCCL's would.
  void pp_send(const Tensor& x, std::uint64_t n, int peer);
  void pp_recv(const Tensor& x, std::uint64_t n, int peer);
  // The tied embedding's gradient (n elements at g) summed over the first and last stage, through
  // host memory likewise.
  void tie_sum(void* g, std::uint64_t n);
  // The rule of every collective on device buffers (X->data, T): called right after
  // be->synchronize() (or a synchronous upload/download), with no allocation and no backend launch
  // between. On cuda the collective runs on NCCL's stream, unordered with the backend's, and the
  // pool may hand a block just freed on the backend's stream to a new tensor while kernels queued
  // there still read it: the synchronisation is the only ordering.
  // Tensor parallelism: the partial sums of x (n elements) over the group, in place.
  void tp_sum(const Tensor& x, std::uint64_t n) override {
    be->synchronize();
    T->all_reduce_sum(x.data(), n, D);
  }
  // Sequence parallelism: the rank's rows (b, s/tp, h) of every rank gathered into (b, s, h),
  // one batch row at a time (each rank's chunk lands at its sequence offset).
  void sp_gather(const Tensor& local, const Tensor& full, std::int64_t width) override;
  // The (b, s, h) partial sums reduced over the group and scattered by sequence into the rank's
  // (b, s/tp, h), then + x (the residual, the rank's rows) when x is given.
  void sp_reduce_scatter(const Tensor& partial, const Tensor& out, const void* x) override;
  // y = partial (already in y) summed over the group, then + x (the residual): a row-parallel
  // GEMM's output.
  void tp_sum_add(const Tensor& y, const void* x) override;
  // Ring attention's message: `send` to the next context-parallel rank, the previous one's into
  // `recv`, over the ring's MPI group (MPI's send returns once staged, so every rank sends
  // first). Backend buffers other than the cpu's travel through host copies, as pipeline
  // messages do.
  std::vector<unsigned char> cp_out, cp_in;
  void cp_pass(const void* send, void* recv, std::uint64_t count, DType dt) override {
    be->synchronize();
    const int next = int((cr + 1) % cp), prev = int((cr + cp - 1) % cp);
    if (be->kind() == BackendKind::cpu) {
      CPc->send(send, count, dt, next);
      CPc->recv(recv, count, dt, prev);
      return;
    }
    const std::size_t bytes = count * dtype_size(dt);
    cp_out.resize(bytes);
    cp_in.resize(bytes);
    be->download(cp_out.data(), send, bytes);
    CPc->send(cp_out.data(), count, dt, next);
    CPc->recv(cp_in.data(), count, dt, prev);
    be->upload(recv, cp_in.data(), bytes);
  }

  // Vocabulary-parallel cross-entropy, forward: every rank computed its rows' lse and (for the
  // targets it holds) lse - logit; the group's lse is the log-sum-exp of the ranks', the target
  // logit the holder's. `lse` becomes the whole vocabulary's; returns the summed token loss.
  double tp_cross_entropy(Tensor& lse, const Tensor& losses);

  // A weight as the op at unit `u`'s position reads it.
  const void* W(int u, int q) const;
  const void* LW(std::int64_t l, int slot) const {
    return W(int(1 + l), lidx[std::size_t(l)][std::size_t(slot)]);
  }
  int Li(std::int64_t l, int slot) const { return lidx[std::size_t(l)][std::size_t(slot)]; }

  // A parameter's gradient buffer for the op about to produce it (+=): the parameter's own
  // (ZeRO < 2, zeroed once per step) or the reduce bucket, zeroed.
  void* G(int q);
  // The gradient is complete for this micro-batch. ZeRO >= 2: summed over the ranks in the
  // bucket, the owned part added into grads.shard.
  void G_done(int q);

  // ZeRO-3: unit u's weights into its gathered buffer, each owner's slice broadcast.
  void fill_unit(int u);

  // f(q, a, z) for every parameter q with elements [a, z) of the flat range this rank owns (of
  // q's flat vector: lo_of(q)).
  void for_owned(const std::function<void(std::size_t, std::uint64_t, std::uint64_t)>& f) const;
  // ZeRO 1/2 after the update: every parameter's slices broadcast from their owners, in place.
  void broadcast_owned_slices();

  // q_norm and k_norm under tensor parallelism: the same weights on every rank of the group,
  // each rank's gradient from its own heads, so a partial sum.
  // Under sp the RMSNorm weights too: each rank's gradient from its own rows of the sequence.
  bool tp_partial(int q) const;

  // After the last micro-batch: ZeRO 0/1 reduce the whole gradients, then every layout's update
  // and (ZeRO 1/2) the owners' broadcasts.
  void optimizer_step();

  // --offload: the owned slices updated on the host (the gradients already reduced: ZeRO 2/3 in
  // h_grad, ZeRO 1 in the parameters' .grad, copied here), the new D values written back where
  // the parameters live, then (ZeRO 1/2) the owners' broadcasts. The arithmetic is the device
  // update's: AdamW/SGD on the fp32 master (16-bit D) or on the fp32 values themselves.
  void offload_step(float gs);

  // ZeRO-3: the window of position `pos` (past the end: nothing): release what leaves it, then
  // gather what enters it, in position order.
  void window(std::size_t pos);
  std::string unit_name(int u) const;

  // ---------------------------------------------------------------- forward
  // The decoder layer (decoder_layer.hpp) with the rank's slice; this Impl is its host.
  ActDims dims() const {
    ActDims dm{b, s, h, i, a, k, d, sr};
    dm.r = t.lora_rank;
    dm.lora = t.lora() ? t.lora_targets : 0u;
    if (m.moe()) {  // the rank's b·s tokens routed (b·s/tp under sp)
      dm.E = m.experts;
      dm.K = m.experts_per_token;
      dm.m = m.expert_intermediate / p.etp;         // the rank's columns of each expert
      dm.ms = m.shared_expert_intermediate / p.tp;  // its columns, split like the MLP's
      // --capacity-factor: the capacity over the rank's own tokens, its buffers E·c rows as on
      // one GPU (dispatch.send, expert_out); the experts' rows are the kept ones received.
      dm.cap = moe_capacity_of(m, t.capacity_factor, b * sr);
      dm.nk = moe_rows_of(m, t.capacity_factor, b * sr);
      dm.El = dm.E / p.ep;
      dm.er = p.ep > 1 || p.etp > 1 ? checked_mul(routed_rows(), p.etp, "expert rows") : dm.nk;
    }
    return dm;
  }
  // The rank's place in its stage (Megatron's order, the tensor-parallel index fastest):
  // slot = r·tp + tr, r its gradient-group index; a MoE rank's expert-tensor-parallel index is
  // slot mod etp, its expert-parallel index (slot / etp) mod ep and its expert-data-parallel
  // index slot / (etp·ep).
  std::int64_t slot() const { return std::int64_t(r) * p.tp + tr; }
  std::int64_t etp_i() const { return slot() % p.etp; }
  std::int64_t ep_i() const { return slot() / p.etp % p.ep; }
  std::int64_t edp_i() const { return slot() / (p.etp * p.ep); }
  // Expert parallelism: the rows this rank's experts take under balanced routing, its experts
  // [ep_i·El, (ep_i + 1)·El); each of the ep ranks of its group routes ⌊nK/E⌋ of its nK = n·K
  // choices to every expert and one more to each of the first nK mod E (the single-rank
  // balanced_routing, per source), and sends at most `cap` of them per expert under
  // --capacity-factor (cap 0: all; the rest are dropped at the source).
  // This is A, the rows the ep all-to-all brings; the experts compute R = etp·A (every rank of
  // the etp group receives the same A).
  std::int64_t expert_rows(std::int64_t nK, std::int64_t cap) const {
    const std::int64_t E = m.experts, El = E / p.ep, first = ep_i() * El;
    std::int64_t rows = 0;
    for (std::int64_t e = first; e < first + El; ++e) {
      const std::int64_t count = nK / E + (e < nK % E ? 1 : 0);
      rows += cap > 0 ? std::min(count, cap) : count;
    }
    return checked_mul(rows, p.ep, "expert rows");
  }
  // A under balanced routing: the rank's n·K choices, kept up to its capacity.
  std::int64_t routed_rows() const {
    return expert_rows(checked_mul(b * sr, m.experts_per_token, "routed rows"),
                       moe_capacity_of(m, t.capacity_factor, b * sr));
  }
  LayerRank layer_rank() {
    LayerRank lr{m, t, ledger, run ? be : nullptr, *this, dims(), sp, tpx};
    lr.ep = p.ep > 1;
    lr.etp = p.etp > 1;
    lr.cp = cp;
    lr.cp_rank = cr;
    lr.seq = s_full;
    return lr;
  }
  const void* weight(std::int64_t l, int slot) override { return LW(l, slot); }
  MoeDispatch moe_dispatch(int g, const std::vector<std::int32_t>& offsets) override;
  void moe_routed(int g, const std::vector<std::int32_t>& off, const Tensor& topk_idx,
                  const Tensor& probs) override {
    if (off.empty()) return;  // a trace routes nothing
    std::vector<std::int64_t>& c = routed[{cur_mb, g}];
    c.assign(off.size() - 1, 0);
    if (t.capacity_factor > 0) {
      // The choices routed to each expert before the capacity drops any (the offsets count the
      // kept rows), as the single rank's --dump-routing counts them.
      std::vector<std::int32_t> idx(topk_idx.bytes() / sizeof(std::int32_t));
      be->download(idx.data(), topk_idx.data(), topk_idx.bytes());
      for (const std::int32_t e : idx) ++c[std::size_t(e)];
    } else {
      for (std::size_t e = 0; e + 1 < off.size(); ++e) c[e] = off[e + 1] - off[e];
    }
    if (!m.output_router_logits) return;
    // The load-balancing loss's probability sums over the rank's tokens (its choices: `c`).
    const std::size_t E = std::size_t(m.experts);
    std::vector<float> pr(probs.bytes() / sizeof(float));
    be->download(pr.data(), probs.data(), probs.bytes());
    std::vector<double>& sum = aux_probs[cur_mb];
    sum.resize(E, 0.0);
    for (std::size_t k = 0; k < pr.size(); ++k) sum[k % E] += double(pr[k]);
  }
  const float* moe_aux_grad() override {
    if (!m.output_router_logits) return nullptr;
    std::vector<float>& g = aux_grad[cur_mb];
    g.resize(std::size_t(m.experts), 0.0f);  // a trace's (or a rank that routed nothing): zeros
    return g.data();
  }
  void ep_all_to_all(const void* send, const std::vector<std::size_t>& send_rows, void* recv,
                     const std::vector<std::size_t>& recv_rows, std::int64_t row) override {
    be->synchronize();
    EPc->all_to_all_v(send, send_rows.data(), recv, recv_rows.data(), std::size_t(row), D);
  }
  void etp_gather_v(const void* send, std::size_t rows, void* recv,
                    const std::vector<std::size_t>& peer_rows, std::int64_t row) override {
    be->synchronize();
    ETP->all_gather_v(send, rows, recv, peer_rows.data(), std::size_t(row), D);
  }
  void etp_reduce_scatter_v(const void* send, const std::vector<std::size_t>& peer_rows, void* recv,
                            std::int64_t row) override {
    be->synchronize();
    ETP->reduce_scatter_sum_v(send, peer_rows.data(), recv, std::size_t(row), D);
  }
  const Quant4View* quant4(std::int64_t l, int slot) override {
    const int q = Li(l, slot);
    return q >= 0 && P[std::size_t(q)].quant >= 0
               ? &quant[std::size_t(P[std::size_t(q)].quant)].view
               : nullptr;
  }
  void* grad(std::int64_t l, int slot) override { return grad_buffer(Li(l, slot)); }
  void grad_done(std::int64_t l, int slot) override {
    if (run) G_done(Li(l, slot));
  }
  // x_l of micro-batch B: the stage's input for layer 0, else layer l-1's out.
  Tensor& layer_input(MicroBatch& B, std::int64_t l) {
    return l == 0 ? B.input : B.layers[std::size_t(l) - 1][LayerAct::out];
  }

  void forward(std::int64_t mb, bool mark);

  // ---------------------------------------------------------------- backward
  void backward(std::int64_t mb);

  float train_step();

  std::vector<float> parameter_values(const std::string& name);
};

}  // namespace trainmem
