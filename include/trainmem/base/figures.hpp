// The memory figures every source reports (analytic profiles, the ledger, device sources),
// with docs/design.md's meaning. All in bytes. Base vocabulary: the ledger's own figures are
// measured_figures (ledger.hpp).
#pragma once
#include <cstdint>

#include "trainmem/base/categories.hpp"

namespace trainmem {

struct MemoryFigures {
  std::uint64_t params = 0;
  std::uint64_t gradients = 0;  // peak of gradient bytes (LOMO: largest single one)
  std::uint64_t optimizer_states = 0;
  std::uint64_t activations = 0;       // alive at the end of forward
  std::uint64_t activations_peak = 0;  // max alive at any instant of the step
  std::uint64_t workspace = 0;         // peak of workspace bytes
  std::uint64_t inputs = 0;
  std::uint64_t sum = 0;           // params + gradients + optimizer_states + activations
  std::uint64_t peak = 0;          // true high-water mark of all live bytes
  CategoryBytes peak_breakdown{};  // per category at the instant of `peak`
};

}  // namespace trainmem
