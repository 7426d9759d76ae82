// Least-squares fits of per-layer activation bytes over a grid of runs. This is how a user
// checks a formula's coefficients against measurement: `trainmem sweep --fit`.
//
// The model being fitted (docs/design.md, "Analytic model"): per-layer activation bytes
//   y = c_sbh·s·b·h + c_sbi·s·b·i + c_as2b·a·s²·b + c_sb·s·b
// Which coefficients a grid can identify depends on what it varies:
//   - one model, a grid over (b, s): h, i and a are constant, so sbh, sbi and sb all move
//     together with b·s. The fit gives bytes per token per layer, reported as a coefficient
//     of sbh:  sbh = c_sbh + c_sbi·i/h + c_sb/h  (FitTerms::one_model), plus as2b.
//   - several widths (lists of --hidden / --intermediate / --heads): the separate sbh, sbi,
//     as2b and sb coefficients (FitTerms::separate).
// Terms the grid cannot identify (e.g. as2b with a single --seq) are refused with an
// InputError that says which flag to vary, never silently set to zero.
//
// The solver is Householder QR in long double on a column-scaled design matrix, so grids
// whose regressors differ by many orders of magnitude (s·b·h ~ 1e7, a·s²·b ~ 1e9) fit to the
// last byte.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace trainmem {

// One grid point: the shape and the measured per-layer activation bytes.
struct FitSample {
  std::int64_t batch = 0;         // b
  std::int64_t seq = 0;           // s
  std::int64_t hidden = 0;        // h
  std::int64_t intermediate = 0;  // i
  std::int64_t heads = 0;         // a
  double bytes = 0;               // y: per-layer activation bytes
};

enum class FitTerms { one_model, separate };

// The coefficient names a fit of that kind reports, in order: {"sbh", "as2b"} or
// {"sbh", "sbi", "as2b", "sb"}.
std::vector<std::string> fit_term_names(FitTerms terms);

// The regressor value of a named term at one sample ("sbh" -> s·b·h, ...).
long double fit_regressor(const std::string& term, const FitSample& x);

struct FitResult {
  FitTerms terms = FitTerms::one_model;
  std::map<std::string, double> coefficients;  // bytes per unit of each term
  std::vector<double> fitted;                  // per sample, bytes
  std::vector<double> residuals;               // per sample: measured − fitted, bytes
  double r2 = 0;  // 1 − SS_res / SS_tot (SS_tot about the mean; 1 when both are 0)
  double max_abs_residual = 0;
};

// Fits the samples. Throws InputError when there are fewer samples than terms or a term is
// not identifiable from the grid (the message names the term and the flag to vary).
FitResult fit_activation_coefficients(const std::vector<FitSample>& samples, FitTerms terms);

// Folds separate analytic coefficients {"sbh","sbi","as2b","sb"} into what a one-model fit
// reports: sbh' = sbh + sbi·i/h + sb/h, as2b unchanged. Missing keys count as 0.
std::map<std::string, double> fold_coefficients_one_model(
    const std::map<std::string, double>& separate, std::int64_t hidden, std::int64_t intermediate);

// ---- the general solver, exposed for tests ----
struct LeastSquares {
  std::vector<long double> x;               // the solution
  int rank = 0;                             // numerical rank of the (scaled) design matrix
  std::vector<int> rank_deficient_columns;  // columns that add nothing (when rank < cols)
};
// Minimises |A x − y|₂. `a` is row-major (rows × cols). Columns are scaled to unit norm,
// then Householder QR with column pivoting in long double; a column whose pivot falls below
// rel_tol × the largest pivot is reported in rank_deficient_columns and its x is 0.
LeastSquares solve_least_squares(const std::vector<long double>& a, std::size_t rows,
                                 std::size_t cols, const std::vector<long double>& y,
                                 long double rel_tol = 1e-12L);

}  // namespace trainmem
