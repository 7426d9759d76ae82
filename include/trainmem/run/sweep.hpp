// sweep's fits over its grid of runs: per source (the ledger; cupti and pool on cuda) the
// per-layer activation bytes of every run, least-squares fitted to the coefficients a grid can
// identify (include/trainmem/run/fit.hpp), beside the analytic native profile's.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "trainmem/run/fit.hpp"
#include "trainmem/run/run.hpp"

namespace trainmem {

struct SourceFit {
  std::string source;
  FitResult fit;
  std::map<std::string, double> analytic;
};

struct SweepFits {
  FitTerms terms = FitTerms::one_model;
  std::vector<SourceFit> fits;
  std::map<std::string, std::string> unavailable;
  std::vector<std::string> notes;
};

// The fits of `runs` (every run completed, the grid checked to identify `terms`); sources that
// cannot give the figure for every run are in `unavailable` with the reason.
SweepFits fit_sources(const std::vector<RunResult>& runs, FitTerms terms);

}  // namespace trainmem
