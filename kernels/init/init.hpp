// Parameter initialisation on the GPU: the same values as the host path of
// Backend::init_param (include/trainmem/base/param_init.hpp, which is the CPU side: the generator
// is written once, TM_HD), computed where they are stored. Launcher in init.cu, kernel in
// init_kernels.cuh.
#pragma once
#include <cstdint>

#include "common/cuda_handles.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/param_init.hpp"

namespace trainmem {

// dst (n) D = round(param_init_value(init, i)); master (n) f32 = param_init_value(init, i)
// when non-null.
void init_param_cuda(void* dst, float* master, std::int64_t n, const ParamInit& init, DType dt,
                     cudaStream_t stream);

}  // namespace trainmem
