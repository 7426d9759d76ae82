// LoRA dropout, CPU reference (math in dropout_math.hpp): elementwise, in parallel; every
// element is a function of its own index, so the bits do not depend on the team size.
#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "dropout/dropout.hpp"
#include "dropout/dropout_math.hpp"

namespace trainmem {
namespace {

template <class S>
void dropout_apply_impl(void* out, const void* x, const std::uint8_t* mask, std::int64_t n,
                        float scale, bool accumulate) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (std::int64_t e = 0; e < n; ++e)
    S::store(out, e,
             dropout_apply_elem(accumulate ? S::load(out, e) : 0.0f, S::load(x, e), mask[e], scale,
                                accumulate));
}

}  // namespace

void dropout_mask_cpu(std::uint8_t* mask, std::int64_t n, float p, std::uint64_t seed,
                      std::uint64_t stream) {
  cpu_threads_setup();
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (std::int64_t e = 0; e < n; ++e) mask[e] = dropout_keep(seed, stream, std::uint64_t(e), p);
}

void dropout_apply_cpu(void* out, const void* x, const std::uint8_t* mask, std::int64_t n,
                       float scale, bool accumulate, DType dt) {
  cpu_threads_setup();
  dispatch_storage(dt, "dropout_apply", [&](auto tag) {
    dropout_apply_impl<decltype(tag)>(out, x, mask, n, scale, accumulate);
  });
}

}  // namespace trainmem
