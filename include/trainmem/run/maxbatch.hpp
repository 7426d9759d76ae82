// The largest-value search behind `trainmem maxbatch`.
#pragma once
#include <cstdint>
#include <functional>

namespace trainmem::cli {

// The outcome of probing one value: whether it fits and the peak it would need.
struct Probe {
  bool fits = false;
  std::uint64_t peak = 0;  // bytes needed (0 when unknown, e.g. the size overflowed)
};

struct SearchResult {
  std::int64_t best = 0;  // largest value that fits (0: not even `lowest`)
  Probe at_best;          // its probe (when best > 0)
  Probe at_next;          // the probe of best + step (the first that does not fit)
  int probes = 0;         // how many values were tried
};

// Largest v = lowest + k·step (k >= 0, v <= highest) with probe(v).fits, assuming fits is
// monotone (true up to some value, false after). Doubles k until a value fails, then
// bisects. `probe` may throw; exceptions propagate.
SearchResult find_largest_fitting(std::int64_t lowest, std::int64_t highest, std::int64_t step,
                                  const std::function<Probe(std::int64_t)>& probe);

}  // namespace trainmem::cli
