// Memory timelines: Chrome/Perfetto trace JSON and a self-contained SVG stacked-area plot
// (see include/trainmem/run/timeline.hpp).
#include "trainmem/run/timeline.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "trainmem/base/atomic_file.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {

namespace {

std::string lower_extension(const std::string& path) {
  const auto dot = path.find_last_of('.');
  const auto slash = path.find_last_of('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  std::string ext = path.substr(dot);
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

double trace_ts_us(const TimelineData& d, std::size_t i) {
  if (d.axis == TimeAxis::event_index) return double(i + 1);
  return double(d.points[i].time_ns) / 1000.0;
}

}  // namespace

TimelineData hf_step_timeline(const HfStep& step, std::string title,
                              std::vector<TensorRecord>* tensors_out) {
  auto phase_of = [](HfStepPhase p) {
    switch (p) {
      case HfStepPhase::backward:
        return Phase::backward;
      case HfStepPhase::optimizer:
      case HfStepPhase::zero_grad:
        return Phase::optimizer;
      case HfStepPhase::forward:
      case HfStepPhase::loss:
      case HfStepPhase::autocast_exit:
        break;
    }
    return Phase::forward;
  };
  std::vector<LedgerEvent> events;
  std::vector<TensorRecord> tensors;
  std::uint64_t seq = 0;
  auto add = [&](std::uint32_t id, bool alloc, Phase phase) {
    const HfStepTensor& t = step.tensors[id];
    LedgerEvent e;
    e.seq = ++seq;
    e.time_ns = static_cast<std::int64_t>(seq);
    e.delta = alloc ? static_cast<std::int64_t>(t.bytes) : -static_cast<std::int64_t>(t.bytes);
    e.category = hf_step_category(t.kind);
    e.tensor_id = id;
    e.layer = t.layer;
    e.phase = phase;
    events.push_back(e);
    // the records say when each tensor lives (the page lists those live at an instant)
    TensorRecord& r = tensors[id];
    if (alloc) {
      r.alloc_seq = e.seq;
      r.phase = phase;
    } else {
      r.free_seq = e.seq;
    }
  };
  for (std::uint32_t i = 0; i < step.tensors.size(); ++i) {
    const HfStepTensor& t = step.tensors[i];
    TensorRecord r;
    r.id = i;
    r.name = t.name;
    r.category = hf_step_category(t.kind);
    r.layer = t.layer;
    r.bytes = t.bytes;
    tensors.push_back(std::move(r));
    if (i < step.first_step_tensor) add(i, true, Phase::setup);
  }
  const std::uint64_t first = seq + 1;
  for (const HfStepEvent& e : step.events) add(e.tensor, e.alloc, phase_of(e.phase));
  TimelineData d = build_timeline(events, tensors, first, TimeAxis::event_index, std::move(title));
  if (tensors_out) *tensors_out = std::move(tensors);
  return d;
}

TimelineData build_timeline(const std::vector<LedgerEvent>& events,
                            const std::vector<TensorRecord>& tensors, std::uint64_t from_seq,
                            TimeAxis axis, std::string title, std::uint64_t dropped_events,
                            const std::vector<PhaseMark>& phase_marks) {
  TimelineData d;
  d.title = std::move(title);
  d.axis = axis;
  d.dropped_events = dropped_events;
  std::unordered_map<std::uint64_t, const TensorRecord*> by_id;
  by_id.reserve(tensors.size());
  for (const auto& t : tensors) by_id[t.id] = &t;

  CategoryBytes live{};
  std::int64_t t0 = 0;
  auto apply = [&](const LedgerEvent& e) {
    auto& slot = live[static_cast<int>(e.category)];
    if (e.delta < 0 && std::uint64_t(-e.delta) > slot)
      throw Error("timeline: event " + std::to_string(e.seq) + " releases more " +
                  category_name(e.category) + " bytes than are live");
    slot = e.delta < 0 ? slot - std::uint64_t(-e.delta) : slot + std::uint64_t(e.delta);
  };
  for (const auto& e : events) {
    if (e.seq < from_seq) {
      apply(e);
      continue;
    }
    if (d.points.empty()) {
      d.initial = live;
      t0 = e.time_ns;
    }
    apply(e);
    TimelinePoint p;
    p.seq = e.seq;
    p.time_ns = e.time_ns - t0;
    p.delta = e.delta;
    p.category = e.category;
    p.layer = e.layer;
    p.phase = e.phase;
    if (auto it = by_id.find(e.tensor_id); it != by_id.end()) p.tensor = it->second->name;
    p.live = live;
    for (auto b : live) p.live_total += b;
    d.points.push_back(std::move(p));
  }
  if (d.points.empty())
    throw Error("timeline: the ledger recorded no events from sequence number " +
                std::to_string(from_seq));

  for (std::size_t i = 0; i < d.points.size(); ++i)
    if (d.points[i].live_total > d.points[d.peak_index].live_total) d.peak_index = i;

  for (std::size_t i = 0; i < d.points.size(); ++i) {
    if (d.phases.empty() || d.phases.back().phase != d.points[i].phase) {
      if (!d.phases.empty()) d.phases.back().end_ns = d.points[i].time_ns;
      d.phases.push_back({d.points[i].phase, i, i, d.points[i].time_ns, d.points[i].time_ns});
    }
    d.phases.back().last = i;
    d.phases.back().end_ns = d.points[i].time_ns;
  }

  // Phases that allocated nothing: an enter and its exit with no event in between.
  const std::uint64_t first_seq = d.points.front().seq;
  std::int64_t window_t0 = 0;
  for (const auto& e : events)
    if (e.seq == first_seq) window_t0 = e.time_ns;
  std::vector<const PhaseMark*> open;
  for (const PhaseMark& m : phase_marks) {
    if (m.enter) {
      open.push_back(&m);
      continue;
    }
    if (open.empty()) continue;
    const PhaseMark* in = open.back();
    open.pop_back();
    if (in->phase != m.phase || in->after_seq != m.after_seq) continue;
    // Before the window: the previous step's optimizer ends right before the window's first
    // event, so the sequence number alone cannot tell; its time can.
    if (m.after_seq + 1 < first_seq || in->time_ns < window_t0) continue;
    QuietPhase q;
    q.phase = m.phase;
    q.before = std::size_t(std::min<std::uint64_t>(m.after_seq + 1 - first_seq, d.points.size()));
    q.start_ns = in->time_ns - window_t0;
    q.end_ns = m.time_ns - window_t0;
    d.quiet_phases.push_back(q);
  }
  return d;
}

std::string timeline_trace_json(const TimelineData& d) {
  using nlohmann::json;
  std::vector<json> ev;
  const int pid = 1, tid_phases = 1, tid_allocs = 2;
  ev.push_back({{"name", "process_name"},
                {"ph", "M"},
                {"pid", pid},
                {"args", {{"name", "trainmem: " + d.title}}}});
  ev.push_back({{"name", "thread_name"},
                {"ph", "M"},
                {"pid", pid},
                {"tid", tid_phases},
                {"args", {{"name", "phases"}}}});
  ev.push_back({{"name", "thread_name"},
                {"ph", "M"},
                {"pid", pid},
                {"tid", tid_allocs},
                {"args", {{"name", "allocations"}}}});

  auto counter = [&](const std::string& name, double ts, std::uint64_t bytes) {
    ev.push_back(
        {{"name", name}, {"ph", "C"}, {"pid", pid}, {"ts", ts}, {"args", {{"bytes", bytes}}}});
  };
  // Initial values of every counter track, at time 0.
  std::uint64_t total0 = 0;
  for (Category c : all_categories()) {
    counter(std::string("live ") + category_name(c), 0.0, d.initial[static_cast<int>(c)]);
    total0 += d.initial[static_cast<int>(c)];
  }
  counter("live total", 0.0, total0);

  for (std::size_t i = 0; i < d.points.size(); ++i) {
    const TimelinePoint& p = d.points[i];
    const double ts = trace_ts_us(d, i);
    counter(std::string("live ") + category_name(p.category), ts,
            p.live[static_cast<int>(p.category)]);
    counter("live total", ts, p.live_total);
    ev.push_back({{"name", (p.delta >= 0 ? "alloc " : "free ") +
                               (p.tensor.empty() ? std::string("?") : p.tensor)},
                  {"cat", category_name(p.category)},
                  {"ph", "i"},
                  {"s", "t"},
                  {"pid", pid},
                  {"tid", tid_allocs},
                  {"ts", ts},
                  {"args",
                   {{"seq", p.seq},
                    {"bytes", p.delta},
                    {"category", category_name(p.category)},
                    {"layer", p.layer},
                    {"phase", phase_name(p.phase)}}}});
  }

  for (const PhaseSlice& s : d.phases) {
    double start, end;
    if (d.axis == TimeAxis::event_index) {
      start = trace_ts_us(d, s.first);
      end = trace_ts_us(d, s.last) + 1.0;
    } else {
      start = double(s.start_ns) / 1000.0;
      end = double(s.end_ns) / 1000.0;
      if (end <= start) end = start + 0.001;  // a visible sliver rather than nothing
    }
    std::uint64_t phase_peak = 0;
    for (std::size_t i = s.first; i <= s.last; ++i)
      phase_peak = std::max(phase_peak, d.points[i].live_total);
    ev.push_back({{"name", phase_name(s.phase)},
                  {"cat", "phase"},
                  {"ph", "X"},
                  {"pid", pid},
                  {"tid", tid_phases},
                  {"ts", start},
                  {"dur", end - start},
                  {"args", {{"events", s.last - s.first + 1}, {"peak_bytes", phase_peak}}}});
  }

  for (const QuietPhase& q : d.quiet_phases) {
    double start, end;
    if (d.axis == TimeAxis::event_index) {
      start = double(q.before) + 0.5;  // between the events around it
      end = start + 0.001;
    } else {
      start = double(q.start_ns) / 1000.0;
      end = std::max(double(q.end_ns) / 1000.0, start + 0.001);
    }
    ev.push_back({{"name", phase_name(q.phase)},
                  {"cat", "phase"},
                  {"ph", "X"},
                  {"pid", pid},
                  {"tid", tid_phases},
                  {"ts", start},
                  {"dur", end - start},
                  {"args", {{"events", 0}, {"note", "no allocation in this phase"}}}});
  }

  const TimelinePoint& pk = d.points[d.peak_index];
  json breakdown = json::object();
  for (Category c : all_categories()) breakdown[category_name(c)] = pk.live[static_cast<int>(c)];
  ev.push_back(
      {{"name", "peak " + format_bytes_with_unit(pk.live_total, byte_unit_for(pk.live_total))},
       {"cat", "peak"},
       {"ph", "i"},
       {"s", "g"},
       {"pid", pid},
       {"tid", tid_phases},
       {"ts", trace_ts_us(d, d.peak_index)},
       {"args",
        {{"bytes", pk.live_total},
         {"tensor", pk.tensor},
         {"layer", pk.layer},
         {"phase", phase_name(pk.phase)},
         {"seq", pk.seq},
         {"breakdown", breakdown}}}});

  std::string out = "{\"traceEvents\": [\n";
  for (std::size_t i = 0; i < ev.size(); ++i) {
    out += ev[i].dump();
    out += i + 1 < ev.size() ? ",\n" : "\n";
  }
  json other = {{"title", d.title},
                {"time_axis", d.axis == TimeAxis::wall ? "wall" : "event_index"},
                {"time_axis_note", d.axis == TimeAxis::wall
                                       ? "ts is wall time in microseconds since the step began"
                                       : "ts is the ledger event index (1 us per event): the "
                                         "meta backend does no work, so no time passes"},
                {"peak_bytes", pk.live_total},
                {"dropped_events", d.dropped_events}};
  out += "],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": " + other.dump() + "\n}\n";
  return out;
}

void validate_timeline_path(const std::string& path) {
  const std::string ext = lower_extension(path);
  if (ext != ".json" && ext != ".svg")
    throw InputError("--timeline: '" + path +
                     "' must end in .json (Chrome/Perfetto trace) or .svg (plot)");
}

void write_timeline(const std::string& path, const TimelineData& data) {
  validate_timeline_path(path);
  const std::string text =
      lower_extension(path) == ".json" ? timeline_trace_json(data) : timeline_svg(data);
  write_file_atomically(path, text, "--timeline");
}

}  // namespace trainmem
