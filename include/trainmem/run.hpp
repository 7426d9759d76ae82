// Running training steps for the measuring subcommands (profile, compare, sweep, maxbatch):
// one code path that picks the backend, runs the steps, reads the ledger and the device
// probes, attaches the analytic profiles and reconciles them. Also the small pieces those
// commands share: SIZE parsing for budgets, the largest-value search behind `maxbatch`, and
// a progress bar for long grids.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace trainmem {

// Parses a byte size: a number with an optional unit, case-insensitive: B, KiB, MiB, GiB, TiB
// (powers of 1024), KB, MB, GB, TB (powers of 1000); K/M/G/T alone are binary. Fractions are
// allowed ("1.5GiB") and rounded down to a byte. Throws InputError naming `flag` and the
// accepted forms for anything else (negative, empty, unknown unit, > 2^64).
std::uint64_t parse_size(const std::string& text, const std::string& flag);

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

// A one-line progress bar on stderr, drawn only when stderr is a terminal ("sweep 3/8
// [#####.....] llama-7b b4 s256"). Cleared when done or destroyed.
class ProgressBar {
 public:
  ProgressBar(std::string label, std::size_t total);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  void step(const std::string& what);  // the item about to run
  void done();
  bool active() const { return active_; }

 private:
  std::string label_;
  std::size_t total_, current_ = 0;
  bool active_;
};

}  // namespace trainmem
