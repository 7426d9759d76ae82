// CPU tests of the host-side plans of the cuda backend, so that the index arithmetic is
// checked in CI without a GPU:
//  - gemm_args.hpp: the row-major -> column-major translation handed to cuBLAS, replayed with a
//    column-major GEMM written here from cuBLAS's documented semantics, against a row-major
//    GEMM in double;
//  - attention_heads.hpp: the head batching of the eager attention's strided-batched GEMMs,
//    replayed with the same emulated GEMM (and the causal softmax written out as the kernels
//    compute it) against the CPU reference attention (kernels/attention/attention.hpp), forward and
//    backward, for shapes that take each batching mode, with and without GQA.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <random>
#include <vector>

#include "attention/attention.hpp"
#include "attention/attention_heads.hpp"
#include "matmul/gemm_args.hpp"

namespace trainmem {
namespace {

// cuBLAS's strided-batched GEMM on fp32, column-major, as documented:
// C_i = alpha * op(A_i) op(B_i) + beta * C_i, X_i = X + i*stride, element (r, c) of a stored
// column-major matrix at r + c*ld; beta == 0 does not read C.
void emulate_cublas_gemm(Trans op_a, Trans op_b, std::int64_t m, std::int64_t n, std::int64_t k,
                         float alpha, const float* A, std::int64_t lda, std::int64_t stride_a,
                         const float* B, std::int64_t ldb, std::int64_t stride_b, float beta,
                         float* C, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch) {
  for (std::int64_t bi = 0; bi < batch; ++bi) {
    const float* a = A + bi * stride_a;
    const float* b = B + bi * stride_b;
    float* c = C + bi * stride_c;
    for (std::int64_t j = 0; j < n; ++j) {
      for (std::int64_t i = 0; i < m; ++i) {
        double acc = 0;
        for (std::int64_t p = 0; p < k; ++p) {
          const float av = op_a == Trans::no ? a[i + p * lda] : a[p + i * lda];
          const float bv = op_b == Trans::no ? b[p + j * ldb] : b[j + p * ldb];
          acc += double(av) * bv;
        }
        float& out = c[i + j * ldc];
        out = float(alpha * acc + (beta == 0.0f ? 0.0 : double(beta) * out));
      }
    }
  }
}

// What matmul_strided_batched_cuda hands to cuBLAS, replayed on the emulator.
void rowmajor_via_cublas(float* c, std::int64_t ldc, std::int64_t stride_c, const float* a,
                         std::int64_t lda, std::int64_t stride_a, const float* b, std::int64_t ldb,
                         std::int64_t stride_b, std::int64_t M, std::int64_t N, std::int64_t K,
                         Trans ta, Trans tb, float alpha, float beta, std::int64_t batch) {
  const ColumnMajorGemm g = column_major_gemm(M, N, K, ta, tb, lda, ldb, ldc);
  ASSERT_TRUE(g.first_is_b);
  emulate_cublas_gemm(g.op_first, g.op_second, g.m, g.n, g.k, alpha, b, g.ld_first, stride_b, a,
                      g.ld_second, stride_a, beta, c, g.ldc, stride_c, batch);
}

std::vector<float> random_vec(std::size_t n, std::mt19937& rng, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t bad = 0, first = 0;
  double max_err = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - want[i]);
    max_err = std::max(max_err, e);
    if (!(e <= tol * (1 + std::fabs(want[i])))) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": first mismatch at " << first << " got " << got[first] << " want "
                     << want[first] << ", max abs error " << max_err;
}

struct GemmCase {
  std::int64_t M, N, K;
};

TEST(CudaGemmArgs, RowMajorThroughColumnMajorMatchesDirectProductForEveryTransposeAndPadding) {
  std::mt19937 rng(7);
  for (const GemmCase& gc : {GemmCase{1, 1, 1}, GemmCase{3, 5, 7}, GemmCase{71, 29, 13},
                             GemmCase{8, 1, 16}, GemmCase{1, 9, 4}}) {
    for (Trans ta : {Trans::no, Trans::yes}) {
      for (Trans tb : {Trans::no, Trans::yes}) {
        for (std::int64_t pad : {0, 3}) {  // leading dimensions larger than the row length
          const std::int64_t M = gc.M, N = gc.N, K = gc.K;
          const std::int64_t a_rows = ta == Trans::no ? M : K, a_cols = ta == Trans::no ? K : M;
          const std::int64_t b_rows = tb == Trans::no ? K : N, b_cols = tb == Trans::no ? N : K;
          const std::int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
          const auto a = random_vec(std::size_t(a_rows * lda), rng);
          const auto b = random_vec(std::size_t(b_rows * ldb), rng);
          auto c = random_vec(std::size_t(M * ldc), rng);
          const auto c0 = c;
          const float alpha = 0.75f, beta = pad ? 0.5f : 0.0f;
          rowmajor_via_cublas(c.data(), ldc, 0, a.data(), lda, 0, b.data(), ldb, 0, M, N, K, ta, tb,
                              alpha, beta, 1);
          std::vector<float> got, want;
          for (std::int64_t i = 0; i < M; ++i) {
            for (std::int64_t j = 0; j < N; ++j) {
              double acc = 0;
              for (std::int64_t p = 0; p < K; ++p) {
                const float av = ta == Trans::no ? a[i * lda + p] : a[p * lda + i];
                const float bv = tb == Trans::no ? b[p * ldb + j] : b[j * ldb + p];
                acc += double(av) * bv;
              }
              want.push_back(float(alpha * acc + beta * c0[i * ldc + j]));
              got.push_back(c[i * ldc + j]);
            }
            for (std::int64_t j = N; j < ldc; ++j)  // padding untouched
              EXPECT_EQ(c[i * ldc + j], c0[i * ldc + j]);
          }
          expect_close(got, want, 1e-5, "row-major GEMM through the column-major arguments");
        }
      }
    }
  }
}

TEST(CudaGemmArgs, DenseLeadingDimensionsAreTheStoredRowLengths) {
  EXPECT_EQ(dense_lda(5, 7, Trans::no), 7);   // a (M,K)
  EXPECT_EQ(dense_lda(5, 7, Trans::yes), 5);  // a (K,M)
  EXPECT_EQ(dense_ldb(3, 7, Trans::no), 3);   // b (K,N)
  EXPECT_EQ(dense_ldb(3, 7, Trans::yes), 7);  // b (N,K)
}

struct AttnCase {
  std::int64_t b, s, a, kv, d;
};
void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << "b=" << c.b << " s=" << c.s << " a=" << c.a << " kv=" << c.kv << " d=" << c.d;
}

// The eager attention of attention_eager.cu, with cuBLAS replaced by the emulator and the two
// row kernels written out as loops. fp32 storage.
void eager_forward_replay(std::vector<float>& out, std::vector<float>& probs,
                          const std::vector<float>& q, const std::vector<float>& k,
                          const std::vector<float>& v, const AttnCase& c) {
  const auto [b, s, a, kv, d] = c;
  const float scale = 1.0f / std::sqrt(float(d));
  const HeadPlan plan = plan_attention_heads(b, s, a, kv, d);
  for (const HeadCall& call : plan.calls)
    rowmajor_via_cublas(probs.data() + call.s_off, s, plan.s_stride, q.data() + call.q_off, a * d,
                        plan.q_stride, k.data() + call.kv_off, kv * d, plan.kv_stride, s, s, d,
                        Trans::no, Trans::yes, scale, 0.0f, plan.batch);
  for (std::int64_t row = 0; row < b * a * s; ++row) {  // causal_softmax_kernel
    float* p = probs.data() + row * s;
    const std::int64_t i = row % s;
    float mx = -INFINITY, sum = 0;
    for (std::int64_t j = 0; j <= i; ++j) mx = std::max(mx, p[j]);
    for (std::int64_t j = 0; j <= i; ++j) sum += std::exp(p[j] - mx);
    for (std::int64_t j = 0; j < s; ++j) p[j] = j <= i ? std::exp(p[j] - mx) / sum : 0.0f;
  }
  for (const HeadCall& call : plan.calls)
    rowmajor_via_cublas(out.data() + call.q_off, a * d, plan.q_stride, probs.data() + call.s_off, s,
                        plan.s_stride, v.data() + call.kv_off, kv * d, plan.kv_stride, s, d, s,
                        Trans::no, Trans::no, 1.0f, 0.0f, plan.batch);
}

void eager_backward_replay(std::vector<float>& dq, std::vector<float>& dk, std::vector<float>& dv,
                           std::vector<float>& dprobs, const std::vector<float>& dout,
                           const std::vector<float>& q, const std::vector<float>& k,
                           const std::vector<float>& v, const std::vector<float>& probs,
                           const AttnCase& c) {
  const auto [b, s, a, kv, d] = c;
  const float scale = 1.0f / std::sqrt(float(d));
  const HeadPlan plan = plan_attention_heads(b, s, a, kv, d);
  for (const HeadCall& call : plan.calls)
    rowmajor_via_cublas(dprobs.data() + call.s_off, s, plan.s_stride, dout.data() + call.q_off,
                        a * d, plan.q_stride, v.data() + call.kv_off, kv * d, plan.kv_stride, s, s,
                        d, Trans::no, Trans::yes, 1.0f, 0.0f, plan.batch);
  for (std::int64_t row = 0; row < b * a * s; ++row) {  // causal_softmax_backward_kernel
    float* ds = dprobs.data() + row * s;
    const float* p = probs.data() + row * s;
    const std::int64_t i = row % s;
    float dot = 0;
    for (std::int64_t j = 0; j <= i; ++j) dot += p[j] * ds[j];
    for (std::int64_t j = 0; j < s; ++j) ds[j] = j <= i ? p[j] * (ds[j] - dot) : 0.0f;
  }
  for (const HeadCall& call : plan.calls) {
    const float beta = call.first_of_group ? 0.0f : 1.0f;
    rowmajor_via_cublas(dq.data() + call.q_off, a * d, plan.q_stride, dprobs.data() + call.s_off, s,
                        plan.s_stride, k.data() + call.kv_off, kv * d, plan.kv_stride, s, d, s,
                        Trans::no, Trans::no, scale, 0.0f, plan.batch);
    rowmajor_via_cublas(dk.data() + call.kv_off, kv * d, plan.kv_stride, dprobs.data() + call.s_off,
                        s, plan.s_stride, q.data() + call.q_off, a * d, plan.q_stride, s, d, s,
                        Trans::yes, Trans::no, scale, beta, plan.batch);
    rowmajor_via_cublas(dv.data() + call.kv_off, kv * d, plan.kv_stride, probs.data() + call.s_off,
                        s, plan.s_stride, dout.data() + call.q_off, a * d, plan.q_stride, s, d, s,
                        Trans::yes, Trans::no, 1.0f, beta, plan.batch);
  }
}

class CudaAttentionPlan : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CudaAttentionPlan, ReplayedGemmsMatchTheCpuReferenceForwardAndBackward) {
  const AttnCase c = GetParam();
  const auto [b, s, a, kv, d] = c;
  std::mt19937 rng(11);
  const std::size_t nq = std::size_t(b * s * a * d), nkv = std::size_t(b * s * kv * d);
  const std::size_t np = std::size_t(b * a * s * s);
  const auto q = random_vec(nq, rng, -2, 2), k = random_vec(nkv, rng), v = random_vec(nkv, rng);
  const auto dout = random_vec(nq, rng);

  std::vector<float> out_ref(nq), probs_ref(np);
  attention_eager_forward_cpu(out_ref.data(), probs_ref.data(), q.data(), k.data(), v.data(), b, s,
                              a, kv, d, 0, DType::f32);
  // Garbage in the outputs: every element must be written (dk/dv by the beta-0 call first).
  std::vector<float> out(nq, NAN), probs(np, NAN);
  eager_forward_replay(out, probs, q, k, v, c);
  expect_close(probs, probs_ref, 1e-5, "probs");
  expect_close(out, out_ref, 1e-5, "out");

  std::vector<float> dq_ref(nq), dk_ref(nkv), dv_ref(nkv);
  attention_eager_backward_cpu(dq_ref.data(), dk_ref.data(), dv_ref.data(), nullptr, dout.data(),
                               q.data(), k.data(), v.data(), probs_ref.data(), b, s, a, kv, d, 0,
                               DType::f32);
  std::vector<float> dq(nq, NAN), dk(nkv, NAN), dv(nkv, NAN), dprobs(np, NAN);
  eager_backward_replay(dq, dk, dv, dprobs, dout, q, k, v, probs_ref, c);
  expect_close(dq, dq_ref, 1e-4, "dq");
  expect_close(dk, dk_ref, 1e-4, "dk");
  expect_close(dv, dv_ref, 1e-4, "dv");
}

// Which batching each case takes: per (bi, r) when b*g <= a, else per head.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionPlan,
                         ::testing::Values(AttnCase{1, 1, 1, 1, 1},    // per (b, r), single element
                                           AttnCase{2, 7, 6, 2, 5},    // per (b, r), GQA g=3
                                           AttnCase{3, 9, 4, 4, 8},    // per (b, r), no GQA
                                           AttnCase{4, 6, 4, 1, 4},    // per h, MQA g=4
                                           AttnCase{5, 5, 2, 2, 3},    // per h, no GQA
                                           AttnCase{3, 11, 8, 2, 6}),  // per h, GQA g=4
                         [](const ::testing::TestParamInfo<AttnCase>& info) {
                           const AttnCase& c = info.param;
                           const std::string mode = c.b * (c.a / c.kv) <= c.a ? "per_b_r" : "per_h";
                           return mode + "_b" + std::to_string(c.b) + "_s" + std::to_string(c.s) +
                                  "_a" + std::to_string(c.a) + "_kv" + std::to_string(c.kv) + "_d" +
                                  std::to_string(c.d);
                         });

TEST(CudaAttentionPlan, ChoosesTheBatchingWithFewerCalls) {
  // LLaMA-7B at batch 8: 8 calls of 32 heads rather than 32 calls of 8.
  const HeadPlan a = plan_attention_heads(8, 512, 32, 32, 128);
  EXPECT_EQ(a.calls.size(), 8u);
  EXPECT_EQ(a.batch, 32);
  // LLaMA-2-70B-like GQA (g = 8) at batch 16: 64 query heads -> 64 calls of 16 beat 128 of 8.
  const HeadPlan b = plan_attention_heads(16, 128, 64, 8, 128);
  EXPECT_EQ(b.calls.size(), 64u);
  EXPECT_EQ(b.batch, 16);
}

}  // namespace
}  // namespace trainmem
