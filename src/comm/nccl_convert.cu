// The conversions of nccl_convert.hpp: one thread per element (grid-stride), with dtype.hpp's
// bit-exact conversions (the same as the cpu backend's).
#include "nccl_convert.hpp"
#include "trainmem/base/cuda_check.hpp"

namespace trainmem::comm {
namespace {

__global__ void to_f32_kernel(const void* in, float* out, std::size_t n, DType t) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = load_as_f32(in, i, t);
}

__global__ void from_f32_kernel(const float* in, void* out, std::size_t n, DType t) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    store_from_f32(out, i, t, in[i]);
}

unsigned grid_for(std::size_t n) {
  const std::size_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 65535 ? (blocks ? blocks : 1) : 65535);
}

}  // namespace

void to_f32_async(const void* in, float* out, std::size_t n, DType t, cudaStream_t stream) {
  if (n == 0) return;
  to_f32_kernel<<<grid_for(n), 256, 0, stream>>>(in, out, n, t);
  TM_CUDA_CHECK_LAUNCH();
}

void from_f32_async(const float* in, void* out, std::size_t n, DType t, cudaStream_t stream) {
  if (n == 0) return;
  from_f32_kernel<<<grid_for(n), 256, 0, stream>>>(in, out, n, t);
  TM_CUDA_CHECK_LAUNCH();
}

}  // namespace trainmem::comm
