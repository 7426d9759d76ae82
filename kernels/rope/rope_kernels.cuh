// RoPE kernel (launchers in rope.cu). Device code only: also compiled as host C++ by the CPU
// emulator tests (tests/test_cuda_kernels_emulated.cpp).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/cuda_device.cuh"
#include "common/storage.hpp"
#include "rope/rope_math.hpp"

namespace trainmem::cuda {

// ---------------------------------------------------------------- kernels

// x (b, s, heads, d) D: pairs = b*s*heads*(d/2), grid-stride over them. freq: the fp32
// constants of the frequency rule (rope_freq_params of rope_math.hpp); row t of a sequence at
// position pos.at(t).
template <class S>
__global__ void rope_kernel(void* x, std::int64_t pairs, std::int64_t s, std::int64_t heads,
                            std::int64_t d, RopeFreqParams freq, SeqPositions pos, float sign) {
  const std::int64_t half = d / 2;
  for (std::int64_t p = cuda::global_thread_index(); p < pairs; p += cuda::global_thread_count()) {
    const std::int64_t j = p % half;
    const std::int64_t row = p / half;  // (batch index * s + t) * heads + head
    const std::int64_t t = (row / heads) % s;
    const float angle = rope_scaled_angle(pos.at(t), j, d, freq);
    float sn, c;
    sincosf(angle, &sn, &c);
    const std::size_t i1 = std::size_t(row) * d + j;
    const std::size_t i2 = i1 + half;
    float x1 = S::load(x, i1);
    float x2 = S::load(x, i2);
    rope_rotate_pair<float>(&x1, &x2, c, sign * sn);
    S::store(x, i1, x1);
    S::store(x, i2, x2);
  }
}

}  // namespace trainmem::cuda
