// One rank's sharded step on meta (include/trainmem/sharded_step.hpp), written from
// docs/distributed.md ("The sharded step") only. It walks every layer and every micro-batch in
// the stage's 1F1B order and allocates through the ledger; the ledger finds the peak. The
// per-rank analytic profile picks a few instants in closed form: agreement is the check.
#include "trainmem/sharded_step.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <string>

#include "trainmem/checked.hpp"
#include "trainmem/error.hpp"

namespace trainmem {

namespace {
constexpr DType f32 = DType::f32;
constexpr DType i32 = DType::i32;
using Shape = std::vector<std::int64_t>;
}  // namespace

struct ShardedStep::Impl {
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

  std::vector<Tensor> persistent;  // params, gradients, states, inputs, workspace, buckets

  // ZeRO-3: unit positions and the gathered units alive.
  std::vector<int> seq;  // unit per position (0 embedding, 1+l layer, Ls+1 head)
  std::vector<std::uint64_t> unit_elems;
  std::map<int, Tensor> gathered;

  // Activations of one micro-batch in flight: one slot per per-layer tensor name.
  static constexpr const char* kActNames[] = {
      "rstd1", "xn1",      "q_pre", "k_pre", "q_rstd", "k_rstd", "q",  "k",   "v",  "probs",
      "lse",   "attn_out", "h_mid", "rstd2", "xn2",    "gate",   "up", "act", "out"};
  static constexpr int kNumActs = sizeof(kActNames) / sizeof(kActNames[0]);
  static int act_slot(const char* name) {
    for (int n = 0; n < kNumActs; ++n)
      if (std::strcmp(kActNames[n], name) == 0) return n;
    throw Error(std::string("sharded step: no activation slot '") + name + "'");
  }
  struct Layer {
    std::array<Tensor, kNumActs> slots;
    Tensor& operator[](const char* name) { return slots[std::size_t(act_slot(name))]; }
    void erase(const char* name) { (*this)[name].reset(); }
    const char* first_alive() const {
      for (int n = 0; n < kNumActs; ++n)
        if (slots[std::size_t(n)]) return kActNames[n];
      return nullptr;
    }
  };
  struct MicroBatch {
    Tensor input;  // embed_out or stage_input (x_0)
    std::vector<Layer> layers;
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
  };
  std::vector<ParamShape> param_shapes() const {
    std::vector<ParamShape> v;
    const std::int64_t ad = a * d, kd = k * d;
    if (first) v.push_back({"model.embed_tokens.weight", -1, {V, h}});
    for (std::int64_t l = 0; l < Ls; ++l) {
      const int g = global_layer(l);
      const std::string pre = "model.layers." + std::to_string(g) + ".";
      v.push_back({pre + "input_layernorm.weight", g, {h}});
      // Column-parallel q/k/v: each bias split with its projection's output columns.
      v.push_back({pre + "self_attn.q_proj.weight", g, {ad, h}});
      if (bias) v.push_back({pre + "self_attn.q_proj.bias", g, {ad}});
      v.push_back({pre + "self_attn.k_proj.weight", g, {kd, h}});
      if (bias) v.push_back({pre + "self_attn.k_proj.bias", g, {kd}});
      v.push_back({pre + "self_attn.v_proj.weight", g, {kd, h}});
      if (bias) v.push_back({pre + "self_attn.v_proj.bias", g, {kd}});
      v.push_back({pre + "self_attn.o_proj.weight", g, {h, ad}});
      if (qkn) {  // per-head norms: the same (d) weights on every tp rank
        v.push_back({pre + "self_attn.q_norm.weight", g, {d}});
        v.push_back({pre + "self_attn.k_norm.weight", g, {d}});
      }
      v.push_back({pre + "post_attention_layernorm.weight", g, {h}});
      v.push_back({pre + "mlp.gate_proj.weight", g, {i, h}});
      v.push_back({pre + "mlp.up_proj.weight", g, {i, h}});
      v.push_back({pre + "mlp.down_proj.weight", g, {h, i}});
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
    const auto params = param_shapes();
    std::uint64_t largest = 0;
    for (const auto& q : params) {
      Pk = checked_add(Pk, numel(q.shape), "parameters");
      largest = std::max(largest, numel(q.shape));
    }
    const std::int64_t shard =
        static_cast<std::int64_t>((Pk + std::uint64_t(p.dp) - 1) / std::uint64_t(p.dp));
    const bool off = p.offload != Offload::none;
    const bool off_params = p.offload == Offload::optimizer_params;
    // 1. parameters.
    if (p.zero == 3) {
      if (!off_params)
        persistent.push_back(alloc("params.shard", Category::params, -1, {shard}, D));
    } else {
      for (const auto& q : params)
        persistent.push_back(alloc(q.name, Category::params, q.layer, q.shape, D));
    }
    // 2. gradients.
    if (p.zero >= 2) {
      if (!off) persistent.push_back(alloc("grads.shard", Category::gradients, -1, {shard}, D));
    } else {
      for (const auto& q : params)
        persistent.push_back(alloc(q.name + ".grad", Category::gradients, q.layer, q.shape, D));
    }
    // 3. optimizer states, f32.
    if (!off) {
      std::vector<const char*> states;
      const bool master = D != DType::f32;
      if (t.optimizer == Optimizer::adamw) {
        if (master) states.push_back(".master");
        states.push_back(".exp_avg");
        states.push_back(".exp_avg_sq");
      } else if (t.optimizer == Optimizer::sgd && master) {
        states.push_back(".master");
      }
      if (p.zero >= 1) {
        for (const char* st : states)
          persistent.push_back(
              alloc(std::string("shard") + st, Category::optimizer_states, -1, {shard}, f32));
      } else {
        for (const auto& q : params)
          for (const char* st : states)
            persistent.push_back(
                alloc(q.name + st, Category::optimizer_states, q.layer, q.shape, f32));
      }
    }
    // 4. inputs of one micro-batch.
    if (first) persistent.push_back(alloc("tokens", Category::inputs, -1, {b, s}, i32));
    if (last) persistent.push_back(alloc("targets", Category::inputs, -1, {b, s}, i32));
    // 5. the GEMM workspace.
    persistent.push_back(alloc("cublas_workspace", Category::workspace, -1, {8388608}, f32));
    // 6. ZeRO-2/3 reduce bucket(s).
    if (p.zero >= 2) {
      const std::uint64_t n = std::min(std::max(p.reduce_bucket, largest), Pk);
      for (int c = 0; c < (p.overlap_comm ? 2 : 1); ++c)
        persistent.push_back(comm(c == 0 ? "reduce_bucket" : "reduce_bucket.1", -1,
                                  {static_cast<std::int64_t>(n)}, D));
    }
    // ZeRO-3 units and their order.
    if (p.zero == 3) {
      std::uint64_t layer_elems = 0;
      for (const auto& q : params)
        if (q.layer == global_layer(0)) layer_elems = checked_add(layer_elems, numel(q.shape));
      unit_elems.assign(std::size_t(Ls) + 2, layer_elems);
      unit_elems[0] = numel({V, h});
      unit_elems[std::size_t(Ls) + 1] = numel({V, h}) + std::uint64_t(h);
      seq.push_back(0);
      for (std::int64_t l = 0; l < Ls; ++l) seq.push_back(int(1 + l));
      seq.push_back(int(Ls + 1));
      for (std::int64_t l = Ls - 1; l >= 0; --l) seq.push_back(int(1 + l));
    }
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
      if (!gathered.count(u))
        gathered[u] = comm("gathered." + unit_name(u), -1,
                           {static_cast<std::int64_t>(unit_elems[std::size_t(u)])}, D);
  }
  std::string unit_name(int u) const {
    if (u == 0) return "embedding";
    if (u == Ls + 1) return "head";
    return "layer" + std::to_string(global_layer(u - 1));
  }

  // ---------------------------------------------------------------- forward
  // One layer's forward (recompute: stops before `out`).
  void layer_forward(std::int64_t l, Layer& L, bool recompute) {
    const int g = global_layer(l);
    auto A = [&](const char* name, Shape sh, DType dt) { L[name] = act(name, g, sh, dt); };
    A("rstd1", {b, sr}, f32);
    A("xn1", {b, sr, h}, D);
    Tensor gath;
    if (sp) gath = comm("xn1.gathered", g, {b, s, h}, D);
    if (qkn) {
      A("q_pre", {b, s, a * d}, D);
      A("k_pre", {b, s, k * d}, D);
      A("q_rstd", {b, s, a}, f32);
      A("k_rstd", {b, s, k}, f32);
    }
    A("q", {b, s, a * d}, D);
    A("k", {b, s, k * d}, D);
    A("v", {b, s, k * d}, D);
    gath.reset();
    if (eager)
      A("probs", {b, a, s, s}, D);
    else
      A("lse", {b, a, s}, f32);
    A("attn_out", {b, s, a * d}, D);
    if (sp) gath = comm("o_proj.partial", g, {b, s, h}, D);
    A("h_mid", {b, sr, h}, D);
    gath.reset();
    A("rstd2", {b, sr}, f32);
    A("xn2", {b, sr, h}, D);
    if (sp) gath = comm("xn2.gathered", g, {b, s, h}, D);
    A("gate", {b, s, i}, D);
    A("up", {b, s, i}, D);
    gath.reset();
    A("act", {b, s, i}, D);
    if (recompute) return;
    if (sp) gath = comm("down_proj.partial", g, {b, s, h}, D);
    A("out", {b, sr, h}, D);
    gath.reset();
    if (full) {
      static const char* order[] = {"act",      "up",     "gate",  "xn2",   "rstd2", "h_mid",
                                    "attn_out", "probs",  "lse",   "v",     "k",     "q",
                                    "k_rstd",   "q_rstd", "k_pre", "q_pre", "xn1",   "rstd1"};
      for (const char* name : order) L.erase(name);
    }
  }

  void forward(std::int64_t mb, bool mark) {
    auto ph = ledger.scope(Phase::forward);
    MicroBatch& B = in_flight[mb];
    std::size_t pos = 0;
    if (first) {
      window(pos);
      Tensor partial;
      if (sp) partial = comm("embed.partial", -1, {b, s, h}, D);
      B.input = act("embed_out", -1, {b, sr, h}, D);
    } else {
      B.input = act("stage_input", -1, {b, sr, h}, D);
    }
    B.layers.resize(std::size_t(Ls));
    for (std::int64_t l = 0; l < Ls; ++l) {
      window(++pos);
      layer_forward(l, B.layers[std::size_t(l)], false);
    }
    if (last) {
      window(++pos);
      B.final_norm_out = act("final_norm_out", -1, {b, sr, h}, D);
      B.final_rstd = act("final_rstd", -1, {b, sr}, f32);
      Tensor gath;
      if (sp) gath = comm("final_norm_out.gathered", -1, {b, s, h}, D);
      B.logits = act("logits", -1, {b, s, V}, D);
      gath.reset();
      B.ce_lse = act("ce_lse", -1, {b, s}, f32);
      { Tensor losses = ws("ce_losses", -1, {b, s}, f32); }
    } else if (Ls > 0) {
      B.layers.back().erase("out");  // sent to the next stage
    }
    if (mark) ledger.mark_end_of_forward();
  }

  // ---------------------------------------------------------------- backward
  void layer_backward(std::int64_t l, MicroBatch& B, Tensor& d_res) {
    const int g = global_layer(l);
    Layer& L = B.layers[std::size_t(l)];
    auto drop = [&](std::initializer_list<const char*> names) {
      for (const char* n : names) L.erase(n);
    };
    if (full) {
      auto rc = ledger.scope(Phase::recompute);
      layer_forward(l, L, true);
    }
    // The input gradient of a column-parallel GEMM group: without sp the (b,s,h) gradient
    // itself (all-reduced in place); under sp the group's input gathered again for dW, a
    // (b,s,h) partial, the gather freed, then the (b,s_r,h) gradient it is reduce-scattered
    // into, and the partial freed.
    auto input_grad = [&](const char* gathered, const std::string& grad) {
      Tensor gath;
      if (sp) gath = comm(gathered, g, {b, s, h}, D);
      Tensor t = ws(sp ? grad + ".partial" : grad, g, {b, s, h}, D);
      gath.reset();
      if (sp) {
        Tensor rs = ws(grad, g, {b, sr, h}, D);
        t = std::move(rs);
      }
      return t;
    };
    Tensor gath;
    // 1. down_proj (d_residual gathered under sp).
    if (sp) gath = comm("d_residual.gathered", g, {b, s, h}, D);
    Tensor d_act = ws("d_act", g, {b, s, i}, D);
    drop({"act"});
    gath.reset();
    // 2. SwiGLU.
    Tensor d_gate = ws("d_gate", g, {b, s, i}, D);
    Tensor d_up = ws("d_up", g, {b, s, i}, D);
    d_act.reset();
    drop({"gate", "up"});
    // 3. gate/up: d_xn2 (a partial under sp, reduce-scattered), xn2 gathered for dW.
    Tensor d_xn2 = input_grad("xn2.gathered", "d_xn2");
    d_gate.reset();
    d_up.reset();
    drop({"xn2"});
    // 4. post-attention RMSNorm.
    d_xn2.reset();
    drop({"h_mid", "rstd2"});
    // 5. o_proj.
    if (sp) gath = comm("d_residual.gathered", g, {b, s, h}, D);
    Tensor d_ao = ws("d_attn_out", g, {b, s, a * d}, D);
    gath.reset();
    // 6. attention.
    Tensor d_q = ws("d_q", g, {b, s, a * d}, D);
    Tensor d_k = ws("d_k", g, {b, s, k * d}, D);
    Tensor d_v = ws("d_v", g, {b, s, k * d}, D);
    Tensor scratch =
        eager ? ws("d_probs", g, {b, a, s, s}, D) : ws("attn_delta", g, {b, a, s}, f32);
    scratch.reset();
    d_ao.reset();
    drop({"attn_out", "probs", "lse"});
    // 7. q/k norm backward (qk_norm): the projections' gradients replace d_q and d_k.
    if (qkn) {
      Tensor d_q_pre = ws("d_q_pre", g, {b, s, a * d}, D);
      Tensor d_k_pre = ws("d_k_pre", g, {b, s, k * d}, D);
      d_q.reset();
      d_k.reset();
      drop({"q_pre", "q_rstd", "k_pre", "k_rstd"});
      d_q = std::move(d_q_pre);
      d_k = std::move(d_k_pre);
    }
    // 8. q/k/v: d_xn1 (a partial under sp), xn1 gathered for dW.
    Tensor d_xn1 = input_grad("xn1.gathered", "d_xn1");
    d_q.reset();
    d_k.reset();
    d_v.reset();
    drop({"q", "k", "v", "xn1"});
    // 9. input RMSNorm; x_l is no longer needed.
    d_xn1.reset();
    drop({"rstd1"});
    if (l == 0)
      B.input.reset();
    else
      B.layers[std::size_t(l) - 1].erase("out");
    if (const char* left = L.first_alive())
      throw Error("sharded step: layer " + std::to_string(g) + "'s backward left '" + left +
                  "' alive");
  }

  void backward(std::int64_t mb) {
    auto ph = ledger.scope(Phase::backward);
    MicroBatch& B = in_flight.at(mb);
    std::size_t pos = std::size_t(Ls) + 1;  // the head's position
    Tensor d_res;
    if (last) {
      B.ce_lse.reset();  // 1. dlogits in place
      // 2. lm_head: d_final_norm_out (a partial under sp), the input gathered for dW.
      Tensor gath;
      if (sp) gath = comm("final_norm_out.gathered", -1, {b, s, h}, D);
      Tensor d_fno = ws(sp ? "d_final_norm_out.partial" : "d_final_norm_out", -1, {b, s, h}, D);
      gath.reset();
      B.logits.reset();
      if (sp) {
        Tensor rs = ws("d_final_norm_out", -1, {b, sr, h}, D);
        d_fno = std::move(rs);
      }
      // 3. final norm.
      d_res = ws("d_residual", -1, {b, sr, h}, D);
      d_fno.reset();
      B.final_norm_out.reset();
      B.final_rstd.reset();
      if (Ls > 0) B.layers.back().erase("out");
    } else {
      d_res = ws("d_residual", -1, {b, sr, h}, D);  // received from the next stage
    }
    for (std::int64_t l = Ls - 1; l >= 0; --l) {
      window(++pos);
      layer_backward(l, B, d_res);
    }
    window(seq.size());  // the embedding's backward needs no weight
    if (first && sp) {
      Tensor gath = comm("d_residual.gathered", -1, {b, s, h}, D);
    }
    if (Ls == 0) B.input.reset();
    d_res.reset();
    in_flight.erase(mb);
  }

  void train_step() {
    ++step;
    ledger.begin_step(step);
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
  }
};

ShardedStep::ShardedStep(const ModelConfig& model, const TrainConfig& train,
                         const ParallelConfig& layout, std::int64_t stage, Ledger& ledger)
    : impl_(std::make_unique<Impl>(model, train, layout, stage, ledger)) {
  model.validate();
  train.validate();
  if (stage < 0 || stage >= layout.pp)
    throw Error("sharded step: stage " + std::to_string(stage) + " outside the pipeline");
  if (train.optimizer == Optimizer::lomo && layout.distributed())
    throw InputError("--optimizer lomo: the sharded step supports adamw and sgd");
  impl_->setup();
}

ShardedStep::~ShardedStep() = default;

void ShardedStep::train_step() {
  impl_->train_step();
}

}  // namespace trainmem
