// RoPE: the cpu op against HuggingFace's rotate-half formula written out here
// (q * cos + rotate_half(q) * sin with cos/sin of cat(freqs, freqs), inv_freq computed in fp32
// as HF does), rope_backward as the transpose (dot-product test) and the inverse, over dtype x
// shape.
#include <gtest/gtest.h>

#include <cmath>

#include "ops_testing.hpp"
#include "rope/rope.hpp"
#include "rope/rope_math.hpp"

namespace trainmem {
namespace {
using namespace trainmem::testing;

// HF LlamaRotaryEmbedding + apply_rotary_pos_emb for one (b, s, heads, d) tensor, in double on the
// fp32 angles.
std::vector<double> hf_rope(const std::vector<double>& x, std::int64_t b, std::int64_t s,
                            std::int64_t heads, std::int64_t d, double theta) {
  const std::int64_t half = d / 2;
  std::vector<float> inv_freq(half);  // 1.0 / (base ** (arange(0, dim, 2).float() / dim))
  for (std::int64_t j = 0; j < half; ++j)
    inv_freq[j] = 1.0f / std::pow(float(theta), float(2 * j) / float(d));
  std::vector<double> out(x.size());
  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t t = 0; t < s; ++t)
      for (std::int64_t head = 0; head < heads; ++head) {
        const double* v = x.data() + ((bi * s + t) * heads + head) * d;
        double* o = out.data() + ((bi * s + t) * heads + head) * d;
        for (std::int64_t e = 0; e < d; ++e) {
          const float freq = float(t) * inv_freq[e % half];          // emb = cat(freqs, freqs)
          const double rot = e < half ? -v[e + half] : v[e - half];  // rotate_half
          o[e] = v[e] * std::cos(double(freq)) + rot * std::sin(double(freq));
        }
      }
  return out;
}

TEST(OpsRope, MathPairRotationIsOrthogonal) {
  for (double ang : {0.0, 0.3, -1.7, 100.25}) {
    double a = 0.6, b = -1.3;
    rope_rotate_pair(&a, &b, std::cos(ang), std::sin(ang));
    EXPECT_NEAR(a * a + b * b, 0.6 * 0.6 + 1.3 * 1.3, 1e-12);
    // As a complex product (x1 + i x2) e^{i ang}.
    EXPECT_NEAR(a, 0.6 * std::cos(ang) + 1.3 * std::sin(ang), 1e-12);
    EXPECT_NEAR(b, -1.3 * std::cos(ang) + 0.6 * std::sin(ang), 1e-12);
    rope_rotate_pair(&a, &b, std::cos(ang), -std::sin(ang));
    EXPECT_NEAR(a, 0.6, 1e-12);
    EXPECT_NEAR(b, -1.3, 1e-12);
  }
  EXPECT_NEAR(rope_inv_freq<double>(1, 6, 10000.0), std::pow(10000.0, -2.0 / 6.0), 1e-15);
  EXPECT_EQ(rope_angle<double>(0, 2, 6, 10000.0), 0.0);
}

struct RopeCase {
  DType dt;
  std::int64_t b, s, a, kv, d;
  double theta;
};
void PrintTo(const RopeCase& c, std::ostream* os) {
  *os << dtype_label(c.dt) << " b " << c.b << " s " << c.s << " a " << c.a << " kv " << c.kv
      << " d " << c.d << " theta " << c.theta;
}
class OpsRopeP : public ::testing::TestWithParam<RopeCase> {};

void check_transpose_and_inverse(const RopeCase& c) {
  SCOPED_TRACE("s " + std::to_string(c.s) + " d " + std::to_string(c.d));
  const std::int64_t nq = c.b * c.s * c.a * c.d, nk = c.b * c.s * c.kv * c.d;
  const auto xq = uniform(nq, 41), xk = uniform(nk, 42), yq = uniform(nq, 43), yk = uniform(nk, 44);
  Buf rq = Buf::from(xq, DType::f32), rk = Buf::from(xk, DType::f32);
  rope_forward_cpu(rq.data(), rk.data(), c.b, c.s, c.a, c.kv, c.d, c.theta, DType::f32);
  Buf tq = Buf::from(yq, DType::f32), tk = Buf::from(yk, DType::f32);
  rope_backward_cpu(tq.data(), tk.data(), c.b, c.s, c.a, c.kv, c.d, c.theta, DType::f32);
  // <R x, y> == <x, R^T y>
  const std::vector<double> yq64(yq.begin(), yq.end()), yk64(yk.begin(), yk.end());
  const std::vector<double> xq64(xq.begin(), xq.end()), xk64(xk.begin(), xk.end());
  const double lhs = dot(yq64, rq.f32()) + dot(yk64, rk.f32());
  const double rhs = dot(xq64, tq.f32()) + dot(xk64, tk.f32());
  EXPECT_NEAR(lhs, rhs, 1e-5 * std::sqrt(double(nq + nk)));
  // R^T R x == x
  rope_backward_cpu(rq.data(), rk.data(), c.b, c.s, c.a, c.kv, c.d, c.theta, DType::f32);
  EXPECT_TRUE(all_close("q", rq.f32(), xq64, {1e-6, 1e-5}));
  EXPECT_TRUE(all_close("k", rk.f32(), xk64, {1e-6, 1e-5}));
}

TEST_P(OpsRopeP, ForwardMatchesHuggingFaceFormula) {
  const auto c = GetParam();
  const std::int64_t nq = c.b * c.s * c.a * c.d, nk = c.b * c.s * c.kv * c.d;
  Buf q = Buf::from(uniform(nq, 31), c.dt), k = Buf::from(uniform(nk, 32), c.dt);
  const auto ref_q = hf_rope(q.f64(), c.b, c.s, c.a, c.d, c.theta);
  const auto ref_k = hf_rope(k.f64(), c.b, c.s, c.kv, c.d, c.theta);
  rope_forward_cpu(q.data(), k.data(), c.b, c.s, c.a, c.kv, c.d, c.theta, c.dt);
  EXPECT_TRUE(all_close("q", q.f32(), ref_q, tolerance(c.dt)));
  EXPECT_TRUE(all_close("k", k.f32(), ref_k, tolerance(c.dt)));
}

std::vector<RopeCase> rope_cases() {
  std::vector<RopeCase> out;
  for (DType dt : all_dtypes()) {
    out.push_back({dt, 2, 7, 3, 1, 6, 10000.0});
    out.push_back({dt, 1, 33, 4, 2, 16, 500000.0});
    out.push_back({dt, 1, 300, 2, 2, 8, 10000.0});  // long positions: fp32 angles as HF
  }
  return out;
}

// The linear-algebra identities, in fp32 (no storage rounding between the two applications).
TEST(OpsRope, BackwardIsTransposeAndInverse) {
  for (const RopeCase& c : rope_cases()) {
    if (c.dt == DType::f32) check_transpose_and_inverse(c);
  }
}

INSTANTIATE_TEST_SUITE_P(DtypeByShape, OpsRopeP, ::testing::ValuesIn(rope_cases()),
                         [](const auto& info) {
                           const auto& c = info.param;
                           return dtype_label(c.dt) + "_b" + std::to_string(c.b) + "_s" +
                                  std::to_string(c.s) + "_a" + std::to_string(c.a) + "_kv" +
                                  std::to_string(c.kv) + "_d" + std::to_string(c.d);
                         });

TEST(OpsRope, OddHeadDimIsRejected) {
  std::vector<float> q(2 * 3), k(2 * 3);
  try {
    rope_forward_cpu(q.data(), k.data(), 1, 2, 1, 1, 3, 10000.0, DType::f32);
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "rope: head dim must be even, got 3");
  }
}

}  // namespace
}  // namespace trainmem
