// LoRA dropout (peft gives every adapter its own nn.Dropout on the adapter's input), per
// element, shared by the CPU reference and the CUDA kernels.
//
// The mask is a pure function of (seed, stream, element): element e is kept when
// u = (the top 24 bits of random_bits(seed, stream, e)) · 2^-24, exact in float and uniform on
// [0, 1) in steps of 2^-24, is >= p. So a recompute (checkpointing) and every backend draw the
// same bits, in any order and with any number of threads.
// A kept element is scaled by 1/(1 − p) (inverted dropout, as torch), computed once in fp32 and
// rounded once to the output's dtype.
#pragma once
#include <cstdint>

#include "common/common_math.hpp"
#include "trainmem/base/param_init.hpp"

namespace trainmem {

TM_HD std::uint8_t dropout_keep(std::uint64_t seed, std::uint64_t stream, std::uint64_t e,
                                float p) {
  const float u = float(random_bits(seed, stream, e) >> 40) * (1.0f / 16777216.0f);
  return u >= p ? 1 : 0;
}

// (accumulate ? out : 0) + x · mask · scale.
TM_HD float dropout_apply_elem(float out, float x, std::uint8_t mask, float scale,
                               bool accumulate) {
  const float v = mask ? x * scale : 0.0f;
  return accumulate ? out + v : v;
}

}  // namespace trainmem
