// `trainmem estimate --profile hf-eager|hf-sdpa --world-size N --fsdp2`'s report, in every
// format: the HuggingFace step per rank under PyTorch FSDP2 (analytic/hf_step.hpp,
// hf_step_fsdp2_ranks; docs/hf-step.md, "Per rank under FSDP2"): each group of ranks that run the
// same step, its live bytes at the start, its peak with the phase and the categories then, and
// with --allocator what PyTorch's caching allocator would reserve.
#pragma once
#include <string>
#include <vector>

#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/analytic/hf_step.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/run/allocator_model.hpp"

namespace trainmem::report {

struct HfFsdp2Report {
  ModelConfig model;
  TrainConfig train;
  HfOptions hf;
  std::string profile;  // "hf-eager" or "hf-sdpa"
  int world = 2;
  bool reshard_after_forward = true;
  bool precision_defaulted = false;  // --precision not given: pure, as FSDP2 trains
  std::vector<HfStepRankGroup> groups;
  std::vector<AllocatorModelResult> reserved;  // one per group with --allocator, else empty
  Overheads overheads;  // outside the books: the CUDA context, NCCL's buffers
};

void write_hf_fsdp2(ReportWriter& w, const HfFsdp2Report& r);

}  // namespace trainmem::report
