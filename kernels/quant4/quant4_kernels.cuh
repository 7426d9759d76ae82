// bitsandbytes' 4-bit and 8-bit blockwise quantization kernels (launchers in quant4.cu). Device
// code only: also compiled as host C++ by the CPU emulator tests
// (tests/test_cuda_kernels_emulated.cpp). Quantization: one thread per block (the block's
// absmax, then its elements, in the order of the CPU reference); dequantization: one thread per
// element, grid-stride.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/cuda_device.cuh"
#include "common/storage.hpp"
#include "quant4/quant4_math.hpp"

namespace trainmem::cuda {

template <class S>
__global__ void quantize_4bit_kernel(std::uint8_t* packed, float* absmax, const void* x,
                                     std::int64_t n, std::int64_t blocksize, std::int64_t nb,
                                     Quant4Type t) {
  for (std::int64_t b = cuda::global_thread_index(); b < nb; b += cuda::global_thread_count())
    quantize_4bit_block<S>(packed, absmax, x, n, blocksize, b, t);
}

template <class S>
__global__ void dequantize_4bit_kernel(void* out, const std::uint8_t* packed, const float* absmax,
                                       std::int64_t n, std::int64_t blocksize, Quant4Type t,
                                       bool signed_zero) {
  for (std::int64_t i = cuda::global_thread_index(); i < n; i += cuda::global_thread_count())
    S::store(out, std::size_t(i),
             dequantize_4bit_elem(packed, absmax, i, blocksize, t, signed_zero));
}

// static: this header is also compiled into the emulator tests, which link the launchers too.
static __global__ void quantize_blockwise8_kernel(std::uint8_t* q, float* absmax, const float* x,
                                                  float sub, std::int64_t n, std::int64_t blocksize,
                                                  std::int64_t nb, const std::uint8_t* lut) {
  for (std::int64_t b = cuda::global_thread_index(); b < nb; b += cuda::global_thread_count())
    quantize_blockwise8_block(q, absmax, x, sub, n, blocksize, b, lut);
}

static __global__ void dequantize_blockwise8_kernel(float* out, const std::uint8_t* q,
                                                    const float* absmax, const float* code,
                                                    std::int64_t n, std::int64_t blocksize,
                                                    bool has_add, float add) {
  for (std::int64_t i = cuda::global_thread_index(); i < n; i += cuda::global_thread_count())
    out[i] = dequantize_blockwise8_elem(q, absmax, code, i, blocksize, has_add, add);
}

template <class S>
__global__ void quantize_int8_kernel(std::int8_t* cb, float* scb, const void* w, std::int64_t rows,
                                     std::int64_t cols) {
  for (std::int64_t r = cuda::global_thread_index(); r < rows; r += cuda::global_thread_count())
    quantize_int8_row<S>(cb, scb, w, cols, r);
}

template <class S>
__global__ void dequantize_int8_kernel(void* out, const std::int8_t* cb, const float* scb,
                                       std::int64_t n, std::int64_t cols) {
  for (std::int64_t i = cuda::global_thread_index(); i < n; i += cuda::global_thread_count())
    S::store(out, std::size_t(i), dequantize_int8_elem(cb, scb, i, cols));
}

}  // namespace trainmem::cuda
