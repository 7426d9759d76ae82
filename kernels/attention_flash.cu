// Causal attention, flash-style: tiled online softmax, never materialising (T,T).
// Plain fp32 SIMT arithmetic (no tensor cores): correct and memory-lean first, fast second.
//
// Layouts: q, out, dout, dq (B,T,NH,HD) D; k, v, dk, dv (B,T,NKV,HD) D; lse, delta (B,NH,T) f32.
// Query head h reads kv head kh = h / g, g = NH / NKV. HD <= 256 (template HDMAX in 32..256);
// a lane owns head dims d = lane + 32*t, t < HDMAX/32.
//
// forward  grid (B*NH, ceil(T/16)), 4 warps. A block owns 16 query rows (4 per warp) and walks
//          key tiles of 32 (lane j scores key k0+j), keeping (m, l, o) per row in registers.
// backward delta kernel: delta = rowsum(dout * out), one warp per row;
//          dk/dv kernel, grid (B*NKV, ceil(T/16)): a block owns 16 keys (4 per warp), loops
//          over the g query heads of its group and over query tiles of 32 (lane i = a query
//          row), recomputes p = exp(s - lse) and ds = p (dp - delta), sums dv += p dout and
//          dk += ds q in registers;
//          dq kernel, grid (B*NH, ceil(T/16)): like the forward, dq += ds k over key tiles.
// Every output element has exactly one writer: no atomics, deterministic, dq/dk/dv with =.
//
// Shared memory is dynamic (floats). Tiles read by lane-distinct rows (lane j reads row j)
// use an odd pitch (HD | 1) so that the 32 lanes hit 32 different banks; tiles read by all
// lanes at the same address (broadcast) or at consecutive d use pitch HD.
#include "attention.cuh"
#include "attention_math.hpp"
#include "cuda_common.cuh"

namespace trainmem {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 4;                    // forward and dq
constexpr int kBlockRows = kWarps * kRowsPerWarp;  // 16 query rows per block
constexpr int kKeyTile = 32;                       // keys per tile (one per lane)
constexpr int kKeysPerWarp = 4;                    // dk/dv
constexpr int kBlockKeys = kWarps * kKeysPerWarp;  // 16 keys per block
constexpr int kQueryTile = 32;                     // query rows per tile (one per lane)
constexpr int kMaxHeadDim = 256;

__device__ __forceinline__ float dot_smem(const float* a, const float* b, int n) {
  float acc = 0.0f;
  for (int d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

// ---------------------------------------------------------------- kernels

// smem: sQ (16, HD) | sK (32, kp) | sV (32, HD)
template <class S, int HDMAX>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(void* out, float* lse, const void* q, const void* k, const void* v,
                         std::int64_t T, std::int64_t NH, std::int64_t NKV, int HD, float scale) {
  constexpr int DPL = HDMAX / 32;
  extern __shared__ float smem[];
  const int kp = HD | 1;
  float* sQ = smem;
  float* sK = sQ + kBlockRows * HD;
  float* sV = sK + kKeyTile * kp;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const std::int64_t b = blockIdx.x / NH;
  const std::int64_t h = blockIdx.x % NH;
  const std::int64_t kh = attention_kv_head(h, NH, NKV);
  // Later query blocks have more keys to visit: schedule them first.
  const std::int64_t q0 = std::int64_t(gridDim.y - 1 - blockIdx.y) * kBlockRows;
  const std::int64_t q_end = q0 + kBlockRows < T ? q0 + kBlockRows : T;

  for (int idx = threadIdx.x; idx < kBlockRows * HD; idx += kThreads) {
    const int r = idx / HD;
    const int d = idx - r * HD;
    const std::int64_t i = q0 + r;
    sQ[idx] = i < T ? S::load(q, std::size_t((b * T + i) * NH + h) * HD + d) : 0.0f;
  }

  OnlineSoftmax<float> st[kRowsPerWarp];
  float o[kRowsPerWarp][DPL];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    st[rr] = OnlineSoftmax<float>::start();
#pragma unroll
    for (int t = 0; t < DPL; ++t) o[rr][t] = 0.0f;
  }

  for (std::int64_t k0 = 0; k0 < q_end; k0 += kKeyTile) {
    __syncthreads();  // sQ written (first tile) / previous sK, sV consumed
    for (int idx = threadIdx.x; idx < kKeyTile * HD; idx += kThreads) {
      const int j = idx / HD;
      const int d = idx - j * HD;
      const std::int64_t t = k0 + j;
      float kval = 0.0f, vval = 0.0f;
      if (t < T) {
        const std::size_t off = std::size_t((b * T + t) * NKV + kh) * HD + d;
        kval = S::load(k, off);
        vval = S::load(v, off);
      }
      sK[j * kp + d] = kval;
      sV[j * HD + d] = vval;
    }
    __syncthreads();

#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const std::int64_t i = q0 + r;
      if (i >= T || i < k0) continue;  // warp-uniform: no visible key in this tile
      const std::int64_t kj = k0 + lane;
      const bool vis = causal_visible(i, kj);  // kj <= i < T
      float s = -INFINITY;
      if (vis) s = dot_smem(sQ + r * HD, sK + lane * kp, HD) * scale;
      // Key k0 <= i is visible to lane 0, so the tile maximum is finite.
      const float alpha = online_softmax_rescale<float>(&st[rr], cuda::warp_max(s));
      const float p = vis ? online_softmax_weight<float>(st[rr], s) : 0.0f;
      st[rr].l += cuda::warp_sum(p);
#pragma unroll
      for (int t = 0; t < DPL; ++t) o[rr][t] *= alpha;
      const std::int64_t nvis = i - k0 + 1;
      const int jmax = nvis < kKeyTile ? int(nvis) : kKeyTile;
      for (int j = 0; j < jmax; ++j) {
        const float pj = __shfl_sync(cuda::kFullMask, p, j);
        const float* vr = sV + j * HD;
#pragma unroll
        for (int t = 0; t < DPL; ++t) {
          const int d = lane + 32 * t;
          if (d < HD) o[rr][t] += pj * vr[d];
        }
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const std::int64_t i = q0 + warp * kRowsPerWarp + rr;
    if (i >= T) continue;
    const float inv_l = 1.0f / st[rr].l;
    const std::size_t row = std::size_t((b * T + i) * NH + h) * HD;
#pragma unroll
    for (int t = 0; t < DPL; ++t) {
      const int d = lane + 32 * t;
      if (d < HD) S::store(out, row + d, o[rr][t] * inv_l);
    }
    if (lane == 0) lse[(b * NH + h) * T + i] = online_softmax_lse<float>(st[rr]);
  }
}

// delta (B,NH,T) = rowsum(dout * out): one warp per (b, i, h) row, rows in dout's order.
template <class S>
__global__ void __launch_bounds__(kThreads)
    flash_delta_kernel(float* delta, const void* dout, const void* out, std::int64_t rows,
                       std::int64_t T, std::int64_t NH, int HD) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
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
__global__ void __launch_bounds__(kThreads)
    flash_backward_dkdv_kernel(void* dk, void* dv, const void* dout, const void* q, const void* k,
                               const void* v, const float* lse, const float* delta, std::int64_t T,
                               std::int64_t NH, std::int64_t NKV, int HD, float scale) {
  constexpr int DPL = HDMAX / 32;
  extern __shared__ float smem[];
  const int qp = HD | 1;
  float* sK = smem;
  float* sV = sK + kBlockKeys * HD;
  float* sQ = sV + kBlockKeys * HD;
  float* sdO = sQ + kQueryTile * qp;
  float* sL = sdO + kQueryTile * qp;
  float* sD = sL + kQueryTile;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const std::int64_t b = blockIdx.x / NKV;
  const std::int64_t kh = blockIdx.x % NKV;
  const std::int64_t g = NH / NKV;
  // Early keys are seen by the most queries: schedule them first.
  const std::int64_t k0 = std::int64_t(blockIdx.y) * kBlockKeys;

  for (int idx = threadIdx.x; idx < kBlockKeys * HD; idx += kThreads) {
    const int j = idx / HD;
    const int d = idx - j * HD;
    const std::int64_t t = k0 + j;
    float kval = 0.0f, vval = 0.0f;
    if (t < T) {
      const std::size_t off = std::size_t((b * T + t) * NKV + kh) * HD + d;
      kval = S::load(k, off);
      vval = S::load(v, off);
    }
    sK[idx] = kval;
    sV[idx] = vval;
  }

  float dk_acc[kKeysPerWarp][DPL];
  float dv_acc[kKeysPerWarp][DPL];
#pragma unroll
  for (int kk = 0; kk < kKeysPerWarp; ++kk) {
#pragma unroll
    for (int t = 0; t < DPL; ++t) dk_acc[kk][t] = dv_acc[kk][t] = 0.0f;
  }

  const std::int64_t i_first = (k0 / kQueryTile) * kQueryTile;  // first tile with a row >= k0
  for (std::int64_t hh = 0; hh < g; ++hh) {
    const std::int64_t h = kh * g + hh;
    for (std::int64_t i0 = i_first; i0 < T; i0 += kQueryTile) {
      __syncthreads();  // sK, sV written (first pass) / previous sQ, sdO, sL, sD consumed
      for (int idx = threadIdx.x; idx < kQueryTile * HD; idx += kThreads) {
        const int r = idx / HD;
        const int d = idx - r * HD;
        const std::int64_t i = i0 + r;
        float qval = 0.0f, oval = 0.0f;
        if (i < T) {
          const std::size_t off = std::size_t((b * T + i) * NH + h) * HD + d;
          qval = S::load(q, off);
          oval = S::load(dout, off);
        }
        sQ[r * qp + d] = qval;
        sdO[r * qp + d] = oval;
      }
      if (threadIdx.x < kQueryTile) {
        const std::int64_t i = i0 + threadIdx.x;
        sL[threadIdx.x] = i < T ? lse[(b * NH + h) * T + i] : 0.0f;
        sD[threadIdx.x] = i < T ? delta[(b * NH + h) * T + i] : 0.0f;
      }
      __syncthreads();

      const std::int64_t i = i0 + lane;  // this lane's query row
      const std::int64_t rows_left = T - i0;
      const int ii_end = rows_left < kQueryTile ? int(rows_left) : kQueryTile;
#pragma unroll
      for (int kk = 0; kk < kKeysPerWarp; ++kk) {
        const int kr = warp * kKeysPerWarp + kk;
        const std::int64_t j = k0 + kr;
        if (j >= T || j >= i0 + kQueryTile) continue;  // warp-uniform: no row sees key j
        const bool vis = i < T && causal_visible(i, j);
        float p = 0.0f, ds = 0.0f;
        if (vis) {
          const float s = dot_smem(sQ + lane * qp, sK + kr * HD, HD) * scale;
          const float dp = dot_smem(sdO + lane * qp, sV + kr * HD, HD);
          p = softmax_prob_from_lse<float>(s, sL[lane]);
          ds = softmax_backward_elem<float>(p, dp, sD[lane]);
        }
        const int ii_begin = j > i0 ? int(j - i0) : 0;  // rows before key j do not see it
        for (int ii = ii_begin; ii < ii_end; ++ii) {
          const float pi = __shfl_sync(cuda::kFullMask, p, ii);
          const float dsi = __shfl_sync(cuda::kFullMask, ds, ii);
          const float* qr = sQ + ii * qp;
          const float* dr = sdO + ii * qp;
#pragma unroll
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

#pragma unroll
  for (int kk = 0; kk < kKeysPerWarp; ++kk) {
    const std::int64_t j = k0 + warp * kKeysPerWarp + kk;
    if (j >= T) continue;
    const std::size_t row = std::size_t((b * T + j) * NKV + kh) * HD;
#pragma unroll
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
__global__ void __launch_bounds__(kThreads)
    flash_backward_dq_kernel(void* dq, const void* dout, const void* q, const void* k,
                             const void* v, const float* lse, const float* delta, std::int64_t T,
                             std::int64_t NH, std::int64_t NKV, int HD, float scale) {
  constexpr int DPL = HDMAX / 32;
  extern __shared__ float smem[];
  const int kp = HD | 1;
  float* sQ = smem;
  float* sdO = sQ + kBlockRows * HD;
  float* sK = sdO + kBlockRows * HD;
  float* sV = sK + kKeyTile * kp;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const std::int64_t b = blockIdx.x / NH;
  const std::int64_t h = blockIdx.x % NH;
  const std::int64_t kh = attention_kv_head(h, NH, NKV);
  const std::int64_t q0 = std::int64_t(gridDim.y - 1 - blockIdx.y) * kBlockRows;
  const std::int64_t q_end = q0 + kBlockRows < T ? q0 + kBlockRows : T;

  for (int idx = threadIdx.x; idx < kBlockRows * HD; idx += kThreads) {
    const int r = idx / HD;
    const int d = idx - r * HD;
    const std::int64_t i = q0 + r;
    float qval = 0.0f, oval = 0.0f;
    if (i < T) {
      const std::size_t off = std::size_t((b * T + i) * NH + h) * HD + d;
      qval = S::load(q, off);
      oval = S::load(dout, off);
    }
    sQ[idx] = qval;
    sdO[idx] = oval;
  }

  float row_lse[kRowsPerWarp], row_delta[kRowsPerWarp];
  float dq_acc[kRowsPerWarp][DPL];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const std::int64_t i = q0 + warp * kRowsPerWarp + rr;
    row_lse[rr] = i < T ? lse[(b * NH + h) * T + i] : 0.0f;
    row_delta[rr] = i < T ? delta[(b * NH + h) * T + i] : 0.0f;
#pragma unroll
    for (int t = 0; t < DPL; ++t) dq_acc[rr][t] = 0.0f;
  }

  for (std::int64_t k0 = 0; k0 < q_end; k0 += kKeyTile) {
    __syncthreads();  // sQ, sdO written (first tile) / previous sK, sV consumed
    for (int idx = threadIdx.x; idx < kKeyTile * HD; idx += kThreads) {
      const int j = idx / HD;
      const int d = idx - j * HD;
      const std::int64_t t = k0 + j;
      float kval = 0.0f, vval = 0.0f;
      if (t < T) {
        const std::size_t off = std::size_t((b * T + t) * NKV + kh) * HD + d;
        kval = S::load(k, off);
        vval = S::load(v, off);
      }
      sK[j * kp + d] = kval;
      sV[j * kp + d] = vval;
    }
    __syncthreads();

#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const std::int64_t i = q0 + r;
      if (i >= T || i < k0) continue;  // warp-uniform
      const std::int64_t kj = k0 + lane;
      float ds = 0.0f;
      if (causal_visible(i, kj)) {
        const float s = dot_smem(sQ + r * HD, sK + lane * kp, HD) * scale;
        const float dp = dot_smem(sdO + r * HD, sV + lane * kp, HD);
        const float p = softmax_prob_from_lse<float>(s, row_lse[rr]);
        ds = softmax_backward_elem<float>(p, dp, row_delta[rr]);
      }
      const std::int64_t nvis = i - k0 + 1;
      const int jmax = nvis < kKeyTile ? int(nvis) : kKeyTile;
      for (int j = 0; j < jmax; ++j) {
        const float dsj = __shfl_sync(cuda::kFullMask, ds, j);
        const float* kr = sK + j * kp;
#pragma unroll
        for (int t = 0; t < DPL; ++t) {
          const int d = lane + 32 * t;
          if (d < HD) dq_acc[rr][t] += dsj * kr[d];
        }
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const std::int64_t i = q0 + warp * kRowsPerWarp + rr;
    if (i >= T) continue;
    const std::size_t row = std::size_t((b * T + i) * NH + h) * HD;
#pragma unroll
    for (int t = 0; t < DPL; ++t) {
      const int d = lane + 32 * t;
      if (d < HD) S::store(dq, row + d, dq_acc[rr][t] * scale);
    }
  }
}

// ---------------------------------------------------------------- launch helpers

std::size_t forward_smem(int HD) {
  return sizeof(float) * (std::size_t(kBlockRows) * HD + std::size_t(kKeyTile) * (HD | 1) +
                          std::size_t(kKeyTile) * HD);
}
std::size_t dkdv_smem(int HD) {
  return sizeof(float) * (2 * std::size_t(kBlockKeys) * HD +
                          2 * std::size_t(kQueryTile) * (HD | 1) + 2 * kQueryTile);
}
std::size_t dq_smem(int HD) {
  return sizeof(float) * (2 * std::size_t(kBlockRows) * HD + 2 * std::size_t(kKeyTile) * (HD | 1));
}

// Calls f.template operator()<HDMAX>() with the smallest supported HDMAX >= HD.
template <class F>
void dispatch_head_dim(std::int64_t HD, const char* op, F&& f) {
  if (HD <= 32) {
    f(std::integral_constant<int, 32>{});
  } else if (HD <= 64) {
    f(std::integral_constant<int, 64>{});
  } else if (HD <= 128) {
    f(std::integral_constant<int, 128>{});
  } else if (HD <= kMaxHeadDim) {
    f(std::integral_constant<int, 256>{});
  } else {
    throw InputError(std::string(op) + ": flash attention supports head dim HD up to " +
                     std::to_string(kMaxHeadDim) + ", got " + std::to_string(HD) +
                     " (use --attention eager)");
  }
}

dim3 query_grid(std::int64_t B, std::int64_t H, std::int64_t T, const char* op) {
  const std::int64_t bh = B * H;
  const std::int64_t blocks = (T + kBlockRows - 1) / kBlockRows;
  cuda::require_fits(bh, cuda::kMaxGridX, op, "B*heads");
  cuda::require_fits(blocks, cuda::kMaxGridY, op, "T/16");
  return dim3(unsigned(bh), unsigned(blocks));
}

}  // namespace

// ---------------------------------------------------------------- launchers

void attention_flash_forward_cuda(void* out, float* lse, const void* q, const void* k,
                                  const void* v, std::int64_t B, std::int64_t T, std::int64_t NH,
                                  std::int64_t NKV, std::int64_t HD, DType dt,
                                  cudaStream_t stream) {
  const char* op = "attention_flash_forward_cuda";
  cuda::check_attention_dims(op, B, T, NH, NKV, HD);
  if (lse == nullptr) throw InputError(std::string(op) + ": lse output is required");
  const dim3 grid = query_grid(B, NH, T, op);
  const int hd = int(HD);
  const float scale = attention_scale<float>(HD);
  const std::size_t smem = forward_smem(hd);
  TM_DISPATCH_STORAGE(dt, op, dispatch_head_dim(HD, op, [&](auto hdmax) {
                        constexpr int kHD = decltype(hdmax)::value;
                        auto kernel = flash_forward_kernel<S, kHD>;
                        cuda::allow_dynamic_smem(kernel, smem);
                        kernel<<<grid, kThreads, smem, stream>>>(out, lse, q, k, v, T, NH, NKV, hd,
                                                                 scale);
                        TM_CUDA_CHECK_LAUNCH();
                      }));
}

void attention_flash_backward_cuda(void* dq, void* dk, void* dv, float* delta, const void* dout,
                                   const void* q, const void* k, const void* v, const void* out,
                                   const float* lse, std::int64_t B, std::int64_t T,
                                   std::int64_t NH, std::int64_t NKV, std::int64_t HD, DType dt,
                                   cudaStream_t stream) {
  const char* op = "attention_flash_backward_cuda";
  cuda::check_attention_dims(op, B, T, NH, NKV, HD);
  if (delta == nullptr) throw InputError(std::string(op) + ": delta scratch is required");
  if (lse == nullptr) throw InputError(std::string(op) + ": lse from the forward is required");
  const int hd = int(HD);
  const float scale = attention_scale<float>(HD);
  const std::int64_t rows = B * T * NH;
  const std::int64_t delta_blocks = (rows + kWarps - 1) / kWarps;
  cuda::require_fits(delta_blocks, cuda::kMaxGridX, op, "B*T*NH/4");
  const dim3 dq_grid = query_grid(B, NH, T, op);
  const dim3 dkdv_grid = query_grid(B, NKV, T, op);  // key blocks of 16, like query blocks
  const std::size_t smem_dkdv = dkdv_smem(hd);
  const std::size_t smem_dq = dq_smem(hd);
  TM_DISPATCH_STORAGE(dt, op,
                      flash_delta_kernel<S><<<unsigned(delta_blocks), kThreads, 0, stream>>>(
                          delta, dout, out, rows, T, NH, hd);
                      TM_CUDA_CHECK_LAUNCH(); dispatch_head_dim(HD, op, [&](auto hdmax) {
                        constexpr int kHD = decltype(hdmax)::value;
                        auto dkdv = flash_backward_dkdv_kernel<S, kHD>;
                        cuda::allow_dynamic_smem(dkdv, smem_dkdv);
                        dkdv<<<dkdv_grid, kThreads, smem_dkdv, stream>>>(
                            dk, dv, dout, q, k, v, lse, delta, T, NH, NKV, hd, scale);
                        TM_CUDA_CHECK_LAUNCH();
                        auto dqk = flash_backward_dq_kernel<S, kHD>;
                        cuda::allow_dynamic_smem(dqk, smem_dq);
                        dqk<<<dq_grid, kThreads, smem_dq, stream>>>(dq, dout, q, k, v, lse, delta,
                                                                    T, NH, NKV, hd, scale);
                        TM_CUDA_CHECK_LAUNCH();
                      }));
}

}  // namespace trainmem
