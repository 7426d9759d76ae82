// Parameter initialisation, written once for the host and the CUDA kernel: every value is a
// pure function of (seed, stream, element index), so the cpu and cuda backends produce the
// same weights (and a tensor can be filled in any order, by any number of threads) without
// the host generating and uploading billions of values.
//
//   constant:  value
//   normal:    scale * N(0,1), Box-Muller in double from one 64-bit counter-based draw
//              (splitmix64 of splitmix64(seed * K + stream) + index)
//
// The double-precision log/cos/sqrt of the device and of the host C library agree to within
// an ulp or two of double, so after rounding to float the two sides give the same values
// except in the rare case that the exact result lies within that distance of a float rounding
// boundary.
#pragma once
#include <cmath>
#include <cstdint>

#include "trainmem/base/hd.hpp"

namespace trainmem {

struct ParamInit {
  enum class Kind { constant, normal };
  Kind kind = Kind::normal;
  float value = 0.0f;  // constant
  float scale = 1.0f;  // normal: standard deviation
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;  // one stream per tensor
};

TM_HD std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element `i` of stream `stream` under `seed`.
TM_HD std::uint64_t random_bits(std::uint64_t seed, std::uint64_t stream, std::uint64_t i) {
  return splitmix64(splitmix64(seed * 0x2545f4914f6cdd1dull + stream) + i);
}

// Standard normal by Box-Muller from one 64-bit draw: u1 in (0, 1) from the high 32 bits,
// u2 in [0, 1) from the low 32 bits.
TM_HD float normal_at(std::uint64_t seed, std::uint64_t stream, std::uint64_t i) {
  const std::uint64_t u = random_bits(seed, stream, i);
  const double u1 = (double(u >> 32) + 0.5) * (1.0 / 4294967296.0);
  const double u2 = double(u & 0xffffffffu) * (1.0 / 4294967296.0);
  return float(::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2));
}

TM_HD float param_init_value(const ParamInit& init, std::uint64_t i) {
  return init.kind == ParamInit::Kind::constant ? init.value
                                                : init.scale * normal_at(init.seed, init.stream, i);
}

}  // namespace trainmem
