// Bias add over rows (the q/k/v projection biases of Qwen2), forward and backward. The CPU
// reference (bias_cpu.cpp) and the CUDA launchers (bias.cu, kernels in bias_kernels.cuh) side by
// side, in the same argument order (CUDA: plus the stream). The summation order of the backward
// is fixed in bias_math.hpp and shared by both, so cpu and cuda give the same bits.
#pragma once
#include <cstdint>

#include "common/cuda_handles.hpp"
#include "trainmem/base/dtype.hpp"

namespace trainmem {

// out (n, c) D += bias (c) D, broadcast over the n rows: loaded to fp32, added, rounded once.
// n, c >= 0 (InputError otherwise); nothing happens when either is 0.
void bias_forward_cpu(void* out, const void* bias, std::int64_t n, std::int64_t c, DType dt);
void bias_forward_cuda(void* out, const void* bias, std::int64_t n, std::int64_t c, DType dt,
                       cudaStream_t stream);

// dbias (c) D += the column sums of dout (n, c) D: summed in fp32 (bias_math.hpp's order),
// added to the loaded dbias and rounded once.
void bias_backward_cpu(void* dbias, const void* dout, std::int64_t n, std::int64_t c, DType dt);
void bias_backward_cuda(void* dbias, const void* dout, std::int64_t n, std::int64_t c, DType dt,
                        cudaStream_t stream);

}  // namespace trainmem
