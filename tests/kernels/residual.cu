// Residual add and casts on the GPU: one thread per element, grid-stride.
#include "common/cuda_common.cuh"
#include "residual.cuh"
#include "residual_kernels.cuh"

namespace trainmem {
namespace {

constexpr int kThreads = cuda::kElementwiseThreads;

template <class Dst>
void launch_cast(void* dst, const void* src, DType src_dt, std::int64_t N, cudaStream_t stream) {
  const unsigned grid = cuda::grid_for(N, kThreads);
  dispatch_storage(src_dt, "cast_cuda: source", [&](auto s) {
    cuda::cast_kernel<Dst, decltype(s)><<<grid, kThreads, 0, stream>>>(dst, src, N);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

// ---------------------------------------------------------------- launchers

void residual_forward_cuda(void* out, const void* inp1, const void* inp2, std::int64_t N, DType dt,
                           cudaStream_t stream) {
  cuda::require_fits(N, std::numeric_limits<std::int64_t>::max(), "residual_forward_cuda", "N");
  if (N == 0) return;
  dispatch_storage(dt, "residual_forward_cuda", [&](auto s) {
    cuda::residual_forward_kernel<decltype(s)>
        <<<cuda::grid_for(N, kThreads), kThreads, 0, stream>>>(out, inp1, inp2, N);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void cast_cuda(void* dst, DType dst_dt, const void* src, DType src_dt, std::int64_t N,
               cudaStream_t stream) {
  cuda::require_fits(N, std::numeric_limits<std::int64_t>::max(), "cast_cuda", "N");
  if (N == 0) return;
  dispatch_storage(dst_dt, "cast_cuda: destination",
                   [&](auto s) { launch_cast<decltype(s)>(dst, src, src_dt, N, stream); });
}

}  // namespace trainmem
