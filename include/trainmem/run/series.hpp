// Several single-rank runs in a row (compare's modes, sweep's grid): the requests run in order,
// each through execute_run, with the caller told before and after each one (its progress bar,
// its timeline file). The caller checks every request (check_run_can_start) before the first
// one runs, so that a bad point late in a long series fails before any work.
#pragma once
#include <functional>
#include <vector>

#include "trainmem/run/run.hpp"

namespace trainmem {

struct SeriesHooks {
  std::function<void(const RunRequest&)> before;                   // may be empty
  std::function<void(const RunRequest&, const RunResult&)> after;  // may be empty
};

// Runs every request; the first run's backend note (why `auto` chose meta) is logged once as a
// warning. Out-of-memory is in each result's `failure`; other errors propagate.
std::vector<RunResult> run_series(const std::vector<RunRequest>& requests,
                                  const SeriesHooks& hooks = {});

}  // namespace trainmem
