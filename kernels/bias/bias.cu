// Bias add and its backward on the GPU. Forward: one thread per element, grid-stride. Backward:
// per 32 columns a (32, 16) block sums strided rows in fp32 and adds the 16 partials in a fixed
// order (bias_math.hpp), the CPU reference's order: the same bits, no atomics.
#include <string>

#include "bias/bias.hpp"
#include "bias/bias_kernels.cuh"
#include "common/cuda_common.cuh"
#include "trainmem/base/checked.hpp"

namespace trainmem {
namespace {

void check_dims(const char* op, std::int64_t n, std::int64_t c) {
  if (n < 0) throw InputError(std::string(op) + ": n must be >= 0, got " + std::to_string(n));
  if (c < 0) throw InputError(std::string(op) + ": c must be >= 0, got " + std::to_string(c));
  checked_product({std::uint64_t(n), std::uint64_t(c)}, op);
}

}  // namespace

// ---------------------------------------------------------------- launchers

void bias_forward_cuda(void* out, const void* bias, std::int64_t n, std::int64_t c, DType dt,
                       cudaStream_t stream) {
  const char* op = "bias_forward_cuda";
  check_dims(op, n, c);
  if (n == 0 || c == 0) return;
  const std::int64_t total = n * c;
  constexpr int kThreads = cuda::kElementwiseThreads;
  dispatch_storage(dt, op, [&](auto tag) {
    cuda::bias_forward_kernel<decltype(tag)>
        <<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(out, bias, total, c);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void bias_backward_cuda(void* dbias, const void* dout, std::int64_t n, std::int64_t c, DType dt,
                        cudaStream_t stream) {
  const char* op = "bias_backward_cuda";
  check_dims(op, n, c);
  if (n == 0 || c == 0) return;
  const cuda::LaunchShape shape = cuda::bias_backward_launch(c, op);
  dispatch_storage(dt, op, [&](auto tag) {
    cuda::bias_backward_kernel<decltype(tag)>
        <<<cuda::grid_of(shape), cuda::block_of(shape), 0, stream>>>(dbias, dout, n, c);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace trainmem
