// The CUDA kernels' own code, run on the CPU under tests/cuda_emulator.hpp (a std::thread per
// CUDA thread, real barriers and warp shuffles), against the CPU references of
// kernels/*_cpu.hpp. This checks indexing, bounds, tiling, shared-memory layout, barrier
// placement and the warp reductions of every kernel without a GPU. The launch geometry is the
// launchers' (grid, block and dynamic shared memory from the same constants); grid-stride
// kernels get a deliberately small grid so the stride loop runs. Shapes are small (thread
// creation dominates) but cross every tile boundary: several query blocks and key tiles in
// attention, a partial last tile, head dims below and above 32, GQA.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda_emulator.hpp"
// The kernel headers, compiled as host C++.
#include "adamw_kernels.cuh"
#include "attention_eager_kernels.cuh"
#include "attention_flash_kernels.cuh"
#include "cross_entropy_kernels.cuh"
#include "embedding_kernels.cuh"
#include "residual_kernels.cuh"
#include "rmsnorm_kernels.cuh"
#include "rope_kernels.cuh"
#include "swiglu_kernels.cuh"
// The CPU references.
#include "adamw_cpu.hpp"
#include "attention_cpu.hpp"
#include "cross_entropy_cpu.hpp"
#include "embedding_cpu.hpp"
#include "rmsnorm_cpu.hpp"
#include "rope_cpu.hpp"
#include "swiglu_cpu.hpp"

namespace trainmem {
namespace {

using namespace trainmem::cuda;
using emu::launch;

// n elements of storage S (raw bits), filled uniformly in [lo, hi) and rounded to S.
template <class S>
std::vector<typename S::raw> random_storage(std::size_t n, std::mt19937& rng, float lo = -1,
                                            float hi = 1) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<typename S::raw> v(n);
  for (std::size_t i = 0; i < n; ++i) S::store(v.data(), i, d(rng));
  return v;
}
template <class S>
std::vector<float> to_f32(const std::vector<typename S::raw>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = S::load(v.data(), i);
  return out;
}

// |got - want| <= tol * (max|want| + |want|): scale-aware, and exact when tol is 0.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (float w : want)
    if (std::isfinite(w)) scale = std::max(scale, double(std::fabs(w)));
  std::size_t bad = 0, first = 0;
  double max_err = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    const double e = both_nan ? 0.0 : std::fabs(double(got[i]) - want[i]);
    if (!(e <= tol * (scale + std::fabs(want[i])))) {
      if (bad++ == 0) first = i;
    }
    if (e > max_err || std::isnan(e)) max_err = e;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " elements differ; first at [" << first << "]: got " << got[first]
                     << ", want " << want[first] << "; max abs error " << max_err;
}

template <class S>
double tol16() {  // one fp32 computation rounded once on each side: two ulps of S
  if (S::dtype == DType::bf16) return 1.6e-2;
  if (S::dtype == DType::f16) return 2e-3;
  return 2e-6;
}

// ---------------------------------------------------------------- embedding

template <class S>
void check_embedding() {
  std::mt19937 rng(1);
  const std::int64_t B = 2, T = 7, C = 70, V = 9, N = B * T;
  const auto wte = random_storage<S>(std::size_t(V * C), rng);
  std::vector<std::int32_t> tok(static_cast<std::size_t>(N));
  for (auto& t : tok) t = std::int32_t(rng() % V);  // 14 ids out of 9: repeats
  std::vector<typename S::raw> want(std::size_t(N * C)), got(std::size_t(N * C));
  embedding_forward_cpu(want.data(), tok.data(), wte.data(), B, T, C, V, S::dtype);
  launch(dim3(3), dim3(64), 0, embedding_forward_kernel<S>, static_cast<void*>(got.data()),
         static_cast<const std::int32_t*>(tok.data()), static_cast<const void*>(wte.data()), N, C,
         V);
  expect_close(to_f32<S>(got), to_f32<S>(want), 0, "embedding forward");

  const auto dout = random_storage<S>(std::size_t(N * C), rng);
  auto dw_want = random_storage<S>(std::size_t(V * C), rng);
  auto dw_got = dw_want;
  embedding_backward_cpu(dw_want.data(), dout.data(), tok.data(), B, T, C, V, S::dtype);
  const dim3 grid(unsigned(N), unsigned((C + kEmbBwdColsPerBlock - 1) / kEmbBwdColsPerBlock));
  launch(grid, dim3(kEmbBwdThreads), 0, embedding_backward_kernel<S>,
         static_cast<void*>(dw_got.data()), static_cast<const void*>(dout.data()),
         static_cast<const std::int32_t*>(tok.data()), N, C, V);
  expect_close(to_f32<S>(dw_got), to_f32<S>(dw_want), 0, "embedding backward (bit for bit)");
}
TEST(CudaKernelsEmulated, EmbeddingForwardAndBackward) {
  check_embedding<F32>();
  check_embedding<BF16>();
}

// ---------------------------------------------------------------- rmsnorm

template <class S>
void check_rmsnorm() {
  std::mt19937 rng(2);
  const std::int64_t N = 5, C = 300;
  const auto inp = random_storage<S>(std::size_t(N * C), rng, -3, 3);
  const auto w = random_storage<S>(std::size_t(C), rng, 0.5f, 1.5f);
  std::vector<typename S::raw> want(std::size_t(N * C)), got(std::size_t(N * C));
  std::vector<float> rstd_want(static_cast<std::size_t>(N)), rstd_got(static_cast<std::size_t>(N));
  rmsnorm_forward_cpu(want.data(), rstd_want.data(), inp.data(), w.data(), N, C, 1e-5f, S::dtype);
  launch(dim3(unsigned(N)), dim3(kRmsRowThreads), 0, rmsnorm_forward_kernel<S>,
         static_cast<void*>(got.data()), rstd_got.data(), static_cast<const void*>(inp.data()),
         static_cast<const void*>(w.data()), C, 1e-5f);
  expect_close(rstd_got, rstd_want, 1e-6, "rmsnorm rstd");
  expect_close(to_f32<S>(got), to_f32<S>(want), tol16<S>(), "rmsnorm out");

  const auto dout = random_storage<S>(std::size_t(N * C), rng);
  auto dinp_want = random_storage<S>(std::size_t(N * C), rng);
  auto dw_want = random_storage<S>(std::size_t(C), rng);
  auto dinp_got = dinp_want, dw_got = dw_want;
  rmsnorm_backward_cpu(dinp_want.data(), dw_want.data(), dout.data(), inp.data(), w.data(),
                       rstd_want.data(), N, C, S::dtype);
  launch(dim3(unsigned(N)), dim3(kRmsRowThreads), 0, rmsnorm_backward_dinp_kernel<S>,
         static_cast<void*>(dinp_got.data()), static_cast<const void*>(dout.data()),
         static_cast<const void*>(inp.data()), static_cast<const void*>(w.data()),
         static_cast<const float*>(rstd_want.data()), C);
  launch(dim3(unsigned((C + kRmsColX - 1) / kRmsColX)), dim3(kRmsColX, kRmsColY), 0,
         rmsnorm_backward_dweight_kernel<S>, static_cast<void*>(dw_got.data()),
         static_cast<const void*>(dout.data()), static_cast<const void*>(inp.data()),
         static_cast<const float*>(rstd_want.data()), N, C);
  expect_close(to_f32<S>(dinp_got), to_f32<S>(dinp_want), tol16<S>() * 2, "rmsnorm dinp");
  expect_close(to_f32<S>(dw_got), to_f32<S>(dw_want), tol16<S>() * 4, "rmsnorm dweight");
}
TEST(CudaKernelsEmulated, RmsNormForwardAndBackward) {
  check_rmsnorm<F32>();
  check_rmsnorm<BF16>();
}

// ---------------------------------------------------------------- rope

template <class S>
void check_rope() {
  std::mt19937 rng(3);
  const std::int64_t B = 2, T = 9, NH = 4, NKV = 2, HD = 12;
  for (float sign : {1.0f, -1.0f}) {
    auto q_want = random_storage<S>(std::size_t(B * T * NH * HD), rng);
    auto k_want = random_storage<S>(std::size_t(B * T * NKV * HD), rng);
    auto q_got = q_want, k_got = k_want;
    if (sign > 0) {
      rope_forward_cpu(q_want.data(), k_want.data(), B, T, NH, NKV, HD, 10000.0, S::dtype);
    } else {
      rope_backward_cpu(q_want.data(), k_want.data(), B, T, NH, NKV, HD, 10000.0, S::dtype);
    }
    launch(dim3(2), dim3(64), 0, rope_kernel<S>, static_cast<void*>(q_got.data()),
           B * T * NH * (HD / 2), T, NH, HD, 10000.0f, sign);
    launch(dim3(2), dim3(64), 0, rope_kernel<S>, static_cast<void*>(k_got.data()),
           B * T * NKV * (HD / 2), T, NKV, HD, 10000.0f, sign);
    expect_close(to_f32<S>(q_got), to_f32<S>(q_want), tol16<S>() * 2, "rope q");
    expect_close(to_f32<S>(k_got), to_f32<S>(k_want), tol16<S>() * 2, "rope k");
  }
}
TEST(CudaKernelsEmulated, RopeForwardAndBackward) {
  check_rope<F32>();
  check_rope<F16>();
}

// ---------------------------------------------------------------- elementwise

template <class S>
void check_elementwise() {
  std::mt19937 rng(4);
  const std::int64_t N = 1000;
  const auto gate = random_storage<S>(std::size_t(N), rng, -8, 8);
  const auto up = random_storage<S>(std::size_t(N), rng, -2, 2);
  const auto dout = random_storage<S>(std::size_t(N), rng);
  std::vector<typename S::raw> out_w(N), out_g(N), dg_w(N), dg_g(N), du_w(N), du_g(N);
  swiglu_forward_cpu(out_w.data(), gate.data(), up.data(), N, S::dtype);
  swiglu_backward_cpu(dg_w.data(), du_w.data(), dout.data(), gate.data(), up.data(), N, S::dtype);
  launch(dim3(3), dim3(64), 0, swiglu_forward_kernel<S>, static_cast<void*>(out_g.data()),
         static_cast<const void*>(gate.data()), static_cast<const void*>(up.data()), N);
  launch(dim3(3), dim3(64), 0, swiglu_backward_kernel<S>, static_cast<void*>(dg_g.data()),
         static_cast<void*>(du_g.data()), static_cast<const void*>(dout.data()),
         static_cast<const void*>(gate.data()), static_cast<const void*>(up.data()), N);
  expect_close(to_f32<S>(out_g), to_f32<S>(out_w), tol16<S>(), "swiglu out");
  expect_close(to_f32<S>(dg_g), to_f32<S>(dg_w), tol16<S>(), "swiglu dgate");
  expect_close(to_f32<S>(du_g), to_f32<S>(du_w), tol16<S>(), "swiglu dup");

  // residual: one fp32 add, one rounding (the host computes exactly the same)
  std::vector<typename S::raw> sum(N);
  launch(dim3(2), dim3(32), 0, residual_forward_kernel<S>, static_cast<void*>(sum.data()),
         static_cast<const void*>(gate.data()), static_cast<const void*>(up.data()), N);
  std::vector<float> want(N);
  for (std::int64_t i = 0; i < N; ++i)
    want[std::size_t(i)] = S::round(S::load(gate.data(), i) + S::load(up.data(), i));
  expect_close(to_f32<S>(sum), want, 0, "residual add");

  // cast to bf16 and back
  std::vector<std::uint16_t> b16(N);
  launch(dim3(2), dim3(32), 0, cast_kernel<BF16, S>, static_cast<void*>(b16.data()),
         static_cast<const void*>(gate.data()), N);
  for (std::int64_t i = 0; i < N; ++i)
    ASSERT_EQ(b16[std::size_t(i)], f32_to_bf16(S::load(gate.data(), i))) << "cast at " << i;
}
TEST(CudaKernelsEmulated, SwiGluResidualAndCast) {
  check_elementwise<F32>();
  check_elementwise<BF16>();
  check_elementwise<F16>();
}

// ---------------------------------------------------------------- cross-entropy

template <class S>
void check_cross_entropy() {
  std::mt19937 rng(5);
  const std::int64_t N = 4, V = 1300;
  const auto logits = random_storage<S>(std::size_t(N * V), rng, -6, 6);
  const std::vector<std::int32_t> tgt = {3, -1, std::int32_t(V - 1), 700};
  std::vector<float> loss_w(N), lse_w(N), loss_g(N), lse_g(N);
  cross_entropy_forward_cpu(loss_w.data(), lse_w.data(), logits.data(), tgt.data(), N, V, S::dtype);
  launch(dim3(unsigned(N)), dim3(kCeFwdThreads), 0, cross_entropy_forward_kernel<S>, loss_g.data(),
         lse_g.data(), static_cast<const void*>(logits.data()),
         static_cast<const std::int32_t*>(tgt.data()), V);
  expect_close(lse_g, lse_w, 1e-6, "cross-entropy lse");
  expect_close(loss_g, loss_w, 1e-6, "cross-entropy losses");
  std::vector<typename S::raw> d_w(std::size_t(N * V));
  auto d_g = logits;  // in place, as the model runs it
  cross_entropy_backward_cpu(d_w.data(), logits.data(), lse_w.data(), tgt.data(), N, V, 0.25f,
                             S::dtype);
  launch(dim3(unsigned(N)), dim3(kCeBwdThreads), 0, cross_entropy_backward_kernel<S>,
         static_cast<void*>(d_g.data()), static_cast<const void*>(d_g.data()),
         static_cast<const float*>(lse_w.data()), static_cast<const std::int32_t*>(tgt.data()), V,
         0.25f);
  expect_close(to_f32<S>(d_g), to_f32<S>(d_w), tol16<S>(), "cross-entropy dlogits");
}
TEST(CudaKernelsEmulated, CrossEntropyForwardAndInPlaceBackward) {
  check_cross_entropy<F32>();
  check_cross_entropy<BF16>();
}

// ---------------------------------------------------------------- optimizers

template <class S>
void check_optimizers() {
  std::mt19937 rng(6);
  const std::int64_t n = 777;
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  auto p_w = random_storage<S>(std::size_t(n), rng);
  auto p_g = p_w;
  std::vector<float> master_w = to_f32<S>(p_w), m_w(n, 0.0f), v_w(n, 0.0f);
  auto master_g = master_w, m_g = m_w, v_g = v_w;
  const bool with_master = S::dtype != DType::f32;
  for (int step = 1; step <= 3; ++step) {
    const auto grad = random_storage<S>(std::size_t(n), rng);
    adamw_update_cpu(p_w.data(), grad.data(), with_master ? master_w.data() : nullptr, m_w.data(),
                     v_w.data(), n, hp, step, S::dtype);
    const AdamWStepConsts c =
        adamw_step_consts(hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, step);
    launch(dim3(2), dim3(128), 0, adamw_kernel<S>, static_cast<void*>(p_g.data()),
           static_cast<const void*>(grad.data()), with_master ? master_g.data() : nullptr,
           m_g.data(), v_g.data(), n, c);
    expect_close(m_g, m_w, 1e-6, "adamw m");
    expect_close(v_g, v_w, 1e-6, "adamw v");
    if (with_master) expect_close(master_g, master_w, 1e-6, "adamw master");
    expect_close(to_f32<S>(p_g), to_f32<S>(p_w), tol16<S>(), "adamw param");
  }
  const auto grad = random_storage<S>(std::size_t(n), rng);
  sgd_update_cpu(p_w.data(), grad.data(), nullptr, n, 0.05f, S::dtype);
  launch(dim3(2), dim3(128), 0, sgd_kernel<S>, static_cast<void*>(p_g.data()),
         static_cast<const void*>(grad.data()), static_cast<float*>(nullptr), n, 0.05f);
  expect_close(to_f32<S>(p_g), to_f32<S>(p_w), tol16<S>(), "sgd (LOMO, no master)");
}
TEST(CudaKernelsEmulated, AdamWAndSgd) {
  check_optimizers<F32>();
  check_optimizers<BF16>();
}

// ---------------------------------------------------------------- attention

struct AttnDims {
  std::int64_t B, T, NH, NKV, HD;
};

// The eager path's two row kernels, fed scores / dP computed here in fp32 (the GEMMs are
// cuBLAS and checked in test_cuda_plans.cpp).
template <class S>
void check_causal_softmax(const AttnDims& d) {
  std::mt19937 rng(7);
  const std::int64_t rows = d.B * d.NH * d.T;
  auto p = random_storage<S>(std::size_t(rows * d.T), rng, -4, 4);  // scaled scores
  const auto scores = to_f32<S>(p);
  launch(dim3(unsigned((rows + kSoftmaxWarps - 1) / kSoftmaxWarps)), dim3(kSoftmaxThreads), 0,
         causal_softmax_kernel<S>, static_cast<void*>(p.data()), rows, d.T);
  std::vector<float> want(std::size_t(rows * d.T));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = r % d.T;
    double mx = -INFINITY, sum = 0;
    for (std::int64_t j = 0; j <= i; ++j) mx = std::max<double>(mx, scores[r * d.T + j]);
    for (std::int64_t j = 0; j <= i; ++j) sum += std::exp(scores[r * d.T + j] - mx);
    for (std::int64_t j = 0; j < d.T; ++j)
      want[r * d.T + j] = j <= i ? float(std::exp(scores[r * d.T + j] - mx) / sum) : 0.0f;
  }
  expect_close(to_f32<S>(p), want, tol16<S>() * 2, "causal softmax");

  auto dp = random_storage<S>(std::size_t(rows * d.T), rng);
  const auto dpf = to_f32<S>(dp), pf = to_f32<S>(p);
  launch(dim3(unsigned((rows + kSoftmaxWarps - 1) / kSoftmaxWarps)), dim3(kSoftmaxThreads), 0,
         causal_softmax_backward_kernel<S>, static_cast<void*>(dp.data()),
         static_cast<const void*>(p.data()), rows, d.T);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = r % d.T;
    double dot = 0;
    for (std::int64_t j = 0; j <= i; ++j) dot += double(pf[r * d.T + j]) * dpf[r * d.T + j];
    for (std::int64_t j = 0; j < d.T; ++j)
      want[r * d.T + j] = j <= i ? float(pf[r * d.T + j] * (dpf[r * d.T + j] - dot)) : 0.0f;
  }
  expect_close(to_f32<S>(dp), want, tol16<S>() * 4, "causal softmax backward");
}

template <class S, int HDMAX>
void check_flash(const AttnDims& d) {
  std::mt19937 rng(8);
  const auto [B, T, NH, NKV, HD] = d;
  const std::size_t nq = std::size_t(B * T * NH * HD), nkv = std::size_t(B * T * NKV * HD);
  const std::size_t nl = std::size_t(B * NH * T);
  const auto q = random_storage<S>(nq, rng, -2, 2), k = random_storage<S>(nkv, rng),
             v = random_storage<S>(nkv, rng), dout = random_storage<S>(nq, rng);
  const float scale = attention_scale<float>(HD);
  const int hd = int(HD);

  std::vector<typename S::raw> out_w(nq), out_g(nq);
  std::vector<float> lse_w(nl), lse_g(nl, NAN);
  attention_flash_forward_cpu(out_w.data(), lse_w.data(), q.data(), k.data(), v.data(), B, T, NH,
                              NKV, HD, S::dtype);
  const unsigned qblocks = unsigned((T + kFlashBlockRows - 1) / kFlashBlockRows);
  launch(dim3(unsigned(B * NH), qblocks), dim3(kFlashThreads), flash_forward_smem(hd),
         flash_forward_kernel<S, HDMAX>, static_cast<void*>(out_g.data()), lse_g.data(),
         static_cast<const void*>(q.data()), static_cast<const void*>(k.data()),
         static_cast<const void*>(v.data()), T, NH, NKV, hd, scale);
  expect_close(lse_g, lse_w, 1e-6, "flash lse");
  expect_close(to_f32<S>(out_g), to_f32<S>(out_w), tol16<S>() * 2, "flash out");

  // Backward from the CPU's forward results, on both sides.
  std::vector<typename S::raw> dq_w(nq), dk_w(nkv), dv_w(nkv);
  std::vector<float> delta_w(nl), delta_g(nl, NAN);
  attention_flash_backward_cpu(dq_w.data(), dk_w.data(), dv_w.data(), delta_w.data(), dout.data(),
                               q.data(), k.data(), v.data(), out_w.data(), lse_w.data(), B, T, NH,
                               NKV, HD, S::dtype);
  std::vector<typename S::raw> dq_g(nq), dk_g(nkv), dv_g(nkv);
  for (auto* buf : {&dq_g, &dk_g, &dv_g})
    for (std::size_t i = 0; i < buf->size(); ++i) S::store(buf->data(), i, NAN);
  const std::int64_t rows = B * T * NH;
  launch(dim3(unsigned((rows + kFlashWarps - 1) / kFlashWarps)), dim3(kFlashThreads), 0,
         flash_delta_kernel<S>, delta_g.data(), static_cast<const void*>(dout.data()),
         static_cast<const void*>(out_w.data()), rows, T, NH, hd);
  expect_close(delta_g, delta_w, 1e-6, "flash delta");
  launch(dim3(unsigned(B * NKV), qblocks), dim3(kFlashThreads), flash_dkdv_smem(hd),
         flash_backward_dkdv_kernel<S, HDMAX>, static_cast<void*>(dk_g.data()),
         static_cast<void*>(dv_g.data()), static_cast<const void*>(dout.data()),
         static_cast<const void*>(q.data()), static_cast<const void*>(k.data()),
         static_cast<const void*>(v.data()), static_cast<const float*>(lse_w.data()),
         static_cast<const float*>(delta_g.data()), T, NH, NKV, hd, scale);
  launch(dim3(unsigned(B * NH), qblocks), dim3(kFlashThreads), flash_dq_smem(hd),
         flash_backward_dq_kernel<S, HDMAX>, static_cast<void*>(dq_g.data()),
         static_cast<const void*>(dout.data()), static_cast<const void*>(q.data()),
         static_cast<const void*>(k.data()), static_cast<const void*>(v.data()),
         static_cast<const float*>(lse_w.data()), static_cast<const float*>(delta_g.data()), T, NH,
         NKV, hd, scale);
  expect_close(to_f32<S>(dv_g), to_f32<S>(dv_w), tol16<S>() * 4, "flash dv");
  expect_close(to_f32<S>(dk_g), to_f32<S>(dk_w), tol16<S>() * 4, "flash dk");
  expect_close(to_f32<S>(dq_g), to_f32<S>(dq_w), tol16<S>() * 4, "flash dq");
}

TEST(CudaKernelsEmulated, CausalSoftmaxForwardAndBackward) {
  check_causal_softmax<F32>({2, 11, 3, 3, 4});
  check_causal_softmax<BF16>({1, 45, 2, 1, 4});  // rows longer than a warp
}

TEST(CudaKernelsEmulated, FlashAttentionGqaAcrossTilesHeadDim24) {
  // 3 query blocks of 16, 2 key tiles of 32 (the last partial), GQA g = 2, HD < 32.
  check_flash<F32, 32>({1, 37, 4, 2, 24});
}
TEST(CudaKernelsEmulated, FlashAttentionMqaOddHeadDimBf16) {
  // MQA (g = 3), odd HD = 33 in the 64-wide lane layout, two batch rows.
  check_flash<BF16, 64>({2, 20, 3, 1, 33});
}

}  // namespace
}  // namespace trainmem
