// Residual add and dtype casts on the GPU, test-only (compiled into trainmem_gpu_tests, not the
// library; tests/gpu_test_backend.cpp checks them against dtype.hpp's host conversions).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "trainmem/base/dtype.hpp"

namespace trainmem {

// out (n) D = inp1 + inp2 (fp32 add, one rounding). out may alias inp1 or inp2.
void residual_forward_cuda(void* out, const void* inp1, const void* inp2, std::int64_t n, DType dt,
                           cudaStream_t stream);
// dst (n) in dst_dt = src (n) in src_dt, through fp32 with one rounding (round to nearest
// even; the same bit conversions as dtype.hpp on the host). Float dtypes only.
void cast_cuda(void* dst, DType dst_dt, const void* src, DType src_dt, std::int64_t n,
               cudaStream_t stream);

}  // namespace trainmem
