// SwiGLU (LLaMA MLP). The CPU reference (swiglu_cpu.cpp) and the CUDA launchers (swiglu.cu,
// kernels in swiglu_kernels.cuh) side by side, in the same argument order (CUDA: plus the
// stream). Math per element in swiglu_math.hpp, shared by both.
#pragma once
#include <cstdint>

#include "common/cuda_handles.hpp"
#include "trainmem/base/dtype.hpp"

namespace trainmem {

// out (n) D = silu(gate) * up ; gate, up (n) D.
void swiglu_forward_cpu(void* out, const void* gate, const void* up, std::int64_t n, DType dt);
void swiglu_forward_cuda(void* out, const void* gate, const void* up, std::int64_t n, DType dt,
                         cudaStream_t stream);

// dgate, dup (n) D written with = ; dout, gate, up (n) D.
void swiglu_backward_cpu(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                         std::int64_t n, DType dt);
void swiglu_backward_cuda(void* dgate, void* dup, const void* dout, const void* gate,
                          const void* up, std::int64_t n, DType dt, cudaStream_t stream);

}  // namespace trainmem
