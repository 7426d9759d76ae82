// The ledger's vocabulary: the categories every byte is booked under and the phases of a step
// (docs/design.md). Split from ledger.hpp so the analytic model and the figures can name them
// without reaching the ledger itself.
#pragma once
#include <array>
#include <cstdint>

namespace trainmem {

enum class Category : std::uint8_t {
  params,
  gradients,
  optimizer_states,
  activations,
  workspace,
  inputs,
  communication,  // collective buffers: ZeRO buckets, gathered parameters, pipeline send/recv
};
constexpr int kNumCategories = 7;
const char* category_name(Category c);  // "params", "gradients", ...
constexpr std::array<Category, kNumCategories> all_categories() {
  return {Category::params,       Category::gradients, Category::optimizer_states,
          Category::activations,  Category::workspace, Category::inputs,
          Category::communication};
}

enum class Phase : std::uint8_t { setup, forward, backward, recompute, optimizer };
constexpr int kNumPhases = 5;
const char* phase_name(Phase p);  // "setup", "forward", ...

using CategoryBytes = std::array<std::uint64_t, kNumCategories>;

}  // namespace trainmem
