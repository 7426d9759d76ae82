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

// x (B,T,H,HD) D: pairs = B*T*H*(HD/2), grid-stride over them.
template <class S>
__global__ void rope_kernel(void* x, std::int64_t pairs, std::int64_t T, std::int64_t H,
                            std::int64_t HD, float theta, float sign) {
  const std::int64_t half = HD / 2;
  for (std::int64_t p = cuda::global_thread_index(); p < pairs; p += cuda::global_thread_count()) {
    const std::int64_t j = p % half;
    const std::int64_t row = p / half;  // (b*T + t)*H + h
    const std::int64_t t = (row / H) % T;
    const float angle = rope_angle<float>(t, j, HD, theta);
    float s, c;
    sincosf(angle, &s, &c);
    const std::size_t i1 = std::size_t(row) * HD + j;
    const std::size_t i2 = i1 + half;
    float x1 = S::load(x, i1);
    float x2 = S::load(x, i2);
    rope_rotate_pair<float>(&x1, &x2, c, sign * s);
    S::store(x, i1, x1);
    S::store(x, i2, x2);
  }
}

}  // namespace trainmem::cuda
