// Coefficient fits: recovery of known coefficients from exact and noisy grids, identifiability
// errors, the folding of separate coefficients into a one-model sbh, and the solver on badly
// scaled problems.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "trainmem/base/error.hpp"
#include "trainmem/run/fit.hpp"

namespace trainmem {
namespace {

// Per-layer bytes of the native plan (docs/native-plan.md), written out here independently:
// xn1, q, attn_out, h_mid, xn2, out at w·sbh; k, v at w·s·b·kd; gate, up, act at w·sbi;
// probs (eager) at w·as²b; rstd1, rstd2 at 4·sb.
double native_layer_bytes(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t i,
                          std::int64_t a, std::int64_t k, double w) {
  const double sbh = double(s) * b * h, kd = double(k) * (h / a);
  return 6 * w * sbh + 2 * w * s * b * kd + 3 * w * double(s) * b * i + w * double(a) * s * s * b +
         8.0 * s * b;
}

TEST(Fit, OneModelRecoversFoldedCoefficientsExactly) {
  // LLaMA-7B widths, bf16, GQA-free: folded sbh = 8w + 3w·i/h + 8/h.
  const std::int64_t h = 4096, i = 11008, a = 32;
  std::vector<FitSample> grid;
  for (std::int64_t b : {1, 2, 4, 8})
    for (std::int64_t s : {128, 256, 512}) {
      grid.push_back({b, s, h, i, a, native_layer_bytes(b, s, h, i, a, a, 2.0)});
    }
  const FitResult f = fit_activation_coefficients(grid, FitTerms::one_model);
  const double want_sbh = 16.0 + 6.0 * 11008.0 / 4096.0 + 8.0 / 4096.0;
  // Exact data: the solve in long double (2^-64 = 5.4e-20) times the scaled system's condition
  // number, then one rounding to double (1.1e-16): ~1e-15; 1e-12 allows a condition number ~1e4
  // through the double rounding of the inputs (byte counts < 2^53 are exact).
  EXPECT_NEAR(f.coefficients.at("sbh"), want_sbh, want_sbh * 1e-12);
  EXPECT_NEAR(f.coefficients.at("as2b"), 2.0, 2e-12);
  EXPECT_EQ(f.coefficients.size(), 2u);
  EXPECT_DOUBLE_EQ(f.r2, 1.0);
  ASSERT_EQ(f.residuals.size(), grid.size());
  for (std::size_t r = 0; r < grid.size(); ++r) {
    EXPECT_LT(std::fabs(f.residuals[r]), 1e-3) << "grid point " << r;
    // fitted values ~1e9 B (double ulp 1.2e-7): a few ulps; 1e-3 B is the resolution that matters
    // (a fraction of a byte), not a rounding bound.
    EXPECT_NEAR(f.fitted[r], grid[r].bytes, 1e-3);
  }
}

TEST(Fit, SeparateTermsRecoveredOverSeveralWidths) {
  // GQA with k/a = 1/2 folds k and v into 1·w·sbh: c_sbh = 7w.
  std::vector<FitSample> grid;
  for (std::int64_t h : {64, 96})
    for (std::int64_t i : {160, 256})
      for (std::int64_t a : {2, 4})
        for (std::int64_t s : {16, 24}) {
          const std::int64_t b = 3;
          grid.push_back({b, s, h, i, a, native_layer_bytes(b, s, h, i, a, a / 2, 4.0)});
        }
  const FitResult f = fit_activation_coefficients(grid, FitTerms::separate);
  // Exact data, 4 scaled columns: ~1e-14 expected from the solve; 1e-9 of a byte per unit.
  EXPECT_NEAR(f.coefficients.at("sbh"), 28.0, 1e-9);
  EXPECT_NEAR(f.coefficients.at("sbi"), 12.0, 1e-9);
  EXPECT_NEAR(f.coefficients.at("as2b"), 4.0, 1e-9);
  EXPECT_NEAR(f.coefficients.at("sb"), 8.0, 1e-9);
  EXPECT_NEAR(f.r2, 1.0, 1e-12);
}

TEST(Fit, NoisyTwoTermFitMatchesClosedFormNormalEquations) {
  // y = 34·x1 + 5·x2 + noise; compare with the 2×2 normal equations solved by Cramer's rule.
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0.0, 500.0);
  std::vector<FitSample> grid;
  for (std::int64_t b : {1, 2, 3, 5})
    for (std::int64_t s : {32, 48, 64}) {
      FitSample x{b, s, 128, 352, 4, 0};
      x.bytes = 34.0 * s * b * 128 + 5.0 * 4 * s * s * b + noise(rng);
      grid.push_back(x);
    }
  double s11 = 0, s12 = 0, s22 = 0, t1 = 0, t2 = 0;
  for (const auto& x : grid) {
    const double x1 = double(x.seq) * x.batch * x.hidden;
    const double x2 = double(x.heads) * x.seq * x.seq * x.batch;
    s11 += x1 * x1, s12 += x1 * x2, s22 += x2 * x2, t1 += x1 * x.bytes, t2 += x2 * x.bytes;
  }
  const double det = s11 * s22 - s12 * s12;
  const double c1 = (t1 * s22 - s12 * t2) / det, c2 = (s11 * t2 - s12 * t1) / det;
  const FitResult f = fit_activation_coefficients(grid, FitTerms::one_model);
  // The 2x2 normal equations in double square the condition number (~1e3 → ~1e6 here), so the
  // closed form is good to ~1e6·1.1e-16 ~ 1e-10 relative; 1e-9 covers it.
  EXPECT_NEAR(f.coefficients.at("sbh"), c1, std::fabs(c1) * 1e-9);
  EXPECT_NEAR(f.coefficients.at("as2b"), c2, std::fabs(c2) * 1e-9);
  EXPECT_GT(f.r2, 0.999);
  EXPECT_LT(f.r2, 1.0);
  // Residuals are orthogonal to each regressor at the optimum.
  double dot1 = 0, scale1 = 0;
  for (std::size_t r = 0; r < grid.size(); ++r) {
    const double x1 = double(grid[r].seq) * grid[r].batch * grid[r].hidden;
    dot1 += f.residuals[r] * x1;
    scale1 += std::fabs(f.residuals[r] * x1);
  }
  EXPECT_LT(std::fabs(dot1), scale1 * 1e-9);
}

TEST(Fit, SingleSequenceLengthCannotIdentifyAs2b) {
  std::vector<FitSample> grid;
  for (std::int64_t b : {1, 2, 4}) grid.push_back({b, 128, 64, 172, 4, 1000.0 * b});
  try {
    fit_activation_coefficients(grid, FitTerms::one_model);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--seq"), std::string::npos) << e.what();
  }
}

TEST(Fit, OneHiddenSizeCannotSeparateSbhFromSb) {
  std::vector<FitSample> grid;
  for (std::int64_t i : {160, 256})
    for (std::int64_t s : {16, 32})
      for (std::int64_t b : {1, 2})
        grid.push_back({b, s, 64, i, 4, native_layer_bytes(b, s, 64, i, 4, 4, 2.0)});
  try {
    fit_activation_coefficients(grid, FitTerms::separate);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot identify"), std::string::npos) << e.what();
  }
}

TEST(Fit, TooFewGridPointsIsAnInputError) {
  std::vector<FitSample> grid{{1, 128, 64, 172, 4, 1.0}};
  EXPECT_THROW(fit_activation_coefficients(grid, FitTerms::one_model), InputError);
}

TEST(Fit, FoldingSeparateIntoOneModel) {
  // 7B, fp16: 8w + 3w·i/h + 8/h with w = 2.
  const auto f =
      fold_coefficients_one_model({{"sbh", 16}, {"sbi", 6}, {"as2b", 2}, {"sb", 8}}, 4096, 11008);
  EXPECT_DOUBLE_EQ(f.at("sbh"), 16.0 + 6.0 * 11008.0 / 4096.0 + 8.0 / 4096.0);
  EXPECT_DOUBLE_EQ(f.at("as2b"), 2.0);
  const auto g = fold_coefficients_one_model({{"sbh", 3}}, 100, 200);
  EXPECT_DOUBLE_EQ(g.at("sbh"), 3.0);
  EXPECT_DOUBLE_EQ(g.at("as2b"), 0.0);
}

TEST(LeastSquares, BadlyScaledColumnsSolvedExactly) {
  // Columns differing by 1e12 in scale: unscaled normal equations in double lose the small
  // one entirely; the scaled QR recovers both.
  const std::vector<long double> a = {1e12L, 1, 2e12L, 3, 3e12L, 7, 5e12L, 2};
  std::vector<long double> y;
  for (int r = 0; r < 4; ++r) y.push_back(a[r * 2] * 0.25L + a[r * 2 + 1] * 1234.5L);
  const LeastSquares ls = solve_least_squares(a, 4, 2, y);
  EXPECT_EQ(ls.rank, 2);
  EXPECT_TRUE(ls.rank_deficient_columns.empty());
  // y ~ 1e12 in long double (ulp 1.1e-19·1.25e12 = 1.4e-7), so the small column's coefficient
  // is determined only to ~1e-7 absolute (its entries are 1..7): 1e-6. x[0] sees the same
  // errors divided by its 1e12 scale: ~1e-19, under a few double ulps of 0.25: 1e-15.
  EXPECT_NEAR(double(ls.x[0]), 0.25, 1e-15);
  EXPECT_NEAR(double(ls.x[1]), 1234.5, 1e-6);
}

TEST(LeastSquares, ReportsCollinearColumns) {
  // Column 2 = 3 × column 0.
  const std::vector<long double> a = {1, 5, 3, 2, 1, 6, 4, 0, 12, 7, 2, 21};
  const std::vector<long double> y = {1, 2, 3, 4};
  const LeastSquares ls = solve_least_squares(a, 4, 3, y);
  EXPECT_EQ(ls.rank, 2);
  ASSERT_EQ(ls.rank_deficient_columns.size(), 1u);
  const int dropped = ls.rank_deficient_columns[0];
  EXPECT_TRUE(dropped == 0 || dropped == 2) << dropped;
  EXPECT_EQ(double(ls.x[dropped]), 0.0);
}

TEST(LeastSquares, OverdeterminedInconsistentSystemMinimisesResidual) {
  // Fit y = c over {1, 2, 3, 6}: the mean, 3.
  const std::vector<long double> a = {1, 1, 1, 1};
  const std::vector<long double> y = {1, 2, 3, 6};
  const LeastSquares ls = solve_least_squares(a, 4, 1, y);
  // The mean of four small integers in long double: exact or an ulp off; 1e-15 is ~2 double ulps
  // of 3.
  EXPECT_NEAR(double(ls.x[0]), 3.0, 1e-15);
}

}  // namespace
}  // namespace trainmem
