// trainmem replay — a sequence of allocations and frees through a model of PyTorch's CUDA
// caching allocator (include/trainmem/analytic/caching_allocator.hpp; docs/allocator.md): what
// memory_allocated and memory_reserved would show, the segments, and the out-of-memory PyTorch
// would raise under --budget (exit 3, after the report).
#include <memory>

#include "cli.hpp"
#include "size.hpp"
#include "trainmem/analytic/caching_allocator.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/input_file.hpp"
#include "trainmem/report/replay_report.hpp"

namespace trainmem::cli {
namespace {

struct ReplayFlags {
  std::string events;
  std::string allocator = "pytorch";
  std::string budget;
  std::string format = "table";
  std::string output;
  std::string log_level = "info";
};

int run_replay(const ReplayFlags& f) {
  const Format format = parse_format(f.format);
  CachingAllocatorConfig config = parse_allocator_spec(f.allocator);
  std::string budget_source;
  if (!f.budget.empty()) {
    config.device_bytes = parse_size(f.budget, "--budget");
    budget_source = "--budget " + f.budget;
  }
  const std::vector<AllocEvent> events =
      parse_alloc_events(read_input_file(f.events, "the events file", kMaxEventsBytes), f.events);
  const ReplayResult r = replay(events, config);
  const auto w = report::make_writer(format, stdout_colour(f.output));
  report::write_replay(*w, r, f.events, budget_source);
  write_output(f.output, w->str());
  return r.oom ? 3 : 0;
}

}  // namespace

Runner register_replay(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "replay",
      "What PyTorch's CUDA caching allocator would reserve for a sequence of allocations and "
      "frees (a model of it, no GPU): allocated, reserved, segments, out-of-memory");
  auto f = std::make_shared<ReplayFlags>();
  cmd->add_option("EVENTS", f->events,
                  "A JSON file: [{\"op\": \"alloc\"|\"free\", \"id\": N, \"bytes\": N, "
                  "\"stream\": N}, ...] (or {\"events\": [...]})")
      ->required();
  cmd->add_option("--allocator", f->allocator,
                  "pytorch[:expandable_segments=false,max_split_size_mb=N,"
                  "max_non_split_rounding_mb=N,roundup_power2_divisions=N] "
                  "(PYTORCH_CUDA_ALLOC_CONF's keys)")
      ->capture_default_str();
  cmd->add_option("--budget", f->budget,
                  "The device's memory, a SIZE (80GiB, 24GB): an allocation that cannot fit "
                  "after freeing the cache is PyTorch's out-of-memory (exit 3)");
  cmd->add_option("--format", f->format, "table|json|csv|markdown|html")->capture_default_str();
  cmd->add_option("--output", f->output, "Write the report to FILE instead of stdout");
  add_log_level_flag(*cmd, f->log_level);
  cmd->footer(
      "Example:\n"
      "  trainmem replay events.json --budget 24GiB --allocator "
      "pytorch:max_split_size_mb=128\n"
      "The rules modelled, and what is not: docs/allocator.md.");
  return [f] { return run_replay(*f); };
}

}  // namespace trainmem::cli
