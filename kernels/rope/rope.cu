// RoPE, forward and backward, on the GPU: each thread rotates one pair (x_j, x_{j+d/2}) of
// one head vector at position t by angle t * inv_freq[j] (backward: by -angle). The angle is
// computed in fp32 as HuggingFace does (inv_freq rescaled under the RopeSpec's scaling, the
// shared rope_math.hpp code), with the accurate sinf/cosf (no fast math).
#include "common/cuda_common.cuh"
#include "rope/rope.hpp"
#include "rope/rope_kernels.cuh"
#include "rope/rope_math.hpp"
#include "trainmem/base/checked.hpp"

namespace trainmem {
namespace {

enum class Direction { forward, backward };

void launch(const char* op, void* q, void* k, std::int64_t b, std::int64_t s, std::int64_t a,
            std::int64_t kv, std::int64_t d, const RopeSpec& rope, DType dt, Direction dir,
            cudaStream_t stream) {
  const std::pair<std::int64_t, const char*> dims[] = {
      {b, "b"}, {s, "s"}, {a, "a"}, {kv, "kv"}, {d, "d"}};
  for (const auto& [value, name] : dims)
    cuda::require_fits(value, std::numeric_limits<std::int32_t>::max(), op, name);
  if (d % 2 != 0)
    throw InputError(std::string(op) + ": head dim d must be even for RoPE, got " +
                     std::to_string(d));
  const float sign = dir == Direction::forward ? 1.0f : -1.0f;
  const RopeFreqParams freq = rope_freq_params(rope);
  constexpr int kThreads = cuda::kElementwiseThreads;
  const std::pair<void*, std::int64_t> tensors[] = {{q, a}, {k, kv}};  // (b, s, heads, d) each
  for (const auto& [x, heads] : tensors) {
    const std::int64_t pairs = std::int64_t(checked_product(
        {std::uint64_t(b), std::uint64_t(s), std::uint64_t(heads), std::uint64_t(d / 2)}, op));
    if (pairs == 0) continue;
    dispatch_storage(dt, op, [&](auto tag) {
      cuda::rope_kernel<decltype(tag)><<<cuda::grid_for(pairs, kThreads), kThreads, 0, stream>>>(
          x, pairs, s, heads, d, freq, rope.positions, sign);
      TM_CUDA_CHECK_LAUNCH();
    });
  }
}

}  // namespace

// ---------------------------------------------------------------- launchers

void rope_forward_cuda(void* q, void* k, std::int64_t b, std::int64_t s, std::int64_t a,
                       std::int64_t kv, std::int64_t d, const RopeSpec& rope, DType dt,
                       cudaStream_t stream) {
  launch("rope_forward_cuda", q, k, b, s, a, kv, d, rope, dt, Direction::forward, stream);
}

void rope_backward_cuda(void* dq, void* dk, std::int64_t b, std::int64_t s, std::int64_t a,
                        std::int64_t kv, std::int64_t d, const RopeSpec& rope, DType dt,
                        cudaStream_t stream) {
  launch("rope_backward_cuda", dq, dk, b, s, a, kv, d, rope, dt, Direction::backward, stream);
}

}  // namespace trainmem
