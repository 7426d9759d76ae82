// Causal attention with GQA, CPU reference (math in attention_math.hpp), eager and
// flash-style. OpenMP runs one task per (batch, query head) in forward and per (batch, kv
// head) in backward (a kv head's dk, dv sum over its query heads); inside a task every product
// is a single-threaded sgemm on one head's (s, d) slice (leading dimension heads*d for an fp32
// buffer, or a contiguous fp32 copy of a 16-bit one). Results do not depend on the thread
// count.
//
// Sliding window W > 0 (attention_math.hpp): row i keeps keys max(0, i-W+1)..i only.
// Eager: S = scale * Q K^T (s, s), causal softmax row by row into probs (stored rounded to D;
// zeros outside the visible keys;
// the stored values are what P.V and the backward use). Backward: dP = dO V^T,
// dS = P * (dP - rowsum(P * dP)), dQ = scale dS K, dK += scale dS^T Q, dV += P^T dO.
// Flash: query blocks of kBlockRows rows against key blocks of kBlockCols keys from the block
// holding the block's first visible key (0 without a window) up to the diagonal, with the online
// softmax of attention_math.hpp; key blocks entirely outside the window are never visited; only
// lse (b, a, s) is kept.
// Backward recomputes P = exp(S - lse) tile by tile with delta = rowsum(dO * O).
#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "attention/attention.hpp"
#include "attention/attention_math.hpp"
#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "matmul/matmul.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

constexpr std::int64_t kBlockRows = 64;  // flash query tile
constexpr std::int64_t kBlockCols = 64;  // flash key tile

struct Dims {
  std::int64_t b, s, a, kv, d;
  std::int64_t window;  // 0: full causal
  std::int64_t group() const { return a / kv; }
  // Whether the (s, s, d) products of all heads are worth an OpenMP team.
  bool parallel() const { return double(b) * a * s * s * d >= kParallelMinMacs; }
};

void check_dims(const Dims& dims) {
  if (dims.kv <= 0 || dims.a % dims.kv != 0)
    throw InputError("attention: kv heads (" + std::to_string(dims.kv) +
                     ") must divide query heads (" + std::to_string(dims.a) + ")");
  if (dims.window < 0)
    throw InputError("attention: window must be >= 0 (0: full causal), got " +
                     std::to_string(dims.window));
}
// First key block a query block starting at row i0 visits: the one holding its first visible key.
std::int64_t first_key_block(std::int64_t i0, std::int64_t window) {
  return window_first_key(i0, window) / kBlockCols * kBlockCols;
}

// One head's (s, d) rows of a (b, s, heads, d) buffer, as fp32. For fp32 storage this points into
// the buffer (leading dimension heads*d); otherwise the rows are widened into `scratch`.
struct HeadView {
  const float* ptr;
  std::int64_t ld;
};
template <class S>
HeadView head_in(const void* x, std::int64_t bi, std::int64_t head, std::int64_t s,
                 std::int64_t heads, std::int64_t d, std::vector<float>& scratch) {
  const std::size_t base = std::size_t((bi * s * heads + head) * d);
  if constexpr (std::is_same_v<S, F32>) {
    return {static_cast<const float*>(x) + base, heads * d};
  } else {
    scratch.resize(std::size_t(s * d));
    for (std::int64_t t = 0; t < s; ++t)
      for (std::int64_t e = 0; e < d; ++e)
        scratch[t * d + e] = S::load(x, base + std::size_t(t * heads * d + e));
    return {scratch.data(), d};
  }
}
// Stores (s, d) contiguous fp32 rows into one head of a (b, s, heads, d) buffer, rounded to D.
template <class S>
void head_out(void* x, std::int64_t bi, std::int64_t head, std::int64_t s, std::int64_t heads,
              std::int64_t d, const float* src) {
  const std::size_t base = std::size_t((bi * s * heads + head) * d);
  for (std::int64_t t = 0; t < s; ++t)
    for (std::int64_t e = 0; e < d; ++e)
      S::store(x, base + std::size_t(t * heads * d + e), src[t * d + e]);
}

// ---------------------------------------------------------------- eager

template <class S>
void eager_forward(void* out, void* probs, const void* q, const void* k, const void* v,
                   const Dims& dims) {
  const std::int64_t s = dims.s, d = dims.d;
  const float scale = attention_scale<float>(d);
#pragma omp parallel if (dims.parallel())
  {
    std::vector<float> qs, ks, vs, p_scratch, os(std::size_t(s * d));
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < dims.b * dims.a; ++task) {
      const std::int64_t bi = task / dims.a, head = task % dims.a, kvh = head / dims.group();
      const HeadView K = head_in<S>(k, bi, kvh, s, dims.kv, d, ks);
      const HeadView V = head_in<S>(v, bi, kvh, s, dims.kv, d, vs);
      const HeadView Q = head_in<S>(q, bi, head, s, dims.a, d, qs);
      const std::size_t pbase = std::size_t((bi * dims.a + head) * s * s);
      float* P;  // (s, s) scores, then probabilities as stored
      if constexpr (std::is_same_v<S, F32>) {
        P = static_cast<float*>(probs) + pbase;
      } else {
        p_scratch.resize(std::size_t(s * s));
        P = p_scratch.data();
      }
      sgemm_cpu(Trans::no, Trans::yes, s, s, d, scale, Q.ptr, Q.ld, K.ptr, K.ld, 0.0f, P, s);
      for (std::int64_t i = 0; i < s; ++i) {
        float* row = P + i * s;
        const std::int64_t lo = window_first_key(i, dims.window);
        float mx = tm_neg_inf<float>();
        for (std::int64_t j = lo; j <= i; ++j) mx = tm_max(mx, row[j]);
        float sum = 0.0f;
        for (std::int64_t j = lo; j <= i; ++j) {
          row[j] = tm_exp(row[j] - mx);
          sum += row[j];
        }
        const float inv = 1.0f / sum;
        for (std::int64_t j = 0; j < lo; ++j) row[j] = 0.0f;
        for (std::int64_t j = lo; j <= i; ++j) row[j] = S::round(row[j] * inv);
        for (std::int64_t j = i + 1; j < s; ++j) row[j] = 0.0f;
        if constexpr (!std::is_same_v<S, F32>)
          for (std::int64_t j = 0; j < s; ++j) S::store(probs, pbase + i * s + j, row[j]);
      }
      sgemm_cpu(Trans::no, Trans::no, s, d, s, 1.0f, P, s, V.ptr, V.ld, 0.0f, os.data(), d);
      head_out<S>(out, bi, head, s, dims.a, d, os.data());
    }
  }
}

template <class S>
void eager_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                    const void* v, const void* probs, const Dims& dims) {
  const std::int64_t s = dims.s, d = dims.d;
  const float scale = attention_scale<float>(d);
#pragma omp parallel if (dims.parallel())
  {
    std::vector<float> qs, ks, vs, dos, p_scratch;
    std::vector<float> dP(std::size_t(s * s));  // (s, s) dP, then dS in place
    std::vector<float> dQ(std::size_t(s * d)), dK(std::size_t(s * d)), dV(std::size_t(s * d));
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < dims.b * dims.kv; ++task) {
      const std::int64_t bi = task / dims.kv, kvh = task % dims.kv;
      const HeadView K = head_in<S>(k, bi, kvh, s, dims.kv, d, ks);
      const HeadView V = head_in<S>(v, bi, kvh, s, dims.kv, d, vs);
      std::fill(dK.begin(), dK.end(), 0.0f);
      std::fill(dV.begin(), dV.end(), 0.0f);
      for (std::int64_t g = 0; g < dims.group(); ++g) {
        const std::int64_t head = kvh * dims.group() + g;
        const HeadView Q = head_in<S>(q, bi, head, s, dims.a, d, qs);
        const HeadView dO = head_in<S>(dout, bi, head, s, dims.a, d, dos);
        const std::size_t pbase = std::size_t((bi * dims.a + head) * s * s);
        const float* P;  // (s, s) as stored
        if constexpr (std::is_same_v<S, F32>) {
          P = static_cast<const float*>(probs) + pbase;
        } else {
          p_scratch.resize(std::size_t(s * s));
          for (std::int64_t i = 0; i < s * s; ++i) p_scratch[i] = S::load(probs, pbase + i);
          P = p_scratch.data();
        }
        sgemm_cpu(Trans::no, Trans::yes, s, s, d, 1.0f, dO.ptr, dO.ld, V.ptr, V.ld, 0.0f, dP.data(),
                  s);
        for (std::int64_t i = 0; i < s; ++i) {
          const float* p = P + i * s;
          float* ds = dP.data() + i * s;
          const std::int64_t lo = window_first_key(i, dims.window);
          float delta = 0.0f;
          for (std::int64_t j = lo; j <= i; ++j) delta += p[j] * ds[j];
          for (std::int64_t j = 0; j < lo; ++j) ds[j] = 0.0f;
          for (std::int64_t j = lo; j <= i; ++j) ds[j] = softmax_backward_elem(p[j], ds[j], delta);
          for (std::int64_t j = i + 1; j < s; ++j) ds[j] = 0.0f;
        }
        sgemm_cpu(Trans::no, Trans::no, s, d, s, scale, dP.data(), s, K.ptr, K.ld, 0.0f, dQ.data(),
                  d);
        sgemm_cpu(Trans::yes, Trans::no, s, d, s, scale, dP.data(), s, Q.ptr, Q.ld, 1.0f, dK.data(),
                  d);
        sgemm_cpu(Trans::yes, Trans::no, s, d, s, 1.0f, P, s, dO.ptr, dO.ld, 1.0f, dV.data(), d);
        head_out<S>(dq, bi, head, s, dims.a, d, dQ.data());
      }
      head_out<S>(dk, bi, kvh, s, dims.kv, d, dK.data());
      head_out<S>(dv, bi, kvh, s, dims.kv, d, dV.data());
    }
  }
}

// ---------------------------------------------------------------- flash

template <class S>
void flash_forward(void* out, float* lse, const void* q, const void* k, const void* v,
                   const Dims& dims) {
  const std::int64_t s = dims.s, d = dims.d;
  const float scale = attention_scale<float>(d);
#pragma omp parallel if (dims.parallel())
  {
    std::vector<float> qs, ks, vs;
    std::vector<float> tile(std::size_t(kBlockRows * kBlockCols));  // (Br,Bc) scores, then p
    std::vector<float> acc(std::size_t(kBlockRows * d));            // (Br,d)
    std::vector<float> os(std::size_t(s * d));                      // (s, d)
    std::vector<OnlineSoftmax<float>> st(kBlockRows);
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < dims.b * dims.a; ++task) {
      const std::int64_t bi = task / dims.a, head = task % dims.a, kvh = head / dims.group();
      const HeadView K = head_in<S>(k, bi, kvh, s, dims.kv, d, ks);
      const HeadView V = head_in<S>(v, bi, kvh, s, dims.kv, d, vs);
      const HeadView Q = head_in<S>(q, bi, head, s, dims.a, d, qs);
      for (std::int64_t i0 = 0; i0 < s; i0 += kBlockRows) {
        const std::int64_t rows = std::min(kBlockRows, s - i0);
        std::fill(acc.begin(), acc.end(), 0.0f);
        std::fill(st.begin(), st.end(), OnlineSoftmax<float>::start());
        for (std::int64_t j0 = first_key_block(i0, dims.window); j0 < i0 + rows; j0 += kBlockCols) {
          const std::int64_t cols = std::min(kBlockCols, i0 + rows - j0);
          sgemm_cpu(Trans::no, Trans::yes, rows, cols, d, scale, Q.ptr + i0 * Q.ld, Q.ld,
                    K.ptr + j0 * K.ld, K.ld, 0.0f, tile.data(), kBlockCols);
          for (std::int64_t r = 0; r < rows; ++r) {
            const std::int64_t i = i0 + r;
            float* sc = tile.data() + r * kBlockCols;
            float bmax = tm_neg_inf<float>();
            for (std::int64_t c = 0; c < cols; ++c)
              if (window_visible(i, j0 + c, dims.window)) bmax = tm_max(bmax, sc[c]);
            const float alpha = online_softmax_rescale(&st[r], bmax);
            for (std::int64_t e = 0; e < d; ++e) acc[r * d + e] *= alpha;
            float sum = 0.0f;
            for (std::int64_t c = 0; c < cols; ++c) {
              sc[c] = window_visible(i, j0 + c, dims.window) ? online_softmax_weight(st[r], sc[c])
                                                             : 0.0f;
              sum += sc[c];
            }
            st[r].l += sum;
          }
          sgemm_cpu(Trans::no, Trans::no, rows, d, cols, 1.0f, tile.data(), kBlockCols,
                    V.ptr + j0 * V.ld, V.ld, 1.0f, acc.data(), d);
        }
        for (std::int64_t r = 0; r < rows; ++r) {
          const float inv = 1.0f / st[r].l;
          for (std::int64_t e = 0; e < d; ++e) os[(i0 + r) * d + e] = acc[r * d + e] * inv;
          lse[(bi * dims.a + head) * s + i0 + r] = online_softmax_lse(st[r]);
        }
      }
      head_out<S>(out, bi, head, s, dims.a, d, os.data());
    }
  }
}

template <class S>
void flash_backward(void* dq, void* dk, void* dv, float* delta, const void* dout, const void* q,
                    const void* k, const void* v, const void* out, const float* lse,
                    const Dims& dims) {
  const std::int64_t s = dims.s, d = dims.d;
  const float scale = attention_scale<float>(d);
#pragma omp parallel if (dims.parallel())
  {
    std::vector<float> qs, ks, vs, dos, os;
    std::vector<float> p(std::size_t(kBlockRows * kBlockCols));   // (Br,Bc) recomputed P
    std::vector<float> ds(std::size_t(kBlockRows * kBlockCols));  // (Br,Bc) dP, then dS
    std::vector<float> dQ(std::size_t(s * d)), dK(std::size_t(s * d)), dV(std::size_t(s * d));
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < dims.b * dims.kv; ++task) {
      const std::int64_t bi = task / dims.kv, kvh = task % dims.kv;
      const HeadView K = head_in<S>(k, bi, kvh, s, dims.kv, d, ks);
      const HeadView V = head_in<S>(v, bi, kvh, s, dims.kv, d, vs);
      std::fill(dK.begin(), dK.end(), 0.0f);
      std::fill(dV.begin(), dV.end(), 0.0f);
      for (std::int64_t g = 0; g < dims.group(); ++g) {
        const std::int64_t head = kvh * dims.group() + g;
        const HeadView Q = head_in<S>(q, bi, head, s, dims.a, d, qs);
        const HeadView dO = head_in<S>(dout, bi, head, s, dims.a, d, dos);
        const HeadView O = head_in<S>(out, bi, head, s, dims.a, d, os);
        float* dl = delta + (bi * dims.a + head) * s;
        const float* L = lse + (bi * dims.a + head) * s;
        for (std::int64_t i = 0; i < s; ++i) {
          float acc = 0.0f;
          for (std::int64_t e = 0; e < d; ++e) acc += dO.ptr[i * dO.ld + e] * O.ptr[i * O.ld + e];
          dl[i] = acc;
        }
        std::fill(dQ.begin(), dQ.end(), 0.0f);
        for (std::int64_t i0 = 0; i0 < s; i0 += kBlockRows) {
          const std::int64_t rows = std::min(kBlockRows, s - i0);
          for (std::int64_t j0 = first_key_block(i0, dims.window); j0 < i0 + rows;
               j0 += kBlockCols) {
            const std::int64_t cols = std::min(kBlockCols, i0 + rows - j0);
            sgemm_cpu(Trans::no, Trans::yes, rows, cols, d, scale, Q.ptr + i0 * Q.ld, Q.ld,
                      K.ptr + j0 * K.ld, K.ld, 0.0f, p.data(), kBlockCols);
            sgemm_cpu(Trans::no, Trans::yes, rows, cols, d, 1.0f, dO.ptr + i0 * dO.ld, dO.ld,
                      V.ptr + j0 * V.ld, V.ld, 0.0f, ds.data(), kBlockCols);
            for (std::int64_t r = 0; r < rows; ++r) {
              const std::int64_t i = i0 + r;
              for (std::int64_t c = 0; c < cols; ++c) {
                float& pr = p[r * kBlockCols + c];
                pr =
                    window_visible(i, j0 + c, dims.window) ? softmax_prob_from_lse(pr, L[i]) : 0.0f;
                float& g2 = ds[r * kBlockCols + c];
                g2 = softmax_backward_elem(pr, g2, dl[i]);
              }
            }
            sgemm_cpu(Trans::yes, Trans::no, cols, d, rows, 1.0f, p.data(), kBlockCols,
                      dO.ptr + i0 * dO.ld, dO.ld, 1.0f, dV.data() + j0 * d, d);
            sgemm_cpu(Trans::no, Trans::no, rows, d, cols, scale, ds.data(), kBlockCols,
                      K.ptr + j0 * K.ld, K.ld, 1.0f, dQ.data() + i0 * d, d);
            sgemm_cpu(Trans::yes, Trans::no, cols, d, rows, scale, ds.data(), kBlockCols,
                      Q.ptr + i0 * Q.ld, Q.ld, 1.0f, dK.data() + j0 * d, d);
          }
        }
        head_out<S>(dq, bi, head, s, dims.a, d, dQ.data());
      }
      head_out<S>(dk, bi, kvh, s, dims.kv, d, dK.data());
      head_out<S>(dv, bi, kvh, s, dims.kv, d, dV.data());
    }
  }
}

}  // namespace

void attention_eager_forward_cpu(void* out, void* probs, const void* q, const void* k,
                                 const void* v, std::int64_t b, std::int64_t s, std::int64_t a,
                                 std::int64_t kv, std::int64_t d, std::int64_t window, DType dt) {
  cpu_threads_setup();
  const Dims dims{b, s, a, kv, d, window};
  check_dims(dims);
  dispatch_storage(dt, "attention_forward",
                   [&](auto tag) { eager_forward<decltype(tag)>(out, probs, q, k, v, dims); });
}

void attention_eager_backward_cpu(void* dq, void* dk, void* dv, void* /*dprobs*/, const void* dout,
                                  const void* q, const void* k, const void* v, const void* probs,
                                  std::int64_t b, std::int64_t s, std::int64_t a, std::int64_t kv,
                                  std::int64_t d, std::int64_t window, DType dt) {
  cpu_threads_setup();
  const Dims dims{b, s, a, kv, d, window};
  check_dims(dims);
  dispatch_storage(dt, "attention_backward", [&](auto tag) {
    eager_backward<decltype(tag)>(dq, dk, dv, dout, q, k, v, probs, dims);
  });
}

void attention_flash_forward_cpu(void* out, float* lse, const void* q, const void* k, const void* v,
                                 std::int64_t b, std::int64_t s, std::int64_t a, std::int64_t kv,
                                 std::int64_t d, std::int64_t window, DType dt) {
  cpu_threads_setup();
  const Dims dims{b, s, a, kv, d, window};
  check_dims(dims);
  dispatch_storage(dt, "attention_forward",
                   [&](auto tag) { flash_forward<decltype(tag)>(out, lse, q, k, v, dims); });
}

void attention_flash_backward_cpu(void* dq, void* dk, void* dv, float* delta, const void* dout,
                                  const void* q, const void* k, const void* v, const void* out,
                                  const float* lse, std::int64_t b, std::int64_t s, std::int64_t a,
                                  std::int64_t kv, std::int64_t d, std::int64_t window, DType dt) {
  cpu_threads_setup();
  const Dims dims{b, s, a, kv, d, window};
  check_dims(dims);
  dispatch_storage(dt, "attention_backward", [&](auto tag) {
    flash_backward<decltype(tag)>(dq, dk, dv, delta, dout, q, k, v, out, lse, dims);
  });
}

void attention_forward_cpu(void* out, void* probs, float* lse, const void* q, const void* k,
                           const void* v, std::int64_t b, std::int64_t s, std::int64_t a,
                           std::int64_t kv, std::int64_t d, std::int64_t window, Attention variant,
                           DType dt) {
  cpu_threads_setup();
  if (variant == Attention::eager)
    attention_eager_forward_cpu(out, probs, q, k, v, b, s, a, kv, d, window, dt);
  else
    attention_flash_forward_cpu(out, lse, q, k, v, b, s, a, kv, d, window, dt);
}

void attention_backward_cpu(void* dq, void* dk, void* dv, void* dprobs, float* delta,
                            const void* dout, const void* q, const void* k, const void* v,
                            const void* out, const void* probs, const float* lse, std::int64_t b,
                            std::int64_t s, std::int64_t a, std::int64_t kv, std::int64_t d,
                            std::int64_t window, Attention variant, DType dt) {
  cpu_threads_setup();
  if (variant == Attention::eager)
    attention_eager_backward_cpu(dq, dk, dv, dprobs, dout, q, k, v, probs, b, s, a, kv, d, window,
                                 dt);
  else
    attention_flash_backward_cpu(dq, dk, dv, delta, dout, q, k, v, out, lse, b, s, a, kv, d, window,
                                 dt);
}

}  // namespace trainmem
