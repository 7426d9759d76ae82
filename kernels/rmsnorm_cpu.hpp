// RMSNorm, CPU reference (math in rmsnorm_math.hpp). Same argument order as the CUDA
// launchers (rmsnorm_forward_cuda(..., DType, cudaStream_t)).
#pragma once
#include <cstdint>

#include "trainmem/dtype.hpp"

namespace trainmem {

// out (N,C) D = inp * rstd * weight ; rstd (N) f32 = 1/sqrt(mean(inp^2) + eps) ;
// inp (N,C) D ; weight (C) D.
void rmsnorm_forward_cpu(void* out, float* rstd, const void* inp, const void* weight,
                         std::int64_t N, std::int64_t C, float eps, DType dt);
// dinp (N,C) D += ... ; dweight (C) D += ... (accumulated in fp32 over rows, one rounding per
// element) ; dout, inp (N,C) D ; weight (C) D ; rstd (N) f32 from the forward.
void rmsnorm_backward_cpu(void* dinp, void* dweight, const void* dout, const void* inp,
                          const void* weight, const float* rstd, std::int64_t N, std::int64_t C,
                          DType dt);

}  // namespace trainmem
