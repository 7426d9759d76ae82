// Checked 64-bit size arithmetic. A 65B model at long sequence overflows 32 bits fast; every
// byte count in trainmem goes through these. Overflow throws OverflowError naming `what`.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>

#include "trainmem/base/error.hpp"

namespace trainmem {

inline std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, const char* what = "size") {
  std::uint64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    throw OverflowError(std::string(what) + ": product overflows 64 bits");
  return r;
}
inline std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, const char* what = "size") {
  std::uint64_t r;
  if (__builtin_add_overflow(a, b, &r))
    throw OverflowError(std::string(what) + ": sum overflows 64 bits");
  return r;
}
inline std::uint64_t checked_product(std::initializer_list<std::uint64_t> xs,
                                     const char* what = "size") {
  std::uint64_t r = 1;
  for (auto x : xs) r = checked_mul(r, x, what);
  return r;
}

}  // namespace trainmem
