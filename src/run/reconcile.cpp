// Reconciliation primitives (include/trainmem/run/reconcile.hpp).
#include "trainmem/run/reconcile.hpp"

#include <limits>

#include "trainmem/base/checked.hpp"

namespace trainmem {

namespace {
constexpr std::int64_t kNoUpper = std::numeric_limits<std::int64_t>::max();

std::int64_t signed_difference(std::uint64_t device, std::uint64_t ledger) {
  // Byte counts on one device fit in 63 bits many times over; saturate rather than wrap.
  constexpr std::uint64_t kMax = static_cast<std::uint64_t>(kNoUpper);
  if (device >= ledger) return static_cast<std::int64_t>(std::min(device - ledger, kMax));
  return -static_cast<std::int64_t>(std::min(ledger - device, kMax));
}
}  // namespace

LedgerSummary LedgerSummary::of(const Ledger& l) {
  LedgerSummary s;
  for (Category c : all_categories()) {
    s.live[static_cast<int>(c)] = l.live(c);
    s.peak[static_cast<int>(c)] = l.peak(c);
  }
  s.live_total = l.live_total();
  s.peak_total = l.peak_total().bytes;
  s.peak_breakdown = l.peak_total().breakdown;
  s.peak_live_count = l.peak_live_count();
  for (int p = 0; p < kNumPhases; ++p) s.phase_peak[p] = l.phase_peak(static_cast<Phase>(p));
  return s;
}

SourceCheck make_check(std::string source, std::string what, std::uint64_t ledger,
                       std::uint64_t device, std::int64_t lower, std::int64_t upper,
                       std::string bound) {
  SourceCheck c;
  c.source = std::move(source);
  c.what = std::move(what);
  c.ledger = ledger;
  c.device = device;
  c.difference = signed_difference(device, ledger);
  c.lower = lower;
  c.upper = upper;
  c.ok = c.difference >= lower && c.difference <= upper;
  c.bound = std::move(bound);
  return c;
}

nlohmann::json SourceCheck::to_json() const {
  nlohmann::json j = {
      {"source", source},         {"what", what},   {"ledger", ledger}, {"device", device},
      {"difference", difference}, {"lower", lower}, {"ok", ok},         {"bound", bound}};
  j["upper"] = upper == kNoUpper ? nlohmann::json(nullptr) : nlohmann::json(upper);
  return j;
}

std::vector<SourceCheck> reconcile_pool(const LedgerSummary& l, const PoolResult& pool,
                                        std::uint64_t granularity) {
  std::vector<SourceCheck> out;
  if (!pool.available) return out;
  const std::uint64_t slack_per_alloc = granularity > 0 ? granularity - 1 : 0;
  const std::uint64_t upper = checked_mul(l.peak_live_count, slack_per_alloc, "pool bound");
  const std::string bound = "0 <= difference <= " + std::to_string(l.peak_live_count) +
                            " live allocations x " + std::to_string(slack_per_alloc) +
                            " bytes (rounding to " + std::to_string(granularity) + ")";
  out.push_back(make_check("pool", "used_high vs peak", l.peak_total, pool.used_high, 0,
                           signed_difference(upper, 0), bound));
  out.push_back(make_check("pool", "reserved_high vs peak", l.peak_total, pool.reserved_high, 0,
                           kNoUpper, "reserved >= live; the excess is pool slack"));
  return out;
}

std::vector<SourceCheck> reconcile_cupti(const LedgerSummary& l, const CuptiResult& cupti) {
  std::vector<SourceCheck> out;
  if (!cupti.available) return out;
  const CuptiFigures& f = cupti.figures;
  for (Category c : all_categories()) {
    const int k = static_cast<int>(c);
    out.push_back(make_check("cupti", std::string(category_name(c)) + " live", l.live[k], f.live[k],
                             0, 0, "exact"));
    out.push_back(make_check("cupti", std::string(category_name(c)) + " peak", l.peak[k], f.peak[k],
                             0, 0, "exact"));
  }
  out.push_back(make_check("cupti", "peak", l.peak_total, f.peak_total, 0, 0, "exact"));
  if (f.dropped > 0) {
    SourceCheck d = make_check("cupti", "dropped records", 0, f.dropped, 0, 0,
                               "no record may be dropped for the figures to be complete");
    out.push_back(d);
  }
  return out;
}

std::vector<SourceCheck> reconcile_memgetinfo(const LedgerSummary& l, const MemGetInfoResult& mem) {
  std::vector<SourceCheck> out;
  if (!mem.available) return out;
  const std::string bound = "overhead >= 0 (context, cuBLAS, modules, pool slack, others)";
  for (const MemSnapshot& s : mem.snapshots)
    if (s.has_ledger)
      out.push_back(make_check("memgetinfo", "overhead at " + s.name, s.ledger_live, s.used, 0,
                               kNoUpper, bound));
  if (mem.sampler_running && mem.samples > 0)
    out.push_back(make_check("memgetinfo", "overhead at the sampled peak", l.peak_total,
                             mem.sampler_max_used, 0, kNoUpper, bound));
  return out;
}

}  // namespace trainmem
