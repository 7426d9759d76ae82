// fill: out = value; axpy: y += alpha * x. fp32, grid-stride loops over N elements.
#include "fill.cuh"
#include "trainmem/cuda_check.hpp"

namespace trainmem {
namespace {

// ---------------------------------------------------------------- kernels

__global__ void fill_f32_kernel(float* out, float value, std::int64_t N) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t n = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += stride)
    out[n] = value;
}

__global__ void axpy_f32_kernel(float* y, const float* x, float alpha, std::int64_t N) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t n = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += stride)
    y[n] = fmaf(alpha, x[n], y[n]);
}

constexpr int kBlock = 256;
constexpr std::int64_t kMaxGrid = 65535;

unsigned grid_for(std::int64_t N) {
  const std::int64_t blocks = (N + kBlock - 1) / kBlock;
  return static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
}

}  // namespace

// ---------------------------------------------------------------- launchers

void fill_f32(float* out, float value, std::int64_t N, cudaStream_t stream) {
  if (N <= 0) return;
  fill_f32_kernel<<<grid_for(N), kBlock, 0, stream>>>(out, value, N);
  TM_CUDA_CHECK_LAUNCH();
}

void axpy_f32(float* y, const float* x, float alpha, std::int64_t N, cudaStream_t stream) {
  if (N <= 0) return;
  axpy_f32_kernel<<<grid_for(N), kBlock, 0, stream>>>(y, x, alpha, N);
  TM_CUDA_CHECK_LAUNCH();
}

}  // namespace trainmem
