// The parallel-layout flags (--world-size, --dp, --tp, --pp, --zero, --sp, --microbatches,
// --offload, --reduce-bucket, --overlap-comm, --prefetch, and the overhead estimates
// --cuda-context, --nccl-memory, --nccl-channels) and the per-rank report of `estimate`
// (docs/distributed.md).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "cli.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/base/parallel.hpp"
#include "trainmem/run/compare.hpp"
#include "trainmem/run/maxbatch.hpp"
#include "trainmem/run/run_layout.hpp"

namespace trainmem::cli {

struct LayoutFlags {
  std::int64_t world = 1;
  std::int64_t dp = 0;  // 0: not given (N / (tp·pp))
  std::int64_t tp = 1;
  std::int64_t pp = 1;
  std::string zero = "0";
  bool sp = false;
  std::int64_t microbatches = 1;
  std::string offload = "none";
  std::string reduce_bucket;  // elements; "" = DeepSpeed's 5e8
  bool overlap_comm = false;
  std::int64_t prefetch = 1;
  std::string cuda_context;  // SIZE; "" = the default estimate
  std::string nccl_memory;   // SIZE; "" = the formula
  std::int64_t nccl_channels = 16;
};

void add_layout_flags(CLI::App& cmd, LayoutFlags& flags);
// The layout, resolved against the model and run (InputError naming the flag).
ParallelConfig resolve_layout(const LayoutFlags& flags, const ModelConfig& model,
                              const TrainConfig& train);
OverheadOptions resolve_overheads(const LayoutFlags& flags);

// What the per-rank estimate supports (InputError naming the flag otherwise): one optimizer,
// one checkpointing mode, the native profile, no --explain or --paper.
void check_layout_request(const Common& c, bool explain, bool paper);

// The per-rank report of a layout in the chosen format.
// `title` opens the text and Markdown forms.
std::string render_layout(const LayoutEstimate& le, Format format, report::Colour colour,
                          const std::string& title = "trainmem estimate (PREDICTED, per rank)");
// maxbatch with a layout (find_max's result): the largest micro-batch (or sequence) whose worst
// rank, traced on meta, plus the overheads outside the books fits `budget_bytes`.
std::string render_maxbatch_layout(const Common& c, const ParallelConfig& par,
                                   const MaxbatchResult& m, const std::string& budget_source,
                                   std::uint64_t budget_bytes, bool vary_batch);

// The per-rank trace of `profile --world-size N` (meta) beside the analytic, in the chosen format.
std::string render_layout_trace(const LayoutTrace& lt, Format format, report::Colour colour);
// A measured multi-rank `profile` (rank 0 prints it): every rank's books beside its trace and
// analytic profile, the losses, and the per-rank figures of the layout.
std::string render_measured_layout(const MeasuredLayout& ml, Format format, report::Colour colour);
// The partial report of a measured rank that ran out of memory (ml.failure; ml.ranks holds it
// alone): the layout's per-rank prediction, what failed and what was alive, and the rank's books
// up to the failure beside its stage's trace. `budget`: --device-budget, when given.
// `command`: the subcommand that ran it ("profile", "compare").
std::string render_failed_rank(const MeasuredLayout& ml, const std::optional<std::uint64_t>& budget,
                               const std::string& command, Format format, report::Colour colour);

// `compare --world-size N`: a rank (or, traced, a stage) with checkpointing off and on.
// `source`: "TRACED on meta" or "MEASURED on cpu, 4 ranks over mpi".
std::string render_compare_layout(const LayoutEstimate& le,
                                  const std::vector<CompareLayoutRow>& rows,
                                  const std::string& source, const std::string& backend, int steps,
                                  Format format, report::Colour colour);

}  // namespace trainmem::cli
