// Folding CUPTI memory records into per-category books (see cupti_fold.hpp). Host code only.
#include "cupti_fold.hpp"

#include <algorithm>

namespace trainmem::probes {

void CuptiFold::clear() {
  events_.clear();
  external_.clear();
  pool_records_ = other_records_ = dropped_ = 0;
}

CuptiFigures CuptiFold::fold(std::uint64_t step_start_ns,
                             const std::vector<std::pair<Phase, std::uint64_t>>& phase_ends) const {
  CuptiFigures f;
  f.pool_records = pool_records_;
  f.other_records = other_records_;
  f.dropped = dropped_;
  f.memory_records = events_.size();

  std::vector<CuptiMemEvent> ev = events_;
  std::stable_sort(ev.begin(), ev.end(), [](const CuptiMemEvent& a, const CuptiMemEvent& b) {
    return a.timestamp != b.timestamp ? a.timestamp < b.timestamp : a.correlation < b.correlation;
  });

  constexpr int kUnattributed = kNumCategories;
  struct LiveAlloc {
    std::uint64_t bytes;
    int category;  // 0..kNumCategories-1, or kUnattributed
  };
  std::unordered_map<std::uint64_t, LiveAlloc> live_by_address;
  std::uint64_t attributed_total = 0;
  bool started = false;
  const std::size_t n_windows = phase_ends.size();
  std::vector<std::uint64_t> window_peak(n_windows, 0);
  std::size_t window = 0;  // the window the walk is in
  bool window_open = false;

  auto start_step = [&] {
    started = true;
    f.peak = f.live;
    f.peak_total = attributed_total;
    f.peak_breakdown = f.live;
    f.unattributed_peak = f.unattributed_live;
  };
  auto open_window = [&] {
    if (window < n_windows) {
      window_peak[window] = attributed_total;
      window_open = true;
    }
  };

  for (const CuptiMemEvent& e : ev) {
    if (!started && e.timestamp >= step_start_ns) {
      start_step();
      open_window();
    }
    if (started) {
      while (window < n_windows && e.timestamp > phase_ends[window].second) {
        ++window;
        window_open = false;
        open_window();
      }
    }
    if (e.allocation) {
      ++f.allocations;
      int cat = kUnattributed;
      auto x = external_.find(e.correlation);
      if (x != external_.end()) {
        const int c = external_id_category(x->second);
        if (c >= 0) cat = c;
      }
      if (cat == kUnattributed) ++f.unknown_correlation;
      auto [it, inserted] = live_by_address.emplace(e.address, LiveAlloc{e.bytes, cat});
      if (!inserted) {  // the release of the previous occupant was lost
        ++f.reused_live_address;
        const LiveAlloc old = it->second;
        if (old.category == kUnattributed) {
          f.unattributed_live -= old.bytes;
        } else {
          f.live[old.category] -= old.bytes;
          attributed_total -= old.bytes;
        }
        it->second = LiveAlloc{e.bytes, cat};
      }
      if (cat == kUnattributed) {
        f.unattributed_live += e.bytes;
      } else {
        f.live[cat] += e.bytes;
        attributed_total += e.bytes;
      }
    } else {
      ++f.releases;
      auto it = live_by_address.find(e.address);
      if (it == live_by_address.end()) {
        ++f.unmatched_releases;
        continue;
      }
      const LiveAlloc a = it->second;
      live_by_address.erase(it);
      if (a.category == kUnattributed) {
        f.unattributed_live -= a.bytes;
      } else {
        f.live[a.category] -= a.bytes;
        attributed_total -= a.bytes;
      }
    }
    if (!started) continue;
    for (int c = 0; c < kNumCategories; ++c) f.peak[c] = std::max(f.peak[c], f.live[c]);
    f.unattributed_peak = std::max(f.unattributed_peak, f.unattributed_live);
    if (attributed_total > f.peak_total) {
      f.peak_total = attributed_total;
      f.peak_breakdown = f.live;
    }
    if (window_open && window < n_windows)
      window_peak[window] = std::max(window_peak[window], attributed_total);
  }
  if (!started) {
    start_step();
    open_window();
  }
  // Windows the records never reached hold what was live at their start (the end state).
  while (window < n_windows) {
    if (!window_open) window_peak[window] = attributed_total;
    ++window;
    window_open = false;
  }
  for (std::size_t i = 0; i < n_windows; ++i)
    f.phases.push_back(CuptiPhaseFigure{phase_ends[i].first, window_peak[i]});
  return f;
}

}  // namespace trainmem::probes
