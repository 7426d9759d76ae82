// GPU tests of causal attention (eager: cuBLAS + softmax kernels; flash: the tiled kernels)
// against the cpu backend, per dtype, on awkward shapes (s not a multiple of any tile, odd
// head dims, GQA and MQA) and LLaMA-sized ones. Forward and backward are checked separately:
// the backward of both backends is fed the same forward results (the CPU's), so a failure
// points at one kernel.
//
// Expected differences: the GPU eager path stores the scaled scores in D before the softmax
// (the CPU keeps them in fp32) and rounds dP and dS to D in the dprobs scratch (the CPU keeps
// fp32 scratch), so its 16-bit tolerances are wider than the flash path's.
#include <cmath>
#include <random>
#include <tuple>

#include "gpu_test_util.hpp"

namespace trainmem::gputest {
namespace {

struct AttnShape {
  std::int64_t b, s, a, kv, d;
  const char* name;
  std::int64_t window = 0;  // sliding window (0: full causal)
};
void PrintTo(const AttnShape& shape, std::ostream* os) {
  *os << shape.name << " b=" << shape.b << " s=" << shape.s << " a=" << shape.a
      << " kv=" << shape.kv << " d=" << shape.d << " window=" << shape.window;
}

using AttnParam = std::tuple<DType, Attention, AttnShape>;

class AttentionGpu : public ::testing::TestWithParam<AttnParam> {
 protected:
  void SetUp() override {
    require_cuda_device();
    std::tie(dt, variant, shape) = GetParam();
    cpu = make_cpu_backend(dt);
    gpu = &cuda_backend(dt);
    const auto [b, s, a, kv, d, name, window] = shape;
    nq = b * s * a * d;
    nkv = b * s * kv * d;
    np = b * a * s * s;
    nl = b * a * s;
    // q in [-2, 2): sharper softmax rows than uniform [-1, 1) keys alone would give.
    q = random_buf(dt, nq, rng, -2, 2);
    k = random_buf(dt, nkv, rng);
    v = random_buf(dt, nkv, rng);
  }
  bool eager() const { return variant == Attention::eager; }
  // The tolerance of outputs that went through the attention: GEMM-like sums, and for eager
  // 16-bit the rounding of scores / dP / dS to D.
  Tolerance tol(double extra = 1) const {
    if (dt == DType::f32) return tolerance(dt, 20 * extra);
    return tolerance(dt, (eager() ? 2 : 1) * extra);
  }

  DType dt = DType::f32;
  Attention variant = Attention::eager;
  AttnShape shape{};
  std::unique_ptr<Backend> cpu;
  Backend* gpu = nullptr;
  std::mt19937 rng{99};
  std::int64_t nq = 0, nkv = 0, np = 0, nl = 0;
  HostBuf q, k, v;
};

TEST_P(AttentionGpu, ForwardMatchesCpu) {
  const auto [b, s, a, kv, d, name, window] = shape;
  HostBuf out(dt, nq), probs(dt, eager() ? np : 1);
  std::vector<float> lse(static_cast<std::size_t>(nl));
  cpu->attention_forward(out.data(), eager() ? probs.data() : nullptr,
                         eager() ? nullptr : lse.data(), q.data(), k.data(), v.data(), b, s, a, kv,
                         d, window, variant);
  DevBuf d_q(*gpu, q), d_k(*gpu, k), d_v(*gpu, v), d_out(*gpu, out.bytes());
  DevBuf d_probs(*gpu, eager() ? probs.bytes() : 1), d_lse(*gpu, nl * 4);
  // Garbage in the outputs: every element must be written.
  HostBuf nan_probs(dt, eager() ? np : 1);
  for (std::int64_t i = 0; i < nan_probs.size(); ++i) nan_probs.set(i, NAN);
  gpu->upload(d_probs.get(), nan_probs.data(), nan_probs.bytes());
  gpu->attention_forward(d_out.get(), eager() ? d_probs.get() : nullptr,
                         eager() ? nullptr : d_lse.as<float>(), d_q.get(), d_k.get(), d_v.get(), b,
                         s, a, kv, d, window, variant);
  if (eager()) {
    EXPECT_TRUE(
        all_close("attention probs", d_probs.f32(dt, np), probs.to_f32(), tol(), {b, a, s, s}));
  } else {
    // lse from fp32 scores on both sides.
    EXPECT_TRUE(all_close("attention lse", d_lse.f32(DType::f32, nl), lse,
                          tolerance(DType::f32, 20), {b, a, s}));
  }
  EXPECT_TRUE(all_close("attention out", d_out.f32(dt, nq), out.to_f32(), tol(), {b, s, a, d}));
}

TEST_P(AttentionGpu, BackwardMatchesCpu) {
  const auto [b, s, a, kv, d, name, window] = shape;
  // The forward results both backends get: the CPU's.
  HostBuf out(dt, nq), probs(dt, eager() ? np : 1);
  std::vector<float> lse(static_cast<std::size_t>(nl));
  cpu->attention_forward(out.data(), eager() ? probs.data() : nullptr,
                         eager() ? nullptr : lse.data(), q.data(), k.data(), v.data(), b, s, a, kv,
                         d, window, variant);
  const HostBuf dout = random_buf(dt, nq, rng);
  HostBuf dq(dt, nq), dk(dt, nkv), dv(dt, nkv), dprobs(dt, eager() ? np : 1);
  std::vector<float> delta(static_cast<std::size_t>(nl));
  cpu->attention_backward(dq.data(), dk.data(), dv.data(), eager() ? dprobs.data() : nullptr,
                          eager() ? nullptr : delta.data(), dout.data(), q.data(), k.data(),
                          v.data(), out.data(), eager() ? probs.data() : nullptr,
                          eager() ? nullptr : lse.data(), b, s, a, kv, d, window, variant);

  DevBuf d_q(*gpu, q), d_k(*gpu, k), d_v(*gpu, v), d_out(*gpu, out), d_dout(*gpu, dout);
  DevBuf d_probs(*gpu, probs), d_lse(*gpu, nl * 4), d_delta(*gpu, nl * 4);
  gpu->upload(d_lse.get(), lse.data(), std::uint64_t(nl) * 4);
  DevBuf d_dprobs(*gpu, eager() ? dprobs.bytes() : 1);
  // Gradients are written with =: start them from NaN.
  HostBuf nan_q(dt, nq), nan_kv(dt, nkv);
  for (std::int64_t i = 0; i < nq; ++i) nan_q.set(i, NAN);
  for (std::int64_t i = 0; i < nkv; ++i) nan_kv.set(i, NAN);
  DevBuf d_dq(*gpu, nan_q), d_dk(*gpu, nan_kv), d_dv(*gpu, nan_kv);
  gpu->attention_backward(d_dq.get(), d_dk.get(), d_dv.get(), eager() ? d_dprobs.get() : nullptr,
                          eager() ? nullptr : d_delta.as<float>(), d_dout.get(), d_q.get(),
                          d_k.get(), d_v.get(), d_out.get(), eager() ? d_probs.get() : nullptr,
                          eager() ? nullptr : d_lse.as<float>(), b, s, a, kv, d, window, variant);
  if (!eager()) {
    EXPECT_TRUE(all_close("attention delta", d_delta.f32(DType::f32, nl), delta,
                          tolerance(DType::f32, 20), {b, a, s}));
  }
  // dq, dk sum s products of values that already carry rounding; dk, dv also over the group.
  EXPECT_TRUE(all_close("attention dv", d_dv.f32(dt, nkv), dv.to_f32(), tol(2), {b, s, kv, d}));
  EXPECT_TRUE(all_close("attention dq", d_dq.f32(dt, nq), dq.to_f32(), tol(2), {b, s, a, d}));
  EXPECT_TRUE(all_close("attention dk", d_dk.f32(dt, nkv), dk.to_f32(), tol(2), {b, s, kv, d}));
}

// Flash and eager on the GPU agree with each other in fp32 (a direct check of the tiled
// online softmax against the materialised one, independent of the CPU), without a window and
// with one that cuts the key tiles.
class AttentionGpuCross : public ::testing::TestWithParam<std::int64_t> {};
TEST_P(AttentionGpuCross, FlashAndEagerAgreeInFp32) {
  require_cuda_device();
  Backend& gpu = cuda_backend(DType::f32);
  std::mt19937 rng(5);
  const std::int64_t b = 2, s = 173, a = 8, kv = 2, d = 64, window = GetParam();
  const std::int64_t nq = b * s * a * d, nkv = b * s * kv * d;
  const HostBuf q = random_buf(DType::f32, nq, rng, -2, 2), k = random_buf(DType::f32, nkv, rng),
                v = random_buf(DType::f32, nkv, rng), dout = random_buf(DType::f32, nq, rng);
  DevBuf d_q(gpu, q), d_k(gpu, k), d_v(gpu, v), d_dout(gpu, dout);
  DevBuf e_out(gpu, nq * 4), f_out(gpu, nq * 4), probs(gpu, b * a * s * s * 4),
      dprobs(gpu, b * a * s * s * 4), lse(gpu, b * a * s * 4), delta(gpu, b * a * s * 4);
  gpu.attention_forward(e_out.get(), probs.get(), nullptr, d_q.get(), d_k.get(), d_v.get(), b, s, a,
                        kv, d, window, Attention::eager);
  gpu.attention_forward(f_out.get(), nullptr, lse.as<float>(), d_q.get(), d_k.get(), d_v.get(), b,
                        s, a, kv, d, window, Attention::flash);
  const auto eager_out = e_out.f32(DType::f32, nq);
  EXPECT_TRUE(all_close("flash vs eager out", f_out.f32(DType::f32, nq), eager_out,
                        tolerance(DType::f32, 20)));
  DevBuf e_dq(gpu, nq * 4), e_dk(gpu, nkv * 4), e_dv(gpu, nkv * 4);
  DevBuf f_dq(gpu, nq * 4), f_dk(gpu, nkv * 4), f_dv(gpu, nkv * 4);
  gpu.attention_backward(e_dq.get(), e_dk.get(), e_dv.get(), dprobs.get(), nullptr, d_dout.get(),
                         d_q.get(), d_k.get(), d_v.get(), e_out.get(), probs.get(), nullptr, b, s,
                         a, kv, d, window, Attention::eager);
  gpu.attention_backward(f_dq.get(), f_dk.get(), f_dv.get(), nullptr, delta.as<float>(),
                         d_dout.get(), d_q.get(), d_k.get(), d_v.get(), f_out.get(), nullptr,
                         lse.as<float>(), b, s, a, kv, d, window, Attention::flash);
  EXPECT_TRUE(all_close("flash vs eager dq", f_dq.f32(DType::f32, nq), e_dq.f32(DType::f32, nq),
                        tolerance(DType::f32, 40)));
  EXPECT_TRUE(all_close("flash vs eager dk", f_dk.f32(DType::f32, nkv), e_dk.f32(DType::f32, nkv),
                        tolerance(DType::f32, 40)));
  EXPECT_TRUE(all_close("flash vs eager dv", f_dv.f32(DType::f32, nkv), e_dv.f32(DType::f32, nkv),
                        tolerance(DType::f32, 40)));
}
INSTANTIATE_TEST_SUITE_P(Windows, AttentionGpuCross, ::testing::Values(0, 1, 45, 100),
                         [](const ::testing::TestParamInfo<std::int64_t>& info) {
                           return "window" + std::to_string(info.param);
                         });

TEST(AttentionGpuErrors, FlashRejectsHeadDimAbove256AndBadGroups) {
  require_cuda_device();
  Backend& gpu = cuda_backend(DType::bf16);
  DevBuf buf(gpu, 1 << 20);
  try {
    gpu.attention_forward(buf.get(), nullptr, buf.as<float>(), buf.get(), buf.get(), buf.get(), 1,
                          2, 1, 1, 512, 0, Attention::flash);
    ADD_FAILURE() << "no InputError for d = 512";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("d up to 256"), std::string::npos) << e.what();
  }
  try {
    gpu.attention_forward(buf.get(), buf.get(), nullptr, buf.get(), buf.get(), buf.get(), 1, 2, 6,
                          4, 8, 0, Attention::eager);
    ADD_FAILURE() << "no InputError for kv = 4 not dividing a = 6";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("must divide a"), std::string::npos) << e.what();
  }
}

const AttnShape kShapes[] = {
    {1, 1, 1, 1, 8, "one"},                  // a single position
    {2, 71, 6, 2, 40, "awkward_gqa"},        // s off every tile, d not a multiple of 32
    {3, 33, 4, 1, 17, "mqa_odd_hd"},         // MQA, odd d (odd shared-memory pitch path)
    {2, 130, 4, 4, 64, "mha_hd64"},          // two flash key tiles and a bit
    {1, 65, 2, 2, 256, "hd256"},             // the largest flash head dim (opt-in smem)
    {1, 512, 32, 32, 128, "llama7b_heads"},  // LLaMA-7B's attention at seq 512, one row
    {1, 1024, 32, 8, 128, "llama3_gqa"},     // LLaMA-3-8B-like GQA at seq 1024
    // Sliding windows: 1 (self only), cutting the flash tiles (16-row blocks, 32-key tiles),
    // past s, and Mistral-7B's heads with a window of a quarter of s.
    {2, 71, 6, 2, 40, "awkward_gqa_window1", 1},
    {2, 130, 4, 4, 64, "mha_hd64_window45", 45},
    {3, 33, 4, 1, 17, "mqa_odd_hd_window7", 7},
    {1, 65, 2, 2, 256, "hd256_window100", 100},
    {1, 1024, 32, 8, 128, "mistral_window256", 256},
};

INSTANTIATE_TEST_SUITE_P(Ops, AttentionGpu,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16, DType::f16),
                                            ::testing::Values(Attention::eager, Attention::flash),
                                            ::testing::ValuesIn(kShapes)),
                         [](const ::testing::TestParamInfo<AttnParam>& info) {
                           return dtype_param_name(std::get<0>(info.param)) + "_" +
                                  (std::get<1>(info.param) == Attention::eager ? "eager"
                                                                               : "flash") +
                                  "_" + std::get<2>(info.param).name;
                         });

// Ring attention's block kernels (context parallelism) against the cpu backend: rank 1 of cp 3
// over a sequence of 48, its queries against the three ranks' blocks in ring order, forward
// (accumulator, lse, the rounded output) and backward (dq, dk, dv accumulators per block, delta).
// Both backends run the same per-row code (attention_ring_math.hpp); the GPU's exp/log may
// differ from the host's in the last bits.
TEST(RingAttentionGpu, BlocksMatchCpu) {
  require_cuda_device();
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::unique_ptr<Backend> cpu = make_cpu_backend(dt);
    Backend* gpu = &cuda_backend(dt);
    std::mt19937 rng{7};
    const std::int64_t b = 2, s = 48, cp = 3, sl = s / cp, a = 4, kv = 2, d = 64, window = 0;
    const std::int64_t nq = b * sl * a * d, nk = b * sl * kv * d, nl = b * a * sl;
    const SeqPositions mine = SeqPositions::of_rank(s, cp, 1);
    const HostBuf q = random_buf(dt, nq, rng), dout = random_buf(dt, nq, rng);
    std::vector<HostBuf> k, v;
    for (int r = 0; r < cp; ++r) {
      k.push_back(random_buf(dt, nk, rng));
      v.push_back(random_buf(dt, nk, rng));
    }
    std::vector<float> acc(static_cast<std::size_t>(nq)), lse(static_cast<std::size_t>(nl));
    DevBuf d_q(*gpu, q), d_dout(*gpu, dout), d_acc(*gpu, nq * 4), d_lse(*gpu, nl * 4);
    for (std::int64_t j = 0; j < cp; ++j) {
      const std::size_t src = std::size_t((1 - j + cp) % cp);
      const SeqPositions kp = SeqPositions::of_rank(s, cp, std::int64_t(src));
      DevBuf d_k(*gpu, k[src]), d_v(*gpu, v[src]);
      cpu->attention_ring_forward(acc.data(), lse.data(), q.data(), k[src].data(), v[src].data(), b,
                                  sl, sl, a, kv, d, window, mine, kp, j == 0);
      gpu->attention_ring_forward(d_acc.as<float>(), d_lse.as<float>(), d_q.get(), d_k.get(),
                                  d_v.get(), b, sl, sl, a, kv, d, window, mine, kp, j == 0);
    }
    EXPECT_TRUE(all_close("ring acc", d_acc.f32(DType::f32, nq), acc, tolerance(DType::f32, 20),
                          {b, sl, a, d}));
    EXPECT_TRUE(all_close("ring lse", d_lse.f32(DType::f32, nl), lse, tolerance(DType::f32, 20),
                          {b, a, sl}));
    // The backward both backends get: the CPU's output and lse.
    HostBuf out(dt, nq);
    cpu->round_from_f32(out.data(), acc.data(), nq);
    DevBuf d_out(*gpu, out), d_dq(*gpu, nq * 4), d_delta(*gpu, nl * 4);
    gpu->upload(d_lse.get(), lse.data(), std::uint64_t(nl) * 4);
    std::vector<float> dq(static_cast<std::size_t>(nq)), delta(static_cast<std::size_t>(nl));
    gpu->fill_zero(d_dq.get(), std::uint64_t(nq) * 4);
    for (std::int64_t j = 0; j < cp; ++j) {
      const std::size_t src = std::size_t((1 - j + cp) % cp);
      const SeqPositions kp = SeqPositions::of_rank(s, cp, std::int64_t(src));
      std::vector<float> dk(static_cast<std::size_t>(nk)), dv(static_cast<std::size_t>(nk));
      DevBuf d_k(*gpu, k[src]), d_v(*gpu, v[src]), d_dk(*gpu, nk * 4), d_dv(*gpu, nk * 4);
      gpu->fill_zero(d_dk.get(), std::uint64_t(nk) * 4);
      gpu->fill_zero(d_dv.get(), std::uint64_t(nk) * 4);
      cpu->attention_ring_backward(dq.data(), dk.data(), dv.data(), delta.data(), dout.data(),
                                   q.data(), k[src].data(), v[src].data(), out.data(), lse.data(),
                                   b, sl, sl, a, kv, d, window, mine, kp, j == 0);
      gpu->attention_ring_backward(d_dq.as<float>(), d_dk.as<float>(), d_dv.as<float>(),
                                   d_delta.as<float>(), d_dout.get(), d_q.get(), d_k.get(),
                                   d_v.get(), d_out.get(), d_lse.as<float>(), b, sl, sl, a, kv, d,
                                   window, mine, kp, j == 0);
      EXPECT_TRUE(all_close("ring dk", d_dk.f32(DType::f32, nk), dk, tolerance(DType::f32, 20),
                            {b, sl, kv, d}));
      EXPECT_TRUE(all_close("ring dv", d_dv.f32(DType::f32, nk), dv, tolerance(DType::f32, 20),
                            {b, sl, kv, d}));
    }
    EXPECT_TRUE(all_close("ring dq", d_dq.f32(DType::f32, nq), dq, tolerance(DType::f32, 20),
                          {b, sl, a, d}));
    EXPECT_TRUE(all_close("ring delta", d_delta.f32(DType::f32, nl), delta,
                          tolerance(DType::f32, 20), {b, a, sl}));
  }
}

}  // namespace
}  // namespace trainmem::gputest
