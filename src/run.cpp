// The run path shared by profile, compare, sweep and maxbatch (see include/trainmem/run.hpp).
#include "trainmem/run.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "trainmem/error.hpp"
#include "trainmem/model.hpp"
#include "trainmem/model_io.hpp"
#include "trainmem/report.hpp"

namespace trainmem {

using nlohmann::json;

// ---------------------------------------------------------------- sizes

std::uint64_t parse_size(const std::string& text, const std::string& flag) {
  auto bad = [&](const std::string& why) {
    return InputError(flag + ": '" + text + "' is not a size (" + why +
                      "); use e.g. 80GiB, 24GB, 512MiB or a byte count");
  };
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  const std::string number = text.substr(0, i);
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  if (!text.empty() && text.front() == '-') throw bad("negative");
  if (number.empty() || std::count(number.begin(), number.end(), '.') > 1 || number == ".")
    throw bad("no number");
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  long double scale;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "k" || unit == "kib") {
    scale = 1024.0L;
  } else if (unit == "m" || unit == "mib") {
    scale = 1024.0L * 1024;
  } else if (unit == "g" || unit == "gib") {
    scale = 1024.0L * 1024 * 1024;
  } else if (unit == "t" || unit == "tib") {
    scale = 1024.0L * 1024 * 1024 * 1024;
  } else if (unit == "kb") {
    scale = 1e3L;
  } else if (unit == "mb") {
    scale = 1e6L;
  } else if (unit == "gb") {
    scale = 1e9L;
  } else if (unit == "tb") {
    scale = 1e12L;
  } else {
    throw bad("unknown unit '" + text.substr(i) + "'");
  }
  const long double value = std::strtold(number.c_str(), nullptr) * scale;
  if (!(value < 18446744073709551615.0L)) throw bad("larger than 2^64 bytes");
  return static_cast<std::uint64_t>(std::floor(value));
}

// ---------------------------------------------------------------- search

SearchResult find_largest_fitting(std::int64_t lowest, std::int64_t highest, std::int64_t step,
                                  const std::function<Probe(std::int64_t)>& probe) {
  if (step < 1 || lowest < 1 || highest < lowest)
    throw Error("find_largest_fitting: need 1 <= lowest <= highest and step >= 1");
  SearchResult r;
  auto try_k = [&](std::int64_t k) {
    ++r.probes;
    return probe(lowest + k * step);
  };
  const std::int64_t k_max = (highest - lowest) / step;
  Probe p0 = try_k(0);
  if (!p0.fits) {
    r.best = 0;
    r.at_next = p0;
    return r;
  }
  // Grow k geometrically until a value fails (or the range ends), then bisect between the
  // last good and the first bad k.
  std::int64_t k_good = 0, k_bad = -1;
  Probe good = p0, bad{};
  for (std::int64_t k = 1;; k = k > k_max / 2 ? k_max : 2 * k) {
    if (k > k_max) k = k_max;
    if (k <= k_good) break;  // the whole range fits
    const Probe p = try_k(k);
    if (!p.fits) {
      k_bad = k, bad = p;
      break;
    }
    k_good = k, good = p;
  }
  if (k_bad >= 0) {
    while (k_bad - k_good > 1) {
      const std::int64_t mid = k_good + (k_bad - k_good) / 2;
      const Probe p = try_k(mid);
      if (p.fits) {
        k_good = mid, good = p;
      } else {
        k_bad = mid, bad = p;
      }
    }
  }
  r.best = lowest + k_good * step;
  r.at_best = good;
  // One more: the first failure, or (when the top of the range fits) a probe past it.
  r.at_next = k_bad >= 0 ? bad : try_k(k_good + 1);
  return r;
}

// ---------------------------------------------------------------- progress

ProgressBar::ProgressBar(std::string label, std::size_t total)
    : label_(std::move(label)), total_(total), active_(isatty(STDERR_FILENO) == 1) {}

ProgressBar::~ProgressBar() {
  done();
}

void ProgressBar::step(const std::string& what) {
  if (!active_) return;
  ++current_;
  const int width = 24;
  const int filled = total_ ? int(width * (current_ - 1) / total_) : 0;
  std::string bar(filled, '#');
  bar.append(width - filled, '.');
  std::fprintf(stderr, "\r\033[K%s %zu/%zu [%s] %s", label_.c_str(), current_, total_, bar.c_str(),
               what.c_str());
  std::fflush(stderr);
}

void ProgressBar::done() {
  if (!active_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  active_ = false;
}

}  // namespace trainmem

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
  return activations_by_layer.size() > 1 ? activations_by_layer[1] : 0;
}

RunResult execute_run(const RunRequest& rq) {
  RunResult r;
  r.model = rq.model;
  r.train = rq.train;
  r.steps_requested = rq.steps;
  r.seed = rq.seed;
  r.weights = rq.weights;
  r.tokens = rq.tokens;
  r.device_budget = rq.device_budget;
  if (rq.steps < 1) throw InputError("--steps must be >= 1, got " + std::to_string(rq.steps));

  // Analytic first: it validates the configuration and needs no memory.
  r.estimates.push_back(estimate(Profile::native, rq.model, rq.train));
  for (Profile p : rq.profiles)
    if (p != Profile::native) r.estimates.push_back(estimate(p, rq.model, rq.train));

  ChosenBackend chosen = choose_backend(rq.backend, rq.train.dtype);
  Backend& be = *chosen.backend;
  r.backend = backend_name(be.kind());
  r.backend_note = chosen.note;
  r.computes = be.computes();
  if (!rq.dump.empty() && !be.computes())
    throw InputError("--dump needs a backend that computes (cpu or cuda); the " + r.backend +
                     " backend only traces allocations");

  std::unique_ptr<BudgetAllocator> budget;
  Allocator* allocator = &be.allocator();
  if (rq.device_budget) {
    budget = std::make_unique<BudgetAllocator>(be.allocator(), *rq.device_budget);
    allocator = budget.get();
  }
  Ledger ledger(*allocator);
  std::unique_ptr<ProbeSet> probes;
  if (be.kind() == BackendKind::cuda && rq.probes) {
    ProbeOptions o;
    o.allocator = &be.allocator();
    o.ledger = &ledger;
    probes = std::make_unique<ProbeSet>(o);
    probes->mark("after_context");
  } else {
    probes = ProbeSet::unavailable(be.kind() == BackendKind::cuda
                                       ? std::string("device probes switched off")
                                       : "the " + r.backend + " backend has no device");
  }
  // Each top-level phase of a step closes a window in every device source.
  ledger.set_phase_listener([&probes](Phase p, bool entering) {
    if (!entering && (p == Phase::forward || p == Phase::backward || p == Phase::optimizer))
      probes->phase_end(p);
  });

  std::unique_ptr<LlamaModel> model;
  std::uint64_t step_first_seq = 0;
  try {
    model = std::make_unique<LlamaModel>(rq.model, rq.train, be, ledger,
                                         default_optimizer_settings(rq.train.optimizer));
    if (!rq.weights.empty()) {
      model->load_weights(rq.weights);
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
    probes->mark("after_params");
    std::unique_ptr<GradientDump> dump;
    if (!rq.dump.empty()) dump = std::make_unique<GradientDump>(rq.dump, *model);
    for (int step = 1; step <= rq.steps; ++step) {
      step_first_seq = ledger.timeline().size() + ledger.dropped_events() + 1;
      probes->begin_step(step);
      const auto t0 = std::chrono::steady_clock::now();
      const float loss = model->train_step(step == 1 && dump ? dump->capture() : nullptr);
      be.synchronize();
      r.step_seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      probes->end_step();
      r.losses.push_back(loss);
      r.steps_done = step;
      if (step == 1 && dump) {
        dump->finish(loss);
        spdlog::info("wrote {} (loss and {} gradients, fp32)", rq.dump, model->parameters().size());
      }
      if (be.computes())
        spdlog::debug("step {}: loss {:.6f} ({:.3f} s)", step, loss, r.step_seconds.back());
      else
        spdlog::debug("step {}: traced in {:.3f} s", step, r.step_seconds.back());
    }
  } catch (const OutOfMemory& e) {
    RunFailure f;
    f.message = e.what();
    f.requested_bytes = e.requested_bytes;
    f.category = e.category;
    f.tensor = e.tensor;
    f.live_bytes = e.live_bytes;
    f.step = model ? r.steps_done + 1 : 0;
    for (const TensorRecord* t : ledger.live_tensors()) f.live_tensors.push_back(*t);
    std::sort(f.live_tensors.begin(), f.live_tensors.end(),
              [](const TensorRecord& a, const TensorRecord& b) { return a.bytes > b.bytes; });
    r.failure = std::move(f);
    spdlog::error("out of memory {}: {}",
                  r.failure->step ? "in step " + std::to_string(r.failure->step) : "in setup",
                  e.what());
  }

  r.ledger = measured_figures(ledger);
  r.peak = ledger.peak_total();
  for (int p = 0; p < kNumPhases; ++p) r.phase_peaks[p] = ledger.phase_peak(static_cast<Phase>(p));
  r.events = ledger.timeline().size() + ledger.dropped_events();
  r.dropped_events = ledger.dropped_events();
  if (model) r.activations_by_layer = model->activations_by_layer();
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
  r.pool = probes->pool();
  r.cupti = probes->cupti();
  r.memgetinfo = probes->memgetinfo();
  const LedgerSummary summary = LedgerSummary::of(ledger);
  for (auto& c : reconcile_pool(summary, r.pool)) r.device_checks.push_back(c);
  for (auto& c : reconcile_cupti(summary, r.cupti)) r.device_checks.push_back(c);
  for (auto& c : reconcile_memgetinfo(summary, r.memgetinfo)) r.device_checks.push_back(c);
  ledger.set_phase_listener(nullptr);
  model.reset();  // the model's tensors go back to the ledger before it goes
  probes.reset();
  return r;
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
  std::vector<ReconciliationRow> out;
  for (const auto& [name, v] : rows) {
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

// ---------------------------------------------------------------- JSON

namespace {

json shape_json(const std::vector<std::int64_t>& shape) {
  json j = json::array();
  for (auto d : shape) j.push_back(d);
  return j;
}

json tensor_record_json(const TensorRecord& t) {
  return json{{"name", t.name},
              {"category", category_name(t.category)},
              {"layer", t.layer},
              {"shape", shape_json(t.shape)},
              {"dtype", dtype_name(t.dtype)},
              {"bytes", t.bytes},
              {"phase", phase_name(t.phase)},
              {"step", t.step}};
}

}  // namespace

json run_result_json(const RunResult& r) {
  json j;
  j["schema"] = report::kSchema;
  j["model"] = report::model_json(r.model, r.model.param_count());
  j["run"] = report::run_json(r.train, r.backend, r.steps_requested);
  j["run"]["steps_done"] = r.steps_done;
  j["run"]["predicted"] = !r.computes;
  j["run"]["seed"] = r.seed;
  j["run"]["weights"] = r.weights.empty() ? json(nullptr) : json(r.weights);
  j["run"]["tokens"] = r.tokens.empty() ? json(nullptr) : json(r.tokens);
  json losses = json::array();
  for (float l : r.losses) losses.push_back(std::isfinite(l) ? json(l) : json(nullptr));
  j["run"]["losses"] = losses;
  j["run"]["step_seconds"] = r.step_seconds;
  if (!r.backend_note.empty()) j["run"]["backend_note"] = r.backend_note;
  j["run"]["device_budget"] = r.device_budget ? json(*r.device_budget) : json(nullptr);
  j["analytic"] = report::analytic_json(r.estimates);

  json led = report::figures_json(r.ledger, true);
  led["per_layer_activations"] = r.per_layer_activations();
  // One run cannot identify coefficients; `trainmem sweep --fit` measures them.
  led["coefficients"] = nullptr;
  if (r.activations_by_layer.size() > 1) {
    led["per_layer_activations_by_layer"] = json(std::vector<std::uint64_t>(
        r.activations_by_layer.begin() + 1, r.activations_by_layer.end()));
    led["outside_layers_activations"] = r.activations_by_layer[0];
  }
  led["peak_at"] = json{{"phase", phase_name(r.peak.phase)},
                        {"tensor", r.peak.tensor},
                        {"layer", r.peak.layer},
                        {"seq", r.peak.seq}};
  json phases = json::object();
  for (Phase ph : {Phase::forward, Phase::backward, Phase::recompute, Phase::optimizer})
    phases[phase_name(ph)] = r.phase_peaks[static_cast<int>(ph)];
  led["phase_peaks"] = phases;
  led["events"] = r.events;
  led["dropped_events"] = r.dropped_events;

  json unavailable = json::object();
  auto source = [&](const char* name, bool available, const std::string& reason,
                    const json& body) -> json {
    if (available) return body;
    unavailable[name] = reason;
    return nullptr;
  };
  j["measured"] = json{{"ledger", led}};
  j["measured"]["pool"] = source("pool", r.pool.available, r.pool.reason, r.pool.to_json());
  j["measured"]["cupti"] = source("cupti", r.cupti.available, r.cupti.reason, r.cupti.to_json());
  j["measured"]["memgetinfo"] =
      source("memgetinfo", r.memgetinfo.available, r.memgetinfo.reason, r.memgetinfo.to_json());
  j["measured"]["unavailable"] = unavailable;

  json rec = json::array();
  for (const auto& row : reconcile_ledger_native(r))
    rec.push_back(
        json{{"category", row.category},
             {"source", "ledger"},
             {"profile", "native"},
             {"measured", row.measured},
             {"analytic", row.analytic},
             {"difference", row.difference},
             {"rel_error", row.rel_error},
             {"ok", row.judged ? json(row.ok) : json(nullptr)},
             {"tolerance", row.judged ? "exact" : "not judged: the run ran out of memory"}});
  j["reconciliation"] = rec;
  json checks = json::array();
  for (const auto& c : r.device_checks) checks.push_back(c.to_json());
  j["device_checks"] = checks;
  json tensors = json::array();
  for (const auto& t : r.tensors) tensors.push_back(tensor_record_json(t));
  j["tensors"] = tensors;
  if (r.failure) {
    const RunFailure& f = *r.failure;
    json live = json::array();
    for (const auto& t : f.live_tensors) live.push_back(tensor_record_json(t));
    j["error"] = json{
        {"kind", "out_of_memory"}, {"message", f.message}, {"requested_bytes", f.requested_bytes},
        {"category", f.category},  {"tensor", f.tensor},   {"live_bytes", f.live_bytes},
        {"step", f.step},          {"live_tensors", live}};
  }
  return j;
}

// ---------------------------------------------------------------- text

TableUnit table_unit(std::uint64_t max_bytes) {
  if (max_bytes >= (std::uint64_t{1} << 30)) return {1073741824.0, "GiB"};
  return {1048576.0, "MiB"};
}

std::string in_unit(std::uint64_t bytes, TableUnit u) {
  return report::fixed(double(bytes) / u.bytes, 2);
}

std::string run_title(const ModelConfig& m, const TrainConfig& t) {
  std::ostringstream o;
  o << m.name << "  b=" << t.batch << " s=" << t.seq << " " << dtype_name(t.dtype) << " "
    << optimizer_name(t.optimizer) << "  checkpointing=" << checkpointing_name(t.checkpointing)
    << " attention=" << attention_name(t.attention);
  return o.str();
}

std::string backend_line(const RunResult& r) {
  std::string s = "backend " + r.backend;
  if (!r.computes)
    s += " — PREDICTED: the exact allocation trace of the step, no arithmetic";
  else if (r.backend == "cpu")
    s += " — measured: real arithmetic on the CPU, the bytes a GPU run allocates";
  else
    s += " — measured on the GPU";
  if (!r.backend_note.empty()) s += "\n  note: " + r.backend_note;
  return s;
}

namespace {

std::string signed_bytes(std::int64_t v) {
  if (v == 0) return "0";
  return (v > 0 ? "+" : "-") + report::with_commas(std::uint64_t(v > 0 ? v : -v));
}

std::string percent(double f) {
  return report::fixed(100.0 * f, 2) + "%";
}

std::string where_text(const PeakInfo& p) {
  std::string s = std::string("in ") + phase_name(p.phase);
  if (p.layer >= 0) s += ", layer " + std::to_string(p.layer);
  if (!p.tensor.empty()) s += ", at the allocation of " + p.tensor;
  if (p.seq) s += " (ledger event " + std::to_string(p.seq) + ")";
  return s;
}

std::uint64_t max_figure(const MemoryFigures& f) {
  return std::max({f.params, f.gradients, f.optimizer_states, f.activations, f.activations_peak,
                   f.workspace, f.inputs, f.sum, f.peak});
}

report::Table reconciliation_table(const RunResult& r, TableUnit u) {
  report::Table t({{"category", report::Align::left},
                   {std::string("measured (") + u.name + ")"},
                   {std::string("analytic (") + u.name + ")"},
                   {"difference (B)"},
                   {"rel error"},
                   {"ok", report::Align::left}});
  for (const auto& row : reconcile_ledger_native(r)) {
    if (row.category == "sum") t.add_rule();
    t.add_row({row.category, in_unit(row.measured, u), in_unit(row.analytic, u),
               signed_bytes(row.difference), percent(row.rel_error),
               !row.judged ? "- (OOM)"
               : row.ok    ? "yes"
                           : "NO"});
  }
  return t;
}

report::Table device_table(const RunResult& r, TableUnit u) {
  report::Table t({{"source", report::Align::left},
                   {"figure", report::Align::left},
                   {std::string("ledger (") + u.name + ")"},
                   {std::string("device (") + u.name + ")"},
                   {"difference (B)"},
                   {"ok", report::Align::left},
                   {"bound", report::Align::left}});
  for (const auto& c : r.device_checks)
    t.add_row({c.source, c.what, in_unit(c.ledger, u), in_unit(c.device, u),
               signed_bytes(c.difference), c.ok ? "yes" : "NO", c.bound});
  return t;
}

report::Table breakdown_table(const RunResult& r, TableUnit u) {
  report::Table t({{"category at the peak", report::Align::left},
                   {std::string("live (") + u.name + ")"},
                   {"share"}});
  for (Category c : all_categories()) {
    const std::uint64_t b = r.peak.breakdown[static_cast<int>(c)];
    t.add_row({category_name(c), in_unit(b, u),
               r.peak.bytes ? percent(double(b) / double(r.peak.bytes)) : "-"});
  }
  t.add_rule();
  t.add_row({"total", in_unit(r.peak.bytes, u), r.peak.bytes ? "100.00%" : "-"});
  return t;
}

report::Table references_table(const RunResult& r, TableUnit u) {
  report::Table t({{"profile", report::Align::left},
                   {"Params"},
                   {"Gradients"},
                   {"Optimizer States"},
                   {"Activations"},
                   {"Total"},
                   {"Peak"},
                   {"per layer", report::Align::left}});
  auto row = [&](const std::string& name, const MemoryFigures& f, const std::string& formula) {
    t.add_row({name, in_unit(f.params, u), in_unit(f.gradients, u), in_unit(f.optimizer_states, u),
               in_unit(f.activations, u), in_unit(f.sum, u), in_unit(f.peak, u), formula});
  };
  row(std::string("measured (") + r.backend + (r.computes ? "" : ", predicted") + ")", r.ledger,
      "");
  t.add_rule();
  for (const Estimate& e : r.estimates)
    row(profile_name(e.profile), e.figures, report::per_layer_formula(e));
  return t;
}

std::string unavailable_lines(const RunResult& r, const char* prefix) {
  std::string s;
  auto line = [&](const char* name, bool available, const std::string& reason) {
    if (!available) s += std::string(prefix) + name + ": unavailable: " + reason + "\n";
  };
  line("pool", r.pool.available, r.pool.reason);
  line("cupti", r.cupti.available, r.cupti.reason);
  line("memgetinfo", r.memgetinfo.available, r.memgetinfo.reason);
  return s;
}

// Overhead = device used − ledger live, at the last memgetinfo snapshot that has both.
std::optional<std::pair<std::string, std::int64_t>> overhead_of(const RunResult& r) {
  if (!r.memgetinfo.available) return std::nullopt;
  for (auto it = r.memgetinfo.snapshots.rbegin(); it != r.memgetinfo.snapshots.rend(); ++it)
    if (it->has_ledger)
      return std::make_pair(it->name, std::int64_t(it->used) - std::int64_t(it->ledger_live));
  return std::nullopt;
}

std::string losses_text(const RunResult& r) {
  std::string s;
  for (std::size_t i = 0; i < r.losses.size(); ++i)
    if (std::isfinite(r.losses[i]))
      s += (s.empty() ? "" : ", ") + std::string("step ") + std::to_string(i + 1) + " " +
           report::fixed(r.losses[i], 4);
  return s;
}

std::string failure_text(const RunResult& r, TableUnit u) {
  if (!r.failure) return "";
  const RunFailure& f = *r.failure;
  std::ostringstream o;
  o << "OUT OF MEMORY " << (f.step ? "in step " + std::to_string(f.step) : "in setup") << ": "
    << f.message << "\n";
  if (r.device_budget)
    o << "  (--device-budget " << report::with_commas(*r.device_budget)
      << " B: a budget-limited allocator; figures below are up to the failure)\n";
  o << "  largest tensors alive at the failure:\n";
  for (std::size_t i = 0; i < f.live_tensors.size() && i < 5; ++i)
    o << "    " << f.live_tensors[i].name << " (" << category_name(f.live_tensors[i].category)
      << ") " << in_unit(f.live_tensors[i].bytes, u) << " " << u.name << "\n";
  return o.str();
}

}  // namespace

Colour stdout_colour(const std::string& output_path) {
  return output_path.empty() && isatty(STDOUT_FILENO) == 1 && !std::getenv("NO_COLOR")
             ? Colour::on
             : Colour::off;
}

std::string report_header(const std::string& command, const RunResult& r) {
  return "## trainmem " + command + ": " + run_title(r.model, r.train) + "\n" + backend_line(r) +
         "\n";
}

std::string suffixed_path(const std::string& path, const std::string& suffix) {
  const auto dot = path.find_last_of('.');
  const auto slash = path.find_last_of('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash))
    return path + "-" + suffix;
  return path.substr(0, dot) + "-" + suffix + path.substr(dot);
}

std::string profile_text(const RunResult& r, Colour colour) {
  const TableUnit u = table_unit(std::max(max_figure(r.ledger), max_figure(r.native().figures)));
  std::ostringstream o;
  o << report_header("profile", r);
  o << r.steps_done << " of " << r.steps_requested << " step(s) run; figures from "
    << (r.failure && r.failure->step == 0
            ? std::string("setup")
            : "step " + std::to_string(r.failure ? r.failure->step : r.steps_done))
    << (r.failure ? (r.failure->step ? " up to the failure"
                                     : " (setup: what it allocated "
                                       "was released while unwinding; "
                                       "the peak stands)")
                  : (r.steps_done >= 2 ? " (steady state)" : ""))
    << "\n";
  const std::string losses = losses_text(r);
  if (!losses.empty()) o << "loss: " << losses << "\n";
  o << failure_text(r, u) << "\n";

  o << "## Reconciliation: measured (ledger) vs analytic (native), ok = exact\n";
  o << reconciliation_table(r, u).text() << "\n";

  o << "## Device sources vs the ledger\n";
  if (!r.device_checks.empty()) o << device_table(r, u).text();
  o << unavailable_lines(r, "  ");
  if (auto oh = overhead_of(r))
    o << "overhead (cudaMemGetInfo used − ledger live, " << oh->first
      << "): " << in_unit(std::uint64_t(std::max<std::int64_t>(oh->second, 0)), u) << " " << u.name
      << " (CUDA context, cuBLAS workspace and modules, pool slack)\n";
  else
    o << "overhead (device used − ledger live): unavailable: " << r.memgetinfo.reason << "\n";
  o << "\n";

  o << "## True peak: " << in_unit(r.peak.bytes, u) << " " << u.name << " " << where_text(r.peak)
    << "\n";
  o << breakdown_table(r, u).text() << "\n";

  o << "## Reference profiles (analytic, for context; " << u.name
    << "; Total = params + gradients + optimizer states + activations)\n";
  o << references_table(r, u).text();
  for (const Estimate& e : r.estimates)
    if (e.profile == Profile::megatron || e.profile == Profile::zero) {
      o << "megatron and zero are GPT-style reference formulas (Korthikanti et al. 2022; "
           "ZeRO), not LLaMA's.\n";
      break;
    }
  return colourize(o.str(), colour);
}

std::string profile_markdown(const RunResult& r) {
  const TableUnit u = table_unit(std::max(max_figure(r.ledger), max_figure(r.native().figures)));
  std::ostringstream o;
  o << "### trainmem profile: " << run_title(r.model, r.train) << "\n\n";
  o << backend_line(r) << "\n\n";
  if (r.failure) o << "**" << failure_text(r, u) << "**\n\n";
  o << "#### Reconciliation: measured (ledger) vs analytic (native)\n\n"
    << reconciliation_table(r, u).markdown() << "\n";
  o << "#### Device sources\n\n";
  if (!r.device_checks.empty()) o << device_table(r, u).markdown() << "\n";
  const std::string un = unavailable_lines(r, "- ");
  if (!un.empty()) o << un << "\n";
  o << "#### True peak: " << in_unit(r.peak.bytes, u) << " " << u.name << " " << where_text(r.peak)
    << "\n\n"
    << breakdown_table(r, u).markdown() << "\n";
  o << "#### Reference profiles (" << u.name << ")\n\n" << references_table(r, u).markdown();
  return o.str();
}

std::string profile_csv(const RunResult& r) {
  report::Table t({{"category", report::Align::left},
                   {"measured"},
                   {"analytic"},
                   {"difference"},
                   {"rel_error"},
                   {"ok", report::Align::left}});
  for (const auto& row : reconcile_ledger_native(r))
    t.add_row({row.category, std::to_string(row.measured), std::to_string(row.analytic),
               std::to_string(row.difference), report::fixed(row.rel_error, 9),
               !row.judged ? ""
               : row.ok    ? "true"
                           : "false"});
  return t.csv();
}

std::string colourize(const std::string& text, Colour colour) {
  if (colour == Colour::off) {
    std::string out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line))
      out += (line.rfind("## ", 0) == 0 ? line.substr(3) : line) + "\n";
    return out;
  }
  const std::string green = "\033[32m", red = "\033[1;31m", bold = "\033[1m", reset = "\033[0m";
  std::istringstream in(text);
  std::ostringstream out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) {
      line = bold + line.substr(3) + reset;
    } else {
      for (const char* word : {" yes", " NO"}) {
        const std::size_t p = line.find(word);
        if (p == std::string::npos) continue;
        const std::size_t end = p + std::string(word).size();
        if (end != line.size() && line[end] != ' ') continue;
        const std::string& c = word[1] == 'y' ? green : red;
        line =
            line.substr(0, p + 1) + c + line.substr(p + 1, end - p - 1) + reset + line.substr(end);
        break;
      }
      if (line.rfind("OUT OF MEMORY", 0) == 0) line = red + line + reset;
    }
    out << line << "\n";
  }
  return out.str();
}

}  // namespace trainmem
