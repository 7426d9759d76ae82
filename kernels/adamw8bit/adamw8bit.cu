// bitsandbytes' AdamW8bit on the GPU (math in adamw8bit_math.hpp, kernels in
// adamw8bit_kernels.cuh).
#include "adamw8bit/adamw8bit.hpp"
#include "adamw8bit/adamw8bit_kernels.cuh"
#include "common/cuda_common.cuh"
#include "quant4/quant4.hpp"

namespace trainmem {
namespace {

constexpr int kThreads = cuda::kElementwiseThreads;

}  // namespace

void bnb_adamw8bit_update_cuda(void* param, const void* grad, std::uint8_t* s1, std::uint8_t* s2,
                               float* absmax1, float* absmax2, const float* qmap1,
                               const float* qmap2, const std::uint8_t* lut1,
                               const std::uint8_t* lut2, std::int64_t n, const BnbAdamWParams& hp,
                               int step, DType dt, cudaStream_t stream) {
  check_bnb_adamw_args("bnb_adamw8bit_update_cuda", n, step);
  if (n == 0) return;
  const BnbAdamWConsts c = bnb_adamw_consts(hp, step);
  const std::int64_t nb = quant_blocks(n, kBlockwise8Size);
  dispatch_storage(dt, "bnb_adamw8bit_update_cuda", [&](auto tag) {
    cuda::bnb_adamw8bit_kernel<decltype(tag)>
        <<<cuda::grid_for(nb, kThreads), kThreads, 0, stream>>>(
            param, grad, s1, s2, absmax1, absmax2, qmap1, qmap2, lut1, lut2, n, nb, c);
    TM_CUDA_CHECK_LAUNCH();
  });
}

void bnb_adamw32_update_cuda(void* param, const void* grad, float* m, float* v, std::int64_t n,
                             const BnbAdamWParams& hp, int step, DType dt, cudaStream_t stream) {
  check_bnb_adamw_args("bnb_adamw32_update_cuda", n, step);
  if (n == 0) return;
  const BnbAdamWConsts c = bnb_adamw_consts(hp, step);
  dispatch_storage(dt, "bnb_adamw32_update_cuda", [&](auto tag) {
    cuda::bnb_adamw32_kernel<decltype(tag)>
        <<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(param, grad, m, v, n, c);
    TM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace trainmem
