// The cpu and meta backends through the Backend interface: kinds, allocators, transfers, a few
// ops against naive references in the backend's dtype (cpu), and that the meta backend never
// touches memory (its ops run on MetaAllocator addresses that must not be dereferenced).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops_testing.hpp"
#include "trainmem/backends/backend.hpp"

namespace trainmem {
namespace {
using namespace trainmem::testing;

TEST(OpsBackends, CpuBackendBasics) {
  auto be = make_cpu_backend(DType::bf16);
  EXPECT_EQ(be->kind(), BackendKind::cpu);
  EXPECT_EQ(be->dtype(), DType::bf16);
  EXPECT_TRUE(be->computes());
  EXPECT_STREQ(be->allocator().name(), "host");
  EXPECT_TRUE(be->allocator().touches_memory());
  void* p = be->allocator().allocate(64);
  ASSERT_NE(p, nullptr);
  const std::vector<unsigned char> src = {1, 2, 3, 4, 5, 6, 7, 8};
  be->upload(p, src.data(), 8);
  std::vector<unsigned char> back(8);
  be->download(back.data(), p, 8);
  EXPECT_EQ(back, src);
  be->copy(static_cast<char*>(p) + 8, p, 8);
  be->fill_zero(p, 4);
  be->download(back.data(), static_cast<char*>(p) + 8, 8);
  EXPECT_EQ(back, src);
  be->download(back.data(), p, 8);
  EXPECT_EQ(back, (std::vector<unsigned char>{0, 0, 0, 0, 5, 6, 7, 8}));
  be->allocator().deallocate(p, 64);
}

TEST(OpsBackends, CpuBackendRejectsInt32) {
  try {
    make_cpu_backend(DType::i32);
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "dtype: the cpu backend trains in fp32, fp16 or bf16, not int32");
  }
}

// A linear layer (x W^T) and SwiGLU through the interface, in each dtype, against fp64.
TEST(OpsBackends, CpuBackendOpsUseItsDtype) {
  for (DType dt : all_dtypes()) {
    SCOPED_TRACE(dtype_label(dt));
    auto be = make_cpu_backend(dt);
    const std::int64_t N = 5, K = 12, M = 7;
    Buf x = Buf::from(uniform(N * K, 171), dt), w = Buf::from(uniform(M * K, 172), dt);
    Buf y(N * M, dt), act(N * M, dt);
    be->matmul(y.data(), x.data(), w.data(), N, M, K, Trans::no, Trans::yes, 1.0f, 0.0f);
    std::vector<double> ref(N * M), ref_act(N * M);
    for (std::int64_t i = 0; i < N; ++i)
      for (std::int64_t j = 0; j < M; ++j) {
        double s = 0;
        for (std::int64_t p = 0; p < K; ++p) s += double(x.get(i * K + p)) * w.get(j * K + p);
        ref[i * M + j] = s;
      }
    // K = 12 fp32 products summed: <= K·u·sum|x·w| (sum|x·w| <= K = 12, |x|,|w| <= 1), 8.6e-6
    // absolute, plus one rounding to D relative to |y| which can be far smaller than sum|x·w|:
    // scale 4 widens atol to 4x the table's (8e-5 f32 / 6.4e-2 bf16) for that cancellation.
    EXPECT_TRUE(all_close("y", y.f32(), ref, tolerance(dt, 4)));
    be->swiglu_forward(act.data(), y.data(), y.data(), N * M);
    for (std::int64_t i = 0; i < N * M; ++i) {
      const double g = y.get(i);
      ref_act[i] = g * g / (1 + std::exp(-g));
    }
    // g·g·sigmoid(g) on the stored y: exp, add, divide, two products in fp32 (~5u = 3e-7
    // relative) then one rounding to D: the table's single-rounding row.
    EXPECT_TRUE(all_close("act", act.f32(), ref_act, tolerance(dt)));
  }
}

// The issue-16 ops through the interface (bias, llama3 rope scaling, sliding-window attention),
// in each dtype, against fp64 written here.
TEST(OpsBackends, CpuBackendFamilyOps) {
  for (DType dt : all_dtypes()) {
    SCOPED_TRACE(dtype_label(dt));
    auto be = make_cpu_backend(dt);
    // bias: out += bias per row; dbias += column sums.
    const std::int64_t n = 9, c = 40;
    Buf out = Buf::from(uniform(n * c, 181), dt), bias = Buf::from(uniform(c, 182), dt);
    Buf dbias = Buf::from(uniform(c, 183), dt);
    std::vector<double> want_out(n * c), want_db(c);
    for (std::int64_t j = 0; j < c; ++j) want_db[j] = dbias.get(j);
    for (std::int64_t i = 0; i < n * c; ++i) {
      want_out[i] = double(out.get(i)) + bias.get(i % c);
      want_db[i % c] += out.get(i);
    }
    be->bias_backward(dbias.data(), out.data(), n, c);
    be->bias_forward(out.data(), bias.data(), n, c);
    // out: one addition rounded once to D; dbias: n fp32 additions (n·u, n small) then one
    // rounding to D: both single-rounding rows of the table.
    EXPECT_TRUE(all_close("bias out", out.f32(), want_out, tolerance(dt)));
    EXPECT_TRUE(all_close("dbias", dbias.f32(), want_db, tolerance(dt)));

    // rope with llama3 scaling, positions 0..5, one head of d = 4, theta 10000, factor 8,
    // low 1, high 4, original 32: pair 0 (inv_freq 1) has wavelength 2π < 32/4 (kept), pair 1
    // (inv_freq 0.01) has 200π > 32/1 (divided by 8).
    RopeSpec spec{10000.0, {}};
    spec.scaling = {RopeScalingKind::llama3, 8.0, 1.0, 4.0, 32};
    const std::int64_t s = 6, d = 4;
    Buf q = Buf::from(uniform(s * d, 184), dt);
    const std::vector<float> q0 = q.f32();
    be->rope_forward(q.data(), nullptr, 1, s, 1, 1, d, spec);
    const double freqs[2] = {1.0, 0.01 / 8.0};
    std::vector<double> want_q(s * d);
    for (std::int64_t t = 0; t < s; ++t)
      for (std::int64_t j = 0; j < 2; ++j) {
        const double ang = double(t) * freqs[j], x1 = q0[t * d + j], x2 = q0[t * d + j + 2];
        want_q[t * d + j] = x1 * std::cos(ang) - x2 * std::sin(ang);
        want_q[t * d + j + 2] = x2 * std::cos(ang) + x1 * std::sin(ang);
      }
    // x1·cos - x2·sin in fp32: the angle t·f, cos, sin, two products and a difference (~6u),
    // then one rounding to D; scale 2 for the angle's rounding, which grows with t.
    EXPECT_TRUE(all_close("rope q", q.f32(), want_q, tolerance(dt, 2)));

    // Window 2 attention, one head, d 1, s 3, eager and flash: row t averages the values at
    // t-1 and t with softmax weights of q_t k_j.
    for (Attention var : {Attention::eager, Attention::flash}) {
      SCOPED_TRACE(var == Attention::eager ? "eager" : "flash");
      Buf aq = Buf::from({0.5f, -1.0f, 2.0f}, dt), ak = Buf::from({1.0f, 0.25f, -0.5f}, dt);
      Buf av = Buf::from({3.0f, -2.0f, 1.0f}, dt), ao(3, dt), probs(9, dt);
      std::vector<float> lse(3);
      be->attention_forward(ao.data(), probs.data(), lse.data(), aq.data(), ak.data(), av.data(), 1,
                            3, 1, 1, 1, 2, var);
      std::vector<double> want(3);
      for (int t = 0; t < 3; ++t) {
        double num = 0, den = 0;
        for (int j = std::max(0, t - 1); j <= t; ++j) {
          const double w = std::exp(double(aq.get(t)) * ak.get(j));
          num += w * av.get(j);
          den += w;
        }
        want[t] = num / den;
      }
      // exp, products, sums and a divide in fp32 (~8u), and two D roundings in 16 bits (eager's
      // stored probabilities, then out): scale 2.
      EXPECT_TRUE(all_close("attn out", ao.f32(), want, tolerance(dt, 2)));
      if (var == Attention::eager) {
        EXPECT_EQ(probs.get(2 * 3 + 0), 0.0f);  // t 2 cannot see 0
      }
    }
  }
}

TEST(OpsBackends, MetaBackendNeverTouchesMemory) {
  for (DType dt : all_dtypes()) {
    auto be = make_meta_backend(dt);
    EXPECT_EQ(be->kind(), BackendKind::meta);
    EXPECT_EQ(be->dtype(), dt);
    EXPECT_FALSE(be->computes());
    EXPECT_FALSE(be->allocator().touches_memory());
    // Fake addresses: any dereference would crash the test.
    void* big = be->allocator().allocate(std::uint64_t(1) << 40);  // 1 TiB, not backed
    void* small = be->allocator().allocate(1024);
    ASSERT_NE(big, nullptr);
    ASSERT_NE(big, small);
    auto* f = static_cast<float*>(small);
    auto* t = static_cast<const std::int32_t*>(small);
    const std::int64_t b = 8, s = 4096, h = 8192, V = 128256, a = 64, kv = 8, d = 128;
    be->upload(big, small, 1 << 20);
    be->download(small, big, 1 << 20);
    be->fill_zero(big, std::uint64_t(1) << 40);
    be->copy(big, small, 1 << 20);
    be->embedding_forward(big, t, small, b, s, h, V);
    be->embedding_backward(big, small, t, b, s, h, V);
    be->rmsnorm_forward(big, f, small, small, b * s, h, 1e-5f);
    be->rmsnorm_backward(big, big, small, small, small, f, b * s, h);
    be->matmul(big, small, small, b * s, V, h, Trans::no, Trans::yes, 1.0f, 0.0f);
    be->rope_forward(big, small, b, s, a, kv, d, RopeSpec{5e5, {}});
    be->rope_backward(big, small, b, s, a, kv, d, RopeSpec{5e5, {}});
    be->bias_forward(big, small, b * s, h);
    be->bias_backward(big, small, b * s, h);
    for (Attention var : {Attention::eager, Attention::flash}) {
      be->attention_forward(big, big, f, small, small, small, b, s, a, kv, d, 0, var);
      be->attention_backward(big, big, big, big, f, small, small, small, small, small, small, f, b,
                             s, a, kv, d, 0, var);
      be->attention_forward(big, big, f, small, small, small, b, s, a, kv, d, 4096, var);
    }
    be->swiglu_forward(big, small, small, b * s * h);
    be->swiglu_backward(big, big, small, small, small, b * s * h);
    be->cross_entropy_forward(f, f, small, t, b * s, V);
    be->cross_entropy_backward(big, big, f, t, b * s, V, 1.0f);
    be->adamw_update(big, small, f, f, f, std::int64_t(1) << 36, AdamWParams{}, 1, 1.0f);
    be->sgd_update(big, small, f, std::int64_t(1) << 36, 1e-3f, 1.0f);
    be->check_finite(big, std::int64_t(1) << 36);
    EXPECT_FALSE(be->take_nonfinite());
    be->synchronize();
    be->allocator().deallocate(small, 1024);
    be->allocator().deallocate(big, std::uint64_t(1) << 40);
  }
}

}  // namespace
}  // namespace trainmem
