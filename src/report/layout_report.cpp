// The per-rank reports of a parallel layout (include/trainmem/report/layout_report.hpp):
// estimate's, profile's (traced and measured), compare's and maxbatch's, and a failed rank's.
#include "trainmem/report/layout_report.hpp"

#include <algorithm>
#include <optional>

#include "layout_internal.hpp"
#include "trainmem/analytic/dist_refs.hpp"
#include "trainmem/base/bytes.hpp"
#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/lora.hpp"
#include "trainmem/report/replay_report.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/report/run_report.hpp"

namespace trainmem::report {

using nlohmann::json;

namespace {

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
      {"owned_elements", r.owned_elements},
      {"expert_params", r.expert_params},
      {"expert_shard_elements", r.expert_shard_elements},
      {"expert_padding_elements", r.expert_padding_elements},
      {"grad_rank", r.grad_rank},
      {"figures", report::figures_json(e.figures, true)},
      {"peak_instant", e.peak_instant >= 0 ? json(e.instants[e.peak_instant].name) : json()},
      {"communication", comm},
      {"host_bytes", r.host_bytes},
      {"host", host},
      {"analytic", report::analytic_profile_json(e)}};
}

std::vector<ReferenceRank> references(const LayoutEstimate& le) {
  return {deepspeed_reference(le.model, le.train, le.layout),
          megatron_reference(le.model, le.train, le.layout),
          mbridge_reference(le.model, le.train, le.layout)};
}

// The groups a reference can be compared on, for the first stage's peak (Megatron and mbridge
// report the first stage; DeepSpeed covers pp = 1 only, where stage 0 is every rank).
struct Group {
  const char* name;
  std::uint64_t ours;
  std::vector<std::optional<std::uint64_t>> theirs;  // per estimator; nullopt: not counted
};

std::vector<Group> reference_groups(const LayoutEstimate& le,
                                    const std::vector<ReferenceRank>& refs) {
  const CategoryBytes& pk = le.ranks.front().est.figures.peak_breakdown;
  auto at = [&](Category c) { return pk[static_cast<int>(c)]; };
  auto each = [&](auto&& value) {
    std::vector<std::optional<std::uint64_t>> v;
    for (const ReferenceRank& r : refs) v.push_back(r.covers ? value(r) : std::nullopt);
    return v;
  };
  using Opt = std::optional<std::uint64_t>;
  const std::vector<Opt> none(refs.size());
  const std::uint64_t states =
      at(Category::params) + at(Category::gradients) + at(Category::optimizer_states);
  return {
      {"model states (params, gradients, optimizer)", states,
       each([](const ReferenceRank& r) { return Opt(r.gpu_total - r.activations); })},
      {"activations", at(Category::activations), each([](const ReferenceRank& r) {
         return r.activations_counted ? Opt(r.activations) : std::nullopt;
       })},
      {"workspace", at(Category::workspace), none},
      {"communication", at(Category::communication), none},
      {"inputs", at(Category::inputs), none},
      {"total (GPU)", le.ranks.front().est.figures.peak,
       each([](const ReferenceRank& r) { return Opt(r.gpu_total); })},
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
  for (const auto& g : reference_groups(le, refs)) {
    json j{{"group", g.name}, {"ours_stage0_at_peak", g.ours}};
    for (std::size_t k = 0; k < refs.size(); ++k)
      j[refs[k].profile] = g.theirs[k] ? json(*g.theirs[k]) : json();
    groups.push_back(std::move(j));
  }
  return {{"estimators", out}, {"by_group", groups}};
}

// Ours (stage 0 at its peak) beside each estimator, group by group; "-" where it counts nothing.
report::Table references_table(const LayoutEstimate& le, const std::vector<ReferenceRank>& refs,
                               ByteUnit u) {
  std::vector<report::Table::Column> cols = {{"stage 0 at its peak", report::Align::left},
                                             {"trainmem (" + std::string(u.name) + ")"}};
  for (const auto& r : refs) cols.push_back({r.profile});
  for (const auto& r : refs) cols.push_back({"trainmem − " + r.profile});
  report::Table t(cols);
  bool any = false;
  for (const auto& r : refs) any |= r.covers;
  auto cell = [&](const std::optional<std::uint64_t>& v) {
    return v ? format_bytes(*v, u) : std::string(any ? "not counted" : "-");
  };
  auto shortfall = [&](std::uint64_t ours, const std::optional<std::uint64_t>& v, bool covers) {
    if (!covers) return std::string("-");
    const std::uint64_t theirs = v ? *v : 0;
    return format_signed_bytes(static_cast<std::int64_t>(ours) - static_cast<std::int64_t>(theirs),
                               u);
  };
  for (const auto& g : reference_groups(le, refs)) {
    std::vector<report::Cell> row = {report::Cell(g.name), report::Cell(format_bytes(g.ours, u))};
    for (const auto& v : g.theirs) row.push_back(report::Cell(cell(v)));
    for (std::size_t k = 0; k < refs.size(); ++k)
      row.push_back(report::Cell(shortfall(g.ours, g.theirs[k], refs[k].covers)));
    t.add_row(row);
  }
  return t;
}

}  // namespace

json layout_detail::layout_json(const ParallelConfig& p) {
  return json{{"world_size", p.world},
              {"dp", p.dp},
              {"tp", p.tp},
              {"pp", p.pp},
              {"cp", p.cp},
              {"ep", p.ep},
              {"etp", p.etp},
              {"edp", p.edp()},
              {"zero", p.zero},
              {"sp", p.sp},
              {"microbatches", p.microbatches},
              {"offload", offload_name(p.offload)},
              {"reduce_bucket_elements", p.reduce_bucket},
              {"overlap_comm", p.overlap_comm},
              {"prefetch", p.prefetch},
              {"sharding", sharding_name(p.sharding)},
              {"reshard_after_forward", p.reshard_after_forward}};
}

json layout_detail::layout_document(const LayoutEstimate& le) {
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

namespace {

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

namespace layout_detail {

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
         checkpointing_name(t) + ", " + attention_name(t.attention) +
         " attention; profile native (docs/distributed.md)" + train_title_extras(t));
  if (const std::string family = report::family_line(le.model); !family.empty()) w.line(family);
  w.heading("Per rank at its peak (" + std::string(u.name) +
            (le.layout.per_parameter()
                 ? "; ranks of one pipeline stage differ only in the optimizer states of the rows "
                   "they own: shown, data-parallel rank " +
                       std::to_string(le.ranks.front().grad_rank) +
                       (le.ranks.front().grad_rank == 0 ? ", which owns the most)" : ")")
             : le.layout.ep > 1
                 ? "; ranks of one pipeline stage may differ in the rows their experts "
                   "receive: shown, expert-parallel index " +
                       std::to_string(le.ranks.front().grad_rank / le.layout.etp % le.layout.ep) +
                       (le.ranks.front().grad_rank / le.layout.etp % le.layout.ep == 0
                            ? ", whose experts receive the most under balanced routing)"
                            : ")")
                 : "; ranks of one pipeline stage have identical books)"));
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
  w.item(
      "parameters on the rank: " + report::with_commas(worst.local_params) +
      (le.train.lora()
           ? " (" + report::with_commas(worst.est.trainable_params) + " trainable: the adapters)"
           : std::string()) +
      (le.layout.zero >= 1 ? ", ZeRO shard " + report::with_commas(worst.shard_elements) +
                                 " (padding " + report::with_commas(worst.padding_elements) + ")"
                           : "") +
      (worst.expert_params > 0
           ? "; the routed experts' " + report::with_commas(worst.expert_params) +
                 " in a flat vector of their own over the " + std::to_string(le.layout.edp()) +
                 " expert-data-parallel ranks" +
                 (le.layout.zero >= 1
                      ? ", shard " + report::with_commas(worst.expert_shard_elements) +
                            " (padding " + report::with_commas(worst.expert_padding_elements) + ")"
                      : std::string())
           : std::string()) +
      (le.layout.per_parameter()
           ? "; per-parameter (FSDP2): every parameter's ceil(rows/N) rows stored, " +
                 report::with_commas(worst.owned_elements) + " owned (the optimizer states')"
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

}  // namespace layout_detail

using namespace layout_detail;

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

// "0-3" / "0, 2" / "5": a list of ranks, runs joined.
std::string rank_list(const std::vector<std::int64_t>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

// The worst routed rank and the worst balanced stage: the highest peak, among equals (a peak
// the workspace decides) the most activations at their peak, then the first.
std::pair<std::uint64_t, std::uint64_t> badness(const MemoryFigures& f) {
  return {f.peak, f.activations_peak};
}
const RoutedRankTrace& worst_routed(const LayoutTrace& lt) {
  std::size_t w = 0;
  for (std::size_t n = 1; n < lt.routed.size(); ++n)
    if (badness(lt.routed[n].ledger) > badness(lt.routed[w].ledger)) w = n;
  return lt.routed[w];
}
const RankTrace& worst_balanced(const LayoutTrace& lt) {
  std::size_t w = 0;
  for (std::size_t n = 1; n < lt.ranks.size(); ++n)
    if (badness(lt.ranks[n].ledger) > badness(lt.ranks[w].ledger)) w = n;
  return lt.ranks[w];
}

// --routing FILE: every rank given it, beside its stage's balanced trace.
report::Table routed_table(const LayoutTrace& lt, ByteUnit u, bool exact) {
  const std::string un = exact ? "" : " (" + std::string(u.name) + ")";
  report::Table t({{"ranks", report::Align::left},
                   {"stage"},
                   {"ep index"},
                   {"expert rows, given"},
                   {"balanced"},
                   {"activations peak" + un},
                   {"communication peak" + un},
                   {"peak" + un},
                   {"− balanced" + un},
                   {"model states = analytic", report::Align::left}});
  auto cell = [&](std::uint64_t b) { return exact ? std::to_string(b) : format_bytes(b, u); };
  for (const RoutedRankTrace& r : lt.routed) {
    std::size_t k = 0;
    while (k + 1 < lt.ranks.size() && lt.ranks[k].stage != r.stage) ++k;
    const std::int64_t d = std::int64_t(r.ledger.peak) - std::int64_t(lt.ranks[k].ledger.peak);
    t.add_row({rank_list(r.ranks), std::to_string(r.stage), std::to_string(r.ep_index),
               std::to_string(r.max_rows), std::to_string(r.balanced_rows),
               cell(r.ledger.activations_peak), cell(r.communication_peak), cell(r.ledger.peak),
               exact ? std::to_string(d) : format_signed_bytes(d, u),
               report::check_cell(r.analytic_differences.empty())});
  }
  return t;
}

json routed_json(const LayoutTrace& lt) {
  json ranks = json::array();
  for (const RoutedRankTrace& r : lt.routed)
    ranks.push_back({{"ranks", r.ranks},
                     {"stage", r.stage},
                     {"ep_index", r.ep_index},
                     {"max_expert_rows", r.max_rows},
                     {"balanced_expert_rows", r.balanced_rows},
                     {"ledger", report::figures_json(r.ledger, true)},
                     {"ledger_communication_peak", r.communication_peak},
                     {"model_states_match_analytic", r.analytic_differences.empty()},
                     {"differences", r.analytic_differences}});
  const RoutedRankTrace& w = worst_routed(lt);
  const RankTrace& b = worst_balanced(lt);
  return {{"source", lt.routing_source},
          {"ranks", ranks},
          {"worst", {{"ranks", w.ranks}, {"stage", w.stage}, {"peak", w.ledger.peak}}},
          {"balanced_worst", {{"stage", b.stage}, {"peak", b.ledger.peak}}}};
}

// --allocator: each traced rank's ledger peak beside what PyTorch's allocator would hold.
report::Table allocator_table(const LayoutTrace& lt, ByteUnit u) {
  const std::string unit = " (" + std::string(u.name) + ")";
  report::Table t({{"stage"},
                   {"ledger peak" + unit},
                   {"allocated" + unit},
                   {"reserved" + unit},
                   {"+ overheads" + unit}});
  auto cell = [&](std::uint64_t b) { return format_bytes(b, u); };
  const std::uint64_t overheads = lt.analytic.overheads.total();
  for (const RankTrace& r : lt.ranks) {
    if (!r.allocator_model) continue;
    const CachingAllocatorStats& s = r.allocator_model->step;
    t.add_row({std::to_string(r.stage), cell(r.ledger.peak), cell(s.allocated.peak),
               cell(s.reserved.peak), cell(s.reserved.peak + overheads)});
  }
  return t;
}

}  // namespace

std::string render_layout_trace(const LayoutTrace& lt, Format format, report::Colour colour,
                                const std::string& title) {
  const LayoutEstimate& le = lt.analytic;
  const ByteUnit u = layout_unit(le);
  auto w = report::make_writer(format, colour);
  // The per-rank figures (as `estimate` shows them), then the trace's reconciliation.
  describe_layout(*w, le, u, title);
  w->heading("Each rank traced on meta (" + std::to_string(lt.steps) +
             " steps, the last one's ledger) against the per-rank analytic profile");
  w->table(reconcile_table(lt, u, false));
  w->paragraph_break();
  w->line(lt.all_match() ? "every rank's ledger equals the analytic profile byte for byte"
                         : "MISMATCH: see the rows marked NO",
          lt.all_match() ? report::Tone::ok : report::Tone::fail);
  const bool modelled = !lt.ranks.empty() && lt.ranks.front().allocator_model.has_value();
  if (modelled) {
    w->heading(
        "What PyTorch's caching allocator would reserve on each rank (a model; --allocator " +
        lt.ranks.front().allocator_model->spec +
        "; the last step's peaks; no device limit; docs/allocator.md)");
    w->table(allocator_table(lt, u));
  }
  if (!lt.routed.empty()) {
    w->heading("Every rank given the routing of " + lt.routing_source +
               " (its experts' rows per micro-batch and layer; the analytic assumes balanced "
               "routing, so it is compared on the model states only)");
    w->table(routed_table(lt, u, false));
    const RoutedRankTrace& wr = worst_routed(lt);
    const RankTrace& wb = worst_balanced(lt);
    w->paragraph_break();
    w->line(
        "worst rank under the given routing: " + rank_list(wr.ranks) + " (stage " +
        std::to_string(wr.stage) + ", ep index " + std::to_string(wr.ep_index) + "), peak " +
        format_bytes(wr.ledger.peak, u) + "; under balanced routing: stage " +
        std::to_string(wb.stage) + " (ep index 0), peak " + format_bytes(wb.ledger.peak, u) + " (" +
        format_signed_bytes(std::int64_t(wr.ledger.peak) - std::int64_t(wb.ledger.peak), u) + ")");
  }
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
      if (r.allocator_model)
        j["allocator_model"] = report::allocator_model_json(*r.allocator_model);
      ranks.push_back(std::move(j));
    }
    json doc = layout_document(le);
    doc["run"] = report::run_json(le.train, "meta", lt.steps);
    doc["ranks"] = ranks;
    doc["all_ranks_match"] = lt.all_match();
    if (!lt.routed.empty()) doc["given_routing"] = routed_json(lt);
    return doc;
  });
  return w->str();
}

std::string render_compare_layout(const LayoutEstimate& le,
                                  const std::vector<CompareLayoutRow>& rows,
                                  const std::string& source, const std::string& backend, int steps,
                                  Format format, report::Colour colour, const std::string& policy) {
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
          attention_name(t.attention) + " attention; checkpointing none vs " + policy +
          ", per rank" + train_title_extras(t));
  if (const std::string family = report::family_line(le.model); !family.empty()) w->line(family);
  const bool reserved = !rows.empty() && rows.front().reserved_none.has_value();  // --allocator
  auto table = [&](bool exact) {
    const std::string un = exact ? "" : " (" + std::string(u.name) + ")";
    std::vector<report::Table::Column> cols = {{"rank", report::Align::left},
                                               {"stage"},
                                               {"activations peak, none" + un},
                                               {"activations peak, " + policy + un},
                                               {"peak, none" + un},
                                               {"peak, " + policy + un},
                                               {"saved" + un}};
    if (reserved) {
      cols.push_back({"reserved, none" + un});
      cols.push_back({"reserved, " + policy + un});
    }
    cols.push_back({"= trace and analytic", report::Align::left});
    report::Table tb(cols);
    auto cell = [&](std::uint64_t b) { return exact ? std::to_string(b) : format_bytes(b, u); };
    for (const auto& r : rows) {
      const std::int64_t saved = std::int64_t(r.none.peak) - std::int64_t(r.full.peak);
      std::vector<report::Cell> row = {
          report::Cell(r.rank),
          report::Cell(std::to_string(r.stage)),
          report::Cell(cell(r.none.activations_peak)),
          report::Cell(cell(r.full.activations_peak)),
          report::Cell(cell(r.none.peak)),
          report::Cell(cell(r.full.peak)),
          report::Cell(exact ? std::to_string(saved) : format_signed_bytes(saved, u))};
      if (reserved) {
        row.emplace_back(r.reserved_none ? cell(*r.reserved_none) : std::string("-"));
        row.emplace_back(r.reserved_full ? cell(*r.reserved_full) : std::string("-"));
      }
      row.push_back(exact ? report::Cell(std::string(r.matches ? "yes" : "NO"))
                          : report::check_cell(r.matches));
      tb.add_row(std::move(row));
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
                    {"checkpointing", policy},
                    {"analytic_none", report::figures_json(r.analytic_none, true)},
                    {"analytic_full", report::figures_json(r.analytic_full, true)},
                    {"saved", std::int64_t(r.none.peak) - std::int64_t(r.full.peak)},
                    {"reserved_none", r.reserved_none ? json(*r.reserved_none) : json(nullptr)},
                    {"reserved_full", r.reserved_full ? json(*r.reserved_full) : json(nullptr)},
                    {"matches", r.matches}});
    doc["rows"] = jr;
    return doc;
  });
  return w->str();
}

}  // namespace trainmem::report
