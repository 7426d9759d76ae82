// Storage dtypes and the 16-bit <-> fp32 conversions shared by the CPU reference and the
// CUDA kernels (bit-exact on both: round to nearest even, NaN kept quiet).
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "trainmem/base/hd.hpp"

namespace trainmem {

// f32, f16, bf16 are training dtypes; i32 holds token ids and labels.
// u8: storage only (bitsandbytes' 8-bit optimizer states); no op computes in it.
enum class DType : std::uint8_t { f32, f16, bf16, i32, u8 };

constexpr std::size_t dtype_size(DType t) {
  return t == DType::u8 ? 1 : t == DType::f16 || t == DType::bf16 ? 2 : 4;
}
const char* dtype_name(DType t);  // "fp32", "fp16", "bf16", "int32", "uint8"
// Accepts fp32|float32|f32, fp16|float16|f16|half, bf16|bfloat16. nullopt otherwise.
std::optional<DType> parse_dtype(const std::string& s);

// ---- bit conversions, usable in kernels (TM_HD) ----
TM_HD std::uint32_t f32_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
TM_HD float bits_f32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
TM_HD float bf16_to_f32(std::uint16_t h) {
  return bits_f32(std::uint32_t(h) << 16);
}
TM_HD std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                              // RNE
  return std::uint16_t(u >> 16);
}
TM_HD float f16_to_f32(std::uint16_t h) {
  std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return bits_f32(sign);
    // subnormal: value = man * 2^-24
    float v = float(man) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13));
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}
TM_HD std::uint16_t f32_to_f16(float f) {
  std::uint32_t u = f32_bits(f);
  std::uint32_t sign = (u >> 16) & 0x8000u;
  std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return std::uint16_t(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // overflow (>= 65520) -> inf
  if (a < 0x38800000u) {                                       // subnormal or zero in f16
    if (a < 0x33000000u) return std::uint16_t(sign);           // < 2^-25 rounds to 0
    std::uint32_t exp = a >> 23;
    std::uint32_t man = (a & 0x7fffffu) | 0x800000u;
    std::uint32_t shift = 126u - exp;  // 14 + (112 - exp) + 0
    // value = man * 2^(exp-150); f16 subnormal unit 2^-24 -> man >> (126-exp)
    std::uint32_t q = man >> shift;
    std::uint32_t rem = man & ((1u << shift) - 1u);
    std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return std::uint16_t(sign | q);
  }
  std::uint32_t r = a + 0xfffu + ((a >> 13) & 1u);  // RNE on the 13 dropped bits
  return std::uint16_t(sign | (((r >> 13) - (112u << 10)) & 0x7fffu));
}

// Load/store one element of a 16/32-bit float buffer as fp32.
TM_HD float load_as_f32(const void* p, std::size_t i, DType t) {
  if (t == DType::f32) return static_cast<const float*>(p)[i];
  std::uint16_t h = static_cast<const std::uint16_t*>(p)[i];
  return t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}
TM_HD void store_from_f32(void* p, std::size_t i, DType t, float v) {
  if (t == DType::f32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<std::uint16_t*>(p)[i] = t == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
  }
}
// Round an fp32 value through a storage dtype (what a store then a load returns).
TM_HD float round_to(DType t, float v) {
  if (t == DType::bf16) return bf16_to_f32(f32_to_bf16(v));
  if (t == DType::f16) return f16_to_f32(f32_to_f16(v));
  return v;
}

}  // namespace trainmem
