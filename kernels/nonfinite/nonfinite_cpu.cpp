// Non-finite check, CPU reference: one parallel pass, OR-reduced.
#include "common/common_math.hpp"
#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "nonfinite/nonfinite.hpp"

namespace trainmem {
namespace {

template <class S>
bool any_nonfinite(const void* x, std::int64_t n) {
  bool found = false;
#pragma omp parallel for reduction(|| : found) if (n >= kParallelMinElements)
  for (std::int64_t i = 0; i < n; ++i) found = found || !tm_isfinite(S::load(x, i));
  return found;
}

}  // namespace

bool has_nonfinite_cpu(const void* x, std::int64_t n, DType dt) {
  cpu_threads_setup();
  return dispatch_storage(dt, "has_nonfinite",
                          [&](auto tag) { return any_nonfinite<decltype(tag)>(x, n); });
}

}  // namespace trainmem
