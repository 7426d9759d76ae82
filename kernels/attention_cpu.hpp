// Causal attention with GQA, CPU reference (math in attention_math.hpp), eager and
// flash-style. Same argument order as the CUDA launchers (..., DType, cudaStream_t).
// Shapes: q, out, dout, dq (B,T,NH,HD) D; k, v, dk, dv (B,T,NKV,HD) D; NKV divides NH.
// Gradients dq, dk, dv are written with = (dk, dv sum over the NH/NKV query heads sharing
// a kv head).
#pragma once
#include <cstdint>

#include "trainmem/dtype.hpp"
#include "trainmem/train_enums.hpp"

namespace trainmem {

// Eager: probs (B,NH,T,T) D receives the causal softmax probabilities (0 above the
// diagonal); out = probs . v uses the stored (rounded) probabilities.
void attention_eager_forward_cpu(void* out, void* probs, const void* q, const void* k,
                                 const void* v, std::int64_t B, std::int64_t T, std::int64_t NH,
                                 std::int64_t NKV, std::int64_t HD, DType dt);
// dprobs (B,NH,T,T) D is scratch (the cpu backend uses fp32 per-head scratch instead and
// leaves it untouched; it may be null).
void attention_eager_backward_cpu(void* dq, void* dk, void* dv, void* dprobs, const void* dout,
                                  const void* q, const void* k, const void* v, const void* probs,
                                  std::int64_t B, std::int64_t T, std::int64_t NH, std::int64_t NKV,
                                  std::int64_t HD, DType dt);
// Flash-style: tiled online softmax, never materialises (T,T) per head beyond one tile;
// lse (B,NH,T) f32 receives the row log-sum-exp.
void attention_flash_forward_cpu(void* out, float* lse, const void* q, const void* k, const void* v,
                                 std::int64_t B, std::int64_t T, std::int64_t NH, std::int64_t NKV,
                                 std::int64_t HD, DType dt);
// delta (B,NH,T) f32 scratch receives rowsum(dout * out); probabilities are recomputed from
// lse tile by tile.
void attention_flash_backward_cpu(void* dq, void* dk, void* dv, float* delta, const void* dout,
                                  const void* q, const void* k, const void* v, const void* out,
                                  const float* lse, std::int64_t B, std::int64_t T, std::int64_t NH,
                                  std::int64_t NKV, std::int64_t HD, DType dt);

// The Backend-shaped entry points: dispatch on the variant (unused buffers may be null).
void attention_forward_cpu(void* out, void* probs, float* lse, const void* q, const void* k,
                           const void* v, std::int64_t B, std::int64_t T, std::int64_t NH,
                           std::int64_t NKV, std::int64_t HD, Attention variant, DType dt);
void attention_backward_cpu(void* dq, void* dk, void* dv, void* dprobs, float* delta,
                            const void* dout, const void* q, const void* k, const void* v,
                            const void* out, const void* probs, const float* lse, std::int64_t B,
                            std::int64_t T, std::int64_t NH, std::int64_t NKV, std::int64_t HD,
                            Attention variant, DType dt);

}  // namespace trainmem
