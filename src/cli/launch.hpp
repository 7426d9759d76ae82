// Multi-rank launches of the measuring subcommands (docs/distributed.md, "Measured runs"): the
// --collective-timeout flag, the checks that say what to run instead (exit 2), and the ranked
// run that ends the whole job with one rank's message and exit code instead of a hang.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "cli.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/backends/backend.hpp"
#include "trainmem/base/parallel.hpp"
#include "trainmem/comm/collective.hpp"
#include "trainmem/run/ranks.hpp"
#include "trainmem/run/run_layout.hpp"

namespace trainmem::cli {

// The command line of this process (set by run_cli), shell-quoted, "trainmem" first: the
// messages below repeat it with the launcher in front.
void set_command_line(int argc, char** argv);
std::string command_line();

// What run_guarded would print and return, captured instead of printed (cli.cpp): the
// command line's mapping of what a rank's work throws to an exit code (RankJob::capture).
Outcome run_captured(const std::function<int()>& body);

struct LaunchFlags {
  double collective_timeout = kDefaultCollectiveTimeout;  // seconds
  std::string collectives;  // "nccl", "mpi"; "" the backend's own (cuda: nccl, cpu: mpi)
};
void add_launch_flags(CLI::App& cmd, LaunchFlags& flags);

// Why a measured run of `world` ranks on `backend` cannot start in this process, as the message
// of an exit 2 that says what to run instead; nullopt when it can (built with MPI, started by
// an MPI launcher). `command` is this process's command line.
std::optional<std::string> launch_problem(const LaunchInfo& launch, bool with_mpi,
                                          std::int64_t world, const std::string& backend,
                                          const std::string& command);
// The flags of a measured run (--timeline, --dump, --weights, --tokens, --device-budget) given
// to the meta trace of a layout (--world-size above 1, --backend meta or auto): the message of
// the exit 2 that says what runs them instead; nullopt when none is given.
std::optional<std::string> traced_layout_problem(const RunFlags& run, std::int64_t world,
                                                 const std::string& command);
// --collectives outside a measured multi-rank run (`measured` false: one rank, or the meta
// trace): InputError saying where it applies, rather than ignoring it.
void check_collectives_flag(const LaunchFlags& flags, bool measured);
// --world-size against the processes MPI started (nullopt when they agree).
std::optional<std::string> world_size_problem(std::int64_t world, int mpi_size,
                                              const std::string& command);

// `profile --backend cpu|cuda --world-size N`: checks the launch (exit 2 with what to run
// otherwise), starts MPI and the backend's collectives (NCCL on cuda), checks that every rank
// is there, runs every rank's measured sharded step (measure_layout), writes each rank's
// timeline (--timeline, the rank in the name), and rank 0 prints the gathered report; the job
// ends through end_job (one rank's failure is every rank's exit code).
int run_measured_layout(const Common& c, const RunFlags& run, const ParallelConfig& layout,
                        const OverheadOptions& overheads, const LaunchFlags& flags);

// The request this rank was started with, for agree_on_request (collective.hpp): the
// subcommand and every flag of the command line (sorted by flag), the model configuration the
// --model flag resolved to, and the sizes of the --weights and --tokens files.
RequestLines rank_request(const Common& c, const RunFlags& run);

// The launch checks (exit 2 saying what to run instead), then the job itself in the run layer
// (run_ranks: MPI, the request agreed, the collectives, `body`, end_job): the shared frame of
// the measured multi-rank subcommands (profile, compare).
int run_ranked(const Common& c, const RunFlags& run, const ParallelConfig& layout,
               const LaunchFlags& flags, const RankBody& body);
// A rank of a measured job that ran out of memory (ml.failure): writes its partial report
// (render_failed_rank) to --output with its rank in the name (report.json -> report.rank1.json),
// or to stdout without --output, then rethrows its OutOfMemory: exit 3 through end_job.
// A report that cannot be written is logged; the OutOfMemory is still what ends the rank.
[[noreturn]] void end_failed_rank(const Common& c, const RunFlags& run, const MeasuredLayout& ml,
                                  int rank, const std::string& command);
// The measurement of `layout` the flags ask for (steps, seed, timeline).
MeasureRequest measure_request(const Common& c, const RunFlags& run, const ParallelConfig& layout,
                               const OverheadOptions& overheads);

}  // namespace trainmem::cli
