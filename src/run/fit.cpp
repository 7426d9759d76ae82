// Least-squares coefficient fits (see include/trainmem/run/fit.hpp).
#include "trainmem/run/fit.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "trainmem/base/error.hpp"

namespace trainmem {

std::vector<std::string> fit_term_names(FitTerms terms) {
  if (terms == FitTerms::one_model) return {"sbh", "as2b"};
  return {"sbh", "sbi", "as2b", "sb"};
}

long double fit_regressor(const std::string& term, const FitSample& x) {
  const long double b = x.batch, s = x.seq, h = x.hidden, i = x.intermediate, a = x.heads;
  if (term == "sbh") return s * b * h;
  if (term == "sbi") return s * b * i;
  if (term == "as2b") return a * s * s * b;
  if (term == "sb") return s * b;
  throw Error("fit: unknown term '" + term + "'");
}

LeastSquares solve_least_squares(const std::vector<long double>& a_in, std::size_t rows,
                                 std::size_t cols, const std::vector<long double>& y_in,
                                 long double rel_tol) {
  if (a_in.size() != rows * cols || y_in.size() != rows)
    throw Error("solve_least_squares: matrix and vector sizes disagree");
  LeastSquares out;
  out.x.assign(cols, 0.0L);
  if (cols == 0) return out;

  // Scale every column to unit norm, so the pivots compare like with like.
  std::vector<long double> a = a_in;  // (rows, cols) row-major, reduced in place
  std::vector<long double> y = y_in;  // (rows)
  std::vector<long double> scale(cols, 1.0L);
  for (std::size_t j = 0; j < cols; ++j) {
    long double n2 = 0;
    for (std::size_t r = 0; r < rows; ++r) n2 += a[r * cols + j] * a[r * cols + j];
    if (n2 > 0) scale[j] = 1.0L / std::sqrt(n2);
    for (std::size_t r = 0; r < rows; ++r) a[r * cols + j] *= scale[j];
  }

  std::vector<std::size_t> perm(cols);
  std::iota(perm.begin(), perm.end(), std::size_t{0});
  auto at = [&](std::size_t r, std::size_t c) -> long double& { return a[r * cols + c]; };
  const std::size_t steps = std::min(rows, cols);
  long double first_pivot = 0;
  std::size_t rank = 0;
  for (std::size_t k = 0; k < steps; ++k) {
    // Pivot: the remaining column with the largest norm below row k.
    std::size_t best = k;
    long double best_n2 = -1;
    for (std::size_t j = k; j < cols; ++j) {
      long double n2 = 0;
      for (std::size_t r = k; r < rows; ++r) n2 += at(r, j) * at(r, j);
      if (n2 > best_n2) best_n2 = n2, best = j;
    }
    const long double norm = std::sqrt(std::max(best_n2, 0.0L));
    if (k == 0) first_pivot = norm;
    if (norm <= rel_tol * first_pivot || norm == 0) break;
    if (best != k) {
      for (std::size_t r = 0; r < rows; ++r) std::swap(at(r, k), at(r, best));
      std::swap(perm[k], perm[best]);
    }
    // Householder reflector v = x − alpha·e1 with alpha = −sign(x0)·|x| (no cancellation).
    const long double alpha = at(k, k) > 0 ? -norm : norm;
    std::vector<long double> v(rows - k);
    for (std::size_t r = k; r < rows; ++r) v[r - k] = at(r, k);
    v[0] -= alpha;
    long double vn2 = 0;
    for (long double t : v) vn2 += t * t;
    if (vn2 > 0) {
      for (std::size_t j = k; j < cols; ++j) {
        long double d = 0;
        for (std::size_t r = k; r < rows; ++r) d += v[r - k] * at(r, j);
        const long double f = 2 * d / vn2;
        for (std::size_t r = k; r < rows; ++r) at(r, j) -= f * v[r - k];
      }
      long double d = 0;
      for (std::size_t r = k; r < rows; ++r) d += v[r - k] * y[r];
      const long double f = 2 * d / vn2;
      for (std::size_t r = k; r < rows; ++r) y[r] -= f * v[r - k];
    }
    rank = k + 1;
  }

  // Back substitution on the leading rank × rank block of R.
  std::vector<long double> z(rank, 0.0L);
  for (std::size_t kk = rank; kk-- > 0;) {
    long double acc = y[kk];
    for (std::size_t j = kk + 1; j < rank; ++j) acc -= at(kk, j) * z[j];
    z[kk] = acc / at(kk, kk);
  }
  for (std::size_t kk = 0; kk < rank; ++kk) out.x[perm[kk]] = z[kk] * scale[perm[kk]];
  for (std::size_t kk = rank; kk < cols; ++kk)
    out.rank_deficient_columns.push_back(static_cast<int>(perm[kk]));
  std::sort(out.rank_deficient_columns.begin(), out.rank_deficient_columns.end());
  out.rank = static_cast<int>(rank);
  return out;
}

namespace {

// What to vary so that a term becomes identifiable.
const char* how_to_identify(const std::string& term, FitTerms terms) {
  if (term == "as2b") return "as2b needs at least two --seq values";
  if (terms == FitTerms::one_model) return "sbh needs at least one run";
  if (term == "sbh") return "sbh needs at least two --hidden values";
  if (term == "sbi") return "sbi needs --intermediate to vary independently of --hidden";
  return "sb needs --hidden and --intermediate to vary independently";
}

}  // namespace

FitResult fit_activation_coefficients(const std::vector<FitSample>& samples, FitTerms terms) {
  const std::vector<std::string> names = fit_term_names(terms);
  if (samples.size() < names.size()) {
    std::ostringstream m;
    m << "sweep --fit: " << samples.size() << " grid point(s) cannot determine " << names.size()
      << " coefficients (";
    for (std::size_t j = 0; j < names.size(); ++j) m << (j ? ", " : "") << names[j];
    m << "); give more --batch/--seq values";
    throw InputError(m.str());
  }
  const std::size_t rows = samples.size(), cols = names.size();
  std::vector<long double> a(rows * cols), y(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    const FitSample& x = samples[r];
    if (x.batch <= 0 || x.seq <= 0 || x.hidden <= 0 || x.intermediate <= 0 || x.heads <= 0)
      throw InputError("sweep --fit: grid point with a non-positive dimension");
    for (std::size_t j = 0; j < cols; ++j) a[r * cols + j] = fit_regressor(names[j], x);
    y[r] = x.bytes;
  }
  // 1e-10 relative: exact collinearity in long double leaves pivots near 1e-19; real,
  // if awkward, grids (s = 128 and 129) keep pivots above 1e-6.
  const LeastSquares ls = solve_least_squares(a, rows, cols, y, 1e-10L);
  if (!ls.rank_deficient_columns.empty()) {
    std::ostringstream m;
    m << "sweep --fit: the grid cannot identify ";
    for (std::size_t j = 0; j < ls.rank_deficient_columns.size(); ++j)
      m << (j ? ", " : "") << names[ls.rank_deficient_columns[j]];
    m << " (";
    for (std::size_t j = 0; j < ls.rank_deficient_columns.size(); ++j)
      m << (j ? "; " : "") << how_to_identify(names[ls.rank_deficient_columns[j]], terms);
    m << ")";
    throw InputError(m.str());
  }

  FitResult out;
  out.terms = terms;
  for (std::size_t j = 0; j < cols; ++j) out.coefficients[names[j]] = double(ls.x[j]);
  long double mean = 0;
  for (long double t : y) mean += t;
  mean /= static_cast<long double>(rows);
  long double ss_res = 0, ss_tot = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    long double f = 0;
    for (std::size_t j = 0; j < cols; ++j) f += a[r * cols + j] * ls.x[j];
    const long double res = y[r] - f;
    out.fitted.push_back(double(f));
    out.residuals.push_back(double(res));
    out.max_abs_residual = std::max(out.max_abs_residual, double(std::fabs(res)));
    ss_res += res * res;
    ss_tot += (y[r] - mean) * (y[r] - mean);
  }
  if (ss_tot > 0) {
    out.r2 = double(1.0L - ss_res / ss_tot);
  } else {
    out.r2 = ss_res == 0 ? 1.0 : 0.0;
  }
  return out;
}

std::map<std::string, double> fold_coefficients_one_model(
    const std::map<std::string, double>& separate, std::int64_t hidden, std::int64_t intermediate) {
  auto get = [&](const char* k) {
    auto it = separate.find(k);
    return it == separate.end() ? 0.0 : it->second;
  };
  const double h = static_cast<double>(hidden), i = static_cast<double>(intermediate);
  return {{"sbh", get("sbh") + get("sbi") * i / h + get("sb") / h}, {"as2b", get("as2b")}};
}

}  // namespace trainmem
