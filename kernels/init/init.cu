// Parameter initialisation on the GPU: one thread per element, grid-stride.
#include "common/cuda_common.cuh"
#include "init/init.hpp"
#include "init/init_kernels.cuh"

namespace trainmem {
namespace {
constexpr int kThreads = cuda::kElementwiseThreads;
}  // namespace

void init_param_cuda(void* dst, float* master, std::int64_t n, const ParamInit& init, DType dt,
                     cudaStream_t stream) {
  cuda::require_fits(n, std::numeric_limits<std::int64_t>::max(), "init_param_cuda", "n");
  if (n == 0) return;
  dispatch_storage(dt, "init_param_cuda", [&](auto tag) {
    cuda::init_param_kernel<decltype(tag)>
        <<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(dst, master, n, init);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace trainmem
