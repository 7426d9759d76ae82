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

// Checks out (the result of c = alpha op(a) op(b) + beta c0) against an fp64 loop over the
// stored operands, with the dtype's tolerance scaled by the largest sum of |a||b|.
::testing::AssertionResult matches_naive(const MatmulCase& c, const Buf& a, const Buf& b,
                                         const std::vector<double>& C0, const Buf& out) {
  const std::vector<double> A = a.f64(), Bm = b.f64();
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
  return all_close("c", out.f32(), ref, tol);
}

TEST_P(OpsMatmulP, MatchesNaiveLoop) {
  const auto c = GetParam();
  Buf a = Buf::from(uniform(c.M * c.K, 51), c.dt), b = Buf::from(uniform(c.K * c.N, 52), c.dt);
  std::vector<float> c0 = uniform(c.M * c.N, 53);
  if (c.beta == 0.0f) c0.assign(c0.size(), std::numeric_limits<float>::quiet_NaN());
  Buf out = Buf::from(c0, c.dt);
  const std::vector<double> C0 = out.f64();
  matmul_cpu(out.data(), a.data(), b.data(), c.M, c.N, c.K, c.ta, c.tb, c.alpha, c.beta, c.dt);
  EXPECT_TRUE(matches_naive(c, a, b, C0, out));
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

// Products large enough to be split into row (M >= N) or column (N > M) blocks, in every
// dtype, computed by teams of 1 to 4 threads (dynamic teams off): the same bits every time,
// and right. A 16-bit product on two threads used to crash (its workers read their own empty
// thread_local copy of the fp32 result) or store another call's numbers.
TEST(OpsMatmul, SameBitsForAnyTeamSize) {
  for (DType dt : all_dtypes())
    for (auto [M, N, K] : {std::tuple{300, 200, 64}, std::tuple{70, 333, 129}})
      for (Trans ta : {Trans::no, Trans::yes})
        for (Trans tb : {Trans::no, Trans::yes}) {
          const MatmulCase c{dt, M, N, K, ta, tb, 0.5f, 1.0f};
          const Buf a = Buf::from(uniform(M * K, 54), dt), b = Buf::from(uniform(K * N, 55), dt);
          const Buf c0 = Buf::from(uniform(M * N, 56), dt);
          std::vector<float> first;
          for (int threads : {1, 2, 3, 4}) {
            Buf out = c0;
            with_threads(threads, [&] {
              matmul_cpu(out.data(), a.data(), b.data(), M, N, K, ta, tb, 0.5f, 1.0f, dt);
            });
            if (threads == 1) {
              EXPECT_TRUE(matches_naive(c, a, b, c0.f64(), out)) << dtype_label(dt);
              first = out.f32();
            } else {
              EXPECT_EQ(first, out.f32()) << dtype_label(dt) << " M " << M << " N " << N << " K "
                                          << K << ", " << threads << " threads";
            }
          }
        }
}

// Two 16-bit products of the same shape with different data, one after the other on a
// two-thread team: the second result is the second product's, not left over from the first.
TEST(OpsMatmul, SixteenBitResultIsNotLeftOverFromAnEarlierCall) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const std::int64_t M = 256, N = 192, K = 96;
    const MatmulCase c{dt, M, N, K, Trans::no, Trans::yes, 1.0f, 0.0f};
    const Buf b = Buf::from(uniform(K * N, 58), dt);
    Buf first = Buf::from(std::vector<float>(M * N, 0.0f), dt), second = first;
    const Buf a1 = Buf::from(uniform(M * K, 59), dt), a2 = Buf::from(uniform(M * K, 60), dt);
    with_threads(2, [&] {
      matmul_cpu(first.data(), a1.data(), b.data(), M, N, K, c.ta, c.tb, 1.0f, 0.0f, dt);
      matmul_cpu(second.data(), a2.data(), b.data(), M, N, K, c.ta, c.tb, 1.0f, 0.0f, dt);
    });
    EXPECT_TRUE(matches_naive(c, a1, b, std::vector<double>(M * N, 0.0), first));
    EXPECT_TRUE(matches_naive(c, a2, b, std::vector<double>(M * N, 0.0), second));
  }
}

// The split is a function of the shape: whole below the parallel threshold, otherwise at most
// 8 blocks of the larger dimension, bounds multiples of 16 covering it in order.
TEST(OpsMatmul, SplitDependsOnTheShapeOnly) {
  EXPECT_EQ(gemm_split(16, 16, 16).parts, 1);  // 4096 multiply-adds
  EXPECT_EQ(gemm_split(63, 4096, 4096).parts, 8);
  EXPECT_FALSE(gemm_split(63, 4096, 4096).rows);
  EXPECT_TRUE(gemm_split(4096, 4096, 64).rows);
  EXPECT_EQ(gemm_split(100, 90, 64).parts, 1);   // 100 / 64 = 1 block
  EXPECT_EQ(gemm_split(300, 200, 64).parts, 4);  // 300 / 64 = 4 blocks
  for (std::int64_t dim : {64, 100, 300, 1000, 4096, 32000})
    for (std::int64_t parts = 1; parts <= 8; ++parts) {
      EXPECT_EQ(gemm_split_begin(dim, parts, 0), 0);
      EXPECT_EQ(gemm_split_begin(dim, parts, parts), dim);
      for (std::int64_t p = 1; p < parts; ++p) {
        EXPECT_EQ(gemm_split_begin(dim, parts, p) % 16, 0);
        EXPECT_LE(gemm_split_begin(dim, parts, p - 1), gemm_split_begin(dim, parts, p));
      }
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
