// LoRA dropout on the GPU: one thread per element, grid-stride.
#include "common/cuda_common.cuh"
#include "dropout/dropout.hpp"
#include "dropout/dropout_kernels.cuh"

namespace trainmem {
namespace {

constexpr int kThreads = cuda::kElementwiseThreads;

}  // namespace

void dropout_mask_cuda(std::uint8_t* mask, std::int64_t n, float p, std::uint64_t seed,
                       std::uint64_t stream, cudaStream_t cuda_stream) {
  cuda::require_fits(n, std::numeric_limits<std::int64_t>::max(), "dropout_mask_cuda", "n");
  if (n == 0) return;
  cuda::dropout_mask_kernel<<<cuda::grid_for(n, kThreads), kThreads, 0, cuda_stream>>>(
      mask, n, p, seed, stream);
  TM_CUDA_CHECK_LAUNCH();
}

void dropout_apply_cuda(void* out, const void* x, const std::uint8_t* mask, std::int64_t n,
                        float scale, bool accumulate, DType dt, cudaStream_t cuda_stream) {
  cuda::require_fits(n, std::numeric_limits<std::int64_t>::max(), "dropout_apply_cuda", "n");
  if (n == 0) return;
  dispatch_storage(dt, "dropout_apply_cuda", [&](auto tag) {
    cuda::dropout_apply_kernel<decltype(tag)>
        <<<cuda::grid_for(n, kThreads), kThreads, 0, cuda_stream>>>(out, x, mask, n, scale,
                                                                    accumulate);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace trainmem
