// Per-layer checkpointing policies (issue 30, point 1): every:K, layers:LIST, budget:SIZE.
// The parser against hand-written lists and messages; the native step (meta and cpu ledgers,
// one GPU and per rank) against the analytic profile byte for byte; the recompute against the
// step without checkpointing bit for bit; budget:SIZE against the peaks it chose between.
#include <gtest/gtest.h>

#include <cstring>

#include "cli/cli.hpp"
#include "family_configs.hpp"
#include "layout_trace_helpers.hpp"
#include "model_helpers.hpp"
#include "policy_helpers.hpp"
#include "trainmem/analytic/analytic.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/model/sharded_step.hpp"

namespace trainmem {
namespace {

using cli::CheckpointPolicy;
using cli::parse_checkpoint_policies;
using test::preset;
using test::train_config;
using test::with_layers;
using test::with_policy;

std::vector<std::int64_t> list_of(const std::string& text, std::int64_t layers) {
  const auto p = parse_checkpoint_policies(text, layers, false);
  EXPECT_EQ(p.size(), 1u);
  return p.front().layers.list;
}

std::string error_of(const std::string& text, std::int64_t layers, bool allow_list = false) {
  try {
    parse_checkpoint_policies(text, layers, allow_list);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(CheckpointPolicy, EveryKIsTorchtitansEveryKthLayer) {
  // torchtitan's _apply_layer_sac counts blocks from 1 and wraps those with count % K == 0:
  // 0-based layers K-1, 2K-1, ...
  EXPECT_EQ(list_of("every:2", 8), (std::vector<std::int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(list_of("every:3", 8), (std::vector<std::int64_t>{2, 5}));
  EXPECT_EQ(list_of("every:8", 8), (std::vector<std::int64_t>{7}));
  // Every layer listed is plain full: an empty list, the spec kept for the reports.
  const auto all = parse_checkpoint_policies("every:1", 8, false).front();
  EXPECT_EQ(all.mode, Checkpointing::full);
  EXPECT_TRUE(all.layers.list.empty());
  EXPECT_EQ(all.layers.spec, "every:1");
}

TEST(CheckpointPolicy, LayersListsRangesAndDuplicates) {
  EXPECT_EQ(list_of("layers:0", 4), (std::vector<std::int64_t>{0}));
  EXPECT_EQ(list_of("layers:3,0,2-3", 6), (std::vector<std::int64_t>{0, 2, 3}));
  EXPECT_TRUE(list_of("layers:0-3", 4).empty());  // all four: full
  TrainConfig t;
  parse_checkpoint_policies("layers:0,1,2,5", 8, false).front().apply(t);
  EXPECT_EQ(checkpointing_name(t), "layers:0,1,2,5");
  EXPECT_TRUE(t.checkpointed(5));
  EXPECT_FALSE(t.checkpointed(3));
  EXPECT_EQ(t.checkpointed_count(0, 8), 4);
  EXPECT_EQ(t.checkpointed_count(2, 4), 2);
  EXPECT_EQ(layer_list_text({0, 1, 2, 5, 7, 8}), "0-2,5,7,8");
}

TEST(CheckpointPolicy, ListsOfPoliciesKeepTheLayersNumbersTogether) {
  const auto p = parse_checkpoint_policies("none,layers:0,2,every:2,full", 4, true);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].mode, Checkpointing::none);
  EXPECT_EQ(p[1].layers.list, (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(p[2].layers.list, (std::vector<std::int64_t>{1, 3}));
  EXPECT_EQ(p[3].mode, Checkpointing::full);
  EXPECT_TRUE(p[3].layers.list.empty());
  EXPECT_EQ(parse_checkpoint_policies("both", 4, true).size(), 2u);
}

TEST(CheckpointPolicy, BadPoliciesNameTheFlagAndWhatIsAllowed) {
  std::string m = error_of("every:0", 4);
  EXPECT_TRUE(contains(m, "--checkpointing every:0") && contains(m, "from 1 to the model's 4"))
      << m;
  m = error_of("every:5", 4);
  EXPECT_TRUE(contains(m, "from 1 to the model's 4")) << m;
  m = error_of("layers:4", 4);
  EXPECT_TRUE(contains(m, "layer 4 is out of range") && contains(m, "4 layers (0-3)")) << m;
  m = error_of("layers:2-1", 4);
  EXPECT_TRUE(contains(m, "'2-1' is not a layer or a range")) << m;
  m = error_of("layers:", 4);
  EXPECT_TRUE(contains(m, "give the layers")) << m;
  m = error_of("sometimes", 4);
  EXPECT_TRUE(contains(m, "unknown policy 'sometimes'") && contains(m, "every:K")) << m;
  m = error_of("none,full", 4);
  EXPECT_TRUE(contains(m, "runs one policy")) << m;
  m = error_of("both", 4);
  EXPECT_TRUE(contains(m, "runs one policy")) << m;
  m = error_of("none,,full", 4, true);
  EXPECT_TRUE(contains(m, "an empty policy")) << m;
  m = error_of("budget:lots", 4);
  EXPECT_TRUE(contains(m, "--checkpointing budget")) << m;
  m = error_of("budget:0", 4);
  EXPECT_TRUE(contains(m, "above 0 bytes")) << m;
}

TEST(CheckpointPolicy, AnUnresolvedBudgetNeverRunsAsFull) {
  TrainConfig t;
  parse_checkpoint_policies("budget:1GiB", 4, false).front().apply(t);
  const ModelConfig m = with_layers("tiny", 4);
  try {
    estimate(Profile::native, m, t);
    FAIL() << "an unresolved budget was estimated";
  } catch (const InputError& e) {
    EXPECT_TRUE(contains(e.what(), "cannot pick the layers for a budget")) << e.what();
  }
}

// ------------------------------------------------------------------ one GPU: ledger == analytic

void expect_ledger_equals_analytic(const ModelConfig& m, const TrainConfig& t,
                                   const std::string& what, BackendKind kind = BackendKind::meta) {
  test::ModelRun run(kind, m, t);
  test::expect_ledger_equals_native(run, m, t, what, kind);
}

TEST(CheckpointPolicy, LedgerEqualsNativeProfileForEveryPolicy) {
  int cases = 0;
  for (const char* name : {"tiny", "tiny-gqa", "tiny-qwen3", "tiny-tied"})
    for (std::int64_t L : {3, 5}) {
      const ModelConfig m = with_layers(name, L);
      for (const std::string& policy :
           std::vector<std::string>{"layers:0", "layers:" + std::to_string(L - 1), "every:2",
                                    "layers:0-1", "layers:1", "selective"})
        for (Attention at : {Attention::eager, Attention::flash})
          for (Optimizer o : {Optimizer::adamw, Optimizer::lomo}) {
            const TrainConfig t =
                with_policy(train_config(2, 9, DType::bf16, o, Checkpointing::none, at), policy, L);
            expect_ledger_equals_analytic(
                m, t, m.name + " " + policy + " " + attention_name(at) + " " + optimizer_name(o));
            ++cases;
            if (testing::Test::HasFailure()) return;
          }
    }
  EXPECT_EQ(cases, 4 * 2 * 6 * 2 * 2);
}

TEST(CheckpointPolicy, CpuLedgerEqualsNativeProfileToo) {
  const ModelConfig m = with_layers("tiny-gqa", 4);
  const TrainConfig t = with_policy(
      train_config(2, 12, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::eager),
      "every:2", 4);
  expect_ledger_equals_analytic(m, t, "cpu every:2", BackendKind::cpu);
}

// The activations at the end of forward, from the two per-layer sets: a checkpointed layer
// keeps its output x_{l+1} (b, s, h), the others their whole set (the analytic profile's
// `layer` list with no checkpointing, read from a plain estimate).
TEST(CheckpointPolicy, EndOfForwardActivationsAreTheKeptSetsAdded) {
  const ModelConfig m = with_layers("tiny", 5);
  const TrainConfig none =
      train_config(2, 9, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::eager);
  const Estimate plain = estimate(Profile::native, m, none);
  const std::uint64_t S = plain.activations.per_layer_bytes;
  const std::uint64_t X = 2 * 9 * std::uint64_t(m.hidden) * 2;
  for (std::int64_t n = 1; n <= 5; ++n) {
    const TrainConfig t = with_policy(none, "layers:0-" + std::to_string(n - 1), 5);
    const Estimate e = estimate(Profile::native, m, t);
    EXPECT_EQ(e.figures.activations, plain.figures.activations - std::uint64_t(n) * (S - X))
        << n << " layers";
    // The ledger agrees (the reports' activations: alive at the end of forward).
    test::ModelRun run(BackendKind::meta, m, t);
    run.model->train_step();
    EXPECT_EQ(run.ledger->activations_end_of_forward(), e.figures.activations) << n;
  }
}

// ------------------------------------------------------------------ the cpu step, bit for bit

TEST(CheckpointPolicy, RecomputeGivesTheSameBitsAsNoCheckpointing) {
  for (const std::string policy : {"layers:1", "every:2", "layers:0,2", "selective"}) {
    const ModelConfig m = with_layers("tiny-gqa", 3);
    auto run = [&](const TrainConfig& t) {
      test::ModelRun r(BackendKind::cpu, m, t);
      r.model->init_random(7);
      r.model->random_tokens(3);
      test::GradMap g1, g2;
      std::pair<float, float> loss{r.model->train_step(test::capture_into(g1)),
                                   r.model->train_step(test::capture_into(g2))};
      return std::make_tuple(loss, g1, g2);
    };
    const TrainConfig off =
        train_config(2, 11, DType::f32, Optimizer::adamw, Checkpointing::none, Attention::eager);
    const auto [l0, a1, a2] = run(off);
    const auto [l1, b1, b2] = run(with_policy(off, policy, 3));
    EXPECT_EQ(std::memcmp(&l0.first, &l1.first, 4), 0) << policy;
    EXPECT_EQ(std::memcmp(&l0.second, &l1.second, 4), 0) << policy;
    ASSERT_EQ(a1.size(), b1.size());
    for (const auto& [name, g] : a1) {
      EXPECT_TRUE(bitwise_equal(g, b1.at(name))) << policy << " step 1 " << name;
      EXPECT_TRUE(bitwise_equal(a2.at(name), b2.at(name))) << policy << " step 2 " << name;
    }
  }
}

// Selective recompute drops exactly the eager probabilities (b, a, s, s) per layer, recomputed
// at backward step 6; with flash it changes nothing.
TEST(CheckpointPolicy, SelectiveDropsTheProbabilitiesOfEveryLayer) {
  const ModelConfig m = with_layers("tiny-gqa", 3);  // a = 6 heads
  for (Attention at : {Attention::eager, Attention::flash}) {
    const TrainConfig none =
        train_config(2, 16, DType::bf16, Optimizer::adamw, Checkpointing::none, at);
    const TrainConfig sel = with_policy(none, "selective", 3);
    const std::uint64_t probs = at == Attention::eager ? 2ull * 6 * 16 * 16 * 2 : 0;
    EXPECT_EQ(estimate(Profile::native, m, sel).figures.activations,
              estimate(Profile::native, m, none).figures.activations - 3 * probs)
        << attention_name(at);
    // The ledger: the recompute phase holds the probabilities (and the output's copy) only.
    test::ModelRun run(BackendKind::meta, m, sel);
    run.model->train_step();
    int recomputed = 0;
    for (const auto& r : run.ledger->tensors())
      if (r.phase == Phase::recompute) {
        EXPECT_TRUE(r.name == "probs" || r.name == "attn_out.recomputed") << r.name;
        ++recomputed;
      }
    EXPECT_EQ(recomputed, at == Attention::eager ? 2 * 3 : 0) << attention_name(at);
  }
}

// Korthikanti et al. 2022, section 5: selective recompute keeps 34sbh per layer (16-bit).
TEST(CheckpointPolicy, MegatronSelectiveKeeps34sbh) {
  const ModelConfig m = preset("llama-7b");
  TrainConfig t =
      train_config(8, 512, DType::f16, Optimizer::adamw, Checkpointing::none, Attention::eager);
  t = with_policy(t, "selective", 32);
  const Estimate e = estimate(Profile::megatron, m, t);
  EXPECT_EQ(e.figures.activations, 32ull * 34 * 512 * 8 * 4096);
  EXPECT_DOUBLE_EQ(e.activations.per_layer.sbh, 34.0);
  EXPECT_DOUBLE_EQ(e.activations.per_layer.as2b, 0.0);
}

// The recompute FLOPs: each checkpointed layer's forward GEMMs and attention square, written out
// for tiny-gqa (h 48, i 128, a 6 heads of d 8, k 2 kv heads; 2 layers) at b 2, s 16.
TEST(CheckpointPolicy, RecomputeFlopsCountTheReRunForward) {
  const ModelConfig m = preset("tiny-gqa");
  ASSERT_EQ(m.hidden, 48);
  ASSERT_EQ(m.intermediate, 128);
  const double gemm = 2.0 * 2 * 16 * (48 * 48 + 2 * 48 * 16 + 48 * 48 + 3 * 48 * 128);
  const double attention = 4.0 * 2 * 6 * 16 * 16 * 8;
  const TrainConfig none =
      train_config(2, 16, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::eager);
  const struct {
    const char* policy;
    double flops;
  } cases[] = {{"none", 0.0},
               {"full", 2 * (gemm + attention)},
               {"layers:1", gemm + attention},
               {"selective", 2 * attention}};
  for (const auto& c : cases)
    EXPECT_DOUBLE_EQ(estimate(Profile::native, m, with_policy(none, c.policy, 2)).recompute_flops,
                     c.flops)
        << c.policy;
}

// ------------------------------------------------------------------ per rank

TEST(CheckpointPolicy, ShardedTraceEqualsTheAnalyticProfilePerRank) {
  int checked = 0;
  for (const char* name : {"tiny-gqa", "tiny-qwen3"})
    for (std::int64_t pp : {1, 2})
      for (std::int64_t tp : {1, 2})
        for (int zero : {0, 3})
          for (bool sp : {false, true})
            for (std::int64_t M : {1, 3})
              for (const char* policy :
                   {"layers:0", "layers:3", "every:2", "layers:1-2", "selective"}) {
                const ModelConfig m = with_layers(name, 4);
                // Selective recompute changes the step with eager attention only.
                const Attention at =
                    std::string(policy) == "selective" ? Attention::eager : Attention::flash;
                const TrainConfig t = with_policy(
                    train_config(2, 16, DType::bf16, Optimizer::adamw, Checkpointing::none, at),
                    policy, 4);
                ParallelConfig p;
                p.world = 2 * tp * pp;
                p.dp = 2;
                p.tp = tp;
                p.pp = pp;
                p.zero = zero;
                p.sp = sp;
                p.microbatches = M;
                try {
                  p.resolve(true, m, t);
                } catch (const InputError&) {
                  continue;
                }
                test::expect_trace_equals_layout(
                    m, t, p, std::string(name) + " " + policy + " " + p.describe());
                if (HasFailure()) return;
                ++checked;
              }
  EXPECT_GT(checked, 100);
}

// ------------------------------------------------------------------ budget:SIZE

TEST(CheckpointPolicy, BudgetPicksTheFewestFirstLayersThatFit) {
  const ModelConfig m = with_layers("tiny", 6);
  const TrainConfig base =
      train_config(4, 64, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::eager);
  // The peaks with the first k layers checkpointed, k = 0..6, from the analytic profile.
  std::vector<std::uint64_t> peak;
  for (int k = 0; k <= 6; ++k) {
    TrainConfig t = base;
    if (k > 0) t = with_policy(base, "layers:0-" + std::to_string(k - 1), 6);
    peak.push_back(estimate(Profile::native, m, t).figures.peak);
  }
  // Each layer checkpointed lowers the peak, but the last: the backward peak is the last
  // layer's backward, where its set is alive again whether kept or recomputed.
  for (int k = 1; k <= 5; ++k) EXPECT_LT(peak[k], peak[k - 1]) << k;
  EXPECT_EQ(peak[6], peak[5]);
  const ParallelConfig one;
  for (int k = 0; k <= 6; ++k) {
    const int want = k == 6 ? 5 : k;  // the fewest layers with that peak
    auto policy = parse_checkpoint_policies("budget:" + std::to_string(peak[k]), 6, false)[0];
    const CheckpointPolicy got = cli::resolve_checkpoint_budget(policy, m, base, one);
    EXPECT_EQ(got.layers.budget, 0u);
    TrainConfig t = base;
    got.apply(t);
    EXPECT_EQ(t.checkpointed_count(0, 6), want) << "budget " << peak[k];
    for (int l = 0; l < want; ++l) EXPECT_TRUE(t.checkpointed(l)) << l;
    EXPECT_EQ(estimate(Profile::native, m, t).figures.peak, peak[k]);
  }
  auto tight = parse_checkpoint_policies("budget:" + std::to_string(peak[6] - 1), 6, false)[0];
  try {
    cli::resolve_checkpoint_budget(tight, m, base, one);
    FAIL() << "a budget below every choice resolved";
  } catch (const InputError& e) {
    EXPECT_TRUE(contains(e.what(), "no choice fits") &&
                contains(e.what(), "(adamw) is " + std::to_string(peak[6]) + " B"))
        << e.what();
  }
}

TEST(CheckpointPolicy, BudgetPerStagePicksTheFirstLayersOfEveryStage) {
  const ModelConfig m = with_layers("tiny", 4);
  const TrainConfig base =
      train_config(2, 32, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::eager);
  ParallelConfig p;
  p.world = 2;
  p.pp = 2;
  p.microbatches = 2;
  p.resolve(true, m, base);
  // One layer per stage checkpointed: layers 0 and 2.
  const TrainConfig one_each = with_policy(base, "layers:0,2", 4);
  const LayoutEstimate le = estimate_layout(m, one_each, p);
  const std::uint64_t worst = le.ranks[std::size_t(le.worst)].est.figures.peak;
  auto policy = parse_checkpoint_policies("budget:" + std::to_string(worst), 4, false)[0];
  TrainConfig t = base;
  cli::resolve_checkpoint_budget(policy, m, base, p).apply(t);
  EXPECT_EQ(t.checkpoint_layers.list, (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(checkpointing_name(t), "budget:" + std::to_string(worst) + " (layers 0,2)");
}

}  // namespace
}  // namespace trainmem
