// Cross-entropy over the vocabulary on the GPU, fp32 loss. Same argument order as the CPU
// reference (cross_entropy_cpu.hpp), plus the stream. Math in cross_entropy_math.hpp.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "trainmem/dtype.hpp"

namespace trainmem {

// losses (N) f32 = lse - logits[target] (0 where target < 0) ; lse (N) f32 (every row) ;
// logits (N,V) D ; targets (N) int32. A target >= V cannot throw from a kernel: its loss is
// written as NaN (the model validates targets on the host).
void cross_entropy_forward_cuda(float* losses, float* lse, const void* logits,
                                const std::int32_t* targets, std::int64_t N, std::int64_t V,
                                DType dt, cudaStream_t stream);
// dlogits (N,V) D = scale * (softmax(logits) - onehot(target)) ; rows with target < 0 are 0,
// rows with target >= V NaN. dlogits may alias logits (each element is read, then written,
// by the same thread).
void cross_entropy_backward_cuda(void* dlogits, const void* logits, const float* lse,
                                 const std::int32_t* targets, std::int64_t N, std::int64_t V,
                                 float scale, DType dt, cudaStream_t stream);

}  // namespace trainmem
