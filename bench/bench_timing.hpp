// The benchmarks' one timing helper: the median wall time of a piece of work.
#pragma once
#include <algorithm>
#include <chrono>
#include <vector>

namespace trainmem::bench {

// Median wall time in ms of `fn` over `reps` runs (after one warm-up).
template <class Fn>
double median_ms(Fn&& fn, int reps) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace trainmem::bench
