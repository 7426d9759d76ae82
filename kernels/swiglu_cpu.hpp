// SwiGLU, CPU reference (math in swiglu_math.hpp). Same argument order as the CUDA launchers
// (swiglu_forward_cuda(..., DType, cudaStream_t)).
#pragma once
#include <cstdint>

#include "trainmem/dtype.hpp"

namespace trainmem {

// out (N) D = silu(gate) * up ; gate, up (N) D.
void swiglu_forward_cpu(void* out, const void* gate, const void* up, std::int64_t N, DType dt);
// dgate, dup (N) D written with = ; dout, gate, up (N) D.
void swiglu_backward_cpu(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                         std::int64_t N, DType dt);

}  // namespace trainmem
