// sweep's fits (include/trainmem/run/sweep.hpp): the per-layer activation bytes of every
// source over the grid, least-squares fitted, beside the analytic native coefficients.
#include "trainmem/run/sweep.hpp"

#include <algorithm>

namespace trainmem {
namespace {

FitSample sample_of(const RunResult& r, double bytes) {
  return FitSample{r.train.batch,        r.train.seq,   r.model.hidden,
                   r.model.intermediate, r.model.heads, bytes};
}

// The analytic coefficients a fit of this kind reports, from the native profile of `r`.
std::map<std::string, double> analytic_coefficients(const RunResult& r, FitTerms terms) {
  const Coefficients& c = r.native().activations.per_layer;
  std::map<std::string, double> sep = {
      {"sbh", c.sbh}, {"sbi", c.sbi}, {"as2b", c.as2b}, {"sb", c.sb}};
  if (terms == FitTerms::separate) return sep;
  auto folded = fold_coefficients_one_model(sep, r.model.hidden, r.model.intermediate);
  // Bytes that fit no monomial (flash attention's (b,a,s) fp32 log-sum-exp) are ∝ s·b for
  // one model, so they fold into sbh as well.
  const double sbh = double(r.train.seq) * double(r.train.batch) * double(r.model.hidden);
  folded["sbh"] += double(c.other_bytes) / sbh;
  return folded;
}

}  // namespace

SweepFits fit_sources(const std::vector<RunResult>& runs, FitTerms terms) {
  SweepFits out;
  out.terms = terms;
  std::map<std::string, std::vector<FitSample>> samples;
  for (const auto& r : runs) {
    const PerLayerBySource by = per_layer_activations_by_source(r);
    for (const auto& [src, bytes] : by.bytes) samples[src].push_back(sample_of(r, bytes));
    for (const auto& [src, why] : by.unavailable) out.unavailable[src] = why;
  }
  const auto analytic = analytic_coefficients(runs.front(), terms);
  for (const auto& r : runs)
    if (analytic_coefficients(r, terms) != analytic) {
      out.notes.push_back(
          "the analytic coefficients differ between grid points (e.g. flash attention's "
          "log-sum-exp over several widths); `analytic` shows the first point's");
      break;
    }
  for (auto& [src, xs] : samples) {
    if (xs.size() != runs.size()) {
      out.unavailable[src] = "not every run gave the figure";
      continue;
    }
    out.unavailable.erase(src);
    out.fits.push_back({src, fit_activation_coefficients(xs, terms), analytic});
  }
  // ledger first, then device sources by name
  std::stable_sort(out.fits.begin(), out.fits.end(), [](const SourceFit& a, const SourceFit& b) {
    return (a.source != "ledger") < (b.source != "ledger");
  });
  return out;
}

}  // namespace trainmem
