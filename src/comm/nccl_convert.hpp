// fp32 work copies of 16-bit buffers for the NCCL sums (src/comm/nccl_convert.cu): NCCL adds in
// fp32 and the result is rounded once to the buffer's dtype.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "trainmem/base/dtype.hpp"

namespace trainmem::comm {

// out[i] = in[i] as fp32 (in: n elements of t, device).
void to_f32_async(const void* in, float* out, std::size_t n, DType t, cudaStream_t stream);
// out[i] = in[i] rounded to t (round to nearest even).
void from_f32_async(const float* in, void* out, std::size_t n, DType t, cudaStream_t stream);

}  // namespace trainmem::comm
