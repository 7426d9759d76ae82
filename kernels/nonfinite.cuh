// Non-finite check on the GPU: whether a buffer of the training dtype holds an infinity or a
// NaN. The CPU reference is nonfinite_cpu.hpp (same data argument, plus DType and stream).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "trainmem/dtype.hpp"

namespace trainmem {

// Queues a pass over x (n) D that sets *flag = 1 when an element is +-inf or NaN; *flag is
// left as it is otherwise (never cleared here), so several buffers can be checked into one
// flag and read once. `flag` is device-accessible (the cuda backend's mapped host word).
void flag_nonfinite_cuda(unsigned* flag, const void* x, std::int64_t n, DType dt,
                         cudaStream_t stream);

}  // namespace trainmem
