// Mixture of experts on the GPU (kernels in moe_kernels.cuh).
#include "common/cuda_common.cuh"
#include "moe/moe.hpp"
#include "moe/moe_kernels.cuh"

namespace trainmem {
namespace {

constexpr int kThreads = cuda::kElementwiseThreads;
constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

}  // namespace

void moe_route_cuda(float* probs, std::int32_t* idx, float* weight, std::int32_t* pos,
                    std::int32_t* offsets, const void* logits, std::int64_t n, std::int64_t E,
                    std::int64_t K, std::int64_t capacity, bool normalize, DType dt,
                    cudaStream_t stream) {
  cuda::require_fits(n * K, std::numeric_limits<std::int32_t>::max(), "moe_route_cuda", "n*K");
  if (n == 0) return;
  dispatch_storage(dt, "moe_route_cuda", [&](auto tag) {
    cuda::moe_route_kernel<decltype(tag)><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
        probs, idx, weight, logits, n, E, K, normalize);
    TM_CUDA_CHECK_LAUNCH();
  });
  cuda::moe_sort_kernel<<<1, 1, 0, stream>>>(pos, offsets, idx, n, E, K, capacity);
  TM_CUDA_CHECK_LAUNCH();
}

void moe_route_backward_cuda(void* dlogits, const float* dweight, const float* probs,
                             const std::int32_t* idx, const float* aux, std::int64_t n,
                             std::int64_t E, std::int64_t K, bool normalize, DType dt,
                             cudaStream_t stream) {
  cuda::require_fits(n, kMax, "moe_route_backward_cuda", "n");
  if (n == 0) return;
  dispatch_storage(dt, "moe_route_backward_cuda", [&](auto tag) {
    cuda::moe_route_backward_kernel<decltype(tag)>
        <<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(dlogits, dweight, probs, idx, aux, n,
                                                               E, K, normalize);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void moe_permute_cuda(void* rows, const void* x, const std::int32_t* pos, std::int64_t n,
                      std::int64_t K, std::int64_t h, DType dt, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_storage(dt, "moe_permute_cuda", [&](auto tag) {
    cuda::moe_permute_kernel<decltype(tag)>
        <<<cuda::grid_for(n * K * h, kThreads), kThreads, 0, stream>>>(rows, x, pos, n, K, h);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void moe_combine_cuda(void* out, const void* res, const void* rows, const float* weight,
                      const std::int32_t* pos, std::int64_t n, std::int64_t K, std::int64_t h,
                      DType dt, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_storage(dt, "moe_combine_cuda", [&](auto tag) {
    cuda::moe_combine_kernel<decltype(tag)>
        <<<cuda::grid_for(n * h, kThreads), kThreads, 0, stream>>>(out, res, rows, weight, pos, n,
                                                                   K, h);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void moe_combine_backward_cuda(void* drows, float* dweight, const void* dout, const void* rows,
                               const float* weight, const std::int32_t* pos, std::int64_t n,
                               std::int64_t K, std::int64_t h, DType dt, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_storage(dt, "moe_combine_backward_cuda", [&](auto tag) {
    cuda::moe_combine_backward_kernel<decltype(tag)>
        <<<cuda::grid_for(n * K, kThreads), kThreads, 0, stream>>>(drows, dweight, dout, rows,
                                                                   weight, pos, n, K, h);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void moe_gate_add_cuda(void* out, const void* y, const void* score, std::int64_t n, std::int64_t h,
                       DType dt, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_storage(dt, "moe_gate_add_cuda", [&](auto tag) {
    cuda::moe_gate_add_kernel<decltype(tag)>
        <<<cuda::grid_for(n * h, kThreads), kThreads, 0, stream>>>(out, y, score, n, h);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void moe_gate_backward_cuda(void* dy, void* dscore, const void* dout, const void* y,
                            const void* score, std::int64_t n, std::int64_t h, DType dt,
                            cudaStream_t stream) {
  if (n == 0) return;
  dispatch_storage(dt, "moe_gate_backward_cuda", [&](auto tag) {
    cuda::moe_gate_backward_kernel<decltype(tag)>
        <<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(dy, dscore, dout, y, score, n, h);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace trainmem
