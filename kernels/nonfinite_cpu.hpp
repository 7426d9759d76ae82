// Non-finite check, CPU reference: whether a buffer of the training dtype holds an infinity or
// a NaN (the overflow check of loss-scaled fp16 gradients, docs/decisions.md). Same argument
// order as the CUDA launcher (has_nonfinite_cuda(..., DType, cudaStream_t)).
#pragma once
#include <cstdint>

#include "trainmem/dtype.hpp"

namespace trainmem {

// True when any of x (n) D is +-inf or NaN.
bool has_nonfinite_cpu(const void* x, std::int64_t n, DType dt);

}  // namespace trainmem
