// Ring attention's block kernels, CPU reference (attention_ring.hpp): the per-row pieces of
// attention_ring_math.hpp (shared with the CUDA kernels), one OpenMP task per (batch, head) of
// rows. Every output element has one writer and a fixed order of operations: results do not
// depend on the thread count. Written for clarity, not speed: the measured context-parallel
// runs are small.
#include <algorithm>
#include <string>
#include <vector>

#include "attention/attention_ring.hpp"
#include "attention/attention_ring_math.hpp"
#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

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

RingShape check_ring_shape(const char* op, std::int64_t b, std::int64_t sq, std::int64_t sk,
                           std::int64_t a, std::int64_t kv, std::int64_t d, std::int64_t window,
                           std::int64_t max_d) {
  if (b < 1 || sq < 1 || sk < 1 || a < 1 || d < 1 || kv < 1 || a % kv != 0)
    throw InputError(std::string(op) + ": b, sq, sk, a, kv, d must be positive and kv divide a");
  if (window < 0) throw InputError(std::string(op) + ": window must be >= 0");
  if (max_d > 0 && d > max_d)
    throw InputError(std::string(op) + ": ring attention supports head dim d up to " +
                     std::to_string(max_d) + ", got " + std::to_string(d));
  checked_product(
      {std::uint64_t(b), std::uint64_t(std::max(sq, sk)), std::uint64_t(a), std::uint64_t(d)}, op);
  return RingShape{b, sq, sk, a, kv, d, window};
}

void attention_ring_forward_cpu(float* acc, float* lse, const void* q, const void* k, const void* v,
                                std::int64_t b, std::int64_t sq, std::int64_t sk, std::int64_t a,
                                std::int64_t kv, std::int64_t d, std::int64_t window,
                                SeqPositions qpos, SeqPositions kpos, bool first, DType dt) {
  const RingShape x = check_ring_shape("attention_ring_forward", b, sq, sk, a, kv, d, window);
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
  const RingShape x = check_ring_shape("attention_ring_backward", b, sq, sk, a, kv, d, window);
  cpu_threads_setup();
  dispatch_storage(dt, "attention_ring_backward", [&](auto tag) {
    ring_backward<decltype(tag)>(dq, dk, dv, delta, dout, q, k, v, out, lse, x, qpos, kpos, first);
  });
}

void round_from_f32_cpu(void* out, const float* in, std::int64_t n, DType dt) {
  for (std::int64_t e = 0; e < n; ++e) store_from_f32(out, std::size_t(e), dt, in[e]);
}

}  // namespace trainmem
