// RMSNorm on the GPU. Same argument order as the CPU reference (rmsnorm_cpu.hpp), plus the
// stream. Math per element in rmsnorm_math.hpp (shared with the CPU).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "trainmem/dtype.hpp"

namespace trainmem {

// out (N,C) D = inp * rstd * weight ; rstd (N) f32 = 1/sqrt(mean(inp^2) + eps) ;
// inp (N,C) D ; weight (C) D. One block per row.
void rmsnorm_forward_cuda(void* out, float* rstd, const void* inp, const void* weight,
                          std::int64_t N, std::int64_t C, float eps, DType dt, cudaStream_t stream);
// dinp (N,C) D += ... (one block per row) ; dweight (C) D += ... (a block per 32 columns,
// its threads loop over the rows and reduce in shared memory: fp32, one rounding per element,
// no scratch) ; dout, inp (N,C) D ; weight (C) D ; rstd (N) f32 from the forward.
void rmsnorm_backward_cuda(void* dinp, void* dweight, const void* dout, const void* inp,
                           const void* weight, const float* rstd, std::int64_t N, std::int64_t C,
                           DType dt, cudaStream_t stream);

}  // namespace trainmem
