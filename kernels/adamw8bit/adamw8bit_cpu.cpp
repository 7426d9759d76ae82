// bitsandbytes' AdamW8bit, CPU reference (math in adamw8bit_math.hpp): blocks of 256 (8-bit) or
// elements (fp32 states) in parallel, each computed by one thread in a fixed order.
#include "adamw8bit/adamw8bit.hpp"
#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "quant4/dynamic_map.hpp"
#include "quant4/quant4.hpp"

namespace trainmem {

void bnb_adamw8bit_tables_host(float* qmap_signed, float* qmap_unsigned, std::uint8_t* lut_signed,
                               std::uint8_t* lut_unsigned) {
  for (int i = 0; i < 256; ++i) {
    qmap_signed[i] = kDynamicMapSigned[i];
    qmap_unsigned[i] = kDynamicMapUnsigned[i];
  }
  blockwise8_build_lut(kDynamicMapSigned, lut_signed);
  blockwise8_build_lut(kDynamicMapUnsigned, lut_unsigned);
}

void bnb_adamw8bit_update_cpu(void* param, const void* grad, std::uint8_t* s1, std::uint8_t* s2,
                              float* absmax1, float* absmax2, const float* qmap1,
                              const float* qmap2, const std::uint8_t* lut1,
                              const std::uint8_t* lut2, std::int64_t n, const BnbAdamWParams& hp,
                              int step, DType dt) {
  check_bnb_adamw_args("bnb_adamw8bit_update_cpu", n, step);
  cpu_threads_setup();
  const BnbAdamWConsts c = bnb_adamw_consts(hp, step);
  const std::int64_t nb = quant_blocks(n, kBlockwise8Size);
  dispatch_storage(dt, "bnb_adamw8bit_update_cpu", [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (std::int64_t b = 0; b < nb; ++b)
      bnb_adamw8bit_block<S>(param, grad, s1, s2, absmax1, absmax2, qmap1, qmap2, lut1, lut2, n, b,
                             c);
  });
}

void bnb_adamw32_update_cpu(void* param, const void* grad, float* m, float* v, std::int64_t n,
                            const BnbAdamWParams& hp, int step, DType dt) {
  check_bnb_adamw_args("bnb_adamw32_update_cpu", n, step);
  cpu_threads_setup();
  const BnbAdamWConsts c = bnb_adamw_consts(hp, step);
  dispatch_storage(dt, "bnb_adamw32_update_cpu", [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (std::int64_t i = 0; i < n; ++i) {
      bnb_adam_moments(S::load(grad, std::size_t(i)), &m[i], &v[i], c);
      S::store(param, std::size_t(i),
               bnb_adamw32_param(S::load(param, std::size_t(i)), m[i], v[i], c));
    }
  });
}

}  // namespace trainmem
