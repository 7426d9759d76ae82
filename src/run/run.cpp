// The run path shared by profile, compare, sweep and maxbatch (see include/trainmem/run/run.hpp):
// choosing the backend, executing a run step by step, and what is derived from a run's
// figures (the reconciliation with the native profile, per-layer activations by source).
// Reports: src/report/run_report.cpp (text, Markdown, CSV) and run_json.cpp.
#include "trainmem/run/run.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>
#include <utility>

#include "trainmem/base/error.hpp"
#include "trainmem/base/lora.hpp"
#include "trainmem/model/model.hpp"
#include "trainmem/model/model_io.hpp"
#include "trainmem/probes/cupti_tag_allocator.hpp"
#include "trainmem/run/routing.hpp"

namespace trainmem {

// ---------------------------------------------------------------- backend

ChosenBackend choose_backend(const std::string& name, DType dtype) {
  ChosenBackend c;
  if (name == "cpu") {
    c.backend = make_cpu_backend(dtype);
  } else if (name == "meta") {
    c.backend = make_meta_backend(dtype);
  } else if (name == "cuda") {
    c.backend = make_cuda_backend(dtype);  // DeviceError with the reason when unusable
  } else if (name == "auto") {
    const std::string reason = cuda_unavailable_reason();
    if (reason.empty()) {
      c.backend = make_cuda_backend(dtype);
    } else {
      c.note = "no usable CUDA device (" + reason +
               "): using the meta backend, so the figures are predicted (--backend cpu "
               "measures small models for real)";
      c.backend = make_meta_backend(dtype);
    }
  } else {
    throw InputError("--backend: unknown backend '" + name + "'; allowed: auto, cuda, cpu, meta");
  }
  return c;
}

// ---------------------------------------------------------------- one run

double RunResult::steady_step_seconds() const {
  if (step_seconds.empty()) return 0;
  std::vector<double> t(step_seconds.size() > 1 ? step_seconds.begin() + 1 : step_seconds.begin(),
                        step_seconds.end());
  std::sort(t.begin(), t.end());
  const std::size_t n = t.size();
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

std::uint64_t RunResult::per_layer_activations() const {
  // The analytic profiles' per-layer list is a MoE layer's when the model has dense layers among
  // MoE ones (the dense layers are counted apart): the first MoE layer's, else layer 0's.
  std::size_t l = 0;
  while (model.moe() && l + 1 < std::size_t(model.layers) && !model.is_moe_layer(std::int64_t(l)))
    ++l;
  return activations_by_layer.size() > l + 1 ? activations_by_layer[l + 1] : 0;
}

namespace {

// Step 1: the result's copy of the request, and the analytic estimates. Analytic first: it
// validates the configuration and needs no memory.
RunResult start_result(const RunRequest& rq) {
  RunResult r;
  r.model = rq.model;
  r.train = rq.train;
  r.steps_requested = rq.steps;
  r.seed = rq.seed;
  r.weights = rq.weights;
  r.tokens = rq.tokens;
  r.device_budget = rq.device_budget;
  if (rq.steps < 1 || rq.steps > kMaxSteps)
    throw InputError("--steps must be from 1 to " + std::to_string(kMaxSteps) + ", got " +
                     std::to_string(rq.steps));
  r.estimates.push_back(estimate(Profile::native, rq.model, rq.train));
  for (Profile p : rq.profiles)
    if (p != Profile::native) r.estimates.push_back(estimate(p, rq.model, rq.train, rq.hf));
  return r;
}

// Step 2: everything a run measures with, built in dependency order (each member uses the ones
// declared before it) and torn down in the reverse order:
//   backend -> CUPTI tagging (cuda with probes: wraps the backend's allocator) -> the model of
//   PyTorch's allocator (--allocator) or else the budget allocator (wraps that) -> ledger
//   (allocates through the outermost of them) -> probes (read the backend's allocator and the
//   ledger, and listen to the ledger's phases) -> model (its tensors live in the ledger).
// The destructor makes the teardown that correctness needs explicit; see ~RunRig.
class RunRig {
 public:
  RunRig(const RunRequest& rq, RunResult& r)
      : chosen_(choose_backend(rq.backend, rq.train.dtype)),
        tagged_(be().kind() == BackendKind::cuda && rq.probes
                    ? std::make_unique<CuptiTagAllocator>(be().allocator())
                    : nullptr),
        modelled_(make_modelled(inner_allocator(), rq)),
        budget_(modelled_ ? nullptr : make_budget(inner_allocator(), rq.device_budget)),
        ledger_(outer_allocator()) {
    r.backend = backend_name(be().kind());
    r.backend_note = chosen_.note;
    r.computes = be().computes();
    if (!rq.dump.empty() && !be().computes())
      throw InputError("--dump needs a backend that computes (cpu or cuda); the " + r.backend +
                       " backend only traces allocations");
    if (be().kind() == BackendKind::cuda && rq.probes) {
      ProbeOptions o;
      o.allocator = &be().allocator();
      o.ledger = &ledger_;
      probes_ = std::make_unique<ProbeSet>(o);
      probes_->mark("after_context");
    } else {
      probes_ = ProbeSet::unavailable(be().kind() == BackendKind::cuda
                                          ? std::string("device probes switched off")
                                          : "the " + r.backend + " backend has no device");
    }
    // Each top-level phase of a step closes a window in every device source.
    ledger_.set_phase_listener([this](Phase p, bool entering) {
      if (!entering && (p == Phase::forward || p == Phase::backward || p == Phase::optimizer))
        probes_->phase_end(p);
    });
  }

  // Teardown, in this order: the phase listener goes first (it calls into the probes), then
  // the model (its tensors go back to the ledger, and through it to the budget and the
  // backend's allocator, while all of them still exist), then the probes (they read the
  // ledger and the backend's allocator). The remaining members then go in reverse declaration
  // order: the ledger, the budget allocator (or the allocator model), the CUPTI tagging, and
  // last the backend.
  ~RunRig() {
    ledger_.set_phase_listener(nullptr);
    model_.reset();
    probes_.reset();
  }
  RunRig(const RunRig&) = delete;
  RunRig& operator=(const RunRig&) = delete;

  Backend& be() { return *chosen_.backend; }
  Ledger& ledger() { return ledger_; }
  ModelledAllocator* modelled() { return modelled_.get(); }
  ProbeSet& probes() { return *probes_; }
  std::unique_ptr<LlamaModel>& model() { return model_; }

 private:
  static std::unique_ptr<BudgetAllocator> make_budget(Allocator& inner,
                                                      const std::optional<std::uint64_t>& bytes) {
    if (!bytes) return nullptr;
    return std::make_unique<BudgetAllocator>(inner, *bytes);
  }
  // --allocator: the model of PyTorch's allocator, given the device budget as its device size.
  static std::unique_ptr<ModelledAllocator> make_modelled(Allocator& inner, const RunRequest& rq) {
    if (!rq.allocator) return nullptr;
    AllocatorSpec allocator = *rq.allocator;
    allocator.config.device_bytes = rq.device_budget;
    return std::make_unique<ModelledAllocator>(inner, allocator, rq.allocator_shadows);
  }
  // What the budget or the model (or, without either, the ledger) allocates through.
  Allocator& inner_allocator() {
    return tagged_ ? static_cast<Allocator&>(*tagged_) : be().allocator();
  }
  Allocator& outer_allocator() {
    if (modelled_) return *modelled_;
    if (budget_) return *budget_;
    return inner_allocator();
  }

  ChosenBackend chosen_;
  std::unique_ptr<CuptiTagAllocator> tagged_;
  std::unique_ptr<ModelledAllocator> modelled_;
  std::unique_ptr<BudgetAllocator> budget_;
  Ledger ledger_;
  std::unique_ptr<ProbeSet> probes_;
  std::unique_ptr<LlamaModel> model_;
};

// Step 3: the model (weights, tokens) and the training steps. An out-of-memory in either is
// caught into r.failure; everything else propagates. Returns the ledger sequence number of
// the last step's first event (0 when no step started), where its timeline begins.
std::uint64_t run_steps(const RunRequest& rq, RunRig& rig, RunResult& r) {
  Backend& be = rig.be();
  Ledger& ledger = rig.ledger();
  ProbeSet& probes = rig.probes();
  std::unique_ptr<LlamaModel>& model = rig.model();
  std::uint64_t step_first_seq = 0;
  try {
    model = std::make_unique<LlamaModel>(rq.model, rq.train, be, ledger,
                                         default_optimizer_settings(rq.train.optimizer));
    model->set_dropout_key(rq.seed, 0);  // LoRA dropout's masks, from --seed
    if (!rq.weights.empty()) {
      try {
        model->load_weights(rq.weights);
      } catch (const InputError& e) {
        throw InputError(weights_error(e));
      }
      r.non_finite_weights = model->non_finite_weights();
    } else {
      model->init_random(rq.seed);
    }
    if (!rq.tokens.empty()) {
      model->set_tokens(load_tokens_file(rq.tokens, rq.train.batch, rq.train.seq, rq.model.vocab),
                        "--tokens " + rq.tokens);
    } else if (be.computes()) {
      // Not on meta: nothing reads the ids there, and b·s of them in host memory is what
      // would stop a maxbatch search long before its device budget.
      model->random_tokens(rq.seed);
    }
    probes.mark("after_params");
    std::unique_ptr<GradientDump> dump;
    if (!rq.dump.empty()) dump = std::make_unique<GradientDump>(rq.dump, *model);
    for (int step = 1; step <= rq.steps; ++step) {
      step_first_seq = ledger.timeline().size() + ledger.dropped_events() + 1;
      probes.begin_step(step);
      if (rig.modelled()) rig.modelled()->begin_step();
      const auto t0 = std::chrono::steady_clock::now();
      const float loss = model->train_step(step == 1 && dump ? dump->capture() : nullptr);
      be.synchronize();
      r.step_seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      probes.end_step();
      r.losses.push_back(loss);
      r.steps_done = step;
      if (be.computes() && !std::isfinite(loss)) {
        r.non_finite_steps.push_back(step);
        spdlog::warn(
            "step {}: the loss is {} (not finite){}", step, std::isnan(loss) ? "NaN" : "Inf",
            r.non_finite_weights.empty() ? std::string()
                                         : std::string(": --weights holds NaN or Inf values"));
      }
      if (step == 1 && dump) {
        dump->finish(loss);
        spdlog::info("wrote {} (loss and {} gradients, fp32)", rq.dump,
                     std::count_if(model->parameters().begin(), model->parameters().end(),
                                   [](const Parameter& p) { return p.trainable; }));
      }
      if (be.computes())
        spdlog::debug("step {}: loss {:.6f} ({:.3f} s)", step, loss, r.step_seconds.back());
      else
        spdlog::debug("step {}: traced in {:.3f} s", step, r.step_seconds.back());
    }
  } catch (const OutOfMemory& e) {
    r.failure = failure_of(e, model ? r.steps_done + 1 : 0, ledger);
    if (rq.log_failure)
      spdlog::error("out of memory {}: {}",
                    r.failure->step ? "in step " + std::to_string(r.failure->step) : "in setup",
                    e.what());
  }
  return step_first_seq;
}

// Step 4: the ledger's figures of the last step run (or the failed one), its tensors and,
// when asked for, its timeline.
void read_ledger(const RunRequest& rq, RunRig& rig, std::uint64_t step_first_seq, RunResult& r) {
  const Ledger& ledger = rig.ledger();
  r.ledger = measured_figures(ledger);
  r.peak = ledger.peak_total();
  for (int p = 0; p < kNumPhases; ++p) r.phase_peaks[p] = ledger.phase_peak(static_cast<Phase>(p));
  r.events = ledger.timeline().size() + ledger.dropped_events();
  if (rig.modelled()) {
    r.allocator_model = rig.modelled()->result();
    r.allocator_shadows = rig.modelled()->shadow_results();
  }
  r.dropped_events = ledger.dropped_events();
  if (rig.model()) {
    r.activations_by_layer = rig.model()->activations_by_layer();
    if (const Ledger* host = rig.model()->host_ledger()) {
      r.offload_host_peak = host->peak_total().bytes;
      r.offload_transfer_bytes = rig.model()->offload_transfer_bytes();
    }
    if (const Ledger* managed = rig.model()->managed_ledger())
      r.optimizer_states_managed = managed->peak_total().bytes;
    const auto& routed = rig.model()->routing();
    for (std::size_t l = 0; l < routed.size(); ++l) {
      if (routed[l].tokens_per_expert.empty()) continue;  // a dense layer
      r.routing.push_back({std::int64_t(l), routed[l].tokens_per_expert, routed[l].dropped});
      r.routing_source = "measured";
    }
    // The meta trace routes nothing: the routing it was given, and what a capacity drops of it
    // (an expert keeps min(routed, capacity) choices; no byte depends on either).
    if (rq.model.moe() && !r.computes) {
      r.routing =
          rq.given_routing.empty() ? balanced_routing(rq.model, rq.train) : rq.given_routing;
      r.routing_source =
          rq.given_routing_source.empty() ? std::string("balanced") : rq.given_routing_source;
    }
  }
  const int last_step = r.failure ? r.failure->step : r.steps_done;
  for (const TensorRecord& t : ledger.tensors())
    if (t.step == 0 || t.step == last_step) r.tensors.push_back(t);
  if (rq.keep_timeline && step_first_seq > 0 && !ledger.timeline().empty()) {
    std::string title = run_title(rq.model, rq.train) + "  " + r.backend +
                        (r.computes ? "" : " (predicted)") + ", step " + std::to_string(last_step);
    r.timeline = build_timeline(ledger.timeline(), ledger.tensors(), step_first_seq,
                                r.computes ? TimeAxis::wall : TimeAxis::event_index,
                                std::move(title), ledger.dropped_events(), ledger.phase_marks());
  }
}

// Step 5: the device sources and their checks against the ledger.
void read_device_sources(RunRig& rig, RunResult& r) {
  ProbeSet& probes = rig.probes();
  r.pool = probes.pool();
  r.cupti = probes.cupti();
  r.memgetinfo = probes.memgetinfo();
  const LedgerSummary summary = LedgerSummary::of(rig.ledger());
  for (auto& c : reconcile_pool(summary, r.pool)) r.device_checks.push_back(c);
  for (auto& c : reconcile_cupti(summary, r.cupti)) r.device_checks.push_back(c);
  for (auto& c : reconcile_memgetinfo(summary, r.memgetinfo)) r.device_checks.push_back(c);
}

}  // namespace

RunResult execute_run(const RunRequest& rq) {
  RunResult r = start_result(rq);
  RunRig rig(rq, r);
  const std::uint64_t step_first_seq = run_steps(rq, rig, r);
  read_ledger(rq, rig, step_first_seq, r);
  read_device_sources(rig, r);
  return r;  // ~RunRig tears down model, probes, ledger, budget and backend, in that order
}

// ---------------------------------------------------------------- reconciliation

std::vector<ReconciliationRow> reconcile_ledger_native(const RunResult& r) {
  const MemoryFigures& m = r.ledger;
  const MemoryFigures& a = r.native().figures;
  const std::vector<std::pair<const char*, std::pair<std::uint64_t, std::uint64_t>>> rows = {
      {"params", {m.params, a.params}},
      {"gradients", {m.gradients, a.gradients}},
      {"optimizer_states", {m.optimizer_states, a.optimizer_states}},
      {"activations", {m.activations, a.activations}},
      {"activations_peak", {m.activations_peak, a.activations_peak}},
      {"workspace", {m.workspace, a.workspace}},
      {"inputs", {m.inputs, a.inputs}},
      {"sum", {m.sum, a.sum}},
      {"peak", {m.peak, a.peak}}};
  auto all = rows;
  if (r.train.offload_activations) {  // the host ledger against the closed form
    const Estimate& n = r.native();
    all.push_back({"offload_host", {r.offload_host_peak, n.offload_host_bytes}});
    all.push_back({"offload_transfer", {r.offload_transfer_bytes, n.offload_transfer_bytes}});
  }
  if (paged_optimizer(r.train.optimizer))  // the managed ledger against the closed form
    all.push_back({"optimizer_states_managed",
                   {r.optimizer_states_managed, r.native().optimizer_states_managed}});
  std::vector<ReconciliationRow> out;
  for (const auto& [name, v] : all) {
    ReconciliationRow row;
    row.category = name;
    row.measured = v.first;
    row.analytic = v.second;
    row.difference = std::int64_t(v.first) - std::int64_t(v.second);
    row.rel_error = v.second ? double(row.difference) / double(v.second) : (row.difference ? 1 : 0);
    row.judged = !r.failure;
    row.ok = row.judged && v.first == v.second;
    out.push_back(row);
  }
  return out;
}

PerLayerBySource per_layer_activations_by_source(const RunResult& r) {
  PerLayerBySource out;
  const double layers = double(r.model.layers);
  const std::uint64_t ledger_layer = r.per_layer_activations();
  if (ledger_layer == 0 || r.failure) {
    out.unavailable["ledger"] = r.failure ? "the run ran out of memory" : "no forward pass ran";
    return out;
  }
  out.bytes["ledger"] = double(ledger_layer);
  const std::uint64_t outside = r.activations_by_layer[0];
  if (!r.cupti.available) {
    out.unavailable["cupti"] = r.cupti.reason;
  } else if (r.train.checkpointing != Checkpointing::none) {
    out.unavailable["cupti"] =
        "with checkpointing CUPTI's activation peak is the recompute peak, not the end of "
        "forward";
  } else {
    const std::uint64_t act = r.cupti.figures.peak[static_cast<int>(Category::activations)];
    out.bytes["cupti"] = (double(act) - double(outside)) / layers;
  }
  if (!r.pool.available) {
    out.unavailable["pool"] = r.pool.reason;
  } else {
    const PoolPhaseFigure* fwd = nullptr;
    for (const auto& w : r.pool.phases)
      if (w.phase == Phase::forward) fwd = &w;
    if (!fwd) {
      out.unavailable["pool"] = "no forward window was read";
    } else {
      const double excess =
          double(fwd->used_high) - double(r.phase_peaks[static_cast<int>(Phase::forward)]);
      out.bytes["pool"] = double(ledger_layer) + excess / layers;
    }
  }
  out.unavailable["memgetinfo"] =
      r.memgetinfo.available
          ? "the pool keeps freed memory reserved between steps, so cudaMemGetInfo does not "
            "follow the steady-state step's activations"
          : r.memgetinfo.reason;
  return out;
}

RunFailure failure_of(const OutOfMemory& e, int step, const Ledger& ledger) {
  RunFailure f;
  f.message = e.what();
  f.requested_bytes = e.requested_bytes;
  f.category = e.category;
  f.tensor = e.tensor;
  f.live_bytes = e.live_bytes;
  f.step = step;
  f.live_tensors = ledger.live_at_last_failure();
  std::sort(f.live_tensors.begin(), f.live_tensors.end(),
            [](const TensorRecord& a, const TensorRecord& b) { return a.bytes > b.bytes; });
  return f;
}

std::string run_title(const ModelConfig& m, const TrainConfig& t) {
  std::ostringstream o;
  o << m.name << "  b=" << t.batch << " s=" << t.seq << " " << dtype_name(t.dtype) << " "
    << optimizer_name(t.optimizer) << "  checkpointing=" << checkpointing_name(t)
    << " attention=" << attention_name(t.attention)
    << (t.offload_activations ? " offload-activations" : "");
  o << train_title_extras(t);
  return o.str();
}

}  // namespace trainmem
