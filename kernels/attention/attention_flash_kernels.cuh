// Flash-style attention kernels (launchers in attention_flash.cu; the design is described
// there). Device code only: also compiled as host C++ by the CPU emulator tests
// (tests/test_cuda_kernels_emulated.cpp).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "attention/attention_math.hpp"
#include "common/cuda_device.cuh"
#include "common/launch_shape.hpp"
#include "common/storage.hpp"

namespace trainmem::cuda {

constexpr int kFlashWarps = 4;
constexpr int kFlashThreads = kFlashWarps * 32;
constexpr int kFlashRowsPerWarp = 4;                              // forward and dq
constexpr int kFlashBlockRows = kFlashWarps * kFlashRowsPerWarp;  // 16 query rows per block
constexpr int kFlashKeyTile = 32;                                 // keys per tile (one per lane)
constexpr int kFlashKeysPerWarp = 4;                              // dk/dv
constexpr int kFlashBlockKeys = kFlashWarps * kFlashKeysPerWarp;  // 16 keys per block
constexpr int kFlashQueryTile = 32;  // query rows per tile (one per lane)
constexpr int kFlashMaxHeadDim = 256;
static_assert(kFlashThreads == kFlashWarps * 32, "one row (or key) group per warp");

__device__ __forceinline__ float flash_dot_smem(const float* x, const float* y, int n) {
  float acc = 0.0f;
  for (int e = 0; e < n; ++e) acc += x[e] * y[e];
  return acc;
}

// A shared-memory tile to fill from a (b, s, heads, d) tensor: its row r starts at smem + r *
// pitch.
struct FlashTile {
  float* smem;
  int pitch;
  const void* src;
};

// The one tile load of the flash kernels: fills `rows` rows of each tile with the head vectors
// of head `head` (of heads) of batch row bi at positions t0, t0 + 1, ..., as fp32: tile row r gets
// the d elements at ((bi*s + t0 + r)*heads + head)*d of its src. Rows at position s or beyond are
// zeros, so a partial last tile reads nothing past the tensor. The tiles share that geometry
// (q with dout, k with v) and are filled in one pass over rows * d elements, strided over the
// block's threads. Every thread of the block must call it; it has no barrier (the caller puts
// one between the tile's writers and its readers).
template <class S, class... Tiles>
__device__ __forceinline__ void flash_load_tiles(int rows, std::int64_t bi, std::int64_t head,
                                                 std::int64_t heads, std::int64_t t0,
                                                 std::int64_t s, int d, Tiles... tiles) {
  static_assert((std::is_same_v<Tiles, FlashTile> && ...), "each tile is a FlashTile");
  for (int idx = threadIdx.x; idx < rows * d; idx += kFlashThreads) {
    const int r = idx / d;
    const int e = idx - r * d;
    const std::int64_t t = t0 + r;
    if (t < s) {
      const std::size_t off = std::size_t((bi * s + t) * heads + head) * d + e;
      ((tiles.smem[r * tiles.pitch + e] = S::load(tiles.src, off)), ...);
    } else {
      ((tiles.smem[r * tiles.pitch + e] = 0.0f), ...);
    }
  }
}

// ---------------------------------------------------------------- kernels

// smem: sQ (16, d) | sK (32, kp) | sV (32, d). window: 0 full causal, W > 0 sliding window
// (attention_math.hpp); key tiles holding no visible key of the block are never loaded.
template <class S, int DMAX>
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(void* out, float* lse, const void* q, const void* k, const void* v,
                         std::int64_t s, std::int64_t a, std::int64_t kv, int d, float scale,
                         std::int64_t window) {
  constexpr int DPL = DMAX / 32;
  TM_DYNAMIC_SHARED(float, smem);
  const int kp = d | 1;
  float* sQ = smem;
  float* sK = sQ + kFlashBlockRows * d;
  float* sV = sK + kFlashKeyTile * kp;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const std::int64_t bi = blockIdx.x / a;
  const std::int64_t head = blockIdx.x % a;
  const std::int64_t kh = attention_kv_head(head, a, kv);
  // Later query blocks have more keys to visit: schedule them first.
  const std::int64_t q0 = std::int64_t(gridDim.y - 1 - blockIdx.y) * kFlashBlockRows;
  const std::int64_t q_end = q0 + kFlashBlockRows < s ? q0 + kFlashBlockRows : s;

  flash_load_tiles<S>(kFlashBlockRows, bi, head, a, q0, s, d, FlashTile{sQ, d, q});

  OnlineSoftmax<float> st[kFlashRowsPerWarp];
  float o[kFlashRowsPerWarp][DPL];
  TM_UNROLL
  for (int rr = 0; rr < kFlashRowsPerWarp; ++rr) {
    st[rr] = OnlineSoftmax<float>::start();
    TM_UNROLL
    for (int t = 0; t < DPL; ++t) o[rr][t] = 0.0f;
  }

  // The first tile holds the first visible key of the block's first row (the earliest of its
  // rows); uniform over the block, so every thread runs the same iterations (barriers).
  const std::int64_t k_first = window_first_key(q0, window) / kFlashKeyTile * kFlashKeyTile;
  for (std::int64_t k0 = k_first; k0 < q_end; k0 += kFlashKeyTile) {
    __syncthreads();  // sQ written (first tile) / previous sK, sV consumed
    flash_load_tiles<S>(kFlashKeyTile, bi, kh, kv, k0, s, d, FlashTile{sK, kp, k},
                        FlashTile{sV, d, v});
    __syncthreads();

    TM_UNROLL
    for (int rr = 0; rr < kFlashRowsPerWarp; ++rr) {
      const int r = warp * kFlashRowsPerWarp + rr;
      const std::int64_t i = q0 + r;
      if (i >= s || i < k0) continue;  // warp-uniform: no visible key in this tile
      const std::int64_t lo = window_first_key(i, window);
      if (lo >= k0 + kFlashKeyTile) continue;  // warp-uniform: the row's window starts later
      const std::int64_t kj = k0 + lane;
      const bool vis = window_visible(i, kj, window);  // lo <= kj <= i < s
      float sc = -INFINITY;
      if (vis) sc = flash_dot_smem(sQ + r * d, sK + lane * kp, d) * scale;
      // Key max(k0, lo) <= i is visible to one lane, so the tile maximum is finite.
      const float alpha = online_softmax_rescale<float>(&st[rr], cuda::warp_max(sc));
      const float p = vis ? online_softmax_weight<float>(st[rr], sc) : 0.0f;
      st[rr].l += cuda::warp_sum(p);
      TM_UNROLL
      for (int t = 0; t < DPL; ++t) o[rr][t] *= alpha;
      const std::int64_t nvis = i - k0 + 1;
      const int jmax = nvis < kFlashKeyTile ? int(nvis) : kFlashKeyTile;
      const int jmin = lo > k0 ? int(lo - k0) : 0;  // keys left of the window: p = 0
      for (int j = jmin; j < jmax; ++j) {
        const float pj = __shfl_sync(cuda::kFullMask, p, j);
        const float* vr = sV + j * d;
        TM_UNROLL
        for (int t = 0; t < DPL; ++t) {
          const int e = lane + 32 * t;
          if (e < d) o[rr][t] += pj * vr[e];
        }
      }
    }
  }

  TM_UNROLL
  for (int rr = 0; rr < kFlashRowsPerWarp; ++rr) {
    const std::int64_t i = q0 + warp * kFlashRowsPerWarp + rr;
    if (i >= s) continue;
    const float inv_l = 1.0f / st[rr].l;
    const std::size_t row = std::size_t((bi * s + i) * a + head) * d;
    TM_UNROLL
    for (int t = 0; t < DPL; ++t) {
      const int e = lane + 32 * t;
      if (e < d) S::store(out, row + e, o[rr][t] * inv_l);
    }
    if (lane == 0) lse[(bi * a + head) * s + i] = online_softmax_lse<float>(st[rr]);
  }
}

// delta (b, a, s) = rowsum(dout * out): one warp per (bi, i, head) row, rows in dout's order.
template <class S>
__global__ void __launch_bounds__(kFlashThreads)
    flash_delta_kernel(float* delta, const void* dout, const void* out, std::int64_t rows,
                       std::int64_t s, std::int64_t a, int d) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * kFlashWarps + (threadIdx.x >> 5);
  if (row >= rows) return;  // whole warp; no barrier follows
  const std::size_t base = std::size_t(row) * d;
  float acc = 0.0f;
  for (int e = lane; e < d; e += 32) acc += S::load(dout, base + e) * S::load(out, base + e);
  acc = cuda::warp_sum(acc);
  if (lane == 0) {
    const std::int64_t head = row % a;
    const std::int64_t pos = row / a;  // bi*s + i
    const std::int64_t i = pos % s;
    const std::int64_t bi = pos / s;
    delta[(bi * a + head) * s + i] = acc;
  }
}

// smem: sK (16, d) | sV (16, d) | sQ (32, qp) | sdO (32, qp) | sL (32) | sD (32). Under a
// window W key j is seen by queries j..j+W-1: query tiles past the block's last such query are
// never loaded.
template <class S, int DMAX>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_dkdv_kernel(void* dk, void* dv, const void* dout, const void* q, const void* k,
                               const void* v, const float* lse, const float* delta, std::int64_t s,
                               std::int64_t a, std::int64_t kv, int d, float scale,
                               std::int64_t window) {
  constexpr int DPL = DMAX / 32;
  TM_DYNAMIC_SHARED(float, smem);
  const int qp = d | 1;
  float* sK = smem;
  float* sV = sK + kFlashBlockKeys * d;
  float* sQ = sV + kFlashBlockKeys * d;
  float* sdO = sQ + kFlashQueryTile * qp;
  float* sL = sdO + kFlashQueryTile * qp;
  float* sD = sL + kFlashQueryTile;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const std::int64_t bi = blockIdx.x / kv;
  const std::int64_t kh = blockIdx.x % kv;
  const std::int64_t g = a / kv;
  // Early keys are seen by the most queries: schedule them first.
  const std::int64_t k0 = std::int64_t(blockIdx.y) * kFlashBlockKeys;

  flash_load_tiles<S>(kFlashBlockKeys, bi, kh, kv, k0, s, d, FlashTile{sK, d, k},
                      FlashTile{sV, d, v});

  float dk_acc[kFlashKeysPerWarp][DPL];
  float dv_acc[kFlashKeysPerWarp][DPL];
  TM_UNROLL
  for (int kk = 0; kk < kFlashKeysPerWarp; ++kk) {
    TM_UNROLL
    for (int t = 0; t < DPL; ++t) dk_acc[kk][t] = dv_acc[kk][t] = 0.0f;
  }

  const std::int64_t i_first =
      (k0 / kFlashQueryTile) * kFlashQueryTile;  // first tile with a row >= k0
  // One past the last query that sees a key of the block: k0 + 15 + W - 1 + 1 (s without a window).
  const std::int64_t last_key = k0 + kFlashBlockKeys - 1;
  const std::int64_t i_stop = window > 0 && last_key + window < s ? last_key + window : s;
  for (std::int64_t hh = 0; hh < g; ++hh) {
    const std::int64_t head = kh * g + hh;
    for (std::int64_t i0 = i_first; i0 < i_stop; i0 += kFlashQueryTile) {
      __syncthreads();  // sK, sV written (first pass) / previous sQ, sdO, sL, sD consumed
      flash_load_tiles<S>(kFlashQueryTile, bi, head, a, i0, s, d, FlashTile{sQ, qp, q},
                          FlashTile{sdO, qp, dout});
      if (threadIdx.x < kFlashQueryTile) {
        const std::int64_t i = i0 + threadIdx.x;
        sL[threadIdx.x] = i < s ? lse[(bi * a + head) * s + i] : 0.0f;
        sD[threadIdx.x] = i < s ? delta[(bi * a + head) * s + i] : 0.0f;
      }
      __syncthreads();

      const std::int64_t i = i0 + lane;  // this lane's query row
      const std::int64_t rows_left = s - i0;
      const int ii_end = rows_left < kFlashQueryTile ? int(rows_left) : kFlashQueryTile;
      TM_UNROLL
      for (int kk = 0; kk < kFlashKeysPerWarp; ++kk) {
        const int kr = warp * kFlashKeysPerWarp + kk;
        const std::int64_t j = k0 + kr;
        if (j >= s || j >= i0 + kFlashQueryTile) continue;  // warp-uniform: no row sees key j
        if (window > 0 && i0 >= j + window) continue;  // warp-uniform: all rows past j's window
        const bool vis = i < s && window_visible(i, j, window);
        float p = 0.0f, ds = 0.0f;
        if (vis) {
          const float sc = flash_dot_smem(sQ + lane * qp, sK + kr * d, d) * scale;
          const float dp = flash_dot_smem(sdO + lane * qp, sV + kr * d, d);
          p = softmax_prob_from_lse<float>(sc, sL[lane]);
          ds = softmax_backward_elem<float>(p, dp, sD[lane]);
        }
        const int ii_begin = j > i0 ? int(j - i0) : 0;  // rows before key j do not see it
        // Rows from j + W on do not see it either.
        const int ii_stop = window > 0 && j + window - i0 < ii_end ? int(j + window - i0) : ii_end;
        for (int ii = ii_begin; ii < ii_stop; ++ii) {
          const float pi = __shfl_sync(cuda::kFullMask, p, ii);
          const float dsi = __shfl_sync(cuda::kFullMask, ds, ii);
          const float* qr = sQ + ii * qp;
          const float* dr = sdO + ii * qp;
          TM_UNROLL
          for (int t = 0; t < DPL; ++t) {
            const int e = lane + 32 * t;
            if (e < d) {
              dv_acc[kk][t] += pi * dr[e];
              dk_acc[kk][t] += dsi * qr[e];
            }
          }
        }
      }
    }
  }

  TM_UNROLL
  for (int kk = 0; kk < kFlashKeysPerWarp; ++kk) {
    const std::int64_t j = k0 + warp * kFlashKeysPerWarp + kk;
    if (j >= s) continue;
    const std::size_t row = std::size_t((bi * s + j) * kv + kh) * d;
    TM_UNROLL
    for (int t = 0; t < DPL; ++t) {
      const int e = lane + 32 * t;
      if (e < d) {
        S::store(dk, row + e, dk_acc[kk][t] * scale);
        S::store(dv, row + e, dv_acc[kk][t]);
      }
    }
  }
}

// smem: sQ (16, d) | sdO (16, d) | sK (32, kp) | sV (32, kp). Window: key tiles as the forward.
template <class S, int DMAX>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_dq_kernel(void* dq, const void* dout, const void* q, const void* k,
                             const void* v, const float* lse, const float* delta, std::int64_t s,
                             std::int64_t a, std::int64_t kv, int d, float scale,
                             std::int64_t window) {
  constexpr int DPL = DMAX / 32;
  TM_DYNAMIC_SHARED(float, smem);
  const int kp = d | 1;
  float* sQ = smem;
  float* sdO = sQ + kFlashBlockRows * d;
  float* sK = sdO + kFlashBlockRows * d;
  float* sV = sK + kFlashKeyTile * kp;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const std::int64_t bi = blockIdx.x / a;
  const std::int64_t head = blockIdx.x % a;
  const std::int64_t kh = attention_kv_head(head, a, kv);
  const std::int64_t q0 = std::int64_t(gridDim.y - 1 - blockIdx.y) * kFlashBlockRows;
  const std::int64_t q_end = q0 + kFlashBlockRows < s ? q0 + kFlashBlockRows : s;

  flash_load_tiles<S>(kFlashBlockRows, bi, head, a, q0, s, d, FlashTile{sQ, d, q},
                      FlashTile{sdO, d, dout});

  float row_lse[kFlashRowsPerWarp], row_delta[kFlashRowsPerWarp];
  float dq_acc[kFlashRowsPerWarp][DPL];
  TM_UNROLL
  for (int rr = 0; rr < kFlashRowsPerWarp; ++rr) {
    const std::int64_t i = q0 + warp * kFlashRowsPerWarp + rr;
    row_lse[rr] = i < s ? lse[(bi * a + head) * s + i] : 0.0f;
    row_delta[rr] = i < s ? delta[(bi * a + head) * s + i] : 0.0f;
    TM_UNROLL
    for (int t = 0; t < DPL; ++t) dq_acc[rr][t] = 0.0f;
  }

  const std::int64_t k_first = window_first_key(q0, window) / kFlashKeyTile * kFlashKeyTile;
  for (std::int64_t k0 = k_first; k0 < q_end; k0 += kFlashKeyTile) {
    __syncthreads();  // sQ, sdO written (first tile) / previous sK, sV consumed
    flash_load_tiles<S>(kFlashKeyTile, bi, kh, kv, k0, s, d, FlashTile{sK, kp, k},
                        FlashTile{sV, kp, v});
    __syncthreads();

    TM_UNROLL
    for (int rr = 0; rr < kFlashRowsPerWarp; ++rr) {
      const int r = warp * kFlashRowsPerWarp + rr;
      const std::int64_t i = q0 + r;
      if (i >= s || i < k0) continue;  // warp-uniform
      const std::int64_t lo = window_first_key(i, window);
      if (lo >= k0 + kFlashKeyTile) continue;  // warp-uniform: the row's window starts later
      const std::int64_t kj = k0 + lane;
      float ds = 0.0f;
      if (window_visible(i, kj, window)) {
        const float sc = flash_dot_smem(sQ + r * d, sK + lane * kp, d) * scale;
        const float dp = flash_dot_smem(sdO + r * d, sV + lane * kp, d);
        const float p = softmax_prob_from_lse<float>(sc, row_lse[rr]);
        ds = softmax_backward_elem<float>(p, dp, row_delta[rr]);
      }
      const std::int64_t nvis = i - k0 + 1;
      const int jmax = nvis < kFlashKeyTile ? int(nvis) : kFlashKeyTile;
      const int jmin = lo > k0 ? int(lo - k0) : 0;  // keys left of the window: ds = 0
      for (int j = jmin; j < jmax; ++j) {
        const float dsj = __shfl_sync(cuda::kFullMask, ds, j);
        const float* kr = sK + j * kp;
        TM_UNROLL
        for (int t = 0; t < DPL; ++t) {
          const int e = lane + 32 * t;
          if (e < d) dq_acc[rr][t] += dsj * kr[e];
        }
      }
    }
  }

  TM_UNROLL
  for (int rr = 0; rr < kFlashRowsPerWarp; ++rr) {
    const std::int64_t i = q0 + warp * kFlashRowsPerWarp + rr;
    if (i >= s) continue;
    const std::size_t row = std::size_t((bi * s + i) * a + head) * d;
    TM_UNROLL
    for (int t = 0; t < DPL; ++t) {
      const int e = lane + 32 * t;
      if (e < d) S::store(dq, row + e, dq_acc[rr][t] * scale);
    }
  }
}

// ---------------------------------------------------------------- launch geometry

// Dynamic shared memory of each kernel, in bytes, for head dim d (see the smem comments).
inline std::size_t flash_forward_smem(int d) {
  return sizeof(float) * (std::size_t(kFlashBlockRows) * d + std::size_t(kFlashKeyTile) * (d | 1) +
                          std::size_t(kFlashKeyTile) * d);
}
inline std::size_t flash_dkdv_smem(int d) {
  return sizeof(float) * (2 * std::size_t(kFlashBlockKeys) * d +
                          2 * std::size_t(kFlashQueryTile) * (d | 1) + 2 * kFlashQueryTile);
}
inline std::size_t flash_dq_smem(int d) {
  return sizeof(float) *
         (2 * std::size_t(kFlashBlockRows) * d + 2 * std::size_t(kFlashKeyTile) * (d | 1));
}

// grid (b*heads, ceil(s / rows_per_block)), kFlashThreads threads: blockIdx.x = bi*heads + head,
// blockIdx.y a block of rows (queries, or keys for dk/dv).
inline LaunchShape flash_rows_launch(std::int64_t b, std::int64_t heads, std::int64_t s,
                                     int rows_per_block, std::size_t smem, const char* op) {
  require_positive(b, op, "b");
  require_positive(heads, op, "heads");
  require_positive(s, op, "s");
  const std::int64_t bh = b * heads;
  const std::int64_t blocks = ceil_div(s, rows_per_block);
  require_fits(bh, kMaxGridX, op, "b*heads");
  require_fits(blocks, kMaxGridY, op, "s/16 (row blocks, gridDim.y)");
  LaunchShape shape;
  shape.grid_x = unsigned(bh);
  shape.grid_y = unsigned(blocks);
  shape.block_x = kFlashThreads;
  shape.smem_bytes = smem;
  return shape;
}
inline LaunchShape flash_forward_launch(std::int64_t b, std::int64_t a, std::int64_t s, int d,
                                        const char* op) {
  return flash_rows_launch(b, a, s, kFlashBlockRows, flash_forward_smem(d), op);
}
inline LaunchShape flash_dq_launch(std::int64_t b, std::int64_t a, std::int64_t s, int d,
                                   const char* op) {
  return flash_rows_launch(b, a, s, kFlashBlockRows, flash_dq_smem(d), op);
}
inline LaunchShape flash_dkdv_launch(std::int64_t b, std::int64_t kv, std::int64_t s, int d,
                                     const char* op) {
  return flash_rows_launch(b, kv, s, kFlashBlockKeys, flash_dkdv_smem(d), op);
}
// delta: a warp per (bi, i, head) row, rows = b*s*a.
inline LaunchShape flash_delta_launch(std::int64_t rows, const char* op) {
  return warp_per_row_launch(rows, kFlashWarps, op, "b*s*a");
}

}  // namespace trainmem::cuda
