// trainmem plan — the cheapest parallel layout that fits: every layout of --gpus N GPUs
// (dp·tp·pp, ZeRO stage, sp, checkpointing, attention, optimizer, micro-batch size, offload)
// whose worst rank fits --gpu-memory less --margin, ranked by an estimated step time
// (include/trainmem/analytic/plan.hpp; the cost model: docs/plan.md). Exit 3 when nothing fits (the
// report, with each rejected family's reason, is still written).
//
// Output by --format:
//   table     the inputs, the best --top K layouts with per-rank memory, the rejected families;
//   markdown  the same as Markdown (the report is described once, on a ReportWriter);
//   csv       the best layouts, one row each, exact figures (bytes, seconds);
//   json      schema "trainmem/1": {"schema", "command": "plan", "model", "inputs",
//             "cost_model", "counts", "candidates", "rejected", "timing"}.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.hpp"
#include "size.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/analytic/plan.hpp"
#include "trainmem/base/bytes.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/report_writer.hpp"

namespace trainmem::cli {
namespace {

using nlohmann::json;

struct PlanFlags {
  std::string model = "llama-7b";
  std::int64_t gpus = 0;  // required
  CLI::Option* gpus_given = nullptr;
  std::string gpu_memory;
  std::int64_t seq = 512;
  std::int64_t global_batch = 0;  // required
  CLI::Option* global_batch_given = nullptr;
  std::string dtype = "bf16";
  std::string optimizer = "adamw";
  double margin = 0.05;
  std::int64_t top = 10;
  double tflops = CostModel{}.tflops;
  double link_gbps = CostModel{}.link_gbps;
  double pcie_gbps = CostModel{}.pcie_gbps;
  std::string cuda_context;
  std::string nccl_memory;
  std::int64_t nccl_channels = OverheadOptions{}.nccl_channels;
  std::string format = "table";
  std::string output;
  std::string log_level = "info";
};

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
                  ", checkpointing " + checkpointing_name(c.train.checkpointing) + ", " +
                  attention_name(c.train.attention) + " attention, " +
                  optimizer_name(c.train.optimizer);
  if (c.layout.sp) s += ", sp";
  s += ", offload " + std::string(offload_name(c.layout.offload));
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
              {"pcie_bytes", c.pcie_bytes},
              {"communication_seconds", c.communication_seconds},
              {"pcie_seconds", c.pcie_seconds},
              {"total_seconds", c.total_seconds}};
}

json layout_json(const PlanCandidate& c) {
  return json{{"dp", c.layout.dp},
              {"tp", c.layout.tp},
              {"pp", c.layout.pp},
              {"zero", c.layout.zero},
              {"sp", c.layout.sp},
              {"micro_batch", c.train.batch},
              {"microbatches", c.layout.microbatches},
              {"checkpointing", checkpointing_name(c.train.checkpointing)},
              {"attention", attention_name(c.train.attention)},
              {"optimizer", optimizer_name(c.train.optimizer)},
              {"offload", offload_name(c.layout.offload)}};
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
  json j = {{"schema", report::kSchema},
            {"command", "plan"},
            {"model", report::model_json(r.model, r.model.param_count())},
            {"inputs",
             {{"gpus", o.gpus},
              {"gpu_memory", o.gpu_memory},
              {"margin", o.margin},
              {"budget", r.budget},
              {"seq", o.seq},
              {"global_batch", o.global_batch},
              {"dtype", dtype_name(o.dtype)},
              {"optimizers", optimizers},
              {"top", o.top}}},
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
    json x = {{"family", family_name(f.dp, f.tp, f.pp, f.zero)},
              {"dp", f.dp},
              {"tp", f.tp},
              {"pp", f.pp},
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

report::Table csv_table(const PlanResult& r) {
  report::Table t({{"rank"},
                   {"dp"},
                   {"tp"},
                   {"pp"},
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
    t.add_row({std::to_string(k + 1),
               str(c.layout.dp),
               str(c.layout.tp),
               str(c.layout.pp),
               str(c.layout.zero),
               c.layout.sp ? "yes" : "no",
               checkpointing_name(c.train.checkpointing),
               attention_name(c.train.attention),
               optimizer_name(c.train.optimizer),
               str(c.train.batch),
               str(c.layout.microbatches),
               offload_name(c.layout.offload),
               sec(c.cost.total_seconds),
               sec(c.cost.compute_seconds),
               sec(c.cost.communication_seconds),
               sec(c.cost.pcie_seconds),
               worst,
               overheads,
               peaks,
               host,
               std::to_string(r.budget)});
  }
  return t;
}

void write_report(report::ReportWriter& w, const PlanResult& r) {
  const PlanOptions& o = r.options;
  const ByteUnit u = table_unit(o.gpu_memory);
  auto q = [&](std::uint64_t b) { return format_bytes_with_unit(b, u); };
  std::string optimizers;
  for (Optimizer x : o.optimizers)
    optimizers += (optimizers.empty() ? "" : ", ") + std::string(optimizer_name(x));
  w.title("trainmem plan: " + r.model.name + " (" +
          report::fixed(static_cast<double>(r.model.param_count()) / 1e9, 2) + " B params) on " +
          str(o.gpus) + " GPUs × " + q(o.gpu_memory) + ", seq " + str(o.seq) + ", global batch " +
          str(o.global_batch) + ", " + dtype_name(o.dtype) + ", " + optimizers);
  w.paragraph_break();
  if (const std::string family = report::family_line(r.model); !family.empty()) w.paragraph(family);
  w.paragraph("budget per GPU " + q(r.budget) + " = " + q(o.gpu_memory) + " × (1 − " +
              report::fixed(o.margin, 2) +
              " --margin); a layout fits when its worst rank's peak + overheads (CUDA context, "
              "NCCL buffers) is at most this");
  w.paragraph("step time (docs/plan.md): compute at " + report::fixed(o.cost.tflops, 0) +
              " TFLOP/s per GPU (--tflops), communication at " +
              report::fixed(o.cost.link_gbps, 0) + " Gb/s (--link-gbps), offload over PCIe at " +
              report::fixed(o.cost.pcie_gbps, 0) + " Gb/s (--pcie-gbps), no overlap");
  w.paragraph(std::to_string(r.enumerated) + " layouts enumerated: " + std::to_string(r.fitting) +
              " fit, " + std::to_string(r.too_big) + " do not, " + std::to_string(r.invalid) +
              " refused by the layout checks (" + std::to_string(r.estimates) +
              " per-rank estimates, " + report::fixed(r.total_seconds, 3) + " s)");
  if (r.candidates.empty()) {
    w.strong("nothing fits " + q(r.budget) + " per GPU");
  } else {
    w.heading("The best " + std::to_string(r.candidates.size()) + " layouts, fastest first");
    const std::string un = std::string(" (") + u.name + ")";
    report::Table t({{"#"},
                     {"dp"},
                     {"tp"},
                     {"pp"},
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
    for (std::size_t k = 0; k < r.candidates.size(); ++k) {
      const PlanCandidate& c = r.candidates[k];
      std::string worst = "-", peaks = "-", host = "-";
      if (c.memory) {
        worst = format_bytes(c.memory->worst_total(), u);
        peaks = rank_peaks(*c.memory, u);
        host = format_bytes(c.memory->ranks[c.memory->worst].host_bytes, u);
      }
      t.add_row({std::to_string(k + 1), str(c.layout.dp), str(c.layout.tp), str(c.layout.pp),
                 str(c.layout.zero), c.layout.sp ? "yes" : "no",
                 checkpointing_name(c.train.checkpointing), attention_name(c.train.attention),
                 optimizer_name(c.train.optimizer), str(c.train.batch), str(c.layout.microbatches),
                 offload_name(c.layout.offload), secs(c.cost.total_seconds),
                 secs(c.cost.compute_seconds), secs(c.cost.communication_seconds),
                 secs(c.cost.pcie_seconds), worst, peaks, host});
    }
    w.table(t);
    w.paragraph_break();
    w.paragraph(
        "step = compute + comm + PCIe seconds per optimizer step; rank peaks: each "
        "pipeline stage's peak, first to last (×n: n equal stages)");
  }
  if (!r.rejected.empty()) {
    w.heading("Families with no layout that fits");
    report::Table t(
        {{"family", report::Align::left}, {"layouts"}, {"reason", report::Align::left}});
    for (const auto& f : r.rejected)
      t.add_row({family_name(f.dp, f.tp, f.pp, f.zero), std::to_string(f.layouts),
                 reason(f, r.budget, u)});
    w.table(t);
  }
}

int run_plan(const PlanFlags& flags) {
  if (flags.gpus_given && !flags.gpus_given->count())
    throw InputError("--gpus is required: the number of GPUs N (>= 1), e.g. --gpus 8");
  if (flags.gpu_memory.empty())
    throw InputError("--gpu-memory is required: a SIZE (80GiB, 24GB, 512MiB)");
  if (flags.global_batch_given && !flags.global_batch_given->count())
    throw InputError("--global-batch is required: sequences per optimizer step (>= 1)");
  // The model, --seq, --dtype, --optimizer, --format and --output as every command checks them.
  CommonFlags cf;
  cf.model = flags.model;
  cf.batch = 1;
  cf.seq = flags.seq;
  cf.dtype = flags.dtype;
  cf.optimizer = flags.optimizer;
  cf.profile = "native";
  cf.format = flags.format;
  cf.output = flags.output;
  const Common c = resolve_common(cf, true, false);

  PlanOptions o;
  o.gpus = flags.gpus;
  o.gpu_memory = parse_size(flags.gpu_memory, "--gpu-memory");
  o.margin = flags.margin;
  o.seq = c.train.seq;
  o.global_batch = flags.global_batch;
  o.dtype = c.train.dtype;
  o.optimizers = c.optimizers;
  if (flags.top < 1) throw InputError("--top must be at least 1, got " + str(flags.top));
  o.top = static_cast<std::size_t>(flags.top);
  o.cost.tflops = flags.tflops;
  o.cost.link_gbps = flags.link_gbps;
  o.cost.pcie_gbps = flags.pcie_gbps;
  if (!flags.cuda_context.empty())
    o.overheads.cuda_context = parse_size(flags.cuda_context, "--cuda-context");
  if (!flags.nccl_memory.empty()) o.overheads.nccl = parse_size(flags.nccl_memory, "--nccl-memory");
  if (flags.nccl_channels < 1)
    throw InputError("--nccl-channels must be at least 1, got " + str(flags.nccl_channels));
  o.overheads.nccl_channels = flags.nccl_channels;
  const PlanResult r = plan(c.model, o);

  const auto w = report::make_writer(c.format, stdout_colour(c.output));
  w->document([&] { return plan_json(r); });
  w->csv_table(csv_table(r));
  write_report(*w, r);
  write_output(c.output, w->str());
  return r.candidates.empty() ? 3 : 0;
}

}  // namespace

Runner register_plan(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "plan",
      "The fastest parallel layouts (dp/tp/pp, ZeRO, sp, checkpointing, micro-batch, "
      "offload) whose worst rank fits --gpu-memory");
  auto flags = std::make_shared<PlanFlags>();
  PlanFlags& f = *flags;
  cmd->add_option(
         "--model", f.model,
         "A preset (" +
             [] {
               std::string s;
               for (const auto& n : preset_names()) s += (s.empty() ? "" : ", ") + n;
               return s;
             }() +
             ") or a HuggingFace config.json path")
      ->capture_default_str();
  f.gpus_given = cmd->add_option("--gpus", f.gpus, "Number of GPUs N = dp·tp·pp (required, >= 1)")
                     ->check(integer_check<std::int64_t>("an integer; allowed: an integer >= 1"));
  cmd->add_option("--gpu-memory", f.gpu_memory,
                  "Memory of one GPU: a SIZE (80GiB, 24GB; required)");
  cmd->add_option("--seq", f.seq, "Sequence length s (>= 2)")
      ->check(integer_check<std::int64_t>("an integer; allowed: an integer >= 2"))
      ->capture_default_str();
  f.global_batch_given =
      cmd->add_option("--global-batch", f.global_batch,
                      "Sequences per optimizer step G = b·M·dp (required, >= 1)")
          ->check(integer_check<std::int64_t>("an integer; allowed: an integer >= 1"));
  cmd->add_option("--dtype", f.dtype, "Training dtype: bf16|fp16|fp32")->capture_default_str();
  cmd->add_option("--optimizer", f.optimizer, "The optimizer of every layout: adamw|sgd|lomo|all")
      ->capture_default_str();
  cmd->add_option("--margin", f.margin,
                  "Fraction of --gpu-memory kept back: a layout fits within gpu-memory × (1 − "
                  "margin)")
      ->capture_default_str();
  cmd->add_option("--top", f.top, "How many of the fastest fitting layouts to show")
      ->check(integer_check<std::int64_t>("an integer; allowed: an integer >= 1"))
      ->capture_default_str();
  cmd->add_option("--tflops", f.tflops, "Achieved dense TFLOP/s per GPU (the cost model)")
      ->capture_default_str();
  cmd->add_option("--link-gbps", f.link_gbps,
                  "Gb/s per GPU for collectives and pipeline transfers (the cost model)")
      ->capture_default_str();
  cmd->add_option("--pcie-gbps", f.pcie_gbps, "Gb/s host <-> device for offload (the cost model)")
      ->capture_default_str();
  cmd->add_option("--cuda-context", f.cuda_context,
                  "Per-rank CUDA context bytes, a SIZE (default: the stated estimate)");
  cmd->add_option("--nccl-memory", f.nccl_memory,
                  "Per-rank NCCL buffer bytes, a SIZE (default: channels × peers × NCCL_BUFFSIZE)");
  cmd->add_option("--nccl-channels", f.nccl_channels,
                  "NCCL channels per communicator, for the NCCL buffer estimate")
      ->check(integer_check<std::int64_t>("an integer; allowed: an integer >= 1"))
      ->capture_default_str();
  cmd->add_option("--format", f.format, "table|json|csv|markdown")->capture_default_str();
  cmd->add_option("--output", f.output, "Write the report to FILE instead of stdout");
  add_log_level_flag(*cmd, f.log_level);
  return [flags] { return run_plan(*flags); };
}

}  // namespace trainmem::cli
