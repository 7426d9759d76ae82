// RoPE, forward and backward, on the GPU: each thread rotates one pair (x_j, x_{j+HD/2}) of
// one head vector at position t by angle t * inv_freq[j] (backward: by -angle). The angle is
// computed in fp32 as HuggingFace does, with the accurate sinf/cosf (no fast math).
#include "common/cuda_common.cuh"
#include "rope/rope.hpp"
#include "rope/rope_kernels.cuh"
#include "rope/rope_math.hpp"
#include "trainmem/checked.hpp"

namespace trainmem {
namespace {

enum class Direction { forward, backward };

void launch(const char* op, void* q, void* k, std::int64_t B, std::int64_t T, std::int64_t NH,
            std::int64_t NKV, std::int64_t HD, double theta, DType dt, Direction dir,
            cudaStream_t stream) {
  const std::pair<std::int64_t, const char*> dims[] = {
      {B, "B"}, {T, "T"}, {NH, "NH"}, {NKV, "NKV"}, {HD, "HD"}};
  for (const auto& [value, name] : dims)
    cuda::require_fits(value, std::numeric_limits<std::int32_t>::max(), op, name);
  if (HD % 2 != 0)
    throw InputError(std::string(op) + ": head dim HD must be even for RoPE, got " +
                     std::to_string(HD));
  const float sign = dir == Direction::forward ? 1.0f : -1.0f;
  constexpr int kThreads = cuda::kElementwiseThreads;
  const std::pair<void*, std::int64_t> tensors[] = {{q, NH}, {k, NKV}};  // (B,T,H,HD) each
  for (const auto& [x, H] : tensors) {
    const std::int64_t pairs = std::int64_t(checked_product(
        {std::uint64_t(B), std::uint64_t(T), std::uint64_t(H), std::uint64_t(HD / 2)}, op));
    if (pairs == 0) continue;
    dispatch_storage(dt, op, [&](auto s) {
      cuda::rope_kernel<decltype(s)><<<cuda::grid_for(pairs, kThreads), kThreads, 0, stream>>>(
          x, pairs, T, H, HD, float(theta), sign);
      TM_CUDA_CHECK_LAUNCH();
    });
  }
}

}  // namespace

// ---------------------------------------------------------------- launchers

void rope_forward_cuda(void* q, void* k, std::int64_t B, std::int64_t T, std::int64_t NH,
                       std::int64_t NKV, std::int64_t HD, double theta, DType dt,
                       cudaStream_t stream) {
  launch("rope_forward_cuda", q, k, B, T, NH, NKV, HD, theta, dt, Direction::forward, stream);
}

void rope_backward_cuda(void* dq, void* dk, std::int64_t B, std::int64_t T, std::int64_t NH,
                        std::int64_t NKV, std::int64_t HD, double theta, DType dt,
                        cudaStream_t stream) {
  launch("rope_backward_cuda", dq, dk, B, T, NH, NKV, HD, theta, dt, Direction::backward, stream);
}

}  // namespace trainmem
