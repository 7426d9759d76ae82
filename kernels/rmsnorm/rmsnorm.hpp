// RMSNorm (LlamaRMSNorm: no mean subtraction). The CPU reference (rmsnorm_cpu.cpp) and the
// CUDA launchers (rmsnorm.cu, kernels in rmsnorm_kernels.cuh) side by side, in the same argument
// order (CUDA: plus the stream). Math per element in rmsnorm_math.hpp, shared by both.
#pragma once
#include <cstdint>

#include "common/cuda_handles.hpp"
#include "trainmem/base/dtype.hpp"

namespace trainmem {

// out (n, h) D = inp * rstd * weight ; rstd (n) f32 = 1/sqrt(mean(inp^2) + eps) ;
// inp (n, h) D ; weight (h) D. CUDA: one block per row.
void rmsnorm_forward_cpu(void* out, float* rstd, const void* inp, const void* weight,
                         std::int64_t n, std::int64_t h, float eps, DType dt);
void rmsnorm_forward_cuda(void* out, float* rstd, const void* inp, const void* weight,
                          std::int64_t n, std::int64_t h, float eps, DType dt, cudaStream_t stream);

// dinp (n, h) D += ... ; dweight (h) D += ... (dweight null: a frozen weight, no gradient)
// (accumulated in fp32 over rows, one rounding per element) ; dout, inp (n, h) D ; weight (h) D ;
// rstd (n) f32 from the forward. CPU: rows in parallel, dweight reduced over fixed row chunks in a
// fixed order. CUDA: dinp one block per row; dweight a block per 32 columns, its threads loop over
// the rows and reduce in shared memory (no scratch).
void rmsnorm_backward_cpu(void* dinp, void* dweight, const void* dout, const void* inp,
                          const void* weight, const float* rstd, std::int64_t n, std::int64_t h,
                          DType dt);
void rmsnorm_backward_cuda(void* dinp, void* dweight, const void* dout, const void* inp,
                           const void* weight, const float* rstd, std::int64_t n, std::int64_t h,
                           DType dt, cudaStream_t stream);

}  // namespace trainmem
