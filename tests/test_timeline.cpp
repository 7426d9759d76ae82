// Timelines: the data built from a ledger event log, the Perfetto trace JSON parsed back and
// replayed, and the SVG checked for well-formedness and for a stack whose top is the peak.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trainmem/base/error.hpp"
#include "trainmem/run/timeline.hpp"

namespace trainmem {
namespace {

// A small hand-written event log in the shape of a training step: setup (params, grads,
// states), then step 1 (forward, backward with recompute, optimizer), then step 2 the same.
struct Log {
  std::vector<LedgerEvent> events;
  std::vector<TensorRecord> tensors;
  std::map<std::string, std::uint64_t> live_ptr;  // name -> tensor id
  std::int64_t now = 0;
  void alloc(const std::string& name, Category c, std::uint64_t bytes, Phase p, int layer = -1) {
    TensorRecord r;
    r.id = tensors.size() + 1;
    r.name = name;
    r.category = c;
    r.bytes = bytes;
    r.layer = layer;
    tensors.push_back(r);
    live_ptr[name] = r.id;
    push(+std::int64_t(bytes), c, r.id, p, layer);
  }
  void free(const std::string& name, Phase p) {
    const TensorRecord& r = tensors.at(live_ptr.at(name) - 1);
    push(-std::int64_t(r.bytes), r.category, r.id, p, r.layer);
    live_ptr.erase(name);
  }
  void push(std::int64_t delta, Category c, std::uint64_t id, Phase p, int layer) {
    LedgerEvent e;
    e.seq = events.size() + 1;
    now += 1000 + 37 * std::int64_t(events.size());
    e.time_ns = now;
    e.delta = delta;
    e.category = c;
    e.tensor_id = id;
    e.layer = layer;
    e.phase = p;
    events.push_back(e);
  }
};

constexpr std::uint64_t MiB = 1 << 20;

Log make_step_log(std::uint64_t* step2_first_seq) {
  Log g;
  g.alloc("w", Category::params, 100 * MiB, Phase::setup);
  g.alloc("w.grad", Category::gradients, 100 * MiB, Phase::setup);
  g.alloc("w.exp_avg", Category::optimizer_states, 200 * MiB, Phase::setup);
  g.alloc("tokens", Category::inputs, 1 * MiB, Phase::setup);
  for (int step = 1; step <= 2; ++step) {
    if (step == 2) *step2_first_seq = g.events.size() + 1;
    g.alloc("x0", Category::activations, 50 * MiB, Phase::forward, 0);
    g.alloc("x1", Category::activations, 50 * MiB, Phase::forward, 1);
    g.alloc("logits", Category::activations, 80 * MiB, Phase::forward);
    g.alloc("d_logits", Category::workspace, 30 * MiB, Phase::backward);
    g.free("logits", Phase::backward);
    g.alloc("recomputed", Category::activations, 120 * MiB, Phase::recompute, 1);
    g.alloc("d_probs", Category::workspace, 60 * MiB, Phase::backward, 1);  // the peak
    g.free("d_probs", Phase::backward);
    g.free("recomputed", Phase::backward);
    g.free("x1", Phase::backward);
    g.free("x0", Phase::backward);
    g.free("d_logits", Phase::backward);
  }
  return g;
}

TEST(Timeline, BuildsTheWindowFromThePersistentState) {
  std::uint64_t from = 0;
  const Log g = make_step_log(&from);
  const TimelineData d = build_timeline(g.events, g.tensors, from, TimeAxis::wall, "test step", 0);
  // The window starts with everything setup allocated.
  EXPECT_EQ(d.initial[int(Category::params)], 100 * MiB);
  EXPECT_EQ(d.initial[int(Category::gradients)], 100 * MiB);
  EXPECT_EQ(d.initial[int(Category::optimizer_states)], 200 * MiB);
  EXPECT_EQ(d.initial[int(Category::inputs)], 1 * MiB);
  EXPECT_EQ(d.initial[int(Category::activations)], 0u);
  ASSERT_EQ(d.points.size(), 12u);
  EXPECT_EQ(d.points.front().seq, from);
  EXPECT_EQ(d.points.front().time_ns, 0);
  // Peak: params+grads+states+inputs (401) + x0 + x1 (100) + d_logits (30) + recomputed
  // (120) + d_probs (60) = 711 MiB, after the 7th event of the step (d_probs).
  EXPECT_EQ(d.peak_index, 6u);
  EXPECT_EQ(d.points[6].tensor, "d_probs");
  EXPECT_EQ(d.points[6].live_total, 711 * MiB);
  EXPECT_EQ(d.points[6].live[int(Category::activations)], 220 * MiB);
  EXPECT_EQ(d.points[6].live[int(Category::workspace)], 90 * MiB);
  EXPECT_EQ(d.points.back().live_total, 401 * MiB);
  // Phases: forward ×3, backward ×2, recompute ×1, backward ×6.
  ASSERT_EQ(d.phases.size(), 4u);
  EXPECT_EQ(d.phases[0].phase, Phase::forward);
  EXPECT_EQ(d.phases[0].first, 0u);
  EXPECT_EQ(d.phases[0].last, 2u);
  EXPECT_EQ(d.phases[1].phase, Phase::backward);
  EXPECT_EQ(d.phases[2].phase, Phase::recompute);
  EXPECT_EQ(d.phases[2].first, 5u);
  EXPECT_EQ(d.phases[2].last, 5u);
  EXPECT_EQ(d.phases[3].last, 11u);
  EXPECT_EQ(d.phases[0].end_ns, d.phases[1].start_ns);
}

TEST(Timeline, ReleasingMoreThanIsLiveIsAnError) {
  std::vector<LedgerEvent> ev(1);
  ev[0].seq = 1;
  ev[0].delta = -5;
  ev[0].category = Category::workspace;
  EXPECT_THROW(build_timeline(ev, {}, 0, TimeAxis::wall, "x"), Error);
  EXPECT_THROW(build_timeline({}, {}, 0, TimeAxis::wall, "x"), Error);
}

TEST(Timeline, TraceJsonReplaysToTheSameLiveBytes) {
  std::uint64_t from = 0;
  const Log g = make_step_log(&from);
  const TimelineData d = build_timeline(g.events, g.tensors, from, TimeAxis::wall, "t \"q\"");
  const auto j = nlohmann::json::parse(timeline_trace_json(d));
  ASSERT_TRUE(j.contains("traceEvents"));
  EXPECT_EQ(j["otherData"]["time_axis"], "wall");
  // Replay the counters: the last value of each category track, and the maximum of "live
  // total", must match an independent replay of the events.
  std::map<std::string, std::uint64_t> last;
  std::uint64_t max_total = 0;
  double prev_ts = -1;
  int phases = 0, peaks = 0, allocs = 0;
  for (const auto& e : j["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "C") {
      const double ts = e["ts"];
      EXPECT_GE(ts, prev_ts) << "counter timestamps must not go back";
      prev_ts = ts;
      last[e["name"]] = e["args"]["bytes"];
      if (e["name"] == "live total")
        max_total = std::max<std::uint64_t>(max_total, e["args"]["bytes"]);
    } else if (ph == "X") {
      ++phases;
      EXPECT_GT(e["dur"].get<double>(), 0.0);
      EXPECT_EQ(e["cat"], "phase");
    } else if (ph == "i" && e["cat"] == "peak") {
      ++peaks;
      EXPECT_EQ(e["args"]["bytes"], 711 * MiB);
      EXPECT_EQ(e["args"]["tensor"], "d_probs");
      EXPECT_EQ(e["args"]["phase"], "backward");
      std::uint64_t sum = 0;
      for (auto& [k, v] : e["args"]["breakdown"].items()) sum += v.get<std::uint64_t>();
      EXPECT_EQ(sum, 711 * MiB);
      EXPECT_EQ(e["s"], "g");
    } else if (ph == "i") {
      ++allocs;
    }
  }
  EXPECT_EQ(phases, 4);
  EXPECT_EQ(peaks, 1);
  EXPECT_EQ(allocs, 12);
  EXPECT_EQ(max_total, 711 * MiB);
  EXPECT_EQ(last["live params"], 100 * MiB);
  EXPECT_EQ(last["live activations"], 0u);
  EXPECT_EQ(last["live workspace"], 0u);
  EXPECT_EQ(last["live total"], 401 * MiB);
  EXPECT_EQ(last.size(), 8u);  // seven categories and the total
  EXPECT_EQ(j["traceEvents"][0]["args"]["name"], "trainmem: t \"q\"");
}

TEST(Timeline, EventIndexAxisSpacesEventsOneMicrosecondApart) {
  std::uint64_t from = 0;
  const Log g = make_step_log(&from);
  const TimelineData d = build_timeline(g.events, g.tensors, from, TimeAxis::event_index, "m");
  const auto j = nlohmann::json::parse(timeline_trace_json(d));
  EXPECT_EQ(j["otherData"]["time_axis"], "event_index");
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "i" && e["cat"] == "peak") {
      EXPECT_EQ(e["ts"].get<double>(), 7.0);
    }
}

// A minimal XML well-formedness check: tags balance, attributes are quoted.
void expect_well_formed_xml(const std::string& s) {
  std::vector<std::string> stack;
  std::size_t i = 0;
  while ((i = s.find('<', i)) != std::string::npos) {
    const std::size_t j = s.find('>', i);
    ASSERT_NE(j, std::string::npos);
    std::string tag = s.substr(i + 1, j - i - 1);
    i = j + 1;
    if (tag.empty() || tag[0] == '?' || tag[0] == '!') continue;
    if (tag[0] == '/') {
      ASSERT_FALSE(stack.empty()) << "stray </" << tag << ">";
      EXPECT_EQ(stack.back(), tag.substr(1));
      stack.pop_back();
      continue;
    }
    const bool self_closing = tag.back() == '/';
    const std::string name = tag.substr(0, tag.find_first_of(" /"));
    const std::size_t quotes = std::count(tag.begin(), tag.end(), '"');
    EXPECT_EQ(quotes % 2, 0u) << "unbalanced quotes in <" << tag << ">";
    if (!self_closing) stack.push_back(name);
  }
  EXPECT_TRUE(stack.empty()) << "unclosed <" << (stack.empty() ? "" : stack.back()) << ">";
}

// The smallest y of every point in the area paths (the top of the stack, in pixels). Plain
// string search: std::regex recurses per character and overflows on long paths.
double top_of_areas(const std::string& svg, int* n_areas) {
  double min_y = 1e9;
  *n_areas = 0;
  std::size_t i = 0;
  while ((i = svg.find("<path class=\"area\"", i)) != std::string::npos) {
    ++*n_areas;
    const std::size_t d0 = svg.find(" d=\"M", i) + 5, d1 = svg.find("Z\"", d0);
    std::istringstream pts(svg.substr(d0, d1 - d0));
    std::string xy;
    while (pts >> xy) min_y = std::min(min_y, std::stod(xy.substr(xy.find(',') + 1)));
    i = d1;
  }
  return min_y;
}

// The text of one panel group (<g id="panel-all"> or <g id="panel-changing">).
std::string panel(const std::string& svg, const std::string& id) {
  const std::size_t a = svg.find("<g id=\"" + id + "\">");
  if (a == std::string::npos) return "";
  return svg.substr(a, svg.find("</g>", a) - a);
}

double peak_dot_y(const std::string& svg) {
  const std::size_t i = svg.find("<circle ");
  if (i == std::string::npos) return -1;
  const std::size_t c = svg.find("cy=\"", i) + 4;
  return std::stod(svg.substr(c, svg.find('"', c) - c));
}

TEST(Timeline, SvgIsWellFormedAndTheStackTopIsThePeak) {
  std::uint64_t from = 0;
  const Log g = make_step_log(&from);
  const TimelineData d = build_timeline(g.events, g.tensors, from, TimeAxis::wall, "a < b & c");
  const std::string svg = timeline_svg(d);
  expect_well_formed_xml(svg);
  // The full panel stacks all six categories and its dot sits on the top of the stack.
  int n_areas = 0;
  const std::string all = panel(svg, "panel-all");
  // y's are written to 0.1 px (%.1f): the dot and the stack top are the same value computed two
  // ways, so they round to neighbouring 0.1 steps at worst: 0.1 + slack.
  EXPECT_NEAR(peak_dot_y(all), top_of_areas(all, &n_areas), 0.11);
  EXPECT_EQ(n_areas, 6);
  // The zoomed panel holds only what changes in the step (activations, workspace), and its
  // dot is on its own stack's top.
  const std::string zoom = panel(svg, "panel-changing");
  EXPECT_NEAR(peak_dot_y(zoom), top_of_areas(zoom, &n_areas), 0.11);
  EXPECT_EQ(n_areas, 2);
  EXPECT_NE(zoom.find("data-category=\"activations\""), std::string::npos);
  EXPECT_NE(zoom.find("data-category=\"workspace\""), std::string::npos);
  EXPECT_NE(svg.find("Zoom on what changes within the step: workspace + activations"),
            std::string::npos);
  EXPECT_NE(svg.find("peak 711.00 MiB"), std::string::npos);
  EXPECT_NE(svg.find("(backward, layer 1, d_probs)"), std::string::npos);
  EXPECT_NE(svg.find("a &lt; b &amp; c"), std::string::npos);
  for (const char* name : {"params", "gradients", "optimizer_states", "activations", "workspace",
                           "inputs", "forward", "backward", "recompute"})
    EXPECT_NE(svg.find(std::string(">") + name + "<"), std::string::npos) << name;
  EXPECT_NE(svg.find(" MiB</text>"), std::string::npos);  // y axis in MiB for < 1 GiB
}

TEST(Timeline, LongStepsAreThinnedButKeepTheirPeak) {
  Log g;
  g.alloc("w", Category::params, std::uint64_t(3) << 30, Phase::setup);
  for (int i = 0; i < 60000; ++i) {
    const std::uint64_t bytes = (i == 41234 ? 900 : 1 + (i * 7919) % 500) * MiB;
    g.alloc("t" + std::to_string(i), Category::activations, bytes, Phase::forward, i % 80);
    g.free("t" + std::to_string(i), Phase::forward);
  }
  const TimelineData d = build_timeline(g.events, g.tensors, 2, TimeAxis::event_index, "long");
  EXPECT_EQ(d.points.size(), 120000u);
  EXPECT_EQ(d.points[d.peak_index].tensor, "t41234");
  const std::string svg = timeline_svg(d);
  EXPECT_LT(svg.size(), 400000u);  // two panels of at most ~1500 columns each
  expect_well_formed_xml(svg);
  int n_areas = 0;
  const std::string all = panel(svg, "panel-all");
  // As above: one 0.1 px step of the written coordinates, plus slack.
  EXPECT_NEAR(peak_dot_y(all), top_of_areas(all, &n_areas), 0.11);
  EXPECT_EQ(n_areas, 2);
  const std::string zoom = panel(svg, "panel-changing");
  EXPECT_NEAR(peak_dot_y(zoom), top_of_areas(zoom, &n_areas), 0.11);
  EXPECT_EQ(n_areas, 1);                                    // only the activations change
  EXPECT_NE(svg.find("peak 3.88 GiB"), std::string::npos);  // 3 GiB + 900 MiB
}

TEST(Timeline, PathsAreCheckedByExtension) {
  EXPECT_NO_THROW(validate_timeline_path("out.json"));
  EXPECT_NO_THROW(validate_timeline_path("dir.v2/OUT.SVG"));
  for (const char* bad : {"out.png", "out", "dir.json/out", ""}) {
    try {
      validate_timeline_path(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--timeline"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find(".svg"), std::string::npos);
    }
  }
}

TEST(Timeline, WritesBothFormatsByExtension) {
  std::uint64_t from = 0;
  const Log g = make_step_log(&from);
  const TimelineData d = build_timeline(g.events, g.tensors, from, TimeAxis::wall, "w");
  const auto dir = std::filesystem::temp_directory_path() / "trainmem_test_timeline";
  std::filesystem::create_directories(dir);
  write_timeline((dir / "t.json").string(), d);
  write_timeline((dir / "t.svg").string(), d);
  std::ifstream fj(dir / "t.json"), fs(dir / "t.svg");
  nlohmann::json parsed;
  EXPECT_NO_THROW(parsed = nlohmann::json::parse(fj));
  EXPECT_TRUE(parsed.contains("traceEvents"));
  std::string head(5, ' ');
  fs.read(head.data(), 5);
  EXPECT_EQ(head, "<svg ");
  EXPECT_THROW(write_timeline((dir / "missing" / "t.svg").string(), d), Error);
  std::filesystem::remove_all(dir);
}

TEST(Timeline, ByteUnits) {
  EXPECT_STREQ(byte_unit_for(0).name, "KiB");
  EXPECT_STREQ(byte_unit_for((1 << 20) - 1).name, "KiB");
  EXPECT_STREQ(byte_unit_for(1 << 20).name, "MiB");
  EXPECT_STREQ(byte_unit_for(std::uint64_t(1) << 30).name, "GiB");
  EXPECT_EQ(byte_unit_for(std::uint64_t(5) << 40).bytes, double(std::uint64_t(1) << 30));
}

}  // namespace
}  // namespace trainmem
