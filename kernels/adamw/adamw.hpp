// Optimizer updates: AdamW, SGD, and LOMO's fused update (= SGD applied to one parameter as soon
// as its gradient is complete). The CPU reference (adamw_cpu.cpp) and the CUDA launchers
// (adamw.cu, kernels in adamw_kernels.cuh) side by side, in the same argument order (CUDA: plus
// the stream). Math per element in adamw_math.hpp, shared by both; the per-step constants (bias
// corrections) are computed once on the host in double.
#pragma once
#include <cstdint>

#include "common/cuda_handles.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/op_types.hpp"

namespace trainmem {

// param (n) D ; grad (n) D ; master (n) f32 or nullptr ; m, v (n) f32 ; step >= 1.
// With master, the update is applied to master and param is written as round(master); without
// (D = fp32), param itself is updated (for a 16-bit D: in fp32, then rounded into param).
// Each gradient element is used as float(grad) * grad_scale (1/S under a loss scale S; 1: as
// stored).
void adamw_update_cpu(void* param, const void* grad, float* master, float* m, float* v,
                      std::int64_t n, const AdamWParams& hp, int step, float grad_scale, DType dt);
void adamw_update_cuda(void* param, const void* grad, float* master, float* m, float* v,
                       std::int64_t n, const AdamWParams& hp, int step, float grad_scale, DType dt,
                       cudaStream_t stream);

// param -= lr * grad * grad_scale, through master when non-null (param = round(master)). With
// master == nullptr and a 16-bit D the update is done in fp32 and rounded into param (LOMO).
void sgd_update_cpu(void* param, const void* grad, float* master, std::int64_t n, float lr,
                    float grad_scale, DType dt);
void sgd_update_cuda(void* param, const void* grad, float* master, std::int64_t n, float lr,
                     float grad_scale, DType dt, cudaStream_t stream);

}  // namespace trainmem
