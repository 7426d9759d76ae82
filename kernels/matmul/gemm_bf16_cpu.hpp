// bf16 GEMM for CPUs with AVX512-BF16 (VDPBF16PS): bf16 operands, fp32 accumulation, the fp32
// result rounded once into bf16 c (round to nearest even, as storage.hpp's BF16). Used by
// matmul_cpu for DType::bf16 when the CPU has the instructions (see matmul.hpp for the
// switch); only the functions that need the instructions are compiled for them, so the build
// stays generic and this file is safe to call into after cpu_has_avx512_bf16().
//
// VDPBF16PS treats bf16 subnormal inputs as zero and flushes subnormal fp32 sums to zero; the
// generic path (widen + sgemm) does not. Both are within the bf16 tolerance of an exact product.
#pragma once
#include <cstdint>

#include "trainmem/base/op_types.hpp"

namespace trainmem {

// True when the CPU (and the OS: zmm state saved) supports avx512f, avx512bw, avx512vl and
// avx512_bf16.
bool cpu_has_avx512_bf16();

// c (M,N) = alpha * op(a) * op(b) + beta * c, row-major bf16 bit patterns, same layouts and
// Trans meaning as matmul_cpu. beta == 0 never reads c. Precondition: cpu_has_avx512_bf16().
// Threads: c is cut into the blocks of gemm_split (shape only); every element is computed by the
// same instruction sequence whichever block or thread holds it, so the bits do not depend on the
// team size.
void gemm_bf16_avx512(std::uint16_t* c, const std::uint16_t* a, const std::uint16_t* b,
                      std::int64_t M, std::int64_t N, std::int64_t K, Trans ta, Trans tb,
                      float alpha, float beta);

}  // namespace trainmem
