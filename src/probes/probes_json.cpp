// JSON forms of the probes' results (all builds). An unavailable source is
// {"available": false, "reason": "..."}; sizes are integers in bytes.
#include <nlohmann/json.hpp>

#include "trainmem/probes/probes.hpp"

namespace trainmem {

namespace {
nlohmann::json categories_json(const CategoryBytes& b) {
  nlohmann::json j = nlohmann::json::object();
  for (Category c : all_categories()) j[category_name(c)] = b[static_cast<int>(c)];
  return j;
}
nlohmann::json unavailable_json(const std::string& reason) {
  return {{"available", false}, {"reason", reason}};
}
}  // namespace

nlohmann::json PoolResult::to_json() const {
  if (!available) return unavailable_json(reason);
  nlohmann::json phases_j = nlohmann::json::array();
  for (const auto& p : phases)
    phases_j.push_back({{"phase", phase_name(p.phase)},
                        {"used_high", p.used_high},
                        {"reserved_high", p.reserved_high}});
  return {{"available", true},
          {"used_high", used_high},
          {"reserved_high", reserved_high},
          {"used_current", used_current},
          {"reserved_current", reserved_current},
          {"phases", phases_j}};
}

nlohmann::json CuptiResult::to_json() const {
  if (!available) return unavailable_json(reason);
  const CuptiFigures& f = figures;
  nlohmann::json phases_j = nlohmann::json::array();
  for (const auto& p : f.phases)
    phases_j.push_back({{"phase", phase_name(p.phase)}, {"peak", p.peak}});
  return {{"available", true},
          {"live", categories_json(f.live)},
          {"peak", categories_json(f.peak)},
          {"peak_total", f.peak_total},
          {"peak_breakdown", categories_json(f.peak_breakdown)},
          {"unattributed_live", f.unattributed_live},
          {"unattributed_peak", f.unattributed_peak},
          {"phases", phases_j},
          {"records",
           {{"memory", f.memory_records},
            {"allocations", f.allocations},
            {"releases", f.releases},
            {"unknown_correlation", f.unknown_correlation},
            {"unmatched_releases", f.unmatched_releases},
            {"reused_live_address", f.reused_live_address},
            {"pool", f.pool_records},
            {"other", f.other_records},
            {"dropped", f.dropped}}}};
}

nlohmann::json MemGetInfoResult::to_json() const {
  if (!available) return unavailable_json(reason);
  nlohmann::json snaps = nlohmann::json::array();
  for (const auto& s : snapshots) {
    nlohmann::json j = {{"name", s.name}, {"step", s.step}, {"free", s.free}, {"used", s.used}};
    if (s.has_ledger) j["ledger_live"] = s.ledger_live;
    snaps.push_back(j);
  }
  nlohmann::json phases_j = nlohmann::json::array();
  for (const auto& p : phase_samples)
    phases_j.push_back({{"phase", phase_name(p.phase)}, {"max_used", p.max_used}});
  return {{"available", true},
          {"total", total},
          {"snapshots", snaps},
          {"sampler",
           {{"running", sampler_running},
            {"interval_us", sample_interval.count()},
            {"samples", samples},
            {"max_used", sampler_max_used},
            {"phases", phases_j}}}};
}

nlohmann::json ProbeSet::to_json() const {
  return {{"pool", pool().to_json()},
          {"cupti", cupti().to_json()},
          {"memgetinfo", memgetinfo().to_json()}};
}

}  // namespace trainmem
