// LoRA dropout: the mask drawn from the counter-based generator, and the masked, scaled copy
// (or accumulation). The CPU reference (dropout_cpu.cpp) and the CUDA launchers (dropout.cu,
// kernels in dropout_kernels.cuh) side by side, in the same argument order (CUDA: plus the
// stream). Math per element in dropout_math.hpp, shared by both.
#pragma once
#include <cstdint>

#include "common/cuda_handles.hpp"
#include "trainmem/base/dtype.hpp"

namespace trainmem {

// mask (n) u8 = dropout_keep(seed, stream, e, p) for e in [0, n): 1 kept, 0 dropped.
void dropout_mask_cpu(std::uint8_t* mask, std::int64_t n, float p, std::uint64_t seed,
                      std::uint64_t stream);
void dropout_mask_cuda(std::uint8_t* mask, std::int64_t n, float p, std::uint64_t seed,
                       std::uint64_t stream, cudaStream_t cuda_stream);

// out (n) D = (accumulate ? out : 0) + x · mask · scale ; x (n) D, mask (n) u8.
void dropout_apply_cpu(void* out, const void* x, const std::uint8_t* mask, std::int64_t n,
                       float scale, bool accumulate, DType dt);
void dropout_apply_cuda(void* out, const void* x, const std::uint8_t* mask, std::int64_t n,
                        float scale, bool accumulate, DType dt, cudaStream_t cuda_stream);

}  // namespace trainmem
