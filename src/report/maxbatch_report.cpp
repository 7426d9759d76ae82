// maxbatch's report (include/trainmem/report/maxbatch_report.hpp): one GPU's, or a layout's
// worst rank's, largest fitting batch or sequence with the probe past it.
#include "trainmem/report/maxbatch_report.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "layout_internal.hpp"
#include "trainmem/analytic/analytic.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/base/bytes.hpp"
#include "trainmem/base/lora.hpp"
#include "trainmem/report/layout_report.hpp"
#include "trainmem/report/report.hpp"

namespace trainmem::report {
namespace {

using layout_detail::layout_json;
using nlohmann::json;

// "peaks: <what was traced>", or with --allocator what PyTorch's allocator (a model, `how`)
// would reserve for it.
// A paged optimizer's state in CUDA managed memory is in no peak maxbatch searches with
// (docs/formulas.md, "Paged optimizers in the native step"): "; ..." saying so, or "".
std::string managed_outside(const MaxbatchRequest& rq) {
  const BnbOptimizer o = rq.hf_peft ? rq.hf_peft->peft.optimizer : BnbOptimizer::none;
  const bool paged = o == BnbOptimizer::paged_adamw || o == BnbOptimizer::paged_adamw8bit ||
                     paged_optimizer(rq.train.optimizer);
  return paged ? "; the paged optimizer's state in CUDA managed memory is outside them" : "";
}

std::string peaks_banner(const MaxbatchRequest& rq, const std::string& how,
                         const std::string& traced) {
  const std::string managed = managed_outside(rq);
  if (rq.hf_peft) {
    return std::string("peaks: the hf-peft profile's, as transformers 5.25 + peft ") +
           (rq.hf_peft->peft.peft_version.empty() ? std::string("0.21")
                                                  : rq.hf_peft->peft.peft_version) +
           " + bitsandbytes " +
           (rq.hf_peft->peft.bnb_version.empty() ? std::string("0.50")
                                                 : rq.hf_peft->peft.bnb_version) +
           " keep the step (params + gradients + optimizer states + activations at "
           "their maxima, no transients; docs/formulas.md, \"Profile hf-peft\")" +
           (managed.empty() ? "" : managed + " (evicted to the host under pressure)");
  }
  if (rq.hf_step) {
    const std::string seq = std::string("the HF step's event sequence (") +
                            profile_name(*rq.hf_step) + ", transformers 5.25, precision " +
                            precision_name(rq.hf.recipe(rq.train.dtype)) + ", AdamW " +
                            adamw_impl_name(rq.hf.adamw_impl) + "; docs/hf-step.md)" +
                            (rq.layout && rq.layout->distributed()
                                 ? ", every distinct rank's under FSDP2, the worst kept"
                                 : "");
    if (!rq.allocator) return "peaks: " + seq;
    return "peaks: what PyTorch's caching allocator would reserve (a model, --allocator " +
           rq.allocator->spec + ", " + how + "; docs/allocator.md) for " + seq;
  }
  if (!rq.allocator) return "peaks: " + traced + managed;
  return "peaks: what PyTorch's caching allocator would reserve (a model, --allocator " +
         rq.allocator->spec + ", " + how + "; docs/allocator.md) for " + traced + managed;
}

// The optimizer in titles: bitsandbytes' for hf-peft when given, else the run's.
std::string optimizer_text(const MaxbatchRequest& rq) {
  if (rq.hf_peft && rq.hf_peft->peft.optimizer != BnbOptimizer::none)
    return bnb_optimizer_name(rq.hf_peft->peft.optimizer);
  return optimizer_name(rq.train.optimizer);
}

// The attention in titles: hf-peft models transformers' SDPA whatever --attention says.
std::string attention_text(const MaxbatchRequest& rq) {
  if (rq.hf_step) return *rq.hf_step == Profile::hf_sdpa ? "sdpa" : "eager";
  return rq.hf_peft ? "sdpa" : attention_name(rq.train.attention);
}

// " finetune=qlora r=16 targets=all-linear" for hf-peft, else "".
std::string finetune_text(const MaxbatchRequest& rq) {
  if (!rq.hf_peft) return train_title_extras(rq.train);  // the native step's own LoRA, if any
  const PeftOptions& p = rq.hf_peft->peft;
  return std::string(" finetune=") + finetune_name(p.finetune) + " r=" + std::to_string(p.rank) +
         " targets=" + lora_targets_name(p.targets);
}

// What the JSON says about where the peaks come from, and the run as searched.
void add_profile_json(json& j, const MaxbatchRequest& rq) {
  j["profile"] = rq.hf_peft ? "hf-peft" : rq.hf_step ? profile_name(*rq.hf_step) : "native";
  if (rq.hf_step) {
    j["run"]["backend"] = nullptr;  // the HF step's event sequence, not a trace
    j["run"]["steps"] = nullptr;
    j["hf"] = {{"precision", precision_name(rq.hf.recipe(rq.train.dtype))},
               {"adamw_implementation", adamw_impl_name(rq.hf.adamw_impl)},
               {"transformers_era", hf_era_name(rq.hf.era.value_or(HfEra::v5_25))}};
    return;
  }
  if (!rq.hf_peft) return;
  const PeftOptions& p = rq.hf_peft->peft;
  j["run"]["optimizer"] = optimizer_text(rq);
  j["run"]["attention"] = attention_text(rq);
  j["run"]["backend"] = nullptr;  // estimated, not traced
  j["run"]["steps"] = nullptr;
  j["peft"] = {{"finetune", finetune_name(p.finetune)},
               {"lora_rank", p.rank},
               {"lora_targets", lora_targets_name(p.targets)},
               {"quant", quant_name(p.quant)},
               {"optimizer", optimizer_text(rq)},
               {"bnb_version", p.bnb_version.empty() ? json(nullptr) : json(p.bnb_version)},
               {"bnb_era", bnb_era_name(p.bnb_era)},
               {"peft_version", p.peft_version.empty() ? json(nullptr) : json(p.peft_version)},
               {"peft_era", peft_era_name(p.peft_era)}};
}

// A layout of several GPUs: the worst rank with the overheads outside the books.
std::string render_layout(const MaxbatchRequest& rq, const MaxbatchResult& m,
                          const std::string& budget_source, Format format, Colour colour) {
  const ModelConfig& model = rq.model;
  const TrainConfig& train = rq.train;
  const ParallelConfig& par = *rq.layout;
  const std::uint64_t budget_bytes = rq.budget;
  const bool vary_batch = rq.vary_batch;
  const SearchResult& s = m.search;
  const Overheads& over = m.layout_overheads;
  const std::int64_t lowest = m.lowest;
  const int traced = m.traced;
  const std::string vary = vary_batch ? "batch" : "seq";
  const ByteUnit u = table_unit(budget_bytes);
  report::Table t({{vary},
                   {"worst rank (" + std::string(u.name) + ")"},
                   {"+ overheads (" + std::string(u.name) + ")"},
                   {"budget (" + std::string(u.name) + ")"},
                   {"fits", report::Align::left}});
  report::Table exact({{vary}, {"worst_rank_peak"}, {"with_overheads"}, {"budget"}, {"fits"}});
  auto row = [&](std::int64_t v, const Probe& p) {
    const std::uint64_t need = p.peak + over.total();
    t.add_row({std::to_string(v), p.peak ? format_bytes(p.peak, u) : "overflow",
               format_bytes(need, u), format_bytes(budget_bytes, u), report::check_cell(p.fits)});
    exact.add_row({std::to_string(v), std::to_string(p.peak), std::to_string(need),
                   std::to_string(budget_bytes), p.fits ? "yes" : "NO"});
  };
  if (s.best > 0) row(s.best, s.at_best);
  row(m.next, s.at_next);
  auto w = report::make_writer(format, colour);
  w->title("trainmem maxbatch per rank: " + model.name + ", " + std::to_string(par.world) +
           " GPUs: " + par.describe() + train_title_extras(rq.train));
  if (const std::string family = report::family_line(model); !family.empty()) w->paragraph(family);
  w->paragraph("budget per GPU " + format_bytes_with_unit(budget_bytes, u) + " (" + budget_source +
               "); overheads " + format_bytes_with_unit(over.total(), u) +
               " (CUDA context: " + over.cuda_context_source + "; NCCL: " + over.nccl_source + ")");
  w->banner(peaks_banner(rq, "no device limit: its release-and-retry not counted",
                         "every rank's sharded step traced on meta (" + std::to_string(traced) +
                             " configurations), the worst rank kept"));
  if (s.best > 0)
    w->strong("largest micro-" + vary + " that fits every rank: " + std::to_string(s.best));
  else
    w->strong("nothing fits: even " + vary + " " + std::to_string(lowest) + " needs " +
              format_bytes_with_unit(s.at_next.peak + over.total(), u) + " on the worst rank");
  w->table(t);
  w->csv_table(exact);
  w->document([&] {
    json j = {{"schema", report::kSchema},
              {"budget", budget_bytes},
              {"budget_source", budget_source},
              {"vary", vary},
              {"best", s.best},
              {"worst_rank_peak", s.best > 0 ? json(s.at_best.peak) : json(nullptr)},
              {"next_worst_rank_peak", s.at_next.peak ? json(s.at_next.peak) : json(nullptr)},
              {"overheads",
               {{"cuda_context", over.cuda_context},
                {"cuda_context_source", over.cuda_context_source},
                {"nccl", over.nccl},
                {"nccl_source", over.nccl_source}}},
              {"peak_kind", rq.allocator ? "reserved" : "allocated"},
              {"allocator", rq.allocator ? json(rq.allocator->spec) : json(nullptr)},
              {"layout", layout_json(par)},
              {"model", report::model_json(model, model.param_count())},
              {"run", report::run_json(train, "meta", 2)},
              {"traced", traced}};
    j["run"][vary] = s.best;
    add_profile_json(j, rq);  // "profile", and the HF step's recipe
    return j;
  });
  return w->str();
}

// One GPU: the step's peak with the overhead no tensor owns.
std::string render_one_gpu(const MaxbatchRequest& rq, const MaxbatchResult& m,
                           const std::string& budget_source, const std::string& overhead_source,
                           Format format, Colour colour) {
  const bool vary_batch = rq.vary_batch;
  const std::string vary = vary_batch ? "batch" : "seq";
  const SearchResult& s = m.search;
  const std::int64_t lowest = m.lowest;
  const int traced = m.traced;

  const std::int64_t batch = vary_batch ? s.best : rq.train.batch;
  const std::int64_t seq = vary_batch ? rq.train.seq : s.best;
  const std::int64_t margin =
      s.best > 0 ? std::int64_t(rq.budget) - std::int64_t(s.at_best.peak + rq.overhead) : 0;

  const ByteUnit u = table_unit(rq.budget);
  auto q = [&](std::uint64_t b) { return format_bytes_with_unit(b, u); };
  report::Table t({{vary_batch ? "batch" : "seq"},
                   {std::string("peak (") + u.name + ")"},
                   {std::string("+ overhead (") + u.name + ")"},
                   {std::string("budget (") + u.name + ")"},
                   {std::string("margin (") + u.name + ")"},
                   {"fits", report::Align::left}});
  report::Table bytes_t({{vary},
                         {"peak"},
                         {"peak_plus_overhead"},
                         {"budget"},
                         {"margin"},
                         {"fits", report::Align::left}});
  auto row = [&](std::int64_t v, const Probe& p) {
    const std::int64_t m = std::int64_t(rq.budget) - std::int64_t(p.peak + rq.overhead);
    bytes_t.add_row({std::to_string(v), std::to_string(p.peak),
                     std::to_string(p.peak + rq.overhead), std::to_string(rq.budget),
                     std::to_string(m), p.fits ? "yes" : "NO"});
    t.add_row({std::to_string(v), p.peak ? format_bytes(p.peak, u) : "overflow",
               format_bytes(p.peak + rq.overhead, u), format_bytes(rq.budget, u),
               format_signed_bytes(m, u), report::check_cell(p.fits)});
  };
  if (s.best > 0) row(s.best, s.at_best);
  row(m.next, s.at_next);
  // The report, described once for every format.
  const auto w = make_writer(format, colour);
  w->document([&] {
    json j = {{"schema", report::kSchema},
              {"budget", rq.budget},
              {"vary", vary},
              {"batch", batch},
              {"seq", seq},
              {"peak", s.best > 0 ? json(s.at_best.peak) : json(nullptr)},
              {"next_peak", s.at_next.peak ? json(s.at_next.peak) : json(nullptr)},
              {"margin", margin},
              {"overhead", rq.overhead},
              {"overhead_source", overhead_source},
              {"budget_source", budget_source},
              {"step", rq.step},
              {"peak_kind", rq.allocator ? "reserved" : "allocated"},
              {"allocator", rq.allocator ? json(rq.allocator->spec) : json(nullptr)},
              {"model", report::model_json(rq.model, rq.model.param_count())},
              {"run", report::run_json(rq.train, "meta", 2)},
              {"traced", traced}};
    j["run"]["batch"] = batch;
    j["run"]["seq"] = seq;
    add_profile_json(j, rq);
    return j;
  });
  w->csv_table(bytes_t);
  w->title(
      "trainmem maxbatch: " + rq.model.name + "  " +
      (vary_batch ? "s=" + std::to_string(rq.train.seq) : "b=" + std::to_string(rq.train.batch)) +
      " " + dtype_name(rq.train.dtype) + " " + optimizer_text(rq) + "  checkpointing=" +
      checkpointing_name(rq.train) + " attention=" + attention_text(rq) + finetune_text(rq));
  w->paragraph_break();
  if (const std::string family = report::family_line(rq.model); !family.empty())
    w->paragraph(family);
  w->paragraph("budget " + q(rq.budget) + " (" + budget_source + "); overhead " + q(rq.overhead) +
               " (" + overhead_source + ")");
  w->banner(peaks_banner(rq, "on a device of budget − overhead",
                         "the meta backend's exact trace of the training step (" +
                             std::to_string(traced) + " configurations traced)"));
  if (s.best > 0)
    w->strong("largest " + vary + " that fits: " + std::to_string(s.best) + ", margin " +
              q(std::uint64_t(std::max<std::int64_t>(margin, 0))));
  else
    w->strong("nothing fits: even " + vary + " " + std::to_string(lowest) + " needs " +
              q(s.at_next.peak + rq.overhead));
  w->table(t);
  return w->str();
}

// The recompute a policy costs at the size it reached: the native step's FLOPs per optimizer step
// (a layout's worst rank's); 0 when nothing fits.
double recompute_flops_at(const MaxbatchRequest& rq, const MaxbatchResult& m) {
  if (m.search.best <= 0 || rq.hf_peft) return 0;
  TrainConfig t = rq.train;
  (rq.vary_batch ? t.batch : t.seq) = m.search.best;
  if (rq.layout && rq.layout->distributed()) {
    const LayoutEstimate e = estimate_layout(rq.model, t, *rq.layout, rq.overheads);
    return e.ranks[std::size_t(e.worst)].est.recompute_flops;
  }
  return estimate(Profile::native, rq.model, t).recompute_flops;
}

}  // namespace

std::string render_maxbatch_policies(const std::vector<MaxbatchPolicyRun>& runs,
                                     const std::string& budget_source,
                                     const std::string& overhead_source, Format format,
                                     Colour colour) {
  const MaxbatchRequest& first = runs.front().request;
  const bool vary_batch = first.vary_batch;
  const std::string vary = vary_batch ? "batch" : "seq";
  const bool layout = first.layout && first.layout->distributed();
  const ByteUnit u = table_unit(first.budget);
  // --finetune lora: hf-peft's rows and trainmem's own step's (native) side by side.
  bool mixed = false;
  for (const MaxbatchPolicyRun& r : runs) mixed |= bool(r.request.hf_peft) != bool(first.hf_peft);
  report::Table t({{mixed ? "step, checkpointing" : "checkpointing", report::Align::left},
                   {"largest " + vary},
                   {std::string(layout ? "worst rank peak (" : "peak (") + u.name + ")"},
                   {std::string(layout ? "+ overheads (" : "+ overhead (") + u.name + ")"},
                   {std::string("margin (") + u.name + ")"},
                   {"recompute (GFLOP/step)"},
                   {"next " + vary + " needs (" + std::string(u.name) + ")"}});
  report::Table bytes_t({{"checkpointing", report::Align::left},
                         {"largest_" + vary},
                         {"peak"},
                         {"peak_plus_overhead"},
                         {"margin"},
                         {"recompute_flops"},
                         {"next_" + vary},
                         {"next_peak_plus_overhead"}});
  json policies = json::array();
  for (const MaxbatchPolicyRun& r : runs) {
    const SearchResult& s = r.result.search;
    const std::uint64_t added = r.result.added_bytes;
    const bool fits = s.best > 0;
    const std::int64_t margin =
        fits ? std::int64_t(r.request.budget) - std::int64_t(s.at_best.peak + added) : 0;
    const double flops = recompute_flops_at(r.request, r.result);
    const std::string name = (mixed ? (r.request.hf_peft ? "hf-peft, " : "native, ") : "") +
                             checkpointing_name(r.request.train);
    const std::uint64_t next_need = s.at_next.peak ? s.at_next.peak + added : 0;
    t.add_row({name, fits ? std::to_string(s.best) : "none fits",
               fits ? format_bytes(s.at_best.peak, u) : "-",
               fits ? format_bytes(s.at_best.peak + added, u) : "-",
               fits ? format_signed_bytes(margin, u) : "-",
               r.request.hf_peft ? "-" : report::fixed(flops / 1e9, 2),
               std::to_string(r.result.next) + ": " +
                   (next_need ? format_bytes(next_need, u) : std::string("overflow"))});
    bytes_t.add_row({name, std::to_string(s.best), std::to_string(fits ? s.at_best.peak : 0),
                     std::to_string(fits ? s.at_best.peak + added : 0), std::to_string(margin),
                     report::fixed(flops, 0), std::to_string(r.result.next),
                     std::to_string(next_need)});
    policies.push_back({{"checkpointing", checkpointing_name(r.request.train)},
                        {"profile", r.request.hf_peft ? "hf-peft" : "native"},
                        {"best", fits ? json(s.best) : json(nullptr)},
                        {"peak", fits ? json(s.at_best.peak) : json(nullptr)},
                        {"margin", margin},
                        {"recompute_flops", r.request.hf_peft ? json(nullptr) : json(flops)},
                        {"next", r.result.next},
                        {"next_peak", s.at_next.peak ? json(s.at_next.peak) : json(nullptr)},
                        {"added", added},
                        {"traced", r.result.traced}});
  }
  const auto w = make_writer(format, colour);
  w->document([&] {
    json j = {{"schema", report::kSchema},
              {"budget", first.budget},
              {"budget_source", budget_source},
              {"vary", vary},
              {"step", first.step},
              {"peak_kind", first.allocator ? "reserved" : "allocated"},
              {"allocator", first.allocator ? json(first.allocator->spec) : json(nullptr)},
              {"overhead_source",
               layout ? json("the layout's per-GPU overheads") : json(overhead_source)},
              {"layout", layout ? json(first.layout->describe()) : json(nullptr)},
              {"model", report::model_json(first.model, first.model.param_count())},
              {"run", report::run_json(first.train, "meta", 2)},
              {"policies", policies}};
    j["run"]["checkpointing"] = nullptr;  // one per policy
    j["run"][vary] = nullptr;             // searched
    add_profile_json(j, first);
    return j;
  });
  w->csv_table(bytes_t);
  w->title("trainmem maxbatch per checkpointing policy: " + first.model.name + "  " +
           (vary_batch ? "s=" + std::to_string(first.train.seq)
                       : "b=" + std::to_string(first.train.batch)) +
           " " + dtype_name(first.train.dtype) + " " + optimizer_text(first) +
           " attention=" + attention_text(first) + finetune_text(first) +
           (first.train.offload_activations ? " offload-activations" : "") +
           (layout
                ? ", " + std::to_string(first.layout->world) + " GPUs: " + first.layout->describe()
                : ""));
  w->paragraph_break();
  if (const std::string family = report::family_line(first.model); !family.empty())
    w->paragraph(family);
  w->paragraph("budget " + format_bytes_with_unit(first.budget, u) + " (" + budget_source + ")" +
               (layout
                    ? "; the per-GPU overheads (CUDA context, NCCL) are in the + overheads column"
                    : "; overhead " + format_bytes_with_unit(first.overhead, u) + " (" +
                          overhead_source + ")"));
  const std::string managed = managed_outside(first);
  w->banner(peaks_banner(first, "on a device of budget − overhead",
                         std::string("the meta backend's exact trace of the training step") +
                             (layout ? ", per rank (the worst rank)" : "")));
  if (mixed)
    w->banner(
        "native rows: the meta backend's exact trace of trainmem's own LoRA step (adapters in " +
        std::string(dtype_name(first.train.dtype)) +
        (bnb_optimizer(first.train.optimizer) || first.train.dtype == DType::f32
             ? std::string(", no master copy")
             : std::string(" with fp32 master weights")) +
        (first.train.quantized()
             ? std::string(first.train.quant8() ? ", on the 8-bit " : ", on the 4-bit ") +
                   quant_name(first.train.quant) + " base dequantized around each GEMM"
             : std::string()) +
        ", attention=" + attention_name(first.train.attention) + "; docs/native-plan.md, " +
        (first.train.quant4()   ? "\"QLoRA\")"
         : first.train.quant8() ? "\"8-bit base\")"
                                : "\"LoRA\")") +
        managed);
  w->table(t);
  if (mixed)
    w->line(
        "recompute: not computed for hf-peft (the native step's FLOP count does not apply); "
        "for the native rows, the forward work the policy re-runs in backward.");
  else if (first.hf_peft)
    w->line("recompute: not computed for hf-peft (the native step's FLOP count does not apply).");
  else
    w->line("recompute: the forward work the policy re-runs in backward at its largest " + vary +
            " (docs/formulas.md, \"Recompute FLOPs\"); a policy saves memory for that time.");
  return w->str();
}

std::string render_maxbatch(const MaxbatchRequest& rq, const MaxbatchResult& m,
                            const std::string& budget_source, const std::string& overhead_source,
                            Format format, Colour colour) {
  if (rq.layout && rq.layout->distributed())
    return render_layout(rq, m, budget_source, format, colour);
  return render_one_gpu(rq, m, budget_source, overhead_source, format, colour);
}

}  // namespace trainmem::report
