// Cross-entropy: the shared log-sum-exp state and per-element gradient against fp64 finite
// differences; the cpu op against fp32 finite differences with ignored targets (-1); forward
// and backward (also in place) against a naive fp64 reference over dtype x shape.
#include <gtest/gtest.h>

#include <cmath>

#include "cross_entropy/cross_entropy.hpp"
#include "cross_entropy/cross_entropy_math.hpp"
#include "ops_testing.hpp"

namespace trainmem {
namespace {
using namespace trainmem::testing;

TEST(OpsCrossEntropy, MathLseStateAndGradientInFp64) {
  const std::int64_t V = 11;
  const auto f = uniform(V, 71, -30, 30);
  std::vector<double> x(f.begin(), f.end());
  auto naive_lse = [&] {
    double mx = -INFINITY;
    for (double v : x) mx = std::max(mx, v);
    double s = 0;
    for (double v : x) s += std::exp(v - mx);
    return mx + std::log(s);
  };
  // Online update, and merging two partial states, both equal the naive value.
  LseState<double> st = LseState<double>::empty(), a = st, b = st;
  for (std::int64_t j = 0; j < V; ++j) {
    lse_update(&st, x[j]);
    lse_update(j < 4 ? &a : &b, x[j]);
  }
  // fp64 over V terms: ~(V + 3)·eps·|lse| (eps = 1.1e-16), ~1e-14; 1e-12 leaves room for |lse|
  // up to 100. Merging with the empty state must be exact (0).
  EXPECT_NEAR(lse_finish(st), naive_lse(), 1e-12);
  EXPECT_NEAR(lse_finish(lse_merge(a, b)), naive_lse(), 1e-12);
  EXPECT_NEAR(lse_finish(lse_merge(LseState<double>::empty(), a)), lse_finish(a), 0);
  // Gradient of loss = lse - x[t] against central differences.
  const int t = 3;
  const double scale = 0.7;
  const double lse = naive_lse();
  auto loss = [&] { return scale * cross_entropy_loss(naive_lse(), x[t]); };
  for (std::int64_t j = 0; j < V; ++j) {
    const double fd = central_difference([&](double v) { x[j] = v; }, x[j], 1e-5, loss);
    // fp64, h = 1e-5: truncation h^2/6·|f^(3)| <= 1.7e-11; rounding eps·|loss|/h = 1.1e-11·|loss|;
    // 1e-9 covers |loss| up to ~50.
    EXPECT_NEAR(cross_entropy_dlogit(x[j], lse, j == t, scale), fd, 1e-9) << "j " << j;
  }
}

TEST(OpsCrossEntropy, CpuBackwardMatchesFp32FiniteDifferences) {
  const std::int64_t n = 14, V = 11;
  std::vector<std::int32_t> targets = {3, -1, 10, 0, 5, 5, -1, 7, 1, 2, 9, 8, 4, 6};
  Buf logits = Buf::from(uniform(n * V, 72, -3, 3), DType::f32);
  std::vector<float> losses(n), lse(n);
  const float scale = 1.0f / 12;  // mean over the 12 counted positions
  auto loss = [&] {
    cross_entropy_forward_cpu(losses.data(), lse.data(), logits.data(), targets.data(), n, V,
                              DType::f32);
    double s = 0;
    for (float l : losses) s += l;
    return s * scale;
  };
  loss();
  for (std::int64_t row = 0; row < n; ++row) {
    if (targets[row] < 0) {
      EXPECT_EQ(losses[row], 0.0f) << "ignored row " << row;
    }
  }
  Buf dlogits(n * V, DType::f32);
  cross_entropy_backward_cpu(dlogits.data(), logits.data(), lse.data(), targets.data(), n, V, scale,
                             DType::f32);
  std::vector<double> fd(n * V);
  for (std::int64_t i = 0; i < n * V; ++i)
    fd[i] =
        central_difference([&](double v) { logits.set(i, float(v)); }, logits.get(i), 1e-2, loss);
  // fp32 forward, h = 1e-2: truncation h^2/6·|f^(3)|, |d^3 lse/dx^3| = |p(1-p)(1-2p)| <= 0.1:
  // <= 1.7e-6·scale; rounding of the fp32 summed loss (~(V+n)·u·|loss| ~ 1e-6) over 2h: ~5e-5.
  // atol 2e-4 is 4x that; rtol 1e-2 is slack for the larger gradients.
  EXPECT_TRUE(all_close("dlogits", dlogits.f32(), fd, {2e-4, 1e-2}));
  for (std::int64_t j = 0; j < V; ++j) EXPECT_EQ(dlogits.get(1 * V + j), 0.0f);
}

struct CeCase {
  DType dt;
  std::int64_t n, V;
};
void PrintTo(const CeCase& c, std::ostream* os) {
  *os << dtype_label(c.dt) << " n " << c.n << " V " << c.V;
}
class OpsCrossEntropyP : public ::testing::TestWithParam<CeCase> {};

TEST_P(OpsCrossEntropyP, MatchesNaiveReferenceAndRunsInPlace) {
  const auto [dt, n, V] = GetParam();
  std::vector<std::int32_t> targets(n);
  std::mt19937 gen(73);
  for (auto& t : targets) t = std::int32_t(gen() % std::uint32_t(V));
  targets[n / 2] = -1;
  Buf logits = Buf::from(uniform(n * V, 74, -8, 8), dt);
  const std::vector<double> x = logits.f64();
  const float scale = 0.37f;
  std::vector<float> losses(n), lse(n);
  cross_entropy_forward_cpu(losses.data(), lse.data(), logits.data(), targets.data(), n, V, dt);
  std::vector<double> ref_loss(n), ref_lse(n), ref_d(n * V);
  for (std::int64_t row = 0; row < n; ++row) {
    double mx = -INFINITY, s = 0;
    for (std::int64_t j = 0; j < V; ++j) mx = std::max(mx, x[row * V + j]);
    for (std::int64_t j = 0; j < V; ++j) s += std::exp(x[row * V + j] - mx);
    ref_lse[row] = mx + std::log(s);
    ref_loss[row] = targets[row] < 0 ? 0.0 : ref_lse[row] - x[row * V + targets[row]];
    for (std::int64_t j = 0; j < V; ++j)
      ref_d[row * V + j] =
          targets[row] < 0
              ? 0.0
              : scale * (std::exp(x[row * V + j] - ref_lse[row]) - (j == targets[row] ? 1.0 : 0.0));
  }
  // lse and losses are fp32 computations on the stored logits, whatever D is.
  // lse: fp32 max, V exps and adds, a log: <= (V + 2)u relative to the sum, so ~V·u absolute in
  // lse (|lse| <= 8 + log V): the f32 row. A loss = lse - x_t is up to ~10x smaller than lse, and
  // its error is lse's in absolute terms: 10x the row.
  EXPECT_TRUE(all_close("lse", lse, ref_lse, tolerance(DType::f32)));
  EXPECT_TRUE(all_close("losses", losses, ref_loss, tolerance(DType::f32, 10)));
  Buf d(n * V, dt);
  cross_entropy_backward_cpu(d.data(), logits.data(), lse.data(), targets.data(), n, V, scale, dt);
  // scale·(exp(x - lse) - [j = t]) in fp32 (~4u) then one rounding to D: one row.
  EXPECT_TRUE(all_close("dlogits", d.f32(), ref_d, tolerance(dt)));
  // In place: dlogits aliases logits, bit-identical to the out-of-place result.
  cross_entropy_backward_cpu(logits.data(), logits.data(), lse.data(), targets.data(), n, V, scale,
                             dt);
  EXPECT_EQ(logits.f32(), d.f32());
}

INSTANTIATE_TEST_SUITE_P(DtypeByShape, OpsCrossEntropyP,
                         ::testing::Values(CeCase{DType::f32, 14, 11}, CeCase{DType::bf16, 14, 11},
                                           CeCase{DType::f16, 14, 11}, CeCase{DType::f32, 33, 1000},
                                           CeCase{DType::bf16, 33, 1000},
                                           CeCase{DType::f16, 33, 1000}),
                         [](const auto& info) {
                           return dtype_label(info.param.dt) + "_n" + std::to_string(info.param.n) +
                                  "_V" + std::to_string(info.param.V);
                         });

TEST(OpsCrossEntropy, TargetOutsideVocabularyIsRejected) {
  std::vector<float> logits(2 * 4), losses(2), lse(2);
  std::vector<std::int32_t> targets = {1, 4};
  try {
    cross_entropy_forward_cpu(losses.data(), lse.data(), logits.data(), targets.data(), 2, 4,
                              DType::f32);
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "targets: id 4 at position 1 is outside the vocabulary [0, 4) (negative ids "
                 "mark ignored positions)");
  }
}

}  // namespace
}  // namespace trainmem
