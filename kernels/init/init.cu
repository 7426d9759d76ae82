// Parameter initialisation on the GPU: one thread per element, grid-stride.
#include "common/cuda_common.cuh"
#include "init/init.hpp"
#include "init/init_kernels.cuh"

namespace trainmem {
namespace {
constexpr int kThreads = cuda::kElementwiseThreads;
}  // namespace

void init_param_cuda(void* dst, float* master, std::int64_t N, const ParamInit& init, DType dt,
                     cudaStream_t stream) {
  cuda::require_fits(N, std::numeric_limits<std::int64_t>::max(), "init_param_cuda", "N");
  if (N == 0) return;
  dispatch_storage(dt, "init_param_cuda", [&](auto s) {
    cuda::init_param_kernel<decltype(s)>
        <<<cuda::grid_for(N, kThreads), kThreads, 0, stream>>>(dst, master, N, init);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace trainmem
