// SwiGLU on the GPU. Same argument order as the CPU reference (swiglu_cpu.hpp), plus the
// stream. Math per element in swiglu_math.hpp (shared with the CPU).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "trainmem/dtype.hpp"

namespace trainmem {

// out (N) D = silu(gate) * up ; gate, up (N) D.
void swiglu_forward_cuda(void* out, const void* gate, const void* up, std::int64_t N, DType dt,
                         cudaStream_t stream);
// dgate, dup (N) D written with = ; dout, gate, up (N) D.
void swiglu_backward_cuda(void* dgate, void* dup, const void* dout, const void* gate,
                          const void* up, std::int64_t N, DType dt, cudaStream_t stream);

}  // namespace trainmem
