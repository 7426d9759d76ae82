// Non-finite check: whether a buffer of the training dtype holds an infinity or a NaN (the
// overflow check of loss-scaled fp16 gradients, docs/decisions.md). The CPU reference
// (nonfinite_cpu.cpp) and the CUDA launcher (nonfinite.cu, kernel in nonfinite_kernels.cuh)
// side by side: the same data arguments; the CPU one answers, the CUDA one raises a flag.
#pragma once
#include <cstdint>

#include "common/cuda_handles.hpp"
#include "trainmem/base/dtype.hpp"

namespace trainmem {

// True when any of x (n) D is +-inf or NaN.
bool has_nonfinite_cpu(const void* x, std::int64_t n, DType dt);

// Queues a pass over x (n) D that sets *flag = 1 when an element is +-inf or NaN; *flag is
// left as it is otherwise (never cleared here), so several buffers can be checked into one
// flag and read once. `flag` is device-accessible (the cuda backend's mapped host word). No
// allocation, no synchronisation: the caller reads the flag.
void flag_nonfinite_cuda(unsigned* flag, const void* x, std::int64_t n, DType dt,
                         cudaStream_t stream);

}  // namespace trainmem
