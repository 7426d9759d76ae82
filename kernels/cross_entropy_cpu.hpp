// Cross-entropy over the vocabulary, CPU reference (math in cross_entropy_math.hpp). Same
// argument order as the CUDA launchers (cross_entropy_forward_cuda(..., DType, cudaStream_t)).
#pragma once
#include <cstdint>

#include "trainmem/dtype.hpp"

namespace trainmem {

// losses (N) f32 = lse - logits[target] (0 where target < 0) ; lse (N) f32 (computed for every
// row) ; logits (N,V) D ; targets (N) int32, < V (negative = ignored).
// Throws InputError("targets: ...") for a target >= V.
void cross_entropy_forward_cpu(float* losses, float* lse, const void* logits,
                               const std::int32_t* targets, std::int64_t N, std::int64_t V,
                               DType dt);
// dlogits (N,V) D = scale * (softmax(logits) - onehot(target)) ; rows with target < 0 are 0.
// dlogits may alias logits (in place).
void cross_entropy_backward_cpu(void* dlogits, const void* logits, const float* lse,
                                const std::int32_t* targets, std::int64_t N, std::int64_t V,
                                float scale, DType dt);

}  // namespace trainmem
