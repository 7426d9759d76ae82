// Causal attention, eager: scores and probabilities materialised in probs (b, a, s, s) D.
//   forward:  probs = scale * q k^T (cuBLAS), causal softmax in place (zeros above the diagonal
//             and, under a sliding window, left of it), out = probs v (cuBLAS);
//   backward: dP = dout v^T into dprobs, dS = P * (dP - rowsum(P * dP)) in place,
//             dq = scale dS k, dk = scale sum_g dS^T q, dv = sum_g P^T dout.
// Heads: one (s, d) head of a (b, s, heads, d) tensor is a row-major matrix with ld heads*d, so
// every GEMM is a strided batch. GQA maps query head qh to kv head qh/g (g = a/kv); dk and dv sum
// over the g query heads of a group by GEMMs with beta = 1 after the first. The batching of
// heads into cuBLAS calls is in attention_heads.hpp.
#include <cublas_v2.h>

#include "attention/attention.hpp"
#include "attention/attention_eager_kernels.cuh"
#include "attention/attention_heads.hpp"
#include "attention/attention_math.hpp"
#include "common/cublas_check.hpp"
#include "common/cuda_common.cuh"
#include "matmul/matmul.hpp"
#include "trainmem/base/checked.hpp"

namespace trainmem {
namespace {

// Byte offset helpers.
const void* at(const void* p, std::int64_t elems, std::size_t width) {
  return static_cast<const char*>(p) + std::size_t(elems) * width;
}
void* at(void* p, std::int64_t elems, std::size_t width) {
  return static_cast<char*>(p) + std::size_t(elems) * width;
}

void check_handle_stream(cublasHandle_t handle, cudaStream_t stream, const char* op) {
  cudaStream_t bound = nullptr;
  TM_CUBLAS_CHECK(cublasGetStream(handle, &bound));
  if (bound != stream)
    throw Error(std::string(op) + ": the cuBLAS handle is bound to another stream");
}

}  // namespace

// ---------------------------------------------------------------- launchers

void attention_eager_forward_cuda(void* out, void* probs, const void* q, const void* k,
                                  const void* v, std::int64_t b, std::int64_t s, std::int64_t a,
                                  std::int64_t kv, std::int64_t d, std::int64_t window, DType dt,
                                  cublasHandle_t handle, cudaStream_t stream) {
  const char* op = "attention_eager_forward_cuda";
  cuda::check_attention_dims(op, b, s, a, kv, d, window);
  checked_product({std::uint64_t(b), std::uint64_t(a), std::uint64_t(s), std::uint64_t(s)}, op);
  check_handle_stream(handle, stream, op);
  const std::size_t w = dtype_size(dt);
  const float scale = attention_scale<float>(d);
  const HeadPlan plan = plan_attention_heads(b, s, a, kv, d);
  // probs (s,s per head) = scale * q (s,d; ld a*d) . k^T (k: s,d; ld kv*d)
  for (const HeadCall& c : plan.calls) {
    matmul_strided_batched_cuda(at(probs, c.s_off, w), s, plan.s_stride,
                                {at(q, c.q_off, w), a * d, plan.q_stride},
                                {at(k, c.kv_off, w), kv * d, plan.kv_stride}, s, s, d, Trans::no,
                                Trans::yes, scale, 0.0f, plan.batch, dt, handle);
  }
  const std::int64_t rows = b * a * s;
  const cuda::LaunchShape sm = cuda::causal_softmax_launch(rows, op);
  dispatch_storage(dt, op, [&](auto tag) {
    cuda::causal_softmax_kernel<decltype(tag)>
        <<<cuda::grid_of(sm), cuda::block_of(sm), 0, stream>>>(probs, rows, s, window);
    TM_CUDA_CHECK_LAUNCH();
  });
  // out (s,d; ld a*d) = probs (s, s) . v (s,d; ld kv*d)
  for (const HeadCall& c : plan.calls) {
    matmul_strided_batched_cuda(at(out, c.q_off, w), a * d, plan.q_stride,
                                {at(probs, c.s_off, w), s, plan.s_stride},
                                {at(v, c.kv_off, w), kv * d, plan.kv_stride}, s, d, s, Trans::no,
                                Trans::no, 1.0f, 0.0f, plan.batch, dt, handle);
  }
}

void attention_eager_backward_cuda(void* dq, void* dk, void* dv, void* dprobs, const void* dout,
                                   const void* q, const void* k, const void* v, const void* probs,
                                   std::int64_t b, std::int64_t s, std::int64_t a, std::int64_t kv,
                                   std::int64_t d, std::int64_t window, DType dt,
                                   cublasHandle_t handle, cudaStream_t stream) {
  const char* op = "attention_eager_backward_cuda";
  cuda::check_attention_dims(op, b, s, a, kv, d, window);
  checked_product({std::uint64_t(b), std::uint64_t(a), std::uint64_t(s), std::uint64_t(s)}, op);
  if (dprobs == nullptr) throw InputError(std::string(op) + ": dprobs scratch is required");
  check_handle_stream(handle, stream, op);
  const std::size_t w = dtype_size(dt);
  const float scale = attention_scale<float>(d);
  const HeadPlan plan = plan_attention_heads(b, s, a, kv, d);
  // dP (s, s) = dout (s,d; ld a*d) . v^T
  for (const HeadCall& c : plan.calls) {
    matmul_strided_batched_cuda(at(dprobs, c.s_off, w), s, plan.s_stride,
                                {at(dout, c.q_off, w), a * d, plan.q_stride},
                                {at(v, c.kv_off, w), kv * d, plan.kv_stride}, s, s, d, Trans::no,
                                Trans::yes, 1.0f, 0.0f, plan.batch, dt, handle);
  }
  const std::int64_t rows = b * a * s;
  const cuda::LaunchShape sm = cuda::causal_softmax_launch(rows, op);
  dispatch_storage(dt, op, [&](auto tag) {
    cuda::causal_softmax_backward_kernel<decltype(tag)>
        <<<cuda::grid_of(sm), cuda::block_of(sm), 0, stream>>>(dprobs, probs, rows, s, window);
    TM_CUDA_CHECK_LAUNCH();
  });
  for (const HeadCall& c : plan.calls) {
    const float beta = c.first_of_group ? 0.0f : 1.0f;
    // dq (s, d) = scale * dS (s, s) . k (s, d)
    matmul_strided_batched_cuda(at(dq, c.q_off, w), a * d, plan.q_stride,
                                {at(dprobs, c.s_off, w), s, plan.s_stride},
                                {at(k, c.kv_off, w), kv * d, plan.kv_stride}, s, d, s, Trans::no,
                                Trans::no, scale, 0.0f, plan.batch, dt, handle);
    // dk (s, d) (+)= scale * dS^T . q
    matmul_strided_batched_cuda(at(dk, c.kv_off, w), kv * d, plan.kv_stride,
                                {at(dprobs, c.s_off, w), s, plan.s_stride},
                                {at(q, c.q_off, w), a * d, plan.q_stride}, s, d, s, Trans::yes,
                                Trans::no, scale, beta, plan.batch, dt, handle);
    // dv (s, d) (+)= P^T . dout
    matmul_strided_batched_cuda(at(dv, c.kv_off, w), kv * d, plan.kv_stride,
                                {at(probs, c.s_off, w), s, plan.s_stride},
                                {at(dout, c.q_off, w), a * d, plan.q_stride}, s, d, s, Trans::yes,
                                Trans::no, 1.0f, beta, plan.batch, dt, handle);
  }
}

}  // namespace trainmem
