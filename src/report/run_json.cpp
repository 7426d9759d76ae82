// The per-run JSON object of docs/design.md ("JSON output"); see
// include/trainmem/report/run_report.hpp. Its keys read back by diff: report/schema.hpp.
#include <cmath>

#include "trainmem/report/replay_report.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/run_report.hpp"
#include "trainmem/report/schema.hpp"

namespace trainmem {

using nlohmann::json;
namespace schema = report::schema;

namespace {}  // namespace

json routing_json(const RunResult& r) {
  const std::int64_t cap = moe_capacity(r.model, r.train);
  json layers = json::array();
  for (const LayerRoutingRecord& rec : r.routing) {
    json layer{{"layer", rec.layer}, {"tokens_per_expert", rec.tokens_per_expert}};
    if (cap > 0) layer["dropped"] = rec.dropped;
    layers.push_back(std::move(layer));
  }
  json j{{"model", r.model.name},
         {"batch", r.train.batch},
         {"seq", r.train.seq},
         {"experts", r.model.experts},
         {"experts_per_token", r.model.experts_per_token},
         {"step", r.steps_done},
         {"source", r.routing_source},
         {"layers", layers},
         {"note", r.routing_source != "measured"
                      ? "the routing the meta trace was given (it routes nothing); no byte of "
                        "trainmem's step depends on it; under a capacity `dropped` counts the "
                        "choices past each expert's capacity"
                  : cap > 0 ? "choices routed to each expert in the step's forward (before the "
                              "capacity: an expert computes at most `capacity` of them, `dropped` "
                              "the rest); no byte of trainmem's step depends on it: every expert "
                              "buffer holds experts*capacity rows"
                            : "tokens each expert received in the step's forward; no byte of "
                              "trainmem's step depends on it: every expert buffer holds "
                              "batch*seq*experts_per_token rows"}};
  if (cap > 0) {
    j["capacity_factor"] = r.train.capacity_factor;
    j["capacity"] = cap;
  }
  return j;
}

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
  j[schema::kSchemaKey] = report::kSchema;
  j[schema::kModel] = report::model_json(r.model, r.model.param_count());
  json& run = j[schema::kRun];
  run = report::run_json(r.train, r.backend, r.steps_requested);
  run["steps_done"] = r.steps_done;
  run["predicted"] = !r.computes;
  run["seed"] = r.seed;
  run["weights"] = r.weights.empty() ? json(nullptr) : json(r.weights);
  run["tokens"] = r.tokens.empty() ? json(nullptr) : json(r.tokens);
  json losses = json::array();
  // Meta predicts (no loss: null); a computed loss that is NaN or Inf says so.
  for (float l : r.losses)
    losses.push_back(std::isfinite(l) ? json(l) : r.computes ? json("non_finite") : json(nullptr));
  run["losses"] = losses;
  if (!r.non_finite_steps.empty() || !r.non_finite_weights.empty())
    run["non_finite"] = {{"steps", r.non_finite_steps}, {"weights", r.non_finite_weights}};
  run["step_seconds"] = r.step_seconds;
  if (!r.backend_note.empty()) run["backend_note"] = r.backend_note;
  run["device_budget"] = r.device_budget ? json(*r.device_budget) : json(nullptr);
  j[schema::kAnalytic] = report::analytic_json(r.estimates);

  json led = report::figures_json(r.ledger, true);
  led[schema::kPerLayerActivations] = r.per_layer_activations();
  // One run cannot identify coefficients; `trainmem sweep --fit` measures them.
  led[schema::kCoefficients] = nullptr;
  if (r.activations_by_layer.size() > 1) {
    led["per_layer_activations_by_layer"] = json(std::vector<std::uint64_t>(
        r.activations_by_layer.begin() + 1, r.activations_by_layer.end()));
    led["outside_layers_activations"] = r.activations_by_layer[0];
  }
  if (r.train.offload_activations) {
    led["offload_host_peak"] = r.offload_host_peak;
    led["offload_transfer_bytes"] = r.offload_transfer_bytes;
  }
  if (paged_optimizer(r.train.optimizer))
    led["optimizer_states_managed"] = r.optimizer_states_managed;
  if (!r.routing.empty()) led["routing"] = routing_json(r);
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
  json& measured = j[schema::kMeasured];
  measured = json{{schema::kLedger, led}};
  measured["pool"] = source("pool", r.pool.available, r.pool.reason, r.pool.to_json());
  measured["cupti"] = source("cupti", r.cupti.available, r.cupti.reason, r.cupti.to_json());
  measured["memgetinfo"] =
      source("memgetinfo", r.memgetinfo.available, r.memgetinfo.reason, r.memgetinfo.to_json());
  measured["unavailable"] = unavailable;

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
  j["allocator_model"] =
      r.allocator_model ? report::allocator_model_json(*r.allocator_model, &r.allocator_shadows)
                        : json(nullptr);
  if (r.failure) j["error"] = failure_json(*r.failure);
  return j;
}

json failure_json(const RunFailure& f) {
  json live = json::array();
  for (const auto& t : f.live_tensors) live.push_back(tensor_record_json(t));
  return json{
      {"kind", "out_of_memory"}, {"message", f.message}, {"requested_bytes", f.requested_bytes},
      {"category", f.category},  {"tensor", f.tensor},   {"live_bytes", f.live_bytes},
      {"step", f.step},          {"live_tensors", live}};
}

}  // namespace trainmem
