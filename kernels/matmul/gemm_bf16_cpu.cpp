// bf16 GEMM with VDPBF16PS (see gemm_bf16_cpu.hpp).
//
// VDPBF16PS multiplies 16 pairs of bf16 values from each operand lane by lane and adds both
// products of a pair to one fp32 lane: lane j += a[2j] * b[2j] + a[2j+1] * b[2j+1]. So the two
// operands are packed as 32-bit words, each holding two consecutive k of one row (of op(a)) or
// of one column (of op(b)), low half the even k; an odd K gets a zero in the last word's high
// half. Packed layouts (words, every panel zero-padded to its full width):
//   A: row panels of kMR rows, each Kp pairs x kMR words  (Ap[(panel * Kp + p) * kMR + r])
//   B: column panels of kNR columns, each Kp pairs x kNR words  (Bp[(panel * Kp + p) * kNR + j])
// where Kp = ceil(K / 2). The micro-kernel keeps a tile of up to kMR x kNR fp32 sums in zmm
// registers; per pair it loads kNV vectors of B and broadcasts one A word per row.
//
// Cache blocking: a block of c is walked in column chunks of nc (the packed B chunk, kc pairs x
// nc words, is sized to stay in L2), row chunks of kMc and K chunks of kKcPairs pairs. When K
// has more than one chunk, the fp32 sums of a (kMc x nc) chunk of c live in a scratch buffer
// between chunks (stored and reloaded exactly, so the blocking does not change any bit); c is
// written once, after the last chunk: alpha * sum (+ beta * c), rounded to bf16.
//
// Threads (docs/decisions.md, "Threads in the cpu ops"): packing is a pure copy, spread over the
// team by panels; c is cut into gemm_split's blocks (shape only). The scratch (packed operands,
// fp32 sums) belongs to the calling thread and reaches the workers as raw pointers taken before
// the regions; each block has its own part of the sums buffer.
#include "matmul/gemm_bf16_cpu.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "common/cpu_parallel.hpp"
#include "matmul/matmul.hpp"

// GCC 12's AVX-512 headers start some intrinsics from a self-initialised "undefined" vector,
// which -Wmaybe-uninitialized reports wherever they are inlined (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// Functions using the AVX-512 intrinsics are compiled for these extensions only.
#define TM_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace trainmem {
namespace {

constexpr int kMR = 8;                  // rows of the register tile
constexpr int kNV = 3;                  // zmm vectors (16 columns each) of the register tile
constexpr int kNR = 16 * kNV;           // columns of the register tile (and of a B panel)
constexpr std::int64_t kKcPairs = 512;  // K chunk, in pairs (1024 values of k)
constexpr std::int64_t kMc = 128;       // rows per chunk of c
constexpr std::int64_t kBChunkBytes = 384 << 10;  // packed B chunk budget (L2 is 1 MiB on Zen 4)

std::int64_t ceil_div(std::int64_t x, std::int64_t y) {
  return (x + y - 1) / y;
}

// Packing: `lines` lines (rows of op(a) or columns of op(b)) into a panel of W words per pair,
// Kp pairs; lines >= `lines` and the odd K's last high half are zeros. Element (line l, k) of
// the source is x[l * sl + k * sk]. Both loops work on groups of 16 lines (one zmm of words).

// sk == 1: each line's k are contiguous, so a pair is already a word in memory and packing is
// a transpose of words: 16 lines x 16 pairs at a time through registers.
TM_AVX512BF16 inline void transpose16_epi32(__m512i r[16]) {
  __m512i b[16], c[16];
  for (int i = 0; i < 16; i += 2) {  // within 128-bit lanes: pairs of rows
    b[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    b[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {  // lane k of c[g + e]: rows g..g+3 of column 4k + e
    c[g + 0] = _mm512_unpacklo_epi64(b[g], b[g + 2]);
    c[g + 1] = _mm512_unpackhi_epi64(b[g], b[g + 2]);
    c[g + 2] = _mm512_unpacklo_epi64(b[g + 1], b[g + 3]);
    c[g + 3] = _mm512_unpackhi_epi64(b[g + 1], b[g + 3]);
  }
  for (int e = 0; e < 4; ++e) {  // gather lane k of c[e], c[4 + e], c[8 + e], c[12 + e]
    const __m512i d_lo = _mm512_shuffle_i32x4(c[e], c[4 + e], 0x88);  // lanes 0, 2
    const __m512i d_hi = _mm512_shuffle_i32x4(c[e], c[4 + e], 0xdd);  // lanes 1, 3
    const __m512i f_lo = _mm512_shuffle_i32x4(c[8 + e], c[12 + e], 0x88);
    const __m512i f_hi = _mm512_shuffle_i32x4(c[8 + e], c[12 + e], 0xdd);
    r[e] = _mm512_shuffle_i32x4(d_lo, f_lo, 0x88);
    r[4 + e] = _mm512_shuffle_i32x4(d_hi, f_hi, 0x88);
    r[8 + e] = _mm512_shuffle_i32x4(d_lo, f_lo, 0xdd);
    r[12 + e] = _mm512_shuffle_i32x4(d_hi, f_hi, 0xdd);
  }
}

TM_AVX512BF16 void pack_words(std::uint32_t* dst, const std::uint16_t* x, std::int64_t sl,
                              std::int64_t lines, int W, std::int64_t K) {
  const std::int64_t Kp = (K + 1) / 2, Kfull = K / 2;  // Kfull: pairs with both halves
  for (int l0 = 0; l0 < W; l0 += 16) {
    const int nl = int(std::clamp<std::int64_t>(lines - l0, 0, 16)), w = std::min(16, W - l0);
    const __mmask16 store = __mmask16((1u << w) - 1u);
    std::int64_t p = 0;
    for (; p + 16 <= Kfull; p += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = i < nl ? _mm512_loadu_si512(static_cast<const void*>(x + (l0 + i) * sl + 2 * p))
                      : _mm512_setzero_si512();
      transpose16_epi32(r);
      for (int q = 0; q < 16; ++q) _mm512_mask_storeu_epi32(dst + (p + q) * W + l0, store, r[q]);
    }
    for (; p < Kp; ++p)
      for (int i = 0; i < w; ++i) {
        std::uint32_t v = 0;
        if (i < nl) {
          const std::uint16_t* src = x + (l0 + i) * sl + 2 * p;
          v = src[0] | (p < Kfull ? std::uint32_t(src[1]) << 16 : 0u);
        }
        dst[p * W + l0 + i] = v;
      }
  }
}

// sl == 1: consecutive lines are contiguous, so a pair's two halves come from two source rows
// (k = 2p and 2p + 1) and packing interleaves them, 16 lines at a time.
TM_AVX512BF16 void pack_interleave(std::uint32_t* dst, const std::uint16_t* x, std::int64_t sk,
                                   std::int64_t lines, int W, std::int64_t K) {
  const std::int64_t Kp = (K + 1) / 2, Kfull = K / 2;
  for (std::int64_t p = 0; p < Kp; ++p) {
    const std::uint16_t* r0 = x + 2 * p * sk;
    for (int l0 = 0; l0 < W; l0 += 16) {
      const int nl = int(std::clamp<std::int64_t>(lines - l0, 0, 16)), w = std::min(16, W - l0);
      __m512i v = _mm512_setzero_si512();
      if (nl > 0) {
        const __mmask16 load = __mmask16((1u << nl) - 1u);
        v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(load, r0 + l0));
        if (p < Kfull) {
          const __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(load, r0 + sk + l0));
          v = _mm512_or_si512(v, _mm512_slli_epi32(hi, 16));
        }
      }
      _mm512_mask_storeu_epi32(dst + p * W + l0, __mmask16((1u << w) - 1u), v);
    }
  }
}

void pack_panel(std::uint32_t* dst, const std::uint16_t* x, std::int64_t sl, std::int64_t sk,
                std::int64_t lines, int W, std::int64_t K) {
  if (sk == 1)
    pack_words(dst, x, sl, lines, W, K);
  else
    pack_interleave(dst, x, sk, lines, W, K);
}

// What a tile does with its sums: `sums` (row stride ld_sums) holds earlier K chunks' fp32
// sums unless `first`; unless `last` the tile stores its sums there, else it writes c.
struct TileOut {
  float* sums;
  std::int64_t ld_sums;
  bool first, last;
  std::uint16_t* c;  // the tile's first element
  std::int64_t ldc;
  float alpha, beta;
};

TM_AVX512BF16 inline __mmask16 column_mask(int cols_left) {
  return cols_left >= 16 ? __mmask16(0xffff) : __mmask16((1u << std::max(cols_left, 0)) - 1u);
}

// fp32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN (as f32_to_bf16 in dtype.hpp).
TM_AVX512BF16 inline __m512i round_to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rne =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_mask_blend_epi32(nan, rne, qnan);
}

// The register tile: R rows (R <= kMR) x NV vectors, `cols` valid columns (<= 16 * NV), kp pairs.
// pa: the first row's word of pair 0 (pair stride kMR); pb: the first column's word of pair 0
// (pair stride kNR).
template <int R, int NV>
TM_AVX512BF16 void tile_kernel(const std::uint32_t* pa, const std::uint32_t* pb, std::int64_t kp,
                               int cols, const TileOut& out) {
  __m512 acc[R][NV];
  if (out.first) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_loadu_ps(out.sums + r * out.ld_sums + 16 * v);
  }
  for (std::int64_t p = 0; p < kp; ++p) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      bv[v] = (__m512bh)_mm512_loadu_si512(static_cast<const void*>(pb + p * kNR + 16 * v));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(pa[p * kMR + r]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  if (!out.last) {  // the sums buffer is padded to whole vectors: no masks needed
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(out.sums + r * out.ld_sums + 16 * v, acc[r][v]);
    return;
  }
  const __m512 alpha = _mm512_set1_ps(out.alpha), beta = _mm512_set1_ps(out.beta);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = column_mask(cols - 16 * v);
      std::uint16_t* cp = out.c + r * out.ldc + 16 * v;
      __m512 x = _mm512_mul_ps(acc[r][v], alpha);
      if (out.beta != 0.0f) {  // beta == 0 never reads c (it may hold NaN)
        const __m256i old = _mm256_maskz_loadu_epi16(m, cp);
        const __m512 oldf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(old), 16));
        x = _mm512_fmadd_ps(beta, oldf, x);
      }
      _mm512_mask_cvtepi32_storeu_epi16(cp, m, round_to_bf16(x));
    }
}

// Picks the instantiation for a tile of `rows` rows (<= R) and `cols` columns (<= 16 * NV): the
// fewest vectors that cover the columns, so edge tiles do not compute padding.
template <int R, int NV>
TM_AVX512BF16 void tile_cols(const std::uint32_t* pa, const std::uint32_t* pb, std::int64_t kp,
                             int cols, const TileOut& out) {
  if constexpr (NV > 1)
    if (cols <= 16 * (NV - 1)) return tile_cols<R, NV - 1>(pa, pb, kp, cols, out);
  tile_kernel<R, NV>(pa, pb, kp, cols, out);
}

template <int R>
TM_AVX512BF16 void tile(const std::uint32_t* pa, const std::uint32_t* pb, std::int64_t kp, int rows,
                        int cols, const TileOut& out) {
  if constexpr (R > 1)
    if (rows < R) return tile<R - 1>(pa, pb, kp, rows, cols, out);
  tile_cols<R, kNV>(pa, pb, kp, cols, out);
}

// Rows [r0, r1) x columns [c0, c1) of c from the packed operands. Tiles start at r0/c0 and at
// panel boundaries; a tile may start inside a panel (r0, c0 are multiples of 16, so a column
// tile's vectors stay inside its panel). `sums`: this block's fp32 buffer, kMc x (nc + 16),
// used when K has more than one chunk.
TM_AVX512BF16 void compute_block(std::uint16_t* c, const std::uint32_t* Ap, const std::uint32_t* Bp,
                                 std::int64_t N, std::int64_t Kp, std::int64_t r0, std::int64_t r1,
                                 std::int64_t c0, std::int64_t c1, float alpha, float beta,
                                 float* sums, std::int64_t nc) {
  const std::int64_t kc = std::min(Kp, kKcPairs), ld_sums = nc + 16;
  for (std::int64_t jc = c0; jc < c1; jc += nc) {
    const std::int64_t jend = std::min(c1, jc + nc);
    for (std::int64_t ic = r0; ic < r1; ic += kMc) {
      const std::int64_t iend = std::min(r1, ic + kMc);
      // K == 0 still runs one (empty) chunk: c = beta * c, rounded.
      for (std::int64_t pc = 0; pc == 0 || pc < Kp; pc += kc) {
        const std::int64_t kp = std::min(kc, Kp - pc);
        for (std::int64_t i = ic; i < iend;) {
          const std::int64_t ip = i / kMR, ioff = i % kMR;
          const int rows = int(std::min<std::int64_t>(kMR - ioff, iend - i));
          const std::uint32_t* pa = Ap + (ip * Kp + pc) * kMR + ioff;
          for (std::int64_t j = jc; j < jend;) {
            const std::int64_t jp = j / kNR, joff = j % kNR;
            const int cols = int(std::min<std::int64_t>(kNR - joff, jend - j));
            const std::uint32_t* pb = Bp + (jp * Kp + pc) * kNR + joff;
            const TileOut out{sums + (i - ic) * ld_sums + (j - jc),
                              ld_sums,
                              pc == 0,
                              pc + kp >= Kp,
                              c + i * N + j,
                              N,
                              alpha,
                              beta};
            tile<kMR>(pa, pb, kp, rows, cols, out);
            j += cols;
          }
          i += rows;
        }
      }
    }
  }
}

// Scratch of the calling thread, reused between calls (packed operands are megabytes). Only
// the calling thread touches the vectors; workers get raw pointers taken before the regions.
struct PackScratch {
  std::vector<std::uint32_t> a, b;
  std::vector<float> sums;
};
PackScratch& calling_thread_scratch() {
  thread_local PackScratch scratch;
  return scratch;
}

}  // namespace

bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

void gemm_bf16_avx512(std::uint16_t* c, const std::uint16_t* a, const std::uint16_t* b,
                      std::int64_t M, std::int64_t N, std::int64_t K, Trans ta, Trans tb,
                      float alpha, float beta) {
  if (M == 0 || N == 0) return;
  cpu_threads_setup();
  const std::int64_t Kp = ceil_div(K, 2);
  const std::int64_t panels_a = ceil_div(M, kMR), panels_b = ceil_div(N, kNR);
  const bool parallel = double(M) * double(N) * double(K) >= kParallelMinMacs && !omp_in_parallel();

  PackScratch& scratch = calling_thread_scratch();
  scratch.a.resize(std::size_t(panels_a * Kp * kMR));
  scratch.b.resize(std::size_t(panels_b * Kp * kNR));
  std::uint32_t* const Ap = scratch.a.data();
  std::uint32_t* const Bp = scratch.b.data();
  // op(a) element (row i, k): a[i * K + k] (Trans::no) or a[k * M + i]; op(b) element
  // (column j, k): b[k * N + j] (Trans::no) or b[j * K + k].
  const std::int64_t a_sl = ta == Trans::no ? K : 1, a_sk = ta == Trans::no ? 1 : M;
  const std::int64_t b_sl = tb == Trans::no ? 1 : K, b_sk = tb == Trans::no ? N : 1;
  if (Kp > 0) {
#pragma omp parallel for schedule(static) if (parallel)
    for (std::int64_t q = 0; q < panels_a + panels_b; ++q) {
      if (q < panels_a) {
        const std::int64_t i0 = q * kMR;
        pack_panel(Ap + q * Kp * kMR, a + i0 * a_sl, a_sl, a_sk,
                   std::min<std::int64_t>(kMR, M - i0), kMR, K);
      } else {
        const std::int64_t j0 = (q - panels_a) * kNR;
        pack_panel(Bp + (q - panels_a) * Kp * kNR, b + j0 * b_sl, b_sl, b_sk,
                   std::min<std::int64_t>(kNR, N - j0), kNR, K);
      }
    }
  }

  // Column chunk: the packed B chunk (kc pairs x nc words) within kBChunkBytes, whole panels.
  const std::int64_t kc = std::max<std::int64_t>(1, std::min(Kp, kKcPairs));
  const std::int64_t nc = std::max<std::int64_t>(1, kBChunkBytes / (kc * 4 * kNR)) * kNR;
  const GemmSplit split = gemm_split(M, N, K);
  const std::int64_t sums_per_block = Kp > kKcPairs ? kMc * (nc + 16) : 0;
  scratch.sums.resize(std::size_t(split.parts * sums_per_block));
  float* const sums = scratch.sums.data();
  const std::int64_t dim = split.rows ? M : N;
#pragma omp parallel for schedule(static) if (parallel && split.parts > 1)
  for (std::int64_t p = 0; p < split.parts; ++p) {
    const std::int64_t lo = gemm_split_begin(dim, split.parts, p);
    const std::int64_t hi = gemm_split_begin(dim, split.parts, p + 1);
    if (hi <= lo) continue;
    float* const block_sums = sums_per_block ? sums + p * sums_per_block : nullptr;
    if (split.rows)
      compute_block(c, Ap, Bp, N, Kp, lo, hi, 0, N, alpha, beta, block_sums, nc);
    else
      compute_block(c, Ap, Bp, N, Kp, 0, M, lo, hi, alpha, beta, block_sums, nc);
  }
}

}  // namespace trainmem
