// LoRA dropout in trainmem's own step (issue 28; docs/native-plan.md, "LoRA dropout"): the
// mask and the masked copy as ops, the ledger of the meta trace against the analytic `native`
// profile byte for byte, the cpu ledger against the meta trace, and what the masks do to the
// step: nothing when nothing is dropped, the same bits when checkpointing recomputes them, new
// bits at the next step or under another seed. The adapters' gradients under a fixed mask are
// checked against finite differences in test_model_families.cpp
// (FamilyGradients.LoraDropoutAdaptersMatchFiniteDifferences).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "family_configs.hpp"
#include "model_helpers.hpp"
#include "ops_testing.hpp"
#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/lora.hpp"
#include "trainmem/base/param_init.hpp"
#include "trainmem/model/decoder_layer.hpp"

namespace trainmem {
namespace {

using test::ModelRun;

TrainConfig dropout_train(std::int64_t b, std::int64_t s, unsigned targets, double p,
                          Optimizer o = Optimizer::adamw, DType dt = DType::bf16,
                          Checkpointing c = Checkpointing::none) {
  TrainConfig t = test::train_config(b, s, dt, o, c, Attention::eager);
  t.lora_rank = 4;
  t.lora_targets = targets;
  t.lora_dropout = p;
  return t;
}

// ------------------------------------------------------------------------------ ops

// The mask keeps element e when the top 24 bits of the generator's draw, as an integer k, reach
// p·2^24 (u = k·2^-24 >= p, both sides exact): about (1 − p)·n elements, the same bits for any
// team size and for any n (a prefix), other bits on another stream or seed.
TEST(LoraDropoutOps, MaskKeepsElementsByTheirOwnDraw) {
  auto be = make_cpu_backend(DType::f32);
  const std::int64_t n = 1 << 20;
  // Fixed team sizes (the cpu ops turn dynamic teams on at their first call: do it first), the
  // process's settings restored after.
  cpu_threads_setup();
  const int dynamic = omp_get_dynamic(), threads = omp_get_max_threads();
  for (float p : {0.05f, 0.1f, 0.5f}) {
    SCOPED_TRACE(p);
    std::vector<std::uint8_t> m1(n), m2(n), prefix(1000), other(n), seed2(n);
    omp_set_dynamic(0);
    omp_set_num_threads(1);
    be->dropout_mask(m1.data(), n, p, 7, 3);
    omp_set_num_threads(2);
    be->dropout_mask(m2.data(), n, p, 7, 3);
    EXPECT_EQ(m1, m2) << "team size";
    be->dropout_mask(prefix.data(), 1000, p, 7, 3);
    EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), m1.begin())) << "prefix";
    be->dropout_mask(other.data(), n, p, 7, 4);
    be->dropout_mask(seed2.data(), n, p, 8, 3);
    EXPECT_NE(other, m1);
    EXPECT_NE(seed2, m1);
    std::int64_t kept = 0, wrong = 0;
    for (std::int64_t e = 0; e < n; ++e) {
      const double k = double(random_bits(7, 3, std::uint64_t(e)) >> 40);
      const bool keep = k >= double(p) * 16777216.0;
      wrong += (m1[std::size_t(e)] == 1) != keep || m1[std::size_t(e)] > 1;
      kept += m1[std::size_t(e)];
    }
    EXPECT_EQ(wrong, 0);
    // Binomial: six standard deviations of the kept count.
    const double mean = (1.0 - p) * double(n), sd = std::sqrt(double(n) * p * (1.0 - p));
    EXPECT_NEAR(double(kept), mean, 6 * sd);
  }
  omp_set_dynamic(dynamic);
  omp_set_num_threads(threads);
}

// dropout_apply: a kept element is x·(1/(1 − p)) in fp32, rounded once to D (plus the output in
// fp32 first when accumulating); a dropped one is 0 (the output unchanged when accumulating).
TEST(LoraDropoutOps, ApplyScalesTheKeptElementsOnce) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto be = make_cpu_backend(dt);
    const std::int64_t n = 4099;
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> val(-3.f, 3.f);
    std::vector<float> xv(n), ov(n);
    for (auto& v : xv) v = val(rng);
    for (auto& v : ov) v = val(rng);
    const testing::Buf x = testing::Buf::from(xv, dt), out0 = testing::Buf::from(ov, dt);
    std::vector<std::uint8_t> mask(n);
    for (std::int64_t e = 0; e < n; ++e) mask[std::size_t(e)] = (e * 7) % 10 < 3 ? 0 : 1;
    const float scale = float(1.0 / (1.0 - 0.3));
    for (bool acc : {false, true}) {
      testing::Buf out = out0;
      be->dropout_apply(out.data(), x.data(), mask.data(), n, scale, acc);
      const std::vector<float> got = out.f32(), xs = x.f32(), os = out0.f32();
      for (std::int64_t e = 0; e < n; ++e) {
        const std::size_t j = std::size_t(e);
        const float v = mask[j] ? xs[j] * scale : 0.0f;
        const float want = testing::Buf::from({acc ? os[j] + v : v}, dt).f32()[0];
        ASSERT_EQ(got[j], want) << "element " << e << (acc ? " (accumulate)" : "");
      }
    }
  }
}

// ------------------------------------------------------------------------------ the ledger

// The figures of the second step of the meta trace equal the closed form, peak breakdown
// included, over families (and shapes whose intermediate size is below the hidden size, or whose
// heads are wider than it), target sets, checkpointing policies, attention variants and a 16-bit
// or 4-bit base.
TEST(LoraDropoutLedger, MetaTraceEqualsTheNativeClosedForm) {
  struct Case {
    const char* preset;
    std::int64_t b, s;
  };
  auto skewed = [](const char* name, std::int64_t h, std::int64_t i, std::int64_t a,
                   std::int64_t d) {
    ModelConfig m = test::any_config("tiny");
    m.name = name;
    m.hidden = h;
    m.intermediate = i;
    m.heads = a;
    m.kv_heads = a;
    m.explicit_head_dim = d;
    return m;
  };
  std::vector<std::pair<ModelConfig, Case>> models;
  for (const Case& c :
       {Case{"tiny", 3, 17}, Case{"tiny-awkward", 3, 7}, Case{"tiny-qwen2", 3, 11},
        Case{"tiny-qwen3", 2, 9}, Case{"tiny-mistral", 2, 9}, Case{"llama3-8b", 1, 64}})
    models.push_back({test::any_config(c.preset), c});
  models.push_back({skewed("narrow-mlp", 64, 16, 4, 16), Case{"narrow-mlp", 2, 9}});
  models.push_back({skewed("wide-heads", 64, 8, 4, 64), Case{"wide-heads", 1, 3}});
  models.push_back({skewed("narrow-heads", 48, 2, 16, 2), Case{"narrow-heads", 1, 4}});
  const std::vector<unsigned> target_sets = {kLoraPeftDefault, kLoraAllLinear, kLoraO, kLoraDown,
                                             kLoraK | kLoraUp};
  int checked = 0;
  for (const auto& [m, c] : models) {
    const bool large = std::string(c.preset) == "llama3-8b";
    for (unsigned targets : target_sets)
      for (const char* ck : {"none", "full", "selective", "every:2"})
        for (Attention at : {Attention::eager, Attention::flash})
          for (Quant q : {Quant::none, Quant::nf4}) {
            if (large && (at != Attention::flash || q != Quant::nf4)) continue;
            TrainConfig t = dropout_train(c.b, c.s, targets, 0.1);
            t.attention = at;
            t.quant = q;
            test::set_checkpointing(t, m, ck);
            SCOPED_TRACE(std::string(c.preset) + " targets " + lora_targets_name(targets) + " " +
                         ck + " " + attention_name(at) + " " + quant_name(q));
            ModelRun run(BackendKind::meta, m, t);
            test::two_random_steps(*run.model);
            const MemoryFigures got = measured_figures(*run.ledger);
            const Estimate e = estimate(Profile::native, m, t);
            test::expect_same_figures(got, e.figures,
                                      "analytic peak at " + e.instants.at(e.peak_instant).name);
            ++checked;
          }
  }
  EXPECT_GT(checked, 500);
}

// Each backward instant the dropout adds (the input dropped again beside d_lora_a: steps 1, 3,
// 5, 8) decides the peak of some shape, and there the meta trace equals it byte for byte: their
// values are checked, not only bounded. Shapes found by a random search over h, i, heads, kv
// heads, head dim, vocab, layers, b, s, r and targets (20,000 configurations). The forward's
// and the recompute's dropped inputs decided none of them (each holds what a backward step, the
// end of forward or the recompute's end holds, less a buffer about as large); the closed form
// keeps them, exact, for shapes no search met.
TEST(LoraDropoutLedger, EachBackwardInstantDecidesSomePeak) {
  struct Case {
    const char* want;
    std::int64_t h, i, a, k, d, V, L, b, s, r;
    unsigned targets;
    Attention at;
  };
  for (const Case& c : {
           Case{"step 1: d_lora_a.down_proj", 48, 128, 1, 1, 8, 128, 2, 2, 3, 4, kLoraAllLinear,
                Attention::flash},
           Case{"step 3: d_lora_a.gate_proj", 64, 16, 1, 1, 4, 8, 1, 2, 2, 1, kLoraGate,
                Attention::eager},
           Case{"step 3: d_lora_a.up_proj", 32, 16, 8, 1, 2, 16, 1, 2, 3, 4, kLoraUp,
                Attention::eager},
           Case{"step 5: d_lora_a.o_proj", 64, 4, 8, 1, 32, 16, 2, 1, 4, 1, kLoraO | kLoraDown,
                Attention::flash},
           Case{"step 8: d_lora_a.q_proj", 96, 8, 1, 1, 64, 8, 1, 1, 4, 16, kLoraQ,
                Attention::eager},
           Case{"step 8: d_lora_a.k_proj", 96, 4, 1, 1, 64, 8, 2, 1, 8, 1, kLoraK,
                Attention::eager},
           Case{"step 8: d_lora_a.v_proj", 96, 4, 2, 2, 32, 16, 1, 1, 2, 1, kLoraV,
                Attention::flash},
       }) {
    SCOPED_TRACE(c.want);
    ModelConfig m = test::any_config("tiny");
    m.hidden = c.h;
    m.intermediate = c.i;
    m.heads = c.a;
    m.kv_heads = c.k;
    m.explicit_head_dim = c.d;
    m.vocab = c.V;
    m.layers = c.L;
    TrainConfig t = dropout_train(c.b, c.s, c.targets, 0.1);
    t.lora_rank = c.r;
    t.attention = c.at;
    t.checkpointing = Checkpointing::full;
    const Estimate e = estimate(Profile::native, m, t);
    const std::string peak = e.instants.at(e.peak_instant).name;
    EXPECT_NE(peak.find(c.want), std::string::npos) << peak;
    EXPECT_NE(peak.find("the input dropped again"), std::string::npos) << peak;
    ModelRun run(BackendKind::meta, m, t);
    test::two_random_steps(*run.model);
    test::expect_same_figures(measured_figures(*run.ledger), e.figures, "analytic peak at " + peak);
  }
}

// The cpu run allocates exactly what the meta trace does, with the masks and the dropped copies.
TEST(LoraDropoutLedger, CpuLedgerIsTheMetaTrace) {
  for (const char* preset : {"tiny-qwen3", "tiny-qwen2"})
    for (const char* ck : {"none", "full"})
      for (Quant q : {Quant::none, Quant::nf4}) {
        SCOPED_TRACE(std::string(preset) + " " + ck + " " + quant_name(q));
        const ModelConfig m = test::any_config(preset);
        TrainConfig t = dropout_train(2, 9, kLoraAllLinear, 0.2);
        t.checkpointing = *parse_checkpointing(ck);
        t.quant = q;
        ModelRun cpu(BackendKind::cpu, m, t), meta(BackendKind::meta, m, t);
        for (ModelRun* run : {&cpu, &meta}) test::two_random_steps(*run->model);
        test::expect_same_ledgers(*cpu.ledger, *meta.ledger);
      }
}

// ------------------------------------------------------------------------------ the step

// Weights from seed 5 with every B away from zero (so that dA and the adapters' share of dx are
// not zero), tokens from seed 6, the masks' key set; one step's loss and gradients.
struct StepResult {
  float loss = 0;
  test::GradMap grads;
};
void prepare(LlamaModel& model, std::uint64_t key_seed, std::uint64_t key_step) {
  model.init_random(5);
  for (const auto& p : model.parameters())
    if (p.name.find(".lora_B.") != std::string::npos) {
      std::vector<float> v(p.numel());
      for (std::size_t e = 0; e < v.size(); ++e) v[e] = 0.02f * float(int(e % 7) - 3);
      model.set_parameter_values(p.name, v);
    }
  model.random_tokens(6);
  model.set_dropout_key(key_seed, key_step);
}
StepResult one_step(const ModelConfig& m, const TrainConfig& t, std::uint64_t key_seed,
                    std::uint64_t key_step) {
  ModelRun run(BackendKind::cpu, m, t);
  prepare(*run.model, key_seed, key_step);
  StepResult r;
  r.loss = run.model->train_step(test::capture_into(r.grads));
  return r;
}

void expect_same_step(const StepResult& got, const StepResult& want, const std::string& what) {
  EXPECT_EQ(got.loss, want.loss) << what;
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  for (const auto& [name, g] : want.grads) EXPECT_EQ(got.grads.at(name), g) << what << ": " << name;
}

// A p so small that the mask keeps every element here (u >= p fails only for a draw of exactly
// 0, about once in 2^24) and 1/(1 − p) rounds to 1 in float: the dropout path (the copy, A's
// GEMMs on it, dx through the mask) gives the LoRA step's loss bit for bit (the copy is x) and
// its gradients up to one rounding: dx gets d_lora_a·A rounded to D first and then added, where
// the LoRA step adds it inside the GEMM (relative L2 error below 2^-7 in bf16, 1e-6 in fp32), in
// each dtype, through a 16-bit or 4-bit base.
TEST(LoraDropoutStep, NothingDroppedIsTheLoraStep) {
  const ModelConfig m = test::any_config("tiny-qwen2");
  for (DType dt : {DType::f32, DType::bf16})
    for (Quant q : {Quant::none, Quant::nf4}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + quant_name(q));
      TrainConfig lora = dropout_train(2, 9, kLoraAllLinear, 0.0, Optimizer::sgd, dt);
      lora.quant = q;
      TrainConfig dropped = lora;
      dropped.lora_dropout = 1e-9;
      ASSERT_EQ(float(1.0 / (1.0 - dropped.lora_dropout)), 1.0f);
      const StepResult want = one_step(m, lora, 3, 0), got = one_step(m, dropped, 3, 0);
      ASSERT_EQ(want.grads.size(), std::size_t(2 * 7 * m.layers));
      ASSERT_EQ(got.grads.size(), want.grads.size());
      EXPECT_EQ(got.loss, want.loss);
      const double tol = dt == DType::f32 ? 1e-6 : 1.0 / 128;
      for (const auto& [name, g] : want.grads) {
        const std::vector<float>& x = got.grads.at(name);
        double num = 0, den = 0;
        for (std::size_t e = 0; e < g.size(); ++e) {
          num += (double(x[e]) - g[e]) * (double(x[e]) - g[e]);
          den += double(g[e]) * g[e];
        }
        ASSERT_GT(den, 0.0) << name;
        EXPECT_LE(std::sqrt(num / den), tol) << name;
      }
    }
}

// The recompute under checkpointing draws the same masks: the gradients equal those of the step
// that kept the masks, bit for bit. A real p changes the loss and every adapter's gradient.
TEST(LoraDropoutStep, CheckpointingRecomputesTheSameMasks) {
  const ModelConfig m = test::any_config("tiny-awkward");
  TrainConfig t = dropout_train(2, 7, kLoraAllLinear, 0.3, Optimizer::sgd, DType::f32);
  const StepResult none = one_step(m, t, 9, 0);
  for (Checkpointing c : {Checkpointing::full, Checkpointing::selective}) {
    t.checkpointing = c;
    expect_same_step(one_step(m, t, 9, 0), none, checkpointing_name(c));
  }
  TrainConfig plain = t;
  plain.checkpointing = Checkpointing::none;
  plain.lora_dropout = 0.0;
  const StepResult lora = one_step(m, plain, 9, 0);
  EXPECT_NE(lora.loss, none.loss);
  for (const auto& [name, g] : none.grads) EXPECT_NE(lora.grads.at(name), g) << name;
}

// The key: the same (seed, step) the same masks; the next step or another seed, others. A run's
// steps advance it (a second train_step draws the masks of step 1).
TEST(LoraDropoutStep, MasksFollowTheSeedAndTheStep) {
  const ModelConfig m = test::any_config("tiny");
  const TrainConfig t =
      dropout_train(2, 9, kLoraPeftDefault | kLoraDown, 0.5, Optimizer::sgd, DType::f32);
  const StepResult a = one_step(m, t, 4, 0);
  expect_same_step(one_step(m, t, 4, 0), a, "the same key");
  EXPECT_NE(one_step(m, t, 4, 1).loss, a.loss);
  EXPECT_NE(one_step(m, t, 5, 0).loss, a.loss);
  // SGD with lr 0 keeps the weights: the second step differs from the first only by its masks.
  OptimizerSettings frozen = default_optimizer_settings(Optimizer::sgd);
  frozen.sgd_lr = 0.0f;
  ModelRun run(BackendKind::cpu, m, t, &frozen);
  prepare(*run.model, 4, 0);
  const float first = run.model->train_step();
  const float second = run.model->train_step();
  ModelRun again(BackendKind::cpu, m, t, &frozen);
  prepare(*again.model, 4, 1);
  EXPECT_NE(first, second);
  EXPECT_EQ(again.model->train_step(), second);
}

}  // namespace
}  // namespace trainmem
