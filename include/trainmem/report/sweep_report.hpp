// sweep's report: the grid's runs (one row each) and, with --fit, the fits per source, in every
// format (docs/design.md, "sweep").
#pragma once
#include <optional>
#include <vector>

#include "trainmem/base/config.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/run/run.hpp"
#include "trainmem/run/sweep.hpp"

namespace trainmem::report {

// The report, described once for every format on `w`; `model` and `train` title it (the grid's
// base configuration), `several_models` when the grid varies the model's widths.
void write_sweep(ReportWriter& w, const ModelConfig& model, const TrainConfig& train,
                 const std::vector<RunResult>& runs, bool several_models,
                 const std::optional<SweepFits>& fits);

}  // namespace trainmem::report
