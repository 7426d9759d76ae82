// Bias add and its backward, the shared pieces. The backward's column sum runs in a fixed
// order that does not depend on threads (CPU) or blocks (CUDA): for column j,
//   partial[y] = sum over rows r = y, y + kBiasRowLanes, y + 2 kBiasRowLanes, ... (in that
//                order, fp32, starting from 0)   for y = 0 .. kBiasRowLanes-1,
//   total      = partial[0] + partial[1] + ... + partial[kBiasRowLanes-1]   (left to right),
//   dbias[j]   = round(dbias[j] + total).
// The CUDA kernel's block (32, kBiasRowLanes) computes exactly this (thread y of a column owns
// partial[y]); the CPU reference computes it per column in one thread. Only additions: no
// contraction into FMA can change them, so both give the same bits.
#pragma once
#include <cstdint>

#include "common/common_math.hpp"

namespace trainmem {

constexpr int kBiasRowLanes = 16;  // strided row partials per column
constexpr int kBiasColumns = 32;   // columns per CUDA block (one per lane)

}  // namespace trainmem
