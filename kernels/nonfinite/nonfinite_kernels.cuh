// Non-finite check kernel (launcher in nonfinite.cu). Device code only: also compiled as host
// C++ by the CPU emulator tests (tests/test_cuda_kernels_emulated.cpp).
#pragma once
#include <cstdint>

#include "common/common_math.hpp"
#include "common/cuda_device.cuh"
#include "common/storage.hpp"

namespace trainmem::cuda {

// *flag = 1 when any of x (n) S is +-inf or NaN; left as it was otherwise (the caller clears
// it). Grid-stride; each block ORs its threads' findings at one barrier and one thread of a
// block that found something writes the flag. Several blocks may store the same value, which
// needs no atomics.
template <class S>
__global__ void nonfinite_flag_kernel(unsigned* flag, const void* x, std::int64_t n) {
  int found = 0;
  for (std::int64_t i = cuda::global_thread_index(); i < n; i += cuda::global_thread_count())
    if (!tm_isfinite(S::load(x, i))) found = 1;
  if (__syncthreads_or(found) && threadIdx.x == 0) *flag = 1u;
}

}  // namespace trainmem::cuda
