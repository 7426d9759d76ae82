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

__device__ __forceinline__ float flash_dot_smem(const float* a, const float* b, int n) {
  float acc = 0.0f;
  for (int d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

// A shared-memory tile to fill from a (B,T,H,HD) tensor: its row r starts at smem + r * pitch.
struct FlashTile {
  float* smem;
  int pitch;
  const void* src;
};

// The one tile load of the flash kernels: fills `rows` rows of each tile with the head vectors
// of head `head` (of H) of batch row b at positions t0, t0 + 1, ..., as fp32: tile row r gets
// the HD elements at ((b*T + t0 + r)*H + head)*HD of its src. Rows at position T or beyond are
// zeros, so a partial last tile reads nothing past the tensor. The tiles share that geometry
// (q with dout, k with v) and are filled in one pass over rows * HD elements, strided over the
// block's threads. Every thread of the block must call it; it has no barrier (the caller puts
// one between the tile's writers and its readers).
template <class S, class... Tiles>
__device__ __forceinline__ void flash_load_tiles(int rows, std::int64_t b, std::int64_t head,
                                                 std::int64_t H, std::int64_t t0, std::int64_t T,
                                                 int HD, Tiles... tiles) {
  static_assert((std::is_same_v<Tiles, FlashTile> && ...), "each tile is a FlashTile");
  for (int idx = threadIdx.x; idx < rows * HD; idx += kFlashThreads) {
    const int r = idx / HD;
    const int d = idx - r * HD;
    const std::int64_t t = t0 + r;
    if (t < T) {
      const std::size_t off = std::size_t((b * T + t) * H + head) * HD + d;
      ((tiles.smem[r * tiles.pitch + d] = S::load(tiles.src, off)), ...);
    } else {
      ((tiles.smem[r * tiles.pitch + d] = 0.0f), ...);
    }
  }
}

// ---------------------------------------------------------------- kernels

// smem: sQ (16, HD) | sK (32, kp) | sV (32, HD)
template <class S, int HDMAX>
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(void* out, float* lse, const void* q, const void* k, const void* v,
                         std::int64_t T, std::int64_t NH, std::int64_t NKV, int HD, float scale) {
  constexpr int DPL = HDMAX / 32;
  TM_DYNAMIC_SHARED(float, smem);
  const int kp = HD | 1;
  float* sQ = smem;
  float* sK = sQ + kFlashBlockRows * HD;
  float* sV = sK + kFlashKeyTile * kp;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const std::int64_t b = blockIdx.x / NH;
  const std::int64_t h = blockIdx.x % NH;
  const std::int64_t kh = attention_kv_head(h, NH, NKV);
  // Later query blocks have more keys to visit: schedule them first.
  const std::int64_t q0 = std::int64_t(gridDim.y - 1 - blockIdx.y) * kFlashBlockRows;
  const std::int64_t q_end = q0 + kFlashBlockRows < T ? q0 + kFlashBlockRows : T;

  flash_load_tiles<S>(kFlashBlockRows, b, h, NH, q0, T, HD, FlashTile{sQ, HD, q});

  OnlineSoftmax<float> st[kFlashRowsPerWarp];
  float o[kFlashRowsPerWarp][DPL];
  TM_UNROLL
  for (int rr = 0; rr < kFlashRowsPerWarp; ++rr) {
    st[rr] = OnlineSoftmax<float>::start();
    TM_UNROLL
    for (int t = 0; t < DPL; ++t) o[rr][t] = 0.0f;
  }

  for (std::int64_t k0 = 0; k0 < q_end; k0 += kFlashKeyTile) {
    __syncthreads();  // sQ written (first tile) / previous sK, sV consumed
    flash_load_tiles<S>(kFlashKeyTile, b, kh, NKV, k0, T, HD, FlashTile{sK, kp, k},
                        FlashTile{sV, HD, v});
    __syncthreads();

    TM_UNROLL
    for (int rr = 0; rr < kFlashRowsPerWarp; ++rr) {
      const int r = warp * kFlashRowsPerWarp + rr;
      const std::int64_t i = q0 + r;
      if (i >= T || i < k0) continue;  // warp-uniform: no visible key in this tile
      const std::int64_t kj = k0 + lane;
      const bool vis = causal_visible(i, kj);  // kj <= i < T
      float s = -INFINITY;
      if (vis) s = flash_dot_smem(sQ + r * HD, sK + lane * kp, HD) * scale;
      // Key k0 <= i is visible to lane 0, so the tile maximum is finite.
      const float alpha = online_softmax_rescale<float>(&st[rr], cuda::warp_max(s));
      const float p = vis ? online_softmax_weight<float>(st[rr], s) : 0.0f;
      st[rr].l += cuda::warp_sum(p);
      TM_UNROLL
      for (int t = 0; t < DPL; ++t) o[rr][t] *= alpha;
      const std::int64_t nvis = i - k0 + 1;
      const int jmax = nvis < kFlashKeyTile ? int(nvis) : kFlashKeyTile;
      for (int j = 0; j < jmax; ++j) {
        const float pj = __shfl_sync(cuda::kFullMask, p, j);
        const float* vr = sV + j * HD;
        TM_UNROLL
        for (int t = 0; t < DPL; ++t) {
          const int d = lane + 32 * t;
          if (d < HD) o[rr][t] += pj * vr[d];
        }
      }
    }
  }

  TM_UNROLL
  for (int rr = 0; rr < kFlashRowsPerWarp; ++rr) {
    const std::int64_t i = q0 + warp * kFlashRowsPerWarp + rr;
    if (i >= T) continue;
    const float inv_l = 1.0f / st[rr].l;
    const std::size_t row = std::size_t((b * T + i) * NH + h) * HD;
    TM_UNROLL
    for (int t = 0; t < DPL; ++t) {
      const int d = lane + 32 * t;
      if (d < HD) S::store(out, row + d, o[rr][t] * inv_l);
    }
    if (lane == 0) lse[(b * NH + h) * T + i] = online_softmax_lse<float>(st[rr]);
  }
}

// delta (B,NH,T) = rowsum(dout * out): one warp per (b, i, h) row, rows in dout's order.
template <class S>
__global__ void __launch_bounds__(kFlashThreads)
    flash_delta_kernel(float* delta, const void* dout, const void* out, std::int64_t rows,
                       std::int64_t T, std::int64_t NH, int HD) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * kFlashWarps + (threadIdx.x >> 5);
  if (row >= rows) return;  // whole warp; no barrier follows
  const std::size_t base = std::size_t(row) * HD;
  float acc = 0.0f;
  for (int d = lane; d < HD; d += 32) acc += S::load(dout, base + d) * S::load(out, base + d);
  acc = cuda::warp_sum(acc);
  if (lane == 0) {
    const std::int64_t h = row % NH;
    const std::int64_t bi = row / NH;  // b*T + i
    const std::int64_t i = bi % T;
    const std::int64_t b = bi / T;
    delta[(b * NH + h) * T + i] = acc;
  }
}

// smem: sK (16, HD) | sV (16, HD) | sQ (32, qp) | sdO (32, qp) | sL (32) | sD (32)
template <class S, int HDMAX>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_dkdv_kernel(void* dk, void* dv, const void* dout, const void* q, const void* k,
                               const void* v, const float* lse, const float* delta, std::int64_t T,
                               std::int64_t NH, std::int64_t NKV, int HD, float scale) {
  constexpr int DPL = HDMAX / 32;
  TM_DYNAMIC_SHARED(float, smem);
  const int qp = HD | 1;
  float* sK = smem;
  float* sV = sK + kFlashBlockKeys * HD;
  float* sQ = sV + kFlashBlockKeys * HD;
  float* sdO = sQ + kFlashQueryTile * qp;
  float* sL = sdO + kFlashQueryTile * qp;
  float* sD = sL + kFlashQueryTile;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const std::int64_t b = blockIdx.x / NKV;
  const std::int64_t kh = blockIdx.x % NKV;
  const std::int64_t g = NH / NKV;
  // Early keys are seen by the most queries: schedule them first.
  const std::int64_t k0 = std::int64_t(blockIdx.y) * kFlashBlockKeys;

  flash_load_tiles<S>(kFlashBlockKeys, b, kh, NKV, k0, T, HD, FlashTile{sK, HD, k},
                      FlashTile{sV, HD, v});

  float dk_acc[kFlashKeysPerWarp][DPL];
  float dv_acc[kFlashKeysPerWarp][DPL];
  TM_UNROLL
  for (int kk = 0; kk < kFlashKeysPerWarp; ++kk) {
    TM_UNROLL
    for (int t = 0; t < DPL; ++t) dk_acc[kk][t] = dv_acc[kk][t] = 0.0f;
  }

  const std::int64_t i_first =
      (k0 / kFlashQueryTile) * kFlashQueryTile;  // first tile with a row >= k0
  for (std::int64_t hh = 0; hh < g; ++hh) {
    const std::int64_t h = kh * g + hh;
    for (std::int64_t i0 = i_first; i0 < T; i0 += kFlashQueryTile) {
      __syncthreads();  // sK, sV written (first pass) / previous sQ, sdO, sL, sD consumed
      flash_load_tiles<S>(kFlashQueryTile, b, h, NH, i0, T, HD, FlashTile{sQ, qp, q},
                          FlashTile{sdO, qp, dout});
      if (threadIdx.x < kFlashQueryTile) {
        const std::int64_t i = i0 + threadIdx.x;
        sL[threadIdx.x] = i < T ? lse[(b * NH + h) * T + i] : 0.0f;
        sD[threadIdx.x] = i < T ? delta[(b * NH + h) * T + i] : 0.0f;
      }
      __syncthreads();

      const std::int64_t i = i0 + lane;  // this lane's query row
      const std::int64_t rows_left = T - i0;
      const int ii_end = rows_left < kFlashQueryTile ? int(rows_left) : kFlashQueryTile;
      TM_UNROLL
      for (int kk = 0; kk < kFlashKeysPerWarp; ++kk) {
        const int kr = warp * kFlashKeysPerWarp + kk;
        const std::int64_t j = k0 + kr;
        if (j >= T || j >= i0 + kFlashQueryTile) continue;  // warp-uniform: no row sees key j
        const bool vis = i < T && causal_visible(i, j);
        float p = 0.0f, ds = 0.0f;
        if (vis) {
          const float s = flash_dot_smem(sQ + lane * qp, sK + kr * HD, HD) * scale;
          const float dp = flash_dot_smem(sdO + lane * qp, sV + kr * HD, HD);
          p = softmax_prob_from_lse<float>(s, sL[lane]);
          ds = softmax_backward_elem<float>(p, dp, sD[lane]);
        }
        const int ii_begin = j > i0 ? int(j - i0) : 0;  // rows before key j do not see it
        for (int ii = ii_begin; ii < ii_end; ++ii) {
          const float pi = __shfl_sync(cuda::kFullMask, p, ii);
          const float dsi = __shfl_sync(cuda::kFullMask, ds, ii);
          const float* qr = sQ + ii * qp;
          const float* dr = sdO + ii * qp;
          TM_UNROLL
          for (int t = 0; t < DPL; ++t) {
            const int d = lane + 32 * t;
            if (d < HD) {
              dv_acc[kk][t] += pi * dr[d];
              dk_acc[kk][t] += dsi * qr[d];
            }
          }
        }
      }
    }
  }

  TM_UNROLL
  for (int kk = 0; kk < kFlashKeysPerWarp; ++kk) {
    const std::int64_t j = k0 + warp * kFlashKeysPerWarp + kk;
    if (j >= T) continue;
    const std::size_t row = std::size_t((b * T + j) * NKV + kh) * HD;
    TM_UNROLL
    for (int t = 0; t < DPL; ++t) {
      const int d = lane + 32 * t;
      if (d < HD) {
        S::store(dk, row + d, dk_acc[kk][t] * scale);
        S::store(dv, row + d, dv_acc[kk][t]);
      }
    }
  }
}

// smem: sQ (16, HD) | sdO (16, HD) | sK (32, kp) | sV (32, kp)
template <class S, int HDMAX>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_dq_kernel(void* dq, const void* dout, const void* q, const void* k,
                             const void* v, const float* lse, const float* delta, std::int64_t T,
                             std::int64_t NH, std::int64_t NKV, int HD, float scale) {
  constexpr int DPL = HDMAX / 32;
  TM_DYNAMIC_SHARED(float, smem);
  const int kp = HD | 1;
  float* sQ = smem;
  float* sdO = sQ + kFlashBlockRows * HD;
  float* sK = sdO + kFlashBlockRows * HD;
  float* sV = sK + kFlashKeyTile * kp;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const std::int64_t b = blockIdx.x / NH;
  const std::int64_t h = blockIdx.x % NH;
  const std::int64_t kh = attention_kv_head(h, NH, NKV);
  const std::int64_t q0 = std::int64_t(gridDim.y - 1 - blockIdx.y) * kFlashBlockRows;
  const std::int64_t q_end = q0 + kFlashBlockRows < T ? q0 + kFlashBlockRows : T;

  flash_load_tiles<S>(kFlashBlockRows, b, h, NH, q0, T, HD, FlashTile{sQ, HD, q},
                      FlashTile{sdO, HD, dout});

  float row_lse[kFlashRowsPerWarp], row_delta[kFlashRowsPerWarp];
  float dq_acc[kFlashRowsPerWarp][DPL];
  TM_UNROLL
  for (int rr = 0; rr < kFlashRowsPerWarp; ++rr) {
    const std::int64_t i = q0 + warp * kFlashRowsPerWarp + rr;
    row_lse[rr] = i < T ? lse[(b * NH + h) * T + i] : 0.0f;
    row_delta[rr] = i < T ? delta[(b * NH + h) * T + i] : 0.0f;
    TM_UNROLL
    for (int t = 0; t < DPL; ++t) dq_acc[rr][t] = 0.0f;
  }

  for (std::int64_t k0 = 0; k0 < q_end; k0 += kFlashKeyTile) {
    __syncthreads();  // sQ, sdO written (first tile) / previous sK, sV consumed
    flash_load_tiles<S>(kFlashKeyTile, b, kh, NKV, k0, T, HD, FlashTile{sK, kp, k},
                        FlashTile{sV, kp, v});
    __syncthreads();

    TM_UNROLL
    for (int rr = 0; rr < kFlashRowsPerWarp; ++rr) {
      const int r = warp * kFlashRowsPerWarp + rr;
      const std::int64_t i = q0 + r;
      if (i >= T || i < k0) continue;  // warp-uniform
      const std::int64_t kj = k0 + lane;
      float ds = 0.0f;
      if (causal_visible(i, kj)) {
        const float s = flash_dot_smem(sQ + r * HD, sK + lane * kp, HD) * scale;
        const float dp = flash_dot_smem(sdO + r * HD, sV + lane * kp, HD);
        const float p = softmax_prob_from_lse<float>(s, row_lse[rr]);
        ds = softmax_backward_elem<float>(p, dp, row_delta[rr]);
      }
      const std::int64_t nvis = i - k0 + 1;
      const int jmax = nvis < kFlashKeyTile ? int(nvis) : kFlashKeyTile;
      for (int j = 0; j < jmax; ++j) {
        const float dsj = __shfl_sync(cuda::kFullMask, ds, j);
        const float* kr = sK + j * kp;
        TM_UNROLL
        for (int t = 0; t < DPL; ++t) {
          const int d = lane + 32 * t;
          if (d < HD) dq_acc[rr][t] += dsj * kr[d];
        }
      }
    }
  }

  TM_UNROLL
  for (int rr = 0; rr < kFlashRowsPerWarp; ++rr) {
    const std::int64_t i = q0 + warp * kFlashRowsPerWarp + rr;
    if (i >= T) continue;
    const std::size_t row = std::size_t((b * T + i) * NH + h) * HD;
    TM_UNROLL
    for (int t = 0; t < DPL; ++t) {
      const int d = lane + 32 * t;
      if (d < HD) S::store(dq, row + d, dq_acc[rr][t] * scale);
    }
  }
}

// ---------------------------------------------------------------- launch geometry

// Dynamic shared memory of each kernel, in bytes, for head dim HD (see the smem comments).
inline std::size_t flash_forward_smem(int HD) {
  return sizeof(float) * (std::size_t(kFlashBlockRows) * HD +
                          std::size_t(kFlashKeyTile) * (HD | 1) + std::size_t(kFlashKeyTile) * HD);
}
inline std::size_t flash_dkdv_smem(int HD) {
  return sizeof(float) * (2 * std::size_t(kFlashBlockKeys) * HD +
                          2 * std::size_t(kFlashQueryTile) * (HD | 1) + 2 * kFlashQueryTile);
}
inline std::size_t flash_dq_smem(int HD) {
  return sizeof(float) *
         (2 * std::size_t(kFlashBlockRows) * HD + 2 * std::size_t(kFlashKeyTile) * (HD | 1));
}

// grid (B*H, ceil(T / rows_per_block)), kFlashThreads threads: blockIdx.x = b*H + head,
// blockIdx.y a block of rows (queries, or keys for dk/dv).
inline LaunchShape flash_rows_launch(std::int64_t B, std::int64_t H, std::int64_t T,
                                     int rows_per_block, std::size_t smem, const char* op) {
  require_positive(B, op, "B");
  require_positive(H, op, "heads");
  require_positive(T, op, "T");
  const std::int64_t bh = B * H;
  const std::int64_t blocks = ceil_div(T, rows_per_block);
  require_fits(bh, kMaxGridX, op, "B*heads");
  require_fits(blocks, kMaxGridY, op, "T/16 (row blocks, gridDim.y)");
  LaunchShape s;
  s.grid_x = unsigned(bh);
  s.grid_y = unsigned(blocks);
  s.block_x = kFlashThreads;
  s.smem_bytes = smem;
  return s;
}
inline LaunchShape flash_forward_launch(std::int64_t B, std::int64_t NH, std::int64_t T, int HD,
                                        const char* op) {
  return flash_rows_launch(B, NH, T, kFlashBlockRows, flash_forward_smem(HD), op);
}
inline LaunchShape flash_dq_launch(std::int64_t B, std::int64_t NH, std::int64_t T, int HD,
                                   const char* op) {
  return flash_rows_launch(B, NH, T, kFlashBlockRows, flash_dq_smem(HD), op);
}
inline LaunchShape flash_dkdv_launch(std::int64_t B, std::int64_t NKV, std::int64_t T, int HD,
                                     const char* op) {
  return flash_rows_launch(B, NKV, T, kFlashBlockKeys, flash_dkdv_smem(HD), op);
}
// delta: a warp per (b, i, h) row, rows = B*T*NH.
inline LaunchShape flash_delta_launch(std::int64_t rows, const char* op) {
  return warp_per_row_launch(rows, kFlashWarps, op, "B*T*NH");
}

}  // namespace trainmem::cuda
