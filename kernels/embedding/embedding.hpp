// Token embedding. The CPU reference (embedding_cpu.cpp) and the CUDA launchers (embedding.cu,
// kernels in embedding_kernels.cuh) side by side, in the same argument order (CUDA: plus the
// stream, and the backward's borrowed scratch). CUDA launch errors throw DeviceError; bad
// dimensions throw InputError.
#pragma once
#include <cstdint>

#include "common/cuda_handles.hpp"
#include "trainmem/base/dtype.hpp"

namespace trainmem {

// out (b, s, h) D = wte[tokens] ; tokens (b, s) int32 in [0, V) ; wte (V, h) D.
// A token outside [0, V): the CPU throws InputError("tokens: ..."); a kernel cannot throw, so
// the CUDA one writes that row of out as NaN and the loss turns NaN visibly (the model
// validates tokens on the host before uploading them).
void embedding_forward_cpu(void* out, const std::int32_t* tokens, const void* wte, std::int64_t b,
                           std::int64_t s, std::int64_t h, std::int64_t V, DType dt);
void embedding_forward_cuda(void* out, const std::int32_t* tokens, const void* wte, std::int64_t b,
                            std::int64_t s, std::int64_t h, std::int64_t V, DType dt,
                            cudaStream_t stream);

// dwte (V, h) D += scatter of dout (b, s, h) D by tokens. Deterministic: each id's rows are added
// in fp32, starting from dwte, in position order and rounded once into dwte (the same sequence
// on both, so the results are bit-identical).
// Rows with an id outside [0, V): the CPU throws InputError, the CUDA one skips them. scratch
// (8*b*s bytes, 8-byte aligned; borrowed, its contents are overwritten) holds the sort that groups
// rows by id; without it (nullptr, or too small) a kernel without scratch that reads O((b*s)^2) ids
// does the same sums.
void embedding_backward_cpu(void* dwte, const void* dout, const std::int32_t* tokens,
                            std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t V,
                            DType dt);
void embedding_backward_cuda(void* dwte, const void* dout, const std::int32_t* tokens,
                             std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t V,
                             DType dt, cudaStream_t stream, void* scratch,
                             std::uint64_t scratch_bytes);

}  // namespace trainmem
