// The sharded step, measured runs (src/model/sharded_impl.hpp): the values a rank holds (random or
// --weights), its inputs, the collectives between ranks, gradients into their buffers, the
// optimizer (ZeRO 0-3, offload) and ZeRO-3's gather window.
#include "sharded_impl.hpp"

namespace trainmem {

ParamInit ShardedStep::Impl::init_of(std::size_t q) const {
  ParamInit init;
  const int sl = P[q].slot;
  const bool lora_b = is_lora_slot(sl) && sl == lora_b_slot((sl - kLoraFirst) / 2);
  if (P[q].shape.size() == 1 || lora_b) {  // norms 1, biases 0, LoRA's B 0 (LlamaModel's)
    const std::string& nm = P[q].name;
    const bool is_bias = nm.size() > 5 && nm.compare(nm.size() - 5, 5, ".bias") == 0;
    init.kind = ParamInit::Kind::constant;
    init.value = is_bias || lora_b ? 0.0f : 1.0f;
  } else {
    init.kind = ParamInit::Kind::normal;
    init.scale = 0.02f;
    init.seed = X->seed;
    init.stream = global_index(q) + 1;
  }
  return init;
}

std::uint64_t ShardedStep::Impl::global_elem(std::size_t q, std::uint64_t e) const {
  if (ep_block(q)) {
    // Local expert x of El, its m_l = m/etp columns block etp_i: gate_up_proj (El, 2m_l, h) holds
    // gate rows [etp_i·m_l, +m_l) then the same up rows (of m + …); down_proj (El, h, m_l) columns
    // [etp_i·m_l, +m_l) of every row. Global expert ep_i·El + x.
    const ParamShape& pq = P[q];
    const std::uint64_t El = std::uint64_t(pq.shape[0]), per = pq.n / El, x = e / per, w = e % per,
                        ge = std::uint64_t(ep_i()) * El + x, T = std::uint64_t(p.etp),
                        ti = std::uint64_t(etp_i());
    if (pq.slot == kExpertsGateUp) {
      const std::uint64_t ml = std::uint64_t(pq.shape[1]) / 2, h_ = std::uint64_t(pq.shape[2]);
      const std::uint64_t row = w / h_, col = w % h_, m_all = ml * T;
      const std::uint64_t grow = row < ml ? ti * ml + row : m_all + ti * ml + (row - ml);
      return (ge * 2 * m_all + grow) * h_ + col;
    }
    const std::uint64_t ml = std::uint64_t(pq.shape[2]), m_all = ml * T;  // down_proj
    return ge * (per * T) + (w / ml) * m_all + ti * ml + w % ml;
  }
  if (replicated(q)) return e;
  const ParamShape& pq = P[q];
  const int sl = pq.slot;
  if (sl >= 0 && layer_param_row_parallel(sl)) {
    const std::uint64_t cl = std::uint64_t(pq.shape[1]);
    return (e / cl) * cl * std::uint64_t(p.tp) + std::uint64_t(tr) * cl + e % cl;
  }
  return std::uint64_t(tr) * pq.n + e;  // a block of rows (or of a bias's elements)
}

ShardedStep::Impl::Shape ShardedStep::Impl::whole_shape(std::size_t q) const {
  Shape sh = P[q].shape;
  if (ep_block(q)) {
    sh[0] *= p.ep;
    sh[P[q].slot == kExpertsGateUp ? 1 : 2] *= p.etp;
    return sh;
  }
  if (replicated(q)) return sh;
  const int sl = P[q].slot;
  sh[sl >= 0 && layer_param_row_parallel(sl) ? 1 : 0] *= p.tp;
  return sh;
}

const SafeTensorsReader* ShardedStep::Impl::weights_file(std::size_t q) const {
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
  if (is_lora_slot(P[q].slot)) return nullptr;  // an adapter the base checkpoint lacks: fresh
  throw InputError("--weights " + X->weights.front()->path() +
                   (X->weights.size() > 1 ? " (and its other shards)" : "") + ": missing tensor '" +
                   name + "' (needed by model " + m.name + ")");
}

std::vector<float> ShardedStep::Impl::rank_values(std::size_t q) const {
  std::vector<float> f(P[q].n);
  const SafeTensorsReader* in = X->weights.empty() ? nullptr : weights_file(q);
  if (!in) {
    // Random, or a LoRA adapter the files lack: it starts as LlamaModel::load_weights starts it
    // (B zero, A drawn with seed 0).
    ParamInit init = init_of(q);
    if (!X->weights.empty()) init.seed = 0;
    for (std::uint64_t e = 0; e < P[q].n; ++e) f[e] = param_init_value(init, global_elem(q, e));
    return f;
  }
  const SafeTensorsReader& file = *in;
  const std::string name = file_name(q);
  const int sl = P[q].slot;
  if (p.tp > 1 && sl >= 0 &&
      layer_param_row_parallel(sl)) {  // a block of columns: one read per row
    const std::uint64_t cl = std::uint64_t(P[q].shape[1]);
    for (std::uint64_t row = 0; row < P[q].n / cl; ++row)
      file.read_f32(name, f.data() + row * cl, global_elem(q, row * cl), cl);
  } else if (ep_block(q) && p.etp > 1) {  // the experts' column blocks: one read per run
    for (std::uint64_t e = 0; e < P[q].n;) {
      const std::uint64_t g0 = global_elem(q, e);
      std::uint64_t n = 1;
      while (e + n < P[q].n && global_elem(q, e + n) == g0 + n) ++n;
      file.read_f32(name, f.data() + e, g0, n);
      e += n;
    }
  } else {  // all of it, or a block of rows
    file.read_f32(name, f.data(), global_elem(q, 0), P[q].n);
  }
  return f;
}

void ShardedStep::Impl::initialise() {
  for (std::size_t q = 0; q < P.size() && !X->weights.empty(); ++q) weights_file(q);
  // Parameters (ZeRO < 3), with the per-parameter master copy under ZeRO 0: the backend's
  // init, or under tensor parallelism or from --weights the rank's elements made on the host.
  for (std::size_t q = 0; q < value.size(); ++q) {
    float* master = states.empty() ? nullptr : states[q].master.as<float>();
    // The D values (and the master copy) into `dst`.
    auto fill = [&](void* dst) {
      if (p.tp == 1 && X->weights.empty() && !ep_block(q)) {  // else the rank's elements
        be->init_param(dst, master, P[q].n, init_of(q));
        return;
      }
      const std::vector<float> f = rank_values(q);
      std::vector<unsigned char> raw(P[q].n * es);
      for (std::uint64_t e = 0; e < P[q].n; ++e) store_from_f32(raw.data(), e, D, f[e]);
      be->upload(dst, raw.data(), raw.size());
      if (master) be->upload(master, f.data(), f.size() * 4);
    };
    if (P[q].quant >= 0)  // a quantized base weight: its D values quantized (frozen: no master)
      quantize_base(ledger, be, value[q].as<std::uint8_t>(), quant[std::size_t(P[q].quant)],
                    P[q].layer, P[q].shape, t, fill);
    else
      fill(value[q].data());
  }
  // The owned slices (ZeRO >= 1's master shard, ZeRO-3's parameter shard), made on the host.
  const bool shard_master = bool(shard_states.master);
  if (offx) {
    // The dense shard's elements, then (a mixture of experts) the experts' shard's from `shard`.
    const std::uint64_t hn = shard + eshard;
    const bool adam = t.optimizer == Optimizer::adamw;
    if (D != DType::f32) h_master.assign(hn, 0.0f);
    if (adam) {
      h_m.assign(hn, 0.0f);
      h_v.assign(hn, 0.0f);
    }
    h_grad.assign(hn, 0.0f);
    if (p.offload == Offload::optimizer_params) h_params.assign(hn * es, 0);
    host_be = make_cpu_backend(DType::f32);
  }
  // The rank's owned elements of the trainable (or, LoRA's, the frozen) parameters, in its
  // shard's layout (`shard` elements, zero where nothing is owned: the padding) and, for the
  // master copy, in the states' (`own` under per-parameter sharding, else the shard's).
  // A mixture of experts: the `expert` vector's parameters or the others'.
  auto owned_values = [&](bool trainable, std::uint64_t n, bool states_layout,
                          bool expert = false) {
    std::vector<float> f(std::size_t(n), 0.0f);
    for (std::size_t q = 0; q < P.size(); ++q) {
      if (P[q].trainable != trainable || P[q].expert != expert) continue;
      std::vector<float> v;
      pieces(q, [&](int owner, std::uint64_t a, std::uint64_t z, std::uint64_t at) {
        if (owner != index_of(q)) return;
        if (v.empty()) v = rank_values(q);
        const std::uint64_t to = states_layout ? state_at(q, at) : at;
        std::copy(v.begin() + std::ptrdiff_t(a), v.begin() + std::ptrdiff_t(z),
                  f.begin() + std::ptrdiff_t(to));
      });
    }
    return f;
  };
  auto upload_d = [&](const Tensor& dst, const std::vector<float>& f) {
    std::vector<unsigned char> raw(f.size() * es);
    for (std::size_t x = 0; x < f.size(); ++x) store_from_f32(raw.data(), x, D, f[x]);
    be->fill_zero(dst.data(), dst.bytes());
    be->upload(dst.data(), raw.data(), raw.size());
  };
  if (frozen_shard) upload_d(frozen_shard, owned_values(false, fhi - flo, false));
  if (shard_master || params_shard || !h_master.empty() || !h_params.empty()) {
    // Flat: the owned range [lo, hi) (the padding past Pk stays zero); per-parameter: the
    // whole padded shard.
    std::vector<float> f = owned_values(true, per_param ? shard : hi - lo, false);
    if (shard_master) {
      const std::vector<float> fm = per_param ? owned_values(true, own, true) : f;
      be->fill_zero(shard_states.master.data(), shard_states.master.bytes());
      be->upload(shard_states.master.data(), fm.data(), fm.size() * 4);
    }
    if (params_shard) upload_d(params_shard, f);
    if (!h_master.empty()) std::copy(f.begin(), f.end(), h_master.begin());
    for (std::size_t x = 0; x < f.size() && !h_params.empty(); ++x)
      store_from_f32(h_params.data(), x, D, f[x]);
  }
  if (expert_states.master || expert_params_shard || (offx && Ek > 0)) {
    // The experts' owned range [elo, ehi); offloaded, at `shard` in the host's vectors.
    const std::vector<float> f = owned_values(true, ehi - elo, false, true);
    if (expert_states.master) {
      be->fill_zero(expert_states.master.data(), expert_states.master.bytes());
      be->upload(expert_states.master.data(), f.data(), f.size() * 4);
    }
    if (expert_params_shard) upload_d(expert_params_shard, f);
    if (!h_master.empty()) std::copy(f.begin(), f.end(), h_master.begin() + std::ptrdiff_t(shard));
    for (std::size_t x = 0; x < f.size() && !h_params.empty(); ++x)
      store_from_f32(h_params.data(), shard + x, D, f[x]);
  }
  for (States* st : all_states()) {
    if (st->m) be->fill_zero(st->m.data(), st->m.bytes());
    if (st->v) be->fill_zero(st->v.data(), st->v.bytes());
  }
  const std::int64_t rows = checked_mul(std::int64_t(p.dp) * M, b, "global batch");
  const std::int64_t ids = checked_mul(rows, s_full, "global batch x seq");
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
  const std::int64_t positions = rows * (s_full - 1);
  S = loss_scale(D, positions);
  ce_scale = S / float(positions);
}

std::vector<ShardedStep::Impl::States*> ShardedStep::Impl::all_states() {
  std::vector<States*> v{&shard_states, &expert_states};
  for (auto& st : states) v.push_back(&st);
  return v;
}

void ShardedStep::Impl::upload_batch(std::int64_t mb) {
  // The data-parallel index r / cp picks the rows; the context-parallel index the positions.
  const std::size_t row0 = std::size_t((std::int64_t(r / int(cp)) * M + mb) * b);
  const SeqPositions pos = SeqPositions::of_rank(s_full, cp, cr);
  std::vector<std::int32_t> tok(std::size_t(b * s)), tgt(std::size_t(b * s));
  for (std::int64_t row = 0; row < b; ++row)
    for (std::int64_t c = 0; c < s; ++c) {
      const std::int64_t at = pos.at(c);
      const std::size_t g = (row0 + std::size_t(row)) * std::size_t(s_full) + std::size_t(at);
      tok[std::size_t(row * s + c)] = global_tokens[g];
      tgt[std::size_t(row * s + c)] = at + 1 < s_full ? global_tokens[g + 1] : -1;
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

void ShardedStep::Impl::pp_send(const Tensor& x, std::uint64_t n, int peer) {
  pp_stage.resize(n * es);
  be->download(pp_stage.data(), x.data(), n * es);
  PPc->send(pp_stage.data(), n, D, peer);
}

void ShardedStep::Impl::pp_recv(const Tensor& x, std::uint64_t n, int peer) {
  pp_stage.resize(n * es);
  PPc->recv(pp_stage.data(), n, D, peer);
  be->upload(x.data(), pp_stage.data(), n * es);
}

void ShardedStep::Impl::tie_sum(void* g, std::uint64_t n) {
  pp_stage.resize(n * es);
  be->download(pp_stage.data(), g, n * es);
  tie_group->all_reduce_sum(pp_stage.data(), n, D);
  be->upload(g, pp_stage.data(), n * es);
}

void ShardedStep::Impl::sp_gather(const Tensor& local, const Tensor& full, std::int64_t width) {
  be->synchronize();
  const std::uint64_t chunk = std::uint64_t(sr * width);
  for (std::int64_t row = 0; row < b; ++row)
    T->all_gather(elem_ptr(local, std::uint64_t(row) * chunk),
                  elem_ptr(full, std::uint64_t(row * s * width)), chunk, D);
}

void ShardedStep::Impl::sp_reduce_scatter(const Tensor& partial, const Tensor& out, const void* x) {
  be->synchronize();
  const std::uint64_t chunk = std::uint64_t(sr * h);
  for (std::int64_t row = 0; row < b; ++row)
    T->reduce_scatter_sum(elem_ptr(partial, std::uint64_t(row * s * h)),
                          elem_ptr(out, std::uint64_t(row) * chunk), chunk, D);
  if (x) be->bias_forward(out.data(), x, 1, std::int64_t(std::uint64_t(b) * chunk));
}

void ShardedStep::Impl::tp_sum_add(const Tensor& y, const void* x) {
  const std::uint64_t n = std::uint64_t(b * s * h);
  tp_sum(y, n);
  be->bias_forward(y.data(), x, 1, std::int64_t(n));
}

double ShardedStep::Impl::tp_cross_entropy(Tensor& lse, const Tensor& losses) {
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

const void* ShardedStep::Impl::W(int u, int q) const {
  if (p.zero < 3) return value[std::size_t(q)].data();
  for (const auto& [mq, pos] : members[std::size_t(u)])
    if (mq == q) return elem_ptr(gathered.at(u), pos);
  throw Error("sharded step: parameter " + P[std::size_t(q)].name + " is not in unit " +
              unit_name(u));
}

void* ShardedStep::Impl::G(int q) {
  if (per_param) {  // autograd's unsharded gradient, accumulated until the unit's post-backward
    auto it = ugrad.find(q);
    if (it == ugrad.end()) {
      const ParamShape& pq = P[std::size_t(q)];
      it = ugrad.emplace(q, alloc(pq.name + ".grad", Category::gradients, pq.layer, pq.shape, D))
               .first;
      if (run) be->fill_zero(it->second.data(), it->second.bytes());
    }
    return it->second.data();
  }
  if (p.zero < 2) return grads[std::size_t(q)].data();
  be->fill_zero(bucket.data(), P[std::size_t(q)].n * es);
  return bucket.data();
}

void ShardedStep::Impl::G_done(int q) {
  if (p.zero < 2 || per_param) return;  // per-parameter: reduced at the unit's post-backward
  const ParamShape& pq = P[std::size_t(q)];
  be->synchronize();  // the backend's work is done before the collective reads its buffers
  if (tp_partial(q)) T->all_reduce_sum(bucket.data(), pq.n, D);
  group_of(std::size_t(q)).all_reduce_sum(bucket.data(), pq.n, D);
  pieces(std::size_t(q), [&](int owner, std::uint64_t a, std::uint64_t z, std::uint64_t at) {
    if (owner != index_of(std::size_t(q))) return;
    if (offx) {  // into the host's fp32 gradient shard
      std::vector<unsigned char> raw((z - a) * es);
      be->download(raw.data(), elem_ptr(bucket, a), raw.size());
      for (std::uint64_t x = a; x < z; ++x)
        h_grad[host_base(std::size_t(q)) + at + (x - a)] += load_as_f32(raw.data(), x - a, D);
    } else {
      be->bias_forward(elem_ptr(grads_shard_of(std::size_t(q)), at), elem_ptr(bucket, a), 1,
                       std::int64_t(z - a));
    }
  });
}

void ShardedStep::Impl::reduce_unit(int u) {
  rs_held.reset();  // the previous unit's reduce-scatter input (FSDP2 keeps one in flight)
  const std::uint64_t S_u = unit_shard[std::size_t(u)];
  Tensor rs_in = comm("reduce_scatter." + unit_name(u), -1,
                      {static_cast<std::int64_t>(S_u * std::uint64_t(p.grad_ranks()))}, D);
  // Each gradient summed over the ranks (as the flat step sums its bucket), this rank's rows
  // staged at their offset in the unit's shard (the padding zero).
  if (run) {
    be->fill_zero(rs_in.data(), S_u * es);
    be->synchronize();
  }
  for (const auto& [q, pos] : members[std::size_t(u)]) {
    auto it = ugrad.find(q);
    if (it == ugrad.end()) continue;  // no gradient (a frozen parameter)
    if (run) {
      const ParamShape& pq = P[std::size_t(q)];
      if (tp_partial(q)) T->all_reduce_sum(it->second.data(), pq.n, D);
      X->data.all_reduce_sum(it->second.data(), pq.n, D);
      pieces(std::size_t(q), [&](int owner, std::uint64_t a, std::uint64_t z, std::uint64_t) {
        if (owner == r)
          be->copy(elem_ptr(rs_in, goff[std::size_t(q)]), elem_ptr(it->second, a), (z - a) * es);
      });
    }
  }
  for (const auto& [q, pos] : members[std::size_t(u)]) ugrad.erase(q);  // the unsharded freed
  Tensor& out = unit_grad[std::size_t(u)];
  const std::int64_t n = static_cast<std::int64_t>(S_u);
  if (!out) {
    out = alloc("grads." + unit_name(u), Category::gradients, -1, {n}, D);
    if (run) be->fill_zero(out.data(), out.bytes());
    if (run) be->bias_forward(out.data(), rs_in.data(), 1, n);
  } else {  // a later micro-batch: its own output, added into the unit's gradient
    Tensor more = alloc("grads." + unit_name(u) + ".accumulated", Category::gradients, -1, {n}, D);
    if (run) {
      be->fill_zero(more.data(), more.bytes());
      be->bias_forward(more.data(), rs_in.data(), 1, n);
      be->bias_forward(out.data(), more.data(), 1, n);
    }
  }
  rs_held = std::move(rs_in);
}

void ShardedStep::Impl::fill_unit(int u) {
  Tensor& buf = gathered.at(u);
  be->synchronize();
  for (const auto& [q, pos] : members[std::size_t(u)]) {
    // LoRA: a frozen parameter's elements are in the frozen base's flat vector; a routed
    // expert's in the experts' vector, whose owners are the expert-data-parallel ranks.
    const std::size_t qi = std::size_t(q);
    const bool frozen = !P[qi].trainable, expert = P[qi].expert;
    const Tensor& src = frozen ? frozen_shard : expert ? expert_params_shard : params_shard;
    pieces(qi, [&](int owner, std::uint64_t a, std::uint64_t z, std::uint64_t at) {
      char* dst = elem_ptr(buf, pos + a);
      const bool mine = owner == index_of(qi);
      if (mine && !frozen && !h_params.empty()) {
        be->upload(dst, h_params.data() + (host_base(qi) + at) * es, (z - a) * es);
      } else if (mine) {
        be->copy(dst, elem_ptr(src, at), (z - a) * es);
        be->synchronize();
      }
      group_of(qi).broadcast(dst, z - a, D, owner);
    });
  }
}

void ShardedStep::Impl::for_owned(
    const std::function<void(std::size_t, std::uint64_t, std::uint64_t)>& f) const {
  for (std::size_t q = 0; q < P.size(); ++q) {
    const std::uint64_t a = std::max(lo_of(q), P[q].off), z = std::min(hi_of(q), P[q].off + P[q].n);
    if (a < z && P[q].trainable) f(q, a, z);
  }
}

void ShardedStep::Impl::broadcast_owned_slices() {
  be->synchronize();
  for (std::size_t q = 0; q < P.size(); ++q)
    if (P[q].trainable)
      by_owner_of(
          shard_of(q), P[q].off, P[q].off + P[q].n,
          [&](int owner, std::uint64_t a, std::uint64_t z) {
            group_of(q).broadcast(elem_ptr(value[q], a - P[q].off), z - a, D, owner);
          },
          ranks_of(q));
}

bool ShardedStep::Impl::tp_partial(int q) const {
  const int sl = P[std::size_t(q)].slot;
  if (!tpx) return false;
  if (sl == kQNorm || sl == kKNorm) return true;
  if (sl >= 0 && layer_param_tp_partial_grad(sl)) return true;  // LoRA: a column target's A
  // Under sp each rank's own rows: the norms' gradients, the router's (each tensor-parallel rank
  // routes its own tokens) and the shared expert's gate's (its logit of the rank's rows), are
  // partial.
  return sp && (sl == kInNorm || sl == kPostNorm || sl == kRouter || sl == kSharedExpertGate ||
                q == norm_i);
}

void ShardedStep::Impl::optimizer_step() {
  be->synchronize();
  if (tie_group && !t.lora()) {  // the embedding's gradient: its first and last stage's summed
    const int q = first ? embed_i : head_i;
    tie_sum(grads[std::size_t(q)].data(), P[std::size_t(q)].n);
  }
  if (p.zero < 2)
    for (std::size_t q = 0; q < P.size(); ++q)
      if (P[q].trainable && tp_partial(int(q))) T->all_reduce_sum(grads[q].data(), P[q].n, D);
  if (p.zero < 2)
    for (std::size_t q = 0; q < P.size(); ++q)
      if (P[q].trainable) group_of(q).all_reduce_sum(grads[q].data(), P[q].n, D);
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
      if (P[q].trainable) update(value[q].data(), grads[q].data(), states[q], 0, P[q].n);
    return;
  }
  if (p.zero == 3 && per_param) {  // each owned piece (the padding is never updated)
    for (std::size_t q = 0; q < P.size(); ++q)
      pieces(q, [&](int owner, std::uint64_t a, std::uint64_t z, std::uint64_t at) {
        if (owner == r)
          update(elem_ptr(params_shard, at), elem_ptr(unit_grad[std::size_t(unit_of[q])], goff[q]),
                 shard_states, state_at(q, at), z - a);
      });
    for (Tensor& g : unit_grad) g.reset();  // zero_grad(set_to_none=True)
    return;
  }
  if (p.zero == 3) {
    if (hi > lo) update(params_shard.data(), grads_shard.data(), shard_states, 0, hi - lo);
    if (ehi > elo)  // the experts' owned range
      update(expert_params_shard.data(), expert_grads_shard.data(), expert_states, 0, ehi - elo);
    return;
  }
  for_owned([&](std::size_t q, std::uint64_t a, std::uint64_t z) {
    const std::uint64_t at = a - lo_of(q);  // in the shard of q's flat vector
    const void* g =
        p.zero == 1 ? elem_ptr(grads[q], a - P[q].off) : elem_ptr(grads_shard_of(q), at);
    update(elem_ptr(value[q], a - P[q].off), g, states_of(q), at, z - a);
  });
  broadcast_owned_slices();
}

void ShardedStep::Impl::offload_step(float gs) {
  // The flat vectors' owned ranges, each at its place in the host's vectors: the dense [lo, hi)
  // from 0, the experts' [elo, ehi) from `shard` (a mixture of experts; empty otherwise).
  struct Range {
    bool expert;
    std::uint64_t from, n, at;
  };
  const Range ranges[2] = {{false, lo, hi - lo, 0}, {true, elo, ehi - elo, shard}};
  auto owned_of = [&](bool expert,
                      const std::function<void(std::size_t, std::uint64_t, std::uint64_t)>& f) {
    for_owned([&](std::size_t q, std::uint64_t a, std::uint64_t z) {
      if (P[q].expert == expert) f(q, a, z);
    });
  };
  if (p.zero < 2) {
    std::fill(h_grad.begin(), h_grad.end(), 0.0f);
    for_owned([&](std::size_t q, std::uint64_t a, std::uint64_t z) {
      std::vector<unsigned char> raw((z - a) * es);
      be->download(raw.data(), elem_ptr(grads[q], a - P[q].off), raw.size());
      const std::uint64_t at = host_base(q) + (a - lo_of(q));
      for (std::uint64_t x = a; x < z; ++x)
        h_grad[at + (x - a)] = load_as_f32(raw.data(), x - a, D);
    });
  }
  auto at_or_null = [](std::vector<float>& v, std::uint64_t at) {
    return v.empty() ? nullptr : v.data() + at;
  };
  for (const Range& rg : ranges) {
    const std::uint64_t n = rg.n;
    if (n == 0) continue;
    const Tensor& dev_shard = rg.expert ? expert_params_shard : params_shard;
    // The owned elements' current D values and a place for the new ones (staging, outside the
    // books like the host's pinned buffers).
    std::vector<unsigned char> vals(n * es);
    std::vector<float> work;  // fp32 D: the values themselves
    float* target = at_or_null(h_master, rg.at);
    if (!target) {
      if (!h_params.empty()) {
        std::memcpy(vals.data(), h_params.data() + rg.at * es, n * es);
      } else if (p.zero == 3) {
        be->download(vals.data(), dev_shard.data(), n * es);
      } else {
        owned_of(rg.expert, [&](std::size_t q, std::uint64_t a, std::uint64_t z) {
          be->download(vals.data() + (a - rg.from) * es, elem_ptr(value[q], a - P[q].off),
                       (z - a) * es);
        });
      }
      work.resize(n);
      for (std::uint64_t x = 0; x < n; ++x) work[x] = load_as_f32(vals.data(), x, D);
      target = work.data();
    }
    float* g = h_grad.data() + rg.at;
    if (t.optimizer == Optimizer::adamw)
      host_be->adamw_update(target, g, nullptr, at_or_null(h_m, rg.at), at_or_null(h_v, rg.at),
                            std::int64_t(n), X->optimizer.adamw, step, gs);
    else
      host_be->sgd_update(target, g, nullptr, std::int64_t(n), X->optimizer.sgd_lr, gs);
    for (std::uint64_t x = 0; x < n; ++x) store_from_f32(vals.data(), x, D, target[x]);
    if (!h_params.empty()) {
      std::memcpy(h_params.data() + rg.at * es, vals.data(), n * es);
    } else if (p.zero == 3) {
      be->upload(dev_shard.data(), vals.data(), n * es);
    } else {
      owned_of(rg.expert, [&](std::size_t q, std::uint64_t a, std::uint64_t z) {
        be->upload(elem_ptr(value[q], a - P[q].off), vals.data() + (a - rg.from) * es,
                   (z - a) * es);
      });
    }
  }
  if (p.zero == 3) return;
  broadcast_owned_slices();
}

void ShardedStep::Impl::window(std::size_t pos) {
  if (p.zero != 3) return;
  std::vector<int> want;
  if (per_param) want.push_back(0);  // FSDP2's root, until the end of the backward
  // FSDP2 prefetches in backward only (from the head on): a layer is resharded in its
  // post-forward before the next pre-forward gathers.
  const std::size_t ahead = per_param && pos <= std::size_t(Ls) ? 0 : std::size_t(p.prefetch);
  for (std::size_t j = pos; j < seq.size() && j <= pos + ahead; ++j)
    if (std::find(want.begin(), want.end(), seq[j]) == want.end()) want.push_back(seq[j]);
  // FSDP2 with reshard_after_forward=False: a unit stays until its post-backward reshards it.
  const bool keep = per_param && !p.reshard_after_forward;
  for (auto it = gathered.begin(); it != gathered.end();)
    if (!keep && std::find(want.begin(), want.end(), it->first) == want.end())
      it = gathered.erase(it);
    else
      ++it;
  for (int u : want)
    if (!gathered.count(u)) {
      const std::int64_t n = static_cast<std::int64_t>(unit_elems[std::size_t(u)]);
      // FSDP2 in forward: the all-gather's flat output (N chunks of every parameter) alive while
      // it is copied out into the unit's buffers, then freed (foreach_all_gather, then
      // foreach_all_gather_copy_out). In backward the prefetched output stands for the buffers.
      Tensor ag;
      if (per_param && pos <= std::size_t(Ls)) ag = comm("all_gather." + unit_name(u), -1, {n}, D);
      gathered[u] = comm("gathered." + unit_name(u), -1, {n}, D);
      if (run) fill_unit(u);
    }
}

std::string ShardedStep::Impl::unit_name(int u) const {
  if (u == 0) return per_param ? "root" : "embedding";
  if (u == Ls + 1) return "head";
  return "layer" + std::to_string(global_layer(u - 1));
}

}  // namespace trainmem
