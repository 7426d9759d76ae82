// estimate's report, described once for every format (--format):
//   table     paper-style memory table in GiB (two decimals), then the explanation if asked;
//   markdown  the same as Markdown tables;
//   csv       the figures in bytes, one row per (optimizer, checkpointing, profile); with
//             --explain instead the per-tensor list, one row per tensor;
//   json      schema "trainmem/1": {"schema", "model", "run", "analytic"} for one
//             (optimizer, checkpointing) pair, {"schema", "runs": [...]} for several;
//   html      one self-contained page: the tables of the text form, the explanation as its
//             worked text.
#pragma once
#include <optional>
#include <vector>

#include "trainmem/analytic/analytic.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/run/allocator_model.hpp"
#include "trainmem/run/timeline.hpp"

namespace trainmem::report {

// The estimates of one (optimizer, checkpointing mode), one per profile in the requested order.
struct EstimateRun {
  TrainConfig train;
  std::vector<Estimate> estimates;
  // --allocator: what PyTorch's caching allocator would reserve for the native step (its meta
  // trace fed to the model).
  std::optional<AllocatorModelResult> allocator_model;
  std::uint64_t traced_peak = 0;  // that trace's peak (== the native profile's)
  // --allocator with hf-eager/hf-sdpa in transformers 5.25: each HF step's event sequence fed
  // to the same model (the state alive when the step begins allocated first, peaks reset at
  // the step's start), by profile name.
  struct HfReplay {
    std::string profile;
    std::uint64_t step_peak = 0;  // the sequence's allocated peak (the profile's Peak)
    AllocatorModelResult model;
  };
  std::vector<HfReplay> hf_allocator;
  // The HTML page: each HF step's timeline (hf-eager/hf-sdpa in transformers 5.25), drawn as
  // the profile page draws the native step's.
  struct HfTimeline {
    std::string profile;
    TimelineData data;
    std::vector<TensorRecord> tensors;
  };
  std::vector<HfTimeline> hf_timelines;
};

// What one `estimate` invocation computed: the model, the configuration as given (the title
// names its optimizer and mode when one run is shown), and the runs.
struct EstimateResult {
  ModelConfig model;
  TrainConfig train;
  std::vector<EstimateRun> runs;
};

// The report on `w`; `explain`: the per-tensor lists and formulas; `paper`: the LOMO paper's
// table beside (the caller checked the configuration is the paper's).
void write_estimate(ReportWriter& w, const EstimateResult& c, bool explain, bool paper);

}  // namespace trainmem::report
