// Residual add and casts on the GPU: one thread per element, grid-stride.
#include "cuda_common.cuh"
#include "residual.cuh"

namespace trainmem {
namespace {

constexpr int kThreads = 256;

// ---------------------------------------------------------------- kernels

template <class S>
__global__ void residual_forward_kernel(void* out, const void* inp1, const void* inp2,
                                        std::int64_t N) {
  for (std::int64_t i = cuda::global_thread_index(); i < N; i += cuda::global_thread_count())
    S::store(out, i, S::load(inp1, i) + S::load(inp2, i));
}

template <class Dst, class Src>
__global__ void cast_kernel(void* dst, const void* src, std::int64_t N) {
  for (std::int64_t i = cuda::global_thread_index(); i < N; i += cuda::global_thread_count())
    Dst::store(dst, i, Src::load(src, i));
}

template <class Dst>
void launch_cast(void* dst, const void* src, DType src_dt, std::int64_t N, cudaStream_t stream) {
  const unsigned grid = cuda::grid_for(N, kThreads);
  TM_DISPATCH_STORAGE(src_dt, "cast_cuda: source",
                      cast_kernel<Dst, S><<<grid, kThreads, 0, stream>>>(dst, src, N);
                      TM_CUDA_CHECK_LAUNCH());
}

}  // namespace

// ---------------------------------------------------------------- launchers

void residual_forward_cuda(void* out, const void* inp1, const void* inp2, std::int64_t N, DType dt,
                           cudaStream_t stream) {
  cuda::require_fits(N, std::numeric_limits<std::int64_t>::max(), "residual_forward_cuda", "N");
  if (N == 0) return;
  TM_DISPATCH_STORAGE(dt, "residual_forward_cuda",
                      residual_forward_kernel<S>
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
