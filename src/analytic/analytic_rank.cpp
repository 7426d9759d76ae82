// A parallel layout's ranks (include/trainmem/analytic/analytic_rank.hpp): one native stage per
// pipeline stage (analytic_native.cpp: the native profile's general form, of which one GPU is the
// case tp = pp = dp = 1), the worst rank, and the overheads outside the books
// (docs/distributed.md, "Outside the books").
#include "trainmem/analytic/analytic_rank.hpp"

#include <algorithm>

#include "analytic_detail.hpp"
#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {

namespace {

std::uint64_t u(std::int64_t v) {
  return static_cast<std::uint64_t>(v);
}

}  // namespace

std::uint64_t Overheads::total() const {
  return checked_add(cuda_context, nccl, "overheads");
}

Overheads estimate_overheads(const ParallelConfig& layout, const OverheadOptions& opts, bool moe) {
  Overheads o;
  if (opts.host_ranks) {
    o.host_ranks = true;
    o.cuda_context_source = "none: the ranks run on the cpu backend";
    o.nccl_source = "none: the cpu backend's collectives are MPI on host memory";
    return o;
  }
  if (opts.cuda_context) {
    o.cuda_context = *opts.cuda_context;
    o.cuda_context_source = "--cuda-context";
  } else {
    o.cuda_context = kCudaContextBytes;
    o.cuda_context_source =
        "default estimate, 512 MiB (users report 0.3-0.55 GB, more on GPUs with more SMs)";
  }
  if (opts.nccl) {
    o.nccl = *opts.nccl;
    o.nccl_source = "--nccl-memory";
    return o;
  }
  // One communicator per parallel group the rank belongs to (the gradient group of dp·cp ranks,
  // tp, pp, cp's ring, where > 1); each holds
  // NCCL_BUFFSIZE per channel per peer, for its ring/tree peers (2: send and receive side).
  std::uint64_t comms = 0;
  for (std::int64_t deg : {layout.grad_ranks(), layout.tp, layout.pp, layout.cp})
    if (deg > 1) ++comms;
  // Expert parallelism: the ep group's all-to-all, the etp group's gather and scatter (a group
  // of its own even where it holds the tensor-parallel ranks, as Megatron's), and the
  // expert-data-parallel group that sums the experts' gradients (the gradient group itself when
  // ep = etp = tp = 1; under tp a group of its own, the stage's dp·tp·cp/(ep·etp) slots, even at
  // ep 1).
  if (layout.ep > 1) ++comms;
  if (layout.etp > 1) ++comms;
  if ((layout.ep * layout.etp > 1 || (moe && layout.tp > 1)) && layout.edp() > 1) ++comms;
  const std::uint64_t per = checked_mul(checked_mul(opts.nccl_buffsize, u(opts.nccl_channels)), 2);
  o.nccl = checked_mul(comms, per, "NCCL buffers");
  o.nccl_source = std::to_string(comms) + " communicator(s) × " +
                  std::to_string(opts.nccl_channels) + " channels × 2 peers × NCCL_BUFFSIZE " +
                  std::to_string(opts.nccl_buffsize) + " B";
  return o;
}

std::uint64_t LayoutEstimate::worst_total() const {
  return checked_add(ranks.at(static_cast<std::size_t>(worst)).est.figures.peak, overheads.total(),
                     "worst rank");
}

LayoutEstimate estimate_layout(const ModelConfig& model, const TrainConfig& train,
                               const ParallelConfig& layout, const OverheadOptions& overheads) {
  return estimate_layout_of_rank(model, train, layout, 0, overheads);
}

LayoutEstimate estimate_layout_of_rank(const ModelConfig& model, const TrainConfig& train,
                                       const ParallelConfig& layout, std::int64_t grad_rank,
                                       const OverheadOptions& overheads) {
  // A MoE under tensor parallelism: grad_rank is the rank's slot in its stage (the tensor-parallel
  // index too), as ShardedStep's trace takes it.
  const bool by_slot = model.moe() && layout.tp > 1;
  const std::int64_t n = layout.grad_ranks() * (by_slot ? layout.tp : 1);
  if (grad_rank < 0 || grad_rank >= n)
    throw Error("estimate_layout: rank " + std::to_string(grad_rank) + " outside the " +
                (by_slot ? "stage's " : "gradient group of ") + std::to_string(n));
  model.validate();
  train.validate();
  LayoutEstimate out;
  out.layout = layout;
  out.model = model;
  out.train = train;
  out.global_batch = checked_mul(checked_mul(u(train.batch), u(layout.microbatches)), u(layout.dp),
                                 "global batch");
  for (std::int64_t k = 0; k < layout.pp; ++k)
    out.ranks.push_back(analytic_detail::native_stage(model, train, layout, k, grad_rank));
  for (std::size_t n = 1; n < out.ranks.size(); ++n)
    if (out.ranks[n].est.figures.peak > out.ranks[u(out.worst)].est.figures.peak)
      out.worst = static_cast<int>(n);
  out.overheads =
      layout.distributed() ? estimate_overheads(layout, overheads, model.moe()) : Overheads{};
  if (!layout.distributed()) {
    out.overheads.cuda_context =
        overheads.cuda_context ? *overheads.cuda_context : kCudaContextBytes;
    out.overheads.cuda_context_source =
        overheads.cuda_context ? "--cuda-context" : "default estimate";
    out.overheads.nccl_source = "single GPU: no NCCL communicator";
  }
  return out;
}

}  // namespace trainmem
