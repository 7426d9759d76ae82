// Ring attention's CUDA launchers (kernels in attention_ring_kernels.cuh): the checks the CPU
// reference makes, then one grid-stride launch per pass.
#include "attention/attention_ring.hpp"
#include "attention/attention_ring_kernels.cuh"
#include "common/cuda_common.cuh"

namespace trainmem {
namespace {

constexpr int kThreads = 128;

}  // namespace

void attention_ring_forward_cuda(float* acc, float* lse, const void* q, const void* k,
                                 const void* v, std::int64_t b, std::int64_t sq, std::int64_t sk,
                                 std::int64_t a, std::int64_t kv, std::int64_t d,
                                 std::int64_t window, SeqPositions qpos, SeqPositions kpos,
                                 bool first, DType dt, cudaStream_t stream) {
  const char* op = "attention_ring_forward_cuda";
  const RingShape x = check_ring_shape(op, b, sq, sk, a, kv, d, window, kRingMaxHeadDim);
  dispatch_storage(dt, op, [&](auto tag) {
    cuda::ring_forward_kernel<decltype(tag)>
        <<<cuda::grid_for(b * a * sq, kThreads), kThreads, 0, stream>>>(acc, lse, q, k, v, x, qpos,
                                                                        kpos, first);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void attention_ring_backward_cuda(float* dq, float* dk, float* dv, float* delta, const void* dout,
                                  const void* q, const void* k, const void* v, const void* out,
                                  const float* lse, std::int64_t b, std::int64_t sq,
                                  std::int64_t sk, std::int64_t a, std::int64_t kv, std::int64_t d,
                                  std::int64_t window, SeqPositions qpos, SeqPositions kpos,
                                  bool first, DType dt, cudaStream_t stream) {
  const char* op = "attention_ring_backward_cuda";
  const RingShape x = check_ring_shape(op, b, sq, sk, a, kv, d, window, kRingMaxHeadDim);
  dispatch_storage(dt, op, [&](auto tag) {
    using S = decltype(tag);
    cuda::ring_dq_kernel<S><<<cuda::grid_for(b * a * sq, kThreads), kThreads, 0, stream>>>(
        dq, delta, dout, q, k, v, out, lse, x, qpos, kpos, first);
    TM_CUDA_CHECK_LAUNCH();
    cuda::ring_dkdv_kernel<S><<<cuda::grid_for(b * kv * sk, kThreads), kThreads, 0, stream>>>(
        dk, dv, delta, dout, q, k, v, lse, x, qpos, kpos);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void round_from_f32_cuda(void* out, const float* in, std::int64_t n, DType dt,
                         cudaStream_t stream) {
  if (n <= 0) return;
  dispatch_storage(dt, "round_from_f32_cuda", [&](auto tag) {
    cuda::round_from_f32_kernel<decltype(tag)>
        <<<cuda::grid_for(n, cuda::kElementwiseThreads), cuda::kElementwiseThreads, 0, stream>>>(
            out, in, n);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace trainmem
