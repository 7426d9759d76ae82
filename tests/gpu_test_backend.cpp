// GPU tests of the cuda backend's plumbing: transfers, fills and copies on its stream; the
// cuBLAS workspace taken from the ledger; out of memory surfacing as the ledger's typed
// OutOfMemory; a failed CUDA call surfacing as DeviceError with file, line and error name;
// the residual-add and cast kernels against dtype.hpp's conversions; the non-finite check.
#include <cstring>
#include <limits>
#include <random>

#include "cuda/cuda_backend.hpp"
#include "gpu_test_util.hpp"
#include "kernels/residual.cuh"
#include "trainmem/base/cuda_check.hpp"
#include "trainmem/ledger/ledger.hpp"

namespace trainmem::gputest {
namespace {

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override { require_cuda_device(); }
};

TEST_F(CudaBackendTest, UploadDownloadFillZeroAndCopyMoveTheBytes) {
  Backend& gpu = cuda_backend(DType::bf16);
  std::vector<unsigned char> host(1000003);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<unsigned char>(i * 131 + 7);
  DevBuf a(gpu, host.size()), b(gpu, host.size());
  gpu.upload(a.get(), host.data(), host.size());
  gpu.copy(b.get(), a.get(), host.size());
  std::vector<unsigned char> back(host.size());
  gpu.download(back.data(), b.get(), back.size());
  EXPECT_EQ(back, host);
  gpu.fill_zero(static_cast<char*>(b.get()) + 10, 1000);
  gpu.download(back.data(), b.get(), back.size());
  for (std::size_t i = 0; i < back.size(); ++i) {
    const unsigned char want = i >= 10 && i < 1010 ? 0 : host[i];
    ASSERT_EQ(back[i], want) << "byte " << i;
  }
}

TEST_F(CudaBackendTest, KindAllocatorAndStream) {
  Backend& gpu = cuda_backend(DType::f16);
  EXPECT_EQ(gpu.kind(), BackendKind::cuda);
  EXPECT_EQ(gpu.dtype(), DType::f16);
  EXPECT_TRUE(gpu.computes());
  EXPECT_TRUE(gpu.allocator().touches_memory());
  auto* cuda = dynamic_cast<CudaBackend*>(&gpu);
  ASSERT_NE(cuda, nullptr);
  EXPECT_NE(cuda->stream(), nullptr);  // its own stream, not the legacy default one
  cudaStream_t bound = nullptr;
  ASSERT_EQ(cublasGetStream(cuda->cublas(), &bound), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(bound, cuda->stream());
  // fp32 stays fp32 (no TF32), and 16-bit GEMMs reduce split-K partials in fp32 (docs/gpu.md).
  cublasMath_t mode = CUBLAS_DEFAULT_MATH;
  ASSERT_EQ(cublasGetMathMode(cuda->cublas(), &mode), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(static_cast<int>(mode) & 0xf, static_cast<int>(CUBLAS_DEFAULT_MATH));
  EXPECT_NE(static_cast<int>(mode) & CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION, 0);
}

TEST_F(CudaBackendTest, Int32IsNotATrainingDtype) {
  EXPECT_THROW(make_cuda_backend(DType::i32), InputError);
}

TEST_F(CudaBackendTest, GemmsUseTheLedgersWorkspaceAndStayCorrect) {
  Backend& gpu = cuda_backend(DType::bf16);
  auto cpu = make_cpu_backend(DType::bf16);
  Ledger ledger(gpu.allocator());
  // 32 MiB, as the model allocates it (docs/native-plan.md, setup step 5).
  Tensor ws = ledger.allocate("cublas_workspace", Category::workspace, -1, {8 << 20}, DType::i32);
  ASSERT_EQ(ws.bytes(), std::uint64_t(32) << 20);
  gpu.set_gemm_workspace(ws.data(), ws.bytes());
  std::mt19937 rng(1);
  const std::int64_t M = 300, N = 500, K = 700;
  const HostBuf a = random_buf(DType::bf16, M * K, rng), b = random_buf(DType::bf16, K * N, rng);
  HostBuf want(DType::bf16, M * N);
  cpu->matmul(want.data(), a.data(), b.data(), M, N, K, Trans::no, Trans::yes, 1.0f, 0.0f);
  DevBuf d_a(gpu, a), d_b(gpu, b), d_c(gpu, want.bytes());
  gpu.matmul(d_c.get(), d_a.get(), d_b.get(), M, N, K, Trans::no, Trans::yes, 1.0f, 0.0f);
  EXPECT_TRUE(all_close("matmul with the ledger's workspace", d_c.f32(DType::bf16, M * N),
                        want.to_f32(), tolerance(DType::bf16)));
  gpu.synchronize();
  // Hand cuBLAS its default workspace back before the ledger's buffer goes away.
  gpu.set_gemm_workspace(nullptr, 0);
  ws.reset();
}

TEST_F(CudaBackendTest, AWorkspaceCublasWouldRefuseIsInputErrorAndChangesNothing) {
  Backend& gpu = cuda_backend(DType::f32);
  Ledger ledger(gpu.allocator());
  Tensor ws = ledger.allocate("cublas_workspace", Category::workspace, -1, {8 << 20}, DType::f32);
  auto* base = static_cast<char*>(ws.data());
  // cuBLAS requires 256-byte alignment (CUBLAS_STATUS_INVALID_VALUE otherwise): refused first.
  try {
    gpu.set_gemm_workspace(base + 16, ws.bytes() - 16);
    FAIL() << "a workspace 16 bytes off the 256-byte grid was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("aligned to 256 bytes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gpu.set_gemm_workspace(base, 1024), InputError);  // under 16 KiB
  // The handle still works (on its default workspace).
  std::vector<float> a = {1, 2, 3, 4}, b = {5, 6, 7, 8}, c(4, 0.0f);
  DevBuf d_a(gpu, 16), d_b(gpu, 16), d_c(gpu, 16);
  gpu.upload(d_a.get(), a.data(), 16);
  gpu.upload(d_b.get(), b.data(), 16);
  gpu.matmul(d_c.get(), d_a.get(), d_b.get(), 2, 2, 2, Trans::no, Trans::no, 1.0f, 0.0f);
  gpu.download(c.data(), d_c.get(), 16);
  EXPECT_EQ(c, (std::vector<float>{19, 22, 43, 50}));
}

TEST_F(CudaBackendTest, OutOfMemoryIsTheLedgersTypedErrorAndTheDeviceStaysUsable) {
  Backend& gpu = cuda_backend(DType::bf16);
  Ledger ledger(gpu.allocator());
  Tensor small = ledger.allocate("small", Category::params, -1, {1024}, DType::bf16);
  const std::uint64_t live = ledger.live_total();
  const std::int64_t huge = std::int64_t(1) << 48;  // 2^48 fp32 elements = 2^50 bytes (1 PiB)
  try {
    ledger.allocate("too_big", Category::activations, 3, {huge}, DType::f32);
    FAIL() << "allocating 1 PiB on the device did not throw";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested_bytes, std::uint64_t(huge) * 4);
    EXPECT_EQ(e.category, "activations");
    EXPECT_EQ(e.tensor, "too_big");
    EXPECT_EQ(e.live_bytes, live);
    // More than the whole device: refused by the allocator without a driver call.
    EXPECT_NE(std::string(e.what()).find("exceeds the device's total memory"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(ledger.live_total(), live);
  // The failed request left no sticky error behind.
  Tensor after = ledger.allocate("after", Category::activations, -1, {4096}, DType::f32);
  std::vector<float> ones(4096, 1.0f), back(4096, 0.0f);
  gpu.upload(after.data(), ones.data(), 4096 * 4);
  gpu.download(back.data(), after.data(), 4096 * 4);
  EXPECT_EQ(back, ones);
}

TEST_F(CudaBackendTest, AFailedCudaCallIsADeviceErrorNamingFileLineAndError) {
  Backend& gpu = cuda_backend(DType::f32);
  // A call that fails synchronously and leaves nothing sticky: properties of a device that does
  // not exist (cudaErrorInvalidDevice). A bad pointer would be riskier: if the driver accepted
  // it and the copy faulted on the device, the context (and every later test) would be lost.
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  const int line = __LINE__ + 3;
  try {
    cudaDeviceProp prop{};
    TM_CUDA_CHECK(cudaGetDeviceProperties(&prop, count + 7));
    FAIL() << "cudaGetDeviceProperties of device " << count + 7 << " did not throw";
  } catch (const DeviceError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("gpu_test_backend.cpp:" + std::to_string(line)), std::string::npos) << msg;
    EXPECT_NE(msg.find("cudaErrorInvalidDevice"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cudaGetDeviceProperties"), std::string::npos) << msg;
  }
  // Still usable.
  DevBuf buf(gpu, 64);
  std::vector<float> in(16, 2.5f), out(16);
  gpu.upload(buf.get(), in.data(), 64);
  gpu.download(out.data(), buf.get(), 64);
  EXPECT_EQ(out, in);
}

// ---------------------------------------------------------------- residual, cast

cudaStream_t stream_of(Backend& be) {
  return dynamic_cast<CudaBackend&>(be).stream();
}

TEST_F(CudaBackendTest, ResidualAddRoundsOnceLikeTheHost) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_param_name(dt));
    Backend& gpu = cuda_backend(dt);
    std::mt19937 rng(8);
    for (std::int64_t n : {std::int64_t(1), std::int64_t(71 * 229), std::int64_t(1) << 22}) {
      const HostBuf a = random_buf(dt, n, rng, -4, 4), b = random_buf(dt, n, rng, -4, 4);
      HostBuf want(dt, n);
      for (std::int64_t i = 0; i < n; ++i) want.set(i, a.get(i) + b.get(i));
      DevBuf d_a(gpu, a), d_b(gpu, b), d_out(gpu, want.bytes());
      residual_forward_cuda(d_out.get(), d_a.get(), d_b.get(), n, dt, stream_of(gpu));
      EXPECT_TRUE(all_close("residual out", d_out.f32(dt, n), want.to_f32(), exact()));
      residual_forward_cuda(d_a.get(), d_a.get(), d_b.get(), n, dt, stream_of(gpu));  // in place
      EXPECT_TRUE(all_close("residual in place", d_a.f32(dt, n), want.to_f32(), exact()));
    }
  }
}

TEST_F(CudaBackendTest, CastsMatchDtypeHppBitForBitIncludingEdgeValues) {
  Backend& gpu = cuda_backend(DType::f32);
  const DType types[] = {DType::f32, DType::bf16, DType::f16};
  std::mt19937 rng(9);
  // Edge values: zeros, subnormals of both 16-bit formats, halfway cases, f16 overflow, inf, NaN.
  std::vector<float> edge = {0.0f,        -0.0f,    1.0f,     -1.5f,     65504.0f, 65520.0f,
                             1e5f,        -1e30f,   6e-8f,    3e-8f,     1e-40f,   1.00390625f,
                             1.01171875f, 2.9e-39f, INFINITY, -INFINITY, NAN,      0.333333343f};
  for (DType src : types) {
    for (DType dst : types) {
      SCOPED_TRACE(dtype_param_name(src) + " -> " + dtype_param_name(dst));
      const std::int64_t n = 100000;
      HostBuf in = random_buf(src, n, rng, -70000, 70000);
      for (std::size_t i = 0; i < edge.size(); ++i) in.set(std::int64_t(i), edge[i]);
      HostBuf want(dst, n);
      for (std::int64_t i = 0; i < n; ++i) want.set(i, in.get(i));
      DevBuf d_in(gpu, in), d_out(gpu, want.bytes());
      cast_cuda(d_out.get(), dst, d_in.get(), src, n, stream_of(gpu));
      const HostBuf got = d_out.download(dst, n);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.bytes()), 0)
          << all_close("cast", got.to_f32(), want.to_f32(), exact()).message();
    }
  }
}

// The overflow check of fp16 loss-scaled gradients: check_finite queues, take_nonfinite reads
// the backend's mapped flag once and clears it; a buffer past the first grid pass (grid-stride)
// and several buffers into one take.
TEST_F(CudaBackendTest, NonFiniteCheckFlagsInfAndNanAndClearsOnTake) {
  std::mt19937 rng(10);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_param_name(dt));
    Backend& gpu = cuda_backend(dt);
    const std::int64_t n = 3000001;
    HostBuf finite = random_buf(dt, n, rng, -60000, 60000);
    DevBuf d_finite(gpu, finite);
    EXPECT_FALSE(gpu.take_nonfinite());  // nothing checked
    gpu.check_finite(d_finite.get(), n);
    EXPECT_FALSE(gpu.take_nonfinite());
    const float big = dt == DType::f16 ? 70000.0f : INFINITY;  // fp16 overflows to inf
    for (float bad : {INFINITY, -INFINITY, NAN, big}) {
      HostBuf x = finite;
      x.set(n - 1, bad);
      DevBuf d_x(gpu, x);
      gpu.check_finite(d_finite.get(), n);
      gpu.check_finite(d_x.get(), n);
      gpu.check_finite(d_finite.get(), n);
      EXPECT_TRUE(gpu.take_nonfinite()) << bad;
      EXPECT_FALSE(gpu.take_nonfinite()) << "cleared by the take";
    }
  }
}

}  // namespace
}  // namespace trainmem::gputest
