// SwiGLU (LLaMA MLP), per element: out = silu(g) * u with silu(g) = g * sigmoid(g).
// Backward: dg = dout * u * s * (1 + g * (1 - s)) with s = sigmoid(g); du = dout * silu(g).
#pragma once
#include "common/common_math.hpp"

namespace trainmem {

template <class T>
TM_HD T sigmoid(T x) {
  return T(1) / (T(1) + tm_exp(-x));
}
template <class T>
TM_HD T silu(T x) {
  return x * sigmoid(x);
}
template <class T>
TM_HD T swiglu_forward_elem(T g, T u) {
  return silu(g) * u;
}
template <class T>
TM_HD void swiglu_backward_elem(T dout, T g, T u, T* dg, T* du) {
  const T s = sigmoid(g);
  *dg = dout * u * s * (T(1) + g * (T(1) - s));
  *du = dout * g * s;
}

}  // namespace trainmem
