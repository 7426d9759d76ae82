// Several single-rank runs in a row (include/trainmem/run/series.hpp).
#include "trainmem/run/series.hpp"

#include <spdlog/spdlog.h>

namespace trainmem {

std::vector<RunResult> run_series(const std::vector<RunRequest>& requests,
                                  const SeriesHooks& hooks) {
  std::vector<RunResult> runs;
  runs.reserve(requests.size());
  for (const auto& rq : requests) {
    if (hooks.before) hooks.before(rq);
    runs.push_back(execute_run(rq));
    if (runs.size() == 1 && !runs.front().backend_note.empty())
      spdlog::warn("{}", runs.front().backend_note);
    if (hooks.after) hooks.after(rq, runs.back());
  }
  return runs;
}

}  // namespace trainmem
