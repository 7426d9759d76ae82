// One rank's sharded step (include/trainmem/model/sharded_step.hpp), written from
// docs/distributed.md
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
//     a mixture of experts keeps its routed experts' parameters in a second flat vector
//     (docs/distributed.md, "Mixture of experts per rank"), sharded alike over the
//     expert-data-parallel ranks into expert_grads.shard and expert_shard.*;
//   - ZeRO 0/1: every parameter and gradient whole; after the last micro-batch each gradient is
//     all-reduced in place (the sum in rank order, collective.hpp). ZeRO 2/3: each parameter's
//     gradient of a micro-batch is computed into reduce_bucket (zeroed), all-reduced there, and
//     the rank's part added into grads.shard;
//   - ZeRO 0: the optimizer updates every parameter with its own states; ZeRO 1/2: each rank
//     updates its owned slices (states in the flat shard.* tensors), then every slice is
//     broadcast from its owner into every rank's parameter; ZeRO 3: each rank updates
//     params.shard, and a unit's weights are gathered into gathered.<unit> (each owner's slice
//     broadcast) when the unit enters the prefetch window;
//   - per-parameter sharding (FSDP2, docs/distributed.md "FSDP2: per-parameter sharding"): each
//     parameter's rows split in chunks of ceil(rows/N) (pieces()); a parameter's gradient is its
//     own unsharded <name>.grad until its unit's post-backward, which all-reduces each (the sum a
//     reduce-scatter would give the owner) and keeps the rank's rows in grads.<unit>.
#include "sharded_impl.hpp"

namespace trainmem {

void ShardedStep::Impl::forward(std::int64_t mb, bool mark) {
  auto ph = ledger.scope(Phase::forward);
  cur_mb = mb;
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
    if (offload)
      offload->after_forward(
          l, layer_input(B, l),
          l > 0 ? layer_act(LayerAct::out).name : (first ? "embed_out" : "stage_input"),
          l > 0 ? global_layer(l - 1) : -1, B.layers[std::size_t(l)], global_layer(l));
  }
  if (last) {
    window(++pos);
    const int hu = head_unit();
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
        // The micro-batch's load-balancing loss counts once per b·(s−1) positions of the
        // global mean (the step's loss divides by dp·M of them).
        if (m.output_router_logits) loss_sum += router_aux_loss(mb) * double(b * (s_full - 1));
      }
    }
  } else if (Ls > 0) {
    if (ppx) pp_send(B.layers.back()[LayerAct::out], std::uint64_t(b * sr * h), int(stage) + 1);
    B.layers.back()[LayerAct::out].reset();  // sent to the next stage
  }
  if (mark) ledger.mark_end_of_forward();
}

void ShardedStep::Impl::backward(std::int64_t mb) {
  auto ph = ledger.scope(Phase::backward);
  cur_mb = mb;
  MicroBatch& B = in_flight.at(mb);
  const std::int64_t n = b * s;
  std::size_t pos = std::size_t(Ls) + 1;  // the head's position
  Tensor d_res;
  if (last) {
    const int hu = head_unit();
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
    // LoRA: a frozen head has no gradient.
    void* g_head = P[std::size_t(head_i)].trainable ? grad_buffer(head_i) : nullptr;
    if (run) {
      be->matmul(d_fno.data(), B.logits.data(), W(hu, head_i), n, h, V, Trans::no, Trans::no, 1.f,
                 0.f);
      if (tpx && !sp) tp_sum(d_fno, std::uint64_t(n * h));
      if (g_head) {
        be->matmul(g_head, B.logits.data(), sp ? gath.data() : B.final_norm_out.data(), V, h, n,
                   Trans::yes, Trans::no, 1.f, 1.f);
        G_done(head_i);
      }
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
    const bool trains = P[std::size_t(norm_i)].trainable;
    void* g_norm = trains ? grad_buffer(norm_i) : nullptr;
    if (run) {
      const void* xL = Ls > 0 ? B.layers.back()[LayerAct::out].data() : B.input.data();
      be->fill_zero(d_res.data(), d_res.bytes());
      be->rmsnorm_backward(d_res.data(), g_norm, d_fno.data(), xL, W(hu, norm_i),
                           B.final_rstd.as<float>(), b * sr, h);
      if (trains) G_done(norm_i);
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
    if (offload) offload->before_backward(l, ledger);  // the layer below, one ahead
    decoder_layer_backward(layer_rank(), l, global_layer(l), B.layers[std::size_t(l)],
                           layer_input(B, l), d_res);
    if (offload) offload->after_backward(l);
    if (per_param) {  // FSDP2's post-backward: the unit resharded, then reduce-scattered
      gathered.erase(int(1 + l));
      reduce_unit(int(1 + l));
    }
  }
  // The embedding's backward needs no weight; FSDP2's root stays gathered until the backward
  // ends (its reshard is the final callback's).
  window(seq.size());
  // The embedding (LoRA: frozen, no backward): from the whole sequence's d_residual (gathered
  // under sp).
  if (first && P[std::size_t(embed_i)].trainable) {
    Tensor gath;
    if (sp) gath = comm("d_residual.gathered", -1, {b, s, h}, D);
    void* g_embed = grad_buffer(embed_i);
    if (run) {
      if (ppx) upload_batch(mb);  // later micro-batches' forwards replaced the tokens
      if (sp) sp_gather(d_res, gath, h);
      const Tensor& dy = sp ? gath : d_res;
      if (tpx) zero_rows(dy, foreign_tok);  // its last use: rows of ids other ranks hold
      be->embedding_backward(g_embed, dy.data(), tokens.as<std::int32_t>(), b, s, h, V);
      G_done(embed_i);
    }
  }
  if (Ls == 0) B.input.reset();
  if (ppx && !first)  // dL/d(stage input), to the previous stage
    pp_send(d_res, std::uint64_t(b * sr * h), int(stage) - 1);
  d_res.reset();
  if (per_param) {  // FSDP2's final callback: the root resharded and reduce-scattered
    gathered.clear();
    reduce_unit(0);
    rs_held.reset();
  }
  in_flight.erase(mb);
}

// output_router_logits per rank (docs/distributed.md, "The load-balancing loss per rank"): HF's
// load_balancing_loss_func over the micro-batch's T = b·s tokens of this rank and its L MoE
// layers, as each rank computes it under DDP: aux = coef·E·Σ_e (C_e/LT)·(P_e/LT), C_e the choices
// routed to expert e and P_e the sum of its probabilities. The step's loss is the mean over the
// dp·M (rank, micro-batch) pairs, so each probability's gradient is coef·E·C_e/(LT)² / (dp·M),
// times the loss scale as the cross-entropy's (check_moe_layout: pp = tp = cp = 1).
double ShardedStep::Impl::router_aux_loss(std::int64_t mb) {
  const std::size_t E = std::size_t(m.experts);
  std::vector<double> count(E, 0.0);
  for (const auto& [key, c] : routed)
    if (key.first == mb)
      for (std::size_t e = 0; e < E; ++e) count[e] += double(c[e]);
  const std::vector<double>& prob = aux_probs[mb];
  const double LT = double(m.moe_layer_count()) * double(b * sr);
  const double coef = m.router_aux_loss_coef, pairs = double(std::int64_t(p.dp) * M);
  std::vector<float>& g = aux_grad[mb];
  g.assign(E, 0.0f);
  if (m.moe_layer_count() == 0 || prob.size() != E) return 0.0;
  double aux = 0.0;
  for (std::size_t e = 0; e < E; ++e) {
    aux += (count[e] / LT) * (prob[e] / LT);
    g[e] = float(double(S) * coef * double(E) * count[e] / (LT * LT * pairs));
  }
  return coef * double(E) * aux;
}

MoeDispatch ShardedStep::Impl::moe_dispatch(int g, const std::vector<std::int32_t>& off) {
  MoeDispatch d;
  const auto key = std::make_pair(cur_mb, g);
  if (!run) {  // a trace: the given routing's rows, or balanced routing's
    const auto it = given_rows.find(key);
    d.a = it != given_rows.end() ? it->second.a : routed_rows();
    d.rows = it != given_rows.end() ? it->second.r : dims().er;
    seen_rows[key] = {d.a, d.rows};
    return d;
  }
  // The rank's own rows per global expert, sent to each peer for its El experts; what each
  // peer routes to this rank's experts comes back (the counts on the host, int32). At ep 1 the
  // rank's own rows are its experts' (El = E).
  const std::int64_t E = m.experts, ep = p.ep, El = E / ep, etp = p.etp;
  std::vector<std::int32_t> mine(static_cast<std::size_t>(E)), theirs(mine.size());
  for (std::int64_t e = 0; e < E; ++e)
    mine[std::size_t(e)] = off[std::size_t(e + 1)] - off[std::size_t(e)];
  if (ep > 1) {
    const std::vector<std::size_t> one(std::size_t(ep), 1);
    EPH->all_to_all_v(mine.data(), one.data(), theirs.data(), one.data(), std::size_t(El),
                      DType::i32);
  } else {
    theirs = mine;
  }
  d.send_rows.assign(std::size_t(ep), 0);
  d.recv_rows.assign(std::size_t(ep), 0);
  for (std::int64_t q = 0; q < ep; ++q)
    for (std::int64_t e = 0; e < El; ++e) {
      const std::size_t k = std::size_t(q * El + e);
      d.send_rows[std::size_t(q)] += std::size_t(mine[k]);
      d.recv_rows[std::size_t(q)] += std::size_t(theirs[k]);
      d.a += theirs[k];
    }
  // Expert tensor parallelism: every etp peer's received counts (E each, in its recv order),
  // gathered; expert_in holds peer after peer's rows.
  std::vector<std::int32_t> all = theirs;
  if (etp > 1) {
    all.resize(std::size_t(etp * E));
    const std::vector<std::size_t> each(static_cast<std::size_t>(etp), static_cast<std::size_t>(E));
    ETPH->all_gather_v(theirs.data(), std::size_t(E), all.data(), each.data(), 1, DType::i32);
    d.gather_rows.assign(std::size_t(etp), 0);
  }
  d.chunk.resize(all.size());
  for (std::size_t k = 0; k < all.size(); ++k) {
    d.chunk[k] = all[k];
    d.rows += all[k];
    if (etp > 1) d.gather_rows[k / std::size_t(E)] += std::size_t(all[k]);
  }
  seen_rows[key] = {d.a, d.rows};
  return d;
}

float ShardedStep::Impl::train_step() {
  ++step;
  ledger.begin_step(step);
  seen_rows.clear();  // this step's dispatch
  routed.clear();
  aux_probs.clear();
  aux_grad.clear();
  if (offload) offload->begin_step(step);
  if (run) {
    loss_sum = 0;
    for (auto& gq : grads)
      if (gq) be->fill_zero(gq.data(), gq.bytes());
    if (grads_shard) be->fill_zero(grads_shard.data(), grads_shard.bytes());
    if (expert_grads_shard) be->fill_zero(expert_grads_shard.data(), expert_grads_shard.bytes());
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
  if (!run) {
    for (Tensor& g : unit_grad) g.reset();  // FSDP2: zero_grad(set_to_none=True), as measured
    return std::numeric_limits<float>::quiet_NaN();
  }
  optimizer_step();
  // The global mean: every rank's sum of token losses, added in rank order.
  std::vector<double> sums(std::size_t(p.grad_ranks()));
  X->host.all_gather(&loss_sum, sums.data(), 2, DType::f32);  // a double as 8 bytes
  double total = 0;
  for (double v : sums) total += v;
  float loss = float(total / double(std::int64_t(p.dp) * M * b * (s_full - 1)));
  if (ppx) PPc->broadcast(&loss, 1, DType::f32, int(p.pp) - 1);  // the last stage's
  return loss;
}

std::vector<float> ShardedStep::Impl::parameter_values(const std::string& name) {
  if (!run) throw Error("sharded step: parameter values exist only in a measured run");
  std::size_t q = 0;
  while (q < P.size() && P[q].name != name) ++q;
  if (q == P.size()) throw InputError("sharded step: no parameter named '" + name + "'");
  if (P[q].quant >= 0)
    throw Error("sharded step: " + name + " is a quantized weight; the layer dequantizes it");
  std::vector<unsigned char> raw(P[q].n * es);
  if (p.zero < 3) {
    be->download(raw.data(), value[q].data(), raw.size());
  } else if (P[q].expert) {  // the expert-data-parallel group's shards, then q's range
    const std::vector<unsigned char> all = expert_group_shards();
    pieces(q, [&](int owner, std::uint64_t a, std::uint64_t z, std::uint64_t at) {
      std::memcpy(raw.data() + a * es, all.data() + (std::uint64_t(owner) * eshard + at) * es,
                  (z - a) * es);
    });
  } else {  // every rank's shard (the frozen base's under LoRA), then the parameter's range
    const bool frozen = !P[q].trainable;
    const std::uint64_t per = frozen ? fshard : shard;
    std::vector<unsigned char> mine(per * es), all(per * es * std::size_t(p.grad_ranks()));
    if (!h_params.empty() && !frozen)
      std::memcpy(mine.data(), h_params.data(), mine.size());
    else
      be->download(mine.data(), (frozen ? frozen_shard : params_shard).data(), mine.size());
    X->host.all_gather(mine.data(), all.data(), per * es / 2, DType::f16);
    pieces(q, [&](int owner, std::uint64_t a, std::uint64_t z, std::uint64_t at) {
      std::memcpy(raw.data() + a * es, all.data() + (std::uint64_t(owner) * per + at) * es,
                  (z - a) * es);
    });
  }
  std::vector<float> out(P[q].n);
  for (std::size_t e = 0; e < out.size(); ++e) out[e] = load_as_f32(raw.data(), e, D);
  return out;
}

std::vector<unsigned char> ShardedStep::Impl::expert_group_shards() {
  // Every slot's expert shard (the stage's dp·cp·tp ranks: over the tensor-parallel group, then
  // the gradient group, so slot r·tp + tr lands at that index), on host buffers; then, in the
  // order of their index, the slots of this rank's expert-data-parallel group, those with its
  // (ep_i, etp_i): slot = edp_i·(ep·etp) + ep_i·etp + etp_i.
  const std::size_t per = std::size_t(eshard) * es, tp = std::size_t(p.tp);
  std::vector<unsigned char> mine(per), row(per * tp), all(per * tp * std::size_t(p.grad_ranks()));
  if (!h_params.empty())  // --offload optimizer+params: the host's copy, after the dense shard
    std::memcpy(mine.data(), h_params.data() + shard * es, per);
  else
    be->download(mine.data(), expert_params_shard.data(), per);
  if (tp > 1)
    TH->all_gather(mine.data(), row.data(), per / 2, DType::f16);  // bytes as 16-bit words
  else
    row = mine;
  X->host.all_gather(row.data(), all.data(), per * tp / 2, DType::f16);
  std::vector<unsigned char> out(per * std::size_t(p.edp()));
  for (std::int64_t o = 0; o < p.edp(); ++o) {
    const std::int64_t j = o * p.ep * p.etp + ep_i() * p.etp + etp_i();
    std::memcpy(out.data() + std::size_t(o) * per, all.data() + std::size_t(j) * per, per);
  }
  return out;
}

ShardedStep::ShardedStep(const ModelConfig& model, const TrainConfig& train,
                         const ParallelConfig& layout, std::int64_t stage, Ledger& ledger,
                         const ShardedExecution* exec, std::int64_t grad_rank)
    : impl_(std::make_unique<Impl>(model, train, layout, stage, ledger)) {
  model.validate();
  train.validate();
  train.check_checkpoint_resolved("this command");
  if (stage < 0 || stage >= layout.pp)
    throw Error("sharded step: stage " + std::to_string(stage) + " outside the pipeline");
  if (train.optimizer == Optimizer::lomo && (layout.distributed() || exec))
    throw InputError("--optimizer lomo: the sharded step supports adamw and sgd");
  if (bnb_optimizer(train.optimizer))
    throw InputError(std::string("--optimizer ") + optimizer_name(train.optimizer) +
                     ": the sharded step supports adamw and sgd (bitsandbytes' optimizers run "
                     "on one GPU without a parallel layout)");
  if (exec) {
    Impl& x = *impl_;
    x.X = exec;
    x.be = &exec->backend;
    x.run = exec->backend.computes();
    x.r = exec->data.rank();
    x.es = dtype_size(train.dtype);
    if (exec->backend.dtype() != train.dtype)
      throw Error("sharded step: the backend's dtype differs from the run's");
    if (exec->data.size() != layout.grad_ranks() || exec->host.size() != layout.grad_ranks())
      throw Error("sharded step: the collectives have " + std::to_string(exec->data.size()) +
                  " ranks, the layout dp·cp " + std::to_string(layout.grad_ranks()));
    if (layout.cp > 1) {
      if (!exec->cp || exec->cp->size() != layout.cp || exec->cp->rank() != x.r % layout.cp)
        throw Error("sharded step: --cp " + std::to_string(layout.cp) +
                    " needs the context-parallel ring's collective, this rank being index " +
                    std::to_string(x.r % layout.cp));
      x.CPc = exec->cp;
      x.cr = exec->cp->rank();
    }
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
    if (layout.ep > 1 || layout.etp > 1 || (model.moe() && layout.tp > 1)) {
      // Megatron's order within the stage: the expert-tensor-parallel index j mod etp, the
      // expert-parallel index (j / etp) mod ep, the expert-data-parallel index j / (etp·ep), j
      // the rank's slot (gradient-group index · tp + tp index). Under tp the experts' gradients
      // are summed over tensor-parallel ranks too (edp spans them), even at ep = etp = 1.
      const int ep = int(layout.ep), etp = int(layout.etp);
      const bool eps = layout.ep > 1, etps = layout.etp > 1;
      const std::int64_t ep_i = x.ep_i(), etp_i = x.etp_i(), edp_i = x.edp_i();
      const bool ep_ok = !eps || (exec->ep && exec->ep_host && exec->ep->size() == ep &&
                                  exec->ep->rank() == ep_i && exec->ep_host->size() == ep);
      const bool etp_ok = !etps || (exec->etp && exec->etp_host && exec->etp->size() == etp &&
                                    exec->etp->rank() == etp_i && exec->etp_host->size() == etp &&
                                    exec->etp_host->rank() == etp_i);
      const bool edp_ok =
          exec->edp && exec->edp->size() == layout.edp() && exec->edp->rank() == edp_i;
      if (!ep_ok || !etp_ok || !edp_ok)
        throw Error("sharded step: --ep " + std::to_string(ep) + " --etp " + std::to_string(etp) +
                    " needs" +
                    (eps ? " the expert-parallel group (this rank index " + std::to_string(ep_i) +
                               " of " + std::to_string(ep) + "),"
                         : "") +
                    (etps ? " the expert-tensor-parallel group (index " + std::to_string(etp_i) +
                                " of " + std::to_string(etp) + "),"
                          : "") +
                    " the expert-data-parallel group (index " + std::to_string(edp_i) + " of " +
                    std::to_string(layout.edp()) + ")");
      x.EPc = eps ? exec->ep : nullptr;
      x.EPH = eps ? exec->ep_host : nullptr;
      x.ETP = etps ? exec->etp : nullptr;
      x.ETPH = etps ? exec->etp_host : nullptr;
      x.EDP = exec->edp;
    }
    x.offx = x.run && layout.offload != Offload::none;
    if (exec->optimizer.kind != train.optimizer)
      throw Error("sharded step: optimizer settings are for another optimizer");
  }
  if (!exec) {
    // A MoE under tensor parallelism: the ranks of a stage differ by their slot (their
    // tensor-parallel index too), which grad_rank then names: r = slot / tp, tr = slot mod tp.
    const bool by_slot = model.moe() && layout.tp > 1;
    const std::int64_t n = layout.grad_ranks() * (by_slot ? layout.tp : 1);
    if (grad_rank < 0 || grad_rank >= n)
      throw Error("sharded step: rank " + std::to_string(grad_rank) + " outside the " +
                  (by_slot ? "stage's " : "gradient group of ") + std::to_string(n));
    impl_->r = int(by_slot ? grad_rank / layout.tp : grad_rank);
    if (by_slot) impl_->tr = int(grad_rank % layout.tp);
  }
  if (layout.cp > 1 && train.attention != Attention::flash)  // resolve's rule, for any caller
    throw InputError("--cp " + std::to_string(layout.cp) + " needs --attention flash");
  check_lora_layout(layout, train);
  if (train.offload_activations) {
    if (layout.pp > 1) throw InputError("--offload-activations with --pp above 1 is not modelled");
    impl_->offload =
        std::make_unique<ActivationOffload>(impl_->run ? impl_->be : nullptr, impl_->Ls);
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

const ShardedStep::ExpertRows& ShardedStep::expert_rows() const {
  return impl_->seen_rows;
}

const ShardedStep::SourceCounts& ShardedStep::routed() const {
  return impl_->routed;
}

void ShardedStep::set_expert_rows(ExpertRows rows) {
  if (impl_->run)
    throw Error("sharded step: given expert rows are a trace's, not a measured run's");
  impl_->given_rows = std::move(rows);
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

bool ShardedStep::is_quantized(const std::string& hf_name) const {
  for (const auto& q : impl_->P)
    if (q.name == hf_name) return q.quant >= 0;
  return false;
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
