// RMSNorm: the shared row math against fp64 central differences, the cpu op's backward
// against fp32 finite differences (including the += accumulation into dinp and dweight), and
// forward/backward against a naive fp64 reference over dtype x shape.
#include <gtest/gtest.h>

#include <cmath>

#include "ops_testing.hpp"
#include "rmsnorm/rmsnorm.hpp"
#include "rmsnorm/rmsnorm_math.hpp"

namespace trainmem {
namespace {
using namespace trainmem::testing;

// One row through the shared math, in double.
std::vector<double> math_row_forward(const std::vector<double>& x, const std::vector<double>& w,
                                     double eps) {
  const std::int64_t h = std::int64_t(x.size());
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = rmsnorm_rstd(ss, h, eps);
  std::vector<double> y(h);
  for (std::int64_t c = 0; c < h; ++c) y[c] = rmsnorm_out(x[c], r, w[c]);
  return y;
}

TEST(OpsRmsnorm, MathBackwardMatchesFp64FiniteDifferences) {
  const std::int64_t h = 13;
  const double eps = 1e-5;
  std::vector<double> x(h), w(h), dy(h);
  auto fx = uniform(h, 1, -2, 2), fw = uniform(h, 2, 0.5, 1.5), fdy = uniform(h, 3);
  for (int c = 0; c < h; ++c) x[c] = fx[c], w[c] = fw[c], dy[c] = fdy[c];
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = rmsnorm_rstd(ss, h, eps);
  double dot = 0;
  for (int c = 0; c < h; ++c) dot += rmsnorm_dot_term(dy[c], w[c], x[c]);
  auto loss = [&] {
    auto y = math_row_forward(x, w, eps);
    double s = 0;
    for (int c = 0; c < h; ++c) s += dy[c] * y[c];
    return s;
  };
  for (int c = 0; c < h; ++c) {
    const double fd_x = central_difference([&](double v) { x[c] = v; }, x[c], 1e-5, loss);
    const double fd_w = central_difference([&](double v) { w[c] = v; }, w[c], 1e-5, loss);
    // fp64, h = 1e-5: truncation h^2/6·|f^(3)| ~ 2e-11; rounding eps·|loss|/h ~ 1e-11·|loss|;
    // 1e-8 is ~100x, for |loss| and f^(3) of a few units.
    EXPECT_NEAR(rmsnorm_dinp(x[c], w[c], dy[c], r, dot, h), fd_x, 1e-8) << "c " << c;
    EXPECT_NEAR(rmsnorm_dweight_term(x[c], dy[c], r), fd_w, 1e-8) << "c " << c;
  }
}

TEST(OpsRmsnorm, CpuBackwardMatchesFp32FiniteDifferences) {
  const std::int64_t n = 14, h = 13;  // b 2 x s 7 rows
  const float eps = 1e-5f;
  Buf inp = Buf::from(uniform(n * h, 4, -2, 2), DType::f32);
  Buf weight = Buf::from(uniform(h, 5, 0.5, 1.5), DType::f32);
  const std::vector<float> w = uniform(n * h, 6);
  Buf out(n * h, DType::f32);
  std::vector<float> rstd(n);
  auto loss = [&] {
    rmsnorm_forward_cpu(out.data(), rstd.data(), inp.data(), weight.data(), n, h, eps, DType::f32);
    double s = 0;
    for (std::int64_t i = 0; i < n * h; ++i) s += double(w[i]) * out.get(i);
    return s;
  };
  loss();
  // Gradients accumulate: start from non-zero buffers and compare the increments.
  const std::vector<float> dinp0 = uniform(n * h, 7), dw0 = uniform(h, 8);
  Buf dinp = Buf::from(dinp0, DType::f32), dweight = Buf::from(dw0, DType::f32);
  Buf dout = Buf::from(w, DType::f32);
  rmsnorm_backward_cpu(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(),
                       rstd.data(), n, h, DType::f32);
  std::vector<double> fd_x(n * h), fd_w(h), got_x(n * h), got_w(h);
  for (std::int64_t i = 0; i < n * h; ++i) {
    fd_x[i] = central_difference([&](double v) { inp.set(i, float(v)); }, inp.get(i), 1e-2, loss);
    got_x[i] = double(dinp.get(i)) - dinp0[i];
  }
  for (std::int64_t c = 0; c < h; ++c) {
    fd_w[c] =
        central_difference([&](double v) { weight.set(c, float(v)); }, weight.get(c), 1e-2, loss);
    got_w[c] = double(dweight.get(c)) - dw0[c];
  }
  // fp32 forward, h = 1e-2: truncation h^2/6·|f^(3)| = 1.7e-5·|f^(3)| (rtol); the fp32 loss's
  // rounding (~h_dim·u·|loss| ~ 1e-5) over 2h = 0.02: ~5e-4 absolute (atol 4x).
  EXPECT_TRUE(all_close("dinp", got_x, fd_x, {2e-3, 1e-2}));
  EXPECT_TRUE(all_close("dweight", got_w, fd_w, {2e-3, 1e-2}));
}

struct RmsCase {
  DType dt;
  std::int64_t n, h;
};
void PrintTo(const RmsCase& c, std::ostream* os) {
  *os << dtype_label(c.dt) << " n " << c.n << " h " << c.h;
}
class OpsRmsnormP : public ::testing::TestWithParam<RmsCase> {};

TEST_P(OpsRmsnormP, MatchesNaiveReference) {
  const auto [dt, n, h] = GetParam();
  const float eps = 1e-6f;
  Buf inp = Buf::from(uniform(n * h, 21, -3, 3), dt), weight = Buf::from(uniform(h, 22), dt);
  Buf dout = Buf::from(uniform(n * h, 23), dt);
  Buf dinp = Buf::from(uniform(n * h, 24), dt), dweight = Buf::from(uniform(h, 25), dt);
  const std::vector<double> dinp0 = dinp.f64(), dw0 = dweight.f64();
  Buf out(n * h, dt);
  std::vector<float> rstd(n);
  rmsnorm_forward_cpu(out.data(), rstd.data(), inp.data(), weight.data(), n, h, eps, dt);
  rmsnorm_backward_cpu(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(),
                       rstd.data(), n, h, dt);
  // Naive reference: y = x / sqrt(mean x^2 + eps) * w, gradients by the chain rule.
  const std::vector<double> x = inp.f64(), wt = weight.f64(), dy = dout.f64();
  std::vector<double> ref_out(n * h), ref_rstd(n), ref_dinp(dinp0), ref_dw(dw0);
  for (std::int64_t row = 0; row < n; ++row) {
    double ms = 0;
    for (std::int64_t c = 0; c < h; ++c) ms += x[row * h + c] * x[row * h + c] / double(h);
    const double r = 1.0 / std::sqrt(ms + eps);
    ref_rstd[row] = r;
    double g = 0;  // sum_c dy_c w_c x_c
    for (std::int64_t c = 0; c < h; ++c) g += dy[row * h + c] * wt[c] * x[row * h + c];
    for (std::int64_t c = 0; c < h; ++c) {
      const std::int64_t i = row * h + c;
      ref_out[i] = x[i] * r * wt[c];
      ref_dinp[i] += dy[i] * wt[c] * r - x[i] * r * r * r * g / double(h);
      ref_dw[c] += dy[i] * x[i] * r;
    }
  }
  // rstd: h squares summed in fp32 ((h-1)u), sqrt, reciprocal: the f32 row. out = x·rstd·w and
  // dinp = (dy·w·r - x·r^3·g/h) in fp32 then one rounding to D: the D row.
  const Tol tol = tolerance(dt);
  EXPECT_TRUE(all_close("rstd", rstd, ref_rstd, tolerance(DType::f32)));
  EXPECT_TRUE(all_close("out", out.f32(), ref_out, tol));
  EXPECT_TRUE(all_close("dinp", dinp.f32(), ref_dinp, tol));
  // dweight, bounded element by element from the kernel's arithmetic (rmsnorm_cpu.cpp): the
  // inputs are exact in fp32 (they are dt values) and so is the reference's use of them.
  //   rstd: h squares summed in fp32 (all positive: relative error <= (h-1)u), then / h, + eps,
  //     sqrt and the reciprocal (one rounding each): <= (h+3)u relative, u = 2^-24;
  //   each row's term dy·x·rstd: two more roundings;
  //   the sum over n rows in chunks, the chunks' sum and the add to the old dweight: at most
  //     n + 1 additions on any path, <= (n+1)u times the sum of the magnitudes;
  //   so in fp32: |v - ref| <= (h + n + 6)u · (sum_rows |dy·x·rstd| + |dweight_0|) = e32;
  //   then one store in dt, round to nearest: <= u_dt·|v| <= u_dt·(|ref| + e32), with
  //   u_dt = 0 (fp32), 2^-11 (fp16), 2^-8 (bf16) relative.
  // A value one bf16 ulp (2^-7 relative) further from the reference than its rounding fails.
  const double u = std::ldexp(1.0, -24);
  const double u_dt = dt == DType::f32 ? 0.0 : std::ldexp(1.0, dt == DType::f16 ? -11 : -8);
  const std::vector<double> got_dw = dweight.f64();
  for (std::int64_t c = 0; c < h; ++c) {
    double mag = std::fabs(dw0[c]);
    for (std::int64_t row = 0; row < n; ++row)
      mag += std::fabs(dy[row * h + c] * x[row * h + c] * ref_rstd[row]);
    const double e32 = double(h + n + 6) * u * mag;
    const double bound = u_dt * (std::fabs(ref_dw[c]) + e32) + e32;
    EXPECT_LE(std::fabs(got_dw[c] - ref_dw[c]), bound)
        << "dweight[" << c << "] " << got_dw[c] << " vs " << ref_dw[c];
  }
}

TEST(OpsRmsnorm, SameBitsForAnyThreadCount) {
  const std::int64_t n = 300, h = 130;
  const auto x = uniform(n * h, 31), w = uniform(h, 32), dy = uniform(n * h, 33);
  auto run = [&](std::vector<float>& out, std::vector<float>& dx, std::vector<float>& dw) {
    std::vector<float> rstd(n);
    out.assign(n * h, 0.0f);
    dx.assign(n * h, 0.0f);
    dw.assign(h, 0.0f);
    rmsnorm_forward_cpu(out.data(), rstd.data(), x.data(), w.data(), n, h, 1e-5f, DType::f32);
    rmsnorm_backward_cpu(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), n, h,
                         DType::f32);
  };
  std::vector<float> o1, dx1, dw1, o3, dx3, dw3;
  with_threads(1, [&] { run(o1, dx1, dw1); });
  with_threads(3, [&] { run(o3, dx3, dw3); });
  EXPECT_EQ(o1, o3);
  EXPECT_EQ(dx1, dx3);
  EXPECT_EQ(dw1, dw3);
}

INSTANTIATE_TEST_SUITE_P(DtypeByShape, OpsRmsnormP,
                         ::testing::Values(RmsCase{DType::f32, 14, 13}, RmsCase{DType::f32, 3, 1},
                                           RmsCase{DType::f32, 70, 257},
                                           RmsCase{DType::bf16, 14, 13},
                                           RmsCase{DType::bf16, 70, 257},
                                           RmsCase{DType::f16, 14, 13},
                                           RmsCase{DType::f16, 70, 257}),
                         [](const auto& info) {
                           return dtype_label(info.param.dt) + "_n" + std::to_string(info.param.n) +
                                  "_h" + std::to_string(info.param.h);
                         });

}  // namespace
}  // namespace trainmem
