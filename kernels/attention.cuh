// Causal attention with GQA on the GPU, eager and flash-style. Same argument order as the CPU
// reference (attention_cpu.hpp), plus the cuBLAS handle (eager: its GEMMs) and the stream.
// Shapes: q, out, dout, dq (B,T,NH,HD) D; k, v, dk, dv (B,T,NKV,HD) D; NKV divides NH; query
// head h reads kv head h / (NH/NKV); scale 1/sqrt(HD). dq, dk, dv are written with = (dk, dv
// sum over the NH/NKV query heads that share a kv head).
// The handle must already be bound to `stream` (checked: a mismatch throws Error).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "trainmem/dtype.hpp"
#include "trainmem/train_enums.hpp"

namespace trainmem {

// Eager: probs (B,NH,T,T) D receives the scaled scores q.k^T/sqrt(HD) (strided-batched GEMM),
// then the causal softmax in place (0 above the diagonal); out = probs . v (GEMM).
void attention_eager_forward_cuda(void* out, void* probs, const void* q, const void* k,
                                  const void* v, std::int64_t B, std::int64_t T, std::int64_t NH,
                                  std::int64_t NKV, std::int64_t HD, DType dt,
                                  cublasHandle_t handle, cudaStream_t stream);
// dprobs (B,NH,T,T) D is scratch: dP = dout . v^T, then dS = P * (dP - rowsum(P * dP)) in
// place; dq = scale dS . k, dk = scale sum_heads dS^T . q, dv = sum_heads P^T . dout.
void attention_eager_backward_cuda(void* dq, void* dk, void* dv, void* dprobs, const void* dout,
                                   const void* q, const void* k, const void* v, const void* probs,
                                   std::int64_t B, std::int64_t T, std::int64_t NH,
                                   std::int64_t NKV, std::int64_t HD, DType dt,
                                   cublasHandle_t handle, cudaStream_t stream);

// Flash-style: tiled online softmax, never materialises (T,T); lse (B,NH,T) f32 receives the
// row log-sum-exp. HD up to 256 (InputError above).
void attention_flash_forward_cuda(void* out, float* lse, const void* q, const void* k,
                                  const void* v, std::int64_t B, std::int64_t T, std::int64_t NH,
                                  std::int64_t NKV, std::int64_t HD, DType dt, cudaStream_t stream);
// delta (B,NH,T) f32 scratch receives rowsum(dout * out); one kernel parallel over key blocks
// writes dk, dv (recomputing probabilities from lse, looping over the heads of the group), one
// parallel over query blocks writes dq. No atomics, deterministic.
void attention_flash_backward_cuda(void* dq, void* dk, void* dv, float* delta, const void* dout,
                                   const void* q, const void* k, const void* v, const void* out,
                                   const float* lse, std::int64_t B, std::int64_t T,
                                   std::int64_t NH, std::int64_t NKV, std::int64_t HD, DType dt,
                                   cudaStream_t stream);

// The Backend-shaped entry points: dispatch on the variant (unused buffers may be null).
void attention_forward_cuda(void* out, void* probs, float* lse, const void* q, const void* k,
                            const void* v, std::int64_t B, std::int64_t T, std::int64_t NH,
                            std::int64_t NKV, std::int64_t HD, Attention variant, DType dt,
                            cublasHandle_t handle, cudaStream_t stream);
void attention_backward_cuda(void* dq, void* dk, void* dv, void* dprobs, float* delta,
                             const void* dout, const void* q, const void* k, const void* v,
                             const void* out, const void* probs, const float* lse, std::int64_t B,
                             std::int64_t T, std::int64_t NH, std::int64_t NKV, std::int64_t HD,
                             Attention variant, DType dt, cublasHandle_t handle,
                             cudaStream_t stream);

namespace cuda {
// Shared by both variants: InputError naming the dimension when B, T, NH, NKV, HD are not
// positive, NKV does not divide NH, or a size overflows.
void check_attention_dims(const char* op, std::int64_t B, std::int64_t T, std::int64_t NH,
                          std::int64_t NKV, std::int64_t HD);
}  // namespace cuda

}  // namespace trainmem
