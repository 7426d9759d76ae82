// The native profile per rank (estimate_layout): (1) a layout of one GPU is the single-GPU native
// profile, whole (the same code: this says so); (2) against per-rank books written out by hand from
// docs/distributed.md: ZeRO shards with their padding, tensor-parallel and sequence-parallel
// activation sets, pipeline stages with their in-flight micro-batches, buckets and gathers.
// Also the layout checks (ParallelConfig::resolve) and their messages.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/sharded_step.hpp"

namespace trainmem {
namespace {

using u64 = std::uint64_t;

ModelConfig preset(const char* name) {
  auto m = find_preset(name);
  EXPECT_TRUE(m.has_value()) << name;
  return *m;
}

TrainConfig train(std::int64_t b, std::int64_t s, DType dt = DType::bf16,
                  Checkpointing ck = Checkpointing::none, Attention at = Attention::eager,
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

ParallelConfig layout(std::int64_t dp, std::int64_t tp, std::int64_t pp, int zero,
                      const ModelConfig& m, const TrainConfig& t, bool sp = false,
                      std::int64_t M = 1) {
  ParallelConfig p;
  p.world = dp * tp * pp;
  p.tp = tp;
  p.pp = pp;
  p.zero = zero;
  p.sp = sp;
  p.microbatches = M;
  p.resolve(false, m, t);
  return p;
}

std::string resolve_error(ParallelConfig p, bool dp_given, const ModelConfig& m,
                          const TrainConfig& t) {
  try {
    p.resolve(dp_given, m, t);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

// Parameters of one full (unsharded) layer: two norms, q/k/v/o, gate/up/down.
u64 layer_params_full(const ModelConfig& m) {
  const u64 h = m.hidden, d = h / m.heads;
  return 2 * h + h * (m.heads * d) + 2 * h * (m.kv_heads * d) + (m.heads * d) * h +
         3 * h * m.intermediate;
}

// A layout of one GPU is the single-GPU native profile: one closed form (analytic_native.cpp)
// serves both, so estimate_layout for one GPU must hand back estimate(Profile::native, ...)
// whole: figures, every tensor row, every instant with its name and bytes, the label and notes.
// (That the closed form is right is checked elsewhere: against trainmem's ledger byte for byte,
// test_ledger_vs_analytic, and against the per-rank books written out by hand below.)
TEST(AnalyticRank, OneGpuIsTheNativeProfile) {
  int comparisons = 0;
  for (const char* name :
       {"tiny", "tiny-gqa", "tiny-tied", "tiny-awkward", "tiny-qwen3", "llama-7b"}) {
    const ModelConfig m = preset(name);
    for (DType dt : {DType::bf16, DType::f32})
      for (Checkpointing ck : {Checkpointing::none, Checkpointing::full})
        for (Attention at : {Attention::eager, Attention::flash})
          for (Optimizer o : {Optimizer::adamw, Optimizer::sgd, Optimizer::lomo}) {
            const TrainConfig t = train(3, 17, dt, ck, at, o);
            const LayoutEstimate le = estimate_layout(m, t, layout(1, 1, 1, 0, m, t));
            const Estimate ref = estimate(Profile::native, m, t);
            ASSERT_EQ(le.ranks.size(), 1u);
            const RankEstimate& r = le.ranks[0];
            const Estimate& e = r.est;
            SCOPED_TRACE(std::string(name) + " " + dtype_name(dt) + " " + checkpointing_name(ck) +
                         " " + attention_name(at) + " " + optimizer_name(o));
            EXPECT_EQ(r.role, "only");
            EXPECT_EQ(r.ranks, 1);
            EXPECT_EQ(r.local_params, ref.param_count);
            EXPECT_EQ(r.shard_elements, ref.param_count);
            EXPECT_EQ(r.padding_elements, 0u);
            EXPECT_TRUE(r.communication.empty());
            const MemoryFigures& a = e.figures;
            const MemoryFigures& b = ref.figures;
            EXPECT_EQ(a.params, b.params);
            EXPECT_EQ(a.gradients, b.gradients);
            EXPECT_EQ(a.optimizer_states, b.optimizer_states);
            EXPECT_EQ(a.activations, b.activations);
            EXPECT_EQ(a.activations_peak, b.activations_peak);
            EXPECT_EQ(a.workspace, b.workspace);
            EXPECT_EQ(a.inputs, b.inputs);
            EXPECT_EQ(a.sum, b.sum);
            EXPECT_EQ(a.peak, b.peak);
            EXPECT_EQ(a.peak_breakdown, b.peak_breakdown);
            EXPECT_EQ(e.param_count, ref.param_count);
            EXPECT_EQ(e.largest_gradient_bytes, ref.largest_gradient_bytes);
            EXPECT_EQ(e.largest_gradient_name, ref.largest_gradient_name);
            EXPECT_EQ(e.label, ref.label);
            EXPECT_EQ(e.notes, ref.notes);
            EXPECT_EQ(e.peak_instant, ref.peak_instant);
            ASSERT_EQ(e.instants.size(), ref.instants.size());
            for (std::size_t n = 0; n < e.instants.size(); ++n) {
              EXPECT_EQ(e.instants[n].name, ref.instants[n].name);
              EXPECT_EQ(e.instants[n].bytes, ref.instants[n].bytes);
            }
            const auto rows = [](const ActivationBreakdown& x) {
              std::vector<std::string> v;
              for (const auto* list : {&x.embedding, &x.layer, &x.recompute, &x.head, &x.inputs})
                for (const TensorEntry& t : *list)
                  v.push_back(t.name + " " + t.shape + " " + t.dtype + " " +
                              std::to_string(t.bytes) + " " + t.kept_by + " | " + t.why);
              return v;
            };
            EXPECT_EQ(rows(e.activations), rows(ref.activations));
            EXPECT_EQ(e.activations.total_bytes, ref.activations.total_bytes);
            ++comparisons;
          }
  }
  EXPECT_EQ(comparisons, 6 * 2 * 2 * 2 * 3);
}

// A one-GPU LOMO layout against docs/native-plan.md's LOMO figures worked out by hand: no
// optimizer states; the gradient peak is the largest single gradient (untied) or the embedding's
// plus the largest other (tied: it lives from head step 2 to the embedding backward).
TEST(AnalyticRank, OneGpuLomoIsTheNativePlansFigures) {
  struct Case {
    const char* name;
    u64 largest_gradient;  // elements
  };
  for (const Case& c : {
           Case{"tiny", 64 * 176},                // h·i = 11,264 > V·h = 8,192
           Case{"tiny-gqa", 48 * 128},            // h·i = 6,144 > V·h = 4,608
           Case{"tiny-tied", 64 * 32 + 32 * 96},  // tied: V·h 2,048 + h·i 3,072
           Case{"tiny-awkward", 40 * 104},        // h·i = 4,160 > V·h = 2,840
           Case{"llama-7b", 32000ull * 4096},     // V·h = 131,072,000 > h·i
       })
    for (DType dt : {DType::bf16, DType::f32}) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      const ModelConfig m = preset(c.name);
      const TrainConfig t =
          train(3, 17, dt, Checkpointing::none, Attention::eager, Optimizer::lomo);
      const LayoutEstimate le = estimate_layout(m, t, layout(1, 1, 1, 0, m, t));
      ASSERT_EQ(le.ranks.size(), 1u);
      const u64 w = dt == DType::f32 ? 4 : 2;
      const MemoryFigures& f = le.ranks[0].est.figures;
      EXPECT_EQ(f.params, m.param_count() * w);
      EXPECT_EQ(f.optimizer_states, 0u);
      EXPECT_EQ(f.gradients, c.largest_gradient * w);
      EXPECT_EQ(f.inputs, 2u * 3 * 17 * 4);  // tokens and targets (b, s) int32
      EXPECT_EQ(le.ranks[0].shard_elements, m.param_count());
    }
}

TEST(AnalyticRank, ZeroStagesShardStatesWithPadding) {
  const ModelConfig m = preset("tiny-awkward");  // P = 54,920 is not a multiple of 3
  const TrainConfig t = train(2, 16);
  const u64 P = m.param_count();
  const u64 shard = (P + 2) / 3;  // padded so the three shards are equal
  ASSERT_NE(P % 3, 0u) << "pick a model whose parameter count needs padding";
  for (int zero = 0; zero <= 3; ++zero) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    const LayoutEstimate le = estimate_layout(m, t, layout(3, 1, 1, zero, m, t));
    ASSERT_EQ(le.ranks.size(), 1u);
    const RankEstimate& r = le.ranks[0];
    EXPECT_EQ(r.ranks, 3);
    EXPECT_EQ(r.local_params, P);
    const MemoryFigures& f = r.est.figures;
    EXPECT_EQ(f.params, (zero == 3 ? shard : P) * 2);
    EXPECT_EQ(f.gradients, (zero >= 2 ? shard : P) * 2);
    EXPECT_EQ(f.optimizer_states, (zero >= 1 ? shard : P) * 12);
    EXPECT_EQ(r.padding_elements, zero >= 1 ? shard * 3 - P : 0);
    // The reduce bucket (ZeRO-2/3): min(max(5e8, largest tensor), P) elements, here all of P.
    const u64 comm_at_start = r.est.instants.front().bytes[int(Category::communication)];
    EXPECT_EQ(comm_at_start, zero >= 2 ? P * 2 : 0);
  }
}

TEST(AnalyticRank, ZeroThreeGathersOneUnitPlusThePrefetchedOne) {
  const ModelConfig m = preset("llama-7b");
  const TrainConfig t = train(1, 512);
  ParallelConfig p = layout(8, 1, 1, 3, m, t);
  p.reduce_bucket = 1000;  // smaller than any tensor: the bucket is the largest tensor
  const LayoutEstimate le = estimate_layout(m, t, p);
  const RankEstimate& r = le.ranks[0];
  const u64 layer = layer_params_full(m) * 2;
  const u64 emb = u64(m.vocab) * m.hidden;
  const u64 bucket = emb * 2;  // the largest tensor is the embedding (or lm_head) matrix
  // In the first backward layer's steps: bucket + layer L-1 + the prefetched layer L-2.
  bool found = false;
  for (const auto& in : r.est.instants)
    if (in.name.find("backward layer L-1 step 1") == 0) {
      EXPECT_EQ(in.bytes[int(Category::communication)], bucket + 2 * layer);
      found = true;
    }
  EXPECT_TRUE(found);
  // At the end of forward: the head (final norm + head weight) and layer 31 prefetched.
  found = false;
  for (const auto& in : r.est.instants) {
    if (in.name.find("end of forward") == 0) {
      EXPECT_EQ(in.bytes[int(Category::communication)], bucket + (emb + m.hidden) * 2 + layer);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST(AnalyticRank, TensorParallelShardsHeadsAndIntermediate) {
  const ModelConfig m = preset("llama-7b");  // a = k = 32, i = 11008, V = 32000
  const u64 b = 2, s = 256, h = 4096, i = 11008, a = 32, V = 32000, w = 2, tp = 4;
  const TrainConfig t = train(b, s);
  const LayoutEstimate le = estimate_layout(m, t, layout(2, tp, 1, 0, m, t));
  const RankEstimate& r = le.ranks[0];
  EXPECT_EQ(r.ranks, 8);
  // Per layer: 2 rstd (b,s) f32; xn1, h_mid, xn2, out (b,s,h); q, k, v, attn_out (b,s,h/t);
  // probs (b,a/t,s,s); gate, up, act (b,s,i/t).
  const u64 per_layer = 2 * b * s * 4 + 4 * b * s * h * w + 4 * b * s * (h / tp) * w +
                        b * (a / tp) * s * s * w + 3 * b * s * (i / tp) * w;
  EXPECT_EQ(r.est.activations.per_layer_bytes, per_layer);
  const u64 head = b * s * h * w + b * s * 4 + b * s * (V / tp) * w + b * s * 4;
  EXPECT_EQ(r.est.figures.activations, b * s * h * w + 32 * per_layer + head);
  const u64 local = (V / tp) * h * 2 + 32 * (2 * h + 4 * h * (h / tp) + 3 * h * (i / tp)) + h;
  EXPECT_EQ(r.local_params, local);
  EXPECT_EQ(r.est.figures.params, local * w);
}

TEST(AnalyticRank, SequenceParallelShardsTheResidualStream) {
  const ModelConfig m = preset("llama-7b");
  const u64 b = 1, s = 512, h = 4096, i = 11008, a = 32, w = 2, tp = 8;
  const TrainConfig t = train(b, s);
  const LayoutEstimate le = estimate_layout(m, t, layout(1, tp, 1, 0, m, t, /*sp=*/true));
  const RankEstimate& r = le.ranks[0];
  // Korthikanti et al. Table 2, "sequence parallel" row, less dropout masks, with LLaMA's
  // tensors: everything divided by t except nothing (the residual stream too).
  const u64 per_layer = 2 * b * (s / tp) * 4 + 4 * b * (s / tp) * h * w + 4 * b * s * (h / tp) * w +
                        b * (a / tp) * s * s * w + 3 * b * s * (i / tp) * w;
  EXPECT_EQ(r.est.activations.per_layer_bytes, per_layer);
  // A gather / partial (b,s,h) buffer is alive at the first backward layer's step 1.
  bool found = false;
  for (const auto& in : r.est.instants) {
    if (in.name.find("backward layer L-1 step 1") == 0) {
      EXPECT_EQ(in.bytes[int(Category::communication)], b * s * h * w);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST(AnalyticRank, PipelineStagesHoldTheirInFlightMicroBatches) {
  const ModelConfig m = preset("llama-7b");
  const u64 b = 1, s = 256, h = 4096, w = 2, pp = 4, M = 8;
  const TrainConfig t = train(b, s, DType::bf16, Checkpointing::full);
  const LayoutEstimate le = estimate_layout(m, t, layout(2, 1, pp, 1, m, t, false, M));
  ASSERT_EQ(le.ranks.size(), pp);
  EXPECT_EQ(le.global_batch, b * M * 2);
  const u64 Ls = 32 / pp, X = b * s * h * w;
  for (u64 k = 0; k < pp; ++k) {
    const RankEstimate& r = le.ranks[k];
    SCOPED_TRACE("stage " + std::to_string(k));
    EXPECT_EQ(r.in_flight, std::int64_t(std::min(pp - k, M)));
    EXPECT_EQ(r.layers, std::int64_t(Ls));
    if (k + 1 < pp) {
      // Checkpointed: the stage input and Ls-1 outputs per micro-batch (the last one is sent).
      EXPECT_EQ(r.est.figures.activations, r.in_flight * Ls * X);
    }
  }
  EXPECT_EQ(le.ranks[0].role, "first");
  EXPECT_EQ(le.ranks[3].role, "last");
  EXPECT_EQ(le.ranks[0].est.figures.inputs, b * s * 4);  // tokens only
  EXPECT_EQ(le.ranks[1].est.figures.inputs, 0u);
  EXPECT_EQ(le.ranks[3].est.figures.inputs, b * s * 4);  // targets only
}

TEST(AnalyticRank, OffloadMovesStatesToTheHost) {
  const ModelConfig m = preset("tiny");
  const TrainConfig t = train(2, 32);
  ParallelConfig p = layout(2, 1, 1, 3, m, t);
  p.offload = Offload::optimizer_params;
  const LayoutEstimate le = estimate_layout(m, t, p);
  const RankEstimate& r = le.ranks[0];
  const u64 shard = (m.param_count() + 1) / 2;
  EXPECT_EQ(r.est.figures.params, 0u);
  EXPECT_EQ(r.est.figures.gradients, 0u);
  EXPECT_EQ(r.est.figures.optimizer_states, 0u);
  EXPECT_EQ(r.host_bytes, shard * 12 + shard * 4 + shard * 2);
}

TEST(AnalyticRank, OverheadsStateTheirSource) {
  ParallelConfig p;
  p.dp = 4;
  p.tp = 2;
  p.world = 8;
  const Overheads o = estimate_overheads(p, {});
  EXPECT_EQ(o.cuda_context, kCudaContextBytes);
  EXPECT_EQ(o.nccl, 2ull * 16 * 2 * 4194304);  // two communicators (dp, tp)
  EXPECT_NE(o.nccl_source.find("NCCL_BUFFSIZE"), std::string::npos);
  OverheadOptions given;
  given.nccl = 123;
  EXPECT_EQ(estimate_overheads(p, given).nccl, 123u);
  // A mixture of experts under tp: the experts' gradients have a group of their own (the stage's
  // 8 ranks) even at ep 1; with ep 2 the ep group too.
  EXPECT_EQ(estimate_overheads(p, {}, true).nccl, 3ull * 16 * 2 * 4194304);
  p.ep = 2;
  EXPECT_EQ(estimate_overheads(p, {}, true).nccl, 4ull * 16 * 2 * 4194304);
  // etp 2: its group too (edp 8/(2·2) = 2 still sums the experts' gradients); at etp 4 × ep 2
  // the experts' group is one rank: no communicator of its own.
  p.etp = 2;
  EXPECT_EQ(estimate_overheads(p, {}, true).nccl, 5ull * 16 * 2 * 4194304);
  p.etp = 4;
  EXPECT_EQ(estimate_overheads(p, {}, true).nccl, 4ull * 16 * 2 * 4194304);
}

TEST(AnalyticRank, BadLayoutsNameTheFlag) {
  const ModelConfig m = preset("llama-7b");
  const TrainConfig t = train(1, 512);
  ParallelConfig p;
  p.world = 8;
  p.dp = 3;
  EXPECT_NE(resolve_error(p, true, m, t).find("--world-size 8 must equal --dp × --tp × --pp"),
            std::string::npos);
  p = {};
  p.world = 6;
  p.tp = 4;
  EXPECT_NE(resolve_error(p, false, m, t).find("--world-size 6 is not divisible by --tp"),
            std::string::npos);
  p = {};
  p.world = 3;
  p.tp = 3;
  EXPECT_NE(resolve_error(p, false, m, t).find("--tp 3: the model's num_attention_heads"),
            std::string::npos);
  p = {};
  p.world = 3;
  p.pp = 3;
  EXPECT_NE(resolve_error(p, false, m, t).find("--pp 3: the model's num_hidden_layers"),
            std::string::npos);
  p = {};
  p.world = 2;
  p.sp = true;
  EXPECT_NE(resolve_error(p, false, m, t).find("--sp needs --tp 2 or more"), std::string::npos);
  p = {};
  p.world = 4;
  p.pp = 2;
  p.zero = 2;
  EXPECT_NE(resolve_error(p, false, m, t).find("--zero 2 with --pp 2"), std::string::npos);
  p = {};
  p.world = 2;
  p.offload = Offload::optimizer_params;
  p.zero = 2;
  EXPECT_NE(resolve_error(p, false, m, t).find("--offload optimizer+params needs --zero 3"),
            std::string::npos);
  p = {};
  p.world = 2;
  p.zero = 4;
  EXPECT_NE(resolve_error(p, false, m, t).find("--zero must be 0, 1, 2 or 3"), std::string::npos);
  p = {};
  p.world = 1;
  p.zero = 1;
  EXPECT_NE(resolve_error(p, false, m, t).find("needs data parallelism"), std::string::npos);
  const TrainConfig odd = train(1, 500);
  p = {};
  p.world = 8;
  p.tp = 8;
  p.sp = true;
  EXPECT_NE(resolve_error(p, false, m, odd).find("--seq 500 must be divisible by --tp"),
            std::string::npos);
  const TrainConfig lomo =
      train(1, 512, DType::bf16, Checkpointing::none, Attention::eager, Optimizer::lomo);
  p = {};
  p.world = 2;
  EXPECT_NE(resolve_error(p, false, m, lomo).find("--optimizer lomo"), std::string::npos);
}

// A mixture of experts per rank, written out by hand (docs/distributed.md, "Mixture of experts
// per rank"): tiny-qwen3-moe (h 64, a 4, kv 2, head_dim 24, V 103, 2 layers, 8 experts of width
// 36, top 2, q/k norms, untied), fp32, AdamW (8 B of states per element). Per layer: attention
// q (96,64) + k, v (48,64) each + o (64,96) = 18,432, q/k norms 2·24, norms 2·64, the router
// (8,64) = 512, the experts 8·3·36·64 = 55,296. The routed experts are one flat vector and the
// rest another, each sharded by ZeRO over the dp ranks (ep = etp = tp = 1: edp = dp).
TEST(AnalyticRank, MixtureOfExpertsShardsTheExpertsApart) {
  const ModelConfig m = preset("tiny-qwen3-moe");
  const TrainConfig t = train(1, 11, DType::f32);
  const u64 per_layer_dense = 18432 + 48 + 128 + 512, experts = 8 * 3 * 36 * 64;
  const u64 Pd = 2 * per_layer_dense + 2 * 103 * 64 + 64;  // + embedding, lm_head, final norm
  const u64 Pe = 2 * experts;
  ASSERT_EQ(Pd, 51488u);
  ASSERT_EQ(Pd + Pe, m.param_count());
  struct Row {
    std::int64_t dp;
    int zero;
    u64 dense_shard, expert_shard;
  };
  // dp 3: 51,488 = 3·17,162 + 2 pads the dense shard to 17,163; 110,592 = 3·36,864 divides.
  for (const Row& row : {Row{2, 1, 25744, 55296}, Row{2, 2, 25744, 55296}, Row{4, 1, 12872, 27648},
                         Row{3, 2, 17163, 36864}, Row{2, 0, Pd, Pe}}) {
    SCOPED_TRACE("dp " + std::to_string(row.dp) + " zero " + std::to_string(row.zero));
    const LayoutEstimate le = estimate_layout(m, t, layout(row.dp, 1, 1, row.zero, m, t));
    ASSERT_EQ(le.ranks.size(), 1u);
    const RankEstimate& r = le.ranks[0];
    EXPECT_EQ(r.local_params, Pd + Pe);
    EXPECT_EQ(r.expert_params, Pe);
    EXPECT_EQ(r.shard_elements, row.dense_shard);
    EXPECT_EQ(r.expert_shard_elements, row.expert_shard);
    EXPECT_EQ(r.padding_elements, row.zero >= 1 ? row.dense_shard * u64(row.dp) - Pd : 0);
    EXPECT_EQ(r.expert_padding_elements, row.zero >= 1 ? row.expert_shard * u64(row.dp) - Pe : 0);
    const MemoryFigures& f = r.est.figures;
    EXPECT_EQ(f.params, (Pd + Pe) * 4);
    EXPECT_EQ(f.gradients, (row.zero >= 2 ? row.dense_shard + row.expert_shard : Pd + Pe) * 4);
    EXPECT_EQ(f.optimizer_states, (row.dense_shard + row.expert_shard) * 8);
  }
  // The hand-worked figure of docs/distributed.md: dp 2, ZeRO-1, 648,320 B of states.
  EXPECT_EQ(estimate_layout(m, t, layout(2, 1, 1, 1, m, t)).ranks[0].est.figures.optimizer_states,
            648320u);
}

// Expert parallelism by hand (docs/distributed.md, "Expert parallelism"): the same tiny-qwen3-moe,
// b 1, s 11, fp32, AdamW. --ep 2 puts E/ep = 4 experts on a rank: Pe per rank = 2·4·3·36·64 =
// 55,296, the dense 51,488 whole. World 2 (dp 2 = ep, edp 1): params 106,784·4 = 427,136 B,
// ZeRO-1 states 8·(⌈51,488/2⌉ + 55,296) = 648,320 B (the experts unsharded: edp 1); world 4 (dp 4,
// edp 2): 8·(12,872 + 27,648) = 324,160 B. Balanced routing of nk = 22 choices over 8 experts:
// 3 to experts 0-5, 2 to 6-7; every rank of an ep group sends alike, so ep index 0 (experts 0-3)
// receives 2·12 = 24 rows and index 1 (experts 4-7) 2·10 = 20: two distinct ranks.
TEST(AnalyticRank, ExpertParallelismPlacesEOverEpExpertsPerRank) {
  const ModelConfig m = preset("tiny-qwen3-moe");
  const TrainConfig t = train(1, 11, DType::f32);
  ParallelConfig p;
  p.world = 2;
  p.ep = 2;
  p.zero = 1;
  p.resolve(false, m, t);
  const LayoutEstimate le = estimate_layout(m, t, p);
  const RankEstimate& r = le.ranks.at(0);
  EXPECT_EQ(r.local_params, 106784u);
  EXPECT_EQ(r.expert_params, 55296u);
  EXPECT_EQ(r.expert_shard_elements, 55296u);
  EXPECT_EQ(r.est.figures.params, 427136u);
  EXPECT_EQ(r.est.figures.gradients, 427136u);
  EXPECT_EQ(r.est.figures.optimizer_states, 648320u);
  p.world = 4;
  p.dp = 0;
  p.resolve(false, m, t);
  EXPECT_EQ(p.edp(), 2);
  EXPECT_EQ(estimate_layout(m, t, p).ranks.at(0).est.figures.optimizer_states, 324160u);
  // The rows each rank's experts take, in the trace's ledger (fp32: 4 B an element): the
  // dispatch buffer holds the rank's own 22 rows, expert_in/combine.send the received ones.
  for (std::int64_t grad_rank : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(grad_rank));
    const std::int64_t rows = grad_rank == 0 ? 24 : 20;
    MetaAllocator alloc;
    Ledger ledger(alloc);
    ShardedStep step(m, t, p, 0, ledger, nullptr, grad_rank);
    step.train_step();
    std::map<std::string, std::vector<std::int64_t>> shape;
    for (const TensorRecord& rec : ledger.tensors())
      if (rec.layer == 1) shape[rec.name] = rec.shape;
    using S = std::vector<std::int64_t>;
    EXPECT_EQ(shape["dispatch.send"], (S{22, 64}));
    EXPECT_EQ(shape["expert_in"], (S{rows, 64}));
    EXPECT_EQ(shape["expert_gate"], (S{rows, 36}));
    EXPECT_EQ(shape["expert_act"], (S{rows, 36}));
    EXPECT_EQ(shape["combine.send"], (S{rows, 64}));
    EXPECT_EQ(shape["expert_out"], (S{22, 64}));
    EXPECT_EQ(shape["d_expert_rows"], (S{rows, 64}));
    EXPECT_EQ(shape["d_expert_in"], (S{22, 64}));
    EXPECT_EQ(shape["model.layers.1.mlp.experts.gate_up_proj"], (S{4, 72, 64}));
    // The analytic of the same rank agrees with its trace (the grid in test_sharded_trace.cpp).
    const LayoutEstimate mine = estimate_layout_of_rank(m, t, p, grad_rank);
    EXPECT_EQ(measured_figures(ledger).activations_peak,
              mine.ranks.at(0).est.figures.activations_peak);
  }
}

// ZeRO-3 of a mixture of experts by hand (docs/distributed.md, "ZeRO-3 and offload of the
// experts"): tiny-qwen3-moe (h 64, a 4 and kv 2 heads of d 24, L 2, V 103 untied, E 8, K 2, m 36),
// world 4 = dp 4, --ep 2 (edp 2), bf16, AdamW, b 1, s 12. A layer's dense part: attention q 96·64,
// k and v 48·64 each, o 64·96 = 18,432, q/k norms 48, norms 128, router 8·64 = 512: 19,120; its 4
// local experts 4·3·36·64 = 27,648. Dense vector Pd = 2·19,120 + 2·103·64 + 64 = 51,488 over dp 4:
// 12,872 a rank; experts Pe = 2·27,648 = 55,296 over edp 2: 27,648. Params = gradients = (12,872 +
// 27,648)·2 = 81,040 B, states 40,520·12 = 486,240 B. The reduce bucket: min(max(5e8, largest),
// 106,784) = 106,784 elements, 213,568 B. Units: the embedding 6,592 el (13,184 B), a layer
// 19,120 + 27,648 = 46,768 el (93,536 B), the head 64 + 6,592 = 6,656 el (13,312 B). At
// --ep 1 (edp 4) the shards are the same (⌈110,592/4⌉ = 27,648) but a layer's unit holds all 8
// experts: 19,120 + 55,296 = 74,416 el, 148,832 B, and the bucket is the rank's 162,080
// parameters (324,160 B).
TEST(AnalyticRank, ZeroThreeShardsTheExpertsOverTheirGroup) {
  const ModelConfig m = preset("tiny-qwen3-moe");
  const TrainConfig t = train(1, 12);
  const u64 emb_unit = 13184, head_unit = 13312;
  for (const std::int64_t ep : {2, 1})
    for (const std::int64_t prefetch : {1, 0}) {
      SCOPED_TRACE("ep " + std::to_string(ep) + " prefetch " + std::to_string(prefetch));
      ParallelConfig p;
      p.world = 4;
      p.ep = ep;
      p.zero = 3;
      p.prefetch = prefetch;
      p.resolve(false, m, t);
      ASSERT_EQ(p.edp(), 4 / ep);
      const u64 layer_unit = ep == 2 ? 93536 : 148832, bucket = ep == 2 ? 213568 : 324160;
      const LayoutEstimate le = estimate_layout(m, t, p);
      const RankEstimate& r = le.ranks.at(0);
      EXPECT_EQ(r.shard_elements, 12872u);
      EXPECT_EQ(r.expert_shard_elements, 27648u);
      const MemoryFigures& f = r.est.figures;
      EXPECT_EQ(f.params, 81040u);
      EXPECT_EQ(f.gradients, 81040u);
      EXPECT_EQ(f.optimizer_states, 486240u);
      std::map<std::string, u64> comm;
      for (const TensorEntry& e : r.communication) comm[e.name] = e.bytes;
      EXPECT_EQ(comm["reduce_bucket"], bucket);
      EXPECT_EQ(comm["gathered units"], layer_unit);
      // The windows: at the end of forward the head (and, prefetching, layer 1); in the first
      // backward step of layer 1, layer 1 (and layer 0).
      std::map<std::string, u64> at;
      for (const auto& in : r.est.instants)
        for (const char* name : {"end of forward", "backward layer L-1 step 1"})
          if (in.name.rfind(name, 0) == 0) at[name] = in.bytes[int(Category::communication)];
      EXPECT_EQ(at["end of forward"], bucket + head_unit + u64(prefetch) * layer_unit);
      EXPECT_EQ(at["backward layer L-1 step 1"], bucket + (1 + u64(prefetch)) * layer_unit);
      // The trace's tensors (meta): each shard, and each unit as it is gathered.
      MetaAllocator alloc;
      Ledger ledger(alloc);
      ShardedStep step(m, t, p, 0, ledger, nullptr, 0);
      step.train_step();
      std::map<std::string, u64> bytes;
      for (const TensorRecord& rec : ledger.tensors()) bytes[rec.name] = rec.bytes;
      EXPECT_EQ(bytes["params.shard"], 12872u * 2);
      EXPECT_EQ(bytes["expert_params.shard"], 27648u * 2);
      EXPECT_EQ(bytes["expert_grads.shard"], 27648u * 2);
      EXPECT_EQ(bytes["gathered.embedding"], emb_unit);
      EXPECT_EQ(bytes["gathered.layer0"], layer_unit);
      EXPECT_EQ(bytes["gathered.layer1"], layer_unit);
      EXPECT_EQ(bytes["gathered.head"], head_unit);
    }
  // --offload (DeepSpeed's per-group offload): each shard's fp32 states (f = 12) and fp32
  // gradient shard on the host, (12,872 + 27,648)·(12 + 4) = 648,320 B, none on the GPU;
  // optimizer+params adds the bf16 parameter shards, 40,520·2 = 81,040 B (729,360 B), and the
  // GPU keeps no parameter at rest.
  for (const Offload off : {Offload::optimizer, Offload::optimizer_params}) {
    SCOPED_TRACE(offload_name(off));
    ParallelConfig p;
    p.world = 4;
    p.ep = 2;
    p.zero = 3;
    p.offload = off;
    p.resolve(false, m, t);
    const RankEstimate r = estimate_layout(m, t, p).ranks.at(0);
    const bool params = off == Offload::optimizer_params;
    EXPECT_EQ(r.host_bytes, params ? 729360u : 648320u);
    std::map<std::string, u64> host;
    for (const TensorEntry& e : r.host) host[e.name] = e.bytes;
    EXPECT_EQ(host["expert optimizer states"], 27648u * 12);
    EXPECT_EQ(host["expert gradient shard"], 27648u * 4);
    EXPECT_EQ(host.count("expert parameter shard"), params ? 1u : 0u);
    EXPECT_EQ(r.est.figures.gradients, 0u);
    EXPECT_EQ(r.est.figures.optimizer_states, 0u);
    EXPECT_EQ(r.est.figures.params, params ? 0u : 81040u);
  }
}

// A capacity per rank by hand (docs/distributed.md, "A capacity per rank"): tiny-qwen3-moe (E 8,
// K 2), b 1, s 12, --capacity-factor 0.5. One GPU: c = ⌈(12·2/8)·0.5⌉ = 2, the expert-ordered
// buffers E·c = 16 rows. At --cp 2 a rank routes its own 6 tokens: c = ⌈(6·2/8)·0.5⌉ = 1, 8
// rows; at dp 2 its 12 tokens, the one GPU's 16. (Megatron's get_capacity over the local tokens.)
TEST(AnalyticRank, CapacityFactorIsEachRanksOwn) {
  const ModelConfig m = preset("tiny-qwen3-moe");
  TrainConfig t = train(1, 12, DType::bf16, Checkpointing::none, Attention::flash);
  t.capacity_factor = 0.5;
  for (const std::int64_t cp : {1, 2}) {
    SCOPED_TRACE("cp " + std::to_string(cp));
    ParallelConfig p;
    p.world = 2;
    p.cp = cp;
    p.zero = 1;
    p.resolve(false, m, t);
    const std::int64_t rows = cp == 2 ? 8 : 16;
    MetaAllocator alloc;
    Ledger ledger(alloc);
    ShardedStep step(m, t, p, 0, ledger, nullptr, 0);
    step.train_step();
    std::map<std::string, std::vector<std::int64_t>> shape;
    for (const TensorRecord& rec : ledger.tensors())
      if (rec.layer == 1) shape[rec.name] = rec.shape;
    using S = std::vector<std::int64_t>;
    EXPECT_EQ(shape["expert_in"], (S{rows, 64}));
    EXPECT_EQ(shape["expert_gate"], (S{rows, 36}));
    EXPECT_EQ(shape["expert_out"], (S{rows, 64}));
    EXPECT_EQ(measured_figures(ledger).activations_peak,
              estimate_layout(m, t, p).ranks.at(0).est.figures.activations_peak);
  }
}

// A capacity under expert parallelism (docs/distributed.md, "A capacity per rank"): each source
// sends the choices its capacity keeps, so the experts' rows are the kept ones received, while the
// source's own buffers (dispatch.send, expert_out) stay E·c rows as on one GPU. tiny-qwen3-moe
// (h 64, E 8, K 2, m 36), bf16, b 1:
// - s 11, ep 2 (world 2): a rank's 22 choices go 3, 3, 3, 3, 3, 3, 2, 2 (balanced_routing).
//   C 0.5: c = ⌈(22/8)·0.5⌉ = 2, every expert keeps 2: A = 2·(4·2) = 16 on both indices (24 and
//   20 without it), E·c = 16. C 1.0: c = 3, nothing dropped: A = 2·12 = 24 on index 0, 2·10 = 20
//   on index 1, E·c = 24.
// - s 12, etp 2 at ep 1 (world 2): a rank's 24 choices go 3 to every expert. C 1.25:
//   c = ⌈3·1.25⌉ = 4, E·c = 32 rows of buffers, but only the 24 kept rows are gathered: A = 24,
//   R = 2·24 = 48 (not 2·32), of m/etp = 18 columns.
TEST(AnalyticRank, CapacityUnderExpertParallelismMovesTheKeptRows) {
  const ModelConfig m = preset("tiny-qwen3-moe");
  struct Case {
    std::int64_t seq, ep, etp;
    double C;
    std::int64_t slot, send, a, r, cols;
  };
  for (const Case& c :
       {Case{11, 2, 1, 0.5, 0, 16, 16, 16, 36}, Case{11, 2, 1, 0.5, 1, 16, 16, 16, 36},
        Case{11, 2, 1, 1.0, 0, 24, 24, 24, 36}, Case{11, 2, 1, 1.0, 1, 24, 20, 20, 36},
        Case{12, 1, 2, 1.25, 0, 32, 24, 48, 18}}) {
    SCOPED_TRACE("s " + std::to_string(c.seq) + " ep " + std::to_string(c.ep) + " etp " +
                 std::to_string(c.etp) + " C " + std::to_string(c.C) + " slot " +
                 std::to_string(c.slot));
    TrainConfig t = train(1, c.seq, DType::bf16, Checkpointing::none, Attention::flash);
    t.capacity_factor = c.C;
    ParallelConfig p;
    p.world = 2;
    p.ep = c.ep;
    p.etp = c.etp;
    p.zero = 1;
    p.resolve(false, m, t);
    MetaAllocator alloc;
    Ledger ledger(alloc);
    ShardedStep step(m, t, p, 0, ledger, nullptr, c.slot);
    step.train_step();
    std::map<std::string, std::vector<std::int64_t>> shape;
    for (const TensorRecord& rec : ledger.tensors())
      if (rec.layer == 1) shape[rec.name] = rec.shape;
    using S = std::vector<std::int64_t>;
    EXPECT_EQ(shape["dispatch.send"], (S{c.send, 64}));
    EXPECT_EQ(shape["expert_out"], (S{c.send, 64}));
    EXPECT_EQ(shape["expert_in"], (S{c.r, 64}));
    EXPECT_EQ(shape["expert_gate"], (S{c.r, c.cols}));
    if (c.etp > 1) {
      EXPECT_EQ(shape["combine.partial"], (S{c.r, 64}));
    }
    const auto& rows = step.expert_rows();
    ASSERT_FALSE(rows.empty());
    for (const auto& [key, n] : rows) {
      EXPECT_EQ(n.a, c.a);
      EXPECT_EQ(n.r, c.r);
    }
    const LayoutEstimate le = estimate_layout_of_rank(m, t, p, c.slot);
    const auto got = measured_figures(ledger);
    EXPECT_EQ(got.activations_peak, le.ranks.at(0).est.figures.activations_peak);
    EXPECT_EQ(got.peak, le.ranks.at(0).est.figures.peak);
  }
}

TEST(AnalyticRank, ExpertParallelFlagsNameTheirRule) {
  const TrainConfig t = train(1, 16);
  const ModelConfig moe = preset("tiny-qwen3-moe");
  ParallelConfig p;
  p.world = 2;
  p.ep = 0;
  EXPECT_NE(resolve_error(p, false, moe, t).find("--ep must be at least 1, got 0"),
            std::string::npos);
  p = {};
  p.world = 2;
  p.etp = -1;
  EXPECT_NE(resolve_error(p, false, moe, t).find("--etp must be at least 1, got -1"),
            std::string::npos);
  p = {};
  p.world = 2;
  p.ep = 2;
  EXPECT_NE(resolve_error(p, false, preset("tiny"), t)
                .find("--ep 2: tiny is not a mixture of experts (it has no routed experts"),
            std::string::npos);
  p = {};
  p.world = 3;
  p.ep = 3;
  EXPECT_NE(resolve_error(p, false, moe, t)
                .find("--ep 3: the model's num_experts (8) is not divisible by it"),
            std::string::npos);
  p = {};
  p.world = 6;
  p.ep = 4;
  EXPECT_NE(resolve_error(p, false, moe, t)
                .find("--ep 4 × --etp 1 = 4 does not divide the 6 ranks of a pipeline stage "
                      "(--world-size 6 / --pp 1 = dp·tp·cp)"),
            std::string::npos);
  p = {};
  p.world = 4;
  p.etp = 5;
  EXPECT_NE(resolve_error(p, false, moe, t)
                .find("--etp 5: the model's moe_intermediate_size (36) is not divisible by it"),
            std::string::npos);
  p = {};
  p.world = 2;
  p.ep = 4;  // more than the stage's ranks, before the product would be formed
  EXPECT_NE(resolve_error(p, false, moe, t).find("--ep 4 × --etp 1 does not divide the 2 ranks"),
            std::string::npos);
  // What the per-rank step does not model yet, each named with its flag.
  p = {};
  p.world = 2;
  p.zero = 3;
  EXPECT_EQ(resolve_error(p, false, moe, t), "(no error)");  // flat ZeRO-3 of the experts
  p.sharding = Sharding::per_parameter;
  EXPECT_NE(resolve_error(p, false, moe, t)
                .find("--sharding per-parameter (--fsdp2) with a mixture of experts (tiny-qwen3-"
                      "moe): FSDP2 of the experts"),
            std::string::npos);
  p = {};
  p.world = 2;
  p.offload = Offload::optimizer;
  p.zero = 1;
  EXPECT_EQ(resolve_error(p, false, moe, t), "(no error)");  // both shards on the host
  TrainConfig cap = t;
  cap.capacity_factor = 1.25;
  p = {};
  p.world = 2;
  EXPECT_EQ(resolve_error(p, false, moe, cap), "(no error)");  // each rank's own capacity
  p.ep = 2;
  EXPECT_EQ(resolve_error(p, false, moe, cap), "(no error)");  // each source's kept choices
  p.ep = 1;
  p.etp = 2;
  EXPECT_EQ(resolve_error(p, false, moe, cap), "(no error)");
  p.etp = 1;
  p.ep = 2;
  ModelConfig aux = moe;
  aux.output_router_logits = true;
  EXPECT_EQ(resolve_error(p, false, aux, t), "(no error)");  // each rank's own tokens (HF, DDP)
  for (const auto& [pp, cp] : {std::pair<int, int>{2, 1}, {1, 2}}) {
    p = {};
    p.world = 2;
    p.pp = pp;
    p.cp = cp;
    TrainConfig tf = t;
    tf.attention = Attention::flash;  // ring attention's
    EXPECT_NE(resolve_error(p, false, aux, tf)
                  .find("output_router_logits with --pp " + std::to_string(pp) + " --tp 1 --cp " +
                        std::to_string(cp) +
                        " with a mixture of experts (tiny-qwen3-moe): the "
                        "load-balancing loss of a rank's part of a model or sequence"),
              std::string::npos)
        << resolve_error(p, false, aux, tf);
  }
  // One GPU: --ep 1 is the default and changes nothing; the flags' rules hold there too.
  p = {};
  EXPECT_EQ(resolve_error(p, false, moe, t), "(no error)");
  p.ep = 2;
  EXPECT_NE(resolve_error(p, false, moe, t).find("does not divide the 1 ranks"), std::string::npos);
}

}  // namespace
}  // namespace trainmem
