// plan's report (include/trainmem/report/plan_report.hpp).
#include "trainmem/report/plan_report.hpp"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/base/bytes.hpp"
#include "trainmem/base/lora.hpp"
#include "trainmem/report/report.hpp"

namespace trainmem::report {
namespace {

// The offload column: ZeRO's (--offload) or, on one GPU, the activations'.
std::string offload_cell(const PlanCandidate& c) {
  return c.train.offload_activations ? "activations" : offload_name(c.layout.offload);
}

using nlohmann::json;

std::string str(std::int64_t v) {
  return std::to_string(v);
}

// Seconds in a table: three decimals, or two significant digits below 0.01 s (tiny models).
std::string secs(double v) {
  if (v == 0 || v >= 0.01) return report::fixed(v, 3);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

// "flash, sp, checkpointing full, offload optimizer" — a layout's settings beside its degrees.
std::string settings(const PlanCandidate& c) {
  std::string s = "b " + str(c.train.batch) + ", M " + str(c.layout.microbatches) +
                  ", checkpointing " + checkpointing_name(c.train) + ", " +
                  attention_name(c.train.attention) + " attention, " +
                  optimizer_name(c.train.optimizer);
  if (c.layout.sp) s += ", sp";
  s += ", offload " + std::string(offload_cell(c));
  return s;
}

// The distinct ranks' peaks, stage order, equal neighbours folded: "61.20 / 59.80×6 / 60.50".
std::string rank_peaks(const LayoutEstimate& e, ByteUnit u) {
  std::string out;
  for (std::size_t k = 0; k < e.ranks.size();) {
    std::size_t n = 1;
    while (k + n < e.ranks.size() && e.ranks[k + n].est.figures.peak == e.ranks[k].est.figures.peak)
      ++n;
    if (!out.empty()) out += " / ";
    out += format_bytes(e.ranks[k].est.figures.peak, u);
    if (n > 1) out += "×" + std::to_string(n);
    k += n;
  }
  return out;
}

std::string reason(const RejectedFamily& f, std::uint64_t budget, ByteUnit u) {
  if (f.too_big() && f.smallest)
    return "smallest worst-rank peak + overheads " +
           format_bytes_with_unit(f.smallest_worst_total, u) + " > " +
           format_bytes_with_unit(budget, u) + " (" + settings(*f.smallest) + ")";
  std::string out;
  for (const auto& m : f.messages) out += (out.empty() ? "" : "; ") + m;
  return out;
}

json cost_json(const StepCost& c) {
  return json{{"flops_per_gpu", c.flops_per_gpu},
              {"bubble", c.bubble},
              {"compute_seconds", c.compute_seconds},
              {"dp_bytes", c.dp_bytes},
              {"tp_bytes", c.tp_bytes},
              {"pp_bytes", c.pp_bytes},
              {"cp_bytes", c.cp_bytes},
              {"ep_bytes", c.ep_bytes},
              {"pcie_bytes", c.pcie_bytes},
              {"communication_seconds", c.communication_seconds},
              {"pcie_seconds", c.pcie_seconds},
              {"total_seconds", c.total_seconds}};
}

// "3", "3 (FSDP2)" or "3 (FSDP2 SHARD_GRAD_OP)": the ZeRO column.
std::string zero_cell(const ParallelConfig& p) {
  if (!p.per_parameter()) return str(p.zero);
  return str(p.zero) + (p.reshard_after_forward ? " (FSDP2)" : " (FSDP2 SHARD_GRAD_OP)");
}

// A refused family's name; under per-parameter sharding stages 2 and 3 are FSDP2's.
std::string family_label(const PlanResult& r, const RejectedFamily& f) {
  std::string name = family_name(f.dp, f.tp, f.pp, f.zero, f.cp, f.ep, f.etp);
  if (r.options.sharding == Sharding::per_parameter && f.zero >= 2)
    name += f.zero == 3 ? " (FSDP2)" : " (FSDP2 SHARD_GRAD_OP)";
  return name;
}

json layout_json(const PlanCandidate& c) {
  return json{{"dp", c.layout.dp},
              {"tp", c.layout.tp},
              {"pp", c.layout.pp},
              {"cp", c.layout.cp},
              {"ep", c.layout.ep},
              {"etp", c.layout.etp},
              {"zero", c.layout.zero},
              {"sharding", sharding_name(c.layout.sharding)},
              {"reshard_after_forward", c.layout.reshard_after_forward},
              {"sp", c.layout.sp},
              {"micro_batch", c.train.batch},
              {"microbatches", c.layout.microbatches},
              {"checkpointing", checkpointing_name(c.train)},
              {"attention", attention_name(c.train.attention)},
              {"optimizer", optimizer_name(c.train.optimizer)},
              {"offload", offload_cell(c)}};
}

json memory_json(const LayoutEstimate& e) {
  json ranks = json::array();
  for (const auto& r : e.ranks)
    ranks.push_back({{"stage", r.stage},
                     {"role", r.role},
                     {"ranks", r.ranks},
                     {"layers", r.layers},
                     {"in_flight", r.in_flight},
                     {"peak", r.est.figures.peak},
                     {"host_bytes", r.host_bytes},
                     {"figures", report::figures_json(r.est.figures, true)}});
  return json{{"worst_total", e.worst_total()},
              {"worst_stage", e.ranks.empty() ? json(nullptr) : json(e.ranks[e.worst].stage)},
              {"overheads",
               {{"cuda_context", e.overheads.cuda_context},
                {"nccl", e.overheads.nccl},
                {"cuda_context_source", e.overheads.cuda_context_source},
                {"nccl_source", e.overheads.nccl_source}}},
              {"ranks", ranks}};
}

json plan_json(const PlanResult& r) {
  const PlanOptions& o = r.options;
  json optimizers = json::array();
  for (Optimizer x : o.optimizers) optimizers.push_back(optimizer_name(x));
  // The recipe every layout trains (--finetune): full, or LoRA's rank and targets.
  const TrainConfig& ft = o.finetune;
  json finetune{{"finetune", !ft.lora() ? "full" : ft.quant4() ? "qlora" : "lora"}};
  if (ft.lora()) {
    finetune["lora_rank"] = ft.lora_rank;
    finetune["lora_targets"] = lora_targets_name(ft.lora_targets);
    if (ft.quantized()) finetune["quant"] = quant_name(ft.quant);
  }
  json policies = json::array(), offload = json::array();
  for (const PlanPolicy& p : o.policies) policies.push_back(p.name());
  for (bool on : o.activation_offload) offload.push_back(on);
  json j = {{"schema", report::kSchema},
            {"command", "plan"},
            {"model", report::model_json(r.model, r.model.param_count())},
            {"inputs",
             {{"gpus", o.gpus},
              {"gpu_memory", o.gpu_memory},
              {"margin", o.margin},
              {"budget", r.budget},
              {"host_memory", o.host_memory ? json(o.host_memory) : json(nullptr)},
              {"seq", o.seq},
              {"global_batch", o.global_batch},
              {"dtype", dtype_name(o.dtype)},
              {"optimizers", optimizers},
              {"checkpointing", policies},
              {"activation_offload", offload},
              {"finetune", finetune},
              {"top", o.top},
              {"step", o.step_profile},
              {"step_description", o.step.empty() ? json(nullptr) : json(o.step)}}},
            {"cost_model",
             {{"tflops", o.cost.tflops},
              {"link_gbps", o.cost.link_gbps},
              {"pcie_gbps", o.cost.pcie_gbps},
              {"overlap", false},
              {"documented_in", "docs/plan.md"}}},
            {"counts",
             {{"enumerated", r.enumerated},
              {"fitting", r.fitting},
              {"too_big", r.too_big},
              {"invalid", r.invalid},
              {"same_as_none_or_full", r.same_as_none_or_full},
              {"estimates", r.estimates}}}};
  json cands = json::array();
  for (std::size_t k = 0; k < r.candidates.size(); ++k) {
    const PlanCandidate& c = r.candidates[k];
    json x = {{"rank", k + 1}, {"layout", layout_json(c)}, {"cost", cost_json(c.cost)}};
    x["memory"] = c.memory ? memory_json(*c.memory) : json(nullptr);
    cands.push_back(x);
  }
  j["candidates"] = cands;
  const ByteUnit u = table_unit(r.options.gpu_memory);
  json rej = json::array();
  for (const auto& f : r.rejected) {
    json x = {{"family", family_label(r, f)},
              {"dp", f.dp},
              {"tp", f.tp},
              {"pp", f.pp},
              {"cp", f.cp},
              {"ep", f.ep},
              {"etp", f.etp},
              {"zero", f.zero},
              {"layouts", f.layouts},
              {"invalid", f.invalid},
              {"reason", reason(f, r.budget, u)},
              {"messages", f.messages}};
    x["smallest_worst_total"] = f.smallest ? json(f.smallest_worst_total) : json(nullptr);
    x["smallest"] = f.smallest ? layout_json(*f.smallest) : json(nullptr);
    rej.push_back(x);
  }
  j["rejected"] = rej;
  j["timing"] = {{"estimate_seconds", r.estimate_seconds}, {"total_seconds", r.total_seconds}};
  return j;
}

// A mixture of experts: "ep" and "etp" columns after "cp" (inserted into a row at the same
// place).
void insert_ep(const PlanResult& r, std::vector<report::Table::Column>& cols) {
  if (r.model.moe())
    cols.insert(cols.begin() + 5, {report::Table::Column{"ep"}, report::Table::Column{"etp"}});
}
// Candidate k's cells up to its step times (the tables' shared columns; seconds by `sec`).
template <class Sec>
std::vector<report::Cell> layout_cells(const PlanResult& r, std::size_t k, Sec&& sec) {
  const PlanCandidate& c = r.candidates[k];
  std::vector<report::Cell> row{std::to_string(k + 1),
                                str(c.layout.dp),
                                str(c.layout.tp),
                                str(c.layout.pp),
                                str(c.layout.cp),
                                zero_cell(c.layout),
                                c.layout.sp ? "yes" : "no",
                                checkpointing_name(c.train),
                                attention_name(c.train.attention),
                                optimizer_name(c.train.optimizer),
                                str(c.train.batch),
                                str(c.layout.microbatches),
                                offload_cell(c),
                                sec(c.cost.total_seconds),
                                sec(c.cost.compute_seconds),
                                sec(c.cost.communication_seconds),
                                sec(c.cost.pcie_seconds)};
  if (r.model.moe()) row.insert(row.begin() + 5, {str(c.layout.ep), str(c.layout.etp)});
  return row;
}

report::Table csv_table(const PlanResult& r) {
  std::vector<report::Table::Column> cols({{"rank"},
                                           {"dp"},
                                           {"tp"},
                                           {"pp"},
                                           {"cp"},
                                           {"zero"},
                                           {"sp"},
                                           {"checkpointing"},
                                           {"attention"},
                                           {"optimizer"},
                                           {"micro_batch"},
                                           {"microbatches"},
                                           {"offload"},
                                           {"step_seconds"},
                                           {"compute_seconds"},
                                           {"communication_seconds"},
                                           {"pcie_seconds"},
                                           {"worst_total"},
                                           {"overheads"},
                                           {"rank_peaks"},
                                           {"host_bytes"},
                                           {"budget"}});
  insert_ep(r, cols);
  report::Table t(std::move(cols));
  for (std::size_t k = 0; k < r.candidates.size(); ++k) {
    const PlanCandidate& c = r.candidates[k];
    std::string peaks, host = "0", worst = "", overheads = "";
    if (c.memory) {
      for (const auto& x : c.memory->ranks)
        peaks += (peaks.empty() ? "" : ";") + std::to_string(x.est.figures.peak);
      host = std::to_string(c.memory->ranks[c.memory->worst].host_bytes);
      worst = std::to_string(c.memory->worst_total());
      overheads = std::to_string(c.memory->overheads.total());
    }
    auto sec = [](double v) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.6g", v);
      return std::string(buf);
    };
    std::vector<report::Cell> row = layout_cells(r, k, sec);
    for (const std::string& x : {worst, overheads, peaks, host, std::to_string(r.budget)})
      row.emplace_back(x);
    t.add_row(std::move(row));
  }
  return t;
}

// The report's prose and tables (text, Markdown, HTML).
void write_prose(ReportWriter& w, const PlanResult& r) {
  const PlanOptions& o = r.options;
  const ByteUnit u = table_unit(o.gpu_memory);
  auto q = [&](std::uint64_t b) { return format_bytes_with_unit(b, u); };
  std::string optimizers;
  for (Optimizer x : o.optimizers)
    optimizers += (optimizers.empty() ? "" : ", ") + std::string(optimizer_name(x));
  w.title("trainmem plan: " + r.model.name + " (" +
          report::fixed(static_cast<double>(r.model.param_count()) / 1e9, 2) + " B params) on " +
          str(o.gpus) + " GPUs × " + q(o.gpu_memory) + ", seq " + str(o.seq) + ", global batch " +
          str(o.global_batch) + ", " + dtype_name(o.dtype) + ", " + optimizers +
          train_title_extras(o.finetune));
  w.paragraph_break();
  if (const std::string family = report::family_line(r.model); !family.empty()) w.paragraph(family);
  if (!o.step.empty()) w.paragraph("step: " + o.step);
  w.paragraph("budget per GPU " + q(r.budget) + " = " + q(o.gpu_memory) + " × (1 − " +
              report::fixed(o.margin, 2) +
              " --margin); a layout fits when its worst rank's peak + overheads (CUDA context, "
              "NCCL buffers) is at most this" +
              (o.host_memory ? ", and what a rank offloads at most " + q(o.host_memory) +
                                   " of host memory (--host-memory)"
                             : std::string("; host memory is not limited (--host-memory)")));
  w.paragraph("step time (docs/plan.md): compute at " + report::fixed(o.cost.tflops, 0) +
              " TFLOP/s per GPU (--tflops), communication at " +
              report::fixed(o.cost.link_gbps, 0) + " Gb/s (--link-gbps), offload over PCIe at " +
              report::fixed(o.cost.pcie_gbps, 0) + " Gb/s (--pcie-gbps), no overlap");
  w.paragraph(std::to_string(r.enumerated) + " layouts enumerated: " + std::to_string(r.fitting) +
              " fit, " + std::to_string(r.too_big) + " do not, " + std::to_string(r.invalid) +
              " refused by the layout checks" +
              (r.same_as_none_or_full ? ", " + std::to_string(r.same_as_none_or_full) +
                                            " budget layouts that are the none or full one"
                                      : std::string()) +
              " (" + std::to_string(r.estimates) + " per-rank estimates, " +
              report::fixed(r.total_seconds, 3) + " s)");
  if (r.candidates.empty()) {
    w.strong("nothing fits " + q(r.budget) + " per GPU");
  } else {
    w.heading("The best " + std::to_string(r.candidates.size()) + " layouts, fastest first");
    const std::string un = std::string(" (") + u.name + ")";
    std::vector<report::Table::Column> cols({{"#"},
                                             {"dp"},
                                             {"tp"},
                                             {"pp"},
                                             {"cp"},
                                             {"ZeRO"},
                                             {"sp", report::Align::left},
                                             {"ckpt", report::Align::left},
                                             {"attention", report::Align::left},
                                             {"optimizer", report::Align::left},
                                             {"b"},
                                             {"M"},
                                             {"offload", report::Align::left},
                                             {"step (s)"},
                                             {"compute"},
                                             {"comm"},
                                             {"PCIe"},
                                             {"worst rank + overheads" + un},
                                             {"rank peaks" + un},
                                             {"host/rank" + un}});
    insert_ep(r, cols);
    report::Table t(std::move(cols));
    for (std::size_t k = 0; k < r.candidates.size(); ++k) {
      const PlanCandidate& c = r.candidates[k];
      std::string worst = "-", peaks = "-", host = "-";
      if (c.memory) {
        worst = format_bytes(c.memory->worst_total(), u);
        peaks = rank_peaks(*c.memory, u);
        host = format_bytes(c.memory->ranks[c.memory->worst].host_bytes, u);
      }
      std::vector<report::Cell> row = layout_cells(r, k, secs);
      for (const std::string& x : {worst, peaks, host}) row.emplace_back(x);
      t.add_row(std::move(row));
    }
    w.table(t);
    w.paragraph_break();
    w.paragraph(
        std::string("step = compute + comm + PCIe seconds per optimizer step; rank peaks: ") +
        (o.hf_step() ? "each group of ranks whose shards have the same shapes, first rank "
                       "to last (×n: n equal groups)"
                     : "each pipeline stage's peak, first to last (×n: n equal stages)"));
  }
  if (!r.rejected.empty()) {
    w.heading("Families with no layout that fits");
    report::Table t(
        {{"family", report::Align::left}, {"layouts"}, {"reason", report::Align::left}});
    for (const auto& f : r.rejected)
      t.add_row({family_label(r, f), std::to_string(f.layouts), reason(f, r.budget, u)});
    w.table(t);
  }
}

}  // namespace

void write_plan(ReportWriter& w, const PlanResult& r) {
  w.document([&] { return plan_json(r); });
  w.csv_table(csv_table(r));
  write_prose(w, r);
}

}  // namespace trainmem::report
