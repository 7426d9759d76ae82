// Causal attention, flash-style: tiled online softmax, never materialising (s, s).
// Plain fp32 SIMT arithmetic (no tensor cores): correct and memory-lean first, fast second.
//
// Layouts: q, out, dout, dq (b, s, a, d) D; k, v, dk, dv (b, s, kv, d) D; lse, delta (b, a, s) f32.
// Query head qh reads kv head kh = qh / g, g = a / kv. d <= 256 (template DMAX in 32..256);
// a lane owns the head-dim elements e = lane + 32*t, t < DMAX/32.
//
// forward  grid (b*a, ceil(s/16)), 4 warps. A block owns 16 query rows (4 per warp) and walks
//          key tiles of 32 (lane j scores key k0+j), keeping (m, l, o) per row in registers.
//          Under a sliding window W it starts at the tile holding the block's first visible key
//          (window_first_key of its first row): tiles entirely left of the window are skipped.
// backward delta kernel: delta = rowsum(dout * out), one warp per row;
//          dk/dv kernel, grid (b*kv, ceil(s/16)): a block owns 16 keys (4 per warp), loops
//          over the g query heads of its group and over query tiles of 32 (lane i = a query
//          row), recomputes p = exp(s - lse) and ds = p (dp - delta), sums dv += p dout and
//          dk += ds q in registers;
//          dq kernel, grid (b*a, ceil(s/16)): like the forward, dq += ds k over key tiles.
//          Window: dk/dv stops at the last query tile holding a query that sees one of its keys
//          (key j is seen by queries j..j+W-1); dq skips key tiles as the forward does.
// Every output element has exactly one writer: no atomics, deterministic, dq/dk/dv with =.
//
// Shared memory is dynamic (floats). Tiles read by lane-distinct rows (lane j reads row j)
// use an odd pitch (d | 1) so that the 32 lanes hit 32 different banks; tiles read by all
// lanes at the same address (broadcast) or at consecutive e use pitch d.
#include "attention/attention.hpp"
#include "attention/attention_flash_kernels.cuh"
#include "attention/attention_math.hpp"
#include "common/cuda_common.cuh"

namespace trainmem {
namespace {

using cuda::kFlashMaxHeadDim;

// Calls f(std::integral_constant<int, DMAX>) with the smallest supported DMAX >= d.
template <class F>
void dispatch_head_dim(std::int64_t d, const char* op, F&& f) {
  if (d <= 32) {
    f(std::integral_constant<int, 32>{});
  } else if (d <= 64) {
    f(std::integral_constant<int, 64>{});
  } else if (d <= 128) {
    f(std::integral_constant<int, 128>{});
  } else if (d <= kFlashMaxHeadDim) {
    f(std::integral_constant<int, 256>{});
  } else {
    throw InputError(std::string(op) + ": flash attention supports head dim d up to " +
                     std::to_string(kFlashMaxHeadDim) + ", got " + std::to_string(d) +
                     " (use --attention eager)");
  }
}

}  // namespace

// ---------------------------------------------------------------- launchers

void attention_flash_forward_cuda(void* out, float* lse, const void* q, const void* k,
                                  const void* v, std::int64_t b, std::int64_t s, std::int64_t a,
                                  std::int64_t kv, std::int64_t d, std::int64_t window, DType dt,
                                  cudaStream_t stream) {
  const char* op = "attention_flash_forward_cuda";
  cuda::check_attention_dims(op, b, s, a, kv, d, window);
  if (lse == nullptr) throw InputError(std::string(op) + ": lse output is required");
  const int d_int = int(d);
  const float scale = attention_scale<float>(d);
  const cuda::LaunchShape fwd = cuda::flash_forward_launch(b, a, s, d_int, op);
  dispatch_storage(dt, op, [&](auto tag) {
    dispatch_head_dim(d, op, [&](auto dmax) {
      constexpr int kDMax = decltype(dmax)::value;
      auto kernel = cuda::flash_forward_kernel<decltype(tag), kDMax>;
      cuda::allow_dynamic_smem(kernel, fwd);
      kernel<<<cuda::grid_of(fwd), cuda::block_of(fwd), fwd.smem_bytes, stream>>>(
          out, lse, q, k, v, s, a, kv, d_int, scale, window);
      TM_CUDA_CHECK_LAUNCH();
    });
  });
}

void attention_flash_backward_cuda(void* dq, void* dk, void* dv, float* delta, const void* dout,
                                   const void* q, const void* k, const void* v, const void* out,
                                   const float* lse, std::int64_t b, std::int64_t s, std::int64_t a,
                                   std::int64_t kv, std::int64_t d, std::int64_t window, DType dt,
                                   cudaStream_t stream) {
  const char* op = "attention_flash_backward_cuda";
  cuda::check_attention_dims(op, b, s, a, kv, d, window);
  if (delta == nullptr) throw InputError(std::string(op) + ": delta scratch is required");
  if (lse == nullptr) throw InputError(std::string(op) + ": lse from the forward is required");
  const int d_int = int(d);
  const float scale = attention_scale<float>(d);
  const std::int64_t rows = b * s * a;
  const cuda::LaunchShape dl = cuda::flash_delta_launch(rows, op);
  const cuda::LaunchShape kv_shape = cuda::flash_dkdv_launch(b, kv, s, d_int, op);
  const cuda::LaunchShape dqs = cuda::flash_dq_launch(b, a, s, d_int, op);
  dispatch_storage(dt, op, [&](auto tag) {
    using S = decltype(tag);
    cuda::flash_delta_kernel<S>
        <<<cuda::grid_of(dl), cuda::block_of(dl), 0, stream>>>(delta, dout, out, rows, s, a, d_int);
    TM_CUDA_CHECK_LAUNCH();
    dispatch_head_dim(d, op, [&](auto dmax) {
      constexpr int kDMax = decltype(dmax)::value;
      auto dkdv = cuda::flash_backward_dkdv_kernel<S, kDMax>;
      cuda::allow_dynamic_smem(dkdv, kv_shape);
      dkdv<<<cuda::grid_of(kv_shape), cuda::block_of(kv_shape), kv_shape.smem_bytes, stream>>>(
          dk, dv, dout, q, k, v, lse, delta, s, a, kv, d_int, scale, window);
      TM_CUDA_CHECK_LAUNCH();
      auto dqk = cuda::flash_backward_dq_kernel<S, kDMax>;
      cuda::allow_dynamic_smem(dqk, dqs);
      dqk<<<cuda::grid_of(dqs), cuda::block_of(dqs), dqs.smem_bytes, stream>>>(
          dq, dout, q, k, v, lse, delta, s, a, kv, d_int, scale, window);
      TM_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace trainmem
