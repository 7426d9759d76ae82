// One rank's sharded step (include/trainmem/model/sharded_step.hpp), written from docs/distributed.md
// ("The sharded step", "Measured runs") only. It walks every layer and every micro-batch in the
// stage's 1F1B order and allocates through the ledger; the ledger finds the peak. The per-rank
// analytic profile picks a few instants in closed form: agreement is the check. The layers are
// the decoder layer of the single-rank model (decoder_layer.hpp) with the rank's slice (a/tp
// heads, i/tp MLP columns, s/tp sequence rows under sp); this file hosts it (weights, gradients,
// collectives) and adds the embedding, the head, the micro-batch schedule and the optimizer.
//
// Measured runs (`run`): the arithmetic sits between the allocations, each op right after the
// buffers it writes exist, so the books are the trace's. Data parallelism, rank r of dp:
//   - the flat parameter vector is the rank's parameters concatenated in setup order (Pk
//     elements); rank r owns [r·shard, min((r+1)·shard, Pk)), shard = ceil(Pk/dp);
//   - ZeRO 0/1: every parameter and gradient whole; after the last micro-batch each gradient is
//     all-reduced in place (the sum in rank order, collective.hpp). ZeRO 2/3: each parameter's
//     gradient of a micro-batch is computed into reduce_bucket (zeroed), all-reduced there, and
//     the rank's part added into grads.shard;
//   - ZeRO 0: the optimizer updates every parameter with its own states; ZeRO 1/2: each rank
//     updates its owned slices (states in the flat shard.* tensors), then every slice is
//     broadcast from its owner into every rank's parameter; ZeRO 3: each rank updates
//     params.shard, and a unit's weights are gathered into gathered.<unit> (each owner's slice
//     broadcast) when the unit enters the prefetch window.
#include "trainmem/model/sharded_step.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <string>

#include "trainmem/base/checked.hpp"
#include "trainmem/model/decoder_layer.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/model/model.hpp"
#include "trainmem/base/param_init.hpp"

namespace trainmem {

namespace {
constexpr DType f32 = DType::f32;
constexpr DType i32 = DType::i32;
using Shape = std::vector<std::int64_t>;

}  // namespace

struct ShardedStep::Impl : LayerHost {
  ModelConfig m;
  TrainConfig t;
  ParallelConfig p;
  std::int64_t stage;
  Ledger& ledger;
  DType D;
  bool first, last, sp, full, eager, tied_here, bias, qkn;
  std::int64_t b, s, sr, h, d, a, k, i, V, Ls, M;
  std::uint64_t Pk = 0;  // the stage's parameter elements
  int step = 0;

  // Measured runs.
  const ShardedExecution* X = nullptr;
  Backend* be = nullptr;
  bool run = false;
  int r = 0;                     // this rank in the data-parallel group
  std::uint64_t shard = 0;       // elements per rank of the flat vectors
  std::uint64_t lo = 0, hi = 0;  // the flat range this rank owns
  std::size_t es = 4;            // bytes of D
  float S = 1, ce_scale = 1;     // the loss scale and the cross-entropy backward's scale
  double loss_sum = 0;           // this rank's summed token losses of the step
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
  Tensor params_shard, grads_shard, tokens, targets, bucket;
  // --offload (measured): what DeepSpeed keeps in host memory, each (shard) elements: the
  // optimizer states (fp32 master when D is 16-bit, m, v), the fp32 gradient shard the host
  // optimizer reads, and under optimizer+params the D parameter shard; the host update runs on a
  // cpu backend of fp32.
  bool offx = false;
  std::unique_ptr<Backend> host_be;
  std::vector<float> h_master, h_m, h_v, h_grad;
  std::vector<unsigned char> h_params;
  std::uint64_t host_bytes() const {
    return (h_master.size() + h_m.size() + h_v.size() + h_grad.size()) * 4 + h_params.size();
  }

  // ZeRO-3: unit positions and the gathered units alive.
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
       std::int64_t st, Ledger& l)
      : m(model), t(train), p(layout), stage(st), ledger(l), D(train.dtype) {
    first = stage == 0;
    last = stage == p.pp - 1;
    sp = p.sp;
    full = t.checkpointing == Checkpointing::full;
    eager = t.attention == Attention::eager;
    tied_here = m.tied_embeddings && p.pp == 1;
    bias = m.qkv_bias;
    qkn = m.qk_norm;
    b = t.batch;
    s = t.seq;
    sr = sp ? s / p.tp : s;
    h = m.hidden;
    d = m.head_dim();
    a = m.heads / p.tp;
    k = m.kv_heads / p.tp;
    i = m.intermediate / p.tp;
    V = m.vocab / p.tp;
    Ls = m.layers / p.pp;
    M = p.microbatches;
  }

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
    std::uint64_t off = 0;  // first element in the flat vector
    std::uint64_t n = 0;    // elements
  };
  std::vector<ParamShape> P;
  std::vector<std::array<int, kLayerParams>> lidx;   // [local layer][slot] -> index in P, -1 if absent
  int embed_i = -1, norm_i = -1, head_i = -1;  // head_i: lm_head, or the embedding when tied
  std::vector<std::vector<std::pair<int, std::uint64_t>>> members;  // ZeRO-3 unit: (param, pos)
  std::vector<ParamShape> param_shapes() const {
    std::vector<ParamShape> v;
    if (first) v.push_back({"model.embed_tokens.weight", -1, {V, h}});
    const std::vector<LayerParamSpec> specs = layer_param_specs(m, dims());
    for (std::int64_t l = 0; l < Ls; ++l) {
      const int g = global_layer(l);
      const std::string pre = "model.layers." + std::to_string(g) + ".";
      for (const LayerParamSpec& spec : specs) v.push_back({pre + spec.name, g, spec.shape, spec.slot});
    }
    if (last) {
      v.push_back({"model.norm.weight", -1, {h}});
      if (!tied_here) v.push_back({"lm_head.weight", -1, {V, h}});
    }
    return v;
  }

  static std::uint64_t numel(const Shape& sh) {
    std::uint64_t n = 1;
    for (auto x : sh) n = checked_mul(n, static_cast<std::uint64_t>(x), "parameter size");
    return n;
  }

  void setup() {
    auto ph = ledger.scope(Phase::setup);
    P = param_shapes();
    std::uint64_t largest = 0;
    lidx.assign(std::size_t(Ls), {});
    for (auto& row : lidx) row.fill(-1);
    for (std::size_t q = 0; q < P.size(); ++q) {
      P[q].n = numel(P[q].shape);
      P[q].off = Pk;
      Pk = checked_add(Pk, P[q].n, "parameters");
      largest = std::max(largest, P[q].n);
      const int qi = int(q);
      if (P[q].slot >= 0)
        lidx[std::size_t(P[q].layer - global_layer(0))][std::size_t(P[q].slot)] = qi;
      else if (P[q].name == "model.embed_tokens.weight")
        embed_i = qi;
      else if (P[q].name == "model.norm.weight")
        norm_i = qi;
      else
        head_i = qi;
    }
    if (tied_here) head_i = embed_i;
    // Indices in the whole model (embedding 0, layer g's j-th parameter 1 + g·per_layer + j, the
    // final norm, lm_head): a later stage's parameters keep the single-rank model's streams.
    if (p.pp > 1) {
      std::size_t per_layer = 0;
      for (const auto& q : P)
        if (q.slot >= 0 && q.layer == global_layer(0)) ++per_layer;
      gidx.assign(P.size(), 0);
      std::size_t j = 0;
      int prev = -1;
      for (std::size_t q = 0; q < P.size(); ++q) {
        if (P[q].slot >= 0) {
          j = P[q].layer == prev ? j + 1 : 0;
          prev = P[q].layer;
          gidx[q] = 1 + std::size_t(P[q].layer) * per_layer + j;
        } else if (int(q) == norm_i) {
          gidx[q] = 1 + std::size_t(m.layers) * per_layer;
        } else if (int(q) == head_i) {  // tied: the last stage's copy starts as the embedding
          gidx[q] = m.tied_embeddings ? 0 : 2 + std::size_t(m.layers) * per_layer;
        }
      }
    }
    shard = (Pk + std::uint64_t(p.dp) - 1) / std::uint64_t(p.dp);
    lo = std::min(Pk, std::uint64_t(r) * shard);
    hi = std::min(Pk, lo + shard);
    const std::int64_t shard_n = static_cast<std::int64_t>(shard);
    const bool off = p.offload != Offload::none;
    const bool off_params = p.offload == Offload::optimizer_params;
    // 1. parameters.
    if (p.zero == 3) {
      if (!off_params) params_shard = alloc("params.shard", Category::params, -1, {shard_n}, D);
    } else {
      for (const auto& q : P) value.push_back(alloc(q.name, Category::params, q.layer, q.shape, D));
    }
    // 2. gradients.
    if (p.zero >= 2) {
      if (!off) grads_shard = alloc("grads.shard", Category::gradients, -1, {shard_n}, D);
    } else {
      for (const auto& q : P)
        grads.push_back(alloc(q.name + ".grad", Category::gradients, q.layer, q.shape, D));
    }
    // 3. optimizer states, f32.
    if (!off) {
      const bool master = D != DType::f32;
      const bool adam = t.optimizer == Optimizer::adamw;
      const bool sgd_master = t.optimizer == Optimizer::sgd && master;
      auto add = [&](States& st, const std::string& pre, int layer, const Shape& shape) {
        auto one = [&](const char* suffix) {
          return alloc(pre + suffix, Category::optimizer_states, layer, shape, f32);
        };
        if ((adam && master) || sgd_master) st.master = one(".master");
        if (adam) {
          st.m = one(".exp_avg");
          st.v = one(".exp_avg_sq");
        }
      };
      if (p.zero >= 1) {
        add(shard_states, "shard", -1, {shard_n});
      } else {
        states.resize(P.size());
        for (std::size_t q = 0; q < P.size(); ++q)
          add(states[q], P[q].name, P[q].layer, P[q].shape);
      }
    }
    // 4. inputs of one micro-batch.
    if (first) tokens = alloc("tokens", Category::inputs, -1, {b, s}, i32);
    if (last) targets = alloc("targets", Category::inputs, -1, {b, s}, i32);
    // 5. the GEMM workspace.
    persistent.push_back(alloc("cublas_workspace", Category::workspace, -1, {8388608}, f32));
    if (run) be->set_gemm_workspace(persistent.back().data(), persistent.back().bytes());
    // 6. ZeRO-2/3 reduce bucket(s). A measured step reduces through the first one only (its
    // reductions are synchronous); the second is allocated as DeepSpeed's overlap_comm would.
    if (p.zero >= 2) {
      const std::uint64_t n = std::min(std::max(p.reduce_bucket, largest), Pk);
      for (int c = 0; c < (p.overlap_comm ? 2 : 1); ++c) {
        Tensor bk = comm(c == 0 ? "reduce_bucket" : "reduce_bucket.1", -1,
                         {static_cast<std::int64_t>(n)}, D);
        (c == 0 ? bucket : persistent.emplace_back()) = std::move(bk);
      }
    }
    // ZeRO-3 units and their order.
    if (p.zero == 3) {
      std::uint64_t layer_elems = 0;
      for (const auto& q : P)
        if (q.layer == global_layer(0)) layer_elems = checked_add(layer_elems, q.n);
      unit_elems.assign(std::size_t(Ls) + 2, layer_elems);
      unit_elems[0] = numel({V, h});
      unit_elems[std::size_t(Ls) + 1] = numel({V, h}) + std::uint64_t(h);
      seq.push_back(0);
      for (std::int64_t l = 0; l < Ls; ++l) seq.push_back(int(1 + l));
      seq.push_back(int(Ls + 1));
      for (std::int64_t l = Ls - 1; l >= 0; --l) seq.push_back(int(1 + l));
      // What each unit's gathered buffer holds, in order (the head: the final norm, then
      // lm_head or, tied, a copy of the embedding).
      members.assign(std::size_t(Ls) + 2, {});
      auto put = [&](int u, int q) {
        auto& mem = members[std::size_t(u)];
        const std::uint64_t pos =
            mem.empty() ? 0 : mem.back().second + P[std::size_t(mem.back().first)].n;
        mem.emplace_back(q, pos);
      };
      if (embed_i >= 0) put(0, embed_i);
      for (std::size_t q = 0; q < P.size(); ++q)
        if (P[q].slot >= 0) put(1 + P[q].layer - global_layer(0), int(q));
      if (last) {
        put(int(Ls) + 1, norm_i);
        put(int(Ls) + 1, head_i);
      }
    }
    if (run) initialise();
  }

  // ---------------------------------------------------------------- measured runs: data
  char* elem_ptr(const Tensor& x, std::uint64_t elem) const {
    return static_cast<char*>(x.data()) + elem * es;
  }
  // The ranks' owned flat ranges overlapping [from, to): f(owner, first, end).
  template <class F>
  void by_owner(std::uint64_t from, std::uint64_t to, F&& f) const {
    for (std::uint64_t q = from / shard; q < std::uint64_t(p.dp) && q * shard < to; ++q)
      f(int(q), std::max(from, q * shard), std::min(to, (q + 1) * shard));
  }
  ParamInit init_of(std::size_t q) const {
    ParamInit init;
    if (P[q].shape.size() == 1) {  // norms 1, biases 0 (LlamaModel::init_random)
      const std::string& nm = P[q].name;
      const bool is_bias = nm.size() > 5 && nm.compare(nm.size() - 5, 5, ".bias") == 0;
      init.kind = ParamInit::Kind::constant;
      init.value = is_bias ? 0.0f : 1.0f;
    } else {
      init.kind = ParamInit::Kind::normal;
      init.scale = 0.02f;
      init.seed = X->seed;
      init.stream = global_index(q) + 1;
    }
    return init;
  }
  // The parameter's index in the whole model's setup order (LlamaModel's): with pp = 1 the
  // rank's own order.
  std::size_t global_index(std::size_t q) const { return gidx.empty() ? q : gidx[q]; }
  // Where local element e of parameter q sits in the whole parameter (row-major): column-parallel
  // weights and biases (q/k/v, gate/up, the vocabulary rows of the embedding and lm_head) hold a
  // block of rows, row-parallel weights (o_proj, down_proj) a block of columns, norms all.
  bool replicated(std::size_t q) const {
    const int sl = P[q].slot;
    return p.tp == 1 || (sl >= 0 && layer_param_replicated(sl)) || (sl < 0 && int(q) == norm_i);
  }
  std::uint64_t global_elem(std::size_t q, std::uint64_t e) const {
    if (replicated(q)) return e;
    const ParamShape& pq = P[q];
    const int sl = pq.slot;
    if (sl >= 0 && layer_param_row_parallel(sl)) {
      const std::uint64_t cl = std::uint64_t(pq.shape[1]);
      return (e / cl) * cl * std::uint64_t(p.tp) + std::uint64_t(tr) * cl + e % cl;
    }
    return std::uint64_t(tr) * pq.n + e;  // a block of rows (or of a bias's elements)
  }

  // --weights: the file's name of parameter q (a tied lm_head on the last stage is the
  // embedding's copy) and the whole parameter's shape in the single-rank model.
  std::string file_name(std::size_t q) const {
    return m.tied_embeddings && int(q) == head_i ? "model.embed_tokens.weight" : P[q].name;
  }
  Shape whole_shape(std::size_t q) const {
    Shape sh = P[q].shape;
    if (replicated(q)) return sh;
    const int sl = P[q].slot;
    sh[sl >= 0 && layer_param_row_parallel(sl) ? 1 : 0] *= p.tp;
    return sh;
  }
  // Checks every parameter's tensor in the files before anything is read (InputError).
  const SafeTensorsReader* weights_file(std::size_t q) const {
    const std::string name = file_name(q);
    for (const SafeTensorsReader* f : X->weights)
      if (const SafeTensorInfo* t = f->find(name)) {
        const std::string where = "--weights " + f->path() + ": tensor '" + name + "'";
        if (t->shape != whole_shape(q))
          throw InputError(where + " has shape " + t->shape_string() + ", the model config needs " +
                           shape_string(whole_shape(q)));
        if (!safe_dtype_is_float(t->dtype))
          throw InputError(where + " has dtype " + safe_dtype_name(t->dtype) +
                           ", expected a floating dtype");
        return f;
      }
    throw InputError("--weights " + X->weights.front()->path() +
                     (X->weights.size() > 1 ? " (and its other shards)" : "") +
                     ": missing tensor '" + name + "' (needed by model " + m.name + ")");
  }
  // The rank's P[q].n values of parameter q as fp32: its elements (global_elem) of the file's
  // tensor, or of the random initialisation.
  std::vector<float> rank_values(std::size_t q) const {
    std::vector<float> f(P[q].n);
    if (X->weights.empty()) {
      const ParamInit init = init_of(q);
      for (std::uint64_t e = 0; e < P[q].n; ++e) f[e] = param_init_value(init, global_elem(q, e));
      return f;
    }
    const SafeTensorsReader& file = *weights_file(q);
    const std::string name = file_name(q);
    const int sl = P[q].slot;
    if (p.tp > 1 && sl >= 0 && layer_param_row_parallel(sl)) {  // a block of columns: one read per row
      const std::uint64_t cl = std::uint64_t(P[q].shape[1]);
      for (std::uint64_t row = 0; row < P[q].n / cl; ++row)
        file.read_f32(name, f.data() + row * cl, global_elem(q, row * cl), cl);
    } else {  // all of it, or a block of rows
      file.read_f32(name, f.data(), global_elem(q, 0), P[q].n);
    }
    return f;
  }

  void initialise() {
    for (std::size_t q = 0; q < P.size() && !X->weights.empty(); ++q) weights_file(q);
    // Parameters (ZeRO < 3), with the per-parameter master copy under ZeRO 0: the backend's
    // init, or under tensor parallelism or from --weights the rank's elements made on the host.
    for (std::size_t q = 0; q < value.size(); ++q) {
      float* master = states.empty() ? nullptr : states[q].master.as<float>();
      if (p.tp == 1 && X->weights.empty()) {
        be->init_param(value[q].data(), master, P[q].n, init_of(q));
        continue;
      }
      const std::vector<float> f = rank_values(q);
      std::vector<unsigned char> raw(P[q].n * es);
      for (std::uint64_t e = 0; e < P[q].n; ++e) store_from_f32(raw.data(), e, D, f[e]);
      be->upload(value[q].data(), raw.data(), raw.size());
      if (master) be->upload(master, f.data(), f.size() * 4);
    }
    // The owned slices (ZeRO >= 1's master shard, ZeRO-3's parameter shard), made on the host.
    const bool shard_master = bool(shard_states.master);
    if (offx) {
      const bool adam = t.optimizer == Optimizer::adamw;
      if (D != DType::f32) h_master.assign(shard, 0.0f);
      if (adam) {
        h_m.assign(shard, 0.0f);
        h_v.assign(shard, 0.0f);
      }
      h_grad.assign(shard, 0.0f);
      if (p.offload == Offload::optimizer_params) h_params.assign(shard * es, 0);
      host_be = make_cpu_backend(DType::f32);
    }
    if (shard_master || params_shard || !h_master.empty() || !h_params.empty()) {
      std::vector<float> f(std::size_t(hi - lo));
      for (std::size_t q = 0; q < P.size(); ++q) {
        const std::uint64_t a = std::max(lo, P[q].off), z = std::min(hi, P[q].off + P[q].n);
        if (a >= z) continue;
        const std::vector<float> v = rank_values(q);
        std::copy(v.begin() + std::ptrdiff_t(a - P[q].off),
                  v.begin() + std::ptrdiff_t(z - P[q].off), f.begin() + std::ptrdiff_t(a - lo));
      }
      if (shard_master) {
        be->fill_zero(shard_states.master.data(), shard_states.master.bytes());
        be->upload(shard_states.master.data(), f.data(), f.size() * 4);
      }
      if (params_shard) {
        std::vector<unsigned char> raw(f.size() * es);
        for (std::size_t x = 0; x < f.size(); ++x) store_from_f32(raw.data(), x, D, f[x]);
        be->fill_zero(params_shard.data(), params_shard.bytes());
        be->upload(params_shard.data(), raw.data(), raw.size());
      }
      if (!h_master.empty()) std::copy(f.begin(), f.end(), h_master.begin());
      for (std::size_t x = 0; x < f.size() && !h_params.empty(); ++x)
        store_from_f32(h_params.data(), x, D, f[x]);
    }
    for (States* st : all_states()) {
      if (st->m) be->fill_zero(st->m.data(), st->m.bytes());
      if (st->v) be->fill_zero(st->v.data(), st->v.bytes());
    }
    const std::int64_t rows = checked_mul(std::int64_t(p.dp) * M, b, "global batch");
    const std::int64_t ids = checked_mul(rows, s, "global batch x seq");
    if (X->tokens) {
      if (std::int64_t(X->tokens->size()) != ids)
        throw InputError("--tokens: " + std::to_string(X->tokens->size()) +
                         " ids given, the global batch needs dp·M·b·s = " + std::to_string(ids));
      for (std::int32_t id : *X->tokens)
        if (id < 0 || id >= m.vocab)
          throw InputError("--tokens: id " + std::to_string(id) + " outside [0, " +
                           std::to_string(m.vocab) + ")");
      global_tokens = *X->tokens;
    } else {
      global_tokens = random_token_ids(X->seed, ids, m.vocab);
    }
    const std::int64_t positions = rows * (s - 1);
    S = loss_scale(D, positions);
    ce_scale = S / float(positions);
  }
  std::vector<States*> all_states() {
    std::vector<States*> v{&shard_states};
    for (auto& st : states) v.push_back(&st);
    return v;
  }

  // Micro-batch mb's rows of the global batch into tokens and targets (targets: the next
  // token within a row, -1 at the last position).
  void upload_batch(std::int64_t mb) {
    const std::size_t row0 = std::size_t((std::int64_t(r) * M + mb) * b);
    std::vector<std::int32_t> tok(std::size_t(b * s)), tgt(std::size_t(b * s));
    for (std::int64_t row = 0; row < b; ++row)
      for (std::int64_t c = 0; c < s; ++c) {
        const std::size_t g = (row0 + std::size_t(row)) * std::size_t(s) + std::size_t(c);
        tok[std::size_t(row * s + c)] = global_tokens[g];
        tgt[std::size_t(row * s + c)] = c + 1 < s ? global_tokens[g + 1] : -1;
      }
    if (tpx) {  // the rank's vocabulary rows: ids outside them read row 0, then corrected
      foreign_tok.clear();
      foreign_tgt.clear();
      mb_targets = tgt;
      for (std::size_t j = 0; j < tok.size(); ++j) {
        if (tok[j] < V_lo || tok[j] >= V_lo + V) {
          foreign_tok.push_back(std::int64_t(j));
          tok[j] = 0;
        } else {
          tok[j] -= std::int32_t(V_lo);
        }
        if (tgt[j] < 0) continue;
        if (tgt[j] < V_lo || tgt[j] >= V_lo + V) {
          foreign_tgt.push_back(std::int64_t(j));
          tgt[j] = 0;
        } else {
          tgt[j] -= std::int32_t(V_lo);
        }
      }
    }
    if (tokens) be->upload(tokens.data(), tok.data(), tokens.bytes());
    if (targets) be->upload(targets.data(), tgt.data(), targets.bytes());
  }
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
  void pp_send(const Tensor& x, std::uint64_t n, int peer) {
    pp_stage.resize(n * es);
    be->download(pp_stage.data(), x.data(), n * es);
    PPc->send(pp_stage.data(), n, D, peer);
  }
  void pp_recv(const Tensor& x, std::uint64_t n, int peer) {
    pp_stage.resize(n * es);
    PPc->recv(pp_stage.data(), n, D, peer);
    be->upload(x.data(), pp_stage.data(), n * es);
  }
  // The tied embedding's gradient (n elements at g) summed over the first and last stage, through
  // host memory likewise.
  void tie_sum(void* g, std::uint64_t n) {
    pp_stage.resize(n * es);
    be->download(pp_stage.data(), g, n * es);
    tie_group->all_reduce_sum(pp_stage.data(), n, D);
    be->upload(g, pp_stage.data(), n * es);
  }
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
  void sp_gather(const Tensor& local, const Tensor& full, std::int64_t width) override {
    be->synchronize();
    const std::uint64_t chunk = std::uint64_t(sr * width);
    for (std::int64_t row = 0; row < b; ++row)
      T->all_gather(elem_ptr(local, std::uint64_t(row) * chunk),
                    elem_ptr(full, std::uint64_t(row * s * width)), chunk, D);
  }
  // The (b, s, h) partial sums reduced over the group and scattered by sequence into the rank's
  // (b, s/tp, h), then + x (the residual, the rank's rows) when x is given.
  void sp_reduce_scatter(const Tensor& partial, const Tensor& out, const void* x) override {
    be->synchronize();
    const std::uint64_t chunk = std::uint64_t(sr * h);
    for (std::int64_t row = 0; row < b; ++row)
      T->reduce_scatter_sum(elem_ptr(partial, std::uint64_t(row * s * h)),
                            elem_ptr(out, std::uint64_t(row) * chunk), chunk, D);
    if (x) be->bias_forward(out.data(), x, 1, std::int64_t(std::uint64_t(b) * chunk));
  }
  // y = partial (already in y) summed over the group, then + x (the residual): a row-parallel
  // GEMM's output.
  void tp_sum_add(const Tensor& y, const void* x) override {
    const std::uint64_t n = std::uint64_t(b * s * h);
    tp_sum(y, n);
    be->bias_forward(y.data(), x, 1, std::int64_t(n));
  }

  // Vocabulary-parallel cross-entropy, forward: every rank computed its rows' lse and (for the
  // targets it holds) lse - logit; the group's lse is the log-sum-exp of the ranks', the target
  // logit the holder's. `lse` becomes the whole vocabulary's; returns the summed token loss.
  double tp_cross_entropy(Tensor& lse, const Tensor& losses) {
    const std::size_t n = std::size_t(b * s), R = std::size_t(p.tp);
    std::vector<float> mine(2 * n), all(2 * n * R);
    be->download(mine.data(), lse.data(), n * 4);
    be->download(mine.data() + n, losses.data(), n * 4);
    TH->all_gather(mine.data(), all.data(), 2 * n, DType::f32);
    std::vector<float> global(n);
    double sum = 0;
    for (std::size_t j = 0; j < n; ++j) {
      float mx = -std::numeric_limits<float>::infinity();
      for (std::size_t q = 0; q < R; ++q) mx = std::max(mx, all[q * 2 * n + j]);
      float acc = 0;
      for (std::size_t q = 0; q < R; ++q) acc += std::exp(all[q * 2 * n + j] - mx);
      global[j] = mx + std::log(acc);
      const std::int32_t t = mb_targets[j];
      if (t < 0) continue;
      const std::size_t holder = std::size_t(t / V);
      const float logit = all[holder * 2 * n + j] - all[holder * 2 * n + n + j];
      sum += double(global[j] - logit);
    }
    be->upload(lse.data(), global.data(), n * 4);
    return sum;
  }

  // A weight as the op at unit `u`'s position reads it.
  const void* W(int u, int q) const {
    if (p.zero < 3) return value[std::size_t(q)].data();
    for (const auto& [mq, pos] : members[std::size_t(u)])
      if (mq == q) return elem_ptr(gathered.at(u), pos);
    throw Error("sharded step: parameter " + P[std::size_t(q)].name + " is not in unit " +
                unit_name(u));
  }
  const void* LW(std::int64_t l, int slot) const {
    return W(int(1 + l), lidx[std::size_t(l)][std::size_t(slot)]);
  }
  int Li(std::int64_t l, int slot) const { return lidx[std::size_t(l)][std::size_t(slot)]; }

  // A parameter's gradient buffer for the op about to produce it (+=): the parameter's own
  // (ZeRO < 2, zeroed once per step) or the reduce bucket, zeroed.
  void* G(int q) {
    if (p.zero < 2) return grads[std::size_t(q)].data();
    be->fill_zero(bucket.data(), P[std::size_t(q)].n * es);
    return bucket.data();
  }
  // The gradient is complete for this micro-batch. ZeRO >= 2: summed over the ranks in the
  // bucket, the owned part added into grads.shard.
  void G_done(int q) {
    if (p.zero < 2) return;
    const ParamShape& pq = P[std::size_t(q)];
    be->synchronize();  // the backend's work is done before the collective reads its buffers
    if (tp_partial(q)) T->all_reduce_sum(bucket.data(), pq.n, D);
    X->data.all_reduce_sum(bucket.data(), pq.n, D);
    const std::uint64_t a = std::max(lo, pq.off), z = std::min(hi, pq.off + pq.n);
    if (a < z && offx) {  // into the host's fp32 gradient shard
      std::vector<unsigned char> raw((z - a) * es);
      be->download(raw.data(), elem_ptr(bucket, a - pq.off), raw.size());
      for (std::uint64_t x = a; x < z; ++x) h_grad[x - lo] += load_as_f32(raw.data(), x - a, D);
    } else if (a < z) {
      be->bias_forward(elem_ptr(grads_shard, a - lo), elem_ptr(bucket, a - pq.off), 1,
                       std::int64_t(z - a));
    }
  }

  // ZeRO-3: unit u's weights into its gathered buffer, each owner's slice broadcast.
  void fill_unit(int u) {
    Tensor& buf = gathered.at(u);
    be->synchronize();
    for (const auto& [q, pos] : members[std::size_t(u)]) {
      const ParamShape& pq = P[std::size_t(q)];
      by_owner(pq.off, pq.off + pq.n, [&](int owner, std::uint64_t a, std::uint64_t z) {
        char* dst = elem_ptr(buf, pos + (a - pq.off));
        if (owner == r && !h_params.empty()) {
          be->upload(dst, h_params.data() + (a - lo) * es, (z - a) * es);
        } else if (owner == r) {
          be->copy(dst, elem_ptr(params_shard, a - lo), (z - a) * es);
          be->synchronize();
        }
        X->data.broadcast(dst, z - a, D, owner);
      });
    }
  }

  // f(q, a, z) for every parameter q with elements [a, z) of the flat range this rank owns.
  void for_owned(const std::function<void(std::size_t, std::uint64_t, std::uint64_t)>& f) const {
    for (std::size_t q = 0; q < P.size(); ++q) {
      const std::uint64_t a = std::max(lo, P[q].off), z = std::min(hi, P[q].off + P[q].n);
      if (a < z) f(q, a, z);
    }
  }
  // ZeRO 1/2 after the update: every parameter's slices broadcast from their owners, in place.
  void broadcast_owned_slices() {
    be->synchronize();
    for (std::size_t q = 0; q < P.size(); ++q)
      by_owner(P[q].off, P[q].off + P[q].n, [&](int owner, std::uint64_t a, std::uint64_t z) {
        X->data.broadcast(elem_ptr(value[q], a - P[q].off), z - a, D, owner);
      });
  }

  // q_norm and k_norm under tensor parallelism: the same weights on every rank of the group,
  // each rank's gradient from its own heads, so a partial sum.
  // Under sp the RMSNorm weights too: each rank's gradient from its own rows of the sequence.
  bool tp_partial(int q) const {
    const int sl = P[std::size_t(q)].slot;
    if (!tpx) return false;
    if (sl == kQNorm || sl == kKNorm) return true;
    return sp && (sl == kInNorm || sl == kPostNorm || q == norm_i);
  }

  // After the last micro-batch: ZeRO 0/1 reduce the whole gradients, then every layout's update
  // and (ZeRO 1/2) the owners' broadcasts.
  void optimizer_step() {
    be->synchronize();
    if (tie_group) {  // the embedding's gradient: its first-stage and last-stage parts summed
      const int q = first ? embed_i : head_i;
      tie_sum(grads[std::size_t(q)].data(), P[std::size_t(q)].n);
    }
    if (p.zero < 2)
      for (std::size_t q = 0; q < P.size(); ++q)
        if (tp_partial(int(q))) T->all_reduce_sum(grads[q].data(), P[q].n, D);
    if (p.zero < 2)
      for (std::size_t q = 0; q < P.size(); ++q) X->data.all_reduce_sum(grads[q].data(), P[q].n, D);
    const float gs = 1.0f / S;
    if (offx) {
      offload_step(gs);
      return;
    }
    auto update = [&](void* param, const void* g, const States& st, std::uint64_t st_off,
                      std::uint64_t n) {
      auto f32_at = [&](const Tensor& x) { return x ? x.as<float>() + st_off : nullptr; };
      if (t.optimizer == Optimizer::adamw)
        be->adamw_update(param, g, f32_at(st.master), f32_at(st.m), f32_at(st.v), std::int64_t(n),
                         X->optimizer.adamw, step, gs);
      else
        be->sgd_update(param, g, f32_at(st.master), std::int64_t(n), X->optimizer.sgd_lr, gs);
    };
    if (p.zero == 0) {
      for (std::size_t q = 0; q < P.size(); ++q)
        update(value[q].data(), grads[q].data(), states[q], 0, P[q].n);
      return;
    }
    if (p.zero == 3) {
      if (hi > lo) update(params_shard.data(), grads_shard.data(), shard_states, 0, hi - lo);
      return;
    }
    for_owned([&](std::size_t q, std::uint64_t a, std::uint64_t z) {
      const void* g = p.zero == 1 ? elem_ptr(grads[q], a - P[q].off) : elem_ptr(grads_shard, a - lo);
      update(elem_ptr(value[q], a - P[q].off), g, shard_states, a - lo, z - a);
    });
    broadcast_owned_slices();
  }

  // --offload: the owned slices updated on the host (the gradients already reduced: ZeRO 2/3 in
  // h_grad, ZeRO 1 in the parameters' .grad, copied here), the new D values written back where
  // the parameters live, then (ZeRO 1/2) the owners' broadcasts. The arithmetic is the device
  // update's: AdamW/SGD on the fp32 master (16-bit D) or on the fp32 values themselves.
  void offload_step(float gs) {
    const std::uint64_t n = hi - lo;
    // The owned elements' current D values and a place for the new ones (staging, outside the
    // books like the host's pinned buffers).
    std::vector<unsigned char> vals(n * es);
    if (p.zero < 2) {
      std::fill(h_grad.begin(), h_grad.end(), 0.0f);
      for_owned([&](std::size_t q, std::uint64_t a, std::uint64_t z) {
        std::vector<unsigned char> raw((z - a) * es);
        be->download(raw.data(), elem_ptr(grads[q], a - P[q].off), raw.size());
        for (std::uint64_t x = a; x < z; ++x) h_grad[x - lo] = load_as_f32(raw.data(), x - a, D);
      });
    }
    if (n > 0) {
      std::vector<float> work;  // fp32 D: the values themselves
      float* target = h_master.empty() ? nullptr : h_master.data();
      if (!target) {
        if (!h_params.empty()) {
          std::memcpy(vals.data(), h_params.data(), n * es);
        } else if (p.zero == 3) {
          be->download(vals.data(), params_shard.data(), n * es);
        } else {
          for_owned([&](std::size_t q, std::uint64_t a, std::uint64_t z) {
            be->download(vals.data() + (a - lo) * es, elem_ptr(value[q], a - P[q].off),
                         (z - a) * es);
          });
        }
        work.resize(n);
        for (std::uint64_t x = 0; x < n; ++x) work[x] = load_as_f32(vals.data(), x, D);
        target = work.data();
      }
      if (t.optimizer == Optimizer::adamw)
        host_be->adamw_update(target, h_grad.data(), nullptr, h_m.data(), h_v.data(),
                              std::int64_t(n), X->optimizer.adamw, step, gs);
      else
        host_be->sgd_update(target, h_grad.data(), nullptr, std::int64_t(n), X->optimizer.sgd_lr,
                            gs);
      for (std::uint64_t x = 0; x < n; ++x) store_from_f32(vals.data(), x, D, target[x]);
      if (!h_params.empty()) {
        std::memcpy(h_params.data(), vals.data(), n * es);
      } else if (p.zero == 3) {
        be->upload(params_shard.data(), vals.data(), n * es);
      } else {
        for_owned([&](std::size_t q, std::uint64_t a, std::uint64_t z) {
          be->upload(elem_ptr(value[q], a - P[q].off), vals.data() + (a - lo) * es, (z - a) * es);
        });
      }
    }
    if (p.zero == 3) return;
    broadcast_owned_slices();
  }

  // ZeRO-3: the window of position `pos` (past the end: nothing): release what leaves it, then
  // gather what enters it, in position order.
  void window(std::size_t pos) {
    if (p.zero != 3) return;
    std::vector<int> want;
    for (std::size_t j = pos; j < seq.size() && j <= pos + std::size_t(p.prefetch); ++j)
      if (std::find(want.begin(), want.end(), seq[j]) == want.end()) want.push_back(seq[j]);
    for (auto it = gathered.begin(); it != gathered.end();)
      if (std::find(want.begin(), want.end(), it->first) == want.end())
        it = gathered.erase(it);
      else
        ++it;
    for (int u : want)
      if (!gathered.count(u)) {
        gathered[u] = comm("gathered." + unit_name(u), -1,
                           {static_cast<std::int64_t>(unit_elems[std::size_t(u)])}, D);
        if (run) fill_unit(u);
      }
  }
  std::string unit_name(int u) const {
    if (u == 0) return "embedding";
    if (u == Ls + 1) return "head";
    return "layer" + std::to_string(global_layer(u - 1));
  }

  // ---------------------------------------------------------------- forward
  // The decoder layer (decoder_layer.hpp) with the rank's slice; this Impl is its host.
  ActDims dims() const { return ActDims{b, s, h, i, a, k, d, sr}; }
  LayerRank layer_rank() { return LayerRank{m, t, ledger, run ? be : nullptr, *this, dims(), sp, tpx}; }
  const void* weight(std::int64_t l, int slot) override { return LW(l, slot); }
  void* grad(std::int64_t l, int slot) override { return run ? G(Li(l, slot)) : nullptr; }
  void grad_done(std::int64_t l, int slot) override {
    if (run) G_done(Li(l, slot));
  }
  // x_l of micro-batch B: the stage's input for layer 0, else layer l-1's out.
  Tensor& layer_input(MicroBatch& B, std::int64_t l) {
    return l == 0 ? B.input : B.layers[std::size_t(l) - 1][LayerAct::out];
  }

  void forward(std::int64_t mb, bool mark) {
    auto ph = ledger.scope(Phase::forward);
    MicroBatch& B = in_flight[mb];
    const std::int64_t n = b * s;
    if (run) upload_batch(mb);
    std::size_t pos = 0;
    if (first) {
      window(pos);
      Tensor partial;
      if (sp) partial = comm("embed.partial", -1, {b, s, h}, D);
      B.input = act("embed_out", -1, {b, sr, h}, D);
      if (run) {
        // The vocabulary-parallel embedding: other ranks' ids give zero rows here, then the sum
        // over the group (sp: into the partial, reduce-scattered into the rank's rows).
        const Tensor& rows = sp ? partial : B.input;
        be->embedding_forward(rows.data(), tokens.as<std::int32_t>(), W(0, embed_i), b, s, h, V);
        if (tpx) zero_rows(rows, foreign_tok);
        if (sp)
          sp_reduce_scatter(partial, B.input, nullptr);
        else if (tpx)
          tp_sum(B.input, std::uint64_t(b * s * h));
      }
    } else {
      B.input = act("stage_input", -1, {b, sr, h}, D);
      if (ppx) pp_recv(B.input, std::uint64_t(b * sr * h), int(stage) - 1);
    }
    B.layers.resize(std::size_t(Ls));
    for (std::int64_t l = 0; l < Ls; ++l) {
      window(++pos);
      decoder_layer_forward(layer_rank(), l, global_layer(l), B.layers[std::size_t(l)],
                            ActPass::forward, layer_input(B, l).data());
    }
    if (last) {
      window(++pos);
      const int hu = int(Ls) + 1;
      const void* xL = Ls > 0 ? B.layers.back()[LayerAct::out].data() : B.input.data();
      B.final_norm_out = act("final_norm_out", -1, {b, sr, h}, D);
      B.final_rstd = act("final_rstd", -1, {b, sr}, f32);
      if (run)
        be->rmsnorm_forward(B.final_norm_out.data(), B.final_rstd.as<float>(), xL, W(hu, norm_i),
                            b * sr, h, float(m.rms_eps));
      Tensor gath;
      if (sp) gath = comm("final_norm_out.gathered", -1, {b, s, h}, D);
      if (sp && run) sp_gather(B.final_norm_out, gath, h);
      B.logits = act("logits", -1, {b, s, V}, D);
      if (run)
        be->matmul(B.logits.data(), sp ? gath.data() : B.final_norm_out.data(), W(hu, head_i), n, V,
                   h, Trans::no, Trans::yes, 1.f, 0.f);
      gath.reset();
      B.ce_lse = act("ce_lse", -1, {b, s}, f32);
      {
        Tensor losses = ws("ce_losses", -1, {b, s}, f32);
        if (run) {
          be->cross_entropy_forward(losses.as<float>(), B.ce_lse.as<float>(), B.logits.data(),
                                    targets.as<std::int32_t>(), n, V);
          if (tpx) {
            loss_sum += tp_cross_entropy(B.ce_lse, losses);
          } else {
            std::vector<float> host(static_cast<std::size_t>(n));
            be->download(host.data(), losses.data(), losses.bytes());
            for (float v : host) loss_sum += v;
          }
        }
      }
    } else if (Ls > 0) {
      if (ppx) pp_send(B.layers.back()[LayerAct::out], std::uint64_t(b * sr * h), int(stage) + 1);
      B.layers.back()[LayerAct::out].reset();  // sent to the next stage
    }
    if (mark) ledger.mark_end_of_forward();
  }

  // ---------------------------------------------------------------- backward
  void backward(std::int64_t mb) {
    auto ph = ledger.scope(Phase::backward);
    MicroBatch& B = in_flight.at(mb);
    const std::int64_t n = b * s;
    std::size_t pos = std::size_t(Ls) + 1;  // the head's position
    Tensor d_res;
    if (last) {
      const int hu = int(Ls) + 1;
      // 1. dlogits in place of logits.
      if (run) {
        // Vocabulary-parallel: a row whose target another rank holds was given target 0 here;
        // its element 0 is rewritten as a non-target's, scale·exp(x - lse).
        std::vector<float> x0(foreign_tgt.size()), l(foreign_tgt.size());
        for (std::size_t j = 0; j < foreign_tgt.size(); ++j) {
          unsigned char raw[4];
          be->download(raw, elem_ptr(B.logits, std::uint64_t(foreign_tgt[j] * V)), es);
          x0[j] = load_as_f32(raw, 0, D);
          be->download(&l[j], B.ce_lse.as<float>() + foreign_tgt[j], 4);
        }
        be->cross_entropy_backward(B.logits.data(), B.logits.data(), B.ce_lse.as<float>(),
                                   targets.as<std::int32_t>(), n, V, ce_scale);
        be->synchronize();
        for (std::size_t j = 0; j < foreign_tgt.size(); ++j) {
          unsigned char raw[4];
          store_from_f32(raw, 0, D, ce_scale * std::exp(x0[j] - l[j]));
          be->upload(elem_ptr(B.logits, std::uint64_t(foreign_tgt[j] * V)), raw, es);
        }
      }
      B.ce_lse.reset();
      // 2. lm_head: d_final_norm_out (a partial under sp), the input gathered for dW.
      Tensor gath;
      if (sp) gath = comm("final_norm_out.gathered", -1, {b, s, h}, D);
      if (sp && run) sp_gather(B.final_norm_out, gath, h);
      Tensor d_fno = ws(sp ? "d_final_norm_out.partial" : "d_final_norm_out", -1, {b, s, h}, D);
      if (run) {
        be->matmul(d_fno.data(), B.logits.data(), W(hu, head_i), n, h, V, Trans::no, Trans::no, 1.f,
                   0.f);
        if (tpx && !sp) tp_sum(d_fno, std::uint64_t(n * h));
        be->matmul(G(head_i), B.logits.data(), sp ? gath.data() : B.final_norm_out.data(), V, h, n,
                   Trans::yes, Trans::no, 1.f, 1.f);
        G_done(head_i);
      }
      gath.reset();
      B.logits.reset();
      if (sp) {
        Tensor rs = ws("d_final_norm_out", -1, {b, sr, h}, D);
        if (run) sp_reduce_scatter(d_fno, rs, nullptr);
        d_fno = std::move(rs);
      }
      // 3. final norm.
      d_res = ws("d_residual", -1, {b, sr, h}, D);
      if (run) {
        const void* xL = Ls > 0 ? B.layers.back()[LayerAct::out].data() : B.input.data();
        be->fill_zero(d_res.data(), d_res.bytes());
        be->rmsnorm_backward(d_res.data(), G(norm_i), d_fno.data(), xL, W(hu, norm_i),
                             B.final_rstd.as<float>(), b * sr, h);
        G_done(norm_i);
      }
      d_fno.reset();
      B.final_norm_out.reset();
      B.final_rstd.reset();
      if (Ls > 0) B.layers.back()[LayerAct::out].reset();
    } else {
      d_res = ws("d_residual", -1, {b, sr, h}, D);  // received from the next stage
      if (ppx) pp_recv(d_res, std::uint64_t(b * sr * h), int(stage) + 1);
    }
    for (std::int64_t l = Ls - 1; l >= 0; --l) {
      window(++pos);
      decoder_layer_backward(layer_rank(), l, global_layer(l), B.layers[std::size_t(l)],
                             layer_input(B, l), d_res);
    }
    window(seq.size());  // the embedding's backward needs no weight
    if (first) {         // the embedding: from the whole sequence's d_residual (gathered under sp)
      Tensor gath;
      if (sp) gath = comm("d_residual.gathered", -1, {b, s, h}, D);
      if (run) {
        if (ppx) upload_batch(mb);  // later micro-batches' forwards replaced the tokens
        if (sp) sp_gather(d_res, gath, h);
        const Tensor& dy = sp ? gath : d_res;
        if (tpx) zero_rows(dy, foreign_tok);  // its last use: rows of ids other ranks hold
        be->embedding_backward(G(embed_i), dy.data(), tokens.as<std::int32_t>(), b, s, h, V);
        G_done(embed_i);
      }
    }
    if (Ls == 0) B.input.reset();
    if (ppx && !first)  // dL/d(stage input), to the previous stage
      pp_send(d_res, std::uint64_t(b * sr * h), int(stage) - 1);
    d_res.reset();
    in_flight.erase(mb);
  }

  float train_step() {
    ++step;
    ledger.begin_step(step);
    if (run) {
      loss_sum = 0;
      for (auto& gq : grads) be->fill_zero(gq.data(), gq.bytes());
      if (grads_shard) be->fill_zero(grads_shard.data(), grads_shard.bytes());
      std::fill(h_grad.begin(), h_grad.end(), 0.0f);
    }
    const std::int64_t warm = std::min<std::int64_t>(p.pp - stage - 1, M);
    const std::int64_t mark_at = std::min<std::int64_t>(warm, M - 1);
    std::int64_t next_f = 0, next_b = 0;
    for (; next_f < warm; ++next_f) forward(next_f, next_f == mark_at);
    while (next_b < M) {
      if (next_f < M) {
        forward(next_f, next_f == mark_at);
        ++next_f;
      }
      backward(next_b++);
    }
    auto ph = ledger.scope(Phase::optimizer);
    if (!run) return std::numeric_limits<float>::quiet_NaN();
    optimizer_step();
    // The global mean: every rank's sum of token losses, added in rank order.
    std::vector<double> sums(std::size_t(p.dp));
    X->host.all_gather(&loss_sum, sums.data(), 2, DType::f32);  // a double as 8 bytes
    double total = 0;
    for (double v : sums) total += v;
    float loss = float(total / double(std::int64_t(p.dp) * M * b * (s - 1)));
    if (ppx) PPc->broadcast(&loss, 1, DType::f32, int(p.pp) - 1);  // the last stage's
    return loss;
  }

  std::vector<float> parameter_values(const std::string& name) {
    if (!run) throw Error("sharded step: parameter values exist only in a measured run");
    std::size_t q = 0;
    while (q < P.size() && P[q].name != name) ++q;
    if (q == P.size()) throw InputError("sharded step: no parameter named '" + name + "'");
    std::vector<unsigned char> raw(P[q].n * es);
    if (p.zero < 3) {
      be->download(raw.data(), value[q].data(), raw.size());
    } else {  // every rank's shard, on the host, then the parameter's range
      std::vector<unsigned char> mine(shard * es), all(shard * es * std::size_t(p.dp));
      if (!h_params.empty())
        std::memcpy(mine.data(), h_params.data(), mine.size());
      else
        be->download(mine.data(), params_shard.data(), mine.size());
      X->host.all_gather(mine.data(), all.data(), shard * es / 2, DType::f16);
      std::memcpy(raw.data(), all.data() + P[q].off * es, raw.size());
    }
    std::vector<float> out(P[q].n);
    for (std::size_t e = 0; e < out.size(); ++e) out[e] = load_as_f32(raw.data(), e, D);
    return out;
  }
};

ShardedStep::ShardedStep(const ModelConfig& model, const TrainConfig& train,
                         const ParallelConfig& layout, std::int64_t stage, Ledger& ledger,
                         const ShardedExecution* exec)
    : impl_(std::make_unique<Impl>(model, train, layout, stage, ledger)) {
  model.validate();
  train.validate();
  if (stage < 0 || stage >= layout.pp)
    throw Error("sharded step: stage " + std::to_string(stage) + " outside the pipeline");
  if (train.optimizer == Optimizer::lomo && (layout.distributed() || exec))
    throw InputError("--optimizer lomo: the sharded step supports adamw and sgd");
  if (exec) {
    Impl& x = *impl_;
    x.X = exec;
    x.be = &exec->backend;
    x.run = exec->backend.computes();
    x.r = exec->data.rank();
    x.es = dtype_size(train.dtype);
    if (exec->backend.dtype() != train.dtype)
      throw Error("sharded step: the backend's dtype differs from the run's");
    if (exec->data.size() != layout.dp || exec->host.size() != layout.dp)
      throw Error("sharded step: the collectives have " + std::to_string(exec->data.size()) +
                  " ranks, the layout dp " + std::to_string(layout.dp));
    if (layout.pp > 1) {
      if (!exec->pp || exec->pp->size() != layout.pp || exec->pp->rank() != stage)
        throw Error("sharded step: --pp " + std::to_string(layout.pp) +
                    " needs the pipeline group's collective, this rank being stage " +
                    std::to_string(stage));
      x.PPc = exec->pp;
      x.ppx = x.run;
      // Tied embeddings: the first and the last stage hold a copy each (split by every stage).
      if (model.tied_embeddings) {
        const bool ends = stage == 0 || stage == layout.pp - 1;
        std::unique_ptr<Collective> g = exec->pp->split(ends ? 0 : 1, int(stage));
        if (ends && x.run) x.tie_group = std::move(g);
      }
    }
    if (layout.tp > 1) {
      if (!exec->tp || !exec->tp_host || exec->tp->size() != layout.tp ||
          exec->tp_host->size() != layout.tp)
        throw Error("sharded step: --tp " + std::to_string(layout.tp) +
                    " needs the tensor-parallel group's collectives");
      x.T = exec->tp;
      x.TH = exec->tp_host;
      x.tr = exec->tp->rank();
      x.tpx = x.run;
      x.V_lo = std::int64_t(x.tr) * x.V;
    }
    x.offx = x.run && layout.offload != Offload::none;
    if (exec->optimizer.kind != train.optimizer)
      throw Error("sharded step: optimizer settings are for another optimizer");
  }
  try {
    impl_->setup();
  } catch (...) {  // the destructor will not run: the backend forgets the workspace it was lent
    if (impl_->run) impl_->be->set_gemm_workspace(nullptr, 0);
    throw;
  }
}

ShardedStep::~ShardedStep() {
  if (impl_ && impl_->run) impl_->be->set_gemm_workspace(nullptr, 0);
}

float ShardedStep::train_step() {
  return impl_->train_step();
}

std::vector<float> ShardedStep::parameter_values(const std::string& hf_name) {
  return impl_->parameter_values(hf_name);
}

std::vector<std::uint64_t> ShardedStep::parameter_elements(const std::string& hf_name) const {
  const Impl& x = *impl_;
  for (std::size_t q = 0; q < x.P.size(); ++q)
    if (x.P[q].name == hf_name) {
      std::vector<std::uint64_t> v(x.P[q].n);
      for (std::uint64_t e = 0; e < v.size(); ++e) v[e] = x.global_elem(q, e);
      return v;
    }
  throw InputError("sharded step: no parameter named '" + hf_name + "'");
}

std::uint64_t ShardedStep::host_bytes() const {
  return impl_->host_bytes();
}

std::vector<std::string> ShardedStep::parameter_names() const {
  std::vector<std::string> v;
  for (const auto& q : impl_->P) v.push_back(q.name);
  return v;
}

}  // namespace trainmem
