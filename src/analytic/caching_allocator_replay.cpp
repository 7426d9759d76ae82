// Replaying a sequence of allocations through the caching allocator model
// (include/trainmem/analytic/caching_allocator.hpp): the --allocator spec, the events file,
// the replay.
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "trainmem/analytic/caching_allocator.hpp"
#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/input_file.hpp"

namespace trainmem {
namespace {

using nlohmann::json;

// One request's largest size: far above any device, far below 2^64 (the sums stay exact).
constexpr std::uint64_t kMaxEventBytes = std::uint64_t{1} << 60;

const char* const kSpecForm =
    "allowed: pytorch, or pytorch:KEY=VALUE,... with the keys expandable_segments (true|false), "
    "max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions (integers) and "
    "garbage_collection_threshold (a number in (0, 1)))";

std::uint64_t spec_integer(const std::string& key, const std::string& value) {
  std::size_t used = 0;
  unsigned long long v = 0;
  const bool digits = !value.empty() && value.find_first_not_of("0123456789") == std::string::npos;
  if (digits) try {
      v = std::stoull(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
  if (!digits || used != value.size())
    throw InputError("--allocator: " + key + "=" + clip(value) + " is not an integer >= 0; " +
                     kSpecForm);
  return v;
}

std::uint64_t megabytes(const std::string& key, const std::string& value) {
  const std::uint64_t mb = spec_integer(key, value);
  if (mb > (std::numeric_limits<std::uint64_t>::max() >> 20))
    throw InputError("--allocator: " + key + "=" + clip(value) + " is too large");
  return mb << 20;
}

}  // namespace

CachingAllocatorConfig parse_allocator_spec(const std::string& spec) {
  CachingAllocatorConfig c;
  const std::string head = spec.substr(0, spec.find(':'));
  if (head != "pytorch")
    throw InputError("--allocator: unknown allocator '" + clip(head) + "'; " + kSpecForm);
  if (spec.size() == head.size()) return c;
  std::string rest = spec.substr(head.size() + 1);
  if (rest.empty())
    throw InputError(std::string("--allocator: nothing after 'pytorch:'; ") + kSpecForm);
  std::size_t start = 0;
  while (start <= rest.size()) {
    const std::size_t comma = rest.find(',', start);
    const std::string item =
        rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InputError("--allocator: '" + clip(item) + "' is not KEY=VALUE; " + kSpecForm);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "expandable_segments") {
      if (value != "true" && value != "false" && value != "True" && value != "False")
        throw InputError("--allocator: expandable_segments=" + clip(value) +
                         ": allowed: true or false");
      c.expandable_segments = value == "true" || value == "True";
    } else if (key == "max_split_size_mb") {
      c.max_split_size = megabytes(key, value);
    } else if (key == "max_non_split_rounding_mb") {
      c.max_non_split_rounding = megabytes(key, value);
    } else if (key == "roundup_power2_divisions") {
      const std::uint64_t d = spec_integer(key, value);
      if (d != 0 && (d & (d - 1)) != 0)
        throw InputError("--allocator: roundup_power2_divisions=" + value +
                         ": allowed: a power of two (PyTorch's check)");
      c.roundup_power2_divisions = d;
    } else if (key == "garbage_collection_threshold") {
      double v = 0;
      std::size_t used = 0;
      try {
        v = std::stod(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != value.size() || !std::isfinite(v) || v <= 0 || v >= 1)
        throw InputError("--allocator: garbage_collection_threshold=" + clip(value) +
                         ": allowed: a number above 0 and below 1");
      c.garbage_collection_threshold = v;
    } else {
      throw InputError("--allocator: unknown key '" + clip(key) + "'; " + kSpecForm);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  c.check();
  return c;
}

std::vector<AllocEvent> parse_alloc_events(const std::string& json_text,
                                           const std::string& source) {
  const json doc = parse_json_strict<json>(json_text, source);
  const json* list = &doc;
  if (doc.is_object()) {
    const auto it = doc.find("events");
    if (it == doc.end())
      throw InputError(source + ": an object needs \"events\": [...] (or give the array itself)");
    list = &*it;
  }
  if (!list->is_array())
    throw InputError(source + ": the events must be an array of {\"op\", \"id\", \"bytes\"}");
  std::vector<AllocEvent> out;
  out.reserve(list->size());
  for (std::size_t n = 0; n < list->size(); ++n) {
    const json& e = (*list)[n];
    const std::string where = source + ": event " + std::to_string(n);
    if (!e.is_object()) throw InputError(where + " is not an object {\"op\", \"id\", \"bytes\"}");
    auto integer = [&](const char* key, bool required, std::uint64_t fallback) -> std::uint64_t {
      const auto it = e.find(key);
      if (it == e.end()) {
        if (required) throw InputError(where + ": missing \"" + key + "\"");
        return fallback;
      }
      if (it->is_number_unsigned()) return it->get<std::uint64_t>();
      if (it->is_number_integer() && it->get<std::int64_t>() >= 0)
        return static_cast<std::uint64_t>(it->get<std::int64_t>());
      throw InputError(where + ": \"" + key + "\" is " + clip(it->dump()) +
                       ", not an integer >= 0");
    };
    const auto op = e.find("op");
    if (op == e.end() || !op->is_string() ||
        (op->get<std::string>() != "alloc" && op->get<std::string>() != "free"))
      throw InputError(where + ": \"op\" must be \"alloc\" or \"free\"" +
                       (op == e.end() ? std::string(" (missing)") : ", got " + clip(op->dump())));
    AllocEvent ev;
    ev.alloc = op->get<std::string>() == "alloc";
    ev.id = integer("id", true, 0);
    if (ev.alloc) {
      ev.bytes = integer("bytes", true, 0);
      if (ev.bytes == 0) throw InputError(where + ": \"bytes\" must be at least 1");
      if (ev.bytes > kMaxEventBytes)
        throw InputError(where + ": \"bytes\" must be at most 2^60 (1 EiB), got " +
                         std::to_string(ev.bytes));
    }
    const std::uint64_t stream = integer("stream", false, 0);
    if (stream > 1000000) throw InputError(where + ": \"stream\" must be at most 1000000");
    ev.stream = static_cast<int>(stream);
    out.push_back(ev);
  }
  return out;
}

ReplayResult replay(const std::vector<AllocEvent>& events, const CachingAllocatorConfig& config) {
  ReplayResult r;
  r.config = config;
  CachingAllocatorModel m(config);
  for (std::size_t n = 0; n < events.size(); ++n) {
    const AllocEvent& e = events[n];
    ++r.events;
    try {
      if (!e.alloc) {
        m.free(e.id);
        continue;
      }
      ++r.allocs;
      if (auto oom = m.malloc(e.id, e.bytes, e.stream)) {
        r.oom = std::move(oom);
        r.oom_event = n;
        break;
      }
    } catch (const InputError& err) {
      throw InputError("event " + std::to_string(n) + ": " + err.what());
    }
  }
  r.stats = m.stats();
  r.segments_at_reserved_peak = m.segments_at_reserved_peak();
  return r;
}

}  // namespace trainmem
