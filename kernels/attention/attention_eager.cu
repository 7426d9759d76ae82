// Causal attention, eager: scores and probabilities materialised in probs (B,NH,T,T) D.
//   forward:  probs = scale * q k^T (cuBLAS), causal softmax in place, out = probs v (cuBLAS);
//   backward: dP = dout v^T into dprobs, dS = P * (dP - rowsum(P * dP)) in place,
//             dq = scale dS k, dk = scale sum_g dS^T q, dv = sum_g P^T dout.
// Heads: a (T,HD) head of a (B,T,H,HD) tensor is a row-major matrix with ld H*HD, so every
// GEMM is a strided batch. GQA maps query head h to kv head h/g (g = NH/NKV); dk and dv sum
// over the g query heads of a group by GEMMs with beta = 1 after the first. The batching of
// heads into cuBLAS calls is in attention_heads.hpp.
#include <cublas_v2.h>

#include "attention/attention.hpp"
#include "attention/attention_eager_kernels.cuh"
#include "attention/attention_heads.hpp"
#include "attention/attention_math.hpp"
#include "common/cuda_common.cuh"
#include "matmul/matmul.hpp"
#include "trainmem/checked.hpp"

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
                                  const void* v, std::int64_t B, std::int64_t T, std::int64_t NH,
                                  std::int64_t NKV, std::int64_t HD, DType dt,
                                  cublasHandle_t handle, cudaStream_t stream) {
  const char* op = "attention_eager_forward_cuda";
  cuda::check_attention_dims(op, B, T, NH, NKV, HD);
  checked_product({std::uint64_t(B), std::uint64_t(NH), std::uint64_t(T), std::uint64_t(T)}, op);
  check_handle_stream(handle, stream, op);
  const std::size_t w = dtype_size(dt);
  const float scale = attention_scale<float>(HD);
  const HeadPlan plan = plan_attention_heads(B, T, NH, NKV, HD);
  // probs (T,T per head) = scale * q (T,HD; ld NH*HD) . k^T (k: T,HD; ld NKV*HD)
  for (const HeadCall& c : plan.calls) {
    matmul_strided_batched_cuda(at(probs, c.s_off, w), T, plan.s_stride,
                                {at(q, c.q_off, w), NH * HD, plan.q_stride},
                                {at(k, c.kv_off, w), NKV * HD, plan.kv_stride}, T, T, HD, Trans::no,
                                Trans::yes, scale, 0.0f, plan.batch, dt, handle);
  }
  const std::int64_t rows = B * NH * T;
  const cuda::LaunchShape sm = cuda::causal_softmax_launch(rows, op);
  dispatch_storage(dt, op, [&](auto s) {
    cuda::causal_softmax_kernel<decltype(s)>
        <<<cuda::grid_of(sm), cuda::block_of(sm), 0, stream>>>(probs, rows, T);
    TM_CUDA_CHECK_LAUNCH();
  });
  // out (T,HD; ld NH*HD) = probs (T,T) . v (T,HD; ld NKV*HD)
  for (const HeadCall& c : plan.calls) {
    matmul_strided_batched_cuda(at(out, c.q_off, w), NH * HD, plan.q_stride,
                                {at(probs, c.s_off, w), T, plan.s_stride},
                                {at(v, c.kv_off, w), NKV * HD, plan.kv_stride}, T, HD, T, Trans::no,
                                Trans::no, 1.0f, 0.0f, plan.batch, dt, handle);
  }
}

void attention_eager_backward_cuda(void* dq, void* dk, void* dv, void* dprobs, const void* dout,
                                   const void* q, const void* k, const void* v, const void* probs,
                                   std::int64_t B, std::int64_t T, std::int64_t NH,
                                   std::int64_t NKV, std::int64_t HD, DType dt,
                                   cublasHandle_t handle, cudaStream_t stream) {
  const char* op = "attention_eager_backward_cuda";
  cuda::check_attention_dims(op, B, T, NH, NKV, HD);
  checked_product({std::uint64_t(B), std::uint64_t(NH), std::uint64_t(T), std::uint64_t(T)}, op);
  if (dprobs == nullptr) throw InputError(std::string(op) + ": dprobs scratch is required");
  check_handle_stream(handle, stream, op);
  const std::size_t w = dtype_size(dt);
  const float scale = attention_scale<float>(HD);
  const HeadPlan plan = plan_attention_heads(B, T, NH, NKV, HD);
  // dP (T,T) = dout (T,HD; ld NH*HD) . v^T
  for (const HeadCall& c : plan.calls) {
    matmul_strided_batched_cuda(at(dprobs, c.s_off, w), T, plan.s_stride,
                                {at(dout, c.q_off, w), NH * HD, plan.q_stride},
                                {at(v, c.kv_off, w), NKV * HD, plan.kv_stride}, T, T, HD, Trans::no,
                                Trans::yes, 1.0f, 0.0f, plan.batch, dt, handle);
  }
  const std::int64_t rows = B * NH * T;
  const cuda::LaunchShape sm = cuda::causal_softmax_launch(rows, op);
  dispatch_storage(dt, op, [&](auto s) {
    cuda::causal_softmax_backward_kernel<decltype(s)>
        <<<cuda::grid_of(sm), cuda::block_of(sm), 0, stream>>>(dprobs, probs, rows, T);
    TM_CUDA_CHECK_LAUNCH();
  });
  for (const HeadCall& c : plan.calls) {
    const float beta = c.first_of_group ? 0.0f : 1.0f;
    // dq (T,HD) = scale * dS (T,T) . k (T,HD)
    matmul_strided_batched_cuda(at(dq, c.q_off, w), NH * HD, plan.q_stride,
                                {at(dprobs, c.s_off, w), T, plan.s_stride},
                                {at(k, c.kv_off, w), NKV * HD, plan.kv_stride}, T, HD, T, Trans::no,
                                Trans::no, scale, 0.0f, plan.batch, dt, handle);
    // dk (T,HD) (+)= scale * dS^T . q
    matmul_strided_batched_cuda(at(dk, c.kv_off, w), NKV * HD, plan.kv_stride,
                                {at(dprobs, c.s_off, w), T, plan.s_stride},
                                {at(q, c.q_off, w), NH * HD, plan.q_stride}, T, HD, T, Trans::yes,
                                Trans::no, scale, beta, plan.batch, dt, handle);
    // dv (T,HD) (+)= P^T . dout
    matmul_strided_batched_cuda(at(dv, c.kv_off, w), NKV * HD, plan.kv_stride,
                                {at(probs, c.s_off, w), T, plan.s_stride},
                                {at(dout, c.q_off, w), NH * HD, plan.q_stride}, T, HD, T,
                                Trans::yes, Trans::no, 1.0f, beta, plan.batch, dt, handle);
  }
}

}  // namespace trainmem
