// Helpers for the op tests (tests/test_ops_*.cpp): typed host buffers in a storage dtype,
// random data, the per-dtype tolerance table, a comparison that prints the first mismatch and
// the max error, and central finite differences.
#pragma once
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/cpu_parallel.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem::testing {

// A host buffer holding n elements in storage dtype dt (fp32, or 16-bit bit patterns).
class Buf {
 public:
  Buf() = default;
  Buf(std::size_t n, DType dt) : n_(n), dt_(dt), bytes_(n * dtype_size(dt), 0) {}
  static Buf from(const std::vector<float>& x, DType dt) {
    Buf b(x.size(), dt);
    for (std::size_t i = 0; i < x.size(); ++i) store_from_f32(b.data(), i, dt, x[i]);
    return b;
  }
  std::vector<float> f32() const {
    std::vector<float> out(n_);
    for (std::size_t i = 0; i < n_; ++i) out[i] = load_as_f32(data(), i, dt_);
    return out;
  }
  std::vector<double> f64() const {
    std::vector<float> f = f32();
    return std::vector<double>(f.begin(), f.end());
  }
  float get(std::size_t i) const { return load_as_f32(data(), i, dt_); }
  void set(std::size_t i, float v) { store_from_f32(data(), i, dt_, v); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  std::size_t size() const { return n_; }
  DType dtype() const { return dt_; }

 private:
  std::size_t n_ = 0;
  DType dt_ = DType::f32;
  std::vector<unsigned char> bytes_;
};

inline std::vector<float> uniform(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                  float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> x(n);
  for (auto& v : x) v = d(gen);
  return x;
}
// x rounded through dt (what the op sees after the values are stored in dt).
inline std::vector<double> rounded(const std::vector<float>& x, DType dt) {
  std::vector<double> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = round_to(dt, x[i]);
  return out;
}

struct Tol {
  double atol;
  double rtol;
};
// The per-dtype tolerance table for an op's result against an fp64 reference on the same
// (rounded) inputs: one rounding of the result plus fp32 accumulation for fp32; the 16-bit
// rows allow for the result's rounding (bf16 2^-8, fp16 2^-11 relative) and a few rounded
// intermediates. `scale` widens the table for ops with long chains of rounded intermediates.
inline Tol tolerance(DType dt, double scale = 1.0) {
  switch (dt) {
    case DType::f32:
      return {2e-5 * scale, 2e-4 * scale};
    case DType::f16:
      return {2e-3 * scale, 4e-3 * scale};
    case DType::bf16:
      return {1.6e-2 * scale, 3e-2 * scale};
    default:
      return {0, 0};
  }
}

// |got - want| <= atol + rtol * |want| everywhere. On failure: the first mismatch and the
// max abs / rel error.
template <class G, class W>
::testing::AssertionResult all_close(const std::string& what, const std::vector<G>& got,
                                     const std::vector<W>& want, Tol tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " != expected " << want.size();
  double max_abs = 0, max_rel = 0;
  std::size_t first = got.size(), bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = double(got[i]), w = double(want[i]);
    const double err = std::fabs(g - w);
    // A NaN anywhere is a mismatch (a reference and an op broken the same way must not
    // pass); infinities match only the same infinity.
    const bool nonfinite_ok = std::isinf(g) && std::isinf(w) && g == w;
    const bool finite = std::isfinite(g) && std::isfinite(w);
    if ((!finite && !nonfinite_ok) || err > tol.atol + tol.rtol * std::fabs(w)) {
      if (first == got.size()) first = i;
      ++bad;
    }
    if (!std::isnan(err)) {
      max_abs = std::max(max_abs, err);
      if (w != 0) max_rel = std::max(max_rel, err / std::fabs(w));
    }
  }
  std::ostringstream msg;
  msg << what << ": max abs err " << max_abs << ", max rel err " << max_rel << " (atol " << tol.atol
      << ", rtol " << tol.rtol << ")";
  if (bad == 0) return ::testing::AssertionSuccess() << msg.str();
  msg << "; " << bad << " of " << got.size() << " mismatch, first at [" << first << "]: got "
      << double(got[first]) << ", expected " << double(want[first]);
  return ::testing::AssertionFailure() << msg.str();
}

// Central difference of a scalar function of one variable x_i, which `set` assigns.
inline double central_difference(const std::function<void(double)>& set, double x0, double h,
                                 const std::function<double()>& loss) {
  set(x0 + h);
  const double lp = loss();
  set(x0 - h);
  const double lm = loss();
  set(x0);
  return (lp - lm) / (2 * h);
}

inline double dot(const std::vector<double>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * double(b[i]);
  return s;
}

// Runs f with exactly n OpenMP threads (dynamic teams off), then restores the settings. The
// cpu ops must give the same bits for any team size.
template <class F>
void with_threads(int n, F&& f) {
  cpu_threads_setup();  // first, so that the ops' own one-time setup does not undo ours
  const int dyn = omp_get_dynamic(), max = omp_get_max_threads();
  omp_set_dynamic(0);
  omp_set_num_threads(n);
  f();
  omp_set_num_threads(max);
  omp_set_dynamic(dyn);
}

inline std::vector<DType> all_dtypes() {
  return {DType::f32, DType::bf16, DType::f16};
}
inline std::string dtype_label(DType dt) {
  return dt == DType::f32 ? "fp32" : dt == DType::bf16 ? "bf16" : "fp16";
}

}  // namespace trainmem::testing
