// Ring attention (context parallelism, docs/distributed.md "Context parallelism"): causal
// attention of a rank's queries against one key/value block at a time, the blocks passed around
// the ring of context-parallel ranks. The CPU reference (attention_ring_cpu.cpp) and the CUDA
// launchers (attention_ring.cu, kernels in attention_ring_kernels.cuh) side by side, in the same
// argument order (CUDA: plus the stream); both run the per-row pieces of attention_ring_math.hpp.
//
// Shapes: q, out, dout (b, sq, a, d) D at sequence positions qpos.at(0..sq-1); k, v (b, sk, kv,
// d) D at kpos.at(0..sk-1). Visibility is attention_math.hpp's on the positions: key position
// pk is visible from query position pq iff pk <= pq and, under a window W > 0, pk > pq - W. GQA
// and scale 1/sqrt(d) as attention.hpp.
#pragma once
#include <cstdint>

#include "attention/attention_ring_math.hpp"
#include "common/cuda_handles.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/op_types.hpp"

namespace trainmem {

// The shape the kernels of both sides accept: InputError naming `op` when b, sq, sk, a, kv, d
// are not positive, kv does not divide a, window is negative, d exceeds `max_d` (the CUDA
// forward's per-thread row; 0: no bound) or a buffer's size overflows. Returns the shape.
RingShape check_ring_shape(const char* op, std::int64_t b, std::int64_t sq, std::int64_t sk,
                           std::int64_t a, std::int64_t kv, std::int64_t d, std::int64_t window,
                           std::int64_t max_d = 0);

// Merges one block into the running output: acc (b, sq, a, d) f32 holds the output normalised
// over the keys seen so far and lse (b, a, sq) f32 their log-sum-exp (-inf: none yet). With
// `first` both are written as if empty before the merge. The block's own output o_B and lse_B
// (over its visible keys, fp32) merge as
//   lse' = log(exp(lse) + exp(lse_B)),  acc' = acc·exp(lse - lse') + o_B·exp(lse_B - lse');
// a row that sees no key of the block is left as it was.
void attention_ring_forward_cpu(float* acc, float* lse, const void* q, const void* k, const void* v,
                                std::int64_t b, std::int64_t sq, std::int64_t sk, std::int64_t a,
                                std::int64_t kv, std::int64_t d, std::int64_t window,
                                SeqPositions qpos, SeqPositions kpos, bool first, DType dt);
void attention_ring_forward_cuda(float* acc, float* lse, const void* q, const void* k,
                                 const void* v, std::int64_t b, std::int64_t sq, std::int64_t sk,
                                 std::int64_t a, std::int64_t kv, std::int64_t d,
                                 std::int64_t window, SeqPositions qpos, SeqPositions kpos,
                                 bool first, DType dt, cudaStream_t stream);

// One block's share of the backward, from the final out and lse of the forward: with
// p = exp(s - lse), dp = dout·v, delta = rowsum(dout * out) (written into delta (b, a, sq) f32
// when `first`, read otherwise), ds = p·(dp - delta):
//   dq (b, sq, a, d) f32 += scale Σ_j ds k_j;  dk (b, sk, kv, d) f32 += scale Σ_i ds q_i;
//   dv (b, sk, kv, d) f32 += Σ_i p dout_i,
// summed over the a/kv query heads of a kv head in head order, rows in order (deterministic).
void attention_ring_backward_cpu(float* dq, float* dk, float* dv, float* delta, const void* dout,
                                 const void* q, const void* k, const void* v, const void* out,
                                 const float* lse, std::int64_t b, std::int64_t sq, std::int64_t sk,
                                 std::int64_t a, std::int64_t kv, std::int64_t d,
                                 std::int64_t window, SeqPositions qpos, SeqPositions kpos,
                                 bool first, DType dt);
// CUDA: d up to kRingMaxHeadDim (256, InputError above); delta is written by the dq pass before
// the dk/dv pass reads it (one stream).
void attention_ring_backward_cuda(float* dq, float* dk, float* dv, float* delta, const void* dout,
                                  const void* q, const void* k, const void* v, const void* out,
                                  const float* lse, std::int64_t b, std::int64_t sq,
                                  std::int64_t sk, std::int64_t a, std::int64_t kv, std::int64_t d,
                                  std::int64_t window, SeqPositions qpos, SeqPositions kpos,
                                  bool first, DType dt, cudaStream_t stream);

// out (n) D = round(in (n) f32): the accumulators into the D tensors.
void round_from_f32_cpu(void* out, const float* in, std::int64_t n, DType dt);
void round_from_f32_cuda(void* out, const float* in, std::int64_t n, DType dt, cudaStream_t stream);

}  // namespace trainmem
