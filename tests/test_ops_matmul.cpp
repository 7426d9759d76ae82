// GEMM: every transpose combination, alpha/beta, against a naive fp64 loop, over dtype x shape;
// beta = 0 must not read c (c starts as NaN there).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "matmul_cpu.hpp"
#include "ops_testing.hpp"

namespace trainmem {
namespace {
using namespace trainmem::testing;

struct MatmulCase {
  DType dt;
  std::int64_t M, N, K;
  Trans ta, tb;
  float alpha, beta;
};
void PrintTo(const MatmulCase& c, std::ostream* os) {
  *os << dtype_label(c.dt) << " M " << c.M << " N " << c.N << " K " << c.K << " ta "
      << (c.ta == Trans::yes) << " tb " << (c.tb == Trans::yes) << " alpha " << c.alpha << " beta "
      << c.beta;
}
class OpsMatmulP : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(OpsMatmulP, MatchesNaiveLoop) {
  const auto c = GetParam();
  Buf a = Buf::from(uniform(c.M * c.K, 51), c.dt), b = Buf::from(uniform(c.K * c.N, 52), c.dt);
  std::vector<float> c0 = uniform(c.M * c.N, 53);
  if (c.beta == 0.0f) c0.assign(c0.size(), std::numeric_limits<float>::quiet_NaN());
  Buf out = Buf::from(c0, c.dt);
  const std::vector<double> A = a.f64(), Bm = b.f64(), C0 = out.f64();
  matmul_cpu(out.data(), a.data(), b.data(), c.M, c.N, c.K, c.ta, c.tb, c.alpha, c.beta, c.dt);
  std::vector<double> ref(c.M * c.N);
  double scale = 0;  // sum |a||b| of a row-column product, for the tolerance
  for (std::int64_t i = 0; i < c.M; ++i)
    for (std::int64_t j = 0; j < c.N; ++j) {
      double s = 0, mag = 0;
      for (std::int64_t p = 0; p < c.K; ++p) {
        const double av = c.ta == Trans::no ? A[i * c.K + p] : A[p * c.M + i];
        const double bv = c.tb == Trans::no ? Bm[p * c.N + j] : Bm[j * c.K + p];
        s += av * bv;
        mag += std::fabs(av * bv);
      }
      scale = std::max(scale, mag);
      ref[i * c.N + j] = c.alpha * s + (c.beta == 0.0f ? 0.0 : c.beta * C0[i * c.N + j]);
    }
  Tol tol = tolerance(c.dt);
  tol.atol *= std::max(1.0, scale / 4);  // fp32 accumulation error grows with the sum
  EXPECT_TRUE(all_close("c", out.f32(), ref, tol));
}

std::vector<MatmulCase> matmul_cases() {
  std::vector<MatmulCase> out;
  for (DType dt : all_dtypes())
    for (Trans ta : {Trans::no, Trans::yes})
      for (Trans tb : {Trans::no, Trans::yes}) {
        out.push_back({dt, 7, 13, 11, ta, tb, 1.0f, 0.0f});
        out.push_back({dt, 71, 229, 33, ta, tb, 0.5f, 1.0f});
        out.push_back({dt, 1, 5, 64, ta, tb, -2.0f, 0.25f});
      }
  return out;
}
INSTANTIATE_TEST_SUITE_P(DtypeByShape, OpsMatmulP, ::testing::ValuesIn(matmul_cases()),
                         [](const auto& info) {
                           const auto& c = info.param;
                           auto t = [](Trans x) { return x == Trans::no ? "N" : "T"; };
                           return dtype_label(c.dt) + "_" + t(c.ta) + t(c.tb) + "_M" +
                                  std::to_string(c.M) + "_N" + std::to_string(c.N) + "_K" +
                                  std::to_string(c.K) + (c.beta == 0.0f ? "_beta0" : "_beta");
                         });

TEST(OpsMatmul, SameBitsForAnyThreadCount) {
  // Large enough to be split into row (M >= N) or column (N > M) blocks across threads.
  for (auto [M, N, K] : {std::tuple{300, 200, 64}, std::tuple{70, 333, 129}})
    for (Trans ta : {Trans::no, Trans::yes})
      for (Trans tb : {Trans::no, Trans::yes}) {
        const auto a = uniform(M * K, 54), b = uniform(K * N, 55), c0 = uniform(M * N, 56);
        std::vector<float> one = c0, three = c0;
        matmul_cpu(one.data(), a.data(), b.data(), M, N, K, ta, tb, 0.5f, 1.0f, DType::f32);
        with_threads(1, [&] {
          one = c0;
          matmul_cpu(one.data(), a.data(), b.data(), M, N, K, ta, tb, 0.5f, 1.0f, DType::f32);
        });
        with_threads(3, [&] {
          matmul_cpu(three.data(), a.data(), b.data(), M, N, K, ta, tb, 0.5f, 1.0f, DType::f32);
        });
        EXPECT_EQ(one, three) << "M " << M << " N " << N << " K " << K;
      }
}

TEST(OpsMatmul, EmptyInnerDimensionScalesC) {
  std::vector<float> c = {1, 2, 3, 4, 5, 6};
  matmul_cpu(c.data(), nullptr, nullptr, 2, 3, 0, Trans::no, Trans::no, 1.0f, 0.5f, DType::f32);
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3}));
}

TEST(OpsMatmul, DimensionsBeyondBlasRangeAreRejected) {
  float x = 0;
  try {
    matmul_cpu(&x, &x, &x, std::int64_t(1) << 32, 1, 1, Trans::no, Trans::no, 1.0f, 0.0f,
               DType::f32);
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("matmul: M = 4294967296 is outside [0, 2^31)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace trainmem
