// The largest-value search behind `trainmem maxbatch` (see src/cli/search.hpp).
#include "search.hpp"

#include "trainmem/base/error.hpp"

namespace trainmem::cli {

SearchResult find_largest_fitting(std::int64_t lowest, std::int64_t highest, std::int64_t step,
                                  const std::function<Probe(std::int64_t)>& probe) {
  if (step < 1 || lowest < 1 || highest < lowest)
    throw Error("find_largest_fitting: need 1 <= lowest <= highest and step >= 1");
  SearchResult r;
  auto try_k = [&](std::int64_t k) {
    ++r.probes;
    return probe(lowest + k * step);
  };
  const std::int64_t k_max = (highest - lowest) / step;
  Probe p0 = try_k(0);
  if (!p0.fits) {
    r.best = 0;
    r.at_next = p0;
    return r;
  }
  // Grow k geometrically until a value fails (or the range ends), then bisect between the
  // last good and the first bad k.
  std::int64_t k_good = 0, k_bad = -1;
  Probe good = p0, bad{};
  for (std::int64_t k = 1;; k = k > k_max / 2 ? k_max : 2 * k) {
    if (k > k_max) k = k_max;
    if (k <= k_good) break;  // the whole range fits
    const Probe p = try_k(k);
    if (!p.fits) {
      k_bad = k, bad = p;
      break;
    }
    k_good = k, good = p;
  }
  if (k_bad >= 0) {
    while (k_bad - k_good > 1) {
      const std::int64_t mid = k_good + (k_bad - k_good) / 2;
      const Probe p = try_k(mid);
      if (p.fits) {
        k_good = mid, good = p;
      } else {
        k_bad = mid, bad = p;
      }
    }
  }
  r.best = lowest + k_good * step;
  r.at_best = good;
  // One more: the first failure, or (when the top of the range fits) a probe past it.
  r.at_next = k_bad >= 0 ? bad : try_k(k_good + 1);
  return r;
}

}  // namespace trainmem::cli
