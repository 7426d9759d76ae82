// A parallel layout traced rank by rank on the meta backend (ShardedStep, sharded_step.hpp)
// beside the per-rank analytic profile (analytic_rank.hpp): for each distinct rank (pipeline
// stage) the ledger's figures of the steady-state step, and whether each equals the closed form.
#pragma once
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/backends/backend.hpp"
#include "trainmem/base/figures.hpp"
#include "trainmem/comm/collective.hpp"
#include "trainmem/probes/probes.hpp"
#include "trainmem/run/routing.hpp"
#include "trainmem/run/run.hpp"
#include "trainmem/run/timeline.hpp"

namespace trainmem {

struct RankTrace {
  std::int64_t stage = 0;
  MemoryFigures ledger;                  // measured_figures after the last step
  std::uint64_t communication_peak = 0;  // the ledger's peak of the communication category
  std::size_t tensors_at_peak = 0;       // allocations alive at the total peak
  bool matches = false;                  // every figure and the peak breakdown equal the analytic
  std::vector<std::string> differences;  // "activations_peak: ledger X, analytic Y"
  // --allocator: the rank's allocations fed to the model of PyTorch's allocator (no device
  // limit: what it would reserve, not whether it would run out).
  std::optional<AllocatorModelResult> allocator_model;
};

// A mixture of experts under a given routing (trace_given_routing): the ranks whose experts
// receive the same rows in every (micro-batch, MoE layer) share one trace, given those rows.
struct RoutedRankTrace {
  std::vector<std::int64_t> ranks;  // global ranks, ascending
  std::int64_t stage = 0;
  std::int64_t ep_index = 0;
  std::int64_t max_rows = 0;       // the most rows its experts receive in one layer's dispatch
  std::int64_t balanced_rows = 0;  // the same under balanced routing
  MemoryFigures ledger;
  std::uint64_t communication_peak = 0;
  // The model states (params, gradients, optimizer states, inputs) against its stage's analytic
  // profile, which assumes balanced routing and so is not compared on the rest.
  std::vector<std::string> analytic_differences;
};

struct LayoutTrace {
  LayoutEstimate analytic;
  std::vector<RankTrace> ranks;  // one per analytic rank, same order
  int steps = 0;
  double seconds = 0;  // wall time of the traces
  // --routing FILE: every rank traced given it (the ranks above stay balanced routing's).
  std::string routing_source;
  std::vector<RoutedRankTrace> routed;
  bool all_match() const;
};

// Traces `steps` (>= 1) steps of every distinct rank of `layout` (resolved) on meta; with
// `allocator`, each rank's allocations are also fed to that model (RankTrace::allocator_model).
// Under per-parameter sharding the ranks of a stage differ in their optimizer states: the trace
// and its analytic are of gradient-group rank `grad_rank` (0 owns the most rows).
LayoutTrace trace_layout(const ModelConfig& model, const TrainConfig& train,
                         const ParallelConfig& layout, const OverheadOptions& overheads, int steps,
                         const std::optional<AllocatorSpec>& allocator = std::nullopt,
                         std::int64_t grad_rank = 0);

// A mixture of experts: every rank of `lt`'s layout traced given `routing` (expert_rows_of),
// into lt.routed; the same number of steps as lt's.
void trace_given_routing(LayoutTrace& lt, const LayoutRouting& routing);

// ---- measured multi-rank runs (docs/distributed.md, "Measured runs")

// One rank's measured figures, as every rank receives them.
struct MeasuredRank {
  int rank = 0;
  std::int64_t stage = 0;
  MemoryFigures ledger;  // measured_figures after the last step
  std::uint64_t communication_peak = 0;
  std::uint64_t tensors_at_peak = 0;
  double step_seconds = 0;  // the rank's median step
  // cuda: the device sources over the last step (cudaMemGetInfo's sampler: total - free at its
  // highest; the memory pool's used high-water mark), when available.
  std::uint64_t host_bytes = 0;  // --offload: what the rank keeps in host memory
  bool device_sources = false;
  std::uint64_t device_used_peak = 0;
  std::uint64_t pool_used_peak = 0;
  // --allocator: the rank's allocations fed to the model (its device: --device-budget), the
  // last step's allocated and reserved peaks and the whole run's reserved peak.
  bool allocator_modelled = false;
  std::uint64_t allocator_allocated_peak = 0, allocator_reserved_peak = 0;
  std::uint64_t allocator_run_reserved_peak = 0;
  // Expert parallelism: the rank's books depend on the routing it measured, so its meta trace is
  // one the rank ran itself given the rows its experts received (ShardedStep::set_expert_rows),
  // and the analytic (balanced routing) is compared on the model states only (params,
  // gradients, optimizer states, inputs).
  bool routed = false;
  MemoryFigures routed_trace;
  std::vector<std::string> trace_differences;     // against its stage's meta trace
  std::vector<std::string> analytic_differences;  // against its stage's analytic profile
  bool matches() const { return trace_differences.empty() && analytic_differences.empty(); }
};

struct MeasuredLayout {
  LayoutTrace predicted;            // every distinct rank traced on meta beside the analytic
  std::vector<MeasuredRank> ranks;  // every rank of the job, in rank order
  std::vector<float> losses;        // per step, the global batch's mean loss
  std::string backend;              // "cpu", "cuda"
  std::string collective;           // "mpi", "nccl", "local"
  int steps = 0;
  std::uint64_t seed = 0;
  std::optional<TimelineData> timeline;  // this rank's last step, when asked for
  std::string device_reason;             // cuda: why this rank's device sources are missing
  // This rank ran out of memory (--device-budget, or the device): `ranks` holds this rank alone,
  // its books up to the failure (nothing was gathered: the other ranks may be waiting in a
  // collective it left), `failure` what failed and what was alive, `failure_error` the
  // OutOfMemory itself, to rethrow once the partial report is written.
  std::optional<RunFailure> failure;
  std::exception_ptr failure_error;
  // The failed rank's groups, held until failure_error is rethrown: destroyed while it unwinds,
  // they abandon their pending sends instead of waiting the collective timeout for peers that
  // may never receive.
  std::vector<std::shared_ptr<Collective>> held_groups;
  // Where the weights and the global batch came from: --weights / --tokens, or "" (--seed).
  std::string weights, tokens;
  // MeasureRequest::gather_routing: every rank's choices in the last step (source "measured").
  LayoutRouting routing;
  bool all_match() const;
};

struct MeasureRequest {
  ModelConfig model;
  TrainConfig train;
  ParallelConfig layout;  // resolved; dp = the collectives' size
  OverheadOptions overheads;
  int steps = 2;
  std::uint64_t seed = 0;
  bool keep_timeline = false;
  // --device-budget: each rank's allocator refuses to go above it (OutOfMemory, exit 3).
  std::optional<std::uint64_t> device_budget;
  // --allocator: each rank mirrored in a model of PyTorch's allocator, which then decides the
  // out-of-memory under device_budget (as on one GPU); the meta traces are fed one too.
  std::optional<AllocatorSpec> allocator;
  // --weights (a safetensors file of the whole model, or one shard of an HF checkpoint) and
  // --tokens (the global batch: dp·M·b rows of seq int32 ids); empty: random of `seed`.
  std::string weights, tokens;
  // A mixture of experts: gather every rank's routing of the last step (--dump-routing).
  bool gather_routing = false;
};

// Runs this rank's sharded step (ShardedStep with a ShardedExecution) `steps` times on `backend`
// with `data` (every rank of the job on the backend's buffers) and `host` (the same ranks on
// host buffers), split into the layout's data- and tensor-parallel groups in Megatron's order
// (rank = (stage·dp + dp index)·tp + tp index), then gathers every rank's figures over `host`:
// every rank returns the whole job's. Every rank must call it. InputError for a layout the
// measured step does not run. An OutOfMemory of this rank is caught into `failure` (no gather).
MeasuredLayout measure_layout(const MeasureRequest& rq, Backend& backend, Collective& data,
                              Collective& host);

// `path` with ".rank<R>" before its extension (t.json -> t.rank1.json): one timeline per rank.
std::string rank_path(const std::string& path, int rank);

// measure_layout, then this rank's timeline (rq.keep_timeline) written to rank_path(timeline,
// rank). A timeline that cannot be written is an error, except after this rank ran out of
// memory: then it is logged and `failure` stays what ends the rank.
MeasuredLayout measure_layout_and_timeline(const MeasureRequest& rq, const std::string& timeline,
                                           Backend& backend, Collective& data, Collective& host);

}  // namespace trainmem
