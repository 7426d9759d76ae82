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
#include "attention/attention.hpp"
#include "attention/attention_flash_kernels.cuh"
#include "attention/attention_math.hpp"
#include "common/cuda_common.cuh"

namespace trainmem {
namespace {

using cuda::kFlashMaxHeadDim;

// Calls f(std::integral_constant<int, HDMAX>) with the smallest supported HDMAX >= HD.
template <class F>
void dispatch_head_dim(std::int64_t HD, const char* op, F&& f) {
  if (HD <= 32) {
    f(std::integral_constant<int, 32>{});
  } else if (HD <= 64) {
    f(std::integral_constant<int, 64>{});
  } else if (HD <= 128) {
    f(std::integral_constant<int, 128>{});
  } else if (HD <= kFlashMaxHeadDim) {
    f(std::integral_constant<int, 256>{});
  } else {
    throw InputError(std::string(op) + ": flash attention supports head dim HD up to " +
                     std::to_string(kFlashMaxHeadDim) + ", got " + std::to_string(HD) +
                     " (use --attention eager)");
  }
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
  const int hd = int(HD);
  const float scale = attention_scale<float>(HD);
  const cuda::LaunchShape fwd = cuda::flash_forward_launch(B, NH, T, hd, op);
  dispatch_storage(dt, op, [&](auto s) {
    dispatch_head_dim(HD, op, [&](auto hdmax) {
      constexpr int kHD = decltype(hdmax)::value;
      auto kernel = cuda::flash_forward_kernel<decltype(s), kHD>;
      cuda::allow_dynamic_smem(kernel, fwd);
      kernel<<<cuda::grid_of(fwd), cuda::block_of(fwd), fwd.smem_bytes, stream>>>(
          out, lse, q, k, v, T, NH, NKV, hd, scale);
      TM_CUDA_CHECK_LAUNCH();
    });
  });
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
  const cuda::LaunchShape dl = cuda::flash_delta_launch(rows, op);
  const cuda::LaunchShape kv = cuda::flash_dkdv_launch(B, NKV, T, hd, op);
  const cuda::LaunchShape dqs = cuda::flash_dq_launch(B, NH, T, hd, op);
  dispatch_storage(dt, op, [&](auto s) {
    using S = decltype(s);
    cuda::flash_delta_kernel<S>
        <<<cuda::grid_of(dl), cuda::block_of(dl), 0, stream>>>(delta, dout, out, rows, T, NH, hd);
    TM_CUDA_CHECK_LAUNCH();
    dispatch_head_dim(HD, op, [&](auto hdmax) {
      constexpr int kHD = decltype(hdmax)::value;
      auto dkdv = cuda::flash_backward_dkdv_kernel<S, kHD>;
      cuda::allow_dynamic_smem(dkdv, kv);
      dkdv<<<cuda::grid_of(kv), cuda::block_of(kv), kv.smem_bytes, stream>>>(
          dk, dv, dout, q, k, v, lse, delta, T, NH, NKV, hd, scale);
      TM_CUDA_CHECK_LAUNCH();
      auto dqk = cuda::flash_backward_dq_kernel<S, kHD>;
      cuda::allow_dynamic_smem(dqk, dqs);
      dqk<<<cuda::grid_of(dqs), cuda::block_of(dqs), dqs.smem_bytes, stream>>>(
          dq, dout, q, k, v, lse, delta, T, NH, NKV, hd, scale);
      TM_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace trainmem
