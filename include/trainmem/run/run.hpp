// Running training steps for the measuring subcommands (profile, compare, sweep, maxbatch):
// one code path that picks the backend, runs the steps, reads the ledger and the device
// probes, attaches the analytic profiles and reconciles them. Reports of a run:
// trainmem/report/run_report.hpp.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainmem/analytic/analytic.hpp"
#include "trainmem/backends/backend.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/figures.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/probes/probes.hpp"
#include "trainmem/run/allocator_model.hpp"
#include "trainmem/run/reconcile.hpp"
#include "trainmem/run/routing.hpp"
#include "trainmem/run/timeline.hpp"

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

// --steps' upper bound: a memory measurement needs a few steps; the bound keeps a meta trace's
// run time bounded (each step is traced whole).
constexpr int kMaxSteps = 10000;

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
  // --allocator pytorch[:...]: every allocation is mirrored in a model of PyTorch's caching
  // allocator (allocator_model.hpp); with device_budget, the model decides the out-of-memory
  // (reserved bytes against the budget) in place of the budget allocator.
  std::optional<AllocatorSpec> allocator;
  std::vector<AllocatorSpec> allocator_shadows;  // fed too, for their figures (compare)
  std::vector<Profile> profiles;  // analytic profiles to attach (native is always computed)
  HfOptions hf;                   // the HF profiles' era, PyTorch series, loop, use_cache
  bool probes = true;             // device probes on cuda
  bool keep_timeline = false;     // build the last step's TimelineData
  bool log_failure = true;        // log an out-of-memory as an error (a search's probes: no)
  // A mixture of experts on the meta backend, which routes nothing: the routing the report
  // assumes (--routing FILE, read_routing_file; empty: balanced_routing), and its name.
  Routing given_routing;
  std::string given_routing_source;  // "file PATH"; "" = balanced
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

// The out-of-memory `e` of step `step` (0: setup), with what `ledger` held alive when it
// happened (largest first).
RunFailure failure_of(const OutOfMemory& e, int step, const Ledger& ledger);

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
  std::vector<float> losses;  // per step (NaN on meta)
  // On a backend that computes: the steps (1-based) whose loss was NaN or Inf (a warning was
  // logged; the JSON report writes "non_finite" for them), and the --weights tensors that held
  // NaN or Inf values (LlamaModel::non_finite_weights).
  std::vector<int> non_finite_steps;
  std::vector<std::string> non_finite_weights;
  std::vector<double> step_seconds;  // per step, wall time including a device synchronise

  // The ledger, for the last step run (docs/design.md meanings).
  MemoryFigures ledger;
  PeakInfo peak;  // bytes, breakdown, phase, tensor, layer
  std::array<std::uint64_t, kNumPhases> phase_peaks{};
  std::vector<std::uint64_t> activations_by_layer;  // [0] outside the layers, [l+1] layer l
  // --offload-activations: the host ledger's peak in the last step (the offloaded copies) and the
  // bytes copied device to host and back in it; 0 otherwise.
  std::uint64_t offload_host_peak = 0;
  std::uint64_t offload_transfer_bytes = 0;
  // --optimizer paged-adamw|paged-adamw8bit: the bytes of the managed ledger (the states taken
  // from managed memory at setup; outside the ledger's figures and peak); 0 otherwise.
  std::uint64_t optimizer_states_managed = 0;
  // A mixture of experts on a backend that computes: the tokens each expert received in the last
  // step's forward, layer by layer (LlamaModel::routing; empty otherwise). No byte depends on it
  // (docs/native-plan.md, "Mixture of experts").
  // On meta (which routes nothing): the routing it was given (RunRequest::given_routing, balanced
  // by default), said by routing_source: "measured", "balanced" or "file PATH".
  // Each MoE layer's record; under --capacity-factor `dropped` counts the choices past their
  // expert's capacity.
  Routing routing;
  std::string routing_source;
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

  // --allocator: what PyTorch's caching allocator would reserve for this run's allocations.
  std::optional<AllocatorModelResult> allocator_model;
  std::vector<AllocatorModelResult> allocator_shadows;  // RunRequest::allocator_shadows

  std::optional<RunFailure> failure;

  // Median wall time of the steady-state steps (all but the first; the only one if one ran).
  double steady_step_seconds() const;
  // Activation bytes one layer keeps (layer 0's; with dense layers among MoE ones the first MoE
  // layer's, as the analytic per-layer list), 0 if unknown.
  std::uint64_t per_layer_activations() const;
};

// Runs the request: analytic estimates first (they validate the configuration), then the
// backend, ledger, probes and model, `steps` training steps, and the readings. An
// OutOfMemory during setup or a step is caught into `failure` with what was measured so far;
// every other error propagates.
RunResult execute_run(const RunRequest& request);

// "llama-7b  b=8 s=512 fp16 adamw  checkpointing=none attention=eager"
std::string run_title(const ModelConfig& m, const TrainConfig& t);

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

}  // namespace trainmem
