// The per-rank trace (ShardedStep on meta, through the ledger) against the per-rank analytic
// profile (estimate_layout), byte for byte, over zero × tp × pp × sp × checkpointing × attention
// × optimizer × dtype × micro-batches × offload × prefetch on small shapes, and on the 70B-class
// presets. Two independent descriptions of docs/distributed.md's sharded step: the trace walks
// every layer and micro-batch, the closed form looks at a few instants.
#include <gtest/gtest.h>

#include <string>

#include "family_configs.hpp"
#include "layout_trace_helpers.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/sharded_step.hpp"

namespace trainmem {
namespace {

struct Case {
  std::string model;
  std::int64_t dp, tp, pp;
  int zero;
  bool sp;
  std::int64_t M;
  Checkpointing ck;
  Attention at;
  Optimizer opt;
  DType dt;
  Offload off = Offload::none;
  std::int64_t prefetch = 1;
  bool overlap = false;
  std::uint64_t bucket = kDefaultReduceBucket;
  std::int64_t b = 2, s = 16;
  std::string str() const {
    return model + " dp" + std::to_string(dp) + " tp" + std::to_string(tp) + " pp" +
           std::to_string(pp) + " z" + std::to_string(zero) + (sp ? " sp" : "") + " M" +
           std::to_string(M) + " " + checkpointing_name(ck) + " " + attention_name(at) + " " +
           optimizer_name(opt) + " " + dtype_name(dt) + " off=" + offload_name(off) + " pf" +
           std::to_string(prefetch) + (overlap ? " overlap" : "") + " bucket" +
           std::to_string(bucket);
  }
};

// Returns false when the layout does not divide the model (skipped).
bool check(const Case& c) {
  const ModelConfig m = test::any_config(c.model);
  TrainConfig t;
  t.batch = c.b;
  t.seq = c.s;
  t.dtype = c.dt;
  t.checkpointing = c.ck;
  t.attention = c.at;
  t.optimizer = c.opt;
  ParallelConfig p;
  p.world = c.dp * c.tp * c.pp;
  p.dp = c.dp;
  p.tp = c.tp;
  p.pp = c.pp;
  p.zero = c.zero;
  p.sp = c.sp;
  p.microbatches = c.M;
  p.offload = c.off;
  p.prefetch = c.prefetch;
  p.overlap_comm = c.overlap;
  p.reduce_bucket = c.bucket;
  try {
    p.resolve(true, m, t);
  } catch (const InputError&) {
    return false;
  }
  test::expect_trace_equals_layout(m, t, p, c.str());
  return true;
}

TEST(ShardedTrace, EqualsTheAnalyticProfilePerRankOverTheGrid) {
  int checked = 0;
  for (const char* model : {"tiny", "tiny-gqa", "tiny-tied"})
    for (std::int64_t tp : {1, 2})
      for (std::int64_t pp : {1, 2})
        for (std::int64_t dp : {1, 2, 3})
          for (int zero = 0; zero <= 3; ++zero)
            for (bool sp : {false, true})
              for (Checkpointing ck : {Checkpointing::none, Checkpointing::full})
                for (Attention at : {Attention::eager, Attention::flash})
                  for (std::int64_t M : {1, 3}) {
                    Case c{model, dp, tp, pp, zero, sp, M, ck, at, Optimizer::adamw, DType::bf16};
                    if (check(c)) ++checked;
                    if (HasFailure()) return;
                  }
  EXPECT_GT(checked, 300);
}

// The families (issue 16): q/k/v biases split with their columns, q/k norm weights replicated,
// Qwen3's q_pre/k_pre/q_rstd/k_rstd and its step-7 buffers, a decoupled head dim.
TEST(ShardedTrace, FamiliesOverTheGrid) {
  int checked = 0;
  for (const char* model :
       {"tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-llama3", "qwen3-narrow-mlp"})
    for (std::int64_t tp : {1, 2})
      for (std::int64_t pp : {1, 2})
        for (std::int64_t dp : {1, 2})
          for (int zero = 0; zero <= 3; ++zero)
            for (bool sp : {false, true})
              for (Checkpointing ck : {Checkpointing::none, Checkpointing::full})
                for (Attention at : {Attention::eager, Attention::flash})
                  for (std::int64_t M : {1, 3}) {
                    Case c{model, dp, tp, pp, zero, sp, M, ck, at, Optimizer::adamw, DType::bf16};
                    if (check(c)) ++checked;
                    if (HasFailure()) return;
                  }
  EXPECT_GT(checked, 300);
  const Case big[] = {
      {"qwen3-0.6b-2l", 2, 2, 1, 3, true, 1, Checkpointing::full, Attention::flash,
       Optimizer::adamw, DType::bf16, Offload::none, 1, false, kDefaultReduceBucket, 1, 256},
      {"qwen2-7b-2l", 2, 2, 2, 1, false, 4, Checkpointing::none, Attention::eager, Optimizer::sgd,
       DType::bf16, Offload::none, 1, false, kDefaultReduceBucket, 1, 128},
      {"mistral-7b-2l", 4, 1, 1, 2, false, 1, Checkpointing::none, Attention::flash,
       Optimizer::adamw, DType::f16, Offload::optimizer, 1, true, 100, 2, 128},
  };
  for (const Case& c : big) {
    EXPECT_TRUE(check(c)) << c.str();
    if (HasFailure()) return;
  }
}

TEST(ShardedTrace, OptimizersDtypesOffloadPrefetchBuckets) {
  int checked = 0;
  for (Optimizer o : {Optimizer::adamw, Optimizer::sgd})
    for (DType dt : {DType::bf16, DType::f16, DType::f32})
      for (int zero = 0; zero <= 3; ++zero)
        for (Offload off : {Offload::none, Offload::optimizer, Offload::optimizer_params})
          for (std::int64_t pf : {0, 1, 2, 5})
            for (bool overlap : {false, true})
              for (std::uint64_t bucket : {std::uint64_t(100), kDefaultReduceBucket}) {
                Case c{"tiny-gqa",       4, 1,  1,   zero, false,   2,     Checkpointing::full,
                       Attention::flash, o, dt, off, pf,   overlap, bucket};
                if (check(c)) ++checked;
                if (HasFailure()) return;
              }
  EXPECT_GT(checked, 100);
}

TEST(ShardedTrace, LargePresetsOnMeta) {
  // 70B-class layouts as users run them (the trace allocates nothing real on meta).
  const Case cases[] = {
      {"llama2-70b", 8, 1, 1, 3, false, 1, Checkpointing::full, Attention::flash, Optimizer::adamw,
       DType::bf16, Offload::none, 1, false, kDefaultReduceBucket, 1, 4096},
      {"llama2-70b", 2, 8, 2, 1, true, 8, Checkpointing::none, Attention::flash, Optimizer::adamw,
       DType::bf16, Offload::none, 1, false, kDefaultReduceBucket, 1, 4096},
      {"llama2-70b", 4, 4, 4, 1, false, 16, Checkpointing::full, Attention::eager, Optimizer::adamw,
       DType::bf16, Offload::optimizer, 1, false, kDefaultReduceBucket, 1, 2048},
      {"llama-7b", 8, 1, 1, 2, false, 1, Checkpointing::none, Attention::eager, Optimizer::adamw,
       DType::bf16, Offload::none, 1, true, kDefaultReduceBucket, 8, 512},
  };
  for (const Case& c : cases) {
    EXPECT_TRUE(check(c)) << c.str();
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace trainmem
