// Non-finite check on the GPU: one grid-stride pass that raises a flag (kernel in
// nonfinite_kernels.cuh). No allocation, no synchronisation: the caller reads the flag.
#include "common/cuda_common.cuh"
#include "nonfinite/nonfinite.hpp"
#include "nonfinite/nonfinite_kernels.cuh"

namespace trainmem {
namespace {

constexpr int kThreads = cuda::kElementwiseThreads;

}  // namespace

void flag_nonfinite_cuda(unsigned* flag, const void* x, std::int64_t n, DType dt,
                         cudaStream_t stream) {
  cuda::require_fits(n, std::numeric_limits<std::int64_t>::max(), "flag_nonfinite_cuda", "n");
  if (n == 0) return;
  dispatch_storage(dt, "flag_nonfinite_cuda", [&](auto tag) {
    cuda::nonfinite_flag_kernel<decltype(tag)>
        <<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(flag, x, n);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace trainmem
