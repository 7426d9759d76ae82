// The per-rank trace (ShardedStep on meta, through the ledger) against the per-rank analytic
// profile (estimate_layout), byte for byte, over zero × tp × pp × sp × checkpointing × attention
// × optimizer × dtype × micro-batches × offload × prefetch on small shapes, and on the 70B-class
// presets. Two independent descriptions of docs/distributed.md's sharded step: the trace walks
// every layer and micro-batch, the closed form looks at a few instants.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
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
  // LoRA (docs/distributed.md, "LoRA per rank"): rank r on `targets` (0: a full fine-tune).
  std::int64_t lora_rank = 0;
  unsigned targets = 0;
  std::int64_t cp = 1;
  // QLoRA: the frozen projections as 4-bit weights (Quant::none: a 16-bit base).
  Quant quant = Quant::none;
  bool double_quant = true;
  std::int64_t blocksize = 64;
  double dropout = 0.0;   // LoRA dropout (each adapter's one-byte mask and dropped input)
  double capacity = 0.0;  // a MoE's --capacity-factor (0: none)
  std::string str() const {
    return model + " dp" + std::to_string(dp) + " tp" + std::to_string(tp) + " pp" +
           std::to_string(pp) + " z" + std::to_string(zero) + (sp ? " sp" : "") + " M" +
           std::to_string(M) + " " + checkpointing_name(ck) + " " + attention_name(at) + " " +
           optimizer_name(opt) + " " + dtype_name(dt) + " off=" + offload_name(off) + " pf" +
           std::to_string(prefetch) + (overlap ? " overlap" : "") + " bucket" +
           std::to_string(bucket) +
           (lora_rank ? " lora r" + std::to_string(lora_rank) + " t" + std::to_string(targets)
                      : "") +
           (cp > 1 ? " cp" + std::to_string(cp) : "") +
           (quant != Quant::none
                ? std::string(" ") + quant_name(quant) + (double_quant ? " dq" : "") + " bs" +
                      std::to_string(blocksize)
                : "") +
           (dropout > 0 ? " dropout" : "") +
           (capacity > 0 ? " capacity " + std::to_string(capacity) : "");
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
  t.lora_rank = c.lora_rank;
  t.lora_targets = c.targets;
  t.quant = c.quant;
  t.double_quant = c.double_quant;
  t.quant_blocksize = c.blocksize;
  t.lora_dropout = c.dropout;
  t.capacity_factor = c.capacity;
  ParallelConfig p;
  p.world = c.dp * c.tp * c.pp * c.cp;
  p.cp = c.cp;
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

// A mixture of experts per rank (docs/distributed.md, "Mixture of experts per rank"; ep = etp =
// tp = 1): the routed experts in a flat vector of their own beside the others', Qwen's dense
// layers among the MoE ones (uneven pipeline stages: tiny-qwen2-moe at pp 3 has a stage of dense
// layers only), the shared expert, and the skewed shapes whose every MoE instant decides some
// figure on one GPU, over dp, pp, cp, ZeRO 0-2, micro-batches, checkpointing and attention.
TEST(ShardedTrace, MixtureOfExpertsOverTheGrid) {
  int checked = 0;
  for (const char* model :
       {"tiny-mixtral", "tiny-qwen3-moe", "tiny-qwen2-moe", "moe-wide-router", "moe-wide-shared",
        "moe-mixed-dense-first", "moe-mixed-router-first", "tiny-qwen3-moe-mixed"})
    for (std::int64_t pp : {1, 2, 3})
      for (std::int64_t dp : {1, 2, 3})
        for (std::int64_t cp : {1, 2})
          for (int zero = 0; zero <= 3; ++zero)
            for (Checkpointing ck : {Checkpointing::none, Checkpointing::full})
              for (Attention at : {Attention::eager, Attention::flash})
                for (std::int64_t M : {1, 3}) {
                  Case c{model, dp, 1, pp, zero, false, M, ck, at, Optimizer::adamw, DType::bf16};
                  c.cp = cp;
                  if (check(c)) ++checked;
                  if (HasFailure()) return;
                }
  EXPECT_GT(checked, 400);
  // Optimizers, dtypes and the reduce bucket (100 elements: each gradient alone, the bucket the
  // largest tensor, here an experts' gate_up_proj or the 64-expert router), with --overlap-comm.
  int more = 0;
  for (const char* model : {"tiny-qwen2-moe", "moe-wide-router", "moe-wide-shared"})
    for (Optimizer o : {Optimizer::adamw, Optimizer::sgd})
      for (DType dt : {DType::bf16, DType::f32})
        for (int zero = 0; zero <= 3; ++zero)
          for (bool overlap : {false, true})
            for (std::uint64_t bucket : {std::uint64_t(100), kDefaultReduceBucket}) {
              Case c{model,
                     3,
                     1,
                     1,
                     zero,
                     false,
                     2,
                     Checkpointing::full,
                     Attention::flash,
                     o,
                     dt,
                     Offload::none,
                     1,
                     overlap,
                     bucket};
              if (check(c)) ++more;
              if (HasFailure()) return;
            }
  EXPECT_EQ(more, 3 * 2 * 2 * 4 * 2 * 2);
}

// The MoE grids' walk: every layout of models × eps × dps × cp {1, 2} × pp {1, 2} × ZeRO 0-2 ×
// checkpointing none/full × micro-batches {1, 3} at tensor-parallel degree tp (with sp above 1,
// the tiny presets' prime vocabularies made even) that resolves, b 1, s 12; every slot of the
// stage (gradient index · tp + tp index) traced against its analytic byte for byte, slot 0
// (expert-parallel index 0) receiving the most rows. "moe-wide-experts" is tiny-qwen3-moe with
// experts of width 96; "moe-wide-shared" and "moe-mid-shared" tiny-qwen2-moe with a shared expert
// of width 288 and 240 (and 8, "moe-narrow-shared", at tp 4): at tp 2 (sp) the shared expert's
// backward decides most of their peaks, at
// its SwiGLU backward (3 (b,s,m_s/t) buffers) when m_s/tp > 2h, else at its input gradient's
// partial with xn2 gathered (2 of them and 2 (b,s,h)). Counts the layouts checked and those whose
// slots' peaks differ.
struct GridCounts {
  int checked = 0, differ = 0;
  std::set<std::string> peaks;  // "model: instant" of the analytic's peaks, every stage and slot
  // Whether an instant naming `part` was a peak (of `model`'s layouts when given).
  bool peaked_at(const std::string& part, const std::string& model = "") const {
    for (const std::string& p : peaks)
      if (p.find(part) != std::string::npos && (model.empty() || p.rfind(model + ": ", 0) == 0))
        return true;
    return false;
  }
};
GridCounts moe_grid(std::initializer_list<const char*> models,
                    std::initializer_list<std::int64_t> eps,
                    std::initializer_list<std::int64_t> dps, std::int64_t tp, std::int64_t etp = 1,
                    std::initializer_list<int> zeros = {0, 1, 2},
                    std::initializer_list<std::int64_t> prefetches = {1},
                    std::initializer_list<Offload> offloads = {Offload::none},
                    double capacity = 0.0) {
  GridCounts n;
  for (const std::string model : models)
    for (std::int64_t ep : eps)
      for (std::int64_t dp : dps)
        for (std::int64_t cp : {1, 2})
          for (std::int64_t pp : {1, 2})
            for (int zero : zeros)
              for (std::int64_t prefetch : prefetches)
                for (Offload off : offloads)
                  for (Checkpointing ck : {Checkpointing::none, Checkpointing::full})
                    for (std::int64_t M : {1, 3}) {
                      const bool shared = model == "moe-wide-shared" || model == "moe-mid-shared" ||
                                          model == "moe-narrow-shared";
                      ModelConfig m =
                          test::any_config(model == "moe-wide-experts"    ? "tiny-qwen3-moe"
                                           : shared || model == "moe-aux" ? "tiny-qwen2-moe"
                                                                          : model);
                      if (model == "moe-wide-experts") m.expert_intermediate = 96;
                      // output_router_logits (dp, ep, etp only)
                      if (model == "moe-aux") m.output_router_logits = true;
                      if (shared)
                        m.shared_expert_intermediate = model == "moe-wide-shared"  ? 288
                                                       : model == "moe-mid-shared" ? 240
                                                                                   : 8;
                      if (tp > 1) m.vocab = 96;
                      TrainConfig t;
                      t.batch = 1;
                      t.seq = 12;
                      t.dtype = DType::bf16;
                      t.checkpointing = ck;
                      t.attention = Attention::flash;
                      t.capacity_factor = capacity;
                      ParallelConfig p;
                      p.tp = tp;
                      p.sp = tp > 1;
                      p.world = dp * pp * cp * tp;
                      p.dp = dp;
                      p.pp = pp;
                      p.cp = cp;
                      p.ep = ep;
                      p.etp = etp;
                      p.zero = zero;
                      p.prefetch = prefetch;
                      p.offload = off;
                      p.microbatches = M;
                      try {
                        p.resolve(true, m, t);
                      } catch (const InputError&) {
                        continue;
                      }
                      std::uint64_t first_peak = 0;
                      bool differ = false;
                      for (std::int64_t slot = 0; slot < p.grad_ranks() * tp; ++slot) {
                        const std::string what =
                            model + " tp" + std::to_string(tp) + " etp" + std::to_string(etp) +
                            " ep" + std::to_string(ep) + " dp" + std::to_string(dp) + " cp" +
                            std::to_string(cp) + " pp" + std::to_string(pp) + " z" +
                            std::to_string(zero) + " pf" + std::to_string(prefetch) +
                            " off=" + offload_name(off) + " " + checkpointing_name(ck) + " M" +
                            std::to_string(M) + " slot " + std::to_string(slot) +
                            (capacity > 0 ? " C " + std::to_string(capacity) : "");
                        const LayoutEstimate le =
                            test::expect_trace_equals_layout(m, t, p, what, slot);
                        if (::testing::Test::HasFailure()) return n;
                        for (const RankEstimate& r : le.ranks)
                          n.peaks.insert(model + ": " +
                                         r.est.instants.at(std::size_t(r.est.peak_instant)).name);
                        const std::uint64_t peak = le.ranks.at(0).est.figures.peak;
                        if (slot == 0) first_peak = peak;
                        differ |= peak != first_peak;
                        EXPECT_LE(peak, first_peak) << what << ": index 0 receives the most rows";
                      }
                      ++n.checked;
                      n.differ += differ;
                    }
  return n;
}

// Expert parallelism (--ep; docs/distributed.md, "Expert parallelism"): E/ep experts per rank,
// their states sharded over edp = dp·cp/ep, the dispatch and combine buffers and the received
// rows, every rank of the gradient group (the expert-parallel indices receive different rows
// when nk = b·s·K is not a multiple of E); s 12 (cp 2: 6 tokens a rank) leaves remainders for
// every E here. "moe-wide-experts" (h < m < 2h) makes backward step 1's d_expert_act instant the
// peak (R·m > nk·h); on the others d_expert_out's is, and the widest workspace is
// d_expert_rows_in's. (The dispatch and combine instants, forward and recompute, never exceed
// step 1's and decide no compared figure: they complete the timeline.) "moe-aux" is
// tiny-qwen2-moe with output_router_logits: the load-balancing loss's (E) f32 gradient in each
// router backward (dp, ep, etp only: its cp and pp layouts are refused and skipped).
TEST(ShardedTrace, ExpertParallelEveryRankOverTheGrid) {
  const GridCounts n =
      moe_grid({"tiny-qwen3-moe", "tiny-qwen2-moe", "tiny-mixtral", "moe-wide-router",
                "moe-mixed-dense-first", "tiny-qwen3-moe-mixed", "moe-wide-experts", "moe-aux"},
               {2, 3, 4, 5, 8}, {2, 4, 6}, 1);
  EXPECT_GT(n.checked, 300);
  EXPECT_GT(n.differ, 50);  // the grid's remainders make ranks differ, or it tests little
  // output_router_logits is modelled at dp and ep: its layouts were traced, not refused.
  EXPECT_TRUE(n.peaked_at("", "moe-aux"));
}

// A mixture of experts under tensor parallelism (--tp with --sp; docs/distributed.md, "Tensor
// parallelism of a mixture of experts"): the attention split by tp, each tensor-parallel rank
// routing its own s/tp rows (no gather before the router), whole experts placed by ep over the
// stage's dp·tp·cp slots, their states over edp = dp·tp·cp/ep; every slot of the stage traced.
// Qwen2-MoE's shared expert split like the dense MLP (its gate/up over the gathered rows, down
// reduce-scattered into the rank's rows).
TEST(ShardedTrace, MixtureOfExpertsUnderTensorParallelism) {
  const GridCounts n =
      moe_grid({"tiny-qwen3-moe", "tiny-mixtral", "tiny-qwen3-moe-mixed", "moe-wide-experts",
                "tiny-qwen2-moe", "moe-wide-shared", "moe-mid-shared"},
               {1, 2, 4, 5}, {1, 2}, 2);
  EXPECT_GT(n.checked, 150);
  EXPECT_GT(n.differ, 10);  // the tensor-parallel ranks of an ep group receive different rows
  std::printf("[moe tp grid] %d layouts, the slots' peaks differing in %d\n", n.checked, n.differ);
  // The shared expert's instants under sp are compared where they decide the peak.
  EXPECT_TRUE(n.peaked_at("d_shared_gate, d_shared_up", "moe-wide-shared"));
  EXPECT_TRUE(n.peaked_at("d_shared_in.partial", "moe-mid-shared"));
  // At tp 4 a narrow shared expert (m_s 8: 2 columns a rank) under full checkpointing peaks at
  // the recompute's shared down projection (its (b,s,h) partial beside d_residual).
  const GridCounts narrow = moe_grid({"moe-narrow-shared"}, {1, 2}, {1}, 4);
  EXPECT_GT(narrow.checked, 5);
  EXPECT_TRUE(narrow.peaked_at("step 0: recompute's shared expert's", "moe-narrow-shared"));
}

// Expert tensor parallelism (--etp; docs/distributed.md, "Expert tensor parallelism"): each
// expert's width split etp ways over consecutive slots, the rows the ep all-to-all brings (A)
// gathered over the etp group (R = etp·A under balanced routing), the down projections' partial
// outputs reduce-scattered back; every slot of the stage traced against its analytic over
// (tp, etp) (1, 2), (2, 2), (1, 4), (2, 4) × ep 1/2/4 × dp × cp × pp × ZeRO 0-2 × checkpointing
// × micro-batches. "moe-wide-experts" has h < m (the experts' rows, not the gathered ones, decide
// step 1); on the others (m < h) the gathered d_expert_rows beside d_expert_rows.recv is step 1's
// largest instant under ep > 1, which the test asserts decides some peaks.
TEST(ShardedTrace, ExpertTensorParallelEveryRankOverTheGrid) {
  GridCounts all;
  for (const auto& [tp, etp] :
       {std::pair<std::int64_t, std::int64_t>{1, 2}, {2, 2}, {1, 4}, {2, 4}}) {
    const GridCounts n = moe_grid(
        {"tiny-qwen3-moe", "tiny-mixtral", "tiny-qwen2-moe", "moe-wide-experts", "moe-aux"},
        {1, 2, 4}, {1, 2, 4}, tp, etp);
    if (::testing::Test::HasFailure()) return;
    EXPECT_GT(n.checked, 20) << "tp " << tp << " etp " << etp;
    all.checked += n.checked;
    all.differ += n.differ;
    all.peaks.insert(n.peaks.begin(), n.peaks.end());
  }
  std::printf("[moe etp grid] %d layouts, the slots' peaks differing in %d\n", all.checked,
              all.differ);
  EXPECT_GT(all.differ, 10);
  EXPECT_TRUE(all.peaked_at("d_expert_rows (the received rows gathered over etp)"));
}

// ZeRO-3 of a mixture of experts (docs/distributed.md, "ZeRO-3 and offload of the experts"): the
// experts' vector sharded over the expert-data-parallel ranks (edp = dp·tp·cp/(ep·etp)), each MoE
// layer's unit holding its dense part and the rank's E/ep experts of m/etp columns, gathered
// --prefetch 0 or 2 units ahead (1 in the offload rows and MixtureOfExpertsOverTheGrid); every slot
// of the stage traced against its analytic over (tp, etp) (1, 1), (2, 1), (1, 2), (2, 2) × ep 1/2/4
// × dp × cp × checkpointing × micro-batches (ZeRO-3 runs without pipelining), edp = 1 layouts
// included.
TEST(ShardedTrace, ZeroThreeOfTheExpertsEveryRankOverTheGrid) {
  GridCounts all;
  for (const auto& [tp, etp] :
       {std::pair<std::int64_t, std::int64_t>{1, 1}, {2, 1}, {1, 2}, {2, 2}}) {
    const GridCounts n =
        moe_grid({"tiny-qwen3-moe", "tiny-qwen2-moe", "tiny-mixtral", "moe-wide-experts"},
                 {1, 2, 4}, {1, 2, 4}, tp, etp, {3}, {0, 2});
    if (::testing::Test::HasFailure()) return;
    EXPECT_GT(n.checked, 20) << "tp " << tp << " etp " << etp;
    all.checked += n.checked;
    all.differ += n.differ;
  }
  std::printf("[moe zero-3 grid] %d layouts, the slots' peaks differing in %d\n", all.checked,
              all.differ);
  EXPECT_GT(all.differ, 10);
  // --offload optimizer (ZeRO 1-3) and optimizer+params (ZeRO-3): both shards' states and
  // gradients leave the GPU (and under optimizer+params both parameter shards).
  for (const auto& [tp, etp] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {2, 2}}) {
    const GridCounts n = moe_grid({"tiny-qwen3-moe", "tiny-qwen2-moe"}, {1, 2}, {2, 4}, tp, etp,
                                  {1, 2, 3}, {1}, {Offload::optimizer, Offload::optimizer_params});
    if (::testing::Test::HasFailure()) return;
    EXPECT_GT(n.checked, 20) << "offload, tp " << tp << " etp " << etp;
  }
}

// --capacity-factor per rank (docs/distributed.md, "A capacity per rank"): each rank's capacity
// c = ⌈(n·K/E)·C⌉ over its own n tokens (b·s/cp, /tp under sp), its own expert-ordered buffers
// E·c rows; under ep or etp each source sends the choices its capacity keeps, so the experts'
// rows are ep·Σ_e min(count_e, c) (AnalyticRank.CapacityUnderExpertParallelismMovesTheKeptRows
// works them by hand). Every slot traced over ep 1/2/4 × dp × cp × pp × ZeRO 0-3 ×
// checkpointing × micro-batches with tp 1 and tp 2 sp, C 0.5 (tokens dropped) and 1.25 (rows
// padded); then etp 2 (tp 1 and 2) at both, where the gathered rows are the kept ones, not E·c.
TEST(ShardedTrace, CapacityPerRankOverTheGrid) {
  int checked = 0;
  for (const std::int64_t tp : {1, 2})
    for (const double C : {0.5, 1.25}) {
      const GridCounts n = moe_grid({"tiny-qwen3-moe", "tiny-qwen2-moe", "tiny-mixtral"}, {1, 2, 4},
                                    {1, 2, 3}, tp, 1, {0, 1, 2, 3}, {1}, {Offload::none}, C);
      if (::testing::Test::HasFailure()) return;
      checked += n.checked;
    }
  for (const std::int64_t tp : {1, 2})
    for (const double C : {0.5, 1.25}) {
      const GridCounts n = moe_grid({"tiny-qwen3-moe", "tiny-qwen2-moe"}, {1, 2}, {1, 2, 4}, tp, 2,
                                    {0, 1, 3}, {1}, {Offload::none}, C);
      if (::testing::Test::HasFailure()) return;
      EXPECT_GT(n.checked, 20) << "etp 2, tp " << tp << ", C " << C;
      checked += n.checked;
    }
  std::printf("[moe capacity grid] %d layouts\n", checked);
  EXPECT_GT(checked, 500);
}

// The recompute's FLOPs of a MoE layer under tp with sp, by hand (docs/formulas.md, "Recompute
// FLOPs"): tiny-qwen3-moe (h 64, a 4 and k 2 heads of d 24, E 8, K 2, m 36, two MoE layers) at
// tp 2, b 1, s 12, every layer checkpointed. Per layer: q, k, v, o over b·s rows, 2·12·(64·48 +
// 2·64·24 + 48·64) = 221,184; the router over the rank's b·s/tp = 6 rows, 2·6·64·8 = 6,144; the
// experts over its 6·2 = 12 routed rows, 2·12·3·64·36 = 165,888; attention 4·1·2·12²·24 =
// 27,648: 420,864 a layer, 841,728 for two. Under --etp 2 a rank computes twice the rows over half
// the columns: the same.
TEST(ShardedTrace, RecomputeFlopsOfAMixtureOfExpertsUnderTensorParallelism) {
  ModelConfig m = test::any_config("tiny-qwen3-moe");
  m.vocab = 96;
  TrainConfig t;
  t.batch = 1;
  t.seq = 12;
  t.attention = Attention::flash;
  t.checkpointing = Checkpointing::full;
  for (const std::int64_t etp : {1, 2}) {
    ParallelConfig p;
    p.world = 2 * etp;
    p.dp = etp;
    p.tp = 2;
    p.sp = true;
    p.etp = etp;
    p.resolve(true, m, t);
    EXPECT_DOUBLE_EQ(estimate_layout_of_rank(m, t, p, 0).ranks.at(0).est.recompute_flops, 841728.0)
        << "etp " << etp;
  }
}

// The shared expert's width is split by tp like intermediate_size: a width tp does not divide is
// refused naming the flag and the field (tp 4 divides every other of tiny-qwen2-moe's, V 96).
TEST(ShardedTrace, ASharedExpertWidthTpDoesNotDivideIsRefused) {
  ModelConfig m = test::any_config("tiny-qwen2-moe");
  m.vocab = 96;
  m.shared_expert_intermediate = 70;
  TrainConfig t;
  t.batch = 1;
  t.seq = 12;
  t.attention = Attention::flash;
  ParallelConfig p;
  p.world = 4;
  p.tp = 4;
  p.sp = true;
  try {
    p.resolve(true, m, t);
    ADD_FAILURE() << "tp 4 with a shared expert of width 70 resolved";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--tp 4: the model's shared_expert_intermediate_size (70) "
                                         "is not divisible by it"),
              std::string::npos)
        << e.what();
  }
  m.shared_expert_intermediate = 72;
  EXPECT_NO_THROW(p.resolve(true, m, t));
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

namespace trainmem {
namespace {

// LoRA per rank: the frozen base whole on every rank (ZeRO-3: its own flat vector, sharded and
// gathered with the adapters per unit), the adapters' gradients and states sharded by ZeRO 1-3,
// split by tp (a column target's B and a row target's A), the recompute's rows, the reduce
// bucket of adapter gradients; over targets, ranks, layouts and both optimizers.
TEST(ShardedTrace, LoraOverTheGrid) {
  int checked = 0;
  const unsigned qv = 1u | 4u, all = 0x7fu, o_down = 8u | 64u;
  for (const char* model : {"tiny-gqa", "tiny-tied", "tiny-qwen2", "tiny-qwen3"})
    for (unsigned targets : {qv, all, o_down})
      for (std::int64_t tp : {1, 2})
        for (std::int64_t pp : {1, 2})
          for (std::int64_t dp : {1, 3})
            for (int zero = 0; zero <= 3; ++zero)
              for (Checkpointing ck : {Checkpointing::none, Checkpointing::full})
                for (std::int64_t M : {1, 3}) {
                  Case c{model,
                         dp,
                         tp,
                         pp,
                         zero,
                         false,
                         M,
                         ck,
                         Attention::eager,
                         Optimizer::adamw,
                         DType::bf16};
                  c.lora_rank = targets == all ? 4 : 8;
                  c.targets = targets;
                  c.opt = (dp + zero) % 2 ? Optimizer::sgd : Optimizer::adamw;
                  c.at = ck == Checkpointing::full ? Attention::flash : Attention::eager;
                  if (check(c)) ++checked;
                  if (HasFailure()) return;
                }
  EXPECT_GT(checked, 650);
  // Context parallelism, fp32 and fp16, offload of the adapters' states, a bucket smaller than
  // an adapter, overlap, and the larger presets on meta.
  Case more[] = {
      {"tiny-gqa", 2, 1, 1, 1, false, 1, Checkpointing::none, Attention::flash, Optimizer::adamw,
       DType::f32},
      {"tiny-gqa", 2, 2, 1, 2, false, 2, Checkpointing::full, Attention::flash, Optimizer::adamw,
       DType::f16, Offload::optimizer, 1, true, 100},
      {"tiny-gqa", 4, 1, 1, 2, false, 1, Checkpointing::none, Attention::eager, Optimizer::sgd,
       DType::bf16, Offload::none, 1, false, 10},
      {"mistral-7b-2l", 4, 2, 1, 2, false, 1, Checkpointing::full, Attention::flash,
       Optimizer::adamw, DType::bf16, Offload::none, 1, false, kDefaultReduceBucket, 1, 512},
      {"qwen2-7b-2l", 2, 1, 2, 1, false, 4, Checkpointing::none, Attention::flash, Optimizer::adamw,
       DType::bf16, Offload::none, 1, false, kDefaultReduceBucket, 1, 256},
  };
  for (Case& c : more) {
    c.lora_rank = 16;
    c.targets = all;
    EXPECT_TRUE(check(c)) << c.str();
    if (HasFailure()) return;
  }
  Case cp{"tiny-gqa",       2,          1, 1, 1, false, 1, Checkpointing::full, Attention::flash,
          Optimizer::adamw, DType::bf16};
  cp.lora_rank = 4;
  cp.targets = qv;
  cp.cp = 2;
  EXPECT_TRUE(check(cp)) << cp.str();
  // LoRA dropout per rank (dp, pp; refused under tp): the masks and the dropped inputs, in the
  // forward, the recompute and the backward.
  int dropped = 0;
  for (std::int64_t pp : {1, 2})
    for (Checkpointing ck : {Checkpointing::none, Checkpointing::full})
      for (unsigned targets : {qv, all, o_down}) {
        Case c{"tiny-qwen2",     2,          1, pp, 1, false, 3, ck, Attention::eager,
               Optimizer::adamw, DType::bf16};
        c.lora_rank = 4;
        c.targets = targets;
        c.dropout = 0.1;
        if (check(c)) ++dropped;
        if (HasFailure()) return;
      }
  EXPECT_EQ(dropped, 12);
}

}  // namespace
}  // namespace trainmem

namespace trainmem {
namespace {

// QLoRA per rank (tp 1): the 4-bit tensors of the frozen projections on every rank of the
// gradient group, the dequantize workspace of each GEMM, the adapters sharded; over targets,
// pp, dp, ZeRO 0-2, checkpointing, micro-batches, double quantization and blocksizes, nf4, fp4
// and the int8 base, and a 7B-class shape.
TEST(ShardedTrace, QloraOverTheGrid) {
  int checked = 0;
  for (const char* model : {"tiny-gqa", "tiny-qwen2", "tiny-qwen3"})
    for (unsigned targets : {1u | 4u, 0x7fu})
      for (std::int64_t pp : {1, 2})
        for (std::int64_t dp : {1, 2})
          for (int zero = 0; zero <= 2; ++zero)
            for (Checkpointing ck : {Checkpointing::none, Checkpointing::full})
              for (std::int64_t M : {1, 3})
                for (bool dq : {true, false}) {
                  Case c{
                      model,      dp, 1, pp, zero, false, M, ck, Attention::flash, Optimizer::adamw,
                      DType::bf16};
                  c.lora_rank = 4;
                  c.targets = targets;
                  // nf4 with double quantization; without, fp4 or the int8 base in turn.
                  c.quant = dq ? Quant::nf4 : M == 1 ? Quant::fp4 : Quant::int8;
                  c.double_quant = dq;
                  c.blocksize = dq ? 64 : 128;
                  if (check(c)) ++checked;
                  if (HasFailure()) return;
                }
  EXPECT_GT(checked, 150);
  Case big{"mistral-7b-2l",
           4,
           1,
           1,
           2,
           false,
           1,
           Checkpointing::full,
           Attention::flash,
           Optimizer::adamw,
           DType::bf16,
           Offload::none,
           1,
           false,
           kDefaultReduceBucket,
           1,
           1024};
  big.lora_rank = 16;
  big.targets = 0x7fu;
  big.quant = Quant::nf4;
  EXPECT_TRUE(check(big)) << big.str();
  // A layout the sharded step refuses is refused alike by the analytic profile (tp 2).
  Case tp{"tiny-gqa",       1,          2, 1, 0, false, 1, Checkpointing::none, Attention::flash,
          Optimizer::adamw, DType::bf16};
  tp.lora_rank = 4;
  tp.targets = 0x7fu;
  tp.quant = Quant::nf4;
  EXPECT_FALSE(check(tp));
}

}  // namespace
}  // namespace trainmem
