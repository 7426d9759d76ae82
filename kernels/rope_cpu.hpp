// RoPE (HuggingFace rotate-half), CPU reference (math in rope_math.hpp). Same argument order
// as the CUDA launchers (rope_forward_cuda(..., DType, cudaStream_t)).
#pragma once
#include <cstdint>

#include "trainmem/dtype.hpp"

namespace trainmem {

// In place on q (B,T,NH,HD) D and k (B,T,NKV,HD) D, positions 0..T-1,
// inv_freq[j] = theta^(-2j/HD). HD must be even.
void rope_forward_cpu(void* q, void* k, std::int64_t B, std::int64_t T, std::int64_t NH,
                      std::int64_t NKV, std::int64_t HD, double theta, DType dt);
// In place on dq (B,T,NH,HD) D and dk (B,T,NKV,HD) D: the inverse (= transposed) rotation.
void rope_backward_cpu(void* dq, void* dk, std::int64_t B, std::int64_t T, std::int64_t NH,
                       std::int64_t NKV, std::int64_t HD, double theta, DType dt);

}  // namespace trainmem
