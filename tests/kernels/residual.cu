// Residual add and casts on the GPU: one thread per element, grid-stride.
#include "common/cuda_common.cuh"
#include "residual.cuh"
#include "residual_kernels.cuh"

namespace trainmem {
namespace {

constexpr int kThreads = cuda::kElementwiseThreads;

template <class Dst>
void launch_cast(void* dst, const void* src, DType src_dt, std::int64_t n, cudaStream_t stream) {
  const unsigned grid = cuda::grid_for(n, kThreads);
  dispatch_storage(src_dt, "cast_cuda: source", [&](auto tag) {
    cuda::cast_kernel<Dst, decltype(tag)><<<grid, kThreads, 0, stream>>>(dst, src, n);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

// ---------------------------------------------------------------- launchers

void residual_forward_cuda(void* out, const void* inp1, const void* inp2, std::int64_t n, DType dt,
                           cudaStream_t stream) {
  cuda::require_fits(n, std::numeric_limits<std::int64_t>::max(), "residual_forward_cuda", "n");
  if (n == 0) return;
  dispatch_storage(dt, "residual_forward_cuda", [&](auto tag) {
    cuda::residual_forward_kernel<decltype(tag)>
        <<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(out, inp1, inp2, n);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void cast_cuda(void* dst, DType dst_dt, const void* src, DType src_dt, std::int64_t n,
               cudaStream_t stream) {
  cuda::require_fits(n, std::numeric_limits<std::int64_t>::max(), "cast_cuda", "n");
  if (n == 0) return;
  dispatch_storage(dst_dt, "cast_cuda: destination",
                   [&](auto tag) { launch_cast<decltype(tag)>(dst, src, src_dt, n, stream); });
}

}  // namespace trainmem
