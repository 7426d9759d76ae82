// The sharded step, setup (src/model/sharded_impl.hpp): the rank's parameters in setup order,
// their flat offsets and owners, and setup's allocations in docs/distributed.md's order.
#include "sharded_impl.hpp"
#include "trainmem/base/checked.hpp"

namespace trainmem {

ShardedStep::Impl::Impl(const ModelConfig& model, const TrainConfig& train,
                        const ParallelConfig& layout, std::int64_t st, Ledger& l)
    : m(model), t(train), p(layout), stage(st), ledger(l), D(train.dtype) {
  require_native_moe(m, t, "the sharded step");
  check_moe_layout(p, m, t);
  first = stage == 0;
  last = stage == p.pp - 1;
  sp = p.sp;
  eager = t.attention == Attention::eager;
  tied_here = m.tied_embeddings && p.pp == 1;
  bias = m.qkv_bias;
  qkn = m.qk_norm;
  b = t.batch;
  s_full = t.seq;
  cp = p.cp;
  s = p.local_seq(t.seq);
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

std::vector<ShardedStep::Impl::ParamShape> ShardedStep::Impl::param_shapes() const {
  std::vector<ParamShape> v;
  if (first) v.push_back({"model.embed_tokens.weight", -1, {V, h}});
  // Each layer's kind: a dense MLP, or the router and experts (ModelConfig::is_moe_layer).
  const std::vector<LayerParamSpec> specs[2] = {layer_param_specs(m, dims(), false),
                                                layer_param_specs(m, dims(), m.moe())};
  for (std::int64_t l = 0; l < Ls; ++l) {
    const int g = global_layer(l);
    const std::string pre = "model.layers." + std::to_string(g) + ".";
    for (const LayerParamSpec& spec : specs[m.is_moe_layer(g) ? 1 : 0]) {
      v.push_back({pre + spec.name, g, spec.shape, spec.slot});
      v.back().trainable = !t.lora() || is_lora_slot(spec.slot);
      v.back().expert = spec.slot == kExpertsGateUp || spec.slot == kExpertsDown;
    }
  }
  if (last) {
    v.push_back({"model.norm.weight", -1, {h}});
    if (!tied_here) v.push_back({"lm_head.weight", -1, {V, h}});
  }
  for (ParamShape& q : v)
    if (q.slot < 0) q.trainable = !t.lora();  // LoRA: the embedding, final norm and head frozen
  return v;
}

std::uint64_t ShardedStep::Impl::numel(const Shape& sh) {
  std::uint64_t n = 1;
  for (auto x : sh) n = checked_mul(n, static_cast<std::uint64_t>(x), "parameter size");
  return n;
}

void ShardedStep::Impl::setup() {
  auto ph = ledger.scope(Phase::setup);
  P = param_shapes();
  std::uint64_t largest = 0;
  lidx.assign(std::size_t(Ls), {});
  for (auto& row : lidx) row.fill(-1);
  for (std::size_t q = 0; q < P.size(); ++q) {
    P[q].n = numel(P[q].shape);
    if (P[q].trainable && P[q].expert) {  // a mixture of experts: the experts' own vector
      P[q].off = Ek;
      Ek = checked_add(Ek, P[q].n, "parameters");
      largest = std::max(largest, P[q].n);
    } else if (P[q].trainable) {  // the flat vector holds the parameters that train
      P[q].off = Pk;
      Pk = checked_add(Pk, P[q].n, "parameters");
      largest = std::max(largest, P[q].n);
    } else {  // LoRA's frozen base: its own flat vector (sharded under ZeRO-3 only)
      P[q].off = Fk;
      Fk = checked_add(Fk, P[q].n, "parameters");
    }
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
  // Indices in the whole model (embedding 0, layer g's j-th parameter 1 + before[g] + j, where
  // before[g] counts the parameters of layers 0..g-1 (each its kind's), the final norm, lm_head):
  // a later stage's parameters keep the single-rank model's streams.
  if (p.pp > 1) {
    std::vector<std::size_t> before(std::size_t(m.layers) + 1, 0);
    const std::size_t per_kind[2] = {layer_param_specs(m, dims(), false).size(),
                                     layer_param_specs(m, dims(), m.moe()).size()};
    for (std::int64_t g = 0; g < m.layers; ++g)
      before[std::size_t(g) + 1] = before[std::size_t(g)] + per_kind[m.is_moe_layer(g) ? 1 : 0];
    const std::size_t all_layers = before.back();
    gidx.assign(P.size(), 0);
    std::size_t j = 0;
    int prev = -1;
    for (std::size_t q = 0; q < P.size(); ++q) {
      if (P[q].slot >= 0) {
        j = P[q].layer == prev ? j + 1 : 0;
        prev = P[q].layer;
        gidx[q] = 1 + before[std::size_t(P[q].layer)] + j;
      } else if (int(q) == norm_i) {
        gidx[q] = 1 + all_layers;
      } else if (int(q) == head_i) {  // tied: the last stage's copy starts as the embedding
        gidx[q] = m.tied_embeddings ? 0 : 2 + all_layers;
      }
    }
  }
  const std::uint64_t ranks = std::uint64_t(p.grad_ranks());  // ZeRO's: dp·cp
  shard = (Pk + ranks - 1) / ranks;
  lo = std::min(Pk, std::uint64_t(r) * shard);
  hi = std::min(Pk, lo + shard);
  if (Ek > 0 && p.per_parameter())
    throw Error(
        "sharded step: the experts' flat vector under FSDP2 is not modelled (check_moe_layout "
        "refuses it)");
  if (Ek > 0) {  // the experts' vector over the expert-data-parallel ranks (dp·tp·cp/(ep·etp))
    const std::uint64_t eranks = std::uint64_t(p.edp());
    eshard = (Ek + eranks - 1) / eranks;
    elo = std::min(Ek, std::uint64_t(edp_i()) * eshard);
    ehi = std::min(Ek, elo + eshard);
  }
  per_param = p.per_parameter();
  if (per_param) {  // FSDP2: each parameter's chunk of ceil(rows/N) rows, in setup order
    shard = own = 0;
    for (ParamShape& q : P) {
      const std::uint64_t rows = std::uint64_t(q.shape.at(0)), cols = q.n / rows;
      q.off = shard;
      q.st = own;
      shard = checked_add(shard, checked_mul(shard_chunk_rows(rows, ranks), cols), "shard");
      own = checked_add(own, checked_mul(shard_owned_rows(rows, ranks, std::uint64_t(r)), cols),
                        "owned rows");
    }
    lo = hi = 0;
    if (t.optimizer == Optimizer::adamw) step_scalars = P.size();
  }
  const std::int64_t shard_n = static_cast<std::int64_t>(shard);
  const bool off = p.offload != Offload::none;
  const bool off_params = p.offload == Offload::optimizer_params;
  // 1. parameters.
  if (p.zero == 3) {
    if (Fk > 0) {  // LoRA: the frozen base's slice, then the adapters'
      fshard = (Fk + ranks - 1) / ranks;
      flo = std::min(Fk, std::uint64_t(r) * fshard);
      fhi = std::min(Fk, flo + fshard);
      frozen_shard = alloc("params.frozen_shard", Category::params, -1, {std::int64_t(fshard)}, D);
    }
    if (!off_params) params_shard = alloc("params.shard", Category::params, -1, {shard_n}, D);
    // A mixture of experts: the rank's slice of the experts' vector, over the expert-data-
    // parallel ranks (gathered into each MoE layer's unit from them).
    if (Ek > 0 && !off_params)
      expert_params_shard = alloc("expert_params.shard", Category::params, -1,
                                  {static_cast<std::int64_t>(eshard)}, D);
  } else {
    for (auto& q : P) {
      if (!t.quantized() || q.slot < 0 || !is_quantizable_slot(q.slot)) {
        value.push_back(alloc(q.name, Category::params, q.layer, q.shape, D));
        continue;
      }
      // QLoRA: bitsandbytes' tensors of the frozen projection (check_lora_layout: tp 1, so the
      // whole weight); the packed pairs are its value.
      QuantParam qp = allocate_quantized(ledger, q.name, q.layer, q.shape, t);
      value.push_back(std::move(qp.packed));
      q.quant = int(quant.size());
      quant.push_back(std::move(qp));
    }
  }
  // 2. gradients.
  if (p.zero >= 2) {
    // Per-parameter (FSDP2): each unit's sharded gradient is made at its post-backward.
    if (!off && !per_param)
      grads_shard = alloc("grads.shard", Category::gradients, -1, {shard_n}, D);
    if (Ek > 0 && !off)  // offload: the experts' fp32 gradient shard on the host
      expert_grads_shard = alloc("expert_grads.shard", Category::gradients, -1,
                                 {static_cast<std::int64_t>(eshard)}, D);
  } else {
    for (const auto& q : P)
      grads.push_back(q.trainable
                          ? alloc(q.name + ".grad", Category::gradients, q.layer, q.shape, D)
                          : Tensor{});
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
      // Per-parameter: the owned rows, unpadded (none at all: no states on this rank).
      if (!per_param || own > 0)
        add(shard_states, "shard", -1, {static_cast<std::int64_t>(per_param ? own : shard)});
      if (Ek > 0) add(expert_states, "expert_shard", -1, {static_cast<std::int64_t>(eshard)});
    } else {
      states.resize(P.size());
      for (std::size_t q = 0; q < P.size(); ++q)
        if (P[q].trainable) add(states[q], P[q].name, P[q].layer, P[q].shape);
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
  if (p.zero >= 2 && !per_param) {  // FSDP2 reduce-scatters each unit instead (reduce_unit)
    const std::uint64_t n =
        std::min(std::max(p.reduce_bucket, largest), checked_add(Pk, Ek, "parameters"));
    for (int c = 0; c < (p.overlap_comm ? 2 : 1); ++c) {
      Tensor bk =
          comm(c == 0 ? "reduce_bucket" : "reduce_bucket.1", -1, {static_cast<std::int64_t>(n)}, D);
      (c == 0 ? bucket : persistent.emplace_back()) = std::move(bk);
    }
  }
  // ZeRO-3 units and their order.
  if (p.zero == 3) {
    unit_elems.assign(std::size_t(Ls) + 2, 0);
    seq.push_back(0);
    for (std::int64_t l = 0; l < Ls; ++l) seq.push_back(int(1 + l));
    seq.push_back(head_unit());
    for (std::int64_t l = Ls - 1; l >= 0; --l) seq.push_back(int(1 + l));
    // What each unit's gathered buffer holds, in order (the head: the final norm, then
    // lm_head or, tied, a copy of the embedding). Per-parameter sharding (FSDP2): each parameter
    // in its padded unsharded buffer, N·ceil(rows/N) rows (FSDPParam.init_all_gather_outputs),
    // the parameter its first rows; the root unit 0 holds the embedding, the final norm and
    // lm_head (fully_shard(model) takes what the layers' calls left).
    members.assign(std::size_t(Ls) + 2, {});
    const std::uint64_t ranks_n = std::uint64_t(p.grad_ranks());
    auto put = [&](int u, int q) {
      auto& mem = members[std::size_t(u)];
      if (per_param)
        for (const auto& [mq, mpos] : mem)
          if (mq == q) return;  // tied: the root holds the embedding once
      const ParamShape& pq = P[std::size_t(q)];
      const std::uint64_t rows = std::uint64_t(pq.shape.at(0));
      const std::uint64_t held =
          per_param ? checked_mul(checked_mul(shard_chunk_rows(rows, ranks_n), ranks_n),
                                  pq.n / rows, "gathered unit")
                    : pq.n;
      mem.emplace_back(q, unit_elems[std::size_t(u)]);
      unit_elems[std::size_t(u)] = checked_add(unit_elems[std::size_t(u)], held, "gathered unit");
    };
    if (embed_i >= 0) put(0, embed_i);
    for (std::size_t q = 0; q < P.size(); ++q)
      if (P[q].slot >= 0) put(1 + P[q].layer - global_layer(0), int(q));
    if (last) {
      put(head_unit(), norm_i);
      put(head_unit(), head_i);
    }
    if (per_param) {  // each unit's sharded gradient: 1/N of its padded buffer, member order
      unit_shard.assign(members.size(), 0);
      unit_grad.clear();
      unit_grad.resize(members.size());
      goff.assign(P.size(), 0);
      unit_of.assign(P.size(), -1);
      for (std::size_t u = 0; u < members.size(); ++u) {
        unit_shard[u] = unit_elems[u] / ranks_n;
        for (const auto& [q, pos] : members[u]) {
          goff[std::size_t(q)] = pos / ranks_n;
          unit_of[std::size_t(q)] = int(u);
        }
      }
    }
  }
  if (run) initialise();
}

}  // namespace trainmem
