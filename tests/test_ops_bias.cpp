// Bias add and its backward (the q/k/v projection biases): the cpu ops against naive fp64
// references over dtype x shape (column counts off the 32-column block, fewer rows than the 16
// row lanes, a single row), dbias accumulating (+=) onto its previous value, the same bits with
// teams of 1, 2 and 4 threads, empty shapes as no-ops and negative ones rejected.
#include <gtest/gtest.h>

#include "bias/bias.hpp"
#include "ops_testing.hpp"

namespace trainmem {
namespace {
using namespace trainmem::testing;

struct BiasCase {
  DType dt;
  std::int64_t n, c;
};
void PrintTo(const BiasCase& c, std::ostream* os) {
  *os << dtype_label(c.dt) << " n " << c.n << " c " << c.c;
}
class OpsBiasP : public ::testing::TestWithParam<BiasCase> {};

TEST_P(OpsBiasP, ForwardMatchesNaive) {
  const auto p = GetParam();
  Buf out = Buf::from(uniform(p.n * p.c, 301), p.dt), bias = Buf::from(uniform(p.c, 302), p.dt);
  std::vector<double> want(p.n * p.c);
  for (std::int64_t r = 0; r < p.n; ++r)
    for (std::int64_t j = 0; j < p.c; ++j)
      want[r * p.c + j] = double(out.get(r * p.c + j)) + double(bias.get(j));
  bias_forward_cpu(out.data(), bias.data(), p.n, p.c, p.dt);
  // One addition of two D values, rounded once to D: <= half an ulp (2^-9 bf16, 2^-12 fp16,
  // 2^-25 fp32 relative), inside every row of the table.
  EXPECT_TRUE(all_close("out", out.f32(), want, tolerance(p.dt)));
}

TEST_P(OpsBiasP, BackwardAddsColumnSums) {
  const auto p = GetParam();
  Buf dout = Buf::from(uniform(p.n * p.c, 303), p.dt), dbias = Buf::from(uniform(p.c, 304), p.dt);
  std::vector<double> want(p.c);
  for (std::int64_t j = 0; j < p.c; ++j) {
    want[j] = dbias.get(j);
    for (std::int64_t r = 0; r < p.n; ++r) want[j] += double(dout.get(r * p.c + j));
  }
  bias_backward_cpu(dbias.data(), dout.data(), p.n, p.c, p.dt);
  // fp32 sums over n rows, then one rounding to D. A running sum of n uniform [-1, 1] values
  // has partial sums ~sqrt(k/3) and rounding errors random in sign: ~sqrt(n)·(u/2)·sqrt(n/3)
  // = 1.7e-5 at n = 1000 (5e-7 at n = 70). A column whose sum is near 0 meets that with atol
  // alone, and f32's 2e-5 is too close at n = 1000: x4 above n = 100. (The worst case
  // n^2·u/2 = 0.03 is not what is bounded.)
  EXPECT_TRUE(all_close("dbias", dbias.f32(), want, tolerance(p.dt, p.n > 100 ? 4.0 : 1.0)));
}

std::vector<BiasCase> bias_cases() {
  std::vector<BiasCase> out;
  for (DType dt : all_dtypes())
    for (auto [n, c] : {std::pair<std::int64_t, std::int64_t>{1, 1},
                        {3, 7},
                        {15, 33},
                        {16, 32},
                        {17, 64},
                        {70, 100},
                        {1000, 96}})
      out.push_back({dt, n, c});
  return out;
}
INSTANTIATE_TEST_SUITE_P(DtypeByShape, OpsBiasP, ::testing::ValuesIn(bias_cases()),
                         [](const auto& info) {
                           const auto& c = info.param;
                           return dtype_label(c.dt) + "_n" + std::to_string(c.n) + "_c" +
                                  std::to_string(c.c);
                         });

// Fp32 column sums where the order matters: one large value then many small ones. Exactly the
// fp32 sum of each 16-row lane in row order, the 16 lanes added left to right (bias_math.hpp),
// computed here from that definition.
TEST(OpsBias, BackwardSumsInTheDocumentedOrder) {
  const std::int64_t n = 200, c = 5;
  std::vector<float> dout(n * c);
  const auto u = uniform(n * c, 305);
  for (std::int64_t i = 0; i < n * c; ++i) dout[i] = (i / c) % 37 == 0 ? 1e4f + u[i] : u[i] * 1e-3f;
  std::vector<float> dbias = {0.5f, -0.25f, 0.0f, 3.0f, -7.0f};
  std::vector<float> want = dbias;
  for (std::int64_t j = 0; j < c; ++j) {
    float lanes[16] = {};
    for (std::int64_t r = 0; r < n; ++r) lanes[r % 16] += dout[r * c + j];
    float total = 0.0f;
    for (float lane : lanes) total += lane;
    want[j] = dbias[j] + total;
  }
  bias_backward_cpu(dbias.data(), dout.data(), n, c, DType::f32);
  EXPECT_EQ(dbias, want);
}

TEST(OpsBias, SameBitsWithTeamsOfOneTwoAndFour) {
  const std::int64_t n = 2048, c = 131;  // above kParallelMinElements
  for (DType dt : all_dtypes()) {
    SCOPED_TRACE(dtype_label(dt));
    const Buf out0 = Buf::from(uniform(n * c, 306), dt), bias = Buf::from(uniform(c, 307), dt);
    const Buf dout = Buf::from(uniform(n * c, 308), dt), dbias0 = Buf::from(uniform(c, 309), dt);
    std::vector<float> fwd[3], bwd[3];
    int slot = 0;
    for (int threads : {1, 2, 4}) {
      Buf out = out0, dbias = dbias0;
      with_threads(threads, [&] {
        bias_forward_cpu(out.data(), bias.data(), n, c, dt);
        bias_backward_cpu(dbias.data(), dout.data(), n, c, dt);
      });
      fwd[slot] = out.f32();
      bwd[slot] = dbias.f32();
      ++slot;
    }
    EXPECT_EQ(fwd[1], fwd[0]);
    EXPECT_EQ(fwd[2], fwd[0]);
    EXPECT_EQ(bwd[1], bwd[0]);
    EXPECT_EQ(bwd[2], bwd[0]);
  }
}

TEST(OpsBias, EmptyShapesAreNoOps) {
  std::vector<float> x = {1.0f, 2.0f}, b = {3.0f, 4.0f};
  bias_forward_cpu(x.data(), b.data(), 0, 2, DType::f32);
  bias_forward_cpu(x.data(), b.data(), 1, 0, DType::f32);
  bias_backward_cpu(b.data(), x.data(), 0, 2, DType::f32);
  bias_backward_cpu(b.data(), x.data(), 1, 0, DType::f32);
  EXPECT_EQ(x, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(b, (std::vector<float>{3.0f, 4.0f}));
}

TEST(OpsBias, NegativeShapesAreRejected) {
  float x = 0.0f;
  try {
    bias_forward_cpu(&x, &x, -1, 1, DType::f32);
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "bias_forward: n must be >= 0, got -1");
  }
  try {
    bias_backward_cpu(&x, &x, 1, -2, DType::f32);
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "bias_backward: c must be >= 0, got -2");
  }
}

}  // namespace
}  // namespace trainmem
