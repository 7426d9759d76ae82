// bitsandbytes' AdamW8bit on trainmem's tensors: the 8-bit blockwise update of a tensor of
// 4,096 elements or more, and the fp32-state update bitsandbytes applies to smaller ones
// (min_8bit_size). The CPU reference (adamw8bit_cpu.cpp) and the CUDA launchers (adamw8bit.cu,
// kernels in adamw8bit_kernels.cuh) side by side, in the same argument order (CUDA: plus the
// stream); the arithmetic in adamw8bit_math.hpp.
#pragma once
#include <cstdint>
#include <string>

#include "adamw8bit/adamw8bit_math.hpp"
#include "common/cuda_handles.hpp"
#include "quant4/quant4.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {

// The arguments both updates check, CPU and CUDA alike: n >= 0, step >= 1 (bias correction).
inline void check_bnb_adamw_args(const char* op, std::int64_t n, int step) {
  if (n < 0) throw InputError(std::string(op) + ": n must be >= 0, got " + std::to_string(n));
  if (step < 1)
    throw InputError(std::string(op) + ": step must be >= 1 (bias correction), got " +
                     std::to_string(step));
}

// The update's shared constants, on the host: the signed and unsigned dynamic maps (256 f32
// each, bitsandbytes' create_dynamic_map) and their lookup tables (kQuantLutSize u8 each,
// blockwise8_build_lut). The backends copy them to where the update runs.
void bnb_adamw8bit_tables_host(float* qmap_signed, float* qmap_unsigned, std::uint8_t* lut_signed,
                               std::uint8_t* lut_unsigned);
static_assert(kBnbLutEntries == kQuantLutSize, "op_types.hpp's LUT size is the quantizer's");
static_assert(kBnbMapEntries == 256 && kBnbStateBlock == kBlockwise8Size,
              "op_types.hpp's map and block sizes are the kernels'");

// param (n) dt, grad (n) dt; s1, s2 (n) u8; absmax1, absmax2 (quant_blocks(n, 256)) f32;
// qmap1 / qmap2: the signed / unsigned dynamic maps (256 f32) and lut1 / lut2 their lookup
// tables (blockwise8_build_lut); device memory for CUDA. step >= 1.
// CPU: blocks in parallel. CUDA: one thread per block of 256.
void bnb_adamw8bit_update_cpu(void* param, const void* grad, std::uint8_t* s1, std::uint8_t* s2,
                              float* absmax1, float* absmax2, const float* qmap1,
                              const float* qmap2, const std::uint8_t* lut1,
                              const std::uint8_t* lut2, std::int64_t n, const BnbAdamWParams& hp,
                              int step, DType dt);
void bnb_adamw8bit_update_cuda(void* param, const void* grad, std::uint8_t* s1, std::uint8_t* s2,
                               float* absmax1, float* absmax2, const float* qmap1,
                               const float* qmap2, const std::uint8_t* lut1,
                               const std::uint8_t* lut2, std::int64_t n, const BnbAdamWParams& hp,
                               int step, DType dt, cudaStream_t stream);

// The fp32-state update: m, v (n) f32. CUDA: one thread per element.
void bnb_adamw32_update_cpu(void* param, const void* grad, float* m, float* v, std::int64_t n,
                            const BnbAdamWParams& hp, int step, DType dt);
void bnb_adamw32_update_cuda(void* param, const void* grad, float* m, float* v, std::int64_t n,
                             const BnbAdamWParams& hp, int step, DType dt, cudaStream_t stream);

}  // namespace trainmem
