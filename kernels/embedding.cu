// Token embedding, forward and backward, on the GPU.
// Forward: out[n, c] = wte[tokens[n], c]. Backward: dwte[v, c] += sum over rows n with
// tokens[n] == v of dout[n, c], in fp32 starting from dwte, in position order, rounded once
// (the same sequence as embedding_cpu: bit-identical results).
#include "cuda_common.cuh"
#include "embedding.cuh"
#include "embedding_kernels.cuh"
#include "trainmem/checked.hpp"

namespace trainmem {
namespace {

void check_dims(const char* op, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t V) {
  cuda::require_fits(B, cuda::kMaxGridX, op, "B");
  cuda::require_fits(T, cuda::kMaxGridX, op, "T");
  cuda::require_fits(C, std::numeric_limits<std::int64_t>::max(), op, "C");
  cuda::require_fits(V, std::numeric_limits<std::int32_t>::max(), op, "V");
}

}  // namespace

// ---------------------------------------------------------------- launchers

void embedding_forward_cuda(void* out, const std::int32_t* tokens, const void* wte, std::int64_t B,
                            std::int64_t T, std::int64_t C, std::int64_t V, DType dt,
                            cudaStream_t stream) {
  check_dims("embedding_forward_cuda", B, T, C, V);
  const std::int64_t N = std::int64_t(checked_mul(B, T, "embedding_forward_cuda: B*T"));
  const std::int64_t total = std::int64_t(checked_mul(N, C, "embedding_forward_cuda: B*T*C"));
  if (total == 0) return;
  constexpr int kThreads = cuda::kElementwiseThreads;
  TM_DISPATCH_STORAGE(
      dt, "embedding_forward_cuda",
      cuda::embedding_forward_kernel<S>
      <<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(out, tokens, wte, N, C, V);
      TM_CUDA_CHECK_LAUNCH());
}

void embedding_backward_cuda(void* dwte, const void* dout, const std::int32_t* tokens,
                             std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t V,
                             DType dt, cudaStream_t stream) {
  check_dims("embedding_backward_cuda", B, T, C, V);
  const std::int64_t N = std::int64_t(checked_mul(B, T, "embedding_backward_cuda: B*T"));
  if (N == 0 || C == 0) return;
  const cuda::LaunchShape L = cuda::embedding_backward_launch(N, C, "embedding_backward_cuda");
  TM_DISPATCH_STORAGE(
      dt, "embedding_backward_cuda",
      cuda::embedding_backward_kernel<S>
      <<<cuda::grid_of(L), cuda::block_of(L), 0, stream>>>(dwte, dout, tokens, N, C, V);
      TM_CUDA_CHECK_LAUNCH());
}

}  // namespace trainmem
