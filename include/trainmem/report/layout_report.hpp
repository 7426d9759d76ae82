// The per-rank reports of a parallel layout (docs/distributed.md), each in the chosen format:
// estimate's (the analytic per rank), profile's (every rank traced on meta, or measured under
// MPI), a measured rank's partial report after an out-of-memory, compare's and maxbatch's.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/base/parallel.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/run/compare.hpp"
#include "trainmem/run/run_layout.hpp"

namespace trainmem::report {

// The per-rank report of a layout in the chosen format.
// `title` opens the text and Markdown forms.
std::string render_layout(const LayoutEstimate& le, Format format, Colour colour,
                          const std::string& title = "trainmem estimate (PREDICTED, per rank)");

// The per-rank trace of `profile --world-size N` (meta) beside the analytic, in the chosen format.
// `title`: the report's first line (estimate --allocator names itself).
std::string render_layout_trace(const LayoutTrace& lt, Format format, Colour colour,
                                const std::string& title =
                                    "trainmem profile (TRACED on meta, "
                                    "per rank)");
// A measured multi-rank `profile` (rank 0 prints it): every rank's books beside its trace and
// analytic profile, the losses, and the per-rank figures of the layout.
std::string render_measured_layout(const MeasuredLayout& ml, Format format, Colour colour);
// The partial report of a measured rank that ran out of memory (ml.failure; ml.ranks holds it
// alone): the layout's per-rank prediction, what failed and what was alive, and the rank's books
// up to the failure beside its stage's trace. `budget`: --device-budget, when given.
// `command`: the subcommand that ran it ("profile", "compare").
std::string render_failed_rank(const MeasuredLayout& ml, const std::optional<std::uint64_t>& budget,
                               const std::string& command, Format format, Colour colour);

// `compare --world-size N`: a rank (or, traced, a stage) without checkpointing and under
// `policy` (its name: "full", "every:2", ...; the rows' `full` figures are its).
// `source`: "TRACED on meta" or "MEASURED on cpu, 4 ranks over mpi".
std::string render_compare_layout(const LayoutEstimate& le,
                                  const std::vector<CompareLayoutRow>& rows,
                                  const std::string& source, const std::string& backend, int steps,
                                  Format format, Colour colour, const std::string& policy = "full");

}  // namespace trainmem::report
