// fill and axpy: the smallest kernels in trainmem, test-only (compiled into trainmem_gpu_tests,
// not the library). They prove the CUDA build, link, launch and skip path end to end
// (tests/gpu_test_fill.cu).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace trainmem {

// out (n) f32 = value
void fill_f32(float* out, float value, std::int64_t n, cudaStream_t stream);
// y (n) f32 += alpha * x (n) f32
void axpy_f32(float* y, const float* x, float alpha, std::int64_t n, cudaStream_t stream);

}  // namespace trainmem
