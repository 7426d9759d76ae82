// Ring attention's block kernels, CPU reference (attention_ring.hpp): the per-row pieces of
// attention_ring_math.hpp (shared with the CUDA kernels), one OpenMP task per (batch, head) of
// rows. Every output element has one writer and a fixed order of operations: results do not
// depend on the thread count. Written for clarity, not speed: the measured context-parallel
// runs are small.
#include <string>
#include <vector>

#include "attention/attention_ring.hpp"
#include "attention/attention_ring_math.hpp"
#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

void check(const RingShape& x, const char* op) {
  if (x.b < 1 || x.sq < 1 || x.sk < 1 || x.a < 1 || x.d < 1 || x.kv < 1 || x.a % x.kv != 0)
    throw InputError(std::string(op) + ": b, sq, sk, a, kv, d must be positive and kv divide a");
  if (x.window < 0) throw InputError(std::string(op) + ": window must be >= 0");
}

bool parallel(const RingShape& x) {
  return double(x.b) * double(x.a) * double(x.sq) * double(x.sk) * double(x.d) >= kParallelMinMacs;
}

template <class S>
void ring_forward(float* acc, float* lse, const void* q, const void* k, const void* v,
                  const RingShape& x, SeqPositions qpos, SeqPositions kpos, bool first) {
#pragma omp parallel for if (parallel(x))
  for (std::int64_t task = 0; task < x.b * x.a; ++task) {
    const std::int64_t bi = task / x.a, qh = task % x.a;
    std::vector<float> o(std::size_t(x.d));
    for (std::int64_t i = 0; i < x.sq; ++i)
      ring_forward_row<S>(acc + x.q_at(bi, i, qh), lse + x.row_at(bi, qh, i), o.data(), q, k, v, x,
                          bi, qh, i, qpos, kpos, first);
  }
}

template <class S>
void ring_backward(float* dq, float* dk, float* dv, float* delta, const void* dout, const void* q,
                   const void* k, const void* v, const void* out, const float* lse,
                   const RingShape& x, SeqPositions qpos, SeqPositions kpos, bool first) {
#pragma omp parallel for if (parallel(x))
  for (std::int64_t task = 0; task < x.b * x.a; ++task) {
    const std::int64_t bi = task / x.a, qh = task % x.a;
    for (std::int64_t i = 0; i < x.sq; ++i)
      ring_dq_row<S>(dq + x.q_at(bi, i, qh), delta, dout, q, k, v, out, lse, x, bi, qh, i, qpos,
                     kpos, first);
  }
#pragma omp parallel for if (parallel(x))
  for (std::int64_t task = 0; task < x.b * x.kv; ++task) {
    const std::int64_t bi = task / x.kv, kh = task % x.kv;
    for (std::int64_t j = 0; j < x.sk; ++j)
      ring_dkdv_row<S>(dk + x.k_at(bi, j, kh), dv + x.k_at(bi, j, kh), delta, dout, q, k, v, lse, x,
                       bi, kh, j, qpos, kpos);
  }
}

}  // namespace

void attention_ring_forward_cpu(float* acc, float* lse, const void* q, const void* k, const void* v,
                                std::int64_t b, std::int64_t sq, std::int64_t sk, std::int64_t a,
                                std::int64_t kv, std::int64_t d, std::int64_t window,
                                SeqPositions qpos, SeqPositions kpos, bool first, DType dt) {
  const RingShape x{b, sq, sk, a, kv, d, window};
  check(x, "attention_ring_forward");
  cpu_threads_setup();
  dispatch_storage(dt, "attention_ring_forward", [&](auto tag) {
    ring_forward<decltype(tag)>(acc, lse, q, k, v, x, qpos, kpos, first);
  });
}

void attention_ring_backward_cpu(float* dq, float* dk, float* dv, float* delta, const void* dout,
                                 const void* q, const void* k, const void* v, const void* out,
                                 const float* lse, std::int64_t b, std::int64_t sq, std::int64_t sk,
                                 std::int64_t a, std::int64_t kv, std::int64_t d,
                                 std::int64_t window, SeqPositions qpos, SeqPositions kpos,
                                 bool first, DType dt) {
  const RingShape x{b, sq, sk, a, kv, d, window};
  check(x, "attention_ring_backward");
  cpu_threads_setup();
  dispatch_storage(dt, "attention_ring_backward", [&](auto tag) {
    ring_backward<decltype(tag)>(dq, dk, dv, delta, dout, q, k, v, out, lse, x, qpos, kpos, first);
  });
}

void round_from_f32_cpu(void* out, const float* in, std::int64_t n, DType dt) {
  for (std::int64_t e = 0; e < n; ++e) store_from_f32(out, std::size_t(e), dt, in[e]);
}

}  // namespace trainmem
