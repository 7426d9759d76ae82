// Causal attention with GQA, eager and flash: the shared softmax pieces in fp64, both variants'
// backward against fp32 finite differences, forward/backward against a naive fp64 reference
// over dtype x shape x variant, eager vs flash agreement, and the causal mask (a change to a
// later key/value leaves earlier outputs bit-identical).
#include <gtest/gtest.h>

#include <cmath>

#include "attention/attention.hpp"
#include "attention/attention_math.hpp"
#include "ops_testing.hpp"

namespace trainmem {
namespace {
using namespace trainmem::testing;

struct Shape {
  std::int64_t b, s, a, kv, d;
  std::int64_t nq() const { return b * s * a * d; }
  std::int64_t nk() const { return b * s * kv * d; }
  std::string label() const {
    return "b" + std::to_string(b) + "_s" + std::to_string(s) + "_a" + std::to_string(a) + "_kv" +
           std::to_string(kv) + "_d" + std::to_string(d);
  }
};

// The naive reference, in fp64, straight from the definition.
struct Reference {
  std::vector<double> out, probs, lse, dq, dk, dv, delta;
};
Reference naive_attention(const Shape& shape, const std::vector<double>& q,
                          const std::vector<double>& k, const std::vector<double>& v,
                          const std::vector<double>& dout) {
  const std::int64_t s = shape.s, d = shape.d;
  Reference r;
  r.out.assign(shape.nq(), 0.0);
  r.dq.assign(shape.nq(), 0.0);
  r.dk.assign(shape.nk(), 0.0);
  r.dv.assign(shape.nk(), 0.0);
  r.probs.assign(shape.b * shape.a * s * s, 0.0);
  r.lse.assign(shape.b * shape.a * s, 0.0);
  r.delta.assign(shape.b * shape.a * s, 0.0);
  const double scale = 1.0 / std::sqrt(double(d));
  auto qi = [&](std::int64_t bi, std::int64_t t, std::int64_t head) {
    return ((bi * s + t) * shape.a + head) * d;
  };
  auto ki = [&](std::int64_t bi, std::int64_t t, std::int64_t head) {
    return ((bi * s + t) * shape.kv + head) * d;
  };
  for (std::int64_t bi = 0; bi < shape.b; ++bi)
    for (std::int64_t head = 0; head < shape.a; ++head) {
      const std::int64_t g = head / (shape.a / shape.kv);
      for (std::int64_t i = 0; i < s; ++i) {
        std::vector<double> sc(i + 1), dp(i + 1);
        double mx = -INFINITY;
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (std::int64_t e = 0; e < d; ++e) dot += q[qi(bi, i, head) + e] * k[ki(bi, j, g) + e];
          sc[j] = dot * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) sum += std::exp(sc[j] - mx);
        const std::int64_t row = (bi * shape.a + head) * s + i;
        r.lse[row] = mx + std::log(sum);
        double delta = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(sc[j] - r.lse[row]);
          r.probs[row * s + j] = p;
          double dot = 0;
          for (std::int64_t e = 0; e < d; ++e) {
            r.out[qi(bi, i, head) + e] += p * v[ki(bi, j, g) + e];
            dot += dout[qi(bi, i, head) + e] * v[ki(bi, j, g) + e];
          }
          dp[j] = dot;
          delta += p * dot;
        }
        r.delta[row] = delta;
        for (std::int64_t j = 0; j <= i; ++j) {
          const double p = r.probs[row * s + j];
          const double ds = p * (dp[j] - delta);
          for (std::int64_t e = 0; e < d; ++e) {
            r.dq[qi(bi, i, head) + e] += scale * ds * k[ki(bi, j, g) + e];
            r.dk[ki(bi, j, g) + e] += scale * ds * q[qi(bi, i, head) + e];
            r.dv[ki(bi, j, g) + e] += p * dout[qi(bi, i, head) + e];
          }
        }
      }
    }
  return r;
}

// The op's buffers for one shape, dtype and variant.
struct AttnRun {
  Shape shape;
  DType dt;
  Attention variant;
  Buf q, k, v, dout, out, probs, dq, dk, dv, dprobs;
  std::vector<float> lse, delta;
  AttnRun(const Shape& dims, DType d, Attention var, std::uint32_t seed)
      : shape(dims), dt(d), variant(var) {
    q = Buf::from(uniform(shape.nq(), seed, -2, 2), dt);
    k = Buf::from(uniform(shape.nk(), seed + 1, -2, 2), dt);
    v = Buf::from(uniform(shape.nk(), seed + 2), dt);
    dout = Buf::from(uniform(shape.nq(), seed + 3), dt);
    out = dq = Buf(shape.nq(), dt);
    dk = dv = Buf(shape.nk(), dt);
    probs = dprobs = Buf(shape.b * shape.a * shape.s * shape.s, dt);
    lse.assign(shape.b * shape.a * shape.s, 0.0f);
    delta = lse;
  }
  void forward() {
    attention_forward_cpu(out.data(), probs.data(), lse.data(), q.data(), k.data(), v.data(),
                          shape.b, shape.s, shape.a, shape.kv, shape.d, variant, dt);
  }
  void backward() {
    attention_backward_cpu(dq.data(), dk.data(), dv.data(), dprobs.data(), delta.data(),
                           dout.data(), q.data(), k.data(), v.data(), out.data(), probs.data(),
                           lse.data(), shape.b, shape.s, shape.a, shape.kv, shape.d, variant, dt);
  }
};

const char* variant_label(Attention a) {
  return a == Attention::eager ? "eager" : "flash";
}

TEST(OpsAttention, MathOnlineSoftmaxAndBackwardInFp64) {
  const auto f = uniform(150, 111, -20, 20);
  std::vector<double> s(f.begin(), f.end()), w(150);
  const auto fw = uniform(150, 112);
  for (int j = 0; j < 150; ++j) w[j] = fw[j];
  auto lse_naive = [&] {
    double mx = -INFINITY, sum = 0;
    for (double x : s) mx = std::max(mx, x);
    for (double x : s) sum += std::exp(x - mx);
    return mx + std::log(sum);
  };
  // Online softmax over blocks of 64 (the flash tile) gives the two-pass log-sum-exp.
  OnlineSoftmax<double> st = OnlineSoftmax<double>::start();
  for (int j0 = 0; j0 < 150; j0 += 64) {
    double bmax = -INFINITY;
    for (int j = j0; j < std::min(150, j0 + 64); ++j) bmax = std::max(bmax, s[j]);
    online_softmax_rescale(&st, bmax);
    for (int j = j0; j < std::min(150, j0 + 64); ++j) st.l += online_softmax_weight(st, s[j]);
  }
  EXPECT_NEAR(online_softmax_lse(st), lse_naive(), 1e-12);
  // d/ds_j of sum_k w_k softmax_k(s) = p_j (w_j - sum_k p_k w_k).
  const double lse = lse_naive();
  double delta = 0;
  for (int j = 0; j < 150; ++j) delta += softmax_prob_from_lse(s[j], lse) * w[j];
  auto loss = [&] {
    const double l = lse_naive();
    double acc = 0;
    for (int j = 0; j < 150; ++j) acc += w[j] * std::exp(s[j] - l);
    return acc;
  };
  for (int j = 0; j < 150; j += 7) {
    const double fd = central_difference([&](double x) { s[j] = x; }, s[j], 1e-6, loss);
    EXPECT_NEAR(softmax_backward_elem(softmax_prob_from_lse(s[j], lse), w[j], delta), fd, 1e-9);
  }
  EXPECT_EQ(attention_kv_head(5, 6, 2), 1);
  EXPECT_EQ(attention_kv_head(2, 6, 2), 0);
  EXPECT_TRUE(causal_visible(3, 3));
  EXPECT_FALSE(causal_visible(3, 4));
}

TEST(OpsAttention, BackwardMatchesFp32FiniteDifferences) {
  const Shape shape{2, 7, 3, 1, 6};
  for (Attention var : {Attention::eager, Attention::flash}) {
    SCOPED_TRACE(variant_label(var));
    AttnRun r(shape, DType::f32, var, 120);
    const std::vector<float> w = r.dout.f32();
    auto loss = [&] {
      r.forward();
      double acc = 0;
      for (std::int64_t i = 0; i < shape.nq(); ++i) acc += double(w[i]) * r.out.get(i);
      return acc;
    };
    loss();
    r.backward();
    for (auto [buf, grad, name] : {std::tuple{&r.q, &r.dq, "dq"}, std::tuple{&r.k, &r.dk, "dk"},
                                   std::tuple{&r.v, &r.dv, "dv"}}) {
      std::vector<double> fd(buf->size());
      for (std::size_t i = 0; i < buf->size(); ++i)
        fd[i] = central_difference([&, bi = buf](double x) { bi->set(i, float(x)); }, buf->get(i),
                                   1e-2, loss);
      EXPECT_TRUE(all_close(name, grad->f32(), fd, {2e-3, 1e-2}));
    }
  }
}

struct AttnCase {
  DType dt;
  Shape shape;
  Attention variant;
};
void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << dtype_label(c.dt) << " " << variant_label(c.variant) << " " << c.shape.label();
}
class OpsAttentionP : public ::testing::TestWithParam<AttnCase> {};

TEST_P(OpsAttentionP, MatchesNaiveReference) {
  const auto c = GetParam();
  AttnRun r(c.shape, c.dt, c.variant, 130);
  r.forward();
  r.backward();
  const Reference ref = naive_attention(c.shape, r.q.f64(), r.k.f64(), r.v.f64(), r.dout.f64());
  // 16-bit: probabilities (eager) and outputs are rounded before the backward reads them.
  const Tol tol = tolerance(c.dt, c.dt == DType::f32 ? 1.0 : 2.0);
  EXPECT_TRUE(all_close("out", r.out.f32(), ref.out, tol));
  if (c.variant == Attention::eager) {
    EXPECT_TRUE(all_close("probs", r.probs.f32(), ref.probs, tolerance(c.dt)));
  } else {
    EXPECT_TRUE(all_close("lse", r.lse, ref.lse, tolerance(DType::f32)));
    EXPECT_TRUE(all_close("delta", r.delta, ref.delta, tol));
  }
  EXPECT_TRUE(all_close("dq", r.dq.f32(), ref.dq, tol));
  EXPECT_TRUE(all_close("dk", r.dk.f32(), ref.dk, tol));
  EXPECT_TRUE(all_close("dv", r.dv.f32(), ref.dv, tol));
}

const Shape kShapes[] = {
    {2, 7, 3, 1, 6},    // awkward, GQA 3:1
    {1, 69, 4, 2, 8},   // crosses the 64-row/64-key flash tile, GQA 2:1
    {2, 130, 2, 2, 4},  // three tiles, no GQA
    {1, 1, 2, 1, 2},    // a single position
};
std::vector<AttnCase> attention_cases() {
  std::vector<AttnCase> out;
  for (DType dt : all_dtypes())
    for (const Shape& shape : kShapes)
      for (Attention var : {Attention::eager, Attention::flash}) out.push_back({dt, shape, var});
  return out;
}
INSTANTIATE_TEST_SUITE_P(DtypeByShapeByVariant, OpsAttentionP,
                         ::testing::ValuesIn(attention_cases()), [](const auto& info) {
                           const auto& c = info.param;
                           return dtype_label(c.dt) + "_" + variant_label(c.variant) + "_" +
                                  c.shape.label();
                         });

TEST(OpsAttention, EagerAndFlashAgree) {
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE(shape.label());
    AttnRun e(shape, DType::f32, Attention::eager, 140),
        f(shape, DType::f32, Attention::flash, 140);
    e.forward();
    e.backward();
    f.forward();
    f.backward();
    const Tol tol{1e-5, 1e-4};
    EXPECT_TRUE(all_close("out", f.out.f32(), e.out.f64(), tol));
    EXPECT_TRUE(all_close("dq", f.dq.f32(), e.dq.f64(), tol));
    EXPECT_TRUE(all_close("dk", f.dk.f32(), e.dk.f64(), tol));
    EXPECT_TRUE(all_close("dv", f.dv.f32(), e.dv.f64(), tol));
  }
}

TEST(OpsAttention, LaterKeysAndValuesDoNotChangeEarlierOutputs) {
  for (DType dt : all_dtypes())
    for (Attention var : {Attention::eager, Attention::flash}) {
      const Shape shape{2, 69, 4, 2, 8};
      SCOPED_TRACE(dtype_label(dt) + " " + variant_label(var));
      AttnRun r(shape, dt, var, 150);
      r.forward();
      const std::vector<float> before = r.out.f32();
      const std::int64_t t0 = 40;  // change every key and value at position t0
      for (std::int64_t bi = 0; bi < shape.b; ++bi)
        for (std::int64_t e = 0; e < shape.kv * shape.d; ++e) {
          const std::int64_t i = (bi * shape.s + t0) * shape.kv * shape.d + e;
          r.k.set(i, r.k.get(i) + 1.5f);
          r.v.set(i, -r.v.get(i) - 0.5f);
        }
      r.forward();
      const std::vector<float> after = r.out.f32();
      std::int64_t changed_later = 0;
      for (std::int64_t bi = 0; bi < shape.b; ++bi)
        for (std::int64_t t = 0; t < shape.s; ++t)
          for (std::int64_t e = 0; e < shape.a * shape.d; ++e) {
            const std::int64_t i = (bi * shape.s + t) * shape.a * shape.d + e;
            if (t < t0)
              ASSERT_EQ(after[i], before[i]) << "bi " << bi << " t " << t << " e " << e;
            else
              changed_later += after[i] != before[i];
          }
      EXPECT_GT(changed_later, shape.b * (shape.s - t0) * shape.a * shape.d / 2);
    }
}

TEST(OpsAttention, SameBitsForAnyThreadCount) {
  const Shape shape{3, 130, 4, 2, 16};  // large enough for the OpenMP team
  for (DType dt : {DType::f32, DType::bf16})
    for (Attention var : {Attention::eager, Attention::flash}) {
      SCOPED_TRACE(dtype_label(dt) + " " + variant_label(var));
      AttnRun one(shape, dt, var, 170), three(shape, dt, var, 170);
      with_threads(1, [&] {
        one.forward();
        one.backward();
      });
      with_threads(3, [&] {
        three.forward();
        three.backward();
      });
      EXPECT_EQ(one.out.f32(), three.out.f32());
      EXPECT_EQ(one.dq.f32(), three.dq.f32());
      EXPECT_EQ(one.dk.f32(), three.dk.f32());
      EXPECT_EQ(one.dv.f32(), three.dv.f32());
    }
}

TEST(OpsAttention, KvHeadsMustDivideHeads) {
  AttnRun r({1, 2, 3, 2, 2}, DType::f32, Attention::eager, 160);
  try {
    r.forward();
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "attention: kv heads (2) must divide query heads (3)");
  }
}

}  // namespace
}  // namespace trainmem
