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
  TM_DISPATCH_STORAGE(src_dt, "cast_cuda: source",
                      cuda::cast_kernel<Dst, S><<<grid, kThreads, 0, stream>>>(dst, src, N);
                      TM_CUDA_CHECK_LAUNCH());
}

}  // namespace

// ---------------------------------------------------------------- launchers

void residual_forward_cuda(void* out, const void* inp1, const void* inp2, std::int64_t N, DType dt,
                           cudaStream_t stream) {
  cuda::require_fits(N, std::numeric_limits<std::int64_t>::max(), "residual_forward_cuda", "N");
  if (N == 0) return;
  TM_DISPATCH_STORAGE(dt, "residual_forward_cuda",
                      cuda::residual_forward_kernel<S>
                      <<<cuda::grid_for(N, kThreads), kThreads, 0, stream>>>(out, inp1, inp2, N);
                      TM_CUDA_CHECK_LAUNCH());
}

void cast_cuda(void* dst, DType dst_dt, const void* src, DType src_dt, std::int64_t N,
               cudaStream_t stream) {
  cuda::require_fits(N, std::numeric_limits<std::int64_t>::max(), "cast_cuda", "N");
  if (N == 0) return;
  TM_DISPATCH_STORAGE(dst_dt, "cast_cuda: destination",
                      launch_cast<S>(dst, src, src_dt, N, stream));
}

}  // namespace trainmem
