// GPU tests: every op of the cuda backend against the cpu backend (the CPU references in
// kernels/*_cpu.cpp), per dtype, on awkward shapes (71x229-like, single elements) and
// LLaMA-sized ones. Inputs are the same bits on both sides; outputs are compared with the
// tolerance table of gpu_test_util.hpp (each comparison prints its max errors). Attention is in
// gpu_test_attention.cpp, the backend's plumbing and errors in gpu_test_backend.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <tuple>

#include "gpu_test_util.hpp"
#include "trainmem/model/model.hpp"  // kGemmWorkspaceBytes

namespace trainmem::gputest {
namespace {

const DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};

// A fixture over (dtype, shape): the cpu backend and the shared cuda backend of that dtype.
template <class Shape>
class OpTest : public ::testing::TestWithParam<std::tuple<DType, Shape>> {
 protected:
  void SetUp() override {
    require_cuda_device();
    dt = std::get<0>(this->GetParam());
    shape = std::get<1>(this->GetParam());
    cpu = make_cpu_backend(dt);
    gpu = &cuda_backend(dt);
  }
  DType dt = DType::f32;
  Shape shape{};
  std::unique_ptr<Backend> cpu;
  Backend* gpu = nullptr;
  std::mt19937 rng{20240607};
};

template <class Shape>
std::string case_name(const ::testing::TestParamInfo<std::tuple<DType, Shape>>& info) {
  return dtype_param_name(std::get<0>(info.param)) + "_" + std::get<1>(info.param).name;
}

// ---------------------------------------------------------------- embedding

struct EmbShape {
  std::int64_t b, s, h, V;
  const char* name;
};
void PrintTo(const EmbShape& shape, std::ostream* os) {
  *os << shape.name << " b=" << shape.b << " s=" << shape.s << " h=" << shape.h << " V=" << shape.V;
}
class EmbeddingGpu : public OpTest<EmbShape> {
 protected:
  // Ids drawn from a small subset so that ids repeat (the backward's hard case), plus the
  // extremes 0 and V-1.
  HostBuf tokens() {
    const auto [b, s, h, V, name] = shape;
    std::vector<std::int32_t> ids(std::size_t(b * s));
    std::uniform_int_distribution<std::int32_t> small(
        0, std::int32_t(std::min<std::int64_t>(V, 37) - 1));
    std::uniform_int_distribution<std::int32_t> any(0, std::int32_t(V - 1));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = i % 3 == 0 ? any(rng) : small(rng);
    ids.front() = std::int32_t(V - 1);
    ids.back() = 0;
    return int_buf(ids);
  }
};

TEST_P(EmbeddingGpu, ForwardGathersTheSameRowsAsCpu) {
  const auto [b, s, h, V, name] = shape;
  const HostBuf wte = random_buf(dt, V * h, rng);
  const HostBuf tok = tokens();
  HostBuf want(dt, b * s * h);
  cpu->embedding_forward(want.data(), tok.as<std::int32_t>(), wte.data(), b, s, h, V);
  DevBuf d_wte(*gpu, wte), d_tok(*gpu, tok), d_out(*gpu, want.bytes());
  gpu->embedding_forward(d_out.get(), d_tok.as<std::int32_t>(), d_wte.get(), b, s, h, V);
  EXPECT_TRUE(all_close("embedding_forward out", d_out.f32(dt, b * s * h), want.to_f32(), exact(),
                        {b, s, h}));
}

// A GEMM workspace lent to the backend, as the model lends the ledger's (set_gemm_workspace):
// the cuda embedding backward then sorts in it (the grouped kernels); without one it takes the
// scan kernel. Handed back before the buffer goes.
class LentGemmWorkspace {
 public:
  explicit LentGemmWorkspace(Backend& be) : be_(be), buf_(be, kGemmWorkspaceBytes) {
    be_.set_gemm_workspace(buf_.get(), kGemmWorkspaceBytes);
  }
  ~LentGemmWorkspace() { be_.set_gemm_workspace(nullptr, 0); }
  LentGemmWorkspace(const LentGemmWorkspace&) = delete;
  LentGemmWorkspace& operator=(const LentGemmWorkspace&) = delete;

 private:
  Backend& be_;
  DevBuf buf_;
};

TEST_P(EmbeddingGpu, BackwardScattersBitForBitLikeCpu) {
  const auto [b, s, h, V, name] = shape;
  const HostBuf dout = random_buf(dt, b * s * h, rng);
  const HostBuf tok = tokens();
  const HostBuf dwte = random_buf(dt, V * h, rng);  // += onto existing gradients
  HostBuf want = dwte;
  cpu->embedding_backward(want.data(), dout.data(), tok.as<std::int32_t>(), b, s, h, V);
  for (const bool grouped : {true, false}) {
    DevBuf d_dwte(*gpu, dwte), d_dout(*gpu, dout), d_tok(*gpu, tok);
    {
      std::unique_ptr<LentGemmWorkspace> ws;
      if (grouped) ws = std::make_unique<LentGemmWorkspace>(*gpu);
      gpu->embedding_backward(d_dwte.get(), d_dout.get(), d_tok.as<std::int32_t>(), b, s, h, V);
      gpu->synchronize();
    }
    // Same fp32 sequence on both sides (dwte, then the rows in position order): identical bits.
    EXPECT_TRUE(
        all_close(grouped ? "embedding_backward dwte (grouped)" : "embedding_backward dwte (scan)",
                  d_dwte.f32(dt, V * h), want.to_f32(), exact(), {V, h}));
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, EmbeddingGpu,
                         ::testing::Combine(::testing::ValuesIn(kDtypes),
                                            ::testing::Values(EmbShape{1, 1, 1, 1, "one"},
                                                              EmbShape{3, 71, 229, 97, "awkward"},
                                                              EmbShape{2, 5, 3000, 11, "wide"},
                                                              // 4400 rows: global merge steps
                                                              EmbShape{4, 1100, 70, 500, "merges"},
                                                              EmbShape{2, 512, 4096, 32000,
                                                                       "llama7b"})),
                         case_name<EmbShape>);

TEST(EmbeddingGpuErrors, OutOfRangeIdsGiveNanRowsAndLeaveOthersIntact) {
  require_cuda_device();
  Backend& gpu = cuda_backend(DType::bf16);
  std::mt19937 rng(3);
  const std::int64_t h = 40, V = 10;
  const HostBuf wte = random_buf(DType::bf16, V * h, rng);
  const HostBuf tok = int_buf({3, -1, 10, 9});
  DevBuf d_wte(gpu, wte), d_tok(gpu, tok), d_out(gpu, 4 * h * 2);
  gpu.embedding_forward(d_out.get(), d_tok.as<std::int32_t>(), d_wte.get(), 1, 4, h, V);
  const HostBuf out = d_out.download(DType::bf16, 4 * h);
  for (std::int64_t c = 0; c < h; ++c) {
    EXPECT_EQ(out.get(0 * h + c), wte.get(3 * h + c));
    EXPECT_TRUE(std::isnan(out.get(1 * h + c))) << "id -1, column " << c;
    EXPECT_TRUE(std::isnan(out.get(2 * h + c))) << "id V, column " << c;
    EXPECT_EQ(out.get(3 * h + c), wte.get(9 * h + c));
  }
}

TEST(EmbeddingGpuErrors, BackwardSkipsOutOfRangeIdsWithAndWithoutTheWorkspace) {
  require_cuda_device();
  Backend& gpu = cuda_backend(DType::bf16);
  auto cpu = make_cpu_backend(DType::bf16);
  std::mt19937 rng(4);
  const std::int64_t h = 40, V = 10;
  const std::int32_t kMin = std::numeric_limits<std::int32_t>::min();
  const std::vector<std::int32_t> ids = {3, -1, 10, 9, 3, kMin, 3};
  const std::int64_t n = std::int64_t(ids.size());
  const HostBuf dout = random_buf(DType::bf16, n * h, rng);
  const HostBuf dwte = random_buf(DType::bf16, V * h, rng);
  // The cpu backend refuses such ids: its reference runs on the valid rows (3, 9, 3, 3).
  HostBuf want = dwte, valid_dout(DType::bf16, 4 * h);
  const std::int64_t valid_rows[] = {0, 3, 4, 6};
  for (std::int64_t r = 0; r < 4; ++r)
    for (std::int64_t c = 0; c < h; ++c) valid_dout.set(r * h + c, dout.get(valid_rows[r] * h + c));
  const HostBuf valid_tok = int_buf({3, 9, 3, 3});
  cpu->embedding_backward(want.data(), valid_dout.data(), valid_tok.as<std::int32_t>(), 1, 4, h, V);
  for (const bool grouped : {true, false}) {
    DevBuf d_dwte(gpu, dwte), d_dout(gpu, dout), d_tok(gpu, int_buf(ids));
    {
      std::unique_ptr<LentGemmWorkspace> ws;
      if (grouped) ws = std::make_unique<LentGemmWorkspace>(gpu);
      gpu.embedding_backward(d_dwte.get(), d_dout.get(), d_tok.as<std::int32_t>(), 1, n, h, V);
      gpu.synchronize();
    }
    EXPECT_TRUE(all_close(grouped ? "grouped" : "scan", d_dwte.f32(DType::bf16, V * h),
                          want.to_f32(), exact(), {V, h}));
  }
}

// ---------------------------------------------------------------- rmsnorm

struct RowShape {
  std::int64_t n, h;
  const char* name;
};
void PrintTo(const RowShape& shape, std::ostream* os) {
  *os << shape.name << " n=" << shape.n << " h=" << shape.h;
}
class RmsNormGpu : public OpTest<RowShape> {};

TEST_P(RmsNormGpu, ForwardMatchesCpu) {
  const auto [n, h, name] = shape;
  const HostBuf inp = random_buf(dt, n * h, rng, -3, 3);
  const HostBuf w = random_buf(dt, h, rng, 0.5f, 1.5f);
  HostBuf want(dt, n * h);
  std::vector<float> rstd_want(static_cast<std::size_t>(n));
  cpu->rmsnorm_forward(want.data(), rstd_want.data(), inp.data(), w.data(), n, h, 1e-5f);
  DevBuf d_inp(*gpu, inp), d_w(*gpu, w), d_out(*gpu, want.bytes()), d_rstd(*gpu, n * 4);
  gpu->rmsnorm_forward(d_out.get(), d_rstd.as<float>(), d_inp.get(), d_w.get(), n, h, 1e-5f);
  EXPECT_TRUE(all_close("rmsnorm_forward rstd", d_rstd.f32(DType::f32, n), rstd_want,
                        tolerance(DType::f32, 4)));
  EXPECT_TRUE(
      all_close("rmsnorm_forward out", d_out.f32(dt, n * h), want.to_f32(), tolerance(dt), {n, h}));
}

TEST_P(RmsNormGpu, BackwardAccumulatesLikeCpu) {
  const auto [n, h, name] = shape;
  const HostBuf inp = random_buf(dt, n * h, rng, -3, 3);
  const HostBuf w = random_buf(dt, h, rng, 0.5f, 1.5f);
  const HostBuf dout = random_buf(dt, n * h, rng);
  HostBuf scratch(dt, n * h);
  std::vector<float> rstd(static_cast<std::size_t>(n));
  cpu->rmsnorm_forward(scratch.data(), rstd.data(), inp.data(), w.data(), n, h, 1e-5f);
  HostBuf dinp_want = random_buf(dt, n * h, rng);  // both gradients accumulate (+=)
  HostBuf dw_want = random_buf(dt, h, rng);
  DevBuf d_dinp(*gpu, dinp_want), d_dw(*gpu, dw_want), d_dout(*gpu, dout), d_inp(*gpu, inp),
      d_w(*gpu, w), d_rstd(*gpu, n * 4);
  gpu->upload(d_rstd.get(), rstd.data(), std::uint64_t(n) * 4);
  cpu->rmsnorm_backward(dinp_want.data(), dw_want.data(), dout.data(), inp.data(), w.data(),
                        rstd.data(), n, h);
  gpu->rmsnorm_backward(d_dinp.get(), d_dw.get(), d_dout.get(), d_inp.get(), d_w.get(),
                        d_rstd.as<float>(), n, h);
  EXPECT_TRUE(all_close("rmsnorm_backward dinp", d_dinp.f32(dt, n * h), dinp_want.to_f32(),
                        tolerance(dt, 2), {n, h}));
  // dweight sums n rows: the order differs (16 row groups on the GPU).
  EXPECT_TRUE(
      all_close("rmsnorm_backward dweight", d_dw.f32(dt, h), dw_want.to_f32(), tolerance(dt, 4)));
}

INSTANTIATE_TEST_SUITE_P(Ops, RmsNormGpu,
                         ::testing::Combine(::testing::ValuesIn(kDtypes),
                                            ::testing::Values(RowShape{1, 1, "one"},
                                                              RowShape{71, 229, "awkward"},
                                                              RowShape{3, 8192, "wide"},
                                                              RowShape{1024, 4096, "llama7b"})),
                         case_name<RowShape>);

// ---------------------------------------------------------------- matmul

struct GemmShape {
  std::int64_t M, N, K;
  const char* name;
};
void PrintTo(const GemmShape& shape, std::ostream* os) {
  *os << shape.name << " M=" << shape.M << " N=" << shape.N << " K=" << shape.K;
}
class MatmulGpu : public OpTest<GemmShape> {};

TEST_P(MatmulGpu, EveryTransposeWithAlphaAndBetaMatchesCpu) {
  const auto [M, N, K, name] = shape;
  for (Trans ta : {Trans::no, Trans::yes}) {
    for (Trans tb : {Trans::no, Trans::yes}) {
      SCOPED_TRACE(std::string("ta=") + (ta == Trans::yes ? "T" : "N") +
                   " tb=" + (tb == Trans::yes ? "T" : "N"));
      const HostBuf a = random_buf(dt, M * K, rng);
      const HostBuf b = random_buf(dt, K * N, rng);
      HostBuf want = random_buf(dt, M * N, rng);
      DevBuf d_a(*gpu, a), d_b(*gpu, b), d_c(*gpu, want);
      cpu->matmul(want.data(), a.data(), b.data(), M, N, K, ta, tb, 0.5f, 1.0f);
      gpu->matmul(d_c.get(), d_a.get(), d_b.get(), M, N, K, ta, tb, 0.5f, 1.0f);
      EXPECT_TRUE(all_close("matmul c (beta 1)", d_c.f32(dt, M * N), want.to_f32(),
                            tolerance(dt, dt == DType::f32 ? 20 : 1), {M, N}));
      // beta 0 must not read c: NaN there may not leak into the result.
      HostBuf nan_c(dt, M * N);
      for (std::int64_t i = 0; i < M * N; ++i) nan_c.set(i, NAN);
      HostBuf want0(dt, M * N);
      DevBuf d_c0(*gpu, nan_c);
      cpu->matmul(want0.data(), a.data(), b.data(), M, N, K, ta, tb, 1.0f, 0.0f);
      gpu->matmul(d_c0.get(), d_a.get(), d_b.get(), M, N, K, ta, tb, 1.0f, 0.0f);
      EXPECT_TRUE(all_close("matmul c (beta 0, c was NaN)", d_c0.f32(dt, M * N), want0.to_f32(),
                            tolerance(dt, dt == DType::f32 ? 20 : 1), {M, N}));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ops, MatmulGpu,
    ::testing::Combine(::testing::ValuesIn(kDtypes),
                       ::testing::Values(GemmShape{1, 1, 1, "one"},
                                         GemmShape{71, 229, 37, "awkward"},
                                         GemmShape{3, 1, 300, "vector"},
                                         GemmShape{256, 4096, 4096, "llama7b_qproj"},
                                         GemmShape{256, 11008, 4096, "llama7b_up"},
                                         GemmShape{256, 4096, 11008, "llama7b_down"})),
    case_name<GemmShape>);

// Empty products: M or N = 0 is a no-op (no error about leading dimensions), K = 0 leaves
// beta * c (cuBLAS's documented k = 0 case).
TEST(MatmulGpuEdge, EmptyDimensionsAreNoOpsAndKZeroScalesC) {
  require_cuda_device();
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Backend& gpu = cuda_backend(dt);
    std::mt19937 rng(3);
    DevBuf d_a(gpu, 64), d_b(gpu, 64), d_c(gpu, 64);
    EXPECT_NO_THROW(
        gpu.matmul(d_c.get(), d_a.get(), d_b.get(), 0, 5, 3, Trans::no, Trans::no, 1.0f, 0.0f));
    EXPECT_NO_THROW(
        gpu.matmul(d_c.get(), d_a.get(), d_b.get(), 4, 0, 3, Trans::no, Trans::yes, 1.0f, 0.0f));
    HostBuf c = random_buf(dt, 12, rng);
    HostBuf want(dt, 12);
    for (std::int64_t i = 0; i < 12; ++i) want.set(i, 0.5f * c.get(i));  // exact: a power of 2
    DevBuf d_c2(gpu, c);
    gpu.matmul(d_c2.get(), d_a.get(), d_b.get(), 3, 4, 0, Trans::no, Trans::no, 1.0f, 0.5f);
    EXPECT_TRUE(all_close("matmul K=0", d_c2.f32(dt, 12), want.to_f32(), exact()));
  }
}

// ---------------------------------------------------------------- rope

struct HeadsShape {
  std::int64_t b, s, a, kv, d;
  double theta;
  const char* name;
};
void PrintTo(const HeadsShape& shape, std::ostream* os) {
  *os << shape.name << " b=" << shape.b << " s=" << shape.s << " a=" << shape.a
      << " kv=" << shape.kv << " d=" << shape.d << " theta=" << shape.theta;
}
class RopeGpu : public OpTest<HeadsShape> {};

// Without scaling and with Llama 3.1's llama3 scaling (factor 8, low 1, high 4, original 8192).
TEST_P(RopeGpu, ForwardAndBackwardMatchCpuInPlace) {
  const auto [b, s, a, kv, d, theta, name] = shape;
  const std::int64_t nq = b * s * a * d, nk = b * s * kv * d;
  RopeSpec scaled{theta, {}};
  scaled.scaling = {RopeScalingKind::llama3, 8.0, 1.0, 4.0, 8192};
  for (const RopeSpec& spec : {RopeSpec{theta, {}}, scaled})
    for (bool forward : {true, false}) {
      SCOPED_TRACE(std::string(forward ? "forward" : "backward") +
                   (spec.scaling.kind == RopeScalingKind::llama3 ? " llama3" : ""));
      HostBuf q = random_buf(dt, nq, rng), k = random_buf(dt, nk, rng);
      DevBuf d_q(*gpu, q), d_k(*gpu, k);
      if (forward) {
        cpu->rope_forward(q.data(), k.data(), b, s, a, kv, d, spec);
        gpu->rope_forward(d_q.get(), d_k.get(), b, s, a, kv, d, spec);
      } else {
        cpu->rope_backward(q.data(), k.data(), b, s, a, kv, d, spec);
        gpu->rope_backward(d_q.get(), d_k.get(), b, s, a, kv, d, spec);
      }
      EXPECT_TRUE(all_close("rope q", d_q.f32(dt, nq), q.to_f32(), tolerance(dt, 2), {b, s, a, d}));
      EXPECT_TRUE(
          all_close("rope k", d_k.f32(dt, nk), k.to_f32(), tolerance(dt, 2), {b, s, kv, d}));
    }
}

TEST_P(RopeGpu, BackwardUndoesForward) {
  if (dt != DType::f32) GTEST_SKIP() << "an fp32-only property (16-bit rounds twice)";
  const auto [b, s, a, kv, d, theta, name] = shape;
  const std::int64_t nq = b * s * a * d, nk = b * s * kv * d;
  const HostBuf q = random_buf(dt, nq, rng), k = random_buf(dt, nk, rng);
  DevBuf d_q(*gpu, q), d_k(*gpu, k);
  gpu->rope_forward(d_q.get(), d_k.get(), b, s, a, kv, d, RopeSpec{theta, {}});
  gpu->rope_backward(d_q.get(), d_k.get(), b, s, a, kv, d, RopeSpec{theta, {}});
  EXPECT_TRUE(all_close("rope q round trip", d_q.f32(dt, nq), q.to_f32(), tolerance(dt, 10)));
  EXPECT_TRUE(all_close("rope k round trip", d_k.f32(dt, nk), k.to_f32(), tolerance(dt, 10)));
}

INSTANTIATE_TEST_SUITE_P(
    Ops, RopeGpu,
    ::testing::Combine(::testing::ValuesIn(kDtypes),
                       ::testing::Values(HeadsShape{1, 1, 1, 1, 2, 10000.0, "one"},
                                         HeadsShape{2, 71, 6, 2, 40, 10000.0, "awkward_gqa"},
                                         HeadsShape{2, 512, 32, 32, 128, 10000.0, "llama7b"},
                                         HeadsShape{1, 2048, 32, 8, 128, 500000.0,
                                                    "llama3_theta"})),
    case_name<HeadsShape>);

// ---------------------------------------------------------------- bias

struct BiasShape {
  std::int64_t n, c;
  const char* name;
};
void PrintTo(const BiasShape& shape, std::ostream* os) {
  *os << shape.name << " n=" << shape.n << " c=" << shape.c;
}
class BiasGpu : public OpTest<BiasShape> {};

// The column sums add in the CPU reference's order (kernels/bias/bias_math.hpp) and the add is one
// fp32 addition: both directions bit for bit (exact()).
TEST_P(BiasGpu, ForwardAndBackwardMatchCpuBitForBit) {
  const auto [n, c, name] = shape;
  HostBuf out = random_buf(dt, n * c, rng), dbias = random_buf(dt, c, rng);
  const HostBuf bias = random_buf(dt, c, rng), dout = random_buf(dt, n * c, rng, -4, 4);
  DevBuf d_out(*gpu, out), d_dbias(*gpu, dbias), d_bias(*gpu, bias), d_dout(*gpu, dout);
  cpu->bias_forward(out.data(), bias.data(), n, c);
  cpu->bias_backward(dbias.data(), dout.data(), n, c);
  gpu->bias_forward(d_out.get(), d_bias.get(), n, c);
  gpu->bias_backward(d_dbias.get(), d_dout.get(), n, c);
  EXPECT_TRUE(all_close("bias out", d_out.f32(dt, n * c), out.to_f32(), exact()));
  EXPECT_TRUE(all_close("dbias", d_dbias.f32(dt, c), dbias.to_f32(), exact()));
}

INSTANTIATE_TEST_SUITE_P(Ops, BiasGpu,
                         ::testing::Combine(::testing::ValuesIn(kDtypes),
                                            ::testing::Values(BiasShape{1, 1, "one"},
                                                              BiasShape{71, 229, "awkward"},
                                                              BiasShape{4096, 3584, "qwen2_7b_q"},
                                                              BiasShape{4096, 512, "qwen2_7b_kv"})),
                         case_name<BiasShape>);

// ---------------------------------------------------------------- swiglu

struct FlatShape {
  std::int64_t n;
  const char* name;
};
void PrintTo(const FlatShape& shape, std::ostream* os) {
  *os << shape.name << " n=" << shape.n;
}
class SwiGluGpu : public OpTest<FlatShape> {};

TEST_P(SwiGluGpu, ForwardAndBackwardMatchCpu) {
  const std::int64_t n = shape.n;
  const HostBuf gate = random_buf(dt, n, rng, -8, 8), up = random_buf(dt, n, rng, -2, 2);
  const HostBuf dout = random_buf(dt, n, rng);
  HostBuf out(dt, n), dgate(dt, n), dup(dt, n);
  cpu->swiglu_forward(out.data(), gate.data(), up.data(), n);
  cpu->swiglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n);
  DevBuf d_gate(*gpu, gate), d_up(*gpu, up), d_dout(*gpu, dout), d_out(*gpu, out.bytes()),
      d_dgate(*gpu, out.bytes()), d_dup(*gpu, out.bytes());
  gpu->swiglu_forward(d_out.get(), d_gate.get(), d_up.get(), n);
  gpu->swiglu_backward(d_dgate.get(), d_dup.get(), d_dout.get(), d_gate.get(), d_up.get(), n);
  EXPECT_TRUE(all_close("swiglu out", d_out.f32(dt, n), out.to_f32(), tolerance(dt)));
  EXPECT_TRUE(all_close("swiglu dgate", d_dgate.f32(dt, n), dgate.to_f32(), tolerance(dt)));
  EXPECT_TRUE(all_close("swiglu dup", d_dup.f32(dt, n), dup.to_f32(), tolerance(dt)));
}

INSTANTIATE_TEST_SUITE_P(Ops, SwiGluGpu,
                         ::testing::Combine(::testing::ValuesIn(kDtypes),
                                            ::testing::Values(FlatShape{1, "one"},
                                                              FlatShape{71 * 229, "awkward"},
                                                              FlatShape{512 * 11008, "llama7b"})),
                         case_name<FlatShape>);

// ---------------------------------------------------------------- cross-entropy

struct VocabShape {
  std::int64_t n, V;
  const char* name;
};
void PrintTo(const VocabShape& shape, std::ostream* os) {
  *os << shape.name << " n=" << shape.n << " V=" << shape.V;
}
class CrossEntropyGpu : public OpTest<VocabShape> {
 protected:
  HostBuf targets() {  // about one row in 8 ignored (-1), the rest anywhere in [0, V)
    const auto [n, V, name] = shape;
    std::vector<std::int32_t> t(static_cast<std::size_t>(n));
    std::uniform_int_distribution<std::int32_t> any(0, std::int32_t(V - 1));
    for (auto& x : t) x = rng() % 8 == 0 ? -1 : any(rng);
    t.back() = std::int32_t(V - 1);
    return int_buf(t);
  }
};

TEST_P(CrossEntropyGpu, ForwardLossAndLseMatchCpu) {
  const auto [n, V, name] = shape;
  const HostBuf logits = random_buf(dt, n * V, rng, -6, 6);
  const HostBuf tgt = targets();
  std::vector<float> losses(static_cast<std::size_t>(n)), lse(static_cast<std::size_t>(n));
  cpu->cross_entropy_forward(losses.data(), lse.data(), logits.data(), tgt.as<std::int32_t>(), n,
                             V);
  DevBuf d_logits(*gpu, logits), d_tgt(*gpu, tgt), d_losses(*gpu, n * 4), d_lse(*gpu, n * 4);
  gpu->cross_entropy_forward(d_losses.as<float>(), d_lse.as<float>(), d_logits.get(),
                             d_tgt.as<std::int32_t>(), n, V);
  // fp32 results from the same inputs: only the summation order differs.
  EXPECT_TRUE(
      all_close("cross_entropy lse", d_lse.f32(DType::f32, n), lse, tolerance(DType::f32, 4)));
  EXPECT_TRUE(all_close("cross_entropy losses", d_losses.f32(DType::f32, n), losses,
                        tolerance(DType::f32, 10)));
}

TEST_P(CrossEntropyGpu, BackwardInPlaceMatchesCpu) {
  const auto [n, V, name] = shape;
  const HostBuf logits = random_buf(dt, n * V, rng, -6, 6);
  const HostBuf tgt = targets();
  std::vector<float> losses(static_cast<std::size_t>(n)), lse(static_cast<std::size_t>(n));
  cpu->cross_entropy_forward(losses.data(), lse.data(), logits.data(), tgt.as<std::int32_t>(), n,
                             V);
  const float scale = 1.0f / float(n);
  HostBuf want(dt, n * V);
  cpu->cross_entropy_backward(want.data(), logits.data(), lse.data(), tgt.as<std::int32_t>(), n, V,
                              scale);
  DevBuf d_logits(*gpu, logits), d_tgt(*gpu, tgt), d_lse(*gpu, n * 4);
  gpu->upload(d_lse.get(), lse.data(), std::uint64_t(n) * 4);
  // In place, as the model does it: dlogits aliases logits.
  gpu->cross_entropy_backward(d_logits.get(), d_logits.get(), d_lse.as<float>(),
                              d_tgt.as<std::int32_t>(), n, V, scale);
  EXPECT_TRUE(all_close("cross_entropy dlogits", d_logits.f32(dt, n * V), want.to_f32(),
                        tolerance(dt), {n, V}));
}

INSTANTIATE_TEST_SUITE_P(
    Ops, CrossEntropyGpu,
    ::testing::Combine(::testing::ValuesIn(kDtypes),
                       ::testing::Values(VocabShape{1, 1, "one"}, VocabShape{71, 229, "awkward"},
                                         VocabShape{1024, 32000, "llama7b"},
                                         VocabShape{4, 128256, "llama3_vocab"})),
    case_name<VocabShape>);

// ---------------------------------------------------------------- optimizers

class OptimizerGpu : public OpTest<FlatShape> {};

TEST_P(OptimizerGpu, AdamWThreeStepsMatchCpu) {
  const std::int64_t n = shape.n;
  const bool with_master = dt != DType::f32;  // the interface: master only for 16-bit D
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  HostBuf param = random_buf(dt, n, rng);
  HostBuf master(DType::f32, n), m(DType::f32, n), v(DType::f32, n);
  for (std::int64_t i = 0; i < n; ++i) master.set(i, param.get(i));
  DevBuf d_param(*gpu, param), d_master(*gpu, master), d_m(*gpu, m), d_v(*gpu, v);
  for (int step = 1; step <= 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const HostBuf grad = random_buf(dt, n, rng, -step, step);
    // Step 2 undoes a loss scale (1/4088: fp16 LLaMA-7B at b 8, s 512), as fp16 runs do.
    const float grad_scale = step == 2 ? 1.0f / 4088.0f : 1.0f;
    DevBuf d_grad(*gpu, grad);
    cpu->adamw_update(param.data(), grad.data(), with_master ? master.as<float>() : nullptr,
                      m.as<float>(), v.as<float>(), n, hp, step, grad_scale);
    gpu->adamw_update(d_param.get(), d_grad.get(), with_master ? d_master.as<float>() : nullptr,
                      d_m.as<float>(), d_v.as<float>(), n, hp, step, grad_scale);
    // fp32 state: nvcc contracts a*b+c into FMA, the host compiler may not (an ulp or so).
    EXPECT_TRUE(all_close("adamw m", d_m.f32(DType::f32, n), m.to_f32(), tolerance(DType::f32)));
    EXPECT_TRUE(all_close("adamw v", d_v.f32(DType::f32, n), v.to_f32(), tolerance(DType::f32)));
    if (with_master) {
      EXPECT_TRUE(all_close("adamw master", d_master.f32(DType::f32, n), master.to_f32(),
                            tolerance(DType::f32)));
    }
    EXPECT_TRUE(all_close("adamw param", d_param.f32(dt, n), param.to_f32(), tolerance(dt)));
  }
}

TEST_P(OptimizerGpu, SgdWithAndWithoutMasterMatchesCpu) {
  const std::int64_t n = shape.n;
  for (bool with_master : {true, false}) {
    SCOPED_TRACE(with_master ? "with master (SGD)" : "in place (LOMO)");
    HostBuf param = random_buf(dt, n, rng);
    HostBuf master(DType::f32, n);
    for (std::int64_t i = 0; i < n; ++i) master.set(i, param.get(i) + 1e-3f);  // not round(param)
    const HostBuf grad = random_buf(dt, n, rng);
    DevBuf d_param(*gpu, param), d_master(*gpu, master), d_grad(*gpu, grad);
    const float grad_scale = with_master ? 1.0f : 0.125f;  // LOMO under a loss scale of 8
    cpu->sgd_update(param.data(), grad.data(), with_master ? master.as<float>() : nullptr, n, 0.05f,
                    grad_scale);
    gpu->sgd_update(d_param.get(), d_grad.get(), with_master ? d_master.as<float>() : nullptr, n,
                    0.05f, grad_scale);
    EXPECT_TRUE(all_close("sgd param", d_param.f32(dt, n), param.to_f32(), tolerance(dt)));
    if (with_master) {
      EXPECT_TRUE(all_close("sgd master", d_master.f32(DType::f32, n), master.to_f32(),
                            tolerance(DType::f32)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ops, OptimizerGpu,
    ::testing::Combine(::testing::ValuesIn(kDtypes),
                       ::testing::Values(FlatShape{1, "one"}, FlatShape{71 * 229, "awkward"},
                                         FlatShape{4096 * 4096, "llama7b_qproj"})),
    case_name<FlatShape>);

}  // namespace
}  // namespace trainmem::gputest
