// Mixture of experts in trainmem's own step (issue 29; docs/native-plan.md, "Mixture of
// experts"): the routing and combine kernels against references written here, the ledger against
// the analytic `native` profile byte for byte, the cpu ledger against the meta trace (the bytes do
// not depend on the routing), and the guard's refusals. The gradients against finite differences
// are in test_model_families.cpp, against the real transformers classes in test_model_golden.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "family_configs.hpp"
#include "model_helpers.hpp"
#include "moe/moe.hpp"
#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/error.hpp"

using namespace trainmem;
using namespace trainmem::test;

namespace {

// ------------------------------------------------------------------------------ kernels

// The routing of one token as written down from HF's MixtralTopKRouter / Qwen3MoeTopKRouter, in
// double: softmax, the K largest (std::stable_sort by descending probability: a tie keeps the
// lower expert first), renormalised when asked.
struct RefRoute {
  std::vector<double> probs;
  std::vector<int> idx;
  std::vector<double> weight;
};
RefRoute ref_route(const std::vector<double>& logits, int K, bool normalize) {
  RefRoute r;
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (double x : logits) sum += std::exp(x - mx);
  for (double x : logits) r.probs.push_back(std::exp(x - mx) / sum);
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return r.probs[std::size_t(a)] > r.probs[std::size_t(b)]; });
  double total = 0;
  for (int j = 0; j < K; ++j) {
    r.idx.push_back(order[std::size_t(j)]);
    r.weight.push_back(r.probs[std::size_t(order[std::size_t(j)])]);
    total += r.weight.back();
  }
  if (normalize)
    for (double& w : r.weight) w /= total;
  return r;
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float scale) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

TEST(MoeKernels, RouteMatchesTheRouterWrittenHereAndSortsChoicesByExpert) {
  for (bool normalize : {true, false})
    for (auto [n, E, K] : {std::array<std::int64_t, 3>{37, 8, 2}, {5, 4, 1}, {64, 6, 3}}) {
      SCOPED_TRACE(std::to_string(n) + " tokens, " + std::to_string(E) + " experts, top " +
                   std::to_string(K) + (normalize ? ", normalised" : ""));
      const std::vector<float> logits =
          random_floats(std::size_t(n * E), 7 + std::uint64_t(n), 2.f);
      std::vector<float> probs(std::size_t(n * E)), weight(std::size_t(n * K));
      std::vector<std::int32_t> idx(std::size_t(n * K)), pos(std::size_t(n * K)),
          off(std::size_t(E + 1));
      moe_route_cpu(probs.data(), idx.data(), weight.data(), pos.data(), off.data(), logits.data(),
                    n, E, K, 0, normalize, DType::f32);
      std::vector<std::int64_t> count(std::size_t(E), 0);
      for (std::int64_t t = 0; t < n; ++t) {
        const RefRoute r =
            ref_route(std::vector<double>(logits.begin() + t * E, logits.begin() + (t + 1) * E),
                      int(K), normalize);
        for (std::int64_t e = 0; e < E; ++e)
          EXPECT_NEAR(probs[std::size_t(t * E + e)], r.probs[std::size_t(e)], 2e-7);
        for (std::int64_t j = 0; j < K; ++j) {
          EXPECT_EQ(idx[std::size_t(t * K + j)], r.idx[std::size_t(j)]) << t << "," << j;
          EXPECT_NEAR(weight[std::size_t(t * K + j)], r.weight[std::size_t(j)], 5e-7);
          ++count[std::size_t(r.idx[std::size_t(j)])];
        }
      }
      // The offsets are the histogram's running sum; the positions fill each expert's range in
      // (token, choice) order.
      EXPECT_EQ(off[0], 0);
      for (std::int64_t e = 0; e < E; ++e)
        EXPECT_EQ(off[std::size_t(e + 1)] - off[std::size_t(e)], count[std::size_t(e)]) << e;
      std::vector<std::int32_t> next(off.begin(), off.end() - 1);
      for (std::int64_t c = 0; c < n * K; ++c)
        EXPECT_EQ(pos[std::size_t(c)], next[std::size_t(idx[std::size_t(c)])]++) << c;
    }
}

// The logit gradient of L = Σ g_tj · weight_tj (+ Σ_e a_e · p_te: the load-balancing loss's
// term, the same a for every token) against central differences of the router written here
// (double), for both normalisations, with and without the aux term.
TEST(MoeKernels, RouteBackwardMatchesFiniteDifferences) {
  const std::int64_t n = 9, E = 6, K = 2;
  const std::vector<float> a = random_floats(std::size_t(E), 5, 0.7f);
  for (bool normalize : {true, false})
    for (bool with_aux : {false, true}) {
      SCOPED_TRACE(std::string(normalize ? "normalised" : "raw") + (with_aux ? ", aux" : ""));
      const std::vector<float> logits = random_floats(std::size_t(n * E), 3, 1.5f);
      const std::vector<float> g = random_floats(std::size_t(n * K), 4, 1.f);
      std::vector<float> probs(std::size_t(n * E)), weight(std::size_t(n * K)),
          dlogits(std::size_t(n * E));
      std::vector<std::int32_t> idx(std::size_t(n * K)), pos(std::size_t(n * K)),
          off(std::size_t(E + 1));
      moe_route_cpu(probs.data(), idx.data(), weight.data(), pos.data(), off.data(), logits.data(),
                    n, E, K, 0, normalize, DType::f32);
      moe_route_backward_cpu(dlogits.data(), g.data(), probs.data(), idx.data(),
                             with_aux ? a.data() : nullptr, n, E, K, normalize, DType::f32);
      for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t e = 0; e < E; ++e) {
          auto L = [&](double delta) {
            std::vector<double> x(logits.begin() + t * E, logits.begin() + (t + 1) * E);
            x[std::size_t(e)] += delta;
            const RefRoute r = ref_route(x, int(K), normalize);
            double l = 0;
            for (std::int64_t j = 0; j < K; ++j) {
              // The experts chosen at the unperturbed point (a step this small changes none).
              EXPECT_EQ(r.idx[std::size_t(j)], idx[std::size_t(t * K + j)]);
              l += double(g[std::size_t(t * K + j)]) * r.weight[std::size_t(j)];
            }
            if (with_aux)
              for (std::int64_t f = 0; f < E; ++f)
                l += double(a[std::size_t(f)]) * r.probs[std::size_t(f)];
            return l;
          };
          const double h = 1e-5, fd = (L(h) - L(-h)) / (2 * h);
          EXPECT_NEAR(dlogits[std::size_t(t * E + e)], fd, 1e-5 + 1e-4 * std::fabs(fd))
              << "token " << t << " expert " << e;
        }
    }
}

TEST(MoeKernels, PermuteCombineAndTheCombineBackwardAreTheirFormulas) {
  const std::int64_t n = 11, E = 5, K = 2, h = 7;
  const std::vector<float> logits = random_floats(std::size_t(n * E), 9, 1.f);
  std::vector<float> probs(std::size_t(n * E)), weight(std::size_t(n * K));
  std::vector<std::int32_t> idx(std::size_t(n * K)), pos(std::size_t(n * K)),
      off(std::size_t(E + 1));
  moe_route_cpu(probs.data(), idx.data(), weight.data(), pos.data(), off.data(), logits.data(), n,
                E, K, 0, true, DType::f32);
  const std::vector<float> x = random_floats(std::size_t(n * h), 10, 1.f);
  const std::vector<float> res = random_floats(std::size_t(n * h), 11, 1.f);
  const std::vector<float> y = random_floats(std::size_t(n * K * h), 12, 1.f);
  const std::vector<float> dout = random_floats(std::size_t(n * h), 13, 1.f);
  std::vector<float> rows(std::size_t(n * K * h), -1.f), out(std::size_t(n * h)),
      sum(std::size_t(n * h)), drows(std::size_t(n * K * h), -1.f), dw(std::size_t(n * K));
  moe_permute_cpu(rows.data(), x.data(), pos.data(), n, K, h, DType::f32);
  moe_combine_cpu(out.data(), res.data(), y.data(), weight.data(), pos.data(), n, K, h, DType::f32);
  moe_combine_cpu(sum.data(), nullptr, y.data(), nullptr, pos.data(), n, K, h, DType::f32);
  moe_combine_backward_cpu(drows.data(), dw.data(), dout.data(), y.data(), weight.data(),
                           pos.data(), n, K, h, DType::f32);
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t c = 0; c < h; ++c) {
      double o = res[std::size_t(t * h + c)], s = 0;
      for (std::int64_t j = 0; j < K; ++j) {
        const std::size_t r = std::size_t(pos[std::size_t(t * K + j)]);
        EXPECT_EQ(rows[r * std::size_t(h) + std::size_t(c)], x[std::size_t(t * h + c)]);
        o += double(weight[std::size_t(t * K + j)]) * y[r * std::size_t(h) + std::size_t(c)];
        s += y[r * std::size_t(h) + std::size_t(c)];
        EXPECT_NEAR(drows[r * std::size_t(h) + std::size_t(c)],
                    double(weight[std::size_t(t * K + j)]) * dout[std::size_t(t * h + c)], 1e-6);
      }
      EXPECT_NEAR(out[std::size_t(t * h + c)], o, 1e-5);
      EXPECT_NEAR(sum[std::size_t(t * h + c)], s, 1e-5);
    }
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t j = 0; j < K; ++j) {
      double d = 0;
      const std::size_t r = std::size_t(pos[std::size_t(t * K + j)]);
      for (std::int64_t c = 0; c < h; ++c)
        d += double(dout[std::size_t(t * h + c)]) * y[r * std::size_t(h) + std::size_t(c)];
      EXPECT_NEAR(dw[std::size_t(t * K + j)], d, 1e-5);
    }
  // Every row of the expert-ordered buffers was written: the positions are a permutation.
  for (float v : drows) EXPECT_NE(v, -1.f);
}

// --capacity-factor (GShard's token dropping): each expert keeps its first `cap` choices in
// (token, choice) order; the others get pos −1, the offsets count the kept rows, and the permute,
// the combine and its backward skip the dropped choices (their weight's gradient is 0). Checked
// against the routing without capacity and the combine's sum written here.
TEST(MoeKernels, CapacityKeepsEachExpertsFirstChoicesAndTheKernelsSkipTheRest) {
  const std::int64_t n = 29, E = 4, K = 2, h = 5;
  const std::vector<float> logits = random_floats(std::size_t(n * E), 31, 2.f);
  auto route = [&](std::int64_t cap, std::vector<std::int32_t>& idx, std::vector<std::int32_t>& pos,
                   std::vector<std::int32_t>& off, std::vector<float>& weight) {
    std::vector<float> probs(std::size_t(n * E));
    weight.assign(std::size_t(n * K), 0.f);
    idx.assign(std::size_t(n * K), 0);
    pos.assign(std::size_t(n * K), 0);
    off.assign(std::size_t(E + 1), 0);
    moe_route_cpu(probs.data(), idx.data(), weight.data(), pos.data(), off.data(), logits.data(), n,
                  E, K, cap, true, DType::f32);
  };
  std::vector<std::int32_t> idx0, pos0, off0, idx, pos, off;
  std::vector<float> w0, weight;
  route(0, idx0, pos0, off0, w0);
  std::int64_t largest = 0;
  for (std::int64_t e = 0; e < E; ++e)
    largest = std::max<std::int64_t>(largest, off0[std::size_t(e + 1)] - off0[std::size_t(e)]);
  ASSERT_GT(largest, 9) << "the test needs an expert with more than 9 choices";
  for (std::int64_t cap : {largest, std::int64_t(9), std::int64_t(1)}) {
    SCOPED_TRACE("capacity " + std::to_string(cap));
    route(cap, idx, pos, off, weight);
    EXPECT_EQ(idx, idx0);
    EXPECT_EQ(weight, w0);  // dropping happens after the weights (no renormalisation)
    std::vector<std::int64_t> seen(std::size_t(E), 0);
    std::int64_t start = 0, dropped = 0;
    for (std::int64_t e = 0; e < E; ++e) {
      const std::int64_t routed = off0[std::size_t(e + 1)] - off0[std::size_t(e)];
      EXPECT_EQ(off[std::size_t(e)], start);
      start += std::min(routed, cap);
    }
    EXPECT_EQ(off[std::size_t(E)], start);
    for (std::int64_t c = 0; c < n * K; ++c) {
      const std::size_t e = std::size_t(idx[std::size_t(c)]);
      const std::int64_t rank = seen[e]++;
      if (rank < cap) {
        EXPECT_EQ(pos[std::size_t(c)], off[e] + rank) << c;
      } else {
        EXPECT_EQ(pos[std::size_t(c)], -1) << c;
        ++dropped;
      }
    }
    EXPECT_EQ(dropped, n * K - start);
    if (cap == largest) {
      EXPECT_EQ(pos, pos0);
    }
    if (cap == 1) {
      EXPECT_EQ(dropped, n * K - E);
    }
    const std::vector<float> x = random_floats(std::size_t(n * h), 32, 1.f);
    const std::vector<float> y = random_floats(std::size_t(n * K * h), 33, 1.f);
    const std::vector<float> dout = random_floats(std::size_t(n * h), 34, 1.f);
    std::vector<float> rows(std::size_t(n * K * h), -1.f), out(std::size_t(n * h)),
        drows(std::size_t(n * K * h), -1.f), dw(std::size_t(n * K), -1.f);
    moe_permute_cpu(rows.data(), x.data(), pos.data(), n, K, h, DType::f32);
    moe_combine_cpu(out.data(), nullptr, y.data(), weight.data(), pos.data(), n, K, h, DType::f32);
    moe_combine_backward_cpu(drows.data(), dw.data(), dout.data(), y.data(), weight.data(),
                             pos.data(), n, K, h, DType::f32);
    for (std::int64_t t = 0; t < n; ++t) {
      for (std::int64_t c = 0; c < h; ++c) {
        double o = 0;
        for (std::int64_t j = 0; j < K; ++j) {
          const std::int32_t r = pos[std::size_t(t * K + j)];
          if (r < 0) continue;
          EXPECT_EQ(rows[std::size_t(r * h + c)], x[std::size_t(t * h + c)]);
          o += double(weight[std::size_t(t * K + j)]) * y[std::size_t(r * h + c)];
        }
        EXPECT_NEAR(out[std::size_t(t * h + c)], o, 1e-5);
      }
      for (std::int64_t j = 0; j < K; ++j)
        if (pos[std::size_t(t * K + j)] < 0) {
          EXPECT_EQ(dw[std::size_t(t * K + j)], 0.f);
        }
    }
    // The kept rows [0, off[E]) are written, the rows past them untouched.
    for (std::int64_t r = 0; r < n * K; ++r)
      EXPECT_EQ(drows[std::size_t(r * h)] != -1.f, r < off[std::size_t(E)]) << r;
  }
}

// Qwen2-MoE's shared expert gate: out += σ(score)·y, and its backward against the derivative of
// σ written here and central differences of the gated sum.
TEST(MoeKernels, SharedExpertGateAndItsBackward) {
  const std::int64_t n = 7, h = 5;
  const std::vector<float> y = random_floats(std::size_t(n * h), 21, 1.f);
  const std::vector<float> score = random_floats(std::size_t(n), 22, 2.f);
  const std::vector<float> base = random_floats(std::size_t(n * h), 23, 1.f);
  const std::vector<float> dout = random_floats(std::size_t(n * h), 24, 1.f);
  std::vector<float> out = base;
  std::vector<float> dy(std::size_t(n * h)), dscore(static_cast<std::size_t>(n));
  moe_gate_add_cpu(out.data(), y.data(), score.data(), n, h, DType::f32);
  moe_gate_backward_cpu(dy.data(), dscore.data(), dout.data(), y.data(), score.data(), n, h,
                        DType::f32);
  auto sigmoid = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  for (std::int64_t t = 0; t < n; ++t) {
    const double g = sigmoid(score[std::size_t(t)]);
    // L(score) = Σ_c dout·σ(score)·y: its derivative by central differences.
    auto L = [&](double x) {
      double l = 0;
      for (std::int64_t c = 0; c < h; ++c)
        l += double(dout[std::size_t(t * h + c)]) * sigmoid(x) * y[std::size_t(t * h + c)];
      return l;
    };
    const double eps = 1e-5,
                 fd = (L(score[std::size_t(t)] + eps) - L(score[std::size_t(t)] - eps)) / (2 * eps);
    EXPECT_NEAR(dscore[std::size_t(t)], fd, 1e-5 + 1e-5 * std::fabs(fd)) << t;
    for (std::int64_t c = 0; c < h; ++c) {
      const std::size_t e = std::size_t(t * h + c);
      EXPECT_NEAR(out[e], base[e] + g * y[e], 1e-6) << t << "," << c;
      EXPECT_NEAR(dy[e], g * dout[e], 1e-6) << t << "," << c;
    }
  }
}

// ------------------------------------------------------------------------------ the step

struct Shape {
  std::string preset;
  std::int64_t b, s;
};

void expect_native_equals_ledger(const ModelConfig& m, const TrainConfig& t, BackendKind kind,
                                 const std::string& what) {
  ModelRun run(kind, m, t);
  two_random_steps(*run.model);
  const MemoryFigures got = measured_figures(*run.ledger);
  const Estimate e = estimate(Profile::native, m, t);
  expect_same_figures(got, e.figures, what);
}

// Mixtral (renormalised top 2 of 5, and 8 at published widths), Qwen3-MoE (q/k norms, head dim
// apart from h/a) and Qwen2-MoE's shared expert (with every layer MoE; Qwen1.5-MoE-A2.7B's 60
// experts, top 4), in every checkpointing policy × attention × optimizer × dtype the native
// profile models; the published ones in bf16 on meta, two of their layers; and three skewed shapes
// (family_configs.hpp, moe-wide-*) in which the router's, the load-balancing loss's and the shared
// expert's instants decide the workspace figure.
TEST(MoeModel, LedgerEqualsNativeProfileByteForByte) {
  const std::vector<Shape> shapes = {
      {"tiny-mixtral", 2, 9},
      {"tiny-mixtral", 1, 33},
      {"tiny-qwen3-moe", 3, 7},
      {"tiny-qwen2-moe-all", 2, 5},
      {"tiny-mixtral-aux", 2, 7},
      {"moe-wide-router", 2, 3},
      {"moe-wide-router-aux", 2, 3},
      {"moe-wide-shared", 2, 3},
      {"mixtral-8x7b", 1, 64},
      {"qwen3-30b-a3b", 1, 32},
      {"qwen1.5-moe-a2.7b", 1, 32},
      // Dense layers among MoE ones: Qwen2-MoE's tiny preset (MoE in layers 1 and 5 of 6), a
      // Qwen3-MoE with its last layer dense, and two skewed shapes (family_configs.hpp).
      {"tiny-qwen2-moe", 2, 5},
      {"tiny-qwen3-moe-mixed", 2, 7},
      {"moe-mixed-dense-first", 2, 3},
      {"moe-mixed-router-first", 2, 3}};
  int cases = 0;
  for (const auto& sh : shapes)
    // --capacity-factor: none, fewer expert rows than choices, more (E·c > b·s·K).
    for (double cf : {0.0, 0.6, 3.0}) {
      ModelConfig m = any_config(sh.preset);  // tiny-mixtral-aux: the load-balancing loss too
      const bool big = sh.preset.rfind("tiny", 0) != 0;          // (and the skewed ones: bf16 only)
      if (big && sh.preset.rfind("moe-", 0) != 0) m.layers = 2;  // two of a published model's
      for (DType dt : {DType::bf16, DType::f32, DType::f16})
        for (const char* ck : {"none", "full", "selective", "every:2"})
          for (Attention at : {Attention::eager, Attention::flash})
            for (Optimizer o : {Optimizer::adamw, Optimizer::sgd, Optimizer::adamw8bit,
                                Optimizer::paged_adamw8bit}) {
              if (big && dt != DType::bf16) continue;
              if (eight_bit_optimizer(o) && dt == DType::f16) continue;  // no fp16 loss scale
              TrainConfig t = train_config(sh.b, sh.s, dt, o, Checkpointing::none, at);
              set_checkpointing(t, m, ck);
              t.capacity_factor = cf;
              const std::string what = sh.preset + " b" + std::to_string(sh.b) + " s" +
                                       std::to_string(sh.s) + " " + dtype_name(dt) + " " + ck +
                                       " " + attention_name(at) + " " + optimizer_name(o) +
                                       " capacity factor " + std::to_string(cf);
              SCOPED_TRACE(what);
              expect_native_equals_ledger(m, t, BackendKind::meta, what);
              ++cases;
            }
    }
  EXPECT_EQ(cases, 3 * (7 * (96 - 16) + 8 * 32));
}

// The bytes do not depend on the routing: the cpu run's ledger is the meta trace's, event for
// event, and both equal the native profile.
TEST(MoeModel, CpuLedgerEqualsMetaTraceAndTheNativeProfile) {
  for (const char* name :
       {"tiny-mixtral", "tiny-qwen3-moe", "tiny-qwen2-moe-all", "tiny-qwen2-moe"})
    for (const char* ck : {"none", "full"}) {
      SCOPED_TRACE(std::string(name) + " " + ck);
      const ModelConfig m = any_config(name);
      TrainConfig t =
          train_config(2, 9, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::flash);
      set_checkpointing(t, m, ck);
      for (double cf : {0.0, 0.6}) {  // and with choices dropped by a capacity
        t.capacity_factor = cf;
        ModelRun cpu(BackendKind::cpu, m, t);
        ModelRun meta(BackendKind::meta, m, t);
        two_random_steps(*cpu.model);
        two_random_steps(*meta.model);
        expect_same_ledgers(*cpu.ledger, *meta.ledger);
        expect_same_figures(measured_figures(*cpu.ledger), estimate(Profile::native, m, t).figures,
                            std::string("cpu ") + name);
        if (cf > 0.0) {
          std::int64_t dropped = 0;
          for (const auto& r : cpu.model->routing()) dropped += r.dropped;
          EXPECT_GT(dropped, 0) << "the capacity dropped no choice";
        }
      }
    }
}

// A MoE config whose every layer is dense (mlp_only_layers lists them all) routes nothing: with
// output_router_logits its loss has no load-balancing term (no router logits; not 0/0), and its
// ledger is the native profile's.
TEST(MoeModel, AConfigWithEveryLayerDenseHasNoLoadBalancingLoss) {
  ModelConfig m = any_config("tiny-qwen3-moe");
  m.mlp_only_layers = {0, 1};
  m.output_router_logits = true;
  ModelConfig plain = m;
  plain.output_router_logits = false;
  const TrainConfig t =
      train_config(2, 9, DType::f32, Optimizer::adamw, Checkpointing::none, Attention::eager);
  auto loss = [&](const ModelConfig& c) {
    ModelRun r(BackendKind::cpu, c, t);
    r.model->init_random(3);
    r.model->random_tokens(4);
    const float l = r.model->train_step();
    expect_same_figures(measured_figures(*r.ledger), estimate(Profile::native, c, t).figures,
                        c.name);
    return l;
  };
  const float with = loss(m), without = loss(plain);
  EXPECT_TRUE(std::isfinite(with));
  EXPECT_EQ(std::memcmp(&with, &without, 4), 0) << with << " vs " << without;
}

// Under --capacity-factor each expert's buffers hold ⌈(b·s·K/E)·C⌉ rows, whatever the routing
// (Megatron's get_capacity, written here in double).
TEST(MoeModel, CapacityFactorSizesTheExpertRowsAsECeilOfTheAverageTimesC) {
  const ModelConfig m = preset("tiny-mixtral");
  const std::int64_t b = 2, s = 9, h = m.hidden, E = m.experts, K = m.experts_per_token,
                     mw = m.expert_intermediate, w = 2;
  TrainConfig t =
      train_config(b, s, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::flash);
  const std::uint64_t none = estimate(Profile::native, m, t).activations.per_layer_bytes;
  for (double cf : {0.3, 1.0, 1.25, 7.0}) {
    SCOPED_TRACE(cf);
    t.capacity_factor = cf;
    const auto rows = std::int64_t(std::ceil(double(b * s * K) / double(E) * cf)) * E;
    EXPECT_EQ(moe_rows(m, t), rows);
    const std::int64_t delta = (rows - b * s * K) * (2 * h + 3 * mw) * w;
    EXPECT_EQ(std::int64_t(estimate(Profile::native, m, t).activations.per_layer_bytes),
              std::int64_t(none) + delta);
  }
  t.capacity_factor = 1e12;  // E·c past the int32 indices
  EXPECT_THROW((void)estimate(Profile::native, m, t), InputError);
}

// Dropping changes the step only where a choice is dropped: with a capacity no expert reaches,
// the loss and gradients are the run's without one, bit for bit; under checkpointing the
// recompute drops the same choices again (no bit changes).
TEST(MoeModel, CapacityChangesNothingUntilAnExpertIsFullAndRecomputesTheSameDrops) {
  const ModelConfig m = preset("tiny-mixtral");
  auto run = [&](double cf, Checkpointing ck) {
    TrainConfig t = train_config(2, 13, DType::f32, Optimizer::adamw, ck, Attention::eager);
    t.capacity_factor = cf;
    ModelRun r(BackendKind::cpu, m, t);
    r.model->init_random(4);
    r.model->random_tokens(5);
    std::vector<float> losses;
    for (int i = 0; i < 2; ++i) losses.push_back(r.model->train_step());
    std::int64_t dropped = 0;
    for (const auto& l : r.model->routing()) dropped += l.dropped;
    return std::pair{losses, dropped};
  };
  const auto [base, d0] = run(0.0, Checkpointing::none);
  EXPECT_EQ(d0, 0);
  // 26·2/5 = 10.4 choices per expert on average; 5.0 gives 52 rows each, all of them.
  const auto [wide, d1] = run(5.0, Checkpointing::none);
  EXPECT_EQ(d1, 0);
  EXPECT_EQ(std::memcmp(base.data(), wide.data(), base.size() * 4), 0);
  const auto [tight, d2] = run(0.5, Checkpointing::none);
  EXPECT_GT(d2, 0);
  EXPECT_NE(tight[0], base[0]);
  const auto [tight_ck, d3] = run(0.5, Checkpointing::full);
  EXPECT_EQ(d3, d2);
  EXPECT_EQ(std::memcmp(tight.data(), tight_ck.data(), tight.size() * 4), 0);
}

// A layer's saved tensors, counted here from the shapes: the routing (fp32 softmax (b,s,E),
// int32 indices, fp32 weights, int32 positions (b,s,K) each, (E+1) int32 offsets) and the n·K
// expert rows (two of width h, three of width m) beside the attention's; a checkpointed layer
// keeps its output only.
TEST(MoeModel, SavedBytesPerLayerAreTheExpertsRowsAndTheRouting) {
  const ModelConfig m = preset("tiny-mixtral");
  const std::int64_t b = 2, s = 9, n = b * s, h = m.hidden, E = m.experts, K = m.experts_per_token,
                     mw = m.expert_intermediate, w = 2;
  const std::int64_t a = m.heads, kv = m.kv_heads, d = m.head_dim();
  const TrainConfig t =
      train_config(b, s, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::flash);
  const Estimate e = estimate(Profile::native, m, t);
  const std::int64_t attention = n * 4 /*rstd1*/ + n * h * w /*xn1*/ + n * a * d * w /*q*/ +
                                 2 * n * kv * d * w /*k, v*/ + b * a * s * 4 /*lse*/ +
                                 n * a * d * w /*attn_out*/ + n * h * w /*h_mid*/ +
                                 n * 4 /*rstd2*/ + n * h * w /*xn2*/;
  const std::int64_t routing = n * E * 4 + 3 * n * K * 4 + (E + 1) * 4;
  const std::int64_t experts = 2 * n * K * h * w + 3 * n * K * mw * w;
  EXPECT_EQ(std::int64_t(e.activations.per_layer_bytes),
            attention + routing + experts + n * h * w /*out*/);
}

TEST(MoeModel, WhatTheNativeMoeLayerDoesNotModelIsRefusedNamingIt) {
  auto refused = [](const ModelConfig& m, const TrainConfig& t, const std::string& needle) {
    try {
      (void)estimate(Profile::native, m, t);
      ADD_FAILURE() << "estimate: " << needle;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    try {
      ModelRun run(BackendKind::meta, m, t);
      ADD_FAILURE() << "step: " << needle;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const TrainConfig t =
      train_config(2, 9, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::flash);
  TrainConfig lora = t;
  lora.lora_rank = 4;
  lora.lora_targets = 3;  // q_proj, v_proj
  refused(preset("tiny-mixtral"), lora, "--finetune lora|qlora");
  TrainConfig lomo = t;
  lomo.optimizer = Optimizer::lomo;
  refused(preset("tiny-mixtral"), lomo, "--optimizer lomo");
}

}  // namespace
