// The parallel-layout flags (--world-size, --dp, --tp, --pp, --cp, --ep, --etp, --zero, --sp,
// --microbatches,
// --offload, --reduce-bucket, --overlap-comm, --prefetch, --sharding, --fsdp2, and the overhead
// estimates
// --cuda-context, --nccl-memory, --nccl-channels), resolved into a ParallelConfig
// (docs/distributed.md); the per-rank reports are report/layout_report.hpp's.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "cli.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/base/parallel.hpp"

namespace trainmem::cli {

struct LayoutFlags {
  std::int64_t world = 1;
  std::int64_t dp = 0;  // 0: not given (N / (tp·pp))
  std::int64_t tp = 1;
  std::int64_t pp = 1;
  std::int64_t cp = 1;
  std::int64_t ep = 1;   // --ep: expert-parallel degree
  std::int64_t etp = 1;  // --etp: expert tensor-parallel degree
  std::string zero = "0";
  bool sp = false;
  std::int64_t microbatches = 1;
  std::string offload = "none";
  std::string reduce_bucket;  // elements; "" = DeepSpeed's 5e8
  bool overlap_comm = false;
  std::int64_t prefetch = 1;
  std::string sharding;      // flat | per-parameter; "" = flat, or per-parameter under --fsdp2
  bool fsdp2 = false;        // --fsdp2: --sharding per-parameter --zero 3
  std::string cuda_context;  // SIZE; "" = the default estimate
  std::string nccl_memory;   // SIZE; "" = the formula
  std::int64_t nccl_channels = 16;
};

void add_layout_flags(CLI::App& cmd, LayoutFlags& flags);
// The layout, resolved against the model and run (InputError naming the flag).
ParallelConfig resolve_layout(const LayoutFlags& flags, const ModelConfig& model,
                              const TrainConfig& train);
OverheadOptions resolve_overheads(const LayoutFlags& flags);
// --sharding and --fsdp2 (flat when neither is given): InputError naming the flag for a value
// other than flat or per-parameter, or --fsdp2 beside --sharding flat.
Sharding resolve_sharding(const std::string& sharding, bool fsdp2);

// What the per-rank estimate supports (InputError naming the flag otherwise): one optimizer,
// one checkpointing policy (a list where the command searches each: `policy_list`), the native
// profile, no --explain or --paper.
// The HF step per rank (--profile hf-eager|hf-sdpa with --world-size) is modelled under PyTorch
// FSDP2 over data parallelism alone: InputError naming the flags otherwise.
void check_hf_fsdp2_layout(const std::string& profile, const ParallelConfig& par);
void check_layout_request(const Common& c, bool explain, bool paper, bool policy_list = false);

}  // namespace trainmem::cli
