// bitsandbytes' 4-bit and 8-bit blockwise quantization, CPU reference (math in quant4_math.hpp).
// Blocks (quantize) and chunks of elements (dequantize) in parallel; each element or block is
// computed by one thread in a fixed order, so the bits do not depend on the team size.
#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "quant4/dynamic_map.hpp"
#include "quant4/quant4.hpp"

namespace trainmem {

void quantize_4bit_cpu(std::uint8_t* packed, float* absmax, const void* x, std::int64_t n,
                       std::int64_t blocksize, Quant4Type t, DType dt) {
  check_quant_args("quantize_4bit_cpu", n, blocksize, true);
  cpu_threads_setup();
  const std::int64_t nb = quant_blocks(n, blocksize);
  dispatch_storage(dt, "quantize_4bit_cpu", [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (std::int64_t b = 0; b < nb; ++b)
      quantize_4bit_block<S>(packed, absmax, x, n, blocksize, b, t);
  });
}

void dequantize_4bit_cpu(void* out, const std::uint8_t* packed, const float* absmax, std::int64_t n,
                         std::int64_t blocksize, Quant4Type t, bool signed_zero, DType dt) {
  check_quant_args("dequantize_4bit_cpu", n, blocksize, false);
  cpu_threads_setup();
  dispatch_storage(dt, "dequantize_4bit_cpu", [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (std::int64_t i = 0; i < n; ++i)
      S::store(out, std::size_t(i),
               dequantize_4bit_elem(packed, absmax, i, blocksize, t, signed_zero));
  });
}

void quantize_blockwise8_cpu(std::uint8_t* q, float* absmax, const float* x, float sub,
                             std::int64_t n, std::int64_t blocksize, const std::uint8_t* lut) {
  check_quant_args("quantize_blockwise8_cpu", n, blocksize, false);
  cpu_threads_setup();
  const std::int64_t nb = quant_blocks(n, blocksize);
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (std::int64_t b = 0; b < nb; ++b)
    quantize_blockwise8_block(q, absmax, x, sub, n, blocksize, b, lut);
}

void dequantize_blockwise8_cpu(float* out, const std::uint8_t* q, const float* absmax,
                               const float* code, std::int64_t n, std::int64_t blocksize,
                               bool has_add, float add) {
  check_quant_args("dequantize_blockwise8_cpu", n, blocksize, false);
  cpu_threads_setup();
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = dequantize_blockwise8_elem(q, absmax, code, i, blocksize, has_add, add);
}

void quantize_int8_cpu(std::int8_t* cb, float* scb, const void* w, std::int64_t rows,
                       std::int64_t cols, DType dt) {
  check_int8_args("quantize_int8_cpu", rows, cols);
  cpu_threads_setup();
  dispatch_storage(dt, "quantize_int8_cpu", [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMinElements)
    for (std::int64_t r = 0; r < rows; ++r) quantize_int8_row<S>(cb, scb, w, cols, r);
  });
}

void dequantize_int8_cpu(void* out, const std::int8_t* cb, const float* scb, std::int64_t rows,
                         std::int64_t cols, DType dt) {
  check_int8_args("dequantize_int8_cpu", rows, cols);
  cpu_threads_setup();
  const std::int64_t n = rows * cols;
  dispatch_storage(dt, "dequantize_int8_cpu", [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (std::int64_t i = 0; i < n; ++i)
      S::store(out, std::size_t(i), dequantize_int8_elem(cb, scb, i, cols));
  });
}

float double_quant_offset(const float* absmax, std::int64_t nb) {
  if (nb <= 0) throw InputError("double_quant_offset: no absmax entries");
  double sum = 0.0;
  for (std::int64_t j = 0; j < nb; ++j) sum += double(absmax[j]);
  return float(sum) / float(nb);
}

void quant4_tables_host(float* code, float* nested_code, std::uint8_t* nested_lut, Quant4Type t) {
  for (int j = 0; j < 16; ++j) code[j] = quant4_code(t, j);
  if (nested_code)
    for (int j = 0; j < 256; ++j) nested_code[j] = kDynamicMapSigned[j];
  if (nested_lut) blockwise8_build_lut(kDynamicMapSigned, nested_lut);
}

}  // namespace trainmem
