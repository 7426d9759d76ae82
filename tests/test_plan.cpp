// `trainmem plan` (include/trainmem/analytic/plan.hpp, docs/plan.md): the enumeration counts its
// layouts on a tiny model as counted by hand, the cost model's figures equal hand-computed ones, a
// layout is kept iff its worst rank's peak + overheads fits the budget (also against a brute
// force over every layout, which the binary search over b must not change), rejected families
// carry their reasons, and bad options are refused naming the flag. The memory side is mostly a
// stand-in estimator, so the tests pin the enumeration and not estimate_layout's figures; the
// search over b is also checked against a brute force with estimate_layout itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <tuple>

#include "trainmem/analytic/analytic.hpp"
#include "trainmem/analytic/plan.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/lora.hpp"

namespace trainmem {
namespace {

ModelConfig tiny() {
  return *find_preset("tiny");  // V 128, h 64, i 176, L 2, a 4, k 4
}

// A stand-in for estimate_layout: one rank per stage, a peak monotone in b·min(pp, M) (as the
// real one), smaller with tp, ZeRO, checkpointing and flash; 100 bytes of overheads.
LayoutEstimate fake(const ModelConfig& m, const TrainConfig& t, const ParallelConfig& p,
                    const OverheadOptions&) {
  LayoutEstimate e;
  e.layout = p;
  e.model = m;
  e.train = t;
  const std::uint64_t in_flight = static_cast<std::uint64_t>(std::min(p.pp, p.microbatches));
  const std::uint64_t acts = 1000 * static_cast<std::uint64_t>(t.batch) * in_flight *
                             (t.checkpointing == Checkpointing::full ? 1 : 3) *
                             (t.attention == Attention::eager ? 2 : 1) /
                             static_cast<std::uint64_t>(p.tp);
  const std::uint64_t states = 12000 / static_cast<std::uint64_t>(p.tp * p.pp) /
                               (p.zero >= 1 ? p.dp : 1) / (p.offload == Offload::none ? 1 : 2);
  for (std::int64_t s = 0; s < p.pp; ++s) {
    RankEstimate r;
    r.stage = s;
    r.ranks = p.dp * p.tp;
    r.est.figures.peak = acts + states + static_cast<std::uint64_t>(s);
    e.ranks.push_back(r);
  }
  e.worst = static_cast<int>(p.pp - 1);
  e.overheads.cuda_context = 100;
  return e;
}

// A stand-in whose every layout needs exactly `total` bytes.
LayoutEstimator constant(std::uint64_t total) {
  return [total](const ModelConfig& m, const TrainConfig& t, const ParallelConfig& p,
                 const OverheadOptions&) {
    LayoutEstimate e;
    e.layout = p;
    e.model = m;
    e.train = t;
    RankEstimate r;
    r.est.figures.peak = total - 100;
    e.ranks.push_back(r);
    e.overheads.nccl = 100;
    return e;
  };
}

// The counts below are of the none and full policies without activation offload (the policies
// plan adds are tested on their own at the end).
PlanOptions tiny_options() {
  PlanOptions o;
  o.gpus = 4;
  o.gpu_memory = std::uint64_t{1} << 40;
  o.seq = 16;
  o.global_batch = 8;
  o.policies = {{PlanPolicy::Kind::none}, {PlanPolicy::Kind::full}};
  o.activation_offload = {false};
  return o;
}

// N = 4, G = 8, adamw, (none, full) × (flash, eager); per (dp, tp, pp): ZeRO 0 with offload
// none, ZeRO 1 and 2 with none or optimizer, ZeRO 3 with the three: 8 (ZeRO, offload) pairs
// when dp > 1, 1 when dp = 1; sp on and off when tp > 1; b over the divisors of G/dp.
//   dp 4 tp 1 pp 1: 8 × 1 × 4 = 32 settings × b {1, 2}        =  64
//   dp 2 tp 2 pp 1: 8 × 2 × 4 = 64 × b {1, 2, 4}              = 192
//   dp 2 tp 1 pp 2: 8 × 1 × 4 = 32 × 3                        =  96, ZeRO 2/3 with pp:
//                   (2 + 3) pairs × 4 × 3 = 60 refused
//   dp 1 tp 4 pp 1: 1 × 2 × 4 = 8 × b {1, 2, 4, 8}            =  32
//   dp 1 tp 2 pp 2: 1 × 2 × 4 = 8 × 4                         =  32
//   dp 1 tp 1 pp 4: 1 × 1 × 4 = 4 × 4                         =  16, L = 2 not divisible: refused
// 432 layouts, 76 refused, 356 valid.
TEST(Plan, EnumerationCountsTheLayoutsOfATinyModel) {
  const PlanResult r = plan(tiny(), tiny_options(), fake);
  EXPECT_EQ(r.enumerated, 432u);
  EXPECT_EQ(r.invalid, 76u);
  EXPECT_EQ(r.fitting, 356u);
  EXPECT_EQ(r.too_big, 0u);
  EXPECT_EQ(r.enumerated, r.invalid + r.fitting + r.too_big);
  ASSERT_EQ(r.candidates.size(), 10u);
  for (const auto& c : r.candidates) {
    ASSERT_TRUE(c.memory.has_value());
    EXPECT_EQ(c.layout.dp * c.layout.tp * c.layout.pp, 4);
    EXPECT_EQ(c.train.batch * c.layout.microbatches * c.layout.dp, 8);
  }
  // --optimizer all triples the settings (lomo is refused on more than one GPU).
  PlanOptions all = tiny_options();
  all.optimizers = {Optimizer::adamw, Optimizer::sgd, Optimizer::lomo};
  const PlanResult a = plan(tiny(), all, fake);
  EXPECT_EQ(a.enumerated, 3 * 432u);
  EXPECT_EQ(a.invalid, 3 * 76u + 356u);  // sgd as adamw; lomo refused on 4 GPUs
}

TEST(Plan, RejectedFamiliesCarryTheirReasons) {
  const PlanResult r = plan(tiny(), tiny_options(), fake);
  ASSERT_EQ(r.rejected.size(), 3u);
  std::set<std::string> names;
  for (const auto& f : r.rejected) {
    names.insert(family_name(f.dp, f.tp, f.pp, f.zero));
    EXPECT_EQ(f.invalid, f.layouts);
    EXPECT_FALSE(f.too_big());
    ASSERT_FALSE(f.messages.empty());
    if (f.pp == 4) {
      EXPECT_EQ(f.messages.front().rfind("does not divide the model: --pp 4", 0), 0u)
          << f.messages.front();
    } else {
      EXPECT_EQ(f.messages.front().rfind("not supported: --zero " + std::to_string(f.zero), 0), 0u)
          << f.messages.front();
    }
  }
  EXPECT_EQ(names, (std::set<std::string>{"dp 1 tp 1 pp 4 ZeRO-0", "dp 2 tp 1 pp 2 ZeRO-2",
                                          "dp 2 tp 1 pp 2 ZeRO-3"}));

  // Too big: the reason is the family's smallest worst total, at its smallest b.
  PlanOptions o = tiny_options();
  o.gpu_memory = 999;
  o.margin = 0;
  const PlanResult n = plan(tiny(), o, constant(1000));
  EXPECT_TRUE(n.candidates.empty());
  EXPECT_EQ(n.fitting, 0u);
  EXPECT_EQ(n.too_big, 356u);
  std::size_t too_big = 0;
  for (const auto& f : n.rejected) {
    if (!f.too_big()) continue;
    ++too_big;
    EXPECT_EQ(f.smallest_worst_total, 1000u);
    ASSERT_TRUE(f.smallest.has_value());
    EXPECT_EQ(f.smallest->train.batch, 1);
  }
  // Every (dp, tp, pp, ZeRO) family but the three refused ones: 4 + 4 + 2 + 1 + 1.
  EXPECT_EQ(too_big, 12u);
}

TEST(Plan, ALayoutIsKeptIffItsWorstTotalFits) {
  PlanOptions o = tiny_options();
  o.margin = 0;
  o.gpu_memory = 1000;  // budget 1000: exactly the worst total
  EXPECT_EQ(plan(tiny(), o, constant(1000)).fitting, 356u);
  o.gpu_memory = 999;
  EXPECT_EQ(plan(tiny(), o, constant(1000)).fitting, 0u);
  // The margin: 2000 × (1 − 0.5) = 1000.
  o.gpu_memory = 2000;
  o.margin = 0.5;
  EXPECT_EQ(o.budget(), 1000u);
  EXPECT_EQ(plan(tiny(), o, constant(1000)).fitting, 356u);
  o.margin = 0.5005;
  EXPECT_EQ(plan(tiny(), o, constant(1000)).fitting, 0u);
  o.gpu_memory = std::uint64_t{80} << 30;
  o.margin = 0.05;
  EXPECT_EQ(o.budget(), std::uint64_t{76} << 30);
}

using Key =
    std::tuple<std::int64_t, std::int64_t, std::int64_t, int, bool, int, int, int, std::int64_t>;

Key key(const ParallelConfig& p, const TrainConfig& t) {
  return Key{p.dp,
             p.tp,
             p.pp,
             p.zero,
             p.sp,
             static_cast<int>(p.offload),
             static_cast<int>(t.checkpointing),
             static_cast<int>(t.attention),
             t.batch};
}

// Brute force: every layout of tiny_options()' enumeration, resolved and estimated: the worst
// total of each valid one.
std::vector<std::pair<Key, std::uint64_t>> every_layout(const LayoutEstimator& estimator) {
  std::vector<std::pair<Key, std::uint64_t>> out;
  const std::int64_t triples[][3] = {{4, 1, 1}, {2, 2, 1}, {2, 1, 2},
                                     {1, 4, 1}, {1, 2, 2}, {1, 1, 4}};
  for (const auto& tr : triples)
    for (int zero = 0; zero <= 3; ++zero)
      for (Offload off : {Offload::none, Offload::optimizer, Offload::optimizer_params})
        for (bool sp : {false, true})
          for (Checkpointing ck : {Checkpointing::none, Checkpointing::full})
            for (Attention at : {Attention::eager, Attention::flash})
              for (std::int64_t b = 1; b <= 8 / tr[0]; ++b) {
                if ((8 / tr[0]) % b != 0 || (sp && tr[1] == 1) || (zero > 0 && tr[0] == 1) ||
                    (off == Offload::optimizer && zero == 0) ||
                    (off == Offload::optimizer_params && zero != 3))
                  continue;
                ParallelConfig p;
                p.world = 4;
                p.dp = tr[0];
                p.tp = tr[1];
                p.pp = tr[2];
                p.zero = zero;
                p.sp = sp;
                p.offload = off;
                p.microbatches = 8 / (tr[0] * b);
                TrainConfig t;
                t.batch = b;
                t.seq = 16;
                t.checkpointing = ck;
                t.attention = at;
                try {
                  p.resolve(true, tiny(), t);
                } catch (const InputError&) {
                  continue;
                }
                out.emplace_back(key(p, t), estimator(tiny(), t, p, {}).worst_total());
              }
  return out;
}

// The search over b (smallest first, then a binary search) keeps exactly the layouts that a
// brute force finds fitting.
void check_search(const LayoutEstimator& estimator, std::uint64_t budget) {
  SCOPED_TRACE(budget);
  PlanOptions o = tiny_options();
  o.margin = 0;
  o.gpu_memory = budget;
  o.top = 100000;
  const PlanResult r = plan(tiny(), o, estimator);
  std::set<Key> kept;
  for (const auto& c : r.candidates) {
    ASSERT_TRUE(c.memory.has_value());
    EXPECT_LE(c.memory->worst_total(), budget);
    kept.insert(key(c.layout, c.train));
  }
  EXPECT_EQ(kept.size(), r.fitting);
  const auto all = every_layout(estimator);
  ASSERT_EQ(all.size(), 356u);
  std::set<Key> brute;
  for (const auto& [k, total] : all)
    if (total <= budget) brute.insert(k);
  EXPECT_EQ(kept, brute);
  EXPECT_EQ(r.too_big, all.size() - brute.size());
  EXPECT_LT(r.estimates, all.size() + kept.size());  // the search skipped layouts
}

TEST(Plan, TheSearchOverMicroBatchesKeepsExactlyTheFittingLayouts) {
  for (std::uint64_t budget : {1500u, 3200u, 5000u, 9000u, 20000u}) check_search(fake, budget);
}

// The same with the real per-rank estimate, at budgets between its smallest and largest
// worst totals (this is where memory must be monotone in b for the search to be exact).
TEST(Plan, TheSearchIsExactWithEstimateLayout) {
  auto all = every_layout(estimate_layout);
  std::vector<std::uint64_t> totals;
  for (const auto& [k, total] : all) totals.push_back(total);
  std::sort(totals.begin(), totals.end());
  for (double q : {0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0})
    check_search(estimate_layout, totals[static_cast<std::size_t>(q * (totals.size() - 1))]);
}

TEST(Plan, CandidatesAreRankedByStepTimeThenByLargerMicroBatch) {
  PlanOptions o = tiny_options();
  o.top = 100000;
  const PlanResult r = plan(tiny(), o, fake);
  ASSERT_EQ(r.candidates.size(), 356u);
  for (std::size_t k = 1; k < r.candidates.size(); ++k) {
    const auto& a = r.candidates[k - 1];
    const auto& b = r.candidates[k];
    EXPECT_LE(a.cost.total_seconds, b.cost.total_seconds);
    if (a.cost.total_seconds == b.cost.total_seconds) {
      EXPECT_GE(a.train.batch, b.train.batch);
    }
  }
  o.top = 3;
  EXPECT_EQ(plan(tiny(), o, fake).candidates.size(), 3u);
}

// docs/plan.md's formulas by hand, on tiny: P = 2·V·h + L·(2h + 4h² + 3h·i) + h
// = 16384 + 2·50304 + 64 = 117056. Rates: 1 TFLOP/s, 8 Gb/s = 1e9 B/s for both links.
TEST(Plan, TheCostModelMatchesHandComputedFigures) {
  const ModelConfig m = tiny();
  ASSERT_EQ(m.param_count(), 117056u);
  CostModel rates;
  rates.tflops = 1;
  rates.link_gbps = 8;
  rates.pcie_gbps = 8;
  {
    // dp 2 tp 2 pp 2, ZeRO-1, b 2, M 4, s 16, bf16, full recompute, offload optimizer.
    ParallelConfig p;
    p.world = 8;
    p.dp = 2;
    p.tp = 2;
    p.pp = 2;
    p.zero = 1;
    p.microbatches = 4;
    p.offload = Offload::optimizer;
    TrainConfig t;
    t.batch = 2;
    t.seq = 16;
    t.checkpointing = Checkpointing::full;
    const StepCost c = step_cost(m, t, p, rates);
    // T = b·M·dp·s = 256 tokens; (8·P·T + 16·L·h·s·T) / 8 = (239730688 + 8388608) / 8.
    EXPECT_DOUBLE_EQ(c.flops_per_gpu, 31014912.0);
    EXPECT_DOUBLE_EQ(c.bubble, 0.25);
    EXPECT_DOUBLE_EQ(c.compute_seconds, 31014912.0 / 1e12 * 1.25);
    // P_local = P / (tp·pp) = 29264; ZeRO-1: 2·(dp−1)/dp·P_local·w = 2 · 0.5 · 29264 · 2.
    EXPECT_DOUBLE_EQ(c.dp_bytes, 58528.0);
    // M·(L/pp)·(4 + 2)·2(tp−1)/tp·b·s·h·w = 4 · 1 · 6 · 1 · 2·16·64·2.
    EXPECT_DOUBLE_EQ(c.tp_bytes, 98304.0);
    // 2·M·b·s·h·w = 2 · 4 · 4096.
    EXPECT_DOUBLE_EQ(c.pp_bytes, 32768.0);
    // shard = P_local / dp = 14632; ZeRO-1: gradients down once + parameters up: 2·14632·2.
    EXPECT_DOUBLE_EQ(c.pcie_bytes, 58528.0);
    EXPECT_DOUBLE_EQ(c.communication_seconds, (58528.0 + 98304.0 + 32768.0) / 1e9);
    EXPECT_DOUBLE_EQ(c.pcie_seconds, 58528.0 / 1e9);
    EXPECT_DOUBLE_EQ(c.total_seconds, c.compute_seconds + c.communication_seconds + c.pcie_seconds);
  }
  {
    // dp 4, ZeRO-3, b 1, M 2, s 16, fp32, no recompute, offload optimizer+params.
    ParallelConfig p;
    p.world = 4;
    p.dp = 4;
    p.zero = 3;
    p.microbatches = 2;
    p.offload = Offload::optimizer_params;
    TrainConfig t;
    t.batch = 1;
    t.seq = 16;
    t.dtype = DType::f32;
    const StepCost c = step_cost(m, t, p, rates);
    // T = 1·2·4·16 = 128; (6·P·T + 12·L·h·s·T) / 4 = (89898LL... ) computed below.
    EXPECT_DOUBLE_EQ(c.flops_per_gpu, (6.0 * 117056 * 128 + 12.0 * 2 * 64 * 16 * 128) / 4);
    EXPECT_DOUBLE_EQ(c.bubble, 0.0);
    // 3·M·(dp−1)/dp·P·w = 3 · 2 · 0.75 · 117056 · 4.
    EXPECT_DOUBLE_EQ(c.dp_bytes, 2107008.0);
    EXPECT_DOUBLE_EQ(c.tp_bytes, 0.0);
    EXPECT_DOUBLE_EQ(c.pp_bytes, 0.0);
    // shard 29264: gradients down M = 2 times + parameters up once, + 2·M fetches: 7 · 29264 · 4.
    EXPECT_DOUBLE_EQ(c.pcie_bytes, 819392.0);
  }
  {
    // ZeRO-2, dp 2, M 3: (M + 1)·(dp−1)/dp·P·w = 4 · 0.5 · 117056 · 2; ZeRO-0 the all-reduce.
    ParallelConfig p;
    p.world = 2;
    p.dp = 2;
    p.zero = 2;
    p.microbatches = 3;
    TrainConfig t;
    t.batch = 1;
    t.seq = 16;
    EXPECT_DOUBLE_EQ(step_cost(m, t, p, rates).dp_bytes, 468224.0);
    p.zero = 0;
    EXPECT_DOUBLE_EQ(step_cost(m, t, p, rates).dp_bytes, 234112.0);
    p.microbatches = 1;
    p.zero = 3;  // M = 1: 1.5 × the all-reduce
    EXPECT_DOUBLE_EQ(step_cost(m, t, p, rates).dp_bytes, 1.5 * 234112.0);
    // FSDP2's SHARD_GRAD_OP gathers once per micro-batch, for the forward and the backward:
    // 2·M·(dp−1)/dp·P·w = 2 · 1 · 0.5 · 117056 · 2, the all-reduce's volume.
    p.sharding = Sharding::per_parameter;
    p.reshard_after_forward = false;
    EXPECT_DOUBLE_EQ(step_cost(m, t, p, rates).dp_bytes, 234112.0);
    p.reshard_after_forward = true;
    EXPECT_DOUBLE_EQ(step_cost(m, t, p, rates).dp_bytes, 1.5 * 234112.0);
    p.sharding = Sharding::flat;
    // Sequence parallelism moves the same bytes.
    p.dp = 1;
    p.tp = 2;
    p.zero = 0;
    const double without = step_cost(m, t, p, rates).tp_bytes;
    p.sp = true;
    EXPECT_DOUBLE_EQ(step_cost(m, t, p, rates).tp_bytes, without);
    EXPECT_DOUBLE_EQ(without, 1 * 2 * 4 * 1.0 * 1 * 16 * 64 * 2);
  }
}

// LoRA (docs/plan.md, "LoRA") by hand, on tiny (h 64, i 176, L 2; a = k = 4, d 16): adapters
// r 8 on q and v, P_a = L·2·r·(h + h) = 4,096 elements; no weight gradient for the frozen base.
TEST(Plan, TheCostModelOfLoraMatchesHandComputedFigures) {
  const ModelConfig m = tiny();
  CostModel rates;
  rates.tflops = 1;
  rates.link_gbps = 8;
  ParallelConfig p;
  p.world = 4;
  p.dp = 4;
  p.zero = 2;
  p.microbatches = 2;
  TrainConfig t;
  t.batch = 1;
  t.seq = 16;
  t.lora_rank = 8;
  t.lora_targets = kLoraPeftDefault;
  const double P = 117056, Pa = 2 * 2 * 8 * (64 + 64), T = 1 * 2 * 4 * 16;
  ASSERT_EQ(lora_trainable_count(m, 8, kLoraPeftDefault), std::uint64_t(Pa));
  StepCost c = step_cost(m, t, p, rates);
  EXPECT_DOUBLE_EQ(c.flops_per_gpu, (4 * P * T + 6 * Pa * T + 12.0 * 2 * 64 * 16 * T) / 4);
  // ZeRO-2: (M + 1)·(dp−1)/dp·P_a·w: only the adapters' gradients.
  EXPECT_DOUBLE_EQ(c.dp_bytes, 3 * 0.75 * Pa * 2);
  // ZeRO-3: the adapters reduce-scattered per micro-batch, every parameter gathered twice.
  p.zero = 3;
  c = step_cost(m, t, p, rates);
  EXPECT_DOUBLE_EQ(c.dp_bytes, 2 * 0.75 * Pa * 2 + 2 * 2 * 0.75 * (P + Pa) * 2);
}

// Context parallelism by hand, on tiny (k 4, d 16): dp 1 tp 2 pp 1 cp 2, ZeRO-1, b 2, M 1,
// s 16 (s_c 8), bf16, no recompute.
TEST(Plan, TheCostModelOfContextParallelismMatchesHandComputedFigures) {
  const ModelConfig m = tiny();
  CostModel rates;
  rates.tflops = 1;
  rates.link_gbps = 8;
  rates.pcie_gbps = 8;
  ParallelConfig p;
  p.world = 4;
  p.dp = 1;
  p.tp = 2;
  p.cp = 2;
  p.zero = 1;
  TrainConfig t;
  t.batch = 2;
  t.seq = 16;
  t.attention = Attention::flash;
  const StepCost c = step_cost(m, t, p, rates);
  // T = b·M·dp·s = 32 tokens over N = 4 GPUs.
  EXPECT_DOUBLE_EQ(c.flops_per_gpu, (6.0 * 117056 * 32 + 12.0 * 2 * 64 * 16 * 32) / 4);
  // The gradient group is dp·cp = 2 ranks: 2·(1/2)·P_local·w = P/2 · 2.
  EXPECT_DOUBLE_EQ(c.dp_bytes, 117056.0);
  // M·(L/pp)·4·2(tp−1)/tp·b·s_c·h·w = 1·2·4·1·2·8·64·2.
  EXPECT_DOUBLE_EQ(c.tp_bytes, 16384.0);
  // B = 2·b·s_c·(k/tp)·d = 2·2·8·2·16 = 1024; per layer 2·(cp−1)·B·w + cp·B·4 = 4096 + 8192.
  EXPECT_DOUBLE_EQ(c.cp_bytes, 2 * (4096.0 + 8192.0));
  EXPECT_DOUBLE_EQ(c.communication_seconds, (117056.0 + 16384.0 + 24576.0) / 1e9);
  // Full recompute passes the forward's blocks once more: + (cp−1)·B·w per layer.
  t.checkpointing = Checkpointing::full;
  EXPECT_DOUBLE_EQ(step_cost(m, t, p, rates).cp_bytes, 2 * (4096.0 + 2048.0 + 8192.0));
}

// A mixture of experts (docs/plan.md, "Mixture of experts"), by hand for tiny-qwen3-moe (h 64,
// 2 MoE layers, E 8, K 2, m 36; P = 162,080, the experts 2·8·3·36·64 = 110,592): the FLOPs
// count the active parameters P − 2·(8 − 2)·3·36·64 = 162,080 − 82,944 = 79,136; ep 2 over dp 4
// (edp 2) reduces the dense 51,488 over 4 ranks and each rank's 55,296 experts over 2; each MoE
// layer's four all-to-alls send (ep−1)/ep of the rank's b·s·K rows of h.
TEST(Plan, TheCostModelOfExpertParallelismMatchesHandComputedFigures) {
  const ModelConfig m = *find_preset("tiny-qwen3-moe");
  CostModel rates;
  rates.tflops = 1;
  rates.link_gbps = 8;
  ParallelConfig p;
  p.world = 4;
  p.dp = 4;
  p.ep = 2;
  p.zero = 1;
  TrainConfig t;
  t.batch = 2;
  t.seq = 16;
  t.dtype = DType::bf16;
  t.attention = Attention::flash;
  p.resolve(true, m, t);
  StepCost c = step_cost(m, t, p, rates);
  // T = b·M·dp·s = 128 tokens over N = 4 GPUs; attention 12·L·h·s per token.
  EXPECT_DOUBLE_EQ(c.flops_per_gpu, (6.0 * 79136 * 128 + 12.0 * 2 * 64 * 16 * 128) / 4);
  // ZeRO-1: 2·(f·P_dense + f_e·P_experts/ep)·w = 2·(3/4·51,488 + 1/2·55,296)·2.
  EXPECT_DOUBLE_EQ(c.dp_bytes, 2.0 * (0.75 * 51488 + 0.5 * 55296) * 2);
  // M·L_moe·4·(ep−1)/ep·b·s·K·h·w = 1·2·4·(1/2)·2·16·2·64·2.
  EXPECT_DOUBLE_EQ(c.ep_bytes, 2.0 * 4 * 0.5 * 2 * 16 * 2 * 64 * 2);
  EXPECT_DOUBLE_EQ(c.communication_seconds, (c.dp_bytes + c.ep_bytes) / 1e9);
  // ZeRO-3 (docs/plan.md): every forward and backward gathers, and every micro-batch's gradients
  // reduce-scatter, the dense part over dp and the rank's experts over edp: 3·M·(3/4·51,488 +
  // 1/2·55,296)·2.
  p.zero = 3;
  EXPECT_DOUBLE_EQ(step_cost(m, t, p, rates).dp_bytes, 3.0 * (0.75 * 51488 + 0.5 * 55296) * 2);
  p.zero = 1;
  t.checkpointing = Checkpointing::full;  // + the recompute's dispatch and combine
  EXPECT_DOUBLE_EQ(step_cost(m, t, p, rates).ep_bytes, 2.0 * 6 * 0.5 * 2 * 16 * 2 * 64 * 2);
  // ep 2 × etp 2 (edp 1: no expert gradient to reduce): the all-to-alls as above (without the
  // recompute) and the etp gather and reduce-scatter, forward and backward, each moving
  // (etp − 1)·A rows, A = b·s·K = 64: 2·4·(1/2)·64·64·2 + 2·4·1·64·64·2.
  t.checkpointing = Checkpointing::none;
  p.etp = 2;
  c = step_cost(m, t, p, rates);
  EXPECT_DOUBLE_EQ(c.dp_bytes, 2.0 * 0.75 * 51488 * 2);
  EXPECT_DOUBLE_EQ(c.ep_bytes, 2.0 * 4 * 0.5 * 64 * 64 * 2 + 2.0 * 4 * 1 * 64 * 64 * 2);
  p.etp = 1;
  p.ep = 1;  // one group for every parameter again
  EXPECT_DOUBLE_EQ(step_cost(m, t, p, rates).dp_bytes, 2.0 * 0.75 * 162080 * 2);
  EXPECT_DOUBLE_EQ(step_cost(m, t, p, rates).ep_bytes, 0.0);
}

// A shared expert under tensor parallelism (docs/plan.md, "tensor parallelism"): split like the
// dense MLP, its MoE layer moves a dense layer's tensor-parallel volume. tiny-qwen2-moe (h 64,
// 6 layers, MoE layers 1 and 5) at tp 2 with sp, b 2, s 16, bf16, M 1:
// M·((L − L_moe)·4 + L_moe·4)·2(tp−1)/tp·b·s·h·w = (16 + 8)·1·2·16·64·2; without the shared
// expert the MoE layers carry the attention's 2 each: (16 + 4)·…
TEST(Plan, ASharedExpertUnderTensorParallelismMovesTheDenseLayersVolume) {
  ModelConfig m = *find_preset("tiny-qwen2-moe");
  m.vocab = 102;
  CostModel rates;
  ParallelConfig p;
  p.world = 2;
  p.tp = 2;
  p.sp = true;
  TrainConfig t;
  t.batch = 2;
  t.seq = 16;
  t.dtype = DType::bf16;
  t.attention = Attention::flash;
  p.resolve(true, m, t);
  EXPECT_DOUBLE_EQ(step_cost(m, t, p, rates).tp_bytes, 24.0 * 2 * 16 * 64 * 2);
  m.shared_expert_intermediate = 0;
  EXPECT_DOUBLE_EQ(step_cost(m, t, p, rates).tp_bytes, 20.0 * 2 * 16 * 64 * 2);
}

// plan enumerates ep for a MoE model: every degree dividing E and the stage's dp·tp·cp ranks,
// each layout refused or estimated as `estimate --ep` would (tp > 1 with sequence parallelism
// only: check_moe_layout). The preset's prime vocabulary is made even so that tp 2 can split it.
TEST(Plan, ExpertParallelDegreesAreEnumeratedForAMixtureOfExperts) {
  ModelConfig m = *find_preset("tiny-qwen3-moe");
  m.vocab = 96;
  PlanOptions o;
  o.gpus = 4;
  o.gpu_memory = std::uint64_t(1) << 30;
  o.seq = 16;
  o.global_batch = 8;
  o.zero_stages = {0, 1, 2, 3};
  o.policies = {{PlanPolicy::Kind::none}};
  o.activation_offload = {false};
  o.attention = {Attention::flash};
  o.offloads = {Offload::none};
  o.top = 100000;
  const PlanResult r = plan(m, o);
  std::set<std::int64_t> eps, tp_eps, zero3_eps;
  for (const PlanCandidate& c : r.candidates) {
    eps.insert(c.layout.ep);
    if (c.layout.zero == 3) zero3_eps.insert(c.layout.ep);  // ZeRO-3 of the experts too
    if (c.layout.tp > 1) {
      EXPECT_TRUE(c.layout.sp);
      tp_eps.insert(c.layout.ep);
    }
    EXPECT_EQ((c.layout.dp * c.layout.tp * c.layout.cp) % c.layout.ep, 0);
    if (c.layout.ep > 1) {
      EXPECT_GT(c.cost.ep_bytes, 0.0);
    }
    // The candidate's memory is estimate_layout's for its layout.
    ASSERT_TRUE(c.memory);
    EXPECT_EQ(c.memory->worst_total(),
              estimate_layout(m, c.train, c.layout, o.overheads).worst_total());
  }
  EXPECT_EQ(eps, (std::set<std::int64_t>{1, 2, 4}));  // 4 slots: ep 1, 2, 4 (8 does not divide 4)
  // etp divides the experts' width 36 and ep·etp the 4 slots: 1, 2 and 4 (at ep 1), 2 at ep 2.
  std::set<std::pair<std::int64_t, std::int64_t>> ep_etp;
  for (const PlanCandidate& c : r.candidates) ep_etp.insert({c.layout.ep, c.layout.etp});
  EXPECT_EQ(ep_etp, (std::set<std::pair<std::int64_t, std::int64_t>>{
                        {1, 1}, {1, 2}, {1, 4}, {2, 1}, {2, 2}, {4, 1}}));
  EXPECT_EQ(tp_eps, (std::set<std::int64_t>{1, 2, 4}));  // tp 2 (dp 2) or 4 (dp 1) with sp
  EXPECT_EQ(zero3_eps, (std::set<std::int64_t>{1, 2, 4}));
}

// cp {1, 2} on tiny_options' 4 GPUs adds the cp 2 layouts, flash only (eager is not a layout
// with ring attention), the gradient group dp·cp allowing every ZeRO stage:
//   dp 2 tp 1 pp 1: 8 (ZeRO, offload) pairs × 2 policies = 16 × b {1, 2, 4}   =  48
//   dp 1 tp 2 pp 1: 8 × sp on/off × 2 = 32 × b {1, 2, 4, 8}                   = 128
//   dp 1 tp 1 pp 2: 8 × 2 = 16 × 4 = 64, of which ZeRO 2/3 with pp: 5 × 2 × 4 = 40 refused
TEST(Plan, ContextParallelDegreesAddTheirLayouts) {
  PlanOptions o = tiny_options();
  o.top = 100000;
  const PlanResult one = plan(tiny(), o, fake);
  o.cp_degrees = {1, 2};
  const PlanResult two = plan(tiny(), o, fake);
  EXPECT_EQ(two.enumerated - one.enumerated, 240u);
  EXPECT_EQ(two.invalid - one.invalid, 40u);
  EXPECT_EQ(two.fitting - one.fitting, 200u);
  std::size_t with_cp = 0;
  for (const auto& c : two.candidates) {
    EXPECT_EQ(c.layout.dp * c.layout.tp * c.layout.pp * c.layout.cp, 4);
    EXPECT_EQ(c.train.batch * c.layout.microbatches * c.layout.dp, 8);
    if (c.layout.cp == 1) continue;
    ++with_cp;
    EXPECT_EQ(c.train.attention, Attention::flash);
    EXPECT_GT(c.cost.cp_bytes, 0.0);
  }
  EXPECT_EQ(with_cp, 200u);
  // A degree that does not divide the GPUs is refused naming --cp.
  o.cp_degrees = {3};
  try {
    plan(tiny(), o, fake);
    ADD_FAILURE() << "cp 3 of 4 GPUs accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--cp 3: a context-parallel degree must divide --gpus 4"),
              std::string::npos)
        << e.what();
  }
}

TEST(Plan, BadOptionsAreRefusedNamingTheFlag) {
  auto refused = [](PlanOptions o, const std::string& flag) {
    try {
      plan(tiny(), o, fake);
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "not refused: " << flag;
  };
  PlanOptions o = tiny_options();
  o.gpus = 0;
  refused(o, "--gpus");
  o = tiny_options();
  o.gpu_memory = 0;
  refused(o, "--gpu-memory");
  o = tiny_options();
  o.margin = 1;
  refused(o, "--margin");
  o = tiny_options();
  o.seq = 1;
  refused(o, "--seq");
  o = tiny_options();
  o.global_batch = 0;
  refused(o, "--global-batch");
  o = tiny_options();
  o.cost.tflops = 0;
  refused(o, "--tflops");
  o = tiny_options();
  o.cost.link_gbps = -1;
  refused(o, "--link-gbps");
  o = tiny_options();
  o.cost.pcie_gbps = 0;
  refused(o, "--pcie-gbps");
  o = tiny_options();
  o.top = 0;
  refused(o, "--top");
  // 3 GPUs: tp 3 does not divide 4 heads, pp 3 not 2 layers; dp 3 does not divide G = 4.
  o = tiny_options();
  o.gpus = 3;
  o.global_batch = 4;
  refused(o,
          "--global-batch 4: not divisible by any data-parallel degree tiny allows on "
          "--gpus 3 (3)");
  o.global_batch = 6;
  EXPECT_NO_THROW(plan(tiny(), o, fake));
}

// ------------------------------------------------------------------ checkpointing policies

ModelConfig four_layers() {
  ModelConfig m = tiny();
  m.layers = 4;
  m.name = "tiny-4l";
  return m;
}

TEST(PlanPolicies, EachPolicySetsTheLayersTheCommandLineWould) {
  const ModelConfig m = four_layers();
  TrainConfig t;
  ASSERT_TRUE(PlanPolicy::every(2).apply(t, m, 1));
  EXPECT_EQ(t.checkpointing, Checkpointing::full);
  EXPECT_EQ(t.checkpoint_layers.list, (std::vector<std::int64_t>{1, 3}));  // torchtitan's
  EXPECT_EQ(checkpointing_name(t), "every:2");
  EXPECT_FALSE(PlanPolicy::every(5).apply(t, m, 1));  // no layer: none's layout
  const PlanPolicy budget{PlanPolicy::Kind::budget};
  ASSERT_TRUE(budget.apply(t, m, 2, 1, std::uint64_t{76} << 30));  // the first of each stage
  EXPECT_EQ(t.checkpoint_layers.list, (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(checkpointing_name(t), "budget:76GiB (layers 0,2)");
  ASSERT_TRUE(budget.apply(t, m, 1, 0, 1000));
  EXPECT_EQ(t.checkpointing, Checkpointing::none);
  EXPECT_EQ(checkpointing_name(t), "budget:1000 (no layer)");
  ASSERT_TRUE(budget.apply(t, m, 2, 2, std::uint64_t{3} << 20));
  EXPECT_EQ(t.checkpointing, Checkpointing::full);
  EXPECT_TRUE(t.checkpoint_layers.list.empty());
  EXPECT_EQ(checkpointing_name(t), "budget:3MiB (every layer)");
}

// One GPU, the real estimate: every budget candidate checkpoints the fewest first layers that
// fit (one fewer does not, checked here with estimate_layout itself), never none or full (they
// are candidates of their own); selective is not enumerated with flash; activation offload's
// PCIe bytes are the native step's transfer per micro-batch, and on several GPUs it is
// enumerated without pipeline parallelism only.
TEST(PlanPolicies, BudgetTakesTheFewestFirstLayersThatFit) {
  const ModelConfig m = four_layers();
  PlanOptions o;
  o.gpus = 1;
  o.seq = 64;
  o.global_batch = 8;
  o.top = 100000;
  // Between the full step's and the plain step's peak at b 8: some prefixes fit, not all.
  TrainConfig t;
  t.batch = 8;
  t.seq = 64;
  ParallelConfig one;
  one.resolve(true, m, t);
  const std::uint64_t plain = estimate_layout(m, t, one).worst_total();
  t.checkpointing = Checkpointing::full;
  const std::uint64_t full = estimate_layout(m, t, one).worst_total();
  ASSERT_LT(full, plain);
  o.gpu_memory = (full + plain) / 2;
  o.margin = 0;
  const PlanResult r = plan(m, o);
  int budgets = 0, offloaded = 0;
  for (const PlanCandidate& c : r.candidates) {
    EXPECT_FALSE(c.train.checkpointing == Checkpointing::selective &&
                 c.train.attention == Attention::flash);
    if (c.train.offload_activations) {
      ++offloaded;
      const double want = double(c.layout.microbatches) *
                          double(estimate(Profile::native, m, c.train).offload_transfer_bytes) /
                          (o.cost.pcie_gbps * 1e9 / 8.0);
      EXPECT_DOUBLE_EQ(c.cost.pcie_seconds, want);
      EXPECT_GT(c.memory->ranks[0].host_bytes, 0u);
    }
    if (c.train.checkpoint_layers.spec.rfind("budget:", 0) != 0) continue;
    ++budgets;
    const auto& list = c.train.checkpoint_layers.list;
    ASSERT_FALSE(list.empty()) << "every layer: full's own candidate";
    EXPECT_EQ(list.back(), std::int64_t(list.size()) - 1) << "a prefix";
    EXPECT_LE(c.memory->worst_total(), r.budget);
    TrainConfig fewer = c.train;
    fewer.checkpoint_layers.list.pop_back();
    if (fewer.checkpoint_layers.list.empty()) fewer.checkpointing = Checkpointing::none;
    ParallelConfig p = c.layout;
    EXPECT_GT(estimate_layout(m, fewer, p).worst_total(), r.budget) << checkpointing_name(c.train);
  }
  EXPECT_GT(budgets, 0);
  EXPECT_GT(offloaded, 0);
  // Several GPUs: activation offload without pipeline parallelism only, priced by the rank's
  // own transfer (tensor parallelism shards it).
  o.gpus = 2;
  o.gpu_memory = std::uint64_t{1} << 40;
  int ranks_offloading = 0;
  for (const PlanCandidate& c : plan(m, o).candidates)
    if (c.train.offload_activations) {
      ++ranks_offloading;
      EXPECT_EQ(c.layout.pp, 1);
      const double want = double(c.layout.microbatches) *
                          double(c.memory->ranks[0].est.offload_transfer_bytes) /
                          (o.cost.pcie_gbps * 1e9 / 8.0);
      if (c.layout.offload == Offload::none) {  // else ZeRO's offload adds its own bytes
        EXPECT_DOUBLE_EQ(c.cost.pcie_seconds, want);
      }
    }
  EXPECT_GT(ranks_offloading, 0);
}

// The cost of a per-layer policy: its share of the layers re-run (r = n/L in docs/plan.md).
TEST(PlanPolicies, APerLayerPolicyCostsItsShareOfTheRecompute) {
  const ModelConfig m = four_layers();
  TrainConfig none, every, full;
  none.batch = every.batch = full.batch = 2;
  none.seq = every.seq = full.seq = 64;
  ASSERT_TRUE(PlanPolicy::every(2).apply(every, m, 1));
  full.checkpointing = Checkpointing::full;
  ParallelConfig p;
  p.resolve(true, m, none);
  const CostModel rates;
  const double c0 = step_cost(m, none, p, rates).flops_per_gpu;
  const double c1 = step_cost(m, every, p, rates).flops_per_gpu;
  const double c2 = step_cost(m, full, p, rates).flops_per_gpu;
  EXPECT_DOUBLE_EQ(c1 - c0, (c2 - c0) / 2);  // two of the four layers
}

}  // namespace
}  // namespace trainmem
