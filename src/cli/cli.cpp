// The trainmem command line: the app, its subcommands, logging, and the mapping from
// failures to exit codes (0 ok, 2 bad input, 3 out of memory, 1 anything else).
#include "cli.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>

#include "launch.hpp"
#include "trainmem/base/error.hpp"

#ifndef TRAINMEM_VERSION
#define TRAINMEM_VERSION "unknown"
#endif

namespace trainmem::cli {
namespace {

// Logs go to stderr so that stdout carries only the report. Reset on every run_cli call
// (tests call it many times in one process).
void setup_logging() {
  // Colours and line clearing only on the user's terminal (not in a file, a pipe, or a rank's
  // output that mpirun forwards).
  const bool terminal = user_terminal(STDERR_FILENO) && !std::getenv("NO_COLOR");
  std::shared_ptr<spdlog::sinks::sink> sink;
  if (terminal)
    sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  else
    sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("trainmem", sink);
  // On a terminal a log line first clears the line it lands on: a progress bar may be drawn
  // there (sweep, compare), and the message would otherwise be glued to its end.
  logger->set_pattern(terminal ? "\r\033[Ktrainmem: [%l] %v" : "trainmem: [%l] %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::info);
}

int run_cli_throwing(int argc, char** argv) {
  CLI::App app{
      "trainmem measures where the GPU memory of an LLM training step goes: params, gradients,\n"
      "optimizer states, activations, workspace, tensor by tensor, measured and derived.",
      "trainmem"};
  app.set_version_flag("--version", std::string("trainmem ") + TRAINMEM_VERSION);
  std::string log_level = "info";
  add_log_level_flag(app, log_level);
  app.footer(
      "Exit codes: 0 success, 2 bad input, 3 out of memory, 1 anything else.\n"
      "Run `trainmem SUBCOMMAND --help` for the flags of a subcommand.");

  std::map<const CLI::App*, Runner> runners;
  auto add = [&](Runner (*reg)(CLI::App&)) {
    Runner r = reg(app);
    auto subs = app.get_subcommands([](CLI::App*) { return true; });
    if (!subs.empty()) runners[subs.back()] = std::move(r);
  };
  add(register_estimate);
  add(register_profile);
  add(register_compare);
  add(register_sweep);
  add(register_maxbatch);
  add(register_diff);
  add(register_plan);
  add(register_replay);
  app.require_subcommand(0, 1);
  // CLI11's parse errors in the same form as ours, pointing at the help of the subcommand
  // that was being parsed (which lists each flag's allowed values).
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    std::string help = "trainmem --help";
    const auto subs = a->get_subcommands();
    if (!subs.empty()) help = "trainmem " + subs.front()->get_name() + " --help";
    return "trainmem: error: " + std::string(e.what()) + "\nRun `" + help +
           "` for the flags and their allowed values.\n";
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0; they print to stdout.
    const int code = app.exit(e, std::cout, std::cerr);
    return code == 0 ? 0 : 2;
  }

  const auto chosen = app.get_subcommands();
  if (chosen.empty()) {
    std::cerr << app.help() << "trainmem: a subcommand is required\n";
    return 2;
  }
  const auto it = runners.find(chosen.front());
  if (it == runners.end() || !it->second) {
    std::cerr << "trainmem: subcommand " << chosen.front()->get_name() << " has no runner\n";
    return 1;
  }
  return it->second();
}

}  // namespace

namespace {

// run_guarded, writing the message to `err`.
int run_guarded_to(const std::function<int()>& body, std::ostream& err) {
  try {
    return body();
  } catch (const OutOfMemory& e) {
    err << "trainmem: " << e.what() << "\n";
    return 3;
  } catch (const OverflowError& e) {
    err << "trainmem: error: " << e.what()
        << " (the sizes of this --model, --batch and --seq do not fit 64-bit byte "
           "counts; choose smaller values)\n";
    return 2;
  } catch (const InputError& e) {
    err << "trainmem: error: " << e.what() << "\n";
    return 2;
  } catch (const CLI::Error& e) {  // a subcommand parsing something itself
    err << "trainmem: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    err << "trainmem: error: " << e.what() << "\n";
    return 1;
  } catch (...) {
    err << "trainmem: error: unknown exception\n";
    return 1;
  }
}

}  // namespace

int run_guarded(const std::function<int()>& body) {
  return run_guarded_to(body, std::cerr);
}

Outcome run_captured(const std::function<int()>& body) {
  std::ostringstream err;
  const int code = run_guarded_to(body, err);
  return {code, err.str()};
}

int run_cli(int argc, char** argv) {
  set_command_line(argc, argv);
  auto body = [&] {
    setup_logging();
    return run_cli_throwing(argc, argv);
  };
  // A measured multi-rank command (--backend cpu|cuda, --world-size above 1) under an MPI
  // launcher: every rank starts MPI when it gets that far, so an error found before the ranks
  // met (a bad flag, a bad value, a missing file) can go through the end-of-job agreement too:
  // when every rank has the same one, rank 0 alone prints it; a rank that alone has it prints it
  // with its rank. (Other commands never start MPI: a rank failing alone there would wait for
  // its peers in MPI_Init, so they print as without a launcher.) Errors after the ranks met were
  // handled there (end_job).
  auto value_of = [&](const std::string& flag) {
    std::string v;
    for (int k = 1; k < argc; ++k) {
      const std::string a = argv[k];
      if (a == flag && k + 1 < argc) v = argv[k + 1];
      if (a.rfind(flag + "=", 0) == 0) v = a.substr(flag.size() + 1);
    }
    return v;
  };
  const std::string world = value_of("--world-size"), backend = value_of("--backend");
  const bool measured = !world.empty() && world != "1" && (backend == "cpu" || backend == "cuda");
  if (!measured || !detect_launch().under_mpi || !mpi_built()) return run_guarded(body);
  const Outcome outcome = run_captured(body);
  if (outcome.message.empty() || mpi_started()) {
    std::cerr << outcome.message;
    return outcome.code;
  }
  try {
    std::unique_ptr<Collective> world = make_mpi_collective(kDefaultCollectiveTimeout);
    const int code = end_job(*world, outcome.code, outcome.message, std::cerr);
    world.reset();
    return code;
  } catch (const std::exception&) {
    std::cerr << outcome.message;
    return outcome.code;
  }
}

}  // namespace trainmem::cli
