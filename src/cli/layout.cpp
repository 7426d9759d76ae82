// The parallel-layout flags and the per-rank report of `estimate` (src/cli/layout.hpp).
#include "layout.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>

#include "size.hpp"
#include "trainmem/analytic/dist_refs.hpp"
#include "trainmem/base/bytes.hpp"
#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/report/run_report.hpp"

namespace trainmem::cli {

using nlohmann::json;

void add_layout_flags(CLI::App& cmd, LayoutFlags& f) {
  cmd.add_option("--world-size", f.world, "GPUs the step is spread over, N = dp·tp·pp (default 1)")
      ->check(integer_check<std::int64_t>("a whole number of GPUs"));
  cmd.add_option("--dp", f.dp, "Data-parallel degree (default N / (tp·pp))")
      ->check(integer_check<std::int64_t>("a whole number"));
  cmd.add_option("--tp", f.tp, "Tensor-parallel degree (default 1)")
      ->check(integer_check<std::int64_t>("a whole number"));
  cmd.add_option("--pp", f.pp, "Pipeline stages, 1F1B schedule (default 1)")
      ->check(integer_check<std::int64_t>("a whole number"));
  cmd.add_option("--zero", f.zero,
                 "ZeRO stage over the data-parallel ranks: 0, 1 (optimizer states), 2 (+ "
                 "gradients; FSDP SHARD_GRAD_OP), 3 (+ parameters; FSDP FULL_SHARD)");
  cmd.add_flag("--sp", f.sp, "Sequence parallelism inside the tensor-parallel group (needs --tp)");
  cmd.add_option("--microbatches", f.microbatches,
                 "Micro-batches per optimizer step (M; the pipeline's in-flight count)")
      ->check(integer_check<std::int64_t>("a whole number"));
  cmd.add_option("--offload", f.offload,
                 "none | optimizer (ZeRO >= 1) | optimizer+params (ZeRO-3): kept in host memory");
  cmd.add_option(
      "--reduce-bucket", f.reduce_bucket,
      "ZeRO-2/3 reduce bucket in elements (DeepSpeed's reduce_bucket_size, default 5e8)");
  cmd.add_flag("--overlap-comm", f.overlap_comm, "A second reduce bucket (DeepSpeed overlap_comm)");
  cmd.add_option("--prefetch", f.prefetch,
                 "ZeRO-3: units (layers) gathered ahead of the one computing (default 1)")
      ->check(integer_check<std::int64_t>("a whole number"));
  cmd.add_option("--cuda-context", f.cuda_context,
                 "CUDA context per GPU, outside the books (default estimate 512MiB)");
  cmd.add_option("--nccl-memory", f.nccl_memory,
                 "NCCL buffers per GPU, outside the books (default: communicators × channels × "
                 "2 × NCCL_BUFFSIZE)");
  cmd.add_option("--nccl-channels", f.nccl_channels, "NCCL channels per communicator (default 16)")
      ->check(integer_check<std::int64_t>("a whole number"));
}

namespace {

std::uint64_t parse_elements(const std::string& text, const char* flag) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(v >= 1) || v > 1e18 ||
      std::floor(v) != v)
    throw InputError(std::string(flag) + ": '" + text +
                     "' is not a whole number of elements (e.g. 500000000 or 5e8)");
  return static_cast<std::uint64_t>(v);
}

}  // namespace

ParallelConfig resolve_layout(const LayoutFlags& f, const ModelConfig& model,
                              const TrainConfig& train) {
  ParallelConfig p;
  p.world = f.world;
  p.dp = f.dp;
  p.tp = f.tp;
  p.pp = f.pp;
  const auto zero = parse_zero(f.zero);
  if (!zero)
    throw InputError("--zero: '" + f.zero +
                     "' is not a stage; allowed: 0, 1, 2, 3 (or FSDP's NO_SHARD, SHARD_GRAD_OP, "
                     "FULL_SHARD)");
  p.zero = *zero;
  p.sp = f.sp;
  p.microbatches = f.microbatches;
  const auto off = parse_offload(f.offload);
  if (!off)
    throw InputError("--offload: '" + f.offload +
                     "' is not allowed; allowed: none, optimizer, "
                     "optimizer+params");
  p.offload = *off;
  if (!f.reduce_bucket.empty())
    p.reduce_bucket = parse_elements(f.reduce_bucket, "--reduce-bucket");
  p.overlap_comm = f.overlap_comm;
  p.prefetch = f.prefetch;
  if (f.nccl_channels < 1)
    throw InputError("--nccl-channels must be at least 1, got " + std::to_string(f.nccl_channels));
  p.resolve(f.dp != 0, model, train);
  return p;
}

OverheadOptions resolve_overheads(const LayoutFlags& f) {
  OverheadOptions o;
  if (!f.cuda_context.empty()) o.cuda_context = parse_size(f.cuda_context, "--cuda-context");
  if (!f.nccl_memory.empty()) o.nccl = parse_size(f.nccl_memory, "--nccl-memory");
  o.nccl_channels = f.nccl_channels;
  return o;
}

void check_layout_request(const Common& c, bool explain, bool paper) {
  if (c.optimizers.size() != 1)
    throw InputError(
        "--optimizer all: with --world-size above 1 give one optimizer (adamw or sgd)");
  if (c.checkpointing_modes.size() != 1)
    throw InputError(
        "--checkpointing both: with --world-size above 1 give one mode (none or full)");
  for (const auto& p : c.profiles)
    if (p != "native" && p != "hf-eager" && p != "megatron" && p != "zero")
      throw InputError("--profile " + p +
                       ": with --world-size above 1 the per-rank profile is "
                       "native (the default)");
  if (c.profiles.size() == 1 && c.profiles.front() != "native")
    throw InputError("--profile " + c.profiles.front() +
                     ": with --world-size above 1 the per-rank profile is native (the default)");
  if (explain) throw InputError("--explain: not yet available with --world-size above 1");
  if (paper) throw InputError("--paper: a single-GPU table; not with --world-size above 1");
}

namespace {

json layout_json(const ParallelConfig& p) {
  return json{{"world_size", p.world},
              {"dp", p.dp},
              {"tp", p.tp},
              {"pp", p.pp},
              {"zero", p.zero},
              {"sp", p.sp},
              {"microbatches", p.microbatches},
              {"offload", offload_name(p.offload)},
              {"reduce_bucket_elements", p.reduce_bucket},
              {"overlap_comm", p.overlap_comm},
              {"prefetch", p.prefetch}};
}

json rank_json(const RankEstimate& r) {
  json comm = json::array(), host = json::array();
  for (const auto& e : r.communication)
    comm.push_back(report::tensor_entry_json(e, "communication"));
  for (const auto& e : r.host) host.push_back(report::tensor_entry_json(e, "host"));
  const Estimate& e = r.est;
  return json{
      {"stage", r.stage},
      {"role", r.role},
      {"ranks", r.ranks},
      {"layers", r.layers},
      {"in_flight_microbatches", r.in_flight},
      {"local_params", r.local_params},
      {"shard_elements", r.shard_elements},
      {"padding_elements", r.padding_elements},
      {"figures", report::figures_json(e.figures, true)},
      {"peak_instant", e.peak_instant >= 0 ? json(e.instants[e.peak_instant].name) : json()},
      {"communication", comm},
      {"host_bytes", r.host_bytes},
      {"host", host},
      {"analytic", report::analytic_profile_json(e)}};
}

std::vector<ReferenceRank> references(const LayoutEstimate& le) {
  return {deepspeed_reference(le.model, le.train, le.layout),
          megatron_reference(le.model, le.train, le.layout)};
}

// The groups a reference can be compared on, for the first stage's peak (Megatron reports the
// first stage; DeepSpeed covers pp = 1 only, where stage 0 is every rank).
struct Group {
  const char* name;
  std::uint64_t ours;
  std::optional<std::uint64_t> deepspeed, megatron;  // nullopt: not counted
};

std::vector<Group> reference_groups(const LayoutEstimate& le,
                                    const std::vector<ReferenceRank>& refs) {
  const CategoryBytes& pk = le.ranks.front().est.figures.peak_breakdown;
  auto at = [&](Category c) { return pk[static_cast<int>(c)]; };
  const ReferenceRank& ds = refs[0];
  const ReferenceRank& mg = refs[1];
  auto some = [](bool covers, std::uint64_t v) {
    return covers ? std::optional<std::uint64_t>(v) : std::nullopt;
  };
  const std::uint64_t states =
      at(Category::params) + at(Category::gradients) + at(Category::optimizer_states);
  return {
      {"model states (params, gradients, optimizer)", states, some(ds.covers, ds.gpu_total),
       some(mg.covers, mg.gpu_total - mg.activations)},
      {"activations", at(Category::activations), std::nullopt, some(mg.covers, mg.activations)},
      {"workspace", at(Category::workspace), std::nullopt, std::nullopt},
      {"communication", at(Category::communication), std::nullopt, std::nullopt},
      {"inputs", at(Category::inputs), std::nullopt, std::nullopt},
      {"total (GPU)", le.ranks.front().est.figures.peak, some(ds.covers, ds.gpu_total),
       some(mg.covers, mg.gpu_total)},
  };
}

json references_json(const LayoutEstimate& le) {
  const auto refs = references(le);
  json out = json::array();
  for (const auto& r : refs) {
    json terms = json::array();
    for (const auto& t : r.terms)
      terms.push_back(
          {{"name", t.name}, {"bytes", t.bytes}, {"formula", t.formula}, {"host", t.host}});
    out.push_back({{"profile", r.profile},
                   {"source", r.source},
                   {"covers", r.covers},
                   {"why_not", r.why_not},
                   {"activations", r.activations},
                   {"gpu_total", r.gpu_total},
                   {"host_total", r.host_total},
                   {"terms", terms},
                   {"notes", r.notes}});
  }
  json groups = json::array();
  auto opt = [](const std::optional<std::uint64_t>& v) { return v ? json(*v) : json(); };
  for (const auto& g : reference_groups(le, refs))
    groups.push_back({{"group", g.name},
                      {"ours_stage0_at_peak", g.ours},
                      {"deepspeed", opt(g.deepspeed)},
                      {"megatron", opt(g.megatron)}});
  return {{"estimators", out}, {"by_group", groups}};
}

// Ours (stage 0 at its peak) beside each estimator, group by group; "-" where it counts nothing.
report::Table references_table(const LayoutEstimate& le, const std::vector<ReferenceRank>& refs,
                               ByteUnit u) {
  report::Table t({{"stage 0 at its peak", report::Align::left},
                   {"trainmem (" + std::string(u.name) + ")"},
                   {"deepspeed"},
                   {"megatron"},
                   {"trainmem − deepspeed"},
                   {"trainmem − megatron"}});
  auto cell = [&](const std::optional<std::uint64_t>& v) {
    return v ? format_bytes(*v, u)
             : std::string(refs[0].covers || refs[1].covers ? "not counted" : "-");
  };
  auto shortfall = [&](std::uint64_t ours, const std::optional<std::uint64_t>& v, bool covers) {
    if (!covers) return std::string("-");
    const std::uint64_t theirs = v ? *v : 0;
    return format_signed_bytes(static_cast<std::int64_t>(ours) - static_cast<std::int64_t>(theirs),
                               u);
  };
  for (const auto& g : reference_groups(le, refs))
    t.add_row({g.name, format_bytes(g.ours, u), cell(g.deepspeed), cell(g.megatron),
               shortfall(g.ours, g.deepspeed, refs[0].covers),
               shortfall(g.ours, g.megatron, refs[1].covers)});
  return t;
}

json layout_document(const LayoutEstimate& le) {
  json ranks = json::array();
  for (const auto& r : le.ranks) ranks.push_back(rank_json(r));
  const auto& o = le.overheads;
  json doc{{"schema", report::kSchema},
           {"model", report::model_json(le.model, le.model.param_count())},
           {"run", report::run_json(le.train, "", -1)},
           {"layout", layout_json(le.layout)},
           {"global_batch", le.global_batch},
           {"ranks", ranks},
           {"worst_rank", le.worst},
           {"overheads",
            {{"cuda_context", o.cuda_context},
             {"cuda_context_source", o.cuda_context_source},
             {"nccl", o.nccl},
             {"nccl_source", o.nccl_source}}},
           {"worst_total", le.worst_total()},
           {"references", references_json(le)}};
  return doc;
}

// Per-rank figures: stage, role, ranks, the categories, peak, host.
report::Table ranks_table(const LayoutEstimate& le, ByteUnit u, bool exact) {
  std::vector<report::Table::Column> cols = {
      {"stage"}, {"role", report::Align::left}, {"ranks"}, {"in flight"}};
  const char* names[] = {"params", "gradients",     "optimizer", "activations", "workspace",
                         "inputs", "communication", "peak",      "host"};
  for (const char* n : names)
    cols.push_back({exact ? std::string(n) : std::string(n) + " (" + u.name + ")"});
  report::Table t(cols);
  auto cell = [&](std::uint64_t b) { return exact ? std::to_string(b) : format_bytes(b, u); };
  for (const auto& r : le.ranks) {
    const auto& f = r.est.figures;
    const auto& pk = f.peak_breakdown;
    // The categories at the rank's peak instant (they add up to the peak).
    t.add_row({std::to_string(r.stage), r.role, std::to_string(r.ranks),
               std::to_string(r.in_flight), cell(pk[int(Category::params)]),
               cell(pk[int(Category::gradients)]), cell(pk[int(Category::optimizer_states)]),
               cell(pk[int(Category::activations)]), cell(pk[int(Category::workspace)]),
               cell(pk[int(Category::inputs)]), cell(pk[int(Category::communication)]),
               cell(f.peak), cell(r.host_bytes)});
  }
  return t;
}

}  // namespace

namespace {

ByteUnit layout_unit(const LayoutEstimate& le) {
  std::uint64_t max = le.worst_total();
  for (const auto& r : le.ranks) max = std::max(max, r.host_bytes);
  return table_unit(max);
}

// The prose and tables of the per-rank figures (text and Markdown).
void describe_layout(report::ReportWriter& w, const LayoutEstimate& le, ByteUnit u,
                     const std::string& title) {
  const auto& t = le.train;
  w.title(title + " — " + le.model.name + ", " + std::to_string(le.layout.world) + " " +
          le.overheads.unit_word() + ": " + le.layout.describe());
  w.line("micro-batch b " + std::to_string(t.batch) + " (global batch " +
         std::to_string(le.global_batch) + " = b·M·dp), s " + std::to_string(t.seq) + ", " +
         dtype_name(t.dtype) + ", " + optimizer_name(t.optimizer) + ", checkpointing " +
         checkpointing_name(t.checkpointing) + ", " + attention_name(t.attention) +
         " attention; profile native (docs/distributed.md)");
  if (const std::string family = report::family_line(le.model); !family.empty()) w.line(family);
  w.heading("Per rank at its peak (" + std::string(u.name) +
            "; ranks of one pipeline stage have identical books)");
  w.table(ranks_table(le, u, false));
  w.paragraph_break();
  const RankEstimate& worst = le.ranks[static_cast<std::size_t>(le.worst)];
  const auto& o = le.overheads;
  if (o.host_ranks) {
    w.strong("Worst rank: stage " + std::to_string(worst.stage) + ", peak " +
             format_bytes_with_unit(worst.est.figures.peak, u) +
             " (cpu ranks: no CUDA context, no NCCL buffers)");
  } else {
    w.strong("Worst rank: stage " + std::to_string(worst.stage) + ", peak " +
             format_bytes_with_unit(worst.est.figures.peak, u) + " + CUDA context " +
             format_bytes_with_unit(o.cuda_context, u) + " + NCCL " +
             format_bytes_with_unit(o.nccl, u) + " = " +
             format_bytes_with_unit(le.worst_total(), u));
    w.item("CUDA context: " + o.cuda_context_source);
    w.item("NCCL buffers: " + o.nccl_source);
  }
  w.item("peak instant: " + worst.est.instants[worst.est.peak_instant].name);
  w.item("parameters on the rank: " + report::with_commas(worst.local_params) +
         (le.layout.zero >= 1 ? ", ZeRO shard " + report::with_commas(worst.shard_elements) +
                                    " (padding " + report::with_commas(worst.padding_elements) + ")"
                              : ""));
  for (const auto& e : worst.communication)
    w.item("communication: " + e.name + " " + e.shape + " " + format_bytes_with_unit(e.bytes, u) +
           " — " + e.why);
  for (const auto& e : worst.host)
    w.item("host: " + e.name + " " + format_bytes_with_unit(e.bytes, u) + " — " + e.why);
  w.paragraph_break();
  const auto refs = references(le);
  w.heading("Published estimators beside the trace (docs/distributed-references.md)");
  w.table(references_table(le, refs, u));
  w.paragraph_break();
  for (const auto& r : refs) {
    if (!r.covers) {
      w.item(r.profile + ": no formula for this layout (" + r.why_not + ")");
      continue;
    }
    std::string terms;
    for (const auto& term : r.terms)
      terms += (terms.empty() ? "" : "; ") + term.name + " " + term.formula + " = " +
               format_bytes_with_unit(term.bytes, u) + (term.host ? " (host)" : "");
    w.item(r.profile + ": " + terms);
  }
  w.paragraph_break();
}

}  // namespace

std::string render_layout(const LayoutEstimate& le, Format format, report::Colour colour,
                          const std::string& title) {
  const ByteUnit u = layout_unit(le);
  auto w = report::make_writer(format, colour);
  describe_layout(*w, le, u, title);
  w->csv_table(ranks_table(le, u, true));
  w->document([&] { return layout_document(le); });
  return w->str();
}

namespace {

report::Table reconcile_table(const LayoutTrace& lt, ByteUnit u, bool exact) {
  report::Table t({{"stage"},
                   {"figure", report::Align::left},
                   {exact ? std::string("ledger") : "ledger (" + std::string(u.name) + ")"},
                   {exact ? std::string("analytic") : "analytic (" + std::string(u.name) + ")"},
                   {"equal", report::Align::left}});
  auto cell = [&](std::uint64_t b) { return exact ? std::to_string(b) : format_bytes(b, u); };
  for (std::size_t n = 0; n < lt.ranks.size(); ++n) {
    const RankTrace& r = lt.ranks[n];
    const MemoryFigures& a = lt.analytic.ranks[n].est.figures;
    const MemoryFigures& g = r.ledger;
    const struct {
      const char* name;
      std::uint64_t ledger, analytic;
    } rows[] = {{"params", g.params, a.params},
                {"gradients", g.gradients, a.gradients},
                {"optimizer_states", g.optimizer_states, a.optimizer_states},
                {"activations", g.activations, a.activations},
                {"activations_peak", g.activations_peak, a.activations_peak},
                {"workspace", g.workspace, a.workspace},
                {"inputs", g.inputs, a.inputs},
                {"communication at peak", g.peak_breakdown[int(Category::communication)],
                 a.peak_breakdown[int(Category::communication)]},
                {"peak", g.peak, a.peak}};
    if (n) t.add_rule();
    for (const auto& row : rows)
      t.add_row({std::to_string(r.stage), row.name, cell(row.ledger), cell(row.analytic),
                 report::check_cell(row.ledger == row.analytic)});
  }
  return t;
}

}  // namespace

std::string render_layout_trace(const LayoutTrace& lt, Format format, report::Colour colour) {
  const LayoutEstimate& le = lt.analytic;
  const ByteUnit u = layout_unit(le);
  auto w = report::make_writer(format, colour);
  // The per-rank figures (as `estimate` shows them), then the trace's reconciliation.
  describe_layout(*w, le, u, "trainmem profile (TRACED on meta, per rank)");
  w->heading("Each rank traced on meta (" + std::to_string(lt.steps) +
             " steps, the last one's ledger) against the per-rank analytic profile");
  w->table(reconcile_table(lt, u, false));
  w->paragraph_break();
  w->line(lt.all_match() ? "every rank's ledger equals the analytic profile byte for byte"
                         : "MISMATCH: see the rows marked NO",
          lt.all_match() ? report::Tone::ok : report::Tone::fail);
  w->csv_table(reconcile_table(lt, u, true));
  w->document([&] {
    json ranks = json::array();
    for (std::size_t n = 0; n < lt.ranks.size(); ++n) {
      const RankTrace& r = lt.ranks[n];
      json j = rank_json(le.ranks[n]);
      j["ledger"] = report::figures_json(r.ledger, true);
      j["ledger_communication_peak"] = r.communication_peak;
      j["ledger_tensors_at_peak"] = r.tensors_at_peak;
      j["matches_analytic"] = r.matches;
      j["differences"] = r.differences;
      ranks.push_back(std::move(j));
    }
    json doc = layout_document(le);
    doc["run"] = report::run_json(le.train, "meta", lt.steps);
    doc["ranks"] = ranks;
    doc["all_ranks_match"] = lt.all_match();
    return doc;
  });
  return w->str();
}

std::string render_maxbatch_layout(const Common& c, const ParallelConfig& par,
                                   const MaxbatchResult& m, const std::string& budget_source,
                                   std::uint64_t budget_bytes, bool vary_batch) {
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
  auto w = report::make_writer(c.format, stdout_colour(c.output));
  w->title("trainmem maxbatch per rank: " + c.model.name + ", " + std::to_string(par.world) +
           " GPUs: " + par.describe());
  if (const std::string family = report::family_line(c.model); !family.empty())
    w->paragraph(family);
  w->paragraph("budget per GPU " + format_bytes_with_unit(budget_bytes, u) + " (" + budget_source +
               "); overheads " + format_bytes_with_unit(over.total(), u) +
               " (CUDA context: " + over.cuda_context_source + "; NCCL: " + over.nccl_source + ")");
  w->banner("peaks: every rank's sharded step traced on meta (" + std::to_string(traced) +
            " configurations), the worst rank kept");
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
              {"layout", layout_json(par)},
              {"model", report::model_json(c.model, c.model.param_count())},
              {"run", report::run_json(c.train, "meta", 2)},
              {"traced", traced}};
    j["run"][vary] = s.best;
    return j;
  });
  return w->str();
}

namespace {

// Every rank of a measured job: its books at its peak, and whether they equal its stage's meta
// trace and analytic profile.
report::Table measured_table(const MeasuredLayout& ml, ByteUnit u, bool exact) {
  std::vector<report::Table::Column> cols = {{"rank"}, {"stage"}};
  const char* names[] = {"params",      "gradients",     "optimizer",
                         "activations", "communication", "peak"};
  for (const char* n : names)
    cols.push_back({exact ? std::string(n) : std::string(n) + " (" + u.name + ")"});
  cols.push_back({exact ? "step_seconds" : "step (s)"});
  cols.push_back({"= trace", report::Align::left});
  cols.push_back({"= analytic", report::Align::left});
  report::Table t(cols);
  auto cell = [&](std::uint64_t b) { return exact ? std::to_string(b) : format_bytes(b, u); };
  for (const MeasuredRank& r : ml.ranks) {
    const auto& pk = r.ledger.peak_breakdown;
    char secs[32];
    std::snprintf(secs, sizeof secs, exact ? "%.6f" : "%.3f", r.step_seconds);
    auto yes = [&](bool ok) {
      return exact ? std::string(ok ? "yes" : "NO") : report::check_cell(ok);
    };
    t.add_row({std::to_string(r.rank), std::to_string(r.stage), cell(pk[int(Category::params)]),
               cell(pk[int(Category::gradients)]), cell(pk[int(Category::optimizer_states)]),
               cell(pk[int(Category::activations)]), cell(pk[int(Category::communication)]),
               cell(r.ledger.peak), secs, yes(r.trace_differences.empty()),
               yes(r.analytic_differences.empty())});
  }
  return t;
}

}  // namespace

std::string render_measured_layout(const MeasuredLayout& ml, Format format, report::Colour colour) {
  const LayoutEstimate& le = ml.predicted.analytic;
  const ByteUnit u = layout_unit(le);
  auto w = report::make_writer(format, colour);
  const std::string n = std::to_string(ml.ranks.size());
  describe_layout(*w, le, u,
                  "trainmem profile (MEASURED on " + ml.backend + ", " + n + " ranks over " +
                      ml.collective + ")");
  w->heading("Every rank measured (" + std::to_string(ml.steps) +
             " steps, the last one's ledger) against its meta trace and the per-rank analytic "
             "profile");
  w->table(measured_table(ml, u, false));
  w->paragraph_break();
  std::size_t worst = 0;
  for (std::size_t r = 0; r < ml.ranks.size(); ++r)
    if (ml.ranks[r].ledger.peak > ml.ranks[worst].ledger.peak) worst = r;
  std::set<std::vector<std::uint64_t>> distinct;
  for (const auto& r : ml.ranks)
    distinct.insert({r.ledger.params, r.ledger.gradients, r.ledger.optimizer_states,
                     r.ledger.activations_peak, r.ledger.workspace, r.ledger.peak});
  w->line(ml.all_match() ? "every rank's measured ledger equals its meta trace and the analytic "
                           "profile byte for byte"
                         : "MISMATCH: see the rows marked NO and the differences below",
          ml.all_match() ? report::Tone::ok : report::Tone::fail);
  if (le.layout.offload != Offload::none) {
    std::string host;
    for (const auto& r : ml.ranks)
      host += (host.empty() ? "" : ", ") + std::to_string(r.rank) + ": " +
              format_bytes_with_unit(r.host_bytes, u);
    w->item("host memory per rank (--offload " + std::string(offload_name(le.layout.offload)) +
            "; the analytic's host bytes, compared above): " + host);
  }
  w->item("worst rank: " + std::to_string(ml.ranks[worst].rank) + ", peak " +
          format_bytes_with_unit(ml.ranks[worst].ledger.peak, u) +
          "; distinct books: " + std::to_string(distinct.size()) + " of " + n + " ranks");
  std::string losses;
  for (float l : ml.losses) {
    char b[32];
    std::snprintf(b, sizeof b, "%.6f", double(l));
    losses += (losses.empty() ? "" : ", ") +
              (std::isfinite(l) ? std::string(b)
                                : std::string(std::isnan(l) ? "NaN" : "Inf") + " (not finite)");
  }
  const std::string seed = "of --seed " + std::to_string(ml.seed);
  w->item("loss of the global batch (" + std::to_string(le.global_batch) + " rows; weights " +
          (ml.weights.empty() ? "random " + seed : ml.weights) + ", tokens " +
          (ml.tokens.empty() ? "random " + seed : ml.tokens) + ") per step: " + losses);
  for (const auto& r : ml.ranks) {
    for (const auto& d : r.trace_differences)
      w->line("rank " + std::to_string(r.rank) + ": " + d, report::Tone::fail);
    for (const auto& d : r.analytic_differences)
      w->line("rank " + std::to_string(r.rank) + ": " + d, report::Tone::fail);
  }
  if (ml.backend == "cuda") {
    // The device sources per rank: what the GPU used beyond the ledger (CUDA context, cuBLAS,
    // NCCL's own buffers, the pool's rounding) beside plan's stated estimate of it.
    const auto& o = le.overheads;
    report::Table t({{"rank"},
                     {"ledger peak (" + std::string(u.name) + ")"},
                     {"pool used high (" + std::string(u.name) + ")"},
                     {"cudaMemGetInfo peak (" + std::string(u.name) + ")"},
                     {"overhead = device - ledger (" + std::string(u.name) + ")"},
                     {"estimate: context + NCCL (" + std::string(u.name) + ")"}});
    bool any = false;
    for (const auto& r : ml.ranks) {
      if (!r.device_sources) continue;
      any = true;
      const std::int64_t over = std::int64_t(r.device_used_peak) - std::int64_t(r.ledger.peak);
      t.add_row({std::to_string(r.rank), format_bytes(r.ledger.peak, u),
                 format_bytes(r.pool_used_peak, u), format_bytes(r.device_used_peak, u),
                 format_signed_bytes(over, u), format_bytes(o.total(), u)});
    }
    if (any) {
      w->heading("Device sources per rank (the last step)");
      w->table(t);
      w->line("estimate: CUDA context " + o.cuda_context_source + "; NCCL " + o.nccl_source);
      if (ml.collective == "nccl") {
        w->line(
            "not in the estimate: the fp32 work buffer of 16-bit NCCL sums (4 bytes x the largest "
            "count one communicator reduces, kept) and, with groups, the world communicator "
            "beside the group ones");
        if (le.layout.pp > 1)
          w->line(
              "in the estimate but not in this run: the pipeline's NCCL communicator (the "
              "measured stages send through host memory over MPI)");
      } else {
        w->line(
            "--collectives mpi: no NCCL in this run (the estimate's NCCL buffers are absent); "
            "ranks sharing a GPU each see the others' memory in cudaMemGetInfo, while the pool's "
            "high-water is the rank's own");
      }
    } else {
      w->item("device sources: unavailable on rank 0 (" + ml.device_reason + ")");
    }
  }
  w->paragraph_break();
  w->csv_table(measured_table(ml, u, true));
  w->document([&] {
    json doc = layout_document(le);
    doc["run"] = report::run_json(le.train, ml.backend, ml.steps);
    doc["measured"] = true;
    doc["collective"] = ml.collective;
    doc["seed"] = ml.seed;
    doc["weights"] = ml.weights.empty() ? json(nullptr) : json(ml.weights);
    doc["tokens"] = ml.tokens.empty() ? json(nullptr) : json(ml.tokens);
    json losses = json::array();  // a NaN or Inf loss says so (JSON has no NaN)
    for (float l : ml.losses) losses.push_back(std::isfinite(l) ? json(l) : json("non_finite"));
    doc["losses"] = losses;
    json ranks = json::array();
    for (const auto& r : ml.ranks) {
      json j = {{"rank", r.rank},
                {"stage", r.stage},
                {"ledger", report::figures_json(r.ledger, true)},
                {"ledger_communication_peak", r.communication_peak},
                {"ledger_tensors_at_peak", r.tensors_at_peak},
                {"step_seconds", r.step_seconds},
                {"host_bytes", r.host_bytes},
                {"device_sources", r.device_sources},
                {"device_used_peak", r.device_sources ? json(r.device_used_peak) : json(nullptr)},
                {"pool_used_peak", r.device_sources ? json(r.pool_used_peak) : json(nullptr)},
                {"matches_trace", r.trace_differences.empty()},
                {"matches_analytic", r.analytic_differences.empty()},
                {"differences", json::array()}};
      for (const auto& d : r.trace_differences) j["differences"].push_back(d);
      for (const auto& d : r.analytic_differences) j["differences"].push_back(d);
      ranks.push_back(std::move(j));
    }
    doc["measured_ranks"] = ranks;
    doc["worst_measured_rank"] = ml.ranks[worst].rank;
    doc["all_ranks_match"] = ml.all_match();
    return doc;
  });
  return w->str();
}

std::string render_failed_rank(const MeasuredLayout& ml, const std::optional<std::uint64_t>& budget,
                               const std::string& command, Format format, report::Colour colour) {
  const LayoutEstimate& le = ml.predicted.analytic;
  const ByteUnit u = layout_unit(le);
  const MeasuredRank& r = ml.ranks.front();
  const RunFailure& f = *ml.failure;
  auto w = report::make_writer(format, colour);
  const std::string who =
      "rank " + std::to_string(r.rank) + " of " + std::to_string(le.layout.world);
  describe_layout(*w, le, u,
                  "trainmem " + command + " (MEASURED on " + ml.backend + ", " + who +
                      " OUT OF MEMORY: partial)");
  w->alert(failure_lines(f, budget, u));
  std::size_t k = 0;
  while (k + 1 < ml.predicted.ranks.size() && ml.predicted.ranks[k].stage != r.stage) ++k;
  const MemoryFigures& want = ml.predicted.ranks[k].ledger;
  w->heading("The " + who + " (stage " + std::to_string(r.stage) +
             ") up to the failure, beside its stage's meta trace of a whole step (" +
             std::string(u.name) + ")");
  report::Table t(
      {{"figure", report::Align::left}, {"measured up to the failure"}, {"trace (whole step)"}});
  const std::pair<const char*, std::uint64_t MemoryFigures::*> rows[] = {
      {"params", &MemoryFigures::params},
      {"gradients", &MemoryFigures::gradients},
      {"optimizer states", &MemoryFigures::optimizer_states},
      {"activations peak", &MemoryFigures::activations_peak},
      {"workspace", &MemoryFigures::workspace},
      {"peak", &MemoryFigures::peak}};
  for (const auto& [name, field] : rows)
    t.add_row({name, format_bytes(r.ledger.*field, u), format_bytes(want.*field, u)});
  w->table(t);
  w->line(
      "the other ranks' books are not in this report: when one rank fails the others may be "
      "waiting in a collective it left, so nothing is gathered (docs/distributed.md, "
      "\"Failure handling\")");
  w->document([&] {
    json doc = layout_document(le);
    doc["run"] = report::run_json(le.train, ml.backend, ml.steps);
    doc["measured"] = true;
    doc["complete"] = false;
    doc["collective"] = ml.collective;
    doc["seed"] = ml.seed;
    doc["rank"] = r.rank;
    doc["stage"] = r.stage;
    doc["ledger"] = report::figures_json(r.ledger, true);
    doc["trace_ledger"] = report::figures_json(want, true);
    doc["error"] = failure_json(f);
    return doc;
  });
  return w->str();
}

std::string render_compare_layout(const LayoutEstimate& le,
                                  const std::vector<CompareLayoutRow>& rows,
                                  const std::string& source, const std::string& backend, int steps,
                                  Format format, report::Colour colour) {
  std::uint64_t max = 0;
  for (const auto& r : rows) max = std::max({max, r.none.peak, r.full.peak});
  const ByteUnit u = table_unit(max);
  auto w = report::make_writer(format, colour);
  const auto& t = le.train;
  w->title("trainmem compare (" + source + ") — " + le.model.name + ", " +
           std::to_string(le.layout.world) + " " + le.overheads.unit_word() + ": " +
           le.layout.describe());
  w->line("micro-batch b " + std::to_string(t.batch) + " (global batch " +
          std::to_string(le.global_batch) + "), s " + std::to_string(t.seq) + ", " +
          dtype_name(t.dtype) + ", " + optimizer_name(t.optimizer) + ", " +
          attention_name(t.attention) + " attention; checkpointing none vs full, per rank");
  if (const std::string family = report::family_line(le.model); !family.empty()) w->line(family);
  auto table = [&](bool exact) {
    const std::string un = exact ? "" : " (" + std::string(u.name) + ")";
    report::Table tb({{"rank", report::Align::left},
                      {"stage"},
                      {"activations peak, none" + un},
                      {"activations peak, full" + un},
                      {"peak, none" + un},
                      {"peak, full" + un},
                      {"saved" + un},
                      {"= trace and analytic", report::Align::left}});
    auto cell = [&](std::uint64_t b) { return exact ? std::to_string(b) : format_bytes(b, u); };
    for (const auto& r : rows) {
      const std::int64_t saved = std::int64_t(r.none.peak) - std::int64_t(r.full.peak);
      tb.add_row({r.rank, std::to_string(r.stage), cell(r.none.activations_peak),
                  cell(r.full.activations_peak), cell(r.none.peak), cell(r.full.peak),
                  exact ? std::to_string(saved) : format_signed_bytes(saved, u),
                  exact ? std::string(r.matches ? "yes" : "NO") : report::check_cell(r.matches)});
    }
    return tb;
  };
  w->table(table(false));
  w->paragraph_break();
  bool all = !rows.empty();
  for (const auto& r : rows) all = all && r.matches;
  w->line(all ? "every row equals the per-rank analytic profile of its mode byte for byte"
              : "MISMATCH: see the rows marked NO",
          all ? report::Tone::ok : report::Tone::fail);
  w->csv_table(table(true));
  w->document([&] {
    json doc = {{"schema", report::kSchema},
                {"model", report::model_json(le.model, le.model.param_count())},
                {"run", report::run_json(le.train, backend, steps)},
                {"layout", layout_json(le.layout)},
                {"source", source},
                {"all_match", all}};
    json jr = json::array();
    for (const auto& r : rows)
      jr.push_back({{"rank", r.rank},
                    {"stage", r.stage},
                    {"none", report::figures_json(r.none, true)},
                    {"full", report::figures_json(r.full, true)},
                    {"analytic_none", report::figures_json(r.analytic_none, true)},
                    {"analytic_full", report::figures_json(r.analytic_full, true)},
                    {"saved", std::int64_t(r.none.peak) - std::int64_t(r.full.peak)},
                    {"matches", r.matches}});
    doc["rows"] = jr;
    return doc;
  });
  return w->str();
}

}  // namespace trainmem::cli
