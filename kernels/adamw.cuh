// Optimizer updates on the GPU: AdamW, SGD and LOMO's fused update (= SGD on one parameter).
// Same argument order as the CPU reference (adamw_cpu.hpp), plus the stream. Math per element
// in adamw_math.hpp (shared with the CPU); per-step constants computed on the host in double.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "trainmem/dtype.hpp"
#include "trainmem/op_types.hpp"

namespace trainmem {

// param (n) D ; grad (n) D ; master (n) f32 or nullptr ; m, v (n) f32 ; step >= 1.
// With master the update is applied to master and param = round(master); without, param is
// updated in fp32 and rounded into param. Each gradient element is used as
// float(grad) * grad_scale (1/S under a loss scale S).
void adamw_update_cuda(void* param, const void* grad, float* master, float* m, float* v,
                       std::int64_t n, const AdamWParams& hp, int step, float grad_scale, DType dt,
                       cudaStream_t stream);
// param -= lr * grad * grad_scale, through master when non-null (param = round(master)).
void sgd_update_cuda(void* param, const void* grad, float* master, std::int64_t n, float lr,
                     float grad_scale, DType dt, cudaStream_t stream);

}  // namespace trainmem
