// measured_figures (declared in include/trainmem/ledger/ledger.hpp): the ledger's figures.
#include "trainmem/base/checked.hpp"
#include "trainmem/ledger/ledger.hpp"

namespace trainmem {

MemoryFigures measured_figures(const Ledger& ledger) {
  MemoryFigures f;
  f.params = ledger.live(Category::params);
  f.gradients = ledger.peak(Category::gradients);
  f.optimizer_states = ledger.live(Category::optimizer_states);
  f.activations = ledger.activations_end_of_forward();
  f.activations_peak = ledger.peak(Category::activations);
  f.workspace = ledger.peak(Category::workspace);
  f.inputs = ledger.live(Category::inputs);
  f.sum = checked_add(checked_add(f.params, f.gradients),
                      checked_add(f.optimizer_states, f.activations));
  f.peak = ledger.peak_total().bytes;
  f.peak_breakdown = ledger.peak_total().breakdown;
  return f;
}

}  // namespace trainmem
