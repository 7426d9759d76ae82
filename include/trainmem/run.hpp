// Running training steps for the measuring subcommands (profile, compare, sweep, maxbatch):
// one code path that picks the backend, runs the steps, reads the ledger and the device
// probes, attaches the analytic profiles and reconciles them. Also the small pieces those
// commands share: SIZE parsing for budgets, the largest-value search behind `maxbatch`, and
// a progress bar for long grids.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "trainmem/analytic.hpp"
#include "trainmem/backend.hpp"
#include "trainmem/config.hpp"
#include "trainmem/figures.hpp"
#include "trainmem/ledger.hpp"
#include "trainmem/probes.hpp"
#include "trainmem/reconcile.hpp"
#include "trainmem/timeline.hpp"

namespace trainmem {

// ---------------------------------------------------------------- choosing a backend

struct ChosenBackend {
  std::unique_ptr<Backend> backend;
  std::string note;  // why `auto` chose what it chose ("" when the user named the backend)
};
// "auto": cuda when a device is usable, else meta with a note saying why (cpu only when
// asked for). "cuda" without a device: DeviceError with the reason. Unknown: InputError.
ChosenBackend choose_backend(const std::string& name, DType dtype);

// ---------------------------------------------------------------- one run

struct RunRequest {
  ModelConfig model;
  TrainConfig train;
  std::string backend = "auto";  // auto|cuda|cpu|meta
  int steps = 2;                 // figures come from the last
  std::uint64_t seed = 0;
  std::string weights;  // .safetensors, or "" for random weights from `seed`
  std::string tokens;   // raw int32 file, or "" for random tokens from `seed`
  std::string dump;     // --dump FILE.safetensors (first step), or ""
  // --device-budget: the ledger's allocator refuses to go above this many live bytes (a
  // BudgetAllocator), so an out-of-memory can be provoked on any backend.
  std::optional<std::uint64_t> device_budget;
  std::vector<Profile> profiles;  // analytic profiles to attach (native is always computed)
  bool probes = true;             // device probes on cuda
  bool keep_timeline = false;     // build the last step's TimelineData
};

// Why a run stopped early (only out-of-memory is caught; other errors propagate).
struct RunFailure {
  std::string message;
  std::uint64_t requested_bytes = 0;
  std::string category;
  std::string tensor;
  std::uint64_t live_bytes = 0;
  int step = 0;                            // the step that failed (0: setup)
  std::vector<TensorRecord> live_tensors;  // what was alive when it failed, largest first
};

struct RunResult {
  ModelConfig model;
  TrainConfig train;
  std::string backend;       // "cpu", "meta", "cuda"
  std::string backend_note;  // from choose_backend
  bool computes = true;      // false on meta: figures are predicted from the allocation trace
  int steps_requested = 0;
  int steps_done = 0;
  std::uint64_t seed = 0;
  std::string weights, tokens;
  std::optional<std::uint64_t> device_budget;
  std::vector<float> losses;         // per step (NaN on meta)
  std::vector<double> step_seconds;  // per step, wall time including a device synchronise

  // The ledger, for the last step run (DESIGN.md meanings).
  MemoryFigures ledger;
  PeakInfo peak;  // bytes, breakdown, phase, tensor, layer
  std::array<std::uint64_t, kNumPhases> phase_peaks{};
  std::vector<std::uint64_t> activations_by_layer;  // [0] outside the layers, [l+1] layer l
  std::uint64_t events = 0, dropped_events = 0;
  std::vector<TensorRecord> tensors;  // setup and the last step
  std::optional<TimelineData> timeline;

  std::vector<Estimate> estimates;  // native first, then the requested others
  const Estimate& native() const { return estimates.front(); }

  // Device sources (available only on cuda) and their checks against the ledger.
  PoolResult pool;
  CuptiResult cupti;
  MemGetInfoResult memgetinfo;
  std::vector<SourceCheck> device_checks;

  std::optional<RunFailure> failure;

  // Median wall time of the steady-state steps (all but the first; the only one if one ran).
  double steady_step_seconds() const;
  // Activation bytes one layer keeps (layer 0's; every layer keeps the same), 0 if unknown.
  std::uint64_t per_layer_activations() const;
};

// Runs the request: analytic estimates first (they validate the configuration), then the
// backend, ledger, probes and model, `steps` training steps, and the readings. An
// OutOfMemory during setup or a step is caught into `failure` with what was measured so far;
// every other error propagates.
RunResult execute_run(const RunRequest& request);

// ---------------------------------------------------------------- reconciliation

struct ReconciliationRow {
  std::string category;  // params, ..., activations_peak, workspace, inputs, sum, peak
  std::uint64_t measured = 0;
  std::uint64_t analytic = 0;
  std::int64_t difference = 0;  // measured - analytic
  double rel_error = 0;         // difference / analytic (0 when both are 0)
  bool ok = false;              // ledger vs native: exact
  // False when the run ran out of memory: the measured figures stop at the failure (e.g.
  // activations 0 when forward never ended), so the row is shown but not judged (ok false).
  bool judged = true;
};
std::vector<ReconciliationRow> reconcile_ledger_native(const RunResult& r);

// Per-layer activation bytes as each available source sees them (for sweep --fit):
// "ledger" always; "cupti" (its activations peak, checkpointing none only) and "pool" (the
// ledger's figure plus the pool's excess over the ledger in the forward window) on cuda.
// Device figures are spread over the layers after taking out the ledger's bytes outside
// them. Sources that cannot give the figure are listed in `unavailable` with the reason.
struct PerLayerBySource {
  std::map<std::string, double> bytes;
  std::map<std::string, std::string> unavailable;
};
PerLayerBySource per_layer_activations_by_source(const RunResult& r);

// ---------------------------------------------------------------- JSON and text

// The per-run object of DESIGN.md ("JSON output"): schema, model, run, analytic, measured,
// reconciliation, tensors; plus device_checks and, after an out-of-memory, error.
nlohmann::json run_result_json(const RunResult& r);

enum class Colour { off, on };
// Colour for a report written to `output_path` ("" = stdout): on only when it goes to stdout,
// stdout is a terminal and NO_COLOR is not set.
Colour stdout_colour(const std::string& output_path);

// A unit for a table whose largest value is `max_bytes`: GiB from 1 GiB up, else MiB.
struct TableUnit {
  double bytes;
  const char* name;
};
TableUnit table_unit(std::uint64_t max_bytes);
std::string in_unit(std::uint64_t bytes, TableUnit u);  // two decimals

// "llama-7b  b=8 s=512 fp16 adamw  checkpointing=none attention=eager"
std::string run_title(const ModelConfig& m, const TrainConfig& t);
// "backend meta — PREDICTED: allocations traced, no arithmetic (...)" or "backend cpu ...".
std::string backend_line(const RunResult& r);

// profile's terminal report: the reconciliation table, the device sources and overhead, the
// true peak with its breakdown and where it happened, the reference profiles.
std::string profile_text(const RunResult& r, Colour colour);
std::string profile_markdown(const RunResult& r);
std::string profile_csv(const RunResult& r);  // the reconciliation rows, bytes
// The header lines every text report starts with: "## trainmem <command>: <title>", the
// backend line, and the out-of-memory lines when the run failed.
std::string report_header(const std::string& command, const RunResult& r);
// "file.svg" -> "file-<suffix>.svg" (timelines of several runs).
std::string suffixed_path(const std::string& path, const std::string& suffix);

// Finishes a text report: headings are lines starting with "## " (the marker is removed; bold
// when `colour` is on); with colour, a table's "yes" is green and "NO" red. Visible widths
// are unchanged.
std::string colourize(const std::string& text, Colour colour);

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
