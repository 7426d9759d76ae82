// compare's rows for a layout of several GPUs (include/trainmem/run/compare.hpp).
#include "trainmem/run/compare.hpp"

#include "trainmem/base/error.hpp"

namespace trainmem {

std::vector<CompareLayoutRow> compare_rows(const LayoutTrace& none, const LayoutTrace& full) {
  if (none.ranks.size() != full.ranks.size())
    throw Error("compare_rows: the two traces hold different stages");
  std::vector<CompareLayoutRow> rows;
  for (std::size_t k = 0; k < none.ranks.size(); ++k) {
    CompareLayoutRow row;
    row.rank = "stage " + std::to_string(none.ranks[k].stage) + " (" +
               std::to_string(none.analytic.ranks[k].ranks) + " ranks)";
    row.stage = none.ranks[k].stage;
    row.none = none.ranks[k].ledger;
    row.full = full.ranks[k].ledger;
    row.analytic_none = none.analytic.ranks[k].est.figures;
    row.analytic_full = full.analytic.ranks[k].est.figures;
    row.matches = none.ranks[k].matches && full.ranks[k].matches;
    if (none.ranks[k].allocator_model && full.ranks[k].allocator_model) {
      row.reserved_none = none.ranks[k].allocator_model->step.reserved.peak;
      row.reserved_full = full.ranks[k].allocator_model->step.reserved.peak;
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<CompareLayoutRow> compare_rows(const MeasuredLayout& none, const MeasuredLayout& full) {
  if (none.ranks.size() != full.ranks.size())
    throw Error("compare_rows: the two runs hold different ranks");
  std::vector<CompareLayoutRow> rows;
  for (std::size_t r = 0; r < none.ranks.size(); ++r) {
    const MeasuredRank& a = none.ranks[r];
    const MeasuredRank& b = full.ranks[r];
    CompareLayoutRow row;
    row.rank = std::to_string(a.rank);
    row.stage = a.stage;
    row.none = a.ledger;
    row.full = b.ledger;
    row.analytic_none = none.predicted.analytic.ranks[std::size_t(a.stage)].est.figures;
    row.analytic_full = full.predicted.analytic.ranks[std::size_t(b.stage)].est.figures;
    row.matches =
        a.matches() && b.matches() && none.predicted.all_match() && full.predicted.all_match();
    if (a.allocator_modelled && b.allocator_modelled) {
      row.reserved_none = a.allocator_reserved_peak;
      row.reserved_full = b.allocator_reserved_peak;
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace trainmem
