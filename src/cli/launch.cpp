// Multi-rank launches (src/cli/launch.hpp).
#include "launch.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "layout.hpp"
#include "size.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/report/layout_report.hpp"
#include "trainmem/run/run.hpp"
#include "trainmem/run/run_layout.hpp"
#include "trainmem/run/timeline.hpp"

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

// `command` with every "FLAG V" (or "FLAG=V") given `value`; appended when absent and `append`.
std::string with_option(const std::string& command, const std::string& flag,
                        const std::string& value, bool append) {
  std::istringstream in(command);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  std::string out;
  bool seen = false;
  for (std::size_t i = 0; i < words.size(); ++i) {
    std::string w = words[i];
    if (w == flag && i + 1 < words.size()) {
      out += (out.empty() ? "" : " ") + w + " " + value;
      seen = true;
      ++i;
      continue;
    }
    if (w.rfind(flag + "=", 0) == 0) {
      w = flag + "=" + value;
      seen = true;
    }
    out += (out.empty() ? "" : " ") + w;
  }
  if (!seen && append) out += " " + flag + " " + value;
  return out;
}

std::string with_world(const std::string& command, std::int64_t world) {
  return with_option(command, "--world-size", std::to_string(world), false);
}

const char* kScope =
    "Measured multi-rank runs cover data, tensor and pipeline parallelism (--dp with --zero 0-3, "
    "--offload and --microbatches, --tp with or without --sp, --pp with --zero 0 or 1) on the cpu "
    "and cuda backends.";

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
                 "the job ends with an error naming it (default 300; 1 to 604800)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            try {
              std::size_t used = 0;
              const double s = std::stod(v, &used);
              if (used != v.size()) return "'" + v + "' is not a number of seconds";
              check_collective_timeout(s);
            } catch (const InputError& e) {
              // CLI11 names the flag already: "--collective-timeout: must be ...".
              std::string m = e.what();
              const std::string flag = "--collective-timeout ";
              return m.rfind(flag, 0) == 0 ? m.substr(flag.size()) : m;
            } catch (const std::exception&) {
              return "'" + v + "' is not a number of seconds";
            }
            return "";
          },
          "SECONDS"));
  cmd.add_option("--collectives", flags.collectives,
                 "Multi-rank runs on cuda: nccl (default; one GPU per rank) or mpi (the MPI "
                 "collectives through host memory: the cpu backend's bit-reproducible sums, no "
                 "NCCL, ranks may share a GPU). The cpu backend always uses mpi")
      ->check(CLI::IsMember({"nccl", "mpi"}));
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
           kScope;
  if (!launch.under_mpi)
    return what +
           ": a measured multi-rank run is one process per rank started by an MPI launcher, "
           "and this process was not (none of OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK, "
           "SLURM_NTASKS is set). Run instead:\n  mpirun -np " +
           n + " " + command +
           "\n(as root: mpirun --allow-run-as-root ...), or under Slurm:\n  srun -n " + n + " " +
           command + "\n" + kScope;
  return std::nullopt;
}

std::optional<std::string> traced_layout_problem(const RunFlags& run, std::int64_t world,
                                                 const std::string& command) {
  std::string given;
  const std::pair<const char*, const std::string*> flags[] = {
      {"--timeline", &run.timeline},
      {"--dump", &run.dump},
      {"--weights", &run.weights},
      {"--tokens", &run.tokens},
      {"--device-budget", &run.device_budget}};
  for (const auto& [name, value] : flags)
    if (!value->empty()) given += (given.empty() ? "" : ", ") + std::string(name);
  if (given.empty()) return std::nullopt;
  const std::string n = std::to_string(world);
  return given + " with --world-size " + n +
         " on meta: the trace of every rank moves no data, so it takes none of them. They belong "
         "to a measured run, one process per rank: `mpirun -np " +
         n + " " + with_option(command, "--backend", "cpu", true) +
         "` (or --backend cuda: one GPU per rank, or ranks sharing GPUs with --collectives mpi)" +
         (run.dump.empty() ? "" : "; --dump only on a single rank (--world-size 1)");
}

void check_collectives_flag(const LaunchFlags& flags, bool measured) {
  if (!flags.collectives.empty() && !measured)
    throw InputError("--collectives " + flags.collectives +
                     ": it chooses the collectives of a measured multi-rank run (--world-size "
                     "above 1 with --backend cpu or cuda, under mpirun); this run has none");
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

RequestLines rank_request(const Common& c, const RunFlags& run) {
  RequestLines out;
  // The command line: the subcommand, then each flag with its values, sorted by flag (the
  // order flags were typed in does not matter; a flag given on one rank alone does).
  const auto& words = command_words();
  std::vector<std::pair<std::string, std::string>> flags;
  std::string subcommand;
  for (std::size_t k = 1; k < words.size(); ++k) {
    const std::string& w = words[k];
    if (w.rfind("--", 0) == 0) {
      const auto eq = w.find('=');
      if (eq != std::string::npos)
        flags.emplace_back(w.substr(0, eq), w.substr(eq + 1));
      else
        flags.emplace_back(w, "");
    } else if (flags.empty() && subcommand.empty()) {
      subcommand = w;
    } else if (!flags.empty()) {
      flags.back().second += (flags.back().second.empty() ? "" : " ") + w;
    }
  }
  std::stable_sort(flags.begin(), flags.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  out.emplace_back("the subcommand", subcommand);
  for (auto& f : flags) out.push_back(std::move(f));
  // What the flags resolved to where a file stands behind them.
  const ModelConfig& m = c.model;
  std::ostringstream model;
  model << m.family << " V " << m.vocab << " h " << m.hidden << " i " << m.intermediate << " L "
        << m.layers << " a " << m.heads << " k " << m.kv_heads << " d " << m.head_dim()
        << " positions " << m.max_positions << " eps " << m.rms_eps << " theta " << m.rope_theta
        << " tied " << m.tied_embeddings << " qkv_bias " << m.qkv_bias << " qk_norm " << m.qk_norm
        << " window " << m.sliding_window << "/" << m.window_from_layer;
  for (const auto& f : m.features()) model << ", " << f;
  out.emplace_back("--model's configuration", model.str());
  for (const auto& [flag, path] :
       {std::pair<std::string, std::string>{"--weights", run.weights}, {"--tokens", run.tokens}}) {
    if (path.empty()) continue;
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    out.emplace_back(flag + "'s size in bytes", ec ? "unreadable" : std::to_string(size));
  }
  return out;
}

int run_ranked(const Common& c, const RunFlags& run, const ParallelConfig& layout,
               const LaunchFlags& flags, const RankBody& body) {
  const std::string command = command_line();
  if (auto p = launch_problem(detect_launch(), mpi_built(), layout.world, run.backend, command))
    throw InputError(*p);
  if (!run.timeline.empty()) validate_timeline_path(run.timeline);
  check_outputs(c, run);
  RankJob job;
  job.backend = run.backend;
  job.dtype = c.train.dtype;
  job.collectives = flags.collectives;
  job.collective_timeout = flags.collective_timeout;
  job.request = rank_request(c, run);
  job.check_world = [&](const Collective& world) {
    if (auto p = world_size_problem(layout.world, world.size(), command)) throw InputError(*p);
    if (!run.dump.empty())
      throw InputError(
          "--dump is not available with --world-size above 1 (each rank holds a shard of the "
          "gradients); run the single-rank step of the same global batch (--batch dp·M·b, the "
          "same --weights and --tokens) to dump them");
  };
  job.capture = run_captured;
  return run_ranks(job, body);
}

void end_failed_rank(const Common& c, const RunFlags& run, const MeasuredLayout& ml, int rank,
                     const std::string& command) {
  try {
    std::optional<std::uint64_t> budget;
    if (!run.device_budget.empty()) budget = parse_size(run.device_budget, "--device-budget");
    const std::string path = c.output.empty() ? std::string() : rank_path(c.output, rank);
    write_output(path,
                 report::render_failed_rank(ml, budget, command, c.format, stdout_colour(path)));
    if (!path.empty()) spdlog::info("rank {}: wrote the partial report {}", rank, path);
  } catch (const std::exception& e) {
    spdlog::error("rank {}: the partial report was not written: {}", rank, e.what());
  }
  std::rethrow_exception(ml.failure_error);
}

MeasureRequest measure_request(const Common& c, const RunFlags& run, const ParallelConfig& layout,
                               const OverheadOptions& overheads) {
  MeasureRequest rq;
  rq.model = c.model;
  rq.train = c.train;
  rq.layout = layout;
  rq.overheads = overheads;
  rq.overheads.host_ranks = run.backend == "cpu";  // no CUDA context, no NCCL on cpu ranks
  rq.steps = run.steps;
  rq.seed = run.seed;
  rq.keep_timeline = !run.timeline.empty();
  rq.weights = run.weights;
  rq.tokens = run.tokens;
  if (!run.device_budget.empty())
    rq.device_budget = parse_size(run.device_budget, "--device-budget");
  if (!run.allocator.empty()) rq.allocator = parse_allocator(run.allocator);
  return rq;
}

int run_measured_layout(const Common& c, const RunFlags& run, const ParallelConfig& layout,
                        const OverheadOptions& overheads, const LaunchFlags& flags) {
  return run_ranked(c, run, layout, flags, [&](Backend& be, Collective& data, Collective& world) {
    check_layout_request(c, false, false);
    MeasureRequest rq = measure_request(c, run, layout, overheads);
    rq.gather_routing = !run.dump_routing.empty();
    const MeasuredLayout ml = measure_layout_and_timeline(rq, run.timeline, be, data, world);
    if (ml.failure) end_failed_rank(c, run, ml, world.rank(), "profile");
    if (world.rank() == 0) {
      // The routing, then the report: a routing that cannot be written does not keep the
      // report from being written; its error is the exit status afterwards.
      std::optional<std::string> routing_error;
      if (rq.gather_routing) {
        try {
          write_output(
              run.dump_routing,
              layout_routing_json(c.model, c.train, layout, ml.routing, ml.steps).dump(2) + "\n");
        } catch (const InputError& e) {
          routing_error = e.what();
          spdlog::error("the routing was not written: {}", e.what());
        }
      }
      write_output(c.output, report::render_measured_layout(ml, c.format, stdout_colour(c.output)));
      if (routing_error) throw InputError(*routing_error);
    }
    return 0;
  });
}

}  // namespace trainmem::cli
