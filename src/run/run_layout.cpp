// Tracing a parallel layout rank by rank on meta (include/trainmem/run_layout.hpp).
#include "trainmem/run_layout.hpp"

#include <chrono>

#include "trainmem/ledger.hpp"
#include "trainmem/sharded_step.hpp"

namespace trainmem {

bool LayoutTrace::all_match() const {
  for (const auto& r : ranks)
    if (!r.matches) return false;
  return !ranks.empty();
}

namespace {

void compare(RankTrace& r, const MemoryFigures& want) {
  const MemoryFigures& got = r.ledger;
  auto one = [&](const char* name, std::uint64_t g, std::uint64_t w) {
    if (g != w)
      r.differences.push_back(std::string(name) + ": ledger " + std::to_string(g) + ", analytic " +
                              std::to_string(w));
  };
  one("params", got.params, want.params);
  one("gradients", got.gradients, want.gradients);
  one("optimizer_states", got.optimizer_states, want.optimizer_states);
  one("activations", got.activations, want.activations);
  one("activations_peak", got.activations_peak, want.activations_peak);
  one("workspace", got.workspace, want.workspace);
  one("inputs", got.inputs, want.inputs);
  one("peak", got.peak, want.peak);
  for (Category c : all_categories())
    one((std::string("peak_breakdown.") + category_name(c)).c_str(),
        got.peak_breakdown[static_cast<int>(c)], want.peak_breakdown[static_cast<int>(c)]);
  r.matches = r.differences.empty();
}

}  // namespace

LayoutTrace trace_layout(const ModelConfig& model, const TrainConfig& train,
                         const ParallelConfig& layout, const OverheadOptions& overheads,
                         int steps) {
  LayoutTrace out;
  out.analytic = estimate_layout(model, train, layout, overheads);
  out.steps = steps < 1 ? 1 : steps;
  const auto t0 = std::chrono::steady_clock::now();
  for (const RankEstimate& re : out.analytic.ranks) {
    MetaAllocator alloc;
    Ledger ledger(alloc);
    ShardedStep step(model, train, layout, re.stage, ledger);
    for (int n = 0; n < out.steps; ++n) step.train_step();
    RankTrace r;
    r.stage = re.stage;
    r.ledger = measured_figures(ledger);
    r.communication_peak = ledger.peak(Category::communication);
    r.tensors_at_peak = ledger.peak_live_count();
    compare(r, re.est.figures);
    out.ranks.push_back(std::move(r));
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace trainmem
