// bitsandbytes' 4-bit and 8-bit blockwise quantization on the GPU (math in quant4_math.hpp,
// kernels in quant4_kernels.cuh).
#include "common/cuda_common.cuh"
#include "quant4/quant4.hpp"
#include "quant4/quant4_kernels.cuh"

namespace trainmem {
namespace {

constexpr int kThreads = cuda::kElementwiseThreads;

}  // namespace

void quantize_4bit_cuda(std::uint8_t* packed, float* absmax, const void* x, std::int64_t n,
                        std::int64_t blocksize, Quant4Type t, DType dt, cudaStream_t stream) {
  check_quant_args("quantize_4bit_cuda", n, blocksize, true);
  if (n == 0) return;
  const std::int64_t nb = quant_blocks(n, blocksize);
  dispatch_storage(dt, "quantize_4bit_cuda", [&](auto tag) {
    cuda::quantize_4bit_kernel<decltype(tag)>
        <<<cuda::grid_for(nb, kThreads), kThreads, 0, stream>>>(packed, absmax, x, n, blocksize, nb,
                                                                t);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void dequantize_4bit_cuda(void* out, const std::uint8_t* packed, const float* absmax,
                          std::int64_t n, std::int64_t blocksize, Quant4Type t, bool signed_zero,
                          DType dt, cudaStream_t stream) {
  check_quant_args("dequantize_4bit_cuda", n, blocksize, false);
  if (n == 0) return;
  dispatch_storage(dt, "dequantize_4bit_cuda", [&](auto tag) {
    cuda::dequantize_4bit_kernel<decltype(tag)>
        <<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(out, packed, absmax, n, blocksize, t,
                                                               signed_zero);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void quantize_blockwise8_cuda(std::uint8_t* q, float* absmax, const float* x, float sub,
                              std::int64_t n, std::int64_t blocksize, const std::uint8_t* lut,
                              cudaStream_t stream) {
  check_quant_args("quantize_blockwise8_cuda", n, blocksize, false);
  if (n == 0) return;
  const std::int64_t nb = quant_blocks(n, blocksize);
  cuda::quantize_blockwise8_kernel<<<cuda::grid_for(nb, kThreads), kThreads, 0, stream>>>(
      q, absmax, x, sub, n, blocksize, nb, lut);
  TM_CUDA_CHECK_LAUNCH();
}

void dequantize_blockwise8_cuda(float* out, const std::uint8_t* q, const float* absmax,
                                const float* code, std::int64_t n, std::int64_t blocksize,
                                bool has_add, float add, cudaStream_t stream) {
  check_quant_args("dequantize_blockwise8_cuda", n, blocksize, false);
  if (n == 0) return;
  cuda::dequantize_blockwise8_kernel<<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
      out, q, absmax, code, n, blocksize, has_add, add);
  TM_CUDA_CHECK_LAUNCH();
}

void quantize_int8_cuda(std::int8_t* cb, float* scb, const void* w, std::int64_t rows,
                        std::int64_t cols, DType dt, cudaStream_t stream) {
  check_int8_args("quantize_int8_cuda", rows, cols);
  if (rows == 0) return;  // cols 0: every row's SCB is written 0
  dispatch_storage(dt, "quantize_int8_cuda", [&](auto tag) {
    cuda::quantize_int8_kernel<decltype(tag)>
        <<<cuda::grid_for(rows, kThreads), kThreads, 0, stream>>>(cb, scb, w, rows, cols);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void dequantize_int8_cuda(void* out, const std::int8_t* cb, const float* scb, std::int64_t rows,
                          std::int64_t cols, DType dt, cudaStream_t stream) {
  check_int8_args("dequantize_int8_cuda", rows, cols);
  const std::int64_t n = rows * cols;
  if (n == 0) return;
  dispatch_storage(dt, "dequantize_int8_cuda", [&](auto tag) {
    cuda::dequantize_int8_kernel<decltype(tag)>
        <<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(out, cb, scb, n, cols);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace trainmem
