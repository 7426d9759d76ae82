// Causal attention with GQA, eager and flash-style. The CPU reference (attention_cpu.cpp) and
// the CUDA launchers (attention.cu: the checks both variants share and the variant dispatch;
// attention_eager.cu with attention_eager_kernels.cuh; attention_flash.cu with
// attention_flash_kernels.cuh) side by side, in the same argument order (CUDA: plus the cuBLAS
// handle where the eager GEMMs need it, and the stream; the handle must already be bound to
// `stream`, checked: a mismatch throws Error). Per-row math in attention_math.hpp, shared by
// both; the batching of the eager GEMMs over heads in attention_heads.hpp.
// Shapes: q, out, dout, dq (b, s, a, d) D; k, v, dk, dv (b, s, kv, d) D; kv divides a; query
// head qh reads kv head qh / (a/kv); scale 1/sqrt(d). Gradients dq, dk, dv are written with =
// (dk, dv sum over the a/kv query heads sharing a kv head). window: 0 for full causal attention;
// W > 0 for a sliding window, query t attends to keys max(0, t-W+1)..t only (attention_math.hpp);
// negative is InputError.
#pragma once
#include <cstdint>

#include "common/cuda_handles.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/train_enums.hpp"

namespace trainmem {

// Eager: probs (b, a, s, s) D receives the causal softmax probabilities (0 above the diagonal
// and, under a window, 0 left of it);
// out = probs . v uses the stored (rounded) probabilities. CUDA: the scaled scores
// q.k^T/sqrt(d) by strided-batched GEMMs straight into probs, then the causal softmax in place.
void attention_eager_forward_cpu(void* out, void* probs, const void* q, const void* k,
                                 const void* v, std::int64_t b, std::int64_t s, std::int64_t a,
                                 std::int64_t kv, std::int64_t d, std::int64_t window, DType dt);
void attention_eager_forward_cuda(void* out, void* probs, const void* q, const void* k,
                                  const void* v, std::int64_t b, std::int64_t s, std::int64_t a,
                                  std::int64_t kv, std::int64_t d, std::int64_t window, DType dt,
                                  cublasHandle_t handle, cudaStream_t stream);

// dprobs (b, a, s, s) D is scratch. CPU: it uses fp32 per-head scratch instead and leaves dprobs
// untouched (it may be null). CUDA: required; dP = dout . v^T, then dS = P * (dP - rowsum(P *
// dP)) in place; dq = scale dS . k, dk = scale sum_heads dS^T . q, dv = sum_heads P^T . dout.
void attention_eager_backward_cpu(void* dq, void* dk, void* dv, void* dprobs, const void* dout,
                                  const void* q, const void* k, const void* v, const void* probs,
                                  std::int64_t b, std::int64_t s, std::int64_t a, std::int64_t kv,
                                  std::int64_t d, std::int64_t window, DType dt);
void attention_eager_backward_cuda(void* dq, void* dk, void* dv, void* dprobs, const void* dout,
                                   const void* q, const void* k, const void* v, const void* probs,
                                   std::int64_t b, std::int64_t s, std::int64_t a, std::int64_t kv,
                                   std::int64_t d, std::int64_t window, DType dt,
                                   cublasHandle_t handle, cudaStream_t stream);

// Flash-style: tiled online softmax, never materialises (s, s) per head beyond one tile; key
// tiles entirely outside the window (or above the diagonal) are skipped, forward and backward;
// lse (b, a, s) f32 receives the row log-sum-exp. CUDA: d up to 256 (InputError above).
void attention_flash_forward_cpu(void* out, float* lse, const void* q, const void* k, const void* v,
                                 std::int64_t b, std::int64_t s, std::int64_t a, std::int64_t kv,
                                 std::int64_t d, std::int64_t window, DType dt);
void attention_flash_forward_cuda(void* out, float* lse, const void* q, const void* k,
                                  const void* v, std::int64_t b, std::int64_t s, std::int64_t a,
                                  std::int64_t kv, std::int64_t d, std::int64_t window, DType dt,
                                  cudaStream_t stream);

// delta (b, a, s) f32 scratch receives rowsum(dout * out); probabilities are recomputed from
// lse tile by tile. CUDA: one kernel parallel over key blocks writes dk, dv (looping over the
// heads of the group), one parallel over query blocks writes dq. No atomics, deterministic.
void attention_flash_backward_cpu(void* dq, void* dk, void* dv, float* delta, const void* dout,
                                  const void* q, const void* k, const void* v, const void* out,
                                  const float* lse, std::int64_t b, std::int64_t s, std::int64_t a,
                                  std::int64_t kv, std::int64_t d, std::int64_t window, DType dt);
void attention_flash_backward_cuda(void* dq, void* dk, void* dv, float* delta, const void* dout,
                                   const void* q, const void* k, const void* v, const void* out,
                                   const float* lse, std::int64_t b, std::int64_t s, std::int64_t a,
                                   std::int64_t kv, std::int64_t d, std::int64_t window, DType dt,
                                   cudaStream_t stream);

// The Backend-shaped entry points: dispatch on the variant (unused buffers may be null).
void attention_forward_cpu(void* out, void* probs, float* lse, const void* q, const void* k,
                           const void* v, std::int64_t b, std::int64_t s, std::int64_t a,
                           std::int64_t kv, std::int64_t d, std::int64_t window, Attention variant,
                           DType dt);
void attention_forward_cuda(void* out, void* probs, float* lse, const void* q, const void* k,
                            const void* v, std::int64_t b, std::int64_t s, std::int64_t a,
                            std::int64_t kv, std::int64_t d, std::int64_t window, Attention variant,
                            DType dt, cublasHandle_t handle, cudaStream_t stream);

void attention_backward_cpu(void* dq, void* dk, void* dv, void* dprobs, float* delta,
                            const void* dout, const void* q, const void* k, const void* v,
                            const void* out, const void* probs, const float* lse, std::int64_t b,
                            std::int64_t s, std::int64_t a, std::int64_t kv, std::int64_t d,
                            std::int64_t window, Attention variant, DType dt);
void attention_backward_cuda(void* dq, void* dk, void* dv, void* dprobs, float* delta,
                             const void* dout, const void* q, const void* k, const void* v,
                             const void* out, const void* probs, const float* lse, std::int64_t b,
                             std::int64_t s, std::int64_t a, std::int64_t kv, std::int64_t d,
                             std::int64_t window, Attention variant, DType dt,
                             cublasHandle_t handle, cudaStream_t stream);

namespace cuda {
// Shared by both CUDA variants: InputError naming the dimension when b, s, a, kv, d are not
// positive, kv does not divide a, window is negative, or a size overflows.
void check_attention_dims(const char* op, std::int64_t b, std::int64_t s, std::int64_t a,
                          std::int64_t kv, std::int64_t d, std::int64_t window);
}  // namespace cuda

}  // namespace trainmem
