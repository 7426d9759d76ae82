// Mixture of experts (docs/native-plan.md, "Mixture of experts"): the router's softmax, top-k
// and the tokens' order by expert; the rows gathered into that order and combined back. The CPU
// reference (moe_cpu.cpp) and the CUDA launchers (moe.cu, kernels in moe_kernels.cuh) side by
// side, in the same argument order (CUDA: plus the stream). Math per token in moe_math.hpp,
// shared by both. n tokens, E experts, K experts per token, rows of width h; D the training
// dtype; i32 indices.
#pragma once
#include <cstdint>

#include "common/cuda_handles.hpp"
#include "trainmem/base/dtype.hpp"

namespace trainmem {

// probs (n, E) f32 = softmax(float(logits (n, E) D)); idx (n, K) the K experts of largest
// probability, descending (a tie goes to the lower expert); weight (n, K) f32 their
// probabilities, divided by their fp32 sum (in that order) when `normalize`; offsets (E + 1):
// where each expert's rows start in expert order (offsets[E] = n·K without a capacity); pos
// (n, K): the row of
// (token t, choice j) in expert order, experts ascending and within one by token, a stable
// counting sort. capacity > 0 (rows per expert, --capacity-factor): each expert keeps its first
// `capacity` choices in token order, the others get pos −1 (dropped: permute, combine and its
// backward skip them) and offsets count the kept rows (offsets[E] <= n·K).
void moe_route_cpu(float* probs, std::int32_t* idx, float* weight, std::int32_t* pos,
                   std::int32_t* offsets, const void* logits, std::int64_t n, std::int64_t E,
                   std::int64_t K, std::int64_t capacity, bool normalize, DType dt);
void moe_route_cuda(float* probs, std::int32_t* idx, float* weight, std::int32_t* pos,
                    std::int32_t* offsets, const void* logits, std::int64_t n, std::int64_t E,
                    std::int64_t K, std::int64_t capacity, bool normalize, DType dt,
                    cudaStream_t stream);

// dlogits (n, E) D from dweight (n, K) f32 back through the normalisation and the softmax.
void moe_route_backward_cpu(void* dlogits, const float* dweight, const float* probs,
                            const std::int32_t* idx, const float* aux, std::int64_t n,
                            std::int64_t E, std::int64_t K, bool normalize, DType dt);
void moe_route_backward_cuda(void* dlogits, const float* dweight, const float* probs,
                             const std::int32_t* idx, const float* aux, std::int64_t n,
                             std::int64_t E, std::int64_t K, bool normalize, DType dt,
                             cudaStream_t stream);

// rows (n·K, or E·capacity, h) D: rows[pos[t, j]] = x[t] (x (n, h) D), a dropped choice (pos −1)
// skipped.
void moe_permute_cpu(void* rows, const void* x, const std::int32_t* pos, std::int64_t n,
                     std::int64_t K, std::int64_t h, DType dt);
void moe_permute_cuda(void* rows, const void* x, const std::int32_t* pos, std::int64_t n,
                      std::int64_t K, std::int64_t h, DType dt, cudaStream_t stream);

// out (n, h) D = (res ? res[t] : 0) + Σ_j (weight ? weight[t, j] : 1) · rows[pos[t, j]], in fp32,
// j = 0..K−1 in order (dropped choices skipped), rounded once. out may alias res.
void moe_combine_cpu(void* out, const void* res, const void* rows, const float* weight,
                     const std::int32_t* pos, std::int64_t n, std::int64_t K, std::int64_t h,
                     DType dt);
void moe_combine_cuda(void* out, const void* res, const void* rows, const float* weight,
                      const std::int32_t* pos, std::int64_t n, std::int64_t K, std::int64_t h,
                      DType dt, cudaStream_t stream);

// The combine's backward: drows[pos[t, j]] = weight[t, j] · dout[t] (D); dweight[t, j] (f32) =
// Σ_c dout[t, c] · rows[pos[t, j], c], in c order; a dropped choice: dweight 0, no row.
void moe_combine_backward_cpu(void* drows, float* dweight, const void* dout, const void* rows,
                              const float* weight, const std::int32_t* pos, std::int64_t n,
                              std::int64_t K, std::int64_t h, DType dt);
void moe_combine_backward_cuda(void* drows, float* dweight, const void* dout, const void* rows,
                               const float* weight, const std::int32_t* pos, std::int64_t n,
                               std::int64_t K, std::int64_t h, DType dt, cudaStream_t stream);

// Qwen2-MoE's shared expert and its sigmoid gate: out[t] (n, h) D += σ(score[t])·y[t] (y (n, h),
// score (n) D; σ in fp32, the sum rounded once).
void moe_gate_add_cpu(void* out, const void* y, const void* score, std::int64_t n, std::int64_t h,
                      DType dt);
void moe_gate_add_cuda(void* out, const void* y, const void* score, std::int64_t n, std::int64_t h,
                       DType dt, cudaStream_t stream);
// Its backward: dy[t] = σ(score[t])·dout[t] (D); dscore[t] (D) = σ'(score[t])·Σ_c dout[t, c]·y[t,
// c] (in c order, fp32).
void moe_gate_backward_cpu(void* dy, void* dscore, const void* dout, const void* y,
                           const void* score, std::int64_t n, std::int64_t h, DType dt);
void moe_gate_backward_cuda(void* dy, void* dscore, const void* dout, const void* y,
                            const void* score, std::int64_t n, std::int64_t h, DType dt,
                            cudaStream_t stream);

}  // namespace trainmem
