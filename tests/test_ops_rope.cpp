// RoPE: the cpu op against HuggingFace's rotate-half formula written out here
// (q * cos + rotate_half(q) * sin with cos/sin of cat(freqs, freqs), inv_freq computed in fp32
// as HF does), rope_backward as the transpose (dot-product test) and the inverse, over dtype x
// shape. Llama 3 scaling: the shared inv_freq rule against a double-precision reference of the
// llama3 formula written out here (all three bands hit), the op against the HF formula on those
// frequencies, high-frequency pairs unchanged bit for bit, and scaling none the identity.
#include <gtest/gtest.h>

#include <cmath>

#include "ops_testing.hpp"
#include "rope/rope.hpp"
#include "rope/rope_math.hpp"

namespace trainmem {
namespace {
using namespace trainmem::testing;

// inv_freq of HF's default rope: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), fp32.
std::vector<float> hf_inv_freq(std::int64_t d, double theta) {
  std::vector<float> inv_freq(d / 2);
  for (std::int64_t j = 0; j < d / 2; ++j)
    inv_freq[j] = 1.0f / std::pow(float(theta), float(2 * j) / float(d));
  return inv_freq;
}

// HF LlamaRotaryEmbedding + apply_rotary_pos_emb for one (b, s, heads, d) tensor, in double on the
// fp32 angles t * inv_freq[j].
std::vector<double> hf_rope(const std::vector<double>& x, std::int64_t b, std::int64_t s,
                            std::int64_t heads, std::int64_t d,
                            const std::vector<float>& inv_freq) {
  const std::int64_t half = d / 2;
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
std::vector<double> hf_rope(const std::vector<double>& x, std::int64_t b, std::int64_t s,
                            std::int64_t heads, std::int64_t d, double theta) {
  return hf_rope(x, b, s, heads, d, hf_inv_freq(d, theta));
}

// Llama 3.1's rule (Meta's apply_scaling, HF's _compute_llama3_parameters) in double, from its
// definition: wavelengths 2π/inv_freq below L/hi keep their frequency, above L/lo are divided by
// `factor`, in between the frequency is interpolated with smooth = (L/wavelen - lo) / (hi - lo):
// (1 - smooth) * inv_freq / factor + smooth * inv_freq.
enum class Band { high, medium, low };
double llama3_inv_freq_ref(std::int64_t j, std::int64_t d, double theta, const RopeScaling& sc,
                           Band* band = nullptr) {
  const double pi = std::acos(-1.0);
  const double inv = std::pow(theta, -2.0 * double(j) / double(d));
  const double wavelen = 2 * pi / inv;
  const double L = double(sc.original_max_positions);
  const double high_wavelen = L / sc.high_freq_factor, low_wavelen = L / sc.low_freq_factor;
  Band b;
  double out;
  if (wavelen < high_wavelen) {
    b = Band::high;
    out = inv;
  } else if (wavelen > low_wavelen) {
    b = Band::low;
    out = inv / sc.factor;
  } else {
    b = Band::medium;
    const double smooth =
        (L / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor);
    out = (1 - smooth) * inv / sc.factor + smooth * inv;
  }
  if (band) *band = b;
  return out;
}
RopeScaling llama31_scaling() {  // Llama 3.1/3.2's config.json values
  RopeScaling sc;
  sc.kind = RopeScalingKind::llama3;
  sc.factor = 8.0;
  sc.low_freq_factor = 1.0;
  sc.high_freq_factor = 4.0;
  sc.original_max_positions = 8192;
  return sc;
}

TEST(OpsRope, MathPairRotationIsOrthogonal) {
  for (double ang : {0.0, 0.3, -1.7, 100.25}) {
    double a = 0.6, b = -1.3;
    rope_rotate_pair(&a, &b, std::cos(ang), std::sin(ang));
    // fp64 (eps = 1.1e-16), |a|, |b| <= 1.5: the rotation rounds two products and a sum (3 eps
    // relative, ~5e-16 absolute), cos/sin are within an ulp; two rotations and c^2 + s^2 = 1
    // ± 2 eps: ~2e-15 on the inverse. 1e-14 is 5x (was 1e-12: 500x).
    EXPECT_NEAR(a * a + b * b, 0.6 * 0.6 + 1.3 * 1.3, 1e-14);
    // As a complex product (x1 + i x2) e^{i ang}.
    EXPECT_NEAR(a, 0.6 * std::cos(ang) + 1.3 * std::sin(ang), 1e-14);
    EXPECT_NEAR(b, -1.3 * std::cos(ang) + 0.6 * std::sin(ang), 1e-14);
    rope_rotate_pair(&a, &b, std::cos(ang), -std::sin(ang));
    EXPECT_NEAR(a, 0.6, 1e-14);
    EXPECT_NEAR(b, -1.3, 1e-14);
  }
  // 1/pow vs pow with the negated exponent: ~3 ulps of 0.046 (ulp 7e-18) = 2e-17; 1e-15 is
  // loose but harmless (a wrong exponent moves it by > 1e-3).
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

void check_transpose_and_inverse(const RopeCase& c, const RopeSpec& spec) {
  SCOPED_TRACE("s " + std::to_string(c.s) + " d " + std::to_string(c.d));
  const std::int64_t nq = c.b * c.s * c.a * c.d, nk = c.b * c.s * c.kv * c.d;
  const auto xq = uniform(nq, 41), xk = uniform(nk, 42), yq = uniform(nq, 43), yk = uniform(nk, 44);
  Buf rq = Buf::from(xq, DType::f32), rk = Buf::from(xk, DType::f32);
  rope_forward_cpu(rq.data(), rk.data(), c.b, c.s, c.a, c.kv, c.d, spec, DType::f32);
  Buf tq = Buf::from(yq, DType::f32), tk = Buf::from(yk, DType::f32);
  rope_backward_cpu(tq.data(), tk.data(), c.b, c.s, c.a, c.kv, c.d, spec, DType::f32);
  // <R x, y> == <x, R^T y>
  const std::vector<double> yq64(yq.begin(), yq.end()), yk64(yk.begin(), yk.end());
  const std::vector<double> xq64(xq.begin(), xq.end()), xk64(xk.begin(), xk.end());
  const double lhs = dot(yq64, rq.f32()) + dot(yk64, rk.f32());
  const double rhs = dot(xq64, tq.f32()) + dot(xk64, tk.f32());
  // R and R^T use the same fp32 cos/sin, so only roundings differ: ~3u per rotated element
  // (|x||y| <= 1) on each side, random in sign: ~2·3u·sqrt(n) = 3.6e-7·sqrt(n); 1e-5·sqrt(n)
  // is ~30x, kept because the errors' independence is assumed, not guaranteed.
  EXPECT_NEAR(lhs, rhs, 1e-5 * std::sqrt(double(nq + nk)));
  // R^T R x == x
  rope_backward_cpu(rq.data(), rk.data(), c.b, c.s, c.a, c.kv, c.d, spec, DType::f32);
  // Two fp32 rotations (~3u each of the pair's norm <= sqrt 2) and fl(cos)^2 + fl(sin)^2 = 1 ± 2u:
  // ~8u·1.41 = 7e-7 absolute, under atol 1e-6.
  EXPECT_TRUE(all_close("q", rq.f32(), xq64, {1e-6, 1e-5}));
  EXPECT_TRUE(all_close("k", rk.f32(), xk64, {1e-6, 1e-5}));
}

TEST_P(OpsRopeP, ForwardMatchesHuggingFaceFormula) {
  const auto c = GetParam();
  const std::int64_t nq = c.b * c.s * c.a * c.d, nk = c.b * c.s * c.kv * c.d;
  Buf q = Buf::from(uniform(nq, 31), c.dt), k = Buf::from(uniform(nk, 32), c.dt);
  const auto ref_q = hf_rope(q.f64(), c.b, c.s, c.a, c.d, c.theta);
  const auto ref_k = hf_rope(k.f64(), c.b, c.s, c.kv, c.d, c.theta);
  rope_forward_cpu(q.data(), k.data(), c.b, c.s, c.a, c.kv, c.d, RopeSpec{c.theta, {}}, c.dt);
  // fp32 angle, cos/sin, two products and a sum (~6u relative to the pair norm) then one
  // rounding to D: the single-rounding row.
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
    if (c.dt == DType::f32) {
      check_transpose_and_inverse(c, RopeSpec{c.theta, {}});
      check_transpose_and_inverse(c, RopeSpec{c.theta, llama31_scaling()});
    }
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
    rope_forward_cpu(q.data(), k.data(), 1, 2, 1, 1, 3, RopeSpec{}, DType::f32);
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "rope: head dim must be even, got 3");
  }
}

// The shared fp32 rule (rope_math.hpp, used by the cpu op and the CUDA kernel) against the double
// reference, at Llama 3.1 8B's (d 128, theta 500000) and at settings that put the band edges
// elsewhere; every case covers all three bands.
TEST(OpsRope, Llama3InvFreqMatchesDoubleReference) {
  struct Case {
    std::int64_t d;
    double theta;
    RopeScaling sc;
  };
  RopeScaling other = llama31_scaling();
  other.factor = 32.0;
  other.low_freq_factor = 2.0;
  other.high_freq_factor = 16.0;
  other.original_max_positions = 4096;
  for (const Case& c : {Case{128, 500000.0, llama31_scaling()},
                        Case{64, 500000.0, llama31_scaling()}, Case{128, 10000.0, other}}) {
    SCOPED_TRACE("d " + std::to_string(c.d) + " theta " + std::to_string(c.theta));
    const RopeFreqParams p = rope_freq_params(RopeSpec{c.theta, c.sc});
    int in_band[3] = {0, 0, 0};
    for (std::int64_t j = 0; j < c.d / 2; ++j) {
      Band band;
      const double want = llama3_inv_freq_ref(j, c.d, c.theta, c.sc, &band);
      ++in_band[int(band)];
      const double got = rope_scaled_inv_freq(j, c.d, p);
      // fp32 pow and a few fp32 operations: a few ulps.
      EXPECT_NEAR(got, want, 4e-6 * want) << "j " << j;
      if (band == Band::high) {
        EXPECT_EQ(got, rope_inv_freq<float>(j, c.d, float(c.theta))) << "j " << j;
      }
    }
    EXPECT_GT(in_band[int(Band::high)], 0);
    EXPECT_GT(in_band[int(Band::medium)], 0);
    EXPECT_GT(in_band[int(Band::low)], 0);
  }
  // The worked example of docs/formulas.md (d 128, theta 500000, factor 8, 1, 4, 8192):
  // j = 40 has inv_freq 500000^(-80/128) = 2.7425e-4, wavelength 22911 > 8192: divided by 8.
  EXPECT_NEAR(llama3_inv_freq_ref(40, 128, 500000.0, llama31_scaling()),
              std::pow(500000.0, -80.0 / 128.0) / 8.0, 1e-18);
  // The constants are docs/formulas.md's, quoted to 5 significant digits: half a unit of the
  // last digit is 5e-9 (2.7425e-4) or 5e-8 (1.3719e-3), so 1e-8 and 1e-7 (2x). (The j = 40 check
  // above divides the same pow by 8, exact: its 1e-18 is ~130 ulps of 3.4e-5, slack.)
  EXPECT_NEAR(std::pow(500000.0, -80.0 / 128.0), 2.7425e-4, 1e-8);
  // j = 30: inv_freq 2.1311e-3, wavelength 2948.3 between 2048 and 8192, smooth 0.5928, scaled
  // by 0.6437 to 1.3719e-3; j = 28 (wavelength 1956.5 < 2048) unchanged.
  EXPECT_NEAR(llama3_inv_freq_ref(30, 128, 500000.0, llama31_scaling()), 1.3719e-3, 1e-7);
  EXPECT_NEAR(
      rope_scaled_inv_freq(30, 128, rope_freq_params(RopeSpec{500000.0, llama31_scaling()})),
      1.3719e-3, 1e-7);
  EXPECT_NEAR(llama3_inv_freq_ref(28, 128, 500000.0, llama31_scaling()), 3.2114e-3, 1e-7);
}

TEST(OpsRope, ScalingNoneIsTheIdentity) {
  for (std::int64_t d : {2, 6, 64, 128})
    for (double theta : {10000.0, 500000.0}) {
      const RopeFreqParams p = rope_freq_params(RopeSpec{theta, {}});
      for (std::int64_t j = 0; j < d / 2; ++j)
        EXPECT_EQ(rope_scaled_inv_freq(j, d, p), rope_inv_freq<float>(j, d, float(theta)));
    }
}

// The op under llama3 scaling against HF's formula on the reference frequencies (rounded to
// fp32, as HF's inv_freq buffer is), over dtypes; the pairs of the high-frequency band give the
// same bits as without scaling, the others differ.
TEST(OpsRope, Llama3ForwardMatchesHuggingFaceFormula) {
  const std::int64_t b = 2, s = 37, a = 4, kv = 2, d = 64;
  const double theta = 500000.0;
  const RopeScaling sc = llama31_scaling();
  std::vector<float> inv_freq(d / 2);
  std::vector<bool> high(d / 2);
  for (std::int64_t j = 0; j < d / 2; ++j) {
    Band band;
    inv_freq[j] = float(llama3_inv_freq_ref(j, d, theta, sc, &band));
    high[j] = band == Band::high;
  }
  for (DType dt : all_dtypes()) {
    SCOPED_TRACE(dtype_label(dt));
    const std::int64_t nq = b * s * a * d, nk = b * s * kv * d;
    Buf q = Buf::from(uniform(nq, 51), dt), k = Buf::from(uniform(nk, 52), dt);
    Buf q0 = q, k0 = k;
    const auto ref_q = hf_rope(q.f64(), b, s, a, d, inv_freq);
    const auto ref_k = hf_rope(k.f64(), b, s, kv, d, inv_freq);
    rope_forward_cpu(q.data(), k.data(), b, s, a, kv, d, RopeSpec{theta, sc}, dt);
    rope_forward_cpu(q0.data(), k0.data(), b, s, a, kv, d, RopeSpec{theta, {}}, dt);
    // As the unscaled rope: fp32 angle/cos/sin/rotation then one rounding to D.
    EXPECT_TRUE(all_close("q", q.f32(), ref_q, tolerance(dt)));
    EXPECT_TRUE(all_close("k", k.f32(), ref_k, tolerance(dt)));
    const std::vector<float> got = q.f32(), plain = q0.f32();
    std::int64_t changed_low = 0;
    for (std::int64_t i = 0; i < nq; ++i) {
      const std::int64_t j = (i % d) % (d / 2), t = (i / (a * d)) % s;
      if (high[j])
        ASSERT_EQ(got[i], plain[i]) << "element " << i << " pair " << j;
      else if (t > 0)
        changed_low += got[i] != plain[i];
    }
    EXPECT_GT(changed_low, 0);
  }
}

}  // namespace
}  // namespace trainmem
