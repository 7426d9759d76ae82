// Token embedding, CPU reference. Same argument order as the CUDA launchers
// (embedding_forward_cuda(..., DType, cudaStream_t)).
#pragma once
#include <cstdint>

#include "trainmem/dtype.hpp"

namespace trainmem {

// out (B,T,C) D = wte[tokens] ; tokens (B,T) int32 in [0, V) ; wte (V,C) D.
// Throws InputError("tokens: ...") for an id outside [0, V).
void embedding_forward_cpu(void* out, const std::int32_t* tokens, const void* wte, std::int64_t B,
                           std::int64_t T, std::int64_t C, std::int64_t V, DType dt);
// dwte (V,C) D += scatter of dout (B,T,C) D by tokens (rows of repeated ids add up in fp32
// and are rounded once into dwte).
void embedding_backward_cpu(void* dwte, const void* dout, const std::int32_t* tokens,
                            std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t V,
                            DType dt);

}  // namespace trainmem
