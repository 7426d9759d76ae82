// bitsandbytes' 4-bit weight storage (NF4, FP4, blockwise absmax, double quantization of the
// absmax) and its 8-bit blockwise quantization. The CPU reference (quant4_cpu.cpp) and the CUDA
// launchers (quant4.cu, kernels in quant4_kernels.cuh) side by side, in the same argument order
// (CUDA: plus the stream). The arithmetic, per element and per block, is in quant4_math.hpp,
// shared by both; docs/formulas.md ("4-bit weights") gives the layout and the bytes.
#pragma once
#include <cstdint>
#include <string>

#include "common/cuda_handles.hpp"
#include "quant4/quant4_math.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {

// Bytes of a packed 4-bit tensor of n elements, and blocks of `blocksize` over n elements.
constexpr std::int64_t quant4_packed_bytes(std::int64_t n) {
  return (n + 1) / 2;
}
constexpr std::int64_t quant_blocks(std::int64_t n, std::int64_t blocksize) {
  return (n + blocksize - 1) / blocksize;
}
// The nested absmax of double quantization (and 8-bit optimizer state) uses blocks of 256.
constexpr std::int64_t kBlockwise8Size = 256;

// The int8 ops' shape: rows, cols >= 0 (InputError naming `op`).
inline void check_int8_args(const char* op, std::int64_t rows, std::int64_t cols) {
  if (rows < 0 || cols < 0)
    throw InputError(std::string(op) + ": rows and cols must be >= 0, got " + std::to_string(rows) +
                     " x " + std::to_string(cols));
}

// The arguments every quantization op checks, CPU and CUDA alike: n >= 0 and a positive
// blocksize (even for 4-bit, whose blocks must not share a byte). InputError naming `op`.
inline void check_quant_args(const char* op, std::int64_t n, std::int64_t blocksize, bool even) {
  if (n < 0) throw InputError(std::string(op) + ": n must be >= 0, got " + std::to_string(n));
  if (blocksize <= 0 || (even && blocksize % 2 != 0))
    throw InputError(std::string(op) + ": blocksize must be " + (even ? "even and " : "") +
                     "positive, got " + std::to_string(blocksize));
}

// packed (quant4_packed_bytes(n)) u8, absmax (quant_blocks(n, blocksize)) f32 <- x (n) dt.
// blocksize: even and positive (bnb allows 32 ... 4096). CPU: blocks in parallel.
// CUDA: one thread per block.
void quantize_4bit_cpu(std::uint8_t* packed, float* absmax, const void* x, std::int64_t n,
                       std::int64_t blocksize, Quant4Type t, DType dt);
void quantize_4bit_cuda(std::uint8_t* packed, float* absmax, const void* x, std::int64_t n,
                        std::int64_t blocksize, Quant4Type t, DType dt, cudaStream_t stream);

// out (n) dt = code[nibble] * absmax[i / blocksize], rounded once. signed_zero: FP4's nibble 8
// reads -0.0, as bnb's CPU kernel does for a weight whose last dimension is even (its fallback
// for an odd one reads +0.0).
void dequantize_4bit_cpu(void* out, const std::uint8_t* packed, const float* absmax, std::int64_t n,
                         std::int64_t blocksize, Quant4Type t, bool signed_zero, DType dt);
void dequantize_4bit_cuda(void* out, const std::uint8_t* packed, const float* absmax,
                          std::int64_t n, std::int64_t blocksize, Quant4Type t, bool signed_zero,
                          DType dt, cudaStream_t stream);

// 8-bit blockwise: q (n) u8, absmax (quant_blocks(n, blocksize)) f32 <- x - sub (fp32, n),
// through `lut` (kQuantLutSize entries, blockwise8_build_lut of the code; device memory for
// CUDA). sub 0 quantizes x itself (x - 0 is x, bit for bit).
void quantize_blockwise8_cpu(std::uint8_t* q, float* absmax, const float* x, float sub,
                             std::int64_t n, std::int64_t blocksize, const std::uint8_t* lut);
void quantize_blockwise8_cuda(std::uint8_t* q, float* absmax, const float* x, float sub,
                              std::int64_t n, std::int64_t blocksize, const std::uint8_t* lut,
                              cudaStream_t stream);
// out (n) f32 = code[q] * absmax[i / blocksize] (+ add, a second rounding, when has_add: the
// offset of a double-quantized absmax). code: 256 f32 (device memory for CUDA).
void dequantize_blockwise8_cpu(float* out, const std::uint8_t* q, const float* absmax,
                               const float* code, std::int64_t n, std::int64_t blocksize,
                               bool has_add, float add);
void dequantize_blockwise8_cuda(float* out, const std::uint8_t* q, const float* absmax,
                                const float* code, std::int64_t n, std::int64_t blocksize,
                                bool has_add, float add, cudaStream_t stream);

// The 8-bit base (--quant int8): cb (rows·cols) int8 and scb (rows) f32 <- w (rows, cols) dt,
// quantize_int8_row per row (CPU: rows in parallel; CUDA: one thread per row); out (rows·cols)
// dt = dequantize_int8_elem, rounded once.
void quantize_int8_cpu(std::int8_t* cb, float* scb, const void* w, std::int64_t rows,
                       std::int64_t cols, DType dt);
void quantize_int8_cuda(std::int8_t* cb, float* scb, const void* w, std::int64_t rows,
                        std::int64_t cols, DType dt, cudaStream_t stream);
void dequantize_int8_cpu(void* out, const std::int8_t* cb, const float* scb, std::int64_t rows,
                         std::int64_t cols, DType dt);
void dequantize_int8_cuda(void* out, const std::int8_t* cb, const float* scb, std::int64_t rows,
                          std::int64_t cols, DType dt, cudaStream_t stream);

// The constants of one 4-bit weight, on the host: code (16 f32, type t's values, as
// QuantState.code), nested_code (256 f32, bitsandbytes' signed dynamic map, the code of the
// double-quantized absmax) and nested_lut (kQuantLutSize u8, blockwise8_build_lut of it); a
// nullptr nested table is skipped.
void quant4_tables_host(float* code, float* nested_code, std::uint8_t* nested_lut, Quant4Type t);

// Double quantization's offset: the mean of the fp32 absmax (nb entries), summed in double and
// rounded once, then divided by nb in fp32. bnb takes torch's fp32 `mean()`, whose summation
// order can differ from the exact sum in the last bit; tests/test_ops_quant.cpp states by how
// much on the goldens. Host arithmetic (the absmax is small: n / blocksize entries).
float double_quant_offset(const float* absmax, std::int64_t nb);

}  // namespace trainmem
