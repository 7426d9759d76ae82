// GEMM: every transpose combination, alpha/beta, against a naive fp64 loop, over dtype x shape;
// beta = 0 must not read c (c starts as NaN there). The bf16 AVX512-BF16 kernel
// (gemm_bf16_cpu.hpp) the same way, against the generic path and across team sizes; those
// tests skip, saying why, on a CPU without the instructions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <tuple>

#include "matmul/gemm_bf16_cpu.hpp"
#include "matmul/matmul.hpp"
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
  // The table covers one rounding to D; fp32 accumulation adds <= K·u·scale absolute
  // (scale = the largest sum|a||b|): atol·scale/4 = 5e-6·scale in f32 is that bound up to
  // K = 83, and beyond it the roundings' random signs (~sqrt(K)·u·scale) keep well inside.
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

// ---------------------------------------------------------------- the AVX512-BF16 kernel

#define SKIP_WITHOUT_AVX512_BF16()                                                      \
  do {                                                                                  \
    if (!cpu_has_avx512_bf16())                                                         \
      GTEST_SKIP() << "CPU lacks avx512_bf16: the bf16 kernel needs avx512f/bw/vl + "   \
                      "avx512_bf16 (VDPBF16PS); matmul_cpu uses the generic path here"; \
  } while (0)

class OpsMatmulBf16P : public ::testing::TestWithParam<MatmulCase> {};

// Awkward and large shapes, every transpose combination, alpha/beta (beta 0 on a NaN c): odd K
// (a zero-padded last pair), K 1, M 1, edge tiles in both dimensions, a split into blocks that
// start inside a packed panel (300 x 200, 512 x 2048), and K above the kernel's K chunk (1024)
// so the fp32 sums go through the scratch buffer (2051: odd as well).
TEST_P(OpsMatmulBf16P, MatchesNaiveLoop) {
  SKIP_WITHOUT_AVX512_BF16();
  const auto c = GetParam();
  Buf a = Buf::from(uniform(c.M * c.K, 61), c.dt), b = Buf::from(uniform(c.K * c.N, 62), c.dt);
  std::vector<float> c0 = uniform(c.M * c.N, 63);
  if (c.beta == 0.0f) c0.assign(c0.size(), std::numeric_limits<float>::quiet_NaN());
  Buf out = Buf::from(c0, c.dt);
  const std::vector<double> C0 = out.f64();
  matmul_cpu_on(CpuGemmPath::avx512_bf16, out.data(), a.data(), b.data(), c.M, c.N, c.K, c.ta, c.tb,
                c.alpha, c.beta, c.dt);
  EXPECT_TRUE(matches_naive(c, a, b, C0, out));
}

std::vector<MatmulCase> bf16_kernel_cases() {
  std::vector<MatmulCase> out;
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes}) {
      for (auto [M, N, K] :
           {std::tuple{71, 229, 33}, std::tuple{1, 5, 64}, std::tuple{7, 13, 11},
            std::tuple{9, 50, 1}, std::tuple{300, 200, 64}, std::tuple{37, 61, 2051}}) {
        out.push_back({DType::bf16, M, N, K, ta, tb, 1.0f, 0.0f});
        out.push_back({DType::bf16, M, N, K, ta, tb, 0.5f, 1.0f});
        out.push_back({DType::bf16, M, N, K, ta, tb, -2.0f, 0.25f});
      }
      out.push_back({DType::bf16, 512, 2048, 256, ta, tb, 0.5f, 1.0f});
    }
  return out;
}
INSTANTIATE_TEST_SUITE_P(Shapes, OpsMatmulBf16P, ::testing::ValuesIn(bf16_kernel_cases()),
                         [](const auto& info) {
                           const auto& c = info.param;
                           auto t = [](Trans x) { return x == Trans::no ? "N" : "T"; };
                           std::string ab = c.beta == 0.0f ? "_beta0" : "_beta";
                           if (c.alpha < 0) ab += "_negalpha";
                           return std::string(t(c.ta)) + t(c.tb) + "_M" + std::to_string(c.M) +
                                  "_N" + std::to_string(c.N) + "_K" + std::to_string(c.K) + ab;
                         });

// The kernel and the generic path (widen + sgemm) agree within bf16's tolerance: they round
// the same fp32 sum, summed in different orders.
TEST(OpsMatmulBf16, KernelAgreesWithGenericPath) {
  SKIP_WITHOUT_AVX512_BF16();
  for (auto [M, N, K] : {std::tuple{71, 229, 33}, std::tuple{300, 200, 64},
                         std::tuple{64, 96, 1500}, std::tuple{512, 688, 256}})
    for (Trans ta : {Trans::no, Trans::yes})
      for (Trans tb : {Trans::no, Trans::yes}) {
        const DType dt = DType::bf16;
        const Buf a = Buf::from(uniform(M * K, 64), dt), b = Buf::from(uniform(K * N, 65), dt);
        Buf kernel = Buf::from(uniform(M * N, 66), dt), generic = kernel;
        matmul_cpu_on(CpuGemmPath::avx512_bf16, kernel.data(), a.data(), b.data(), M, N, K, ta, tb,
                      0.5f, 1.0f, dt);
        matmul_cpu_on(CpuGemmPath::generic, generic.data(), a.data(), b.data(), M, N, K, ta, tb,
                      0.5f, 1.0f, dt);
        Tol tol = tolerance(dt);
        tol.atol *= std::max(1.0, K / 16.0);  // as matches_naive: sum |a||b| ~ K / 4 here
        EXPECT_TRUE(all_close("kernel vs generic", kernel.f32(), generic.f64(), tol))
            << "M " << M << " N " << N << " K " << K << " ta " << (ta == Trans::yes) << " tb "
            << (tb == Trans::yes);
      }
}

// The same bits for teams of 1 to 4 threads (dynamic teams off), for row splits, column splits
// (blocks starting inside a packed B panel) and K above the kernel's K chunk.
TEST(OpsMatmulBf16, KernelSameBitsForAnyTeamSize) {
  SKIP_WITHOUT_AVX512_BF16();
  for (auto [M, N, K] : {std::tuple{300, 200, 64}, std::tuple{70, 333, 129},
                         std::tuple{130, 100, 2051}, std::tuple{40, 500, 1100}})
    for (Trans ta : {Trans::no, Trans::yes})
      for (Trans tb : {Trans::no, Trans::yes}) {
        const DType dt = DType::bf16;
        const MatmulCase c{dt, M, N, K, ta, tb, 0.5f, 1.0f};
        const Buf a = Buf::from(uniform(M * K, 67), dt), b = Buf::from(uniform(K * N, 68), dt);
        const Buf c0 = Buf::from(uniform(M * N, 69), dt);
        std::vector<float> first;
        for (int threads : {1, 2, 3, 4}) {
          Buf out = c0;
          with_threads(threads, [&] {
            matmul_cpu_on(CpuGemmPath::avx512_bf16, out.data(), a.data(), b.data(), M, N, K, ta, tb,
                          0.5f, 1.0f, dt);
          });
          if (threads == 1) {
            EXPECT_TRUE(matches_naive(c, a, b, c0.f64(), out));
            first = out.f32();
          } else {
            EXPECT_EQ(first, out.f32())
                << "M " << M << " N " << N << " K " << K << ", " << threads << " threads";
          }
        }
      }
}

// TRAINMEM_CPU_GEMM: auto (or unset) and generic; anything else is an error naming the variable
// and the allowed values. bf16 takes the kernel exactly when the CPU has it and the variable
// does not say generic; other dtypes always take the generic path.
TEST(OpsMatmulBf16, PathSwitch) {
  EXPECT_TRUE(parse_cpu_gemm_auto(nullptr));
  EXPECT_TRUE(parse_cpu_gemm_auto("auto"));
  EXPECT_FALSE(parse_cpu_gemm_auto("generic"));
  try {
    parse_cpu_gemm_auto("fast");
    ADD_FAILURE() << "no exception";
  } catch (const InputError& e) {
    const std::string m = e.what();
    for (const char* word : {"TRAINMEM_CPU_GEMM", "'fast'", "auto", "generic"})
      EXPECT_NE(m.find(word), std::string::npos) << m;
  }
  const char* env = std::getenv("TRAINMEM_CPU_GEMM");
  const bool generic = env != nullptr && std::string(env) == "generic";
  EXPECT_EQ(cpu_gemm_path(DType::bf16),
            cpu_has_avx512_bf16() && !generic ? CpuGemmPath::avx512_bf16 : CpuGemmPath::generic);
  EXPECT_EQ(cpu_gemm_path(DType::f32), CpuGemmPath::generic);
  EXPECT_EQ(cpu_gemm_path(DType::f16), CpuGemmPath::generic);
  std::uint16_t x = 0;
  EXPECT_THROW(matmul_cpu_on(CpuGemmPath::avx512_bf16, &x, &x, &x, 1, 1, 1, Trans::no, Trans::no,
                             1.0f, 0.0f, DType::f16),
               InputError);
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
