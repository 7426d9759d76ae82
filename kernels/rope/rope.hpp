// RoPE (HuggingFace rotate-half), in place. The CPU reference (rope_cpu.cpp) and the CUDA
// launchers (rope.cu, kernel in rope_kernels.cuh) side by side, in the same argument order
// (CUDA: plus the stream). Math in rope_math.hpp, shared by both.
#pragma once
#include <cstdint>

#include "common/cuda_handles.hpp"
#include "trainmem/dtype.hpp"

namespace trainmem {

// In place on q (B,T,NH,HD) D and k (B,T,NKV,HD) D at positions 0..T-1,
// inv_freq[j] = theta^(-2j/HD). HD must be even (InputError otherwise).
void rope_forward_cpu(void* q, void* k, std::int64_t B, std::int64_t T, std::int64_t NH,
                      std::int64_t NKV, std::int64_t HD, double theta, DType dt);
void rope_forward_cuda(void* q, void* k, std::int64_t B, std::int64_t T, std::int64_t NH,
                       std::int64_t NKV, std::int64_t HD, double theta, DType dt,
                       cudaStream_t stream);

// In place on dq (B,T,NH,HD) D and dk (B,T,NKV,HD) D: the inverse (= transposed) rotation.
void rope_backward_cpu(void* dq, void* dk, std::int64_t B, std::int64_t T, std::int64_t NH,
                       std::int64_t NKV, std::int64_t HD, double theta, DType dt);
void rope_backward_cuda(void* dq, void* dk, std::int64_t B, std::int64_t T, std::int64_t NH,
                        std::int64_t NKV, std::int64_t HD, double theta, DType dt,
                        cudaStream_t stream);

}  // namespace trainmem
