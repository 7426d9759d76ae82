// RoPE (HuggingFace rotate-half), in place. The CPU reference (rope_cpu.cpp) and the CUDA
// launchers (rope.cu, kernel in rope_kernels.cuh) side by side, in the same argument order
// (CUDA: plus the stream). Math in rope_math.hpp, shared by both.
#pragma once
#include <cstdint>

#include "common/cuda_handles.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/op_types.hpp"

namespace trainmem {

// In place on q (b, s, a, d) D and k (b, s, kv, d) D, row t at position rope.positions.at(t)
// (0..s-1 unless context parallelism gives the rank's chunks),
// inv_freq[j] = rope.theta^(-2j/d), rescaled under rope.scaling (rope_math.hpp). d must be even
// (InputError otherwise).
void rope_forward_cpu(void* q, void* k, std::int64_t b, std::int64_t s, std::int64_t a,
                      std::int64_t kv, std::int64_t d, const RopeSpec& rope, DType dt);
void rope_forward_cuda(void* q, void* k, std::int64_t b, std::int64_t s, std::int64_t a,
                       std::int64_t kv, std::int64_t d, const RopeSpec& rope, DType dt,
                       cudaStream_t stream);

// In place on dq (b, s, a, d) D and dk (b, s, kv, d) D: the inverse (= transposed) rotation.
void rope_backward_cpu(void* dq, void* dk, std::int64_t b, std::int64_t s, std::int64_t a,
                       std::int64_t kv, std::int64_t d, const RopeSpec& rope, DType dt);
void rope_backward_cuda(void* dq, void* dk, std::int64_t b, std::int64_t s, std::int64_t a,
                        std::int64_t kv, std::int64_t d, const RopeSpec& rope, DType dt,
                        cudaStream_t stream);

}  // namespace trainmem
