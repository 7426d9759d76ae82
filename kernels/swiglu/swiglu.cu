// SwiGLU, forward and backward, on the GPU: one thread per element, grid-stride.
#include "common/cuda_common.cuh"
#include "swiglu/swiglu.hpp"
#include "swiglu/swiglu_kernels.cuh"
#include "swiglu/swiglu_math.hpp"

namespace trainmem {
namespace {

constexpr int kThreads = cuda::kElementwiseThreads;

}  // namespace

// ---------------------------------------------------------------- launchers

void swiglu_forward_cuda(void* out, const void* gate, const void* up, std::int64_t n, DType dt,
                         cudaStream_t stream) {
  cuda::require_fits(n, std::numeric_limits<std::int64_t>::max(), "swiglu_forward_cuda", "n");
  if (n == 0) return;
  dispatch_storage(dt, "swiglu_forward_cuda", [&](auto tag) {
    cuda::swiglu_forward_kernel<decltype(tag)>
        <<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(out, gate, up, n);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void swiglu_backward_cuda(void* dgate, void* dup, const void* dout, const void* gate,
                          const void* up, std::int64_t n, DType dt, cudaStream_t stream) {
  cuda::require_fits(n, std::numeric_limits<std::int64_t>::max(), "swiglu_backward_cuda", "n");
  if (n == 0) return;
  dispatch_storage(dt, "swiglu_backward_cuda", [&](auto tag) {
    cuda::swiglu_backward_kernel<decltype(tag)>
        <<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(dgate, dup, dout, gate, up, n);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace trainmem
