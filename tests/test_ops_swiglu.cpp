// SwiGLU: the shared math's backward against fp64 central differences, the cpu op's backward
// against fp32 finite differences, and forward/backward against a naive fp64 reference over
// dtype x size.
#include <gtest/gtest.h>

#include <cmath>

#include "ops_testing.hpp"
#include "swiglu/swiglu.hpp"
#include "swiglu/swiglu_math.hpp"

namespace trainmem {
namespace {
using namespace trainmem::testing;

TEST(OpsSwiglu, MathBackwardMatchesFp64FiniteDifferences) {
  for (double g = -20; g <= 20; g += 0.37) {
    for (double u : {-3.0, -0.5, 0.25, 2.0}) {
      double dg, du;
      swiglu_backward_elem<double>(1.0, g, u, &dg, &du);
      const double h = 1e-5;
      const double fd_g =
          (swiglu_forward_elem<double>(g + h, u) - swiglu_forward_elem<double>(g - h, u)) / (2 * h);
      const double fd_u =
          (swiglu_forward_elem<double>(g, u + h) - swiglu_forward_elem<double>(g, u - h)) / (2 * h);
      // fp64, h = 1e-5: truncation h^2/6·|f^(3)| (f^(3) = O(|u|) <= 3): 5e-11; rounding of the
      // forward (~3 eps·|f|, |f| <= 20·3 = 60) over 2h: 1e-9. 1e-8 + 1e-7|fd| is 10x.
      EXPECT_NEAR(dg, fd_g, 1e-8 + 1e-7 * std::fabs(fd_g)) << "g " << g << " u " << u;
      EXPECT_NEAR(du, fd_u, 1e-8 + 1e-7 * std::fabs(fd_u)) << "g " << g << " u " << u;
    }
  }
  EXPECT_DOUBLE_EQ(silu(0.0), 0.0);
  // fp64 on 0.73: exp, add, divide, ~3 eps = 2.4e-16; 1e-15 is 4x.
  EXPECT_NEAR(silu(1.0), 1.0 / (1.0 + std::exp(-1.0)), 1e-15);
}

TEST(OpsSwiglu, CpuBackwardMatchesFp32FiniteDifferences) {
  const std::int64_t n = 37;
  Buf gate = Buf::from(uniform(n, 1, -4, 4), DType::f32);
  Buf up = Buf::from(uniform(n, 2, -2, 2), DType::f32);
  const std::vector<float> w = uniform(n, 3);  // dL/dout
  Buf out(n, DType::f32), dgate(n, DType::f32), dup(n, DType::f32);
  auto loss = [&] {
    swiglu_forward_cpu(out.data(), gate.data(), up.data(), n, DType::f32);
    double s = 0;
    for (std::int64_t i = 0; i < n; ++i) s += double(w[i]) * out.get(i);
    return s;
  };
  Buf dout = Buf::from(w, DType::f32);
  swiglu_backward_cpu(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n, DType::f32);
  std::vector<double> fd_g(n), fd_u(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const double h = 1e-2;
    fd_g[i] = central_difference([&](double x) { gate.set(i, float(x)); }, gate.get(i), h, loss);
    fd_u[i] = central_difference([&](double x) { up.set(i, float(x)); }, up.get(i), h, loss);
  }
  // fp32 forward, h = 1e-2: truncation h^2/6·|f^(3)| = 1.7e-5·|f^(3)| (rtol); the fp32 loss's
  // rounding (~n·u·|loss|) over 2h: ~1e-4 absolute (atol).
  EXPECT_TRUE(all_close("dgate", dgate.f32(), fd_g, {2e-3, 1e-2}));
  EXPECT_TRUE(all_close("dup", dup.f32(), fd_u, {2e-3, 1e-2}));
}

struct SwigluCase {
  DType dt;
  std::int64_t n;
};
void PrintTo(const SwigluCase& c, std::ostream* os) {
  *os << dtype_label(c.dt) << " n " << c.n;
}
class OpsSwigluP : public ::testing::TestWithParam<SwigluCase> {};

TEST_P(OpsSwigluP, MatchesNaiveReference) {
  const auto [dt, n] = GetParam();
  Buf gate = Buf::from(uniform(n, 11, -6, 6), dt), up = Buf::from(uniform(n, 12), dt);
  Buf dout = Buf::from(uniform(n, 13), dt);
  Buf out(n, dt), dgate(n, dt), dup(n, dt);
  swiglu_forward_cpu(out.data(), gate.data(), up.data(), n, dt);
  swiglu_backward_cpu(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n, dt);
  std::vector<double> ref_out(n), ref_dg(n), ref_du(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const double g = gate.get(i), u = up.get(i), dy = dout.get(i);
    const double sig = 1.0 / (1.0 + std::exp(-g));
    ref_out[i] = g * sig * u;
    ref_dg[i] = dy * u * (sig + g * sig * (1.0 - sig));
    ref_du[i] = dy * g * sig;
  }
  // exp, add, divide, products in fp32 (~6u, |g| <= 6) then one rounding to D: one row.
  EXPECT_TRUE(all_close("out", out.f32(), ref_out, tolerance(dt)));
  EXPECT_TRUE(all_close("dgate", dgate.f32(), ref_dg, tolerance(dt)));
  EXPECT_TRUE(all_close("dup", dup.f32(), ref_du, tolerance(dt)));
}

INSTANTIATE_TEST_SUITE_P(DtypeBySize, OpsSwigluP,
                         ::testing::Values(SwigluCase{DType::f32, 1}, SwigluCase{DType::f32, 37},
                                           SwigluCase{DType::f32, 40001},
                                           SwigluCase{DType::bf16, 37},
                                           SwigluCase{DType::bf16, 40001},
                                           SwigluCase{DType::f16, 37},
                                           SwigluCase{DType::f16, 40001}),
                         [](const auto& info) {
                           return dtype_label(info.param.dt) + "_n" + std::to_string(info.param.n);
                         });

}  // namespace
}  // namespace trainmem
