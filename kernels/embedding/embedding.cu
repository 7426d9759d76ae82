// Token embedding, forward and backward, on the GPU.
// Forward: out[n, c] = wte[tokens[n], c]. Backward: dwte[v, c] += sum over rows n with
// tokens[n] == v of dout[n, c], in fp32 starting from dwte, in position order, rounded once
// (the same sequence as embedding_cpu: bit-identical results).
//
// The backward's scratch. The grouped kernels (embedding_kernels.cuh) need 8 bytes per row
// for their sort keys. They do not allocate them: the caller lends a buffer it owns, and the
// cuda backend lends the ledger's `cublas_workspace` (32 MiB, booked as workspace on every
// backend, docs/native-plan.md setup step 5). The keys live from the first sort launch to the
// sums, all on the backend's stream, and cuBLAS uses its workspace only during its own calls
// on that stream and keeps nothing in it between them: the two never overlap. So the ledger,
// the meta backend and the analytic `native` profile stay as they were, byte for byte. Without a
// buffer large enough (no workspace set, or more than 4 Mi rows for 32 MiB) the backward falls back
// to the scan kernel, which needs no scratch but reads O(n^2) ids.
#include "common/cuda_common.cuh"
#include "embedding/embedding.hpp"
#include "embedding/embedding_kernels.cuh"
#include "trainmem/base/checked.hpp"

namespace trainmem {
namespace {

void check_dims(const char* op, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t V) {
  cuda::require_fits(b, cuda::kMaxGridX, op, "b");
  cuda::require_fits(s, cuda::kMaxGridX, op, "s");
  cuda::require_fits(h, std::numeric_limits<std::int64_t>::max(), op, "h");
  cuda::require_fits(V, std::numeric_limits<std::int32_t>::max(), op, "V");
}

}  // namespace

// ---------------------------------------------------------------- launchers

void embedding_forward_cuda(void* out, const std::int32_t* tokens, const void* wte, std::int64_t b,
                            std::int64_t s, std::int64_t h, std::int64_t V, DType dt,
                            cudaStream_t stream) {
  check_dims("embedding_forward_cuda", b, s, h, V);
  const std::int64_t n = std::int64_t(checked_mul(b, s, "embedding_forward_cuda: b*s"));
  const std::int64_t total = std::int64_t(checked_mul(n, h, "embedding_forward_cuda: b*s*h"));
  if (total == 0) return;
  constexpr int kThreads = cuda::kElementwiseThreads;
  dispatch_storage(dt, "embedding_forward_cuda", [&](auto tag) {
    cuda::embedding_forward_kernel<decltype(tag)>
        <<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(out, tokens, wte, n, h, V);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void embedding_backward_cuda(void* dwte, const void* dout, const std::int32_t* tokens,
                             std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t V,
                             DType dt, cudaStream_t stream, void* scratch,
                             std::uint64_t scratch_bytes) {
  const char* op = "embedding_backward_cuda";
  check_dims(op, b, s, h, V);
  const std::int64_t n = std::int64_t(checked_mul(b, s, "embedding_backward_cuda: b*s"));
  if (n == 0 || h == 0) return;
  if (!cuda::embedding_backward_can_group(scratch, scratch_bytes, n)) {
    const cuda::LaunchShape L = cuda::embedding_backward_scan_launch(n, h, op);
    dispatch_storage(dt, op, [&](auto tag) {
      cuda::embedding_backward_scan_kernel<decltype(tag)>
          <<<cuda::grid_of(L), cuda::block_of(L), 0, stream>>>(dwte, dout, tokens, n, h, V);
      TM_CUDA_CHECK_LAUNCH();
    });
    return;
  }
  // Grouped: sort the keys in the scratch, then sum each group.
  auto* keys = static_cast<cuda::EmbSortKey*>(scratch);
  for (const cuda::EmbeddingSortLaunch& launch : cuda::embedding_sort_launches(n, op)) {
    if (launch.tile) {
      cuda::embedding_sort_tile_kernel<<<cuda::grid_of(launch.shape), cuda::block_of(launch.shape),
                                         0, stream>>>(keys, tokens, n, launch.stage);
    } else {
      cuda::embedding_sort_step_kernel<<<cuda::grid_of(launch.shape), cuda::block_of(launch.shape),
                                         0, stream>>>(keys, n, launch.pairs, launch.half,
                                                      launch.flip);
    }
    TM_CUDA_CHECK_LAUNCH();
  }
  const cuda::LaunchShape L = cuda::embedding_backward_launch(n, h, op);
  dispatch_storage(dt, op, [&](auto tag) {
    cuda::embedding_backward_grouped_kernel<decltype(tag)>
        <<<cuda::grid_of(L), cuda::block_of(L), 0, stream>>>(dwte, dout, keys, n, h, V);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace trainmem
