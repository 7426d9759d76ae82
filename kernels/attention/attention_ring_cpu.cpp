// Ring attention's block kernels, CPU reference (attention_ring.hpp): one task per (batch, query
// head) in forward and per (batch, kv head) in backward, each row's scores in fp32 in key order.
// Written for clarity, not speed: the measured context-parallel runs are small.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attention/attention_math.hpp"
#include "attention/attention_ring.hpp"
#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

struct RingDims {
  std::int64_t b, sq, sk, a, kv, d, window;
  // Element offset of (batch, row, head) in a (b, rows, heads, d) buffer.
  static std::size_t at(std::int64_t bi, std::int64_t row, std::int64_t rows, std::int64_t head,
                        std::int64_t heads, std::int64_t d) {
    return std::size_t(((bi * rows + row) * heads + head) * d);
  }
};

void check(const RingDims& x, const char* op) {
  if (x.b < 1 || x.sq < 1 || x.sk < 1 || x.a < 1 || x.d < 1 || x.kv < 1 || x.a % x.kv != 0)
    throw InputError(std::string(op) + ": b, sq, sk, a, kv, d must be positive and kv divide a");
  if (x.window < 0) throw InputError(std::string(op) + ": window must be >= 0");
}

template <class S>
void ring_forward(float* acc, float* lse, const void* q, const void* k, const void* v,
                  const RingDims& x, SeqPositions qpos, SeqPositions kpos, bool first) {
  const float scale = attention_scale<float>(x.d);
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::int64_t tasks = x.b * x.a;
#pragma omp parallel for if (double(x.b) * x.a * x.sq * x.sk * x.d >= kParallelMinMacs)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t bi = task / x.a, qh = task % x.a;
    const std::int64_t kh = attention_kv_head(qh, x.a, x.kv);
    std::vector<float> sc(std::size_t(x.sk)), o(std::size_t(x.d));
    for (std::int64_t i = 0; i < x.sq; ++i) {
      float* ai = acc + RingDims::at(bi, i, x.sq, qh, x.a, x.d);
      float& li = lse[std::size_t((bi * x.a + qh) * x.sq + i)];
      if (first) {
        for (std::int64_t e = 0; e < x.d; ++e) ai[e] = 0;
        li = ninf;
      }
      const std::int64_t pq = qpos.at(i);
      const std::size_t qo = RingDims::at(bi, i, x.sq, qh, x.a, x.d);
      float mx = ninf;
      for (std::int64_t j = 0; j < x.sk; ++j) {
        if (!window_visible(pq, kpos.at(j), x.window)) {
          sc[std::size_t(j)] = ninf;
          continue;
        }
        const std::size_t ko = RingDims::at(bi, j, x.sk, kh, x.kv, x.d);
        float dot = 0;
        for (std::int64_t e = 0; e < x.d; ++e)
          dot += S::load(q, qo + std::size_t(e)) * S::load(k, ko + std::size_t(e));
        sc[std::size_t(j)] = dot * scale;
        mx = std::max(mx, sc[std::size_t(j)]);
      }
      if (mx == ninf) continue;  // no key of this block is visible from row i
      float l = 0;
      std::fill(o.begin(), o.end(), 0.0f);
      for (std::int64_t j = 0; j < x.sk; ++j) {
        if (sc[std::size_t(j)] == ninf) continue;
        const float p = std::exp(sc[std::size_t(j)] - mx);
        l += p;
        const std::size_t vo = RingDims::at(bi, j, x.sk, kh, x.kv, x.d);
        for (std::int64_t e = 0; e < x.d; ++e)
          o[std::size_t(e)] += p * S::load(v, vo + std::size_t(e));
      }
      const float lb = mx + std::log(l);
      if (li == ninf) {
        for (std::int64_t e = 0; e < x.d; ++e) ai[e] = o[std::size_t(e)] / l;
        li = lb;
        continue;
      }
      const float m2 = std::max(li, lb);
      const float merged = m2 + std::log(std::exp(li - m2) + std::exp(lb - m2));
      const float wa = std::exp(li - merged), wb = std::exp(lb - merged);
      for (std::int64_t e = 0; e < x.d; ++e) ai[e] = ai[e] * wa + (o[std::size_t(e)] / l) * wb;
      li = merged;
    }
  }
}

template <class S>
void ring_backward(float* dq, float* dk, float* dv, float* delta, const void* dout, const void* q,
                   const void* k, const void* v, const void* out, const float* lse,
                   const RingDims& x, SeqPositions qpos, SeqPositions kpos, bool first) {
  const float scale = attention_scale<float>(x.d);
  const std::int64_t group = x.a / x.kv, tasks = x.b * x.kv;
#pragma omp parallel for if (double(x.b) * x.a * x.sq * x.sk * x.d >= kParallelMinMacs)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t bi = task / x.kv, kh = task % x.kv;
    for (std::int64_t qh = kh * group; qh < (kh + 1) * group; ++qh) {
      for (std::int64_t i = 0; i < x.sq; ++i) {
        const std::size_t qo = RingDims::at(bi, i, x.sq, qh, x.a, x.d);
        const std::size_t row = std::size_t((bi * x.a + qh) * x.sq + i);
        if (first) {
          float dl = 0;
          for (std::int64_t e = 0; e < x.d; ++e)
            dl += S::load(dout, qo + std::size_t(e)) * S::load(out, qo + std::size_t(e));
          delta[row] = dl;
        }
        const std::int64_t pq = qpos.at(i);
        for (std::int64_t j = 0; j < x.sk; ++j) {
          if (!window_visible(pq, kpos.at(j), x.window)) continue;
          const std::size_t ko = RingDims::at(bi, j, x.sk, kh, x.kv, x.d);
          float dot = 0, dpv = 0;
          for (std::int64_t e = 0; e < x.d; ++e) {
            dot += S::load(q, qo + std::size_t(e)) * S::load(k, ko + std::size_t(e));
            dpv += S::load(dout, qo + std::size_t(e)) * S::load(v, ko + std::size_t(e));
          }
          const float p = softmax_prob_from_lse(dot * scale, lse[row]);
          const float ds = softmax_backward_elem(p, dpv, delta[row]);
          for (std::int64_t e = 0; e < x.d; ++e) {
            const std::size_t qe = qo + std::size_t(e), ke = ko + std::size_t(e);
            dq[qe] += scale * ds * S::load(k, ke);
            dk[ke] += scale * ds * S::load(q, qe);
            dv[ke] += p * S::load(dout, qe);
          }
        }
      }
    }
  }
}

}  // namespace

void attention_ring_forward_cpu(float* acc, float* lse, const void* q, const void* k, const void* v,
                                std::int64_t b, std::int64_t sq, std::int64_t sk, std::int64_t a,
                                std::int64_t kv, std::int64_t d, std::int64_t window,
                                SeqPositions qpos, SeqPositions kpos, bool first, DType dt) {
  const RingDims x{b, sq, sk, a, kv, d, window};
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
  const RingDims x{b, sq, sk, a, kv, d, window};
  check(x, "attention_ring_backward");
  cpu_threads_setup();
  dispatch_storage(dt, "attention_ring_backward", [&](auto tag) {
    ring_backward<decltype(tag)>(dq, dk, dv, delta, dout, q, k, v, out, lse, x, qpos, kpos, first);
  });
}

}  // namespace trainmem
