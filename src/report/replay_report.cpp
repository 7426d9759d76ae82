// `trainmem replay`'s report (include/trainmem/report/replay_report.hpp).
#include "trainmem/report/replay_report.hpp"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "trainmem/base/bytes.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/schema.hpp"

namespace trainmem::report {
namespace {

using nlohmann::json;

json pair_json(const StatPair& p) {
  return json{{"current", p.current}, {"peak", p.peak}};
}

// Segment sizes as "size × count", largest first, in the unit of the largest.
std::string segment_list(const std::vector<std::uint64_t>& sizes) {
  std::map<std::uint64_t, int, std::greater<>> count;
  for (auto s : sizes) ++count[s];
  const ByteUnit u = table_unit(count.empty() ? 0 : count.begin()->first);
  std::string out;
  for (const auto& [size, n] : count)
    out += (out.empty() ? "" : ", ") + format_bytes_with_unit(size, u) + " × " + std::to_string(n);
  return out.empty() ? "none" : out;
}

}  // namespace

std::string describe_allocator(const CachingAllocatorConfig& c) {
  std::string s = "pytorch (max_split_size ";
  s += c.max_split_size ? std::to_string(*c.max_split_size >> 20) + " MiB" : "unlimited";
  s += ", max_non_split_rounding " + std::to_string(c.max_non_split_rounding >> 20) + " MiB";
  s += ", roundup_power2_divisions " + std::to_string(c.roundup_power2_divisions);
  s += std::string(", expandable_segments ") + (c.expandable_segments ? "true" : "false") + ")";
  return s;
}

json allocator_config_json(const CachingAllocatorConfig& c) {
  return json{{"name", "pytorch"},
              {"max_split_size", c.max_split_size ? json(*c.max_split_size) : json(nullptr)},
              {"max_non_split_rounding", c.max_non_split_rounding},
              {"roundup_power2_divisions", c.roundup_power2_divisions},
              {"expandable_segments", c.expandable_segments}};
}

json allocator_stats_json(const CachingAllocatorStats& s,
                          const std::vector<std::uint64_t>& segments_at_reserved_peak) {
  return json{{"allocated", pair_json(s.allocated)},
              {"reserved", pair_json(s.reserved)},
              {"requested", pair_json(s.requested)},
              {"segments", pair_json(s.segments)},
              {"allocated_at_reserved_peak", s.allocated_at_reserved_peak},
              {"segments_at_reserved_peak", segments_at_reserved_peak},
              {"alloc_retries", s.alloc_retries},
              {"cuda_mallocs", s.cuda_mallocs},
              {"cuda_frees", s.cuda_frees}};
}

json allocator_model_json(const AllocatorModelResult& a,
                          const std::vector<AllocatorModelResult>* shadows) {
  json j = allocator_stats_json(a.step, a.segments_at_reserved_peak);
  j["spec"] = a.spec;
  j["config"] = allocator_config_json(a.config);
  j["scope"] = "the last step, peaks reset at its start";
  j["run_reserved_peak"] = a.run_reserved_peak;
  j["run_allocated_peak"] = a.run_allocated_peak;
  if (shadows) {
    json list = json::array();
    for (const AllocatorModelResult& sh : *shadows) list.push_back(allocator_model_json(sh));
    j["shadows"] = list;
  }
  return j;
}

std::vector<std::string> allocator_peak_lines(
    const CachingAllocatorStats& s, const std::vector<std::uint64_t>& segments_at_reserved_peak,
    ByteUnit u) {
  const std::uint64_t unused = s.reserved.peak - s.allocated_at_reserved_peak;
  return {"at the reserved peak: " + format_bytes_with_unit(s.reserved.peak, u) + " reserved, " +
              format_bytes_with_unit(s.allocated_at_reserved_peak, u) + " allocated, " +
              format_bytes_with_unit(unused, u) + " cached and unused" +
              (s.reserved.peak
                   ? " (" + fixed(100.0 * double(unused) / double(s.reserved.peak), 1) + "%)"
                   : std::string()),
          "segments at the reserved peak: " + segment_list(segments_at_reserved_peak),
          "cudaMalloc " + std::to_string(s.cuda_mallocs) + ", cudaFree " +
              std::to_string(s.cuda_frees) + ", retries after freeing the cache " +
              std::to_string(s.alloc_retries)};
}

namespace {

json replay_json(const ReplayResult& r, const std::string& source, const std::string& budget) {
  const CachingAllocatorStats& s = r.stats;
  const CachingAllocatorConfig& c = r.config;
  json j{{schema::kSchemaKey, kSchema},
         {"command", "replay"},
         {"events_file", source},
         {"events", r.events},
         {"allocations", r.allocs},
         {"allocator", allocator_config_json(c)},
         {"budget", c.device_bytes ? json(*c.device_bytes) : json(nullptr)},
         {"budget_source", budget}};
  j.update(allocator_stats_json(s, r.segments_at_reserved_peak));
  if (r.oom) {
    const CachingAllocatorOom& o = *r.oom;
    j["oom"] = json{{"event", r.oom_event},         {"requested", o.requested},
                    {"alloc_size", o.alloc_size},   {"device_bytes", o.device_bytes},
                    {"device_free", o.device_free}, {"allocated", o.allocated},
                    {"reserved", o.reserved},       {"message", o.message}};
  } else {
    j["oom"] = nullptr;
  }
  return j;
}

}  // namespace

void write_replay(ReportWriter& w, const ReplayResult& r, const std::string& source,
                  const std::string& budget_source) {
  const CachingAllocatorStats& s = r.stats;
  w.document([&] { return replay_json(r, source, budget_source); });
  Table csv({{"figure", Align::left}, {"current"}, {"peak"}});
  for (const auto& [name, p] :
       std::vector<std::pair<const char*, const StatPair*>>{{"allocated", &s.allocated},
                                                            {"reserved", &s.reserved},
                                                            {"requested", &s.requested},
                                                            {"segments", &s.segments}})
    csv.add_row({name, std::to_string(p->current), std::to_string(p->peak)});
  w.csv_table(csv);

  const ByteUnit u = table_unit(std::max(s.reserved.peak, s.allocated.peak));
  w.title("trainmem replay: " + source + " (" + std::to_string(r.events) + " events, " +
          std::to_string(r.allocs) + " allocations)");
  w.paragraph("allocator: " + describe_allocator(r.config) + "; device: " +
              (budget_source.empty() ? std::string("unlimited (no --budget)") : budget_source));
  w.banner("PREDICTED: a model of PyTorch's CUDACachingAllocator (docs/allocator.md), not a GPU");
  Table t({{"", Align::left},
           {std::string("at the end (") + u.name + ")"},
           {std::string("peak (") + u.name + ")"}});
  auto row = [&](const char* name, const StatPair& p) {
    t.add_row({name, format_bytes(p.current, u), format_bytes(p.peak, u)});
  };
  row("allocated (memory_allocated)", s.allocated);
  row("reserved (memory_reserved)", s.reserved);
  row("requested by the callers", s.requested);
  t.add_row({"segments (cudaMalloc'ed)", std::to_string(s.segments.current),
             std::to_string(s.segments.peak)});
  w.table(t);
  for (const std::string& line : allocator_peak_lines(s, r.segments_at_reserved_peak, u))
    w.line(line);
  if (r.oom)
    w.alert({"OUT OF MEMORY at event " + std::to_string(r.oom_event) + " (" +
                 std::to_string(r.oom->requested) + " bytes): PyTorch would raise",
             r.oom->message});
}

}  // namespace trainmem::report
