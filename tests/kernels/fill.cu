// fill: out = value; axpy: y += alpha * x. fp32, grid-stride loops over n elements.
#include "fill.cuh"
#include "trainmem/base/cuda_check.hpp"

namespace trainmem {
namespace {

// ---------------------------------------------------------------- kernels

__global__ void fill_f32_kernel(float* out, float value, std::int64_t n) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride)
    out[e] = value;
}

__global__ void axpy_f32_kernel(float* y, const float* x, float alpha, std::int64_t n) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride)
    y[e] = fmaf(alpha, x[e], y[e]);
}

constexpr int kBlock = 256;
constexpr std::int64_t kMaxGrid = 65535;

unsigned grid_for(std::int64_t n) {
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
}

}  // namespace

// ---------------------------------------------------------------- launchers

void fill_f32(float* out, float value, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  fill_f32_kernel<<<grid_for(n), kBlock, 0, stream>>>(out, value, n);
  TM_CUDA_CHECK_LAUNCH();
}

void axpy_f32(float* y, const float* x, float alpha, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  axpy_f32_kernel<<<grid_for(n), kBlock, 0, stream>>>(y, x, alpha, n);
  TM_CUDA_CHECK_LAUNCH();
}

}  // namespace trainmem
