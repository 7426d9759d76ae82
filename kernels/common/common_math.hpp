// Scalar helpers shared by the CPU reference and the CUDA kernels (TM_HD). Every *_math.hpp
// header builds on these; they are overloaded for float (kernels, the cpu backend) and double
// (finite-difference tests). Only C math functions that nvcc accepts in device code are used.
#pragma once
#include <math.h>

#include <cstdint>

#include "trainmem/base/hd.hpp"

namespace trainmem {

TM_HD float tm_exp(float x) {
  return ::expf(x);
}
TM_HD double tm_exp(double x) {
  return ::exp(x);
}
TM_HD float tm_log(float x) {
  return ::logf(x);
}
TM_HD double tm_log(double x) {
  return ::log(x);
}
TM_HD float tm_sqrt(float x) {
  return ::sqrtf(x);
}
TM_HD double tm_sqrt(double x) {
  return ::sqrt(x);
}
TM_HD float tm_pow(float x, float y) {
  return ::powf(x, y);
}
TM_HD double tm_pow(double x, double y) {
  return ::pow(x, y);
}
TM_HD float tm_cos(float x) {
  return ::cosf(x);
}
TM_HD double tm_cos(double x) {
  return ::cos(x);
}
TM_HD float tm_sin(float x) {
  return ::sinf(x);
}
TM_HD double tm_sin(double x) {
  return ::sin(x);
}

// a * b rounded on its own: nvcc contracts a product followed by an addition into one FMA
// (one rounding instead of two), the host compiler (x86-64 baseline, no FMA) does not. Where the
// CPU and CUDA code must round the same way as an fp32 reference evaluated op by op (PyTorch),
// the product is written with tm_mul_rn.
TM_HD float tm_mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// False for infinities and NaN.
TM_HD bool tm_isfinite(float x) {
  return isfinite(x);
}

template <class T>
TM_HD T tm_max(T a, T b) {
  return a > b ? a : b;
}
template <class T>
TM_HD T tm_neg_inf() {
  return -T(INFINITY);
}

}  // namespace trainmem
