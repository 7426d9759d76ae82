// SwiGLU, CPU reference (math in swiglu_math.hpp): elementwise, in parallel, in chunks of
// kChunk elements. A chunk first takes exp(-g) of each element (libm expf, a scalar call) into
// a buffer, then runs the rest of swiglu_forward_elem / swiglu_backward_elem on it with the
// same operations in the same order (sigmoid(g) = 1 / (1 + exp(-g))). That second loop is
// compiled twice: for the baseline x86-64 and, chosen at run time on CPUs with AVX-512
// (F, BW, VL), 16-wide, with fp-contract off. The bits are those of the per-element functions
// whichever variant, chunking or team size runs.
#include <algorithm>

#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "swiglu/swiglu.hpp"
#include "swiglu/swiglu_math.hpp"

namespace trainmem {
namespace {

constexpr std::int64_t kChunk = 1024;

// The second loop of a chunk: e[k] holds exp(-gate[lo + k]).
template <class S>
inline __attribute__((always_inline)) void forward_rest(void* out, const void* gate,
                                                         const void* up, const float* e,
                                                         std::int64_t lo, std::int64_t hi) {
  for (std::int64_t i = lo; i < hi; ++i) {
    const float g = S::load(gate, i), u = S::load(up, i);
    const float sg = 1.0f / (1.0f + e[i - lo]);  // sigmoid(g)
    S::store(out, i, (g * sg) * u);              // silu(g) * u
  }
}
template <class S>
inline __attribute__((always_inline)) void backward_rest(void* dgate, void* dup,
                                                          const void* dout, const void* gate,
                                                          const void* up, const float* e,
                                                          std::int64_t lo, std::int64_t hi) {
  for (std::int64_t i = lo; i < hi; ++i) {
    const float d = S::load(dout, i), g = S::load(gate, i), u = S::load(up, i);
    const float sg = 1.0f / (1.0f + e[i - lo]);  // sigmoid(g)
    S::store(dgate, i, d * u * sg * (1.0f + g * (1.0f - sg)));
    S::store(dup, i, d * g * sg);
  }
}

template <class S>
__attribute__((noinline)) void forward_rest_base(void* out, const void* gate, const void* up,
                                                 const float* e, std::int64_t lo,
                                                 std::int64_t hi) {
  forward_rest<S>(out, gate, up, e, lo, hi);
}
template <class S>
__attribute__((noinline)) void backward_rest_base(void* dgate, void* dup, const void* dout,
                                                  const void* gate, const void* up,
                                                  const float* e, std::int64_t lo,
                                                  std::int64_t hi) {
  backward_rest<S>(dgate, dup, dout, gate, up, e, lo, hi);
}
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")
#pragma GCC optimize("fp-contract=off")
template <class S>
__attribute__((noinline)) void forward_rest_avx512(void* out, const void* gate, const void* up,
                                                   const float* e, std::int64_t lo,
                                                   std::int64_t hi) {
  forward_rest<S>(out, gate, up, e, lo, hi);
}
template <class S>
__attribute__((noinline)) void backward_rest_avx512(void* dgate, void* dup, const void* dout,
                                                    const void* gate, const void* up,
                                                    const float* e, std::int64_t lo,
                                                    std::int64_t hi) {
  backward_rest<S>(dgate, dup, dout, gate, up, e, lo, hi);
}
#pragma GCC pop_options

bool cpu_has_avx512bw() {
  static const bool has = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return has;
}

template <class S>
void exp_neg(float* e, const void* gate, std::int64_t lo, std::int64_t hi) {
  for (std::int64_t i = lo; i < hi; ++i) e[i - lo] = tm_exp(-S::load(gate, i));
}

template <class S>
void swiglu_forward_impl(void* out, const void* gate, const void* up, std::int64_t n) {
  const bool wide = cpu_has_avx512bw();
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (std::int64_t c = 0; c < chunks; ++c) {
    float e[kChunk];
    const std::int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    exp_neg<S>(e, gate, lo, hi);
    if (wide)
      forward_rest_avx512<S>(out, gate, up, e, lo, hi);
    else
      forward_rest_base<S>(out, gate, up, e, lo, hi);
  }
}

template <class S>
void swiglu_backward_impl(void* dgate, void* dup, const void* dout, const void* gate,
                          const void* up, std::int64_t n) {
  const bool wide = cpu_has_avx512bw();
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (std::int64_t c = 0; c < chunks; ++c) {
    float e[kChunk];
    const std::int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    exp_neg<S>(e, gate, lo, hi);
    if (wide)
      backward_rest_avx512<S>(dgate, dup, dout, gate, up, e, lo, hi);
    else
      backward_rest_base<S>(dgate, dup, dout, gate, up, e, lo, hi);
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
