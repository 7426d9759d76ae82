// trainmem profile — runs the training step(s) on a backend (auto: cuda when a device is
// usable, else meta with a note), measures and reconciles: the ledger's figures of the last,
// steady-state step beside the analytic profiles, the device sources on cuda, and the tensors.
// One run of the shared run path (include/trainmem/run/run.hpp); --dump writes the first step's
// loss and gradients, --timeline the last step's memory timeline.
#include <spdlog/spdlog.h>

#include <memory>
#include <optional>

#include "cli.hpp"
#include "launch.hpp"
#include "layout.hpp"
#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/report/layout_report.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/report/run_report.hpp"
#include "trainmem/run/routing.hpp"
#include "trainmem/run/run.hpp"
#include "trainmem/run/timeline.hpp"

namespace trainmem::cli {
namespace {

struct ProfileFlags {
  CommonFlags common;
  RunFlags run;
  LayoutFlags layout;
  LaunchFlags launch;
};

// Routing per rank (--world-size above 1): --routing FILE is given to the meta trace, which
// routes nothing; --dump-routing writes what a measured run's ranks routed (rank 0 writes it).
void check_layout_routing_flags(const RunFlags& run, const std::string& be) {
  const bool measured = be == "cpu" || be == "cuda";
  if (!run.routing.empty() && measured)
    throw InputError("--routing " + run.routing +
                     ": a routing is given to the meta trace, which routes nothing; add "
                     "--backend meta (cpu and cuda route the tokens themselves; --dump-routing "
                     "writes what they routed)");
  if (!run.dump_routing.empty()) {
    if (!measured)
      throw InputError("--dump-routing " + run.dump_routing +
                       ": the meta trace routes nothing (it computes no logits); use --backend "
                       "cpu or cuda under mpirun");
    check_writable(run.dump_routing, "--dump-routing");
  }
}

// --world-size above 1: measured under MPI (cpu, cuda), or each distinct rank traced on meta
// beside the per-rank analytic.
int run_profile_layout(const Common& c, const ProfileFlags& flags, const ParallelConfig& par) {
  const std::string& be = flags.run.backend;
  // cpu, cuda: one process per rank under MPI, each measuring its rank (src/cli/launch.hpp); exit
  // 2 with the launcher line when not launched so.
  if (be == "cpu" || be == "cuda")
    return run_measured_layout(c, flags.run, par, resolve_overheads(flags.layout), flags.launch);
  if (be != "meta" && be != "auto")
    throw InputError("--backend " + be + " with --world-size above 1: use meta, cpu or cuda");
  if (be == "auto") spdlog::info("--world-size {}: tracing every rank on meta", par.world);
  if (auto p = traced_layout_problem(flags.run, par.world, command_line())) throw InputError(*p);
  check_layout_request(c, false, false);
  std::optional<AllocatorSpec> allocator;
  if (!flags.run.allocator.empty()) allocator = parse_allocator(flags.run.allocator);
  std::optional<LayoutRouting> given;
  if (!flags.run.routing.empty() && flags.run.routing != "balanced")
    given = read_layout_routing_file(flags.run.routing, c.model, c.train, par);
  LayoutTrace lt = trace_layout(c.model, c.train, par, resolve_overheads(flags.layout),
                                flags.run.steps, allocator);
  if (given) trace_given_routing(lt, *given);
  write_output(c.output, report::render_layout_trace(lt, c.format, stdout_colour(c.output)));
  return 0;
}

int run_profile(const ProfileFlags& flags) {
  Common c = resolve_common(flags.common, false, false, /*allow_finetune=*/false,
                            /*native_lora=*/true);
  for (const auto& [flag, value] :
       {std::pair<const char*, const std::string&>{"--dump-routing", flags.run.dump_routing},
        {"--routing", flags.run.routing}})
    if (!value.empty() && !c.model.moe())
      throw InputError(std::string(flag) + " " + value + ": " + c.model.name +
                       " is not a mixture of experts (it routes no token)");
  const ParallelConfig par = resolve_layout(flags.layout, c.model, c.train);
  resolve_checkpointing(c, par);  // budget:SIZE picks its layers for this layout
  const std::string& be = flags.run.backend;
  if (par.distributed()) check_layout_routing_flags(flags.run, be);
  check_collectives_flag(flags.launch, par.distributed() && (be == "cpu" || be == "cuda"));
  if (par.distributed()) return run_profile_layout(c, flags, par);
  if (!flags.run.timeline.empty()) validate_timeline_path(flags.run.timeline);

  RunRequest rq = run_request(c, flags.run);
  rq.keep_timeline |= c.format == Format::html;  // the page shows the step's timeline
  // Before the run, which may take long: every file it will write can be written, and the
  // step can start on the chosen backend.
  if (!flags.run.timeline.empty()) check_writable(flags.run.timeline, "--timeline");
  if (!flags.run.dump.empty()) check_writable(flags.run.dump, "--dump");
  if (!flags.run.routing.empty()) {
    if (be != "meta")
      throw InputError("--routing " + flags.run.routing +
                       ": a routing is given to the meta trace, which routes nothing; add "
                       "--backend meta (cpu and cuda route the tokens themselves and report it)");
    if (flags.run.routing != "balanced") {
      rq.given_routing = read_routing_file(flags.run.routing, c.model, c.train);
      rq.given_routing_source = "file " + flags.run.routing;
    }
  }
  if (!flags.run.dump_routing.empty()) {
    if (be == "meta")
      throw InputError("--dump-routing " + flags.run.dump_routing +
                       ": the meta backend routes nothing (it computes no logits); use --backend "
                       "cpu or cuda");
    check_writable(flags.run.dump_routing, "--dump-routing");
  }
  check_run_can_start(rq);

  const RunResult r = execute_run(rq);
  if (!r.backend_note.empty()) spdlog::warn("{}", r.backend_note);
  // The timeline and the routing, then the report: one that cannot be written (a full disk) does
  // not keep the others from being written; its error is the exit status afterwards.
  std::optional<std::string> output_error;
  if (r.timeline && !flags.run.timeline.empty()) {
    try {
      write_timeline(flags.run.timeline, *r.timeline);
      spdlog::info("wrote {}", flags.run.timeline);
    } catch (const InputError& e) {
      output_error = e.what();
      spdlog::error("the timeline was not written: {}", e.what());
    }
  }

  if (!flags.run.dump_routing.empty()) {
    try {
      if (r.routing_source != "measured")  // auto fell back to meta, or no forward completed
        throw InputError(
            "--dump-routing " + flags.run.dump_routing + ": no routing was measured (backend " +
            r.backend +
            (r.computes ? ": the run stopped before a forward" : ": it computes nothing") + ")");
      write_output(flags.run.dump_routing, routing_json(r).dump(2) + "\n");
    } catch (const InputError& e) {
      if (!output_error) output_error = e.what();
      spdlog::error("the routing was not written: {}", e.what());
    }
  }

  const auto w = report::make_writer(c.format, stdout_colour(c.output));
  write_profile(*w, r);
  write_output(c.output, w->str());
  if (output_error && !r.failure) throw InputError(*output_error);
  // After an out-of-memory (already logged by execute_run) the report above holds what was
  // measured up to the failure.
  return r.failure ? 3 : 0;
}

}  // namespace

Runner register_profile(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "profile", "Run the training step(s) on a backend, measure, reconcile with the formulas");
  auto flags = std::make_shared<ProfileFlags>();
  add_common_flags(*cmd, flags->common);
  add_run_flags(*cmd, flags->run, /*several_runs=*/false);
  add_layout_flags(*cmd, flags->layout);
  add_launch_flags(*cmd, flags->launch);
  return [flags] { return run_profile(*flags); };
}

}  // namespace trainmem::cli
