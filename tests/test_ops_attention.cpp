// Causal attention with GQA, eager and flash: the shared softmax pieces in fp64, both variants'
// backward against fp32 finite differences, forward/backward against a naive fp64 reference
// over dtype x shape x variant (x sliding window), eager vs flash agreement, and the causal mask
// (a change to a later key/value leaves earlier outputs bit-identical). Sliding window: against
// the naive reference masked to keys t-W+1..t, windows >= s equal full causal bit for bit,
// window 1 attends only to self, the window's bound is exact (a key at t-W changes nothing at
// t, a key at t-W+1 does), and flash never visits key tiles entirely outside the window.
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

// The naive reference, in fp64, straight from the definition. window W > 0: query i sees the
// keys j with i - W < j <= i (HuggingFace's kv_idx > q_idx - sliding_window).
struct Reference {
  std::vector<double> out, probs, lse, dq, dk, dv, delta;
};
Reference naive_attention(const Shape& shape, const std::vector<double>& q,
                          const std::vector<double>& k, const std::vector<double>& v,
                          const std::vector<double>& dout, std::int64_t window = 0) {
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
        std::int64_t lo = 0;  // first visible key
        while (window > 0 && !(lo > i - window)) ++lo;
        double mx = -INFINITY;
        for (std::int64_t j = lo; j <= i; ++j) {
          double dot = 0;
          for (std::int64_t e = 0; e < d; ++e) dot += q[qi(bi, i, head) + e] * k[ki(bi, j, g) + e];
          sc[j] = dot * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (std::int64_t j = lo; j <= i; ++j) sum += std::exp(sc[j] - mx);
        const std::int64_t row = (bi * shape.a + head) * s + i;
        r.lse[row] = mx + std::log(sum);
        double delta = 0;
        for (std::int64_t j = lo; j <= i; ++j) {
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
        for (std::int64_t j = lo; j <= i; ++j) {
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
  std::int64_t window;
  Buf q, k, v, dout, out, probs, dq, dk, dv, dprobs;
  std::vector<float> lse, delta;
  AttnRun(const Shape& dims, DType d, Attention var, std::uint32_t seed, std::int64_t w = 0)
      : shape(dims), dt(d), variant(var), window(w) {
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
                          shape.b, shape.s, shape.a, shape.kv, shape.d, window, variant, dt);
  }
  void backward() {
    attention_backward_cpu(dq.data(), dk.data(), dv.data(), dprobs.data(), delta.data(),
                           dout.data(), q.data(), k.data(), v.data(), out.data(), probs.data(),
                           lse.data(), shape.b, shape.s, shape.a, shape.kv, shape.d, window,
                           variant, dt);
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
  // fp64 (eps = 2^-53 = 1.1e-16) over 150 terms with |s| <= ~4: each path sums <= 150 exp terms
  // and rescales 3 times, <= ~160 eps relative of lse ~ 5-10: ~2e-13 absolute; 1e-12 is 5x.
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
    // Central difference in fp64, h = 1e-6: truncation h^2/6·|f^(3)| ~ 2e-13; rounding
    // eps·|loss|/h ~ 1.1e-10·|loss| with |loss| <= max|w| ~ 1-2: ~2e-10; 1e-9 is 5x the sum.
    EXPECT_NEAR(softmax_backward_elem(softmax_prob_from_lse(s[j], lse), w[j], delta), fd, 1e-9);
  }
  EXPECT_EQ(attention_kv_head(5, 6, 2), 1);
  EXPECT_EQ(attention_kv_head(2, 6, 2), 0);
  EXPECT_TRUE(causal_visible(3, 3));
  EXPECT_FALSE(causal_visible(3, 4));
  // Window 4 at query 10: keys 7..10.
  EXPECT_FALSE(window_visible(10, 6, 4));
  EXPECT_TRUE(window_visible(10, 7, 4));
  EXPECT_TRUE(window_visible(10, 10, 4));
  EXPECT_FALSE(window_visible(10, 11, 4));
  EXPECT_TRUE(window_visible(10, 0, 0));
  EXPECT_EQ(window_first_key(10, 4), 7);
  EXPECT_EQ(window_first_key(2, 4), 0);
  EXPECT_EQ(window_first_key(3, 4), 0);
  EXPECT_EQ(window_first_key(4, 4), 1);
  EXPECT_EQ(window_first_key(10, 0), 0);
  EXPECT_EQ(window_first_key(10, 1), 10);
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
      // fp32 forward, h = 1e-2: truncation h^2/6·|f^(3)| = 1.7e-5·|f^(3)| (relative to the gradient
      // <= 1e-2 while f^(3) is within ~500x of f', rtol); rounding of the fp32 loss (~s·u·|loss| ~
      // 1e-5 for |loss| ~ 1) over 2h = 0.02: ~5e-4 absolute, so atol 2e-3 (4x).
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
  // tolerance(): one rounding of each result to D plus fp32 accumulation over s <= 200 keys
  // (<= 200u = 1.2e-5 relative, inside f32's 2e-4). In 16 bits a second D rounding precedes the
  // result (eager: the stored probabilities; both: out feeds delta and the backward), so scale 2.
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
    // Both fp32 on the same inputs, summing the same <= 200 terms in another order (two-pass vs
    // online rescaling): each within ~s·u = 1.2e-5 of the sum of magnitudes, so rtol 1e-4 allows
    // a result ~8x smaller than that sum through cancellation; atol 1e-5 for results near 0.
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

// ---------------------------------------------------------------- sliding window

struct WindowCase {
  DType dt;
  Shape shape;
  Attention variant;
  std::int64_t window;
};
void PrintTo(const WindowCase& c, std::ostream* os) {
  *os << dtype_label(c.dt) << " " << variant_label(c.variant) << " " << c.shape.label() << " w "
      << c.window;
}
class OpsAttentionWindowP : public ::testing::TestWithParam<WindowCase> {};

TEST_P(OpsAttentionWindowP, MatchesNaiveMaskedReference) {
  const auto c = GetParam();
  AttnRun r(c.shape, c.dt, c.variant, 180, c.window);
  r.forward();
  r.backward();
  const Reference ref =
      naive_attention(c.shape, r.q.f64(), r.k.f64(), r.v.f64(), r.dout.f64(), c.window);
  // tolerance(): one rounding of each result to D plus fp32 accumulation over s <= 200 keys
  // (<= 200u = 1.2e-5 relative, inside f32's 2e-4). In 16 bits a second D rounding precedes the
  // result (eager: the stored probabilities; both: out feeds delta and the backward), so scale 2.
  const Tol tol = tolerance(c.dt, c.dt == DType::f32 ? 1.0 : 2.0);
  EXPECT_TRUE(all_close("out", r.out.f32(), ref.out, tol));
  if (c.variant == Attention::eager) {
    EXPECT_TRUE(all_close("probs", r.probs.f32(), ref.probs, tolerance(c.dt)));
    // Outside the window (and above the diagonal) the stored probabilities are exactly 0.
    const std::int64_t s = c.shape.s;
    const std::vector<float> p = r.probs.f32();
    for (std::int64_t row = 0; row < c.shape.b * c.shape.a * s; ++row) {
      const std::int64_t i = row % s;
      for (std::int64_t j = 0; j < s; ++j)
        if (j > i || j <= i - c.window) {
          ASSERT_EQ(p[row * s + j], 0.0f) << "row " << row << " key " << j;
        }
    }
  } else {
    EXPECT_TRUE(all_close("lse", r.lse, ref.lse, tolerance(DType::f32)));
    EXPECT_TRUE(all_close("delta", r.delta, ref.delta, tol));
  }
  EXPECT_TRUE(all_close("dq", r.dq.f32(), ref.dq, tol));
  EXPECT_TRUE(all_close("dk", r.dk.f32(), ref.dk, tol));
  EXPECT_TRUE(all_close("dv", r.dv.f32(), ref.dv, tol));
}

std::vector<WindowCase> window_cases() {
  // The flash tile is 64 x 64: windows inside one tile, ones that cut a tile boundary, exactly
  // a tile, and past s. GQA 3:1, 2:1 and none.
  const std::pair<Shape, std::vector<std::int64_t>> by_shape[] = {
      {{2, 7, 3, 1, 6}, {1, 2, 3, 6}},
      {{1, 69, 4, 2, 8}, {1, 5, 30, 64, 65}},
      {{2, 130, 2, 2, 4}, {2, 17, 63, 64, 65, 100}},
      {{1, 200, 2, 1, 8}, {10, 70, 129}},
  };
  std::vector<WindowCase> out;
  for (DType dt : all_dtypes())
    for (const auto& [shape, windows] : by_shape)
      for (std::int64_t w : windows)
        for (Attention var : {Attention::eager, Attention::flash})
          out.push_back({dt, shape, var, w});
  return out;
}
INSTANTIATE_TEST_SUITE_P(DtypeByShapeByVariantByWindow, OpsAttentionWindowP,
                         ::testing::ValuesIn(window_cases()), [](const auto& info) {
                           const auto& c = info.param;
                           return dtype_label(c.dt) + "_" + variant_label(c.variant) + "_" +
                                  c.shape.label() + "_w" + std::to_string(c.window);
                         });

TEST(OpsAttentionWindow, EagerAndFlashAgree) {
  const std::pair<Shape, std::int64_t> cases[] = {{{2, 7, 3, 1, 6}, 3},
                                                  {{1, 69, 4, 2, 8}, 5},
                                                  {{2, 130, 2, 2, 4}, 65},
                                                  {{1, 200, 2, 1, 8}, 70}};
  for (const auto& [shape, w] : cases) {
    SCOPED_TRACE(shape.label() + " w " + std::to_string(w));
    AttnRun e(shape, DType::f32, Attention::eager, 190, w),
        f(shape, DType::f32, Attention::flash, 190, w);
    e.forward();
    e.backward();
    f.forward();
    f.backward();
    // Both fp32 on the same inputs, summing the same <= 200 terms in another order (two-pass vs
    // online rescaling): each within ~s·u = 1.2e-5 of the sum of magnitudes, so rtol 1e-4 allows
    // a result ~8x smaller than that sum through cancellation; atol 1e-5 for results near 0.
    const Tol tol{1e-5, 1e-4};
    EXPECT_TRUE(all_close("out", f.out.f32(), e.out.f64(), tol));
    EXPECT_TRUE(all_close("dq", f.dq.f32(), e.dq.f64(), tol));
    EXPECT_TRUE(all_close("dk", f.dk.f32(), e.dk.f64(), tol));
    EXPECT_TRUE(all_close("dv", f.dv.f32(), e.dv.f64(), tol));
  }
}

// A window of at least s hides nothing: the same bits as full causal attention (window 0).
TEST(OpsAttentionWindow, WindowAtLeastSeqEqualsFullCausal) {
  const Shape shape{2, 69, 4, 2, 8};
  for (DType dt : all_dtypes())
    for (Attention var : {Attention::eager, Attention::flash})
      for (std::int64_t w : {shape.s, shape.s + 1, std::int64_t(1) << 40}) {
        SCOPED_TRACE(dtype_label(dt) + " " + variant_label(var) + " w " + std::to_string(w));
        AttnRun full(shape, dt, var, 200, 0), win(shape, dt, var, 200, w);
        for (AttnRun* r : {&full, &win}) {
          r->forward();
          r->backward();
        }
        EXPECT_EQ(win.out.f32(), full.out.f32());
        EXPECT_EQ(win.probs.f32(), full.probs.f32());
        EXPECT_EQ(win.lse, full.lse);
        EXPECT_EQ(win.dq.f32(), full.dq.f32());
        EXPECT_EQ(win.dk.f32(), full.dk.f32());
        EXPECT_EQ(win.dv.f32(), full.dv.f32());
      }
}

// Window 1: every query sees only its own key, so out = v of its kv head (p = 1 exactly), the
// score gradient vanishes (dq = dk = 0) and dv[t] = the sum of dout[t] over the group's heads.
TEST(OpsAttentionWindow, WindowOneAttendsOnlyToSelf) {
  const Shape shape{2, 70, 6, 2, 4};  // GQA 3:1, two flash tiles
  for (Attention var : {Attention::eager, Attention::flash}) {
    SCOPED_TRACE(variant_label(var));
    AttnRun r(shape, DType::f32, var, 210, 1);
    r.forward();
    r.backward();
    const std::int64_t g = shape.a / shape.kv;
    std::vector<double> want_out(shape.nq()), want_dv(shape.nk(), 0.0);
    for (std::int64_t bi = 0; bi < shape.b; ++bi)
      for (std::int64_t t = 0; t < shape.s; ++t)
        for (std::int64_t head = 0; head < shape.a; ++head)
          for (std::int64_t e = 0; e < shape.d; ++e) {
            const std::int64_t qi = ((bi * shape.s + t) * shape.a + head) * shape.d + e;
            const std::int64_t ki = ((bi * shape.s + t) * shape.kv + head / g) * shape.d + e;
            want_out[qi] = r.v.get(ki);
            want_dv[ki] += r.dout.get(qi);
          }
    EXPECT_TRUE(all_close("out", r.out.f32(), want_out, {0, 0}));
    // out = v exactly (p = 1, one term): {0, 0}. dv sums g = 3 dout values (|dout| <= 1) in
    // fp32, two roundings: <= 2u·3 = 3.6e-7 < 1e-6. dq, dk = scale·(dp - delta)·k (or q): dp =
    // dout·v and delta = dout·out are sums of the same d = 4 products (out = v exactly), equal
    // when summed in the same order; in another order they could differ by up to
    // 2(d-1)u·sum|dout·v| <= 1.4e-6, times scale·|k| <= 0.5·2: atol 1e-6 relies on the order.
    EXPECT_TRUE(all_close("dv", r.dv.f32(), want_dv, {1e-6, 1e-6}));
    EXPECT_TRUE(all_close("dq", r.dq.f32(), std::vector<double>(shape.nq(), 0.0), {1e-6, 0}));
    EXPECT_TRUE(all_close("dk", r.dk.f32(), std::vector<double>(shape.nk(), 0.0), {1e-6, 0}));
  }
}

// The bound is exact: changing the key and value at position p0 changes the outputs at
// t = p0..p0+W-1 (p0 = t-W+1 is still inside) and leaves every other position bit-identical
// (t = p0+W has p0 = t-W, just outside). An off-by-one window fails one of the two.
TEST(OpsAttentionWindow, WindowBoundIsExact) {
  const Shape shape{1, 150, 2, 1, 8};
  for (DType dt : all_dtypes())
    for (Attention var : {Attention::eager, Attention::flash})
      for (std::int64_t w : {1, 7, 64, 65}) {
        SCOPED_TRACE(dtype_label(dt) + " " + variant_label(var) + " w " + std::to_string(w));
        AttnRun r(shape, dt, var, 220, w);
        r.forward();
        const std::vector<float> before = r.out.f32();
        const std::int64_t p0 = 60;
        for (std::int64_t e = 0; e < shape.kv * shape.d; ++e) {
          const std::int64_t i = p0 * shape.kv * shape.d + e;
          r.k.set(i, r.k.get(i) + 1.5f);
          r.v.set(i, -r.v.get(i) - 0.5f);
        }
        r.forward();
        const std::vector<float> after = r.out.f32();
        for (std::int64_t t = 0; t < shape.s; ++t) {
          std::int64_t changed = 0;
          for (std::int64_t e = 0; e < shape.a * shape.d; ++e) {
            const std::int64_t i = t * shape.a * shape.d + e;
            changed += after[i] != before[i];
          }
          if (t >= p0 && t < p0 + w)
            EXPECT_GT(changed, 0) << "t " << t << " sees p0 " << p0;
          else
            EXPECT_EQ(changed, 0) << "t " << t << " must not see p0 " << p0;
        }
      }
}

// Flash visits only the key tiles (64 keys) that hold a visible key: with the keys and values of
// tile 0 (positions 0..63) NaN and window 10, the query tiles from 128 on (first visible key 119)
// never read them and stay finite and correct, forward and backward; the query tile 64..127
// (first visible key 55) reads tile 0, so NaN reaches it through 0 * NaN.
TEST(OpsAttentionWindow, FlashSkipsKeyTilesOutsideTheWindow) {
  const Shape shape{1, 200, 2, 1, 8};
  const std::int64_t w = 10;
  AttnRun clean(shape, DType::f32, Attention::flash, 230, w);
  AttnRun r(shape, DType::f32, Attention::flash, 230, w);
  for (std::int64_t i = 0; i < 64 * shape.kv * shape.d; ++i) {
    r.k.set(i, NAN);
    r.v.set(i, NAN);
  }
  for (AttnRun* x : {&clean, &r}) {
    x->forward();
    x->backward();
  }
  const std::int64_t row = shape.a * shape.d;
  const std::vector<float> out = r.out.f32(), dq = r.dq.f32();
  const std::vector<float> out0 = clean.out.f32(), dq0 = clean.dq.f32();
  for (std::int64_t i = 128 * row; i < shape.s * row; ++i) {
    ASSERT_EQ(out[i], out0[i]) << "out [" << i << "]";
    ASSERT_EQ(dq[i], dq0[i]) << "dq [" << i << "]";
  }
  // dk, dv of the keys from 128 on come only from the query tiles from 128 on.
  const std::int64_t krow = shape.kv * shape.d;
  const std::vector<float> dk = r.dk.f32(), dk0 = clean.dk.f32();
  const std::vector<float> dv = r.dv.f32(), dv0 = clean.dv.f32();
  for (std::int64_t i = 128 * krow; i < shape.s * krow; ++i) {
    ASSERT_EQ(dk[i], dk0[i]) << "dk [" << i << "]";
    ASSERT_EQ(dv[i], dv0[i]) << "dv [" << i << "]";
  }
  EXPECT_TRUE(std::isnan(out[100 * row])) << "the query tile 64..127 reads key tile 0";
}

TEST(OpsAttentionWindow, SameBitsForAnyThreadCount) {
  const Shape shape{3, 130, 4, 2, 16};
  for (DType dt : {DType::f32, DType::bf16})
    for (Attention var : {Attention::eager, Attention::flash}) {
      SCOPED_TRACE(dtype_label(dt) + " " + variant_label(var));
      AttnRun one(shape, dt, var, 240, 37), four(shape, dt, var, 240, 37);
      with_threads(1, [&] {
        one.forward();
        one.backward();
      });
      with_threads(4, [&] {
        four.forward();
        four.backward();
      });
      EXPECT_EQ(one.out.f32(), four.out.f32());
      EXPECT_EQ(one.dq.f32(), four.dq.f32());
      EXPECT_EQ(one.dk.f32(), four.dk.f32());
      EXPECT_EQ(one.dv.f32(), four.dv.f32());
    }
}

TEST(OpsAttentionWindow, NegativeWindowIsRejected) {
  AttnRun r({1, 4, 2, 1, 2}, DType::f32, Attention::flash, 250, -1);
  try {
    r.forward();
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "attention: window must be >= 0 (0: full causal), got -1");
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
