// Cross-entropy, forward and backward, on the GPU. One block per row of logits: the forward
// folds the row into an online log-sum-exp state per thread (one pass over V), merges the
// states across the block, then writes lse and the loss; the backward writes
// scale * (exp(x - lse) - onehot) per element.
#include "common/cuda_common.cuh"
#include "cross_entropy/cross_entropy.hpp"
#include "cross_entropy/cross_entropy_kernels.cuh"
#include "cross_entropy/cross_entropy_math.hpp"
#include "trainmem/base/checked.hpp"

namespace trainmem {
namespace {

using cuda::kCeBwdThreads;
using cuda::kCeFwdThreads;

void check_dims(const char* op, std::int64_t n, std::int64_t V) {
  cuda::require_fits(n, cuda::kMaxGridX, op, "n (rows)");
  cuda::require_fits(V, std::numeric_limits<std::int32_t>::max(), op, "V");
  checked_mul(n, V, op);
}

}  // namespace

// ---------------------------------------------------------------- launchers

void cross_entropy_forward_cuda(float* losses, float* lse, const void* logits,
                                const std::int32_t* targets, std::int64_t n, std::int64_t V,
                                DType dt, cudaStream_t stream) {
  check_dims("cross_entropy_forward_cuda", n, V);
  if (n == 0) return;
  cuda::require_positive(V, "cross_entropy_forward_cuda", "V");
  const cuda::LaunchShape L =
      cuda::cross_entropy_launch(n, kCeFwdThreads, "cross_entropy_forward_cuda");
  dispatch_storage(dt, "cross_entropy_forward_cuda", [&](auto tag) {
    cuda::cross_entropy_forward_kernel<decltype(tag)>
        <<<cuda::grid_of(L), cuda::block_of(L), 0, stream>>>(losses, lse, logits, targets, V);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_backward_cuda(void* dlogits, const void* logits, const float* lse,
                                 const std::int32_t* targets, std::int64_t n, std::int64_t V,
                                 float scale, DType dt, cudaStream_t stream) {
  check_dims("cross_entropy_backward_cuda", n, V);
  if (n == 0 || V == 0) return;
  const cuda::LaunchShape L =
      cuda::cross_entropy_launch(n, kCeBwdThreads, "cross_entropy_backward_cuda");
  dispatch_storage(dt, "cross_entropy_backward_cuda", [&](auto tag) {
    cuda::cross_entropy_backward_kernel<decltype(tag)>
        <<<cuda::grid_of(L), cuda::block_of(L), 0, stream>>>(dlogits, logits, lse, targets, V,
                                                             scale);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace trainmem
