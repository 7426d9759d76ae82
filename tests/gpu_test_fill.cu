// The fill and axpy kernels on a GPU against values computed on the host, at sizes around
// the block and grid boundaries. Proves the CUDA build, link, launch and skip path.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gpu_helpers.hpp"
#include "kernels/fill.cuh"
#include "trainmem/base/cuda_check.hpp"

namespace trainmem {
namespace {

class FillKernels : public ::testing::TestWithParam<std::int64_t> {
 protected:
  void SetUp() override {
    require_cuda_device();
    TM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) TM_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
  }
  cudaStream_t stream_ = nullptr;
};

TEST_P(FillKernels, FillThenAxpyMatchesHost) {
  const std::int64_t N = GetParam();
  const std::size_t bytes = static_cast<std::size_t>(N) * sizeof(float);
  float *x = nullptr, *y = nullptr;
  TM_CUDA_CHECK(cudaMalloc(&x, bytes));
  TM_CUDA_CHECK(cudaMalloc(&y, bytes));

  // x (N) = host pattern; y (N) = 1.5 by the fill kernel; y += -0.75 * x by axpy.
  std::vector<float> hx(N);
  for (std::int64_t n = 0; n < N; ++n) hx[n] = std::sin(0.001f * float(n)) * 3.0f + float(n % 7);
  TM_CUDA_CHECK(cudaMemcpyAsync(x, hx.data(), bytes, cudaMemcpyHostToDevice, stream_));
  fill_f32(y, 1.5f, N, stream_);

  std::vector<float> hy(N, -1.0f);
  TM_CUDA_CHECK(cudaMemcpyAsync(hy.data(), y, bytes, cudaMemcpyDeviceToHost, stream_));
  TM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (std::int64_t n = 0; n < N; ++n) ASSERT_EQ(hy[n], 1.5f) << "fill, first mismatch at " << n;

  axpy_f32(y, x, -0.75f, N, stream_);
  TM_CUDA_CHECK(cudaMemcpyAsync(hy.data(), y, bytes, cudaMemcpyDeviceToHost, stream_));
  TM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (std::int64_t n = 0; n < N; ++n) {
    const float expected = std::fma(-0.75f, hx[n], 1.5f);  // the kernel's fmaf, bit for bit
    ASSERT_EQ(hy[n], expected) << "axpy, first mismatch at " << n;
  }
  TM_CUDA_CHECK(cudaFree(x));
  TM_CUDA_CHECK(cudaFree(y));
}

// 1, a partial block, exact blocks, and more blocks than the grid cap (grid-stride loop).
INSTANTIATE_TEST_SUITE_P(Sizes, FillKernels,
                         ::testing::Values(1, 255, 256, 257, 4099, 65535LL * 256 + 1000));

}  // namespace
}  // namespace trainmem
