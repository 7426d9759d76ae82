// Optimizer updates, CPU reference (math in adamw_math.hpp): AdamW, SGD, and LOMO's fused
// update (= SGD applied to one parameter as soon as its gradient is complete). Same argument
// order as the CUDA launchers (adamw_update_cuda(..., DType, cudaStream_t)).
#pragma once
#include <cstdint>

#include "trainmem/dtype.hpp"
#include "trainmem/op_types.hpp"

namespace trainmem {

// param (n) D ; grad (n) D ; master (n) f32 or nullptr ; m, v (n) f32 ; step >= 1.
// With master, the update is applied to master and param is written as round(master); without
// (D = fp32), param itself is updated (for a 16-bit D: in fp32, then rounded into param).
// Each gradient element is used as float(grad) * grad_scale (1/S under a loss scale S; 1: as
// stored).
void adamw_update_cpu(void* param, const void* grad, float* master, float* m, float* v,
                      std::int64_t n, const AdamWParams& hp, int step, float grad_scale, DType dt);
// param -= lr * grad * grad_scale, through master when non-null (param = round(master)). With
// master == nullptr and a 16-bit D the update is done in fp32 and rounded into param (LOMO).
void sgd_update_cpu(void* param, const void* grad, float* master, std::int64_t n, float lr,
                    float grad_scale, DType dt);

}  // namespace trainmem
