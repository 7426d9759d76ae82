// bitsandbytes' 4-bit (NF4, FP4) and 8-bit blockwise quantization, per element and per block,
// shared by the CPU reference (quant4_cpu.cpp) and the CUDA kernels (quant4_kernels.cuh). The
// arithmetic is the one bitsandbytes 0.50.2 runs on the CPU, operation by operation, so that the
// stored bytes and the dequantized values are its bits (docs/lora-plan.md, sections 1.2-1.5;
// checked against tests/data/bnb by tests/test_ops_quant.cpp):
//
// 4-bit quantize (bnb's `quantize_4bit` default op, the one the CPU runs):
//   absmax_b = max |x| over the block of `blocksize` consecutive flat elements (the last block
//   may be partial); a whole block scales by x * (1 / max(absmax_b, 1e-38)), the partial last
//   block by x / max(absmax_b, 1e-38) and stores the clamped absmax; the scaled value, clamped
//   to [-1, 1], takes the index of the number of midpoints (c_j + c_j+1) / 2 of the sorted code
//   that lie strictly below it (torch.bucketize); FP4 maps that sorted position back to its
//   nibble. Two elements per byte, element 2j in the high nibble; an odd count pads the last low
//   nibble with the code of 0.0.
// 4-bit dequantize: code[nibble] * absmax_b in fp32, rounded once into the output dtype. bnb's CPU
//   kernel (used when the weight's last dimension is even) reads FP4's nibble 8 as -0.0, its
//   Python fallback (odd last dimension) as +0.0: `signed_zero` chooses.
// 8-bit blockwise quantize (bnb's CPU `quantize_blockwise`, a 65,536-entry lookup table):
//   absmax_b = max |x| (NaN ignored); a block whose absmax is 0 stores index 0 everywhere;
//   otherwise v = clamp(x * (1 / absmax_b), -1, 1) (NaN -> -1), t = ((v + 1) * 0.5) * 65535 +
//   0.5 rounded op by op, and the index is lut[trunc(t)], where lut[i] is the first code entry
//   whose upper midpoint is not below -1 + 2i / 65535.
// 8-bit dequantize: code[q] * absmax_b.
#pragma once
#include <cstdint>

#include "common/common_math.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/op_types.hpp"

namespace trainmem {

constexpr int kQuantLutSize = 65536;  // the 8-bit quantizer's lookup table

// bitsandbytes' `get_4bit_type`: NF4's values, and FP4's raw values divided by their maximum
// (12) in fp32. Index = the nibble.
TM_HD float quant4_code(Quant4Type t, int nibble) {
  const float nf4[16] = {-1.0f,
                         -0.6961928009986877f,
                         -0.5250730514526367f,
                         -0.39491748809814453f,
                         -0.28444138169288635f,
                         -0.18477343022823334f,
                         -0.09105003625154495f,
                         0.0f,
                         0.07958029955625534f,
                         0.16093020141124725f,
                         0.24611230194568634f,
                         0.33791524171829224f,
                         0.44070982933044434f,
                         0.5626170039176941f,
                         0.7229568362236023f,
                         1.0f};
  // Bit 3 is the sign; Python's `-0` in bnb's list is the integer 0, so nibble 8 is +0.0.
  const float fp4_raw[16] = {0.0f, 0.0625f,  8.0f,  12.0f,  4.0f,  6.0f,  2.0f,  3.0f,
                             0.0f, -0.0625f, -8.0f, -12.0f, -4.0f, -6.0f, -2.0f, -3.0f};
  return t == Quant4Type::nf4 ? nf4[nibble] : fp4_raw[nibble] / 12.0f;
}

// The value a nibble dequantizes to before scaling: the code, except FP4's nibble 8 which bnb's
// CPU kernel reads as -0.0 (signed_zero).
TM_HD float quant4_dequant_code(Quant4Type t, int nibble, bool signed_zero) {
  if (t == Quant4Type::fp4 && nibble == 8 && signed_zero) return -0.0f;
  return quant4_code(t, nibble);
}

// The nibble of a scaled value s in [-1, 1]: the count of midpoints of the sorted code strictly
// below s (NaN: none), mapped back through FP4's sort order (a stable sort of the code).
TM_HD int quant4_index(Quant4Type t, float s) {
  const int fp4_order[16] = {11, 10, 13, 12, 15, 14, 9, 0, 8, 1, 6, 7, 4, 5, 2, 3};
  const bool nf4 = t == Quant4Type::nf4;
  int count = 0;
  float lo = quant4_code(t, nf4 ? 0 : fp4_order[0]);
  for (int j = 0; j < 15; ++j) {
    const float hi = quant4_code(t, nf4 ? j + 1 : fp4_order[j + 1]);
    const float mid = (lo + hi) / 2.0f;
    if (mid < s) ++count;
    lo = hi;
  }
  return nf4 ? count : fp4_order[count];
}

// Quantizes 4-bit block b of x (n elements of storage S) into `packed` and `absmax`: the block's
// bytes [lo/2, ceil(hi/2)) (blocksize is even, so no two blocks share a byte).
template <class S>
TM_HD void quantize_4bit_block(std::uint8_t* packed, float* absmax, const void* x, std::int64_t n,
                               std::int64_t blocksize, std::int64_t b, Quant4Type t) {
  const std::int64_t lo = b * blocksize;
  const std::int64_t hi = lo + blocksize < n ? lo + blocksize : n;
  float am = 0.0f;  // torch's max: NaN wins
  for (std::int64_t i = lo; i < hi; ++i) {
    const float a = ::fabsf(S::load(x, std::size_t(i)));
    if (a != a || a > am) am = a;
    if (am != am) break;
  }
  const bool partial = hi - lo < blocksize;
  const float clamped = am < 1e-38f ? 1e-38f : am;  // torch.clamp(min=1e-38): NaN stays NaN
  absmax[b] = partial ? clamped : am;
  const float inv = 1.0f / clamped;
  auto index = [&](std::int64_t i) {
    const float xi = S::load(x, std::size_t(i));
    float s = partial ? xi / clamped : tm_mul_rn(xi, inv);
    s = s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s);
    return quant4_index(t, s);
  };
  for (std::int64_t i = lo; i < hi; i += 2) {
    const int high = index(i);
    const int low = i + 1 < hi ? index(i + 1) : quant4_index(t, 0.0f);  // odd n: the pad
    packed[i / 2] = std::uint8_t((high << 4) | low);
  }
}

// Element i of a dequantized 4-bit tensor, in fp32 (stored by the caller in its dtype).
TM_HD float dequantize_4bit_elem(const std::uint8_t* packed, const float* absmax, std::int64_t i,
                                 std::int64_t blocksize, Quant4Type t, bool signed_zero) {
  const std::uint8_t byte = packed[i / 2];
  const int nibble = (i & 1) ? (byte & 0xF) : (byte >> 4);
  return tm_mul_rn(quant4_dequant_code(t, nibble, signed_zero), absmax[i / blocksize]);
}

// ---------------------------------------------------------------- 8-bit blockwise

// The lookup table's index of a value scaled by its block's absmax.
TM_HD int blockwise8_lut_index(float v) {
  v = v > -1.0f ? v : -1.0f;  // as _mm256_max_ps(v, -1): NaN -> -1
  v = v < 1.0f ? v : 1.0f;
  float t = tm_mul_rn(v + 1.0f, 0.5f);
  t = tm_mul_rn(t, float(kQuantLutSize - 1)) + 0.5f;
  return int(t);  // truncation; t lies in [0.5, 65535.5]
}

// lut (kQuantLutSize entries) for a sorted 256-entry code: entry i is the first code index
// whose upper midpoint 0.5 * (c_j + c_j+1) is not below -1 + 2i / 65535.
inline void blockwise8_build_lut(const float* code, std::uint8_t* lut) {
  float mid[255];
  for (int j = 0; j < 255; ++j) mid[j] = tm_mul_rn(0.5f, code[j] + code[j + 1]);
  int j = 0;
  for (int i = 0; i < kQuantLutSize; ++i) {
    const float val = -1.0f + (2.0f * float(i)) / float(kQuantLutSize - 1);
    while (j < 255 && mid[j] < val) ++j;
    lut[i] = std::uint8_t(j);
  }
}

// Quantizes 8-bit block b of x - sub (fp32, n elements) into q and absmax[b] through lut.
TM_HD void quantize_blockwise8_block(std::uint8_t* q, float* absmax, const float* x, float sub,
                                     std::int64_t n, std::int64_t blocksize, std::int64_t b,
                                     const std::uint8_t* lut) {
  const std::int64_t lo = b * blocksize, hi = lo + blocksize < n ? lo + blocksize : n;
  float am = 0.0f;  // NaN ignored
  for (std::int64_t i = lo; i < hi; ++i) {
    const float a = ::fabsf(x[i] - sub);
    if (a > am) am = a;
  }
  absmax[b] = am;
  if (am == 0.0f) {
    for (std::int64_t i = lo; i < hi; ++i) q[i] = 0;
    return;
  }
  const float inv = 1.0f / am;
  for (std::int64_t i = lo; i < hi; ++i)
    q[i] = lut[blockwise8_lut_index(tm_mul_rn(x[i] - sub, inv))];
}

// Element i of a dequantized 8-bit tensor (+ add, a second rounding, when has_add).
TM_HD float dequantize_blockwise8_elem(const std::uint8_t* q, const float* absmax,
                                       const float* code, std::int64_t i, std::int64_t blocksize,
                                       bool has_add, float add) {
  const float v = tm_mul_rn(code[q[i]], absmax[i / blocksize]);
  return has_add ? v + add : v;
}

// bitsandbytes' row-wise 8-bit weight (LLM.int8's Int8Params._quantize, bnb 0.50.2: the weight
// cast to fp16, then backends/default/ops.py int8_vectorwise_quant with threshold 0; the
// docs/formulas.md section "8-bit base in the native step"): per row the absmax of the fp16
// values (SCB, fp32), scale = fp32(fp32(1/SCB)·127) (torch's `127.0 / t` is a reciprocal times
// 127), CB = rint(fp32(w16)·scale) rounded half to even into int8 (|CB| <= 127 by construction).
// A row of zeros stores SCB 0 and CB 0 (bnb's NaN cast, 0 on the CPUs seen); so does a row whose
// absmax is not finite (a weight beyond fp16's range: bnb's inf·0 cast, undefined in C).
template <class S>
TM_HD void quantize_int8_row(std::int8_t* cb, float* scb, const void* w, std::int64_t cols,
                             std::int64_t row) {
  const std::int64_t lo = row * cols;
  float am = 0.0f;
  for (std::int64_t j = 0; j < cols; ++j) {
    const float a = ::fabsf(f16_to_f32(f32_to_f16(S::load(w, std::size_t(lo + j)))));
    if (a > am) am = a;
  }
  scb[row] = am;
  const bool scaled = am > 0.0f && am <= 3.402823466e38f;  // finite and not zero
  const float scale = scaled ? tm_mul_rn(1.0f / am, 127.0f) : 0.0f;
  for (std::int64_t j = 0; j < cols; ++j) {
    const float v = f16_to_f32(f32_to_f16(S::load(w, std::size_t(lo + j))));
    cb[lo + j] = scaled ? static_cast<std::int8_t>(::rintf(tm_mul_rn(v, scale))) : 0;
  }
}

// Element i of the dequantized weight as MatMul8bitLt and MatMul8bitFp build it for their GEMMs
// (autograd/_functions.py: CB.to(dt).mul_(SCB[:, None] * (1 / 127))): fp32(CB) times
// fp32(SCB · fp32(1/127)), rounded once into the output dtype by the caller.
TM_HD float dequantize_int8_elem(const std::int8_t* cb, const float* scb, std::int64_t i,
                                 std::int64_t cols) {
  const float row_scale = tm_mul_rn(scb[i / cols], 1.0f / 127.0f);
  return tm_mul_rn(static_cast<float>(cb[i]), row_scale);
}

}  // namespace trainmem
