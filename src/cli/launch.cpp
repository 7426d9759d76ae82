// Multi-rank launches (src/cli/launch.hpp).
#include "launch.hpp"

#include <iostream>
#include <sstream>
#include <vector>

#include "trainmem/error.hpp"

namespace trainmem::cli {
namespace {

std::vector<std::string>& command_words() {
  static std::vector<std::string> words;
  return words;
}

std::string shell_quote(const std::string& w) {
  if (!w.empty() && w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789-_./=:,+@%") == std::string::npos)
    return w;
  std::string q = "'";
  for (char ch : w) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// `command` with every "--world-size N" (or "--world-size=N") replaced by `world`.
std::string with_world(const std::string& command, std::int64_t world) {
  std::istringstream in(command);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  std::string out;
  for (std::size_t i = 0; i < words.size(); ++i) {
    std::string w = words[i];
    if (w == "--world-size" && i + 1 < words.size()) {
      out += (out.empty() ? "" : " ") + w + " " + std::to_string(world);
      ++i;
      continue;
    }
    if (w.rfind("--world-size=", 0) == 0) w = "--world-size=" + std::to_string(world);
    out += (out.empty() ? "" : " ") + w;
  }
  return out;
}

const char* kNotBuilt =
    "The measured sharded step with real data is not built yet: such a launch starts the "
    "ranks, checks them and their collectives, and stops with exit 2 saying so; --backend "
    "meta traces every rank's sharded step now.";

}  // namespace

void set_command_line(int argc, char** argv) {
  auto& words = command_words();
  words.assign(1, "trainmem");
  for (int i = 1; i < argc; ++i) words.push_back(argv[i] ? argv[i] : "");
}

std::string command_line() {
  std::string out;
  for (const auto& w : command_words()) out += (out.empty() ? "" : " ") + shell_quote(w);
  return out.empty() ? "trainmem" : out;
}

void add_launch_flags(CLI::App& cmd, LaunchFlags& flags) {
  cmd.add_option("--collective-timeout", flags.collective_timeout,
                 "Multi-rank runs: seconds a collective may wait for the other ranks before "
                 "the job ends with an error naming it (default 300)")
      ->check(CLI::PositiveNumber);
}

std::optional<std::string> launch_problem(const LaunchInfo& launch, bool with_mpi,
                                          std::int64_t world, const std::string& backend,
                                          const std::string& command) {
  const std::string n = std::to_string(world);
  const std::string what = "--backend " + backend + " --world-size " + n;
  if (!with_mpi)
    return what +
           ": this trainmem was built without MPI (libopenmpi-dev was not found when it was "
           "configured), so it cannot run one process per rank. Install MPI (tools/setup.sh "
           "installs openmpi-bin and libopenmpi-dev), rebuild, and launch with `mpirun -np " +
           n + " " + command + "`; or use --backend meta to trace every rank's sharded step. " +
           kNotBuilt;
  if (!launch.under_mpi)
    return what +
           ": a measured multi-rank run is one process per rank started by an MPI launcher, "
           "and this process was not (none of OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK, "
           "SLURM_NTASKS is set). Run instead:\n  mpirun -np " +
           n + " " + command +
           "\n(as root: mpirun --allow-run-as-root ...), or under Slurm:\n  srun -n " + n + " " +
           command + "\n" + kNotBuilt;
  return std::nullopt;
}

std::optional<std::string> world_size_problem(std::int64_t world, int mpi_size,
                                              const std::string& command) {
  if (world == mpi_size) return std::nullopt;
  const std::string w = std::to_string(world), m = std::to_string(mpi_size);
  return "--world-size " + w + " but the MPI launcher started " + m +
         " process(es), one per rank: run `mpirun -np " + w + " " + command + "` (or srun -n " + w +
         "), or give a layout of " + m + " rank(s): `mpirun -np " + m + " " +
         with_world(command, mpi_size) + "`";
}

int run_measured_layout(const std::string& backend, const ParallelConfig& layout,
                        const LaunchFlags& flags) {
  const std::string command = command_line();
  if (auto p = launch_problem(detect_launch(), mpi_built(), layout.world, backend, command))
    throw InputError(*p);
  // Only now, under a launcher, is MPI initialised (MPI_Init_thread); MPI_Finalize when `world`
  // is destroyed.
  std::unique_ptr<Collective> world = make_mpi_collective(flags.collective_timeout);
  std::unique_ptr<Collective> nccl;  // cuda: the data collectives; `world` stays the bootstrap
  Collective* active = world.get();  // what end_job aborts through (NCCL aborts its comm first)
  const Outcome outcome = run_captured([&]() -> int {
    if (auto p = world_size_problem(layout.world, world->size(), command)) throw InputError(*p);
    if (backend == "cuda") {
      nccl = make_nccl_collective(*world);
      active = nccl.get();
    }
    // Every rank is here and the collectives answer (a peer that never arrives becomes a
    // CollectiveTimeout naming the barrier).
    active->barrier();
    throw InputError("--backend " + backend + " --world-size " + std::to_string(layout.world) +
                     ": the " + std::to_string(active->size()) +
                     " ranks started under MPI and their collectives (" + active->backend() +
                     ") answer, but the measured sharded step with real data is not built yet; "
                     "--backend meta traces every rank's sharded step now");
  });
  const int code = end_job(*active, outcome.code, outcome.message, std::cerr);
  nccl.reset();
  world.reset();  // MPI_Finalize
  return code;
}

}  // namespace trainmem::cli
