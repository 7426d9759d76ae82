// An independent check that docs/distributed.md ("The sharded step", "The peak of a rank") and
// estimate_layout agree. The expected per-rank figures below are computed from the documentation
// only (docs/distributed.md, docs/native-plan.md, docs/formulas.md), written without reading
// src/analytic/analytic_rank.cpp or src/model/sharded_step.cpp.
//
// DocRank replays, for one pipeline stage, the instants the doc lists under "The peak of a rank"
// with the tensors the doc sizes under "The sharded step" (Megatron shapes, ZeRO shard and
// padding, reduce buckets, ZeRO-3 windows, 1F1B in-flight micro-batches, offload), and takes the
// largest total, a tie keeping the first instant.
//
// The review that wrote it found the doc silent or short on: the sequence-parallel backward's
// order (what coexists at head step 2, steps 3 and 8), the head's shapes under tp/sp, whether
// `activations` counts the micro-batches in flight, the embedding's ZeRO-3 / sp instant, and the
// non-last stage's forward instant. The doc now spells each out (allocation order under sp,
// "Head", "Figures", the numbered instant list), and this test follows it: every case's peak
// is determined by the doc, and is asserted exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "trainmem/analytic/analytic_rank.hpp"

namespace trainmem {
namespace {

using u64 = std::uint64_t;
using i64 = std::int64_t;

constexpr u64 kC = 33554432;  // the 32 MiB cuBLAS workspace on every rank

ModelConfig preset(const char* name) {
  auto m = find_preset(name);
  EXPECT_TRUE(m.has_value()) << name;
  return *m;
}

struct Case {
  std::string name;
  ModelConfig m;
  TrainConfig t;
  ParallelConfig p;
};

TrainConfig make_train(i64 b, i64 s, DType dt, Checkpointing ck, Attention at,
                       Optimizer o = Optimizer::adamw) {
  TrainConfig t;
  t.batch = b;
  t.seq = s;
  t.dtype = dt;
  t.checkpointing = ck;
  t.attention = at;
  t.optimizer = o;
  return t;
}

// One instant: bytes per category.
struct Inst {
  std::string name;
  CategoryBytes c{};
  u64 total() const {
    u64 s = 0;
    for (u64 v : c) s += v;
    return s;
  }
};

struct DocRank {
  i64 layers = 0;
  i64 in_flight = 1;
  u64 local = 0, shard = 0, padding = 0;
  u64 params = 0, gradients = 0, optimizer_states = 0;
  u64 activations_one = 0;  // end of forward, the micro-batch itself
  u64 activations_all = 0;  // + the other micro-batches in flight
  u64 inputs = 0;
  u64 host = 0;
  u64 buckets = 0;
  std::vector<Inst> instants;  // chronological
  Inst peak;                   // the largest, first on ties
};

constexpr int P = static_cast<int>(Category::params);
constexpr int G = static_cast<int>(Category::gradients);
constexpr int O = static_cast<int>(Category::optimizer_states);
constexpr int A = static_cast<int>(Category::activations);
constexpr int W = static_cast<int>(Category::workspace);
constexpr int IN = static_cast<int>(Category::inputs);
constexpr int CM = static_cast<int>(Category::communication);

DocRank doc_rank(const ModelConfig& m, const TrainConfig& tc, const ParallelConfig& p, i64 stage) {
  DocRank r;
  const u64 w = tc.dtype == DType::f32 ? 4 : 2;
  const u64 b = tc.batch, s = tc.seq, h = m.hidden, i = m.intermediate, a = m.heads,
            kh = m.kv_heads, d = m.hidden / m.heads, V = m.vocab, L = m.layers;
  const u64 T = p.tp, pp = p.pp, dp = p.dp, M = p.microbatches;
  const u64 Ls = L / pp;
  const u64 sr = p.sp ? s / T : s;
  const bool first = stage == 0, last = stage == static_cast<i64>(pp) - 1;
  const bool ck = tc.checkpointing == Checkpointing::full;
  const bool eager = tc.attention == Attention::eager;
  r.layers = static_cast<i64>(Ls);

  // ---- the rank's parameters: Megatron's split ("Tensor parallelism"), the stage's layers.
  const u64 emb = V / T * h;
  const u64 layer = 2 * h + (a / T) * d * h * 2 + 2 * (kh / T) * d * h + 3 * (i / T) * h;
  const u64 largest_layer_tensor = std::max({(a / T) * d * h, (kh / T) * d * h, (i / T) * h, h});
  // The last stage holds lm_head; tied with pp > 1 as its own copy of the embedding.
  const bool own_head = !m.tied_embeddings || pp > 1;
  u64 local = Ls * layer;
  u64 largest = largest_layer_tensor;
  if (first) local += emb, largest = std::max(largest, emb);
  if (last) {
    local += h;
    if (own_head) local += emb, largest = std::max(largest, emb);
  }
  r.local = local;

  // ---- ZeRO: the flat shard, padded to a multiple of dp.
  const int z = p.zero;
  r.shard = z >= 1 ? (local + dp - 1) / dp : local;
  r.padding = z >= 1 ? r.shard * dp - local : 0;
  const u64 f = tc.optimizer == Optimizer::adamw ? (w == 4 ? 8 : 12)
                : tc.optimizer == Optimizer::sgd ? (w == 4 ? 0 : 4)
                                                 : 0;
  const bool off = p.offload != Offload::none;
  const bool offp = p.offload == Offload::optimizer_params;
  r.params = offp ? 0 : (z == 3 ? w * r.shard : w * local);
  r.gradients = (off && z >= 2) ? 0 : (z >= 2 ? w * r.shard : w * local);
  r.optimizer_states = off ? 0 : (z >= 1 ? f * r.shard : f * local);
  r.host = off ? f * r.shard + 4 * r.shard + (offp ? w * r.shard : 0) : 0;
  if (z >= 2)
    r.buckets = (p.overlap_comm ? 2 : 1) * w *
                std::min<u64>(std::max<u64>(p.reduce_bucket, largest), local);
  r.inputs = (first ? 4 * b * s : 0) + (last ? 4 * b * s : 0);

  // ---- activations of one micro-batch (the doc's per-layer table).
  const u64 rs = 4 * b * sr;             // rstd1, rstd2
  const u64 Rh = w * b * sr * h;         // xn1, h_mid, xn2, out, embed_out/stage_input
  const u64 Q = w * b * s * h / T;       // q, attn_out (a·d = h)
  const u64 K = w * b * s * kh * d / T;  // k, v
  const u64 Pr = eager ? w * b * (a / T) * s * s : 4 * b * (a / T) * s;
  const u64 I = w * b * s * (i / T);  // gate, up, act
  const u64 full = 2 * rs + 4 * Rh + 2 * Q + 2 * K + Pr + 3 * I;
  const u64 keep = ck ? Rh : full;
  const u64 R = full - Rh;  // recomputed layer (no out)
  const u64 logits = w * b * s * (V / T);
  const u64 frstd = 4 * b * sr, ce_lse = 4 * b * s, ce_losses = 4 * b * s;
  const u64 head = Rh + frstd + logits + ce_lse;
  const u64 stage_in = Rh;
  const u64 A_end = stage_in + Ls * keep + (last ? head : 0) - (last ? 0 : Rh);
  r.activations_one = A_end;
  r.in_flight = static_cast<i64>(std::min<u64>(pp - stage, M));
  const u64 others = (r.in_flight - 1) * A_end;
  r.activations_all = A_end + others;

  // ---- ZeRO-3 units and windows (pp = 1 under ZeRO-3).
  // positions: 0 embedding, 1..L layers 0..L-1, L+1 head, L+2..2L+1 layers L-1..0.
  const u64 headunit = h + (m.tied_embeddings ? emb : (own_head ? emb : 0));
  auto unit_of = [&](u64 pos) -> i64 {  // -1 embedding, -2 head, else the layer
    if (pos == 0) return -1;
    if (pos <= L) return static_cast<i64>(pos - 1);
    if (pos == L + 1) return -2;
    return static_cast<i64>(2 * L + 1 - pos);
  };
  auto gathered = [&](u64 pos) -> u64 {
    if (z != 3) return 0;
    std::set<i64> units;
    for (u64 q = pos; q <= std::min<u64>(pos + p.prefetch, 2 * L + 1); ++q)
      units.insert(unit_of(q));
    u64 e = 0;
    for (i64 u : units) e += u == -1 ? emb : u == -2 ? headunit : layer;
    return w * e;
  };

  auto inst = [&](const std::string& name, u64 acts, u64 ws, u64 comm) {
    Inst x;
    x.name = name;
    x.c[P] = r.params;
    x.c[G] = r.gradients;
    x.c[O] = r.optimizer_states;
    x.c[IN] = r.inputs;
    x.c[A] = acts + others;
    x.c[W] = kC + ws;
    x.c[CM] = r.buckets + comm;
    r.instants.push_back(x);
  };
  const u64 sp_full = p.sp ? w * b * s * h : 0;  // a (b,s,h) sp buffer

  inst("start", 0, 0, 0);
  // Read literally, "to every instant the activations of the other micro-batches in flight are
  // added" includes the start of the step; nothing is in flight then (the code agrees).
  r.instants.back().c[A] = 0;
  // First stage under sp or ZeRO-3: embed_out allocated (embed.partial, the embedding's window).
  if (first && (p.sp || z == 3)) inst("embed_out", stage_in, 0, sp_full + gathered(0));
  // Under full checkpointing, sp or ZeRO-3, and on every non-last stage: the forward of the last
  // layers when their `out` is allocated (with the down partial under sp; under ZeRO-3 the last
  // prefetch + 1 layers).
  if (ck || p.sp || z == 3 || !last) {
    const u64 from = z == 3 ? std::max<i64>(0, static_cast<i64>(Ls) - 1 - p.prefetch) : Ls - 1;
    for (u64 l = from; l < Ls; ++l) {
      const u64 acts = stage_in + l * keep + full;
      inst("forward layer out", acts, 0, sp_full + gathered(1 + l));
    }
  }
  if (last) {
    const u64 A0 = stage_in + Ls * keep;
    if (p.sp) {
      inst("head forward (sp)", A0 + Rh + frstd + logits, 0, sp_full + gathered(L + 1));
    }
    inst("end of forward", A_end, ce_losses, gathered(L + 1));
    const u64 dres = Rh;
    if (!p.sp) {
      inst("head step 2", A_end - ce_lse, w * b * s * h, gathered(L + 1));
      inst("head step 3", A_end - ce_lse - logits, w * b * s * h + dres, gathered(L + 1));
    } else {  // the doc's allocation order under sp
      inst("head step 2 (sp)", A_end - ce_lse, w * b * s * h, sp_full + gathered(L + 1));
      inst("head step 2 reduce-scatter (sp)", A_end - ce_lse - logits, w * b * s * h + Rh,
           gathered(L + 1));
      inst("head step 3 (sp)", A_end - ce_lse - logits, Rh + dres, gathered(L + 1));
    }
  } else {
    inst("arrival of d_residual", A_end, Rh, 0);
  }
  // The first layer the backward processes.
  const u64 AL = stage_in + Ls * keep - Rh + (ck ? R : 0);
  const u64 D = Rh;  // d_residual (b, s_r, h)
  const u64 g = gathered(L + 2);
  const u64 dprobs = eager ? w * b * (a / T) * s * s : 4 * b * (a / T) * s;
  const u64 a1 = AL, a2 = AL - I, a3 = AL - 3 * I, a5 = a3 - 2 * Rh - rs, a8 = a5 - Q - Pr;
  // "each step of the first layer": under full checkpointing step 0 is the recompute.
  if (ck) inst("step 0 (recompute)", AL, D, g);
  if (!p.sp) {
    inst("step 1", a1, D + I, g);
    inst("step 2", a2, D + 3 * I, g);
    inst("step 3", a3, D + 2 * I + w * b * s * h, g);
    inst("step 5", a5, D + Q, g);
    inst("step 6", a5, D + 2 * Q + 2 * K + dprobs, g);
    inst("step 8", a8, D + Q + 2 * K + w * b * s * h, g);
  } else {  // the doc's allocation order under sp
    inst("step 1 (sp)", a1, D + I, sp_full + g);
    inst("step 2", a2, D + 3 * I, g);
    inst("step 3 (sp)", a3, D + 2 * I + w * b * s * h, sp_full + g);
    inst("step 3 reduce-scatter (sp)", a3, D + 2 * I + w * b * s * h + Rh, g);
    inst("step 5 (sp)", a5, D + Q, sp_full + g);
    inst("step 6", a5, D + 2 * Q + 2 * K + dprobs, g);
    inst("step 8 (sp)", a8, D + Q + 2 * K + w * b * s * h, sp_full + g);
    inst("step 8 reduce-scatter (sp)", a8, D + Q + 2 * K + w * b * s * h + Rh, g);
  }
  int best = 0;
  for (size_t k = 0; k < r.instants.size(); ++k)
    if (r.instants[k].total() > r.instants[best].total()) best = static_cast<int>(k);
  r.peak = r.instants[best];
  return r;
}

std::string cats(const CategoryBytes& c) {
  std::string s;
  for (Category k : all_categories())
    s += std::string(category_name(k)) + "=" + std::to_string(c[static_cast<int>(k)]) + " ";
  return s;
}

void check_case(const Case& c) {
  SCOPED_TRACE(c.name);
  LayoutEstimate est = estimate_layout(c.m, c.t, c.p);
  ASSERT_EQ(est.ranks.size(), static_cast<size_t>(c.p.pp));
  EXPECT_EQ(est.global_batch, static_cast<u64>(c.t.batch * c.p.microbatches * c.p.dp));
  int worst = 0;
  u64 worst_peak = 0;
  for (i64 k = 0; k < c.p.pp; ++k) {
    SCOPED_TRACE("stage " + std::to_string(k));
    const DocRank d = doc_rank(c.m, c.t, c.p, k);
    const RankEstimate& r = est.ranks[k];
    EXPECT_EQ(r.stage, k);
    EXPECT_EQ(r.ranks, c.p.dp * c.p.tp);
    EXPECT_EQ(r.layers, d.layers);
    EXPECT_EQ(r.role, c.p.pp == 1       ? "only"
                      : k == 0          ? "first"
                      : k == c.p.pp - 1 ? "last"
                                        : "middle");
    EXPECT_EQ(r.in_flight, d.in_flight);
    EXPECT_EQ(r.local_params, d.local);
    EXPECT_EQ(r.shard_elements, d.shard);
    EXPECT_EQ(r.padding_elements, d.padding);
    EXPECT_EQ(r.est.figures.params, d.params);
    EXPECT_EQ(r.est.figures.gradients, d.gradients);
    EXPECT_EQ(r.est.figures.optimizer_states, d.optimizer_states);
    EXPECT_EQ(r.est.figures.inputs, d.inputs);
    EXPECT_EQ(r.host_bytes, d.host);
    // `activations` at end of forward: the doc does not say whether the other micro-batches in
    // flight are in it; we read "every figure is per rank ... at the rank's own peak" as yes.
    EXPECT_EQ(r.est.figures.activations, d.activations_all)
        << "one micro-batch: " << d.activations_one;
    const u64 peak = r.est.figures.peak;
    EXPECT_EQ(peak, d.peak.total()) << "doc instant: " << d.peak.name;
    EXPECT_EQ(r.est.figures.peak_breakdown, d.peak.c)
        << "code: " << cats(r.est.figures.peak_breakdown) << "\ndoc (" << d.peak.name
        << "): " << cats(d.peak.c);
    // Every instant the doc lists (the start aside) is one of the code's, in the same order,
    // with the same bytes in every category.
    size_t at = 0;
    for (size_t j = 1; j < d.instants.size(); ++j) {
      const Inst& want = d.instants[j];
      size_t k2 = at;
      while (k2 < r.est.instants.size() && r.est.instants[k2].bytes != want.c) ++k2;
      EXPECT_LT(k2, r.est.instants.size())
          << "doc instant '" << want.name << "' not among the code's (after #" << at
          << "): " << cats(want.c);
      if (k2 < r.est.instants.size()) at = k2 + 1;
    }
    if (std::getenv("TRAINMEM_DOC_VERBOSE") != nullptr)
      std::printf("[case] %s stage %lld: peak %llu doc at '%s', code at '%s'\n", c.name.c_str(),
                  static_cast<long long>(k), static_cast<unsigned long long>(peak),
                  d.peak.name.c_str(),
                  r.est.peak_instant >= 0
                      ? r.est.instants[static_cast<size_t>(r.est.peak_instant)].name.c_str()
                      : "?");
    if (std::getenv("TRAINMEM_DOC_VERBOSE") != nullptr)
      for (const Instant& ci : r.est.instants) {
        bool found = false;
        for (const Inst& di : d.instants) found = found || di.c == ci.bytes;
        if (!found)
          std::printf("  code-only instant: %s (%s)\n", ci.name.c_str(), cats(ci.bytes).c_str());
      }
    if (peak > worst_peak) worst_peak = peak, worst = static_cast<int>(k);
  }
  EXPECT_EQ(est.worst, worst);
}

ParallelConfig layout(i64 dp, i64 tp, i64 pp, int zero, const ModelConfig& m, const TrainConfig& t,
                      bool sp = false, i64 M = 1) {
  ParallelConfig p;
  p.world = dp * tp * pp;
  p.dp = dp;
  p.tp = tp;
  p.pp = pp;
  p.zero = zero;
  p.sp = sp;
  p.microbatches = M;
  p.resolve(true, m, t);
  return p;
}

// ---------------------------------------------------------------- the layouts

TEST(DistributedDoc, Zero0DataParallel) {
  auto m = preset("tiny");
  auto t = make_train(2, 8, DType::bf16, Checkpointing::none, Attention::eager);
  check_case({"zero0 dp2", m, t, layout(2, 1, 1, 0, m, t)});
}

TEST(DistributedDoc, Zero1Padding) {
  auto m = preset("tiny-gqa");
  auto t = make_train(2, 8, DType::bf16, Checkpointing::none, Attention::flash);
  auto p = layout(5, 1, 1, 1, m, t);
  ASSERT_NE(m.param_count() % 5, 0u) << "want padding";
  check_case({"zero1 dp5 tiny-gqa flash", m, t, p});
}

TEST(DistributedDoc, Zero2SmallBucketOverlap) {
  auto m = preset("tiny");
  auto t = make_train(1, 16, DType::bf16, Checkpointing::none, Attention::eager);
  auto p = layout(3, 1, 1, 2, m, t);
  p.reduce_bucket = 100;  // below the largest tensor: the bucket is the largest tensor
  p.overlap_comm = true;
  check_case({"zero2 dp3 bucket 100 overlap", m, t, p});
  p.reduce_bucket = 20000;  // between the largest tensor and P_r
  p.overlap_comm = false;
  check_case({"zero2 dp3 bucket 20000", m, t, p});
}

TEST(DistributedDoc, Zero3Prefetch) {
  auto m = preset("tiny");
  auto t = make_train(2, 8, DType::bf16, Checkpointing::none, Attention::eager);
  for (i64 pf : {0, 1, 2}) {
    auto p = layout(3, 1, 1, 3, m, t);
    p.prefetch = pf;
    check_case({"zero3 dp3 prefetch " + std::to_string(pf), m, t, p});
  }
  auto tc = make_train(2, 8, DType::bf16, Checkpointing::full, Attention::flash);
  for (i64 pf : {0, 2}) {
    auto p = layout(4, 1, 1, 3, m, tc);
    p.prefetch = pf;
    check_case({"zero3 dp4 full flash prefetch " + std::to_string(pf), m, tc, p});
  }
}

TEST(DistributedDoc, Zero3TiedHeadUnit) {
  auto m = preset("tiny-tied");
  auto t = make_train(2, 8, DType::bf16, Checkpointing::full, Attention::eager);
  auto p = layout(3, 1, 1, 3, m, t);
  p.prefetch = 0;
  check_case({"zero3 tied prefetch 0", m, t, p});
}

// Under ZeRO-3 the embedding's forward instant (embed_out allocated, the embedding's window
// gathered) is the peak when the window reaches the head and a layer's activations are smaller
// than the embedding weight (the review found the doc's list lacked it; the doc now lists it).
TEST(DistributedDoc, Zero3EmbeddingWindowPeak) {
  auto m = preset("tiny");
  auto t = make_train(1, 2, DType::bf16, Checkpointing::none, Attention::eager);
  ParallelConfig p;
  p.world = 3;
  p.dp = 3;
  p.zero = 3;
  p.prefetch = 3;
  p.resolve(true, m, t);
  check_case({"zero3 dp3 prefetch 3 b1 s2", m, t, p});
}

TEST(DistributedDoc, TensorParallel) {
  auto m = preset("tiny");
  auto t = make_train(2, 8, DType::bf16, Checkpointing::none, Attention::eager);
  check_case({"tp2", m, t, layout(1, 2, 1, 0, m, t)});
  auto g = preset("tiny-gqa");
  auto tf = make_train(2, 8, DType::f32, Checkpointing::full, Attention::flash, Optimizer::sgd);
  check_case({"tp2 gqa fp32 sgd full flash", g, tf, layout(1, 2, 1, 0, g, tf)});
}

TEST(DistributedDoc, SequenceParallel) {
  auto m = preset("tiny");
  auto t = make_train(2, 8, DType::bf16, Checkpointing::none, Attention::eager);
  check_case({"tp2 sp", m, t, layout(1, 2, 1, 0, m, t, true)});
  auto tc = make_train(2, 8, DType::bf16, Checkpointing::full, Attention::flash);
  check_case({"tp2 sp full flash dp2 zero1", m, tc, layout(2, 2, 1, 1, m, tc, true)});
  auto m4 = preset("tiny");
  m4.layers = 4;
  check_case({"tp2 sp pp2 M3", m4, t, layout(1, 2, 2, 0, m4, t, true, 3)});
  auto p3 = layout(3, 2, 1, 3, m, tc, true);
  p3.prefetch = 2;
  check_case({"tp2 sp zero3 dp3 prefetch 2 full flash", m, tc, p3});
}

TEST(DistributedDoc, Zero3TensorParallelFp32) {
  auto m = preset("tiny-gqa");
  auto t = make_train(2, 8, DType::f32, Checkpointing::none, Attention::flash);
  auto p = layout(5, 2, 1, 3, m, t);
  p.reduce_bucket = 1000;
  p.overlap_comm = true;
  check_case({"zero3 tp2 dp5 fp32 bucket 1000 overlap", m, t, p});
}

TEST(DistributedDoc, PipelineTwoStages) {
  auto m = preset("tiny");
  auto t = make_train(2, 8, DType::bf16, Checkpointing::none, Attention::eager);
  check_case({"pp2 M1", m, t, layout(1, 1, 2, 0, m, t, false, 1)});
  check_case({"pp2 M4", m, t, layout(1, 1, 2, 0, m, t, false, 4)});
  auto tc = make_train(2, 8, DType::bf16, Checkpointing::full, Attention::flash);
  check_case({"pp2 M3 full flash dp2 zero1", m, tc, layout(2, 1, 2, 1, m, tc, false, 3)});
}

TEST(DistributedDoc, PipelineTiedOwnHead) {
  auto m = preset("tiny-tied");
  auto t = make_train(1, 8, DType::bf16, Checkpointing::none, Attention::eager);
  check_case({"pp2 tied M2", m, t, layout(1, 1, 2, 0, m, t, false, 2)});
}

TEST(DistributedDoc, PipelineFourStages) {
  // tiny with 4 layers (the tiny presets have 2, and pp must divide L).
  auto m = preset("tiny");
  m.layers = 4;
  auto t = make_train(2, 8, DType::bf16, Checkpointing::none, Attention::eager);
  check_case({"pp4 M2 (M < pp)", m, t, layout(1, 1, 4, 0, m, t, false, 2)});
  check_case({"pp4 M8 (M > pp)", m, t, layout(1, 1, 4, 0, m, t, false, 8)});
  check_case({"pp4 tp2 M6", m, t, layout(1, 2, 4, 0, m, t, false, 6)});
}

TEST(DistributedDoc, Offload) {
  auto m = preset("tiny");
  auto t = make_train(2, 8, DType::bf16, Checkpointing::full, Attention::flash);
  auto p1 = layout(2, 1, 1, 1, m, t);
  p1.offload = Offload::optimizer;
  check_case({"zero1 offload optimizer", m, t, p1});
  auto p3 = layout(3, 1, 1, 3, m, t);
  p3.offload = Offload::optimizer;
  check_case({"zero3 offload optimizer", m, t, p3});
  p3.offload = Offload::optimizer_params;
  check_case({"zero3 offload optimizer+params", m, t, p3});
  p3.overlap_comm = true;
  check_case({"zero3 offload optimizer+params overlap", m, t, p3});
}

// The worked examples' tables (GiB to two decimals; the columns are the peak's breakdown, host
// the host bytes).
std::string gib(u64 v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(v) / 1073741824.0);
  return buf;
}

struct Row {
  std::string params, grads, opt, acts, comm, peak, host;
};

void check_row(const std::string& name, const ModelConfig& m, const TrainConfig& t,
               const ParallelConfig& p, const Row& want) {
  SCOPED_TRACE(name);
  LayoutEstimate e = estimate_layout(m, t, p);
  const RankEstimate& r = e.ranks[static_cast<size_t>(e.worst)];
  const CategoryBytes& c = r.est.figures.peak_breakdown;
  EXPECT_EQ(gib(c[P]), want.params);
  EXPECT_EQ(gib(c[G]), want.grads);
  EXPECT_EQ(gib(c[O]), want.opt);
  EXPECT_EQ(gib(c[A]), want.acts);
  EXPECT_EQ(gib(c[CM]), want.comm);
  EXPECT_EQ(gib(r.est.figures.peak), want.peak);
  EXPECT_EQ(gib(r.host_bytes), want.host);
}

TEST(DistributedDoc, WorkedExampleLlama2_70B) {
  auto m = preset("llama2-70b");
  auto t = make_train(1, 4096, DType::bf16, Checkpointing::full, Attention::flash);
  auto z3 = layout(8, 1, 1, 3, m, t);
  check_row("ZeRO-3", m, t, z3, {"16.06", "16.06", "96.36", "5.77", "4.12", "139.11", "0.00"});
  z3.offload = Offload::optimizer;
  check_row("ZeRO-3 offload optimizer", m, t, z3,
            {"16.06", "0.00", "0.00", "5.77", "4.12", "26.70", "128.48"});
  z3.offload = Offload::optimizer_params;
  check_row("ZeRO-3 offload optimizer+params", m, t, z3,
            {"0.00", "0.00", "0.00", "5.77", "4.12", "10.64", "144.54"});
  check_row("tp 8 sp", m, t, layout(1, 8, 1, 0, m, t, true),
            {"16.06", "16.06", "96.37", "0.67", "0.06", "129.38", "0.00"});
  check_row("tp 8 sp dp 2 ZeRO-1", m, t, layout(2, 8, 1, 1, m, t, true),
            {"16.06", "16.06", "48.19", "0.67", "0.06", "81.20", "0.00"});
  LayoutEstimate e = estimate_layout(m, t, layout(8, 1, 1, 3, m, t));
  EXPECT_EQ(gib(e.worst_total()), "139.74");
}

TEST(DistributedDoc, WorkedExampleLlama7B) {
  auto m = preset("llama-7b");
  auto t = make_train(4, 512, DType::f16, Checkpointing::full, Attention::eager);
  LayoutEstimate e = estimate_layout(m, t, layout(8, 1, 1, 3, m, t));
  const MemoryFigures& f = e.ranks[0].est.figures;
  EXPECT_EQ(gib(f.params), "1.57");
  EXPECT_EQ(gib(f.gradients), "1.57");
  EXPECT_EQ(gib(f.optimizer_states), "9.41");
  EXPECT_EQ(gib(f.peak_breakdown[A]), "0.76");
  EXPECT_EQ(gib(f.peak_breakdown[W]), "0.17");
  EXPECT_EQ(gib(f.peak_breakdown[CM]), "1.69");
  EXPECT_EQ(gib(f.peak), "15.17");
  EXPECT_EQ(gib(e.worst_total()), "15.79");
}

}  // namespace
}  // namespace trainmem
