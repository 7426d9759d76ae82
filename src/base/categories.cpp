// The names of the ledger's vocabulary (include/trainmem/base/categories.hpp): base, so that every
// layer that names a category or phase (reports, the analytic model) needs no ledger.
#include "trainmem/base/categories.hpp"

namespace trainmem {

const char* category_name(Category c) {
  switch (c) {
    case Category::params:
      return "params";
    case Category::gradients:
      return "gradients";
    case Category::optimizer_states:
      return "optimizer_states";
    case Category::activations:
      return "activations";
    case Category::workspace:
      return "workspace";
    case Category::inputs:
      return "inputs";
    case Category::communication:
      return "communication";
  }
  return "?";
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::setup:
      return "setup";
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::recompute:
      return "recompute";
    case Phase::optimizer:
      return "optimizer";
  }
  return "?";
}

}  // namespace trainmem
