// Causal attention with GQA, CPU reference (math in attention_math.hpp), eager and
// flash-style. OpenMP runs one task per (batch, query head) in forward and per (batch, kv
// head) in backward (a kv head's dk, dv sum over its query heads); inside a task every product
// is a single-threaded sgemm on one head's (T,HD) slice (leading dimension H*HD for an fp32
// buffer, or a contiguous fp32 copy of a 16-bit one). Results do not depend on the thread
// count.
//
// Eager: S = scale * Q K^T (T,T), causal softmax row by row into probs (stored rounded to D;
// the stored values are what P.V and the backward use). Backward: dP = dO V^T,
// dS = P * (dP - rowsum(P * dP)), dQ = scale dS K, dK += scale dS^T Q, dV += P^T dO.
// Flash: query blocks of kBlockRows rows against key blocks of kBlockCols keys up to the
// diagonal, with the online softmax of attention_math.hpp; only lse (B,NH,T) is kept.
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
#include "trainmem/error.hpp"

namespace trainmem {
namespace {

constexpr std::int64_t kBlockRows = 64;  // flash query tile
constexpr std::int64_t kBlockCols = 64;  // flash key tile

struct Dims {
  std::int64_t B, T, NH, NKV, HD;
  std::int64_t group() const { return NH / NKV; }
  // Whether the (T,T,HD) products of all heads are worth an OpenMP team.
  bool parallel() const { return double(B) * NH * T * T * HD >= kParallelMinMacs; }
};

void check_dims(const Dims& d) {
  if (d.NKV <= 0 || d.NH % d.NKV != 0)
    throw InputError("attention: kv heads (" + std::to_string(d.NKV) +
                     ") must divide query heads (" + std::to_string(d.NH) + ")");
}

// One head's (T,HD) rows of a (B,T,H,HD) buffer, as fp32. For fp32 storage this points into
// the buffer (leading dimension H*HD); otherwise the rows are widened into `scratch`.
struct HeadView {
  const float* ptr;
  std::int64_t ld;
};
template <class S>
HeadView head_in(const void* x, std::int64_t b, std::int64_t h, std::int64_t T, std::int64_t H,
                 std::int64_t HD, std::vector<float>& scratch) {
  const std::size_t base = std::size_t((b * T * H + h) * HD);
  if constexpr (std::is_same_v<S, F32>) {
    return {static_cast<const float*>(x) + base, H * HD};
  } else {
    scratch.resize(std::size_t(T * HD));
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t d = 0; d < HD; ++d)
        scratch[t * HD + d] = S::load(x, base + std::size_t(t * H * HD + d));
    return {scratch.data(), HD};
  }
}
// Stores (T,HD) contiguous fp32 rows into one head of a (B,T,H,HD) buffer, rounded to D.
template <class S>
void head_out(void* x, std::int64_t b, std::int64_t h, std::int64_t T, std::int64_t H,
              std::int64_t HD, const float* src) {
  const std::size_t base = std::size_t((b * T * H + h) * HD);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t d = 0; d < HD; ++d)
      S::store(x, base + std::size_t(t * H * HD + d), src[t * HD + d]);
}

// ---------------------------------------------------------------- eager

template <class S>
void eager_forward(void* out, void* probs, const void* q, const void* k, const void* v,
                   const Dims& d) {
  const std::int64_t T = d.T, HD = d.HD;
  const float scale = attention_scale<float>(HD);
#pragma omp parallel if (d.parallel())
  {
    std::vector<float> qs, ks, vs, p_scratch, os(std::size_t(T * HD));
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < d.B * d.NH; ++task) {
      const std::int64_t b = task / d.NH, h = task % d.NH, kvh = h / d.group();
      const HeadView K = head_in<S>(k, b, kvh, T, d.NKV, HD, ks);
      const HeadView V = head_in<S>(v, b, kvh, T, d.NKV, HD, vs);
      const HeadView Q = head_in<S>(q, b, h, T, d.NH, HD, qs);
      const std::size_t pbase = std::size_t((b * d.NH + h) * T * T);
      float* P;  // (T,T) scores, then probabilities as stored
      if constexpr (std::is_same_v<S, F32>) {
        P = static_cast<float*>(probs) + pbase;
      } else {
        p_scratch.resize(std::size_t(T * T));
        P = p_scratch.data();
      }
      sgemm_cpu(Trans::no, Trans::yes, T, T, HD, scale, Q.ptr, Q.ld, K.ptr, K.ld, 0.0f, P, T);
      for (std::int64_t i = 0; i < T; ++i) {
        float* row = P + i * T;
        float mx = tm_neg_inf<float>();
        for (std::int64_t j = 0; j <= i; ++j) mx = tm_max(mx, row[j]);
        float sum = 0.0f;
        for (std::int64_t j = 0; j <= i; ++j) {
          row[j] = tm_exp(row[j] - mx);
          sum += row[j];
        }
        const float inv = 1.0f / sum;
        for (std::int64_t j = 0; j <= i; ++j) row[j] = S::round(row[j] * inv);
        for (std::int64_t j = i + 1; j < T; ++j) row[j] = 0.0f;
        if constexpr (!std::is_same_v<S, F32>)
          for (std::int64_t j = 0; j < T; ++j) S::store(probs, pbase + i * T + j, row[j]);
      }
      sgemm_cpu(Trans::no, Trans::no, T, HD, T, 1.0f, P, T, V.ptr, V.ld, 0.0f, os.data(), HD);
      head_out<S>(out, b, h, T, d.NH, HD, os.data());
    }
  }
}

template <class S>
void eager_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                    const void* v, const void* probs, const Dims& d) {
  const std::int64_t T = d.T, HD = d.HD;
  const float scale = attention_scale<float>(HD);
#pragma omp parallel if (d.parallel())
  {
    std::vector<float> qs, ks, vs, dos, p_scratch;
    std::vector<float> dP(std::size_t(T * T));  // (T,T) dP, then dS in place
    std::vector<float> dQ(std::size_t(T * HD)), dK(std::size_t(T * HD)), dV(std::size_t(T * HD));
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < d.B * d.NKV; ++task) {
      const std::int64_t b = task / d.NKV, kvh = task % d.NKV;
      const HeadView K = head_in<S>(k, b, kvh, T, d.NKV, HD, ks);
      const HeadView V = head_in<S>(v, b, kvh, T, d.NKV, HD, vs);
      std::fill(dK.begin(), dK.end(), 0.0f);
      std::fill(dV.begin(), dV.end(), 0.0f);
      for (std::int64_t g = 0; g < d.group(); ++g) {
        const std::int64_t h = kvh * d.group() + g;
        const HeadView Q = head_in<S>(q, b, h, T, d.NH, HD, qs);
        const HeadView dO = head_in<S>(dout, b, h, T, d.NH, HD, dos);
        const std::size_t pbase = std::size_t((b * d.NH + h) * T * T);
        const float* P;  // (T,T) as stored
        if constexpr (std::is_same_v<S, F32>) {
          P = static_cast<const float*>(probs) + pbase;
        } else {
          p_scratch.resize(std::size_t(T * T));
          for (std::int64_t i = 0; i < T * T; ++i) p_scratch[i] = S::load(probs, pbase + i);
          P = p_scratch.data();
        }
        sgemm_cpu(Trans::no, Trans::yes, T, T, HD, 1.0f, dO.ptr, dO.ld, V.ptr, V.ld, 0.0f,
                  dP.data(), T);
        for (std::int64_t i = 0; i < T; ++i) {
          const float* p = P + i * T;
          float* ds = dP.data() + i * T;
          float delta = 0.0f;
          for (std::int64_t j = 0; j <= i; ++j) delta += p[j] * ds[j];
          for (std::int64_t j = 0; j <= i; ++j) ds[j] = softmax_backward_elem(p[j], ds[j], delta);
          for (std::int64_t j = i + 1; j < T; ++j) ds[j] = 0.0f;
        }
        sgemm_cpu(Trans::no, Trans::no, T, HD, T, scale, dP.data(), T, K.ptr, K.ld, 0.0f, dQ.data(),
                  HD);
        sgemm_cpu(Trans::yes, Trans::no, T, HD, T, scale, dP.data(), T, Q.ptr, Q.ld, 1.0f,
                  dK.data(), HD);
        sgemm_cpu(Trans::yes, Trans::no, T, HD, T, 1.0f, P, T, dO.ptr, dO.ld, 1.0f, dV.data(), HD);
        head_out<S>(dq, b, h, T, d.NH, HD, dQ.data());
      }
      head_out<S>(dk, b, kvh, T, d.NKV, HD, dK.data());
      head_out<S>(dv, b, kvh, T, d.NKV, HD, dV.data());
    }
  }
}

// ---------------------------------------------------------------- flash

template <class S>
void flash_forward(void* out, float* lse, const void* q, const void* k, const void* v,
                   const Dims& d) {
  const std::int64_t T = d.T, HD = d.HD;
  const float scale = attention_scale<float>(HD);
#pragma omp parallel if (d.parallel())
  {
    std::vector<float> qs, ks, vs;
    std::vector<float> tile(std::size_t(kBlockRows * kBlockCols));  // (Br,Bc) scores, then p
    std::vector<float> acc(std::size_t(kBlockRows * HD));           // (Br,HD)
    std::vector<float> os(std::size_t(T * HD));                     // (T,HD)
    std::vector<OnlineSoftmax<float>> st(kBlockRows);
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < d.B * d.NH; ++task) {
      const std::int64_t b = task / d.NH, h = task % d.NH, kvh = h / d.group();
      const HeadView K = head_in<S>(k, b, kvh, T, d.NKV, HD, ks);
      const HeadView V = head_in<S>(v, b, kvh, T, d.NKV, HD, vs);
      const HeadView Q = head_in<S>(q, b, h, T, d.NH, HD, qs);
      for (std::int64_t i0 = 0; i0 < T; i0 += kBlockRows) {
        const std::int64_t rows = std::min(kBlockRows, T - i0);
        std::fill(acc.begin(), acc.end(), 0.0f);
        std::fill(st.begin(), st.end(), OnlineSoftmax<float>::start());
        for (std::int64_t j0 = 0; j0 < i0 + rows; j0 += kBlockCols) {
          const std::int64_t cols = std::min(kBlockCols, i0 + rows - j0);
          sgemm_cpu(Trans::no, Trans::yes, rows, cols, HD, scale, Q.ptr + i0 * Q.ld, Q.ld,
                    K.ptr + j0 * K.ld, K.ld, 0.0f, tile.data(), kBlockCols);
          for (std::int64_t r = 0; r < rows; ++r) {
            const std::int64_t i = i0 + r;
            float* s = tile.data() + r * kBlockCols;
            float bmax = tm_neg_inf<float>();
            for (std::int64_t c = 0; c < cols; ++c)
              if (causal_visible(i, j0 + c)) bmax = tm_max(bmax, s[c]);
            const float alpha = online_softmax_rescale(&st[r], bmax);
            for (std::int64_t e = 0; e < HD; ++e) acc[r * HD + e] *= alpha;
            float sum = 0.0f;
            for (std::int64_t c = 0; c < cols; ++c) {
              s[c] = causal_visible(i, j0 + c) ? online_softmax_weight(st[r], s[c]) : 0.0f;
              sum += s[c];
            }
            st[r].l += sum;
          }
          sgemm_cpu(Trans::no, Trans::no, rows, HD, cols, 1.0f, tile.data(), kBlockCols,
                    V.ptr + j0 * V.ld, V.ld, 1.0f, acc.data(), HD);
        }
        for (std::int64_t r = 0; r < rows; ++r) {
          const float inv = 1.0f / st[r].l;
          for (std::int64_t e = 0; e < HD; ++e) os[(i0 + r) * HD + e] = acc[r * HD + e] * inv;
          lse[(b * d.NH + h) * T + i0 + r] = online_softmax_lse(st[r]);
        }
      }
      head_out<S>(out, b, h, T, d.NH, HD, os.data());
    }
  }
}

template <class S>
void flash_backward(void* dq, void* dk, void* dv, float* delta, const void* dout, const void* q,
                    const void* k, const void* v, const void* out, const float* lse,
                    const Dims& d) {
  const std::int64_t T = d.T, HD = d.HD;
  const float scale = attention_scale<float>(HD);
#pragma omp parallel if (d.parallel())
  {
    std::vector<float> qs, ks, vs, dos, os;
    std::vector<float> p(std::size_t(kBlockRows * kBlockCols));   // (Br,Bc) recomputed P
    std::vector<float> ds(std::size_t(kBlockRows * kBlockCols));  // (Br,Bc) dP, then dS
    std::vector<float> dQ(std::size_t(T * HD)), dK(std::size_t(T * HD)), dV(std::size_t(T * HD));
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < d.B * d.NKV; ++task) {
      const std::int64_t b = task / d.NKV, kvh = task % d.NKV;
      const HeadView K = head_in<S>(k, b, kvh, T, d.NKV, HD, ks);
      const HeadView V = head_in<S>(v, b, kvh, T, d.NKV, HD, vs);
      std::fill(dK.begin(), dK.end(), 0.0f);
      std::fill(dV.begin(), dV.end(), 0.0f);
      for (std::int64_t g = 0; g < d.group(); ++g) {
        const std::int64_t h = kvh * d.group() + g;
        const HeadView Q = head_in<S>(q, b, h, T, d.NH, HD, qs);
        const HeadView dO = head_in<S>(dout, b, h, T, d.NH, HD, dos);
        const HeadView O = head_in<S>(out, b, h, T, d.NH, HD, os);
        float* dl = delta + (b * d.NH + h) * T;
        const float* L = lse + (b * d.NH + h) * T;
        for (std::int64_t i = 0; i < T; ++i) {
          float acc = 0.0f;
          for (std::int64_t e = 0; e < HD; ++e) acc += dO.ptr[i * dO.ld + e] * O.ptr[i * O.ld + e];
          dl[i] = acc;
        }
        std::fill(dQ.begin(), dQ.end(), 0.0f);
        for (std::int64_t i0 = 0; i0 < T; i0 += kBlockRows) {
          const std::int64_t rows = std::min(kBlockRows, T - i0);
          for (std::int64_t j0 = 0; j0 < i0 + rows; j0 += kBlockCols) {
            const std::int64_t cols = std::min(kBlockCols, i0 + rows - j0);
            sgemm_cpu(Trans::no, Trans::yes, rows, cols, HD, scale, Q.ptr + i0 * Q.ld, Q.ld,
                      K.ptr + j0 * K.ld, K.ld, 0.0f, p.data(), kBlockCols);
            sgemm_cpu(Trans::no, Trans::yes, rows, cols, HD, 1.0f, dO.ptr + i0 * dO.ld, dO.ld,
                      V.ptr + j0 * V.ld, V.ld, 0.0f, ds.data(), kBlockCols);
            for (std::int64_t r = 0; r < rows; ++r) {
              const std::int64_t i = i0 + r;
              for (std::int64_t c = 0; c < cols; ++c) {
                float& pr = p[r * kBlockCols + c];
                pr = causal_visible(i, j0 + c) ? softmax_prob_from_lse(pr, L[i]) : 0.0f;
                float& g2 = ds[r * kBlockCols + c];
                g2 = softmax_backward_elem(pr, g2, dl[i]);
              }
            }
            sgemm_cpu(Trans::yes, Trans::no, cols, HD, rows, 1.0f, p.data(), kBlockCols,
                      dO.ptr + i0 * dO.ld, dO.ld, 1.0f, dV.data() + j0 * HD, HD);
            sgemm_cpu(Trans::no, Trans::no, rows, HD, cols, scale, ds.data(), kBlockCols,
                      K.ptr + j0 * K.ld, K.ld, 1.0f, dQ.data() + i0 * HD, HD);
            sgemm_cpu(Trans::yes, Trans::no, cols, HD, rows, scale, ds.data(), kBlockCols,
                      Q.ptr + i0 * Q.ld, Q.ld, 1.0f, dK.data() + j0 * HD, HD);
          }
        }
        head_out<S>(dq, b, h, T, d.NH, HD, dQ.data());
      }
      head_out<S>(dk, b, kvh, T, d.NKV, HD, dK.data());
      head_out<S>(dv, b, kvh, T, d.NKV, HD, dV.data());
    }
  }
}

}  // namespace

void attention_eager_forward_cpu(void* out, void* probs, const void* q, const void* k,
                                 const void* v, std::int64_t B, std::int64_t T, std::int64_t NH,
                                 std::int64_t NKV, std::int64_t HD, DType dt) {
  cpu_threads_setup();
  const Dims d{B, T, NH, NKV, HD};
  check_dims(d);
  dispatch_storage(dt, "attention_forward",
                   [&](auto s) { eager_forward<decltype(s)>(out, probs, q, k, v, d); });
}

void attention_eager_backward_cpu(void* dq, void* dk, void* dv, void* /*dprobs*/, const void* dout,
                                  const void* q, const void* k, const void* v, const void* probs,
                                  std::int64_t B, std::int64_t T, std::int64_t NH, std::int64_t NKV,
                                  std::int64_t HD, DType dt) {
  cpu_threads_setup();
  const Dims d{B, T, NH, NKV, HD};
  check_dims(d);
  dispatch_storage(dt, "attention_backward", [&](auto s) {
    eager_backward<decltype(s)>(dq, dk, dv, dout, q, k, v, probs, d);
  });
}

void attention_flash_forward_cpu(void* out, float* lse, const void* q, const void* k, const void* v,
                                 std::int64_t B, std::int64_t T, std::int64_t NH, std::int64_t NKV,
                                 std::int64_t HD, DType dt) {
  cpu_threads_setup();
  const Dims d{B, T, NH, NKV, HD};
  check_dims(d);
  dispatch_storage(dt, "attention_forward",
                   [&](auto s) { flash_forward<decltype(s)>(out, lse, q, k, v, d); });
}

void attention_flash_backward_cpu(void* dq, void* dk, void* dv, float* delta, const void* dout,
                                  const void* q, const void* k, const void* v, const void* out,
                                  const float* lse, std::int64_t B, std::int64_t T, std::int64_t NH,
                                  std::int64_t NKV, std::int64_t HD, DType dt) {
  cpu_threads_setup();
  const Dims d{B, T, NH, NKV, HD};
  check_dims(d);
  dispatch_storage(dt, "attention_backward", [&](auto s) {
    flash_backward<decltype(s)>(dq, dk, dv, delta, dout, q, k, v, out, lse, d);
  });
}

void attention_forward_cpu(void* out, void* probs, float* lse, const void* q, const void* k,
                           const void* v, std::int64_t B, std::int64_t T, std::int64_t NH,
                           std::int64_t NKV, std::int64_t HD, Attention variant, DType dt) {
  cpu_threads_setup();
  if (variant == Attention::eager)
    attention_eager_forward_cpu(out, probs, q, k, v, B, T, NH, NKV, HD, dt);
  else
    attention_flash_forward_cpu(out, lse, q, k, v, B, T, NH, NKV, HD, dt);
}

void attention_backward_cpu(void* dq, void* dk, void* dv, void* dprobs, float* delta,
                            const void* dout, const void* q, const void* k, const void* v,
                            const void* out, const void* probs, const float* lse, std::int64_t B,
                            std::int64_t T, std::int64_t NH, std::int64_t NKV, std::int64_t HD,
                            Attention variant, DType dt) {
  cpu_threads_setup();
  if (variant == Attention::eager)
    attention_eager_backward_cpu(dq, dk, dv, dprobs, dout, q, k, v, probs, B, T, NH, NKV, HD, dt);
  else
    attention_flash_backward_cpu(dq, dk, dv, delta, dout, q, k, v, out, lse, B, T, NH, NKV, HD, dt);
}

}  // namespace trainmem
