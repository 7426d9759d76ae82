// `trainmem compare` for a layout of several GPUs: checkpointing none and full per rank, each
// beside the per-rank analytic profile: one row per pipeline stage when traced on meta, one row
// per rank when measured under MPI.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainmem/base/figures.hpp"
#include "trainmem/run/run_layout.hpp"

namespace trainmem {

struct CompareLayoutRow {
  std::string rank;  // "0", "1", ... (measured) or "stage 0 (all its ranks)" (traced)
  std::int64_t stage = 0;
  MemoryFigures none, full;  // measured or traced
  MemoryFigures analytic_none, analytic_full;
  bool matches = false;  // both modes equal their trace and analytic profile
  // --allocator: each mode's reserved peak under the model (the last step's).
  std::optional<std::uint64_t> reserved_none, reserved_full;
};

// Rows of two traces of one layout (checkpointing none, full), one per stage.
std::vector<CompareLayoutRow> compare_rows(const LayoutTrace& none, const LayoutTrace& full);
// Rows of two measured runs of one layout (checkpointing none, full), one per rank.
std::vector<CompareLayoutRow> compare_rows(const MeasuredLayout& none, const MeasuredLayout& full);

}  // namespace trainmem
