// Ring attention's CUDA kernels (launchers in attention_ring.cu): one thread per query row
// (forward, dq) or key row (dk/dv), grid-stride, each running the per-row piece of
// attention_ring_math.hpp that the CPU reference runs, so both compute the same operations in the
// same order. Plain fp32 SIMT, no shared memory: correct first (the ring's blocks are the
// measured context-parallel runs' small shapes), fast later. Device code only: also compiled as
// host C++ by the CPU emulator tests (tests/test_cuda_kernels_emulated.cpp).
#pragma once
#include <cstdint>

#include "attention/attention_ring_math.hpp"
#include "common/cuda_device.cuh"
#include "common/storage.hpp"

namespace trainmem::cuda {

// acc (b, sq, a, d), lse (b, a, sq): thread t is row (bi·a + qh)·sq + i. d <= kRingMaxHeadDim.
template <class S>
__global__ void ring_forward_kernel(float* acc, float* lse, const void* q, const void* k,
                                    const void* v, RingShape x, SeqPositions qpos,
                                    SeqPositions kpos, bool first) {
  const std::int64_t rows = x.b * x.a * x.sq;
  for (std::int64_t t = global_thread_index(); t < rows; t += global_thread_count()) {
    const std::int64_t i = t % x.sq, qh = (t / x.sq) % x.a, bi = t / (x.sq * x.a);
    float o[kRingMaxHeadDim];
    ring_forward_row<S>(acc + x.q_at(bi, i, qh), lse + x.row_at(bi, qh, i), o, q, k, v, x, bi, qh,
                        i, qpos, kpos, first);
  }
}

// dq (b, sq, a, d) +=, delta (b, a, sq) written when `first`: thread t as the forward's.
template <class S>
__global__ void ring_dq_kernel(float* dq, float* delta, const void* dout, const void* q,
                               const void* k, const void* v, const void* out, const float* lse,
                               RingShape x, SeqPositions qpos, SeqPositions kpos, bool first) {
  const std::int64_t rows = x.b * x.a * x.sq;
  for (std::int64_t t = global_thread_index(); t < rows; t += global_thread_count()) {
    const std::int64_t i = t % x.sq, qh = (t / x.sq) % x.a, bi = t / (x.sq * x.a);
    ring_dq_row<S>(dq + x.q_at(bi, i, qh), delta, dout, q, k, v, out, lse, x, bi, qh, i, qpos, kpos,
                   first);
  }
}

// dk, dv (b, sk, kv, d) +=: thread t is key row (bi·kv + kh)·sk + j; after ring_dq_kernel
// (delta).
template <class S>
__global__ void ring_dkdv_kernel(float* dk, float* dv, const float* delta, const void* dout,
                                 const void* q, const void* k, const void* v, const float* lse,
                                 RingShape x, SeqPositions qpos, SeqPositions kpos) {
  const std::int64_t rows = x.b * x.kv * x.sk;
  for (std::int64_t t = global_thread_index(); t < rows; t += global_thread_count()) {
    const std::int64_t j = t % x.sk, kh = (t / x.sk) % x.kv, bi = t / (x.sk * x.kv);
    ring_dkdv_row<S>(dk + x.k_at(bi, j, kh), dv + x.k_at(bi, j, kh), delta, dout, q, k, v, lse, x,
                     bi, kh, j, qpos, kpos);
  }
}

// out (n) D = round(in (n) f32).
template <class S>
__global__ void round_from_f32_kernel(void* out, const float* in, std::int64_t n) {
  for (std::int64_t t = global_thread_index(); t < n; t += global_thread_count())
    S::store(out, std::size_t(t), in[t]);
}

}  // namespace trainmem::cuda
