// The trainmem command line: the app, its subcommands, logging, and the mapping from
// failures to exit codes (0 ok, 2 bad input, 3 out of memory, 1 anything else).
#include "cli.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <iostream>
#include <map>
#include <sstream>

#include "launch.hpp"
#include "trainmem/error.hpp"

#ifndef TRAINMEM_VERSION
#define TRAINMEM_VERSION "unknown"
#endif

namespace trainmem::cli {
namespace {

// Logs go to stderr so that stdout carries only the report. Reset on every run_cli call
// (tests call it many times in one process).
void setup_logging() {
  auto logger = std::make_shared<spdlog::logger>(
      "trainmem", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  // On a terminal a log line first clears the line it lands on: a progress bar may be drawn
  // there (sweep, compare), and the message would otherwise be glued to its end.
  logger->set_pattern(isatty(STDERR_FILENO) == 1 ? "\r\033[Ktrainmem: [%l] %v"
                                                 : "trainmem: [%l] %v");
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
  return run_guarded([&] {
    setup_logging();
    return run_cli_throwing(argc, argv);
  });
}

}  // namespace trainmem::cli
