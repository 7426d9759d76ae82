// SwiGLU, CPU reference (math in swiglu_math.hpp): elementwise, in parallel.
#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "swiglu/swiglu.hpp"
#include "swiglu/swiglu_math.hpp"

namespace trainmem {
namespace {

template <class S>
void swiglu_forward_impl(void* out, const void* gate, const void* up, std::int64_t n) {
#pragma omp parallel for if (n >= kParallelMinElements)
  for (std::int64_t i = 0; i < n; ++i)
    S::store(out, i, swiglu_forward_elem(S::load(gate, i), S::load(up, i)));
}

template <class S>
void swiglu_backward_impl(void* dgate, void* dup, const void* dout, const void* gate,
                          const void* up, std::int64_t n) {
#pragma omp parallel for if (n >= kParallelMinElements)
  for (std::int64_t i = 0; i < n; ++i) {
    float dg, du;
    swiglu_backward_elem(S::load(dout, i), S::load(gate, i), S::load(up, i), &dg, &du);
    S::store(dgate, i, dg);
    S::store(dup, i, du);
  }
}

}  // namespace

void swiglu_forward_cpu(void* out, const void* gate, const void* up, std::int64_t n, DType dt) {
  cpu_threads_setup();
  dispatch_storage(dt, "swiglu_forward",
                   [&](auto tag) { swiglu_forward_impl<decltype(tag)>(out, gate, up, n); });
}

void swiglu_backward_cpu(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                         std::int64_t n, DType dt) {
  cpu_threads_setup();
  dispatch_storage(dt, "swiglu_backward", [&](auto tag) {
    swiglu_backward_impl<decltype(tag)>(dgate, dup, dout, gate, up, n);
  });
}

}  // namespace trainmem
