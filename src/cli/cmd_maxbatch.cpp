// trainmem maxbatch — the largest batch (or, with --vary seq, the longest sequence) whose
// training step fits a memory budget. Each candidate is traced on the meta backend, whose
// peak is the exact high-water mark of the step's allocations (the same bytes a GPU run
// allocates); the overhead no tensor owns (CUDA context, cuBLAS modules, pool slack) is added
// on top: measured on the GPU when one is usable, else stated with --overhead (default 0).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.hpp"
#include "layout.hpp"
#include "size.hpp"
#include "trainmem/backends/backend.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/report/layout_report.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/run/maxbatch.hpp"

namespace trainmem::cli {
namespace {

using nlohmann::json;

struct MaxbatchFlags {
  CommonFlags common;
  std::string budget;
  std::string vary = "batch";
  std::string overhead = "auto";
  std::int64_t step = 1;
  LayoutFlags layout;
};

struct Budget {
  std::uint64_t bytes = 0;
  std::string source;  // "--budget 80GiB" or "device: total memory of ..."
};

// The device's total memory, from cudaMemGetInfo (needs a usable device).
Budget device_budget() {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty())
    throw InputError("--budget device: no usable CUDA device (" + why +
                     "); give a size instead, e.g. --budget 80GiB");
  std::string reason;
  const std::uint64_t total = cuda_device_total_bytes(&reason);
  if (total == 0)
    throw InputError("--budget device: cudaMemGetInfo unavailable (" + reason +
                     "); give a size instead, e.g. --budget 80GiB");
  return {total, "device: total memory reported by cudaMemGetInfo"};
}

struct Overhead {
  std::uint64_t bytes = 0;
  std::string source;
};

Overhead measure_overhead(DType dtype) {
  return {measure_cuda_overhead(dtype),
          "measured on the GPU: cudaMemGetInfo used − ledger live in a tiny cuda run"};
}

Overhead resolve_overhead(const std::string& flag, DType dtype) {
  if (flag == "auto") {
    if (!cuda_unavailable_reason().empty())
      return {0,
              "stated: 0 (no usable CUDA device to measure it; a GPU run adds the CUDA "
              "context, cuBLAS modules and pool slack, typically 0.5-1 GiB: pass --overhead)"};
    return measure_overhead(dtype);
  }
  if (flag == "measure") {
    const std::string why = cuda_unavailable_reason();
    if (!why.empty())
      throw InputError("--overhead measure: no usable CUDA device (" + why +
                       "); state it instead, e.g. --overhead 1GiB, or use --overhead auto");
    return measure_overhead(dtype);
  }
  return {parse_size(flag, "--overhead"), "stated with --overhead " + flag};
}

int run_maxbatch(const MaxbatchFlags& flags) {
  if (flags.vary != "batch" && flags.vary != "seq")
    throw InputError("--vary: unknown '" + flags.vary + "'; allowed: batch, seq");
  // With --vary seq the --seq flag plays no part (nor its warning past the model's
  // positions): validate the rest at the shortest sequence.
  CommonFlags common = flags.common;
  if (flags.vary == "seq") common.seq = 2;
  const Common c = resolve_common(common, false, false);
  if (flags.budget.empty())
    throw InputError("--budget is required: a SIZE (80GiB, 24GB, 512MiB) or 'device'");
  const std::int64_t step_max = maxbatch_step_max(flags.vary == "batch");
  if (flags.step < 1 || flags.step > step_max)
    throw InputError("--step must be between 1 and " + std::to_string(step_max) + " for --vary " +
                     flags.vary + ", got " + std::to_string(flags.step));
  const Budget budget = flags.budget == "device" ? device_budget()
                                                 : Budget{parse_size(flags.budget, "--budget"),
                                                          "--budget " + flags.budget};
  const bool vary_batch = flags.vary == "batch";
  // The layout flags are checked as every subcommand checks them (--tp 2 or --zero 3 without
  // --world-size is refused here as by estimate, never silently ignored).
  const ParallelConfig par = resolve_layout(flags.layout, c.model, c.train);
  MaxbatchRequest rq;
  rq.model = c.model;
  rq.train = c.train;
  rq.vary_batch = vary_batch;
  rq.step = flags.step;
  rq.budget = budget.bytes;
  if (flags.layout.world != 1) {
    if (flags.overhead != "auto")
      throw InputError(
          "--overhead with --world-size above 1: state the overheads per GPU with "
          "--cuda-context and --nccl-memory");
    check_layout_request(c, false, false);
    rq.layout = par;
    rq.overheads = resolve_overheads(flags.layout);
    const MaxbatchResult m = find_max(rq);
    write_output(c.output, report::render_maxbatch_layout(c.model, c.train, par, c.format,
                                                          stdout_colour(c.output), m, budget.source,
                                                          budget.bytes, vary_batch));
    return m.search.best > 0 ? 0 : 3;
  }
  const Overhead overhead = resolve_overhead(flags.overhead, c.train.dtype);
  rq.overhead = overhead.bytes;
  const MaxbatchResult m = find_max(rq);
  const SearchResult& s = m.search;
  const std::int64_t lowest = m.lowest;
  const int traced = m.traced;

  const std::int64_t batch = vary_batch ? s.best : c.train.batch;
  const std::int64_t seq = vary_batch ? c.train.seq : s.best;
  const std::int64_t margin =
      s.best > 0 ? std::int64_t(budget.bytes) - std::int64_t(s.at_best.peak + overhead.bytes) : 0;
  if (!vary_batch && s.best > c.model.max_positions)
    spdlog::warn("--vary seq: {} is longer than {}'s max_position_embeddings {}", s.best,
                 c.model.name, c.model.max_positions);

  const ByteUnit u = table_unit(budget.bytes);
  auto q = [&](std::uint64_t b) { return format_bytes_with_unit(b, u); };
  report::Table t({{vary_batch ? "batch" : "seq"},
                   {std::string("peak (") + u.name + ")"},
                   {std::string("+ overhead (") + u.name + ")"},
                   {std::string("budget (") + u.name + ")"},
                   {std::string("margin (") + u.name + ")"},
                   {"fits", report::Align::left}});
  report::Table bytes_t({{flags.vary},
                         {"peak"},
                         {"peak_plus_overhead"},
                         {"budget"},
                         {"margin"},
                         {"fits", report::Align::left}});
  auto row = [&](std::int64_t v, const Probe& p) {
    const std::int64_t m = std::int64_t(budget.bytes) - std::int64_t(p.peak + overhead.bytes);
    bytes_t.add_row({std::to_string(v), std::to_string(p.peak),
                     std::to_string(p.peak + overhead.bytes), std::to_string(budget.bytes),
                     std::to_string(m), p.fits ? "yes" : "NO"});
    t.add_row({std::to_string(v), p.peak ? format_bytes(p.peak, u) : "overflow",
               format_bytes(p.peak + overhead.bytes, u), format_bytes(budget.bytes, u),
               format_signed_bytes(m, u), report::check_cell(p.fits)});
  };
  if (s.best > 0) row(s.best, s.at_best);
  row(m.next, s.at_next);
  // The report, described once for every format.
  const auto w = report::make_writer(c.format, stdout_colour(c.output));
  w->document([&] {
    json j = {{"schema", report::kSchema},
              {"budget", budget.bytes},
              {"vary", flags.vary},
              {"batch", batch},
              {"seq", seq},
              {"peak", s.best > 0 ? json(s.at_best.peak) : json(nullptr)},
              {"next_peak", s.at_next.peak ? json(s.at_next.peak) : json(nullptr)},
              {"margin", margin},
              {"overhead", overhead.bytes},
              {"overhead_source", overhead.source},
              {"budget_source", budget.source},
              {"step", flags.step},
              {"model", report::model_json(c.model, c.model.param_count())},
              {"run", report::run_json(c.train, "meta", 2)},
              {"traced", traced}};
    j["run"]["batch"] = batch;
    j["run"]["seq"] = seq;
    return j;
  });
  w->csv_table(bytes_t);
  w->title(
      "trainmem maxbatch: " + c.model.name + "  " +
      (vary_batch ? "s=" + std::to_string(c.train.seq) : "b=" + std::to_string(c.train.batch)) +
      " " + dtype_name(c.train.dtype) + " " + optimizer_name(c.train.optimizer) +
      "  checkpointing=" + checkpointing_name(c.train.checkpointing) +
      " attention=" + attention_name(c.train.attention));
  w->paragraph_break();
  if (const std::string family = report::family_line(c.model); !family.empty())
    w->paragraph(family);
  w->paragraph("budget " + q(budget.bytes) + " (" + budget.source + "); overhead " +
               q(overhead.bytes) + " (" + overhead.source + ")");
  w->banner("peaks: the meta backend's exact trace of the training step (" +
            std::to_string(traced) + " configurations traced)");
  if (s.best > 0)
    w->strong("largest " + flags.vary + " that fits: " + std::to_string(s.best) + ", margin " +
              q(std::uint64_t(std::max<std::int64_t>(margin, 0))));
  else
    w->strong("nothing fits: even " + flags.vary + " " + std::to_string(lowest) + " needs " +
              q(s.at_next.peak + overhead.bytes));
  w->table(t);
  write_output(c.output, w->str());
  return s.best > 0 ? 0 : 3;
}

}  // namespace

Runner register_maxbatch(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "maxbatch", "Largest batch (or --vary seq: longest sequence) whose step fits --budget");
  auto flags = std::make_shared<MaxbatchFlags>();
  add_common_flags(*cmd, flags->common);
  cmd->add_option("--budget", flags->budget,
                  "Memory budget: a SIZE (80GiB, 24GB, 512MiB) or 'device' (the GPU's total)");
  cmd->add_option("--vary", flags->vary, "What to maximise: batch|seq")->capture_default_str();
  cmd->add_option("--overhead", flags->overhead,
                  "Bytes no tensor owns, added to each peak: a SIZE, 'measure' (on the GPU), "
                  "or 'auto' (measure when a GPU is usable, else 0)")
      ->capture_default_str();
  cmd->add_option("--step", flags->step, "Granularity of the answer (e.g. 64 for --vary seq)")
      ->check(integer_check<std::int64_t>("an integer; allowed: an integer >= 1"))
      ->capture_default_str();
  add_layout_flags(*cmd, flags->layout);
  return [flags] { return run_maxbatch(*flags); };
}

}  // namespace trainmem::cli
