// `trainmem maxbatch`'s run: the largest batch (or sequence) whose step fits a budget, each
// candidate traced on meta (the exact high-water mark of the step's allocations): one GPU's
// step (execute_run) or, for a layout of several, every distinct rank's sharded step
// (trace_layout) with the worst rank kept. The command line resolves the budget and the
// overhead and renders the result.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "trainmem/analytic/analytic.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/base/parallel.hpp"
#include "trainmem/run/allocator_model.hpp"

namespace trainmem {

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

// The search's range: batch up to 2^30, seq up to 2^24 (a step beyond it has no answer).
std::int64_t maxbatch_step_max(bool vary_batch);

struct MaxbatchRequest {
  ModelConfig model;
  TrainConfig train;  // the varied size is replaced by each candidate
  bool vary_batch = true;
  std::int64_t step = 1;  // candidates lowest + k·step
  std::uint64_t budget = 0;
  // One GPU: the bytes no tensor owns (CUDA context, cuBLAS modules, pool slack), stated or
  // measured (measure_cuda_overhead), added to each candidate's peak.
  std::uint64_t overhead = 0;
  // Several GPUs (distributed): the layout (resolved), whose overheads come from
  // estimate_overheads(layout, overheads).
  std::optional<ParallelConfig> layout;
  OverheadOptions overheads;
  // --allocator. One GPU: each candidate runs against a model of PyTorch's caching allocator
  // with budget − overhead as the device; it fits when PyTorch would not raise, and its peak
  // is the reserved peak of the whole run (of the run without the budget, when it does not
  // fit). A layout: each rank's reserved peak without a device limit (its release-and-retry
  // not counted), the worst rank's plus the overheads against the budget.
  std::optional<AllocatorSpec> allocator;
  // --finetune lora|qlora (one GPU, no --allocator): each candidate's peak is the hf-peft
  // profile's (transformers + peft + bitsandbytes; the category maxima added, no transients),
  // since trainmem's own step does not run LoRA yet.
  std::optional<HfOptions> hf_peft;
  // --profile hf-eager|hf-sdpa (transformers 5.25): each candidate's peak is the HF step's
  // event sequence (hf_step.hpp) under hf's recipe; with --allocator what the allocator model
  // reserves for that sequence on a device of budget − overhead. With a layout (FSDP2 over
  // data parallelism, the caller checks it) every distinct rank's step, the worst kept.
  std::optional<Profile> hf_step;
  HfOptions hf;
};

struct MaxbatchResult {
  SearchResult search;
  std::int64_t lowest = 0;        // the first candidate
  std::int64_t next = 0;          // the candidate of search.at_next: best + step, or lowest
  int traced = 0;                 // candidates traced (an overflowing size is not traced)
  Overheads layout_overheads;     // distributed: the per-GPU overheads added
  std::uint64_t added_bytes = 0;  // what was added to each peak (overhead or overheads)
};

// Runs the search. InputError for a request the trace cannot run (e.g. --sp with a step that
// is not a multiple of --tp when the sequence varies).
MaxbatchResult find_max(const MaxbatchRequest& rq);

// The overhead of a GPU run: a short cuda run of a tiny model, the largest cudaMemGetInfo used
// minus the ledger's live bytes over its snapshots (context, cuBLAS handle and modules, pool
// slack, other processes on the device). Error when cudaMemGetInfo is unavailable.
std::uint64_t measure_cuda_overhead(DType dtype);

}  // namespace trainmem
