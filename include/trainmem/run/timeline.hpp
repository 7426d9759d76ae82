// The memory timeline of one training step, from the ledger's event log, written as
//   - Chrome/Perfetto trace-event JSON (`--timeline out.json`, opens in ui.perfetto.dev and
//     chrome://tracing): one counter track of live bytes per category plus the total, the
//     phases as slices, the peak as a global instant event with its breakdown;
//   - a self-contained SVG (`--timeline out.svg`): a stacked area of live bytes per category
//     over the step, phase bands behind it, the peak marked and labelled, a legend, and axes
//     in GiB/MiB/KiB; below it a zoomed panel of only the categories that change within the
//     step (activations, workspace; gradients under LOMO), which the persistent state
//     otherwise dwarfs. Readable in any browser or image viewer.
//
// The x axis is either wall time (backends that compute) or the allocation-event index
// (meta: no time passes, so events are spaced evenly; the SVG always uses the event index,
// like PyTorch's memory timeline, because a step's allocations bunch up in time).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trainmem/analytic/hf_step.hpp"
#include "trainmem/base/bytes.hpp"
#include "trainmem/ledger/ledger.hpp"

namespace trainmem {

enum class TimeAxis { wall, event_index };

// One phase slice: a maximal run of events in the same phase (phases that allocate nothing,
// e.g. AdamW's optimizer phase, are TimelineData::quiet_phases instead).
struct PhaseSlice {
  Phase phase = Phase::setup;
  std::size_t first = 0;  // index into TimelineData::points of the first event in the slice
  std::size_t last = 0;   // index of the last event in the slice (inclusive)
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;  // the next slice's start (or the last event's time)
};

// A phase that ran without allocating anything (e.g. AdamW's optimizer phase): no event
// carries it, so it is drawn from the ledger's phase marks, at its place among the events.
struct QuietPhase {
  Phase phase = Phase::setup;
  std::size_t before = 0;  // number of window points that came before it
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
};

struct TimelinePoint {
  std::uint64_t seq = 0;
  std::int64_t time_ns = 0;  // since the window's first event
  std::int64_t delta = 0;    // ± bytes of this event
  Category category = Category::activations;
  int layer = -1;
  Phase phase = Phase::setup;
  std::string tensor;    // name, when the tensor record is known
  CategoryBytes live{};  // live bytes per category after this event
  std::uint64_t live_total = 0;
};

struct TimelineData {
  std::string title;  // e.g. "llama-7b  b8 s512 bf16 adamw  meta backend"
  TimeAxis axis = TimeAxis::wall;
  CategoryBytes initial{};  // live bytes per category before the window's first event
  std::vector<TimelinePoint> points;
  std::vector<PhaseSlice> phases;
  std::vector<QuietPhase> quiet_phases;  // phases with no event, from the phase marks
  std::size_t peak_index = 0;        // index into points of the (first) total peak in the window
  std::uint64_t dropped_events = 0;  // events the ledger did not keep (past its cap)
};

// Builds the data for the events with seq >= from_seq (the step to show; 0 for all). Live
// bytes before the window are accumulated from the earlier events, so the stack starts at
// the persistent state. `tensors` supplies names (may be empty). The peak shown is the
// first event after which the window's live total is largest (for the step the ledger
// measured, the ledger's PeakInfo). Throws Error when the window is empty or an event
// releases more bytes of a category than are live.
TimelineData build_timeline(const std::vector<LedgerEvent>& events,
                            const std::vector<TensorRecord>& tensors, std::uint64_t from_seq,
                            TimeAxis axis, std::string title, std::uint64_t dropped_events = 0,
                            const std::vector<PhaseMark>& phase_marks = {});

// The HF step's event sequence (hf_step.hpp) as a timeline over the event index: the state alive
// when the step begins as the initial stack, each event's tensor and category
// (hf_step_category), its phase as the ledger's (loss and autocast's exit under forward, zero_grad
// under optimizer).
// `tensors_out`: the records the timeline names (for timeline_html), when given.
TimelineData hf_step_timeline(const HfStep& step, std::string title,
                              std::vector<TensorRecord>* tensors_out = nullptr);

// The trace-event JSON text ({"traceEvents": [...], "displayTimeUnit": "ms", ...}).
std::string timeline_trace_json(const TimelineData& data);
// The SVG text (width × height pixels).
std::string timeline_svg(const TimelineData& data, int width = 1100, int height = 760);

// Instants a page can inspect (the HTML report): points of the timeline (indices into
// TimelineData::points, ascending), each drawn over the plot as a transparent column
// (class "instant", "instant peak" at the peak; id "instant-K", data-k, data-seq) from its
// point to the next instant's, with `tooltip[K]` as its native tooltip (SVG <title>).
struct SvgInstants {
  std::vector<std::size_t> index;
  std::vector<std::string> tooltip;
};
// The SVG above with the instants' columns on top (no instants: the same SVG).
std::string timeline_svg(const TimelineData& data, const SvgInstants& instants, int width = 1100,
                         int height = 760);

// Writes by extension: .json -> trace JSON, .svg -> SVG. Anything else is an InputError
// naming --timeline; so is an unwritable path (bad input: exit 2, as for --output).
void write_timeline(const std::string& path, const TimelineData& data);
// Checks the extension only (so a run can refuse a bad --timeline before it starts).
void validate_timeline_path(const std::string& path);

}  // namespace trainmem
