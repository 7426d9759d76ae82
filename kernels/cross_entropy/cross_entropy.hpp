// Cross-entropy over the vocabulary, fp32 loss. The CPU reference (cross_entropy_cpu.cpp) and
// the CUDA launchers (cross_entropy.cu, kernels in cross_entropy_kernels.cuh) side by side, in
// the same argument order (CUDA: plus the stream). Math in cross_entropy_math.hpp, shared by
// both.
#pragma once
#include <cstdint>

#include "common/cuda_handles.hpp"
#include "trainmem/base/dtype.hpp"

namespace trainmem {

// losses (n) f32 = lse - logits[target] (0 where target < 0) ; lse (n) f32 (computed for every
// row) ; logits (n, V) D ; targets (n) int32, < V (negative = ignored).
// A target >= V: the CPU throws InputError("targets: ..."); a kernel cannot throw, so the CUDA
// one writes that row's loss as NaN (the model validates targets on the host).
void cross_entropy_forward_cpu(float* losses, float* lse, const void* logits,
                               const std::int32_t* targets, std::int64_t n, std::int64_t V,
                               DType dt);
void cross_entropy_forward_cuda(float* losses, float* lse, const void* logits,
                                const std::int32_t* targets, std::int64_t n, std::int64_t V,
                                DType dt, cudaStream_t stream);

// dlogits (n, V) D = scale * (softmax(logits) - onehot(target)) ; rows with target < 0 are 0
// (CUDA: rows with target >= V are NaN). dlogits may alias logits (in place; on the GPU each
// element is read, then written, by the same thread).
void cross_entropy_backward_cpu(void* dlogits, const void* logits, const float* lse,
                                const std::int32_t* targets, std::int64_t n, std::int64_t V,
                                float scale, DType dt);
void cross_entropy_backward_cuda(void* dlogits, const void* logits, const float* lse,
                                 const std::int32_t* targets, std::int64_t n, std::int64_t V,
                                 float scale, DType dt, cudaStream_t stream);

}  // namespace trainmem
