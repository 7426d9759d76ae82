// estimate's report (include/trainmem/report/estimate_report.hpp): the memory table per
// (optimizer, checkpointing mode, profile), the legend, the per-layer chart, the paper's table
// and, with --explain, the per-tensor lists and formulas.
#include "trainmem/report/estimate_report.hpp"

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trainmem/base/lora.hpp"
#include "trainmem/report/replay_report.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/run_report.hpp"
#include "trainmem/report/schema.hpp"
#include "trainmem/report/svg_chart.hpp"

namespace trainmem::report {
namespace {

using nlohmann::json;

bool several(const std::vector<EstimateRun>& runs) {
  return runs.size() > 1;
}

// The optimizer a run steps with: bitsandbytes' when hf-peft was given one (then hf-peft is the
// run's only profile), else the torch optimizer of the run's TrainConfig.
std::string optimizer_of(const EstimateRun& r) {
  for (const auto& e : r.estimates)
    if (e.hf.peft.optimizer != BnbOptimizer::none) return bnb_optimizer_name(e.hf.peft.optimizer);
  return optimizer_name(r.train.optimizer);
}

std::vector<std::string> key_headers(const std::vector<EstimateRun>& runs) {
  if (several(runs)) return {"Optimizer", "Checkpointing", "Profile"};
  return {"Profile"};
}

std::vector<report::MemoryRow> memory_rows(const std::vector<EstimateRun>& runs) {
  std::vector<report::MemoryRow> rows;
  for (const auto& r : runs)
    for (const auto& e : r.estimates) {
      report::MemoryRow row;
      if (several(runs)) row.keys = {optimizer_of(r), checkpointing_name(r.train)};
      row.keys.push_back(profile_name(e.profile));
      row.figures = e.figures;
      rows.push_back(std::move(row));
    }
  return rows;
}

report::Table figures_table(const std::vector<EstimateRun>& runs) {
  report::Table t = report::memory_table(key_headers(runs), {});
  const auto rows = memory_rows(runs);
  std::size_t n = 0;
  for (const auto& r : runs) {
    if (&r != &runs.front()) t.add_rule();
    for (std::size_t k = 0; k < r.estimates.size(); ++k, ++n) {
      std::vector<report::Cell> cells(rows[n].keys.begin(), rows[n].keys.end());
      const auto& f = rows[n].figures;
      for (auto b : {f.params, f.gradients, f.optimizer_states, f.activations, f.sum, f.peak})
        cells.emplace_back(report::gib2(b));
      t.add_row(std::move(cells));
    }
  }
  return t;
}

std::string title(const EstimateResult& c, const std::vector<EstimateRun>& runs) {
  const TrainConfig& t = c.train;
  std::ostringstream o;
  o << "trainmem estimate: " << c.model.name << " ("
    << report::fixed(static_cast<double>(runs.front().estimates.front().param_count) / 1e9, 2)
    << " B params), batch " << t.batch << ", seq " << t.seq << ", " << dtype_name(t.dtype)
    << ", attention " << attention_name(t.attention)
    << (t.offload_activations ? ", activations offloaded" : "");
  if (!several(runs))
    o << ", " << optimizer_of(runs.front()) << ", checkpointing " << checkpointing_name(t);
  o << train_title_extras(t) << "  (GiB = 2^30 bytes)";
  return o.str();
}

const char* kLegend =
    "Total = Params + Gradients + Optimizer States + Activations, as published tables add "
    "them. Activations = alive at the end of forward.\n"
    "Peak = the step's high-water mark: native is exact (workspace and inputs included), and so "
    "are hf-eager/hf-sdpa in transformers 5.25 (the step's event sequence); the other "
    "reference profiles add the category maxima (no workspace).";

// The "why" block: per-layer bytes as one coefficient of s·b·h, profile by profile, next to
// ZeRO's 12 elements.
report::Table why_table(const EstimateRun& r) {
  report::Table t({{"Profile", report::Align::left},
                   {"c_sbh", report::Align::right},
                   {"c_sbi", report::Align::right},
                   {"c_as2b", report::Align::right},
                   {"c_sb", report::Align::right},
                   {"other B/layer", report::Align::right},
                   {"= X·sbh per layer", report::Align::right},
                   {"per layer GiB", report::Align::right},
                   {"Activations GiB", report::Align::right}});
  for (const auto& e : r.estimates) {
    const auto& c = e.activations.per_layer;
    t.add_row({profile_name(e.profile), report::coef(c.sbh), report::coef(c.sbi),
               report::coef(c.as2b), report::coef(c.sb), std::to_string(c.other_bytes),
               report::fixed(report::sbh_equivalent(e), 2),
               report::gib2(e.activations.per_layer_bytes), report::gib2(e.figures.activations)});
  }
  return t;
}

std::string why_text(const EstimateResult& c, const EstimateRun& r) {
  const auto& m = c.model;
  const double h = static_cast<double>(m.hidden);
  std::ostringstream o;
  o << "Why these activations? Per layer, bytes = c_sbh·sbh + c_sbi·sbi + c_as2b·as²b + c_sb·sb"
    << " (+ other), checkpointing " << checkpointing_name(r.train) << ".\n"
    << "Here i/h = " << report::fixed(static_cast<double>(m.intermediate) / h, 4)
    << " (SwiGLU width), a·s/h = "
    << report::fixed(static_cast<double>(m.heads) * static_cast<double>(c.train.seq) / h, 4)
    << " (attention scores per token), so each coefficient weighs as X·sbh below. ZeRO's "
       "12·hbs elements are 12·"
    << dtype_size(c.train.dtype) << " = " << 12 * dtype_size(c.train.dtype)
    << " bytes·sbh per layer.\n\n";
  o << why_table(r).text();
  for (const auto& e : r.estimates) {
    if (e.profile != Profile::hf_eager && e.profile != Profile::hf_sdpa &&
        e.profile != Profile::hf_peft)
      continue;
    if (e.profile == Profile::hf_peft)
      o << "\nhf-peft: " << report::with_commas(e.trainable_params)
        << " trainable adapter elements (" << report::gib2(e.figures.gradients)
        << " GiB of gradients); the frozen base and the "
        << "adapters take " << report::gib2(e.figures.params) << " GiB.";
    o << "\n"
      << profile_name(e.profile) << ": the loop (" << loop_name(e.hf.loop) << ") holds "
      << report::gib2(e.activations.loop_bytes) << " GiB at the end of forward (the returned logits"
      << (e.activations.loop.size() > 1 ? ", past_key_values" : "") << "), counted in activations";
    if (!e.hf.use_cache && e.use_cache_bytes > 0)
      o << "; --use-cache would add " << report::gib2(e.use_cache_bytes)
        << " GiB (past_key_values)";
    o << ".\n";
  }
  return o.str();
}

// A published memory table, row by row (GiB as printed), to set the estimate beside.
struct PaperRow {
  Optimizer optimizer;
  Checkpointing checkpointing;
  double params, gradients, states, activations, total;
};

// LOMO: Lv et al. 2023, "Full Parameter Fine-tuning for Large Language Models with Limited
// Resources", Table 1: LLaMA-7B, batch 8, seq 512, fp16 (GB there = GiB). Display only: no
// term of any profile reads these figures.
const PaperRow kLomoTable1[] = {
    {Optimizer::adamw, Checkpointing::none, 12.55, 12.55, 75.31, 45.61, 147.02},
    {Optimizer::adamw, Checkpointing::full, 12.55, 12.55, 75.31, 1.79, 102.20},
    {Optimizer::sgd, Checkpointing::none, 12.55, 12.55, 25.10, 45.61, 96.81},
    {Optimizer::sgd, Checkpointing::full, 12.55, 12.55, 25.10, 1.79, 51.99},
    {Optimizer::lomo, Checkpointing::none, 12.55, 0.24, 0.00, 45.61, 59.40},
    {Optimizer::lomo, Checkpointing::full, 12.55, 0.24, 0.00, 1.79, 14.58},
};

// The paper's table beside the estimate's first HF profile (or the first profile), row by
// row: each figure, the paper's, and the difference (ours - paper).
report::Table paper_table(const std::vector<EstimateRun>& runs) {
  report::Table t({{"Optimizer", report::Align::left},
                   {"Checkpointing", report::Align::left},
                   {"Profile", report::Align::left},
                   {"Activations", report::Align::right},
                   {"paper", report::Align::right},
                   {"diff", report::Align::right},
                   {"Total", report::Align::right},
                   {"paper", report::Align::right},
                   {"diff", report::Align::right},
                   {"paper's parts", report::Align::right}});
  const auto gib = [](std::uint64_t b) { return in_unit(b, kGiB); };
  const auto signed2 = [](double v) {
    const double r = std::round(v * 100) / 100;
    return (r > 0 ? "+" : r < 0 ? "-" : " ") + report::fixed(std::fabs(r), 2);
  };
  for (const auto& r : runs) {
    const Estimate* e = &r.estimates.front();
    for (const auto& x : r.estimates)
      if (x.profile == Profile::hf_eager || x.profile == Profile::hf_sdpa) {
        e = &x;
        break;
      }
    for (const auto& p : kLomoTable1) {
      if (p.optimizer != r.train.optimizer || p.checkpointing != r.train.checkpointing ||
          !r.train.checkpoint_layers.spec.empty())
        continue;
      const double acts = gib(e->figures.activations), total = gib(e->figures.sum);
      const double parts = p.params + p.gradients + p.states + p.activations;
      t.add_row({optimizer_name(p.optimizer), checkpointing_name(p.checkpointing),
                 profile_name(e->profile), report::fixed(acts, 2), report::fixed(p.activations, 2),
                 signed2(acts - p.activations), report::fixed(total, 2), report::fixed(p.total, 2),
                 signed2(total - p.total), report::fixed(parts, 2)});
    }
  }
  return t;
}

const char* kPaperLegend =
    "paper = LOMO (Lv et al. 2023) Table 1, LLaMA-7B b 8 s 512 fp16, GiB as printed; diff = "
    "this estimate - paper; paper's parts = its Params + Gradients + Optimizer States + "
    "Activations (its Total is 1.00 above them without checkpointing). No figure of the "
    "estimate is fitted to the paper.";

// The explanation of one checkpointing mode (--explain), in each human form: the terminal's
// per-layer coefficients worked through and, per profile, the formulas, tensors and instants;
// Markdown's coefficient table and, per profile, the formula, notes and tensor table.
std::string explanation_text(const EstimateResult& c, const EstimateRun& r) {
  std::string o = "\n" + why_text(c, r);
  for (const auto& e : r.estimates) o += "\n" + report::explain_text(e);
  return o;
}

std::string explanation_markdown(const EstimateRun& r) {
  std::ostringstream o;
  o << "\n### Per-layer coefficients (checkpointing " << checkpointing_name(r.train) << ")\n\n"
    << why_table(r).markdown();
  for (const auto& e : r.estimates) {
    o << "\n#### " << profile_name(e.profile) << ", checkpointing " << checkpointing_name(r.train)
      << ": " << e.label << "\n\n"
      << "per layer = " << report::per_layer_formula(e) << " = "
      << report::gib2(e.activations.per_layer_bytes) << " GiB; activations "
      << report::gib2(e.figures.activations) << " GiB, activations_peak "
      << report::gib2(e.figures.activations_peak) << " GiB\n\n";
    for (const auto& n : e.notes) o << "- " << n << "\n";
    o << "\n" << report::tensor_table(e).markdown();
  }
  return o.str();
}

// The CSV table: the figures in bytes, one row per (optimizer, checkpointing, profile); with
// --explain instead the per-tensor list, one row per tensor.
// A model that departs from LLaMA adds two key columns, family and features ("; "-separated).
report::Table csv_table(const ModelConfig& m, const std::vector<EstimateRun>& runs, bool explain) {
  const bool family = !report::family_line(m).empty();
  std::string features;
  for (const auto& f : m.features()) features += (features.empty() ? "" : "; ") + f;
  if (!explain) {
    std::vector<std::string> keys = {"optimizer", "checkpointing", "profile"};
    if (family) keys.insert(keys.end(), {"family", "features"});
    return report::memory_table_bytes(keys, [&] {
      std::vector<report::MemoryRow> rows;
      for (const auto& r : runs)
        for (const auto& e : r.estimates) {
          report::MemoryRow row{
              {optimizer_of(r), checkpointing_name(r.train), profile_name(e.profile)}, e.figures};
          if (family) row.keys.insert(row.keys.end(), {m.family, features});
          rows.push_back(std::move(row));
        }
      return rows;
    }());
  }
  report::Table t({{"checkpointing", report::Align::left},
                   {"profile", report::Align::left},
                   {"group", report::Align::left},
                   {"name", report::Align::left},
                   {"shape", report::Align::left},
                   {"dtype", report::Align::left},
                   {"bytes", report::Align::right},
                   {"term", report::Align::left},
                   {"coefficient", report::Align::right},
                   {"kept_by", report::Align::left},
                   {"why", report::Align::left}});
  for (const auto& r : runs) {
    if (r.train.optimizer != runs.front().train.optimizer) continue;
    for (const auto& e : r.estimates) {
      const json j = report::analytic_profile_json(e);
      auto str = [](const json& v) { return v.get<std::string>(); };
      for (const auto& x : j.at("tensors"))
        t.add_row({checkpointing_name(r.train), profile_name(e.profile), str(x.at("group")),
                   str(x.at("name")), str(x.at("shape")), str(x.at("dtype")),
                   std::to_string(x.at("bytes").get<std::uint64_t>()), str(x.at("term")),
                   report::coef(x.at("coefficient").get<double>()), str(x.at("kept_by")),
                   str(x.at("why"))});
    }
  }
  return t;
}

json run_object(const EstimateResult& c, const EstimateRun& r) {
  json j{{schema::kSchemaKey, report::kSchema},
         {schema::kModel, report::model_json(c.model, r.estimates.front().param_count)},
         {schema::kRun, report::run_json(r.train, "", -1)},
         {schema::kAnalytic, report::analytic_json(r.estimates)}};
  j[schema::kRun][schema::run_key::kOptimizer] = optimizer_of(r);
  if (r.allocator_model) {
    j["allocator_model"] = report::allocator_model_json(*r.allocator_model);
    j["allocator_model"]["traced_peak"] = r.traced_peak;
  }
  for (const auto& h : r.hf_allocator) {
    j["hf_allocator_model"][h.profile] = report::allocator_model_json(h.model);
    j["hf_allocator_model"][h.profile]["step_peak"] = h.step_peak;
  }
  return j;
}

// --allocator: each run's native step as PyTorch's allocator would hold it.
void write_allocator_table(ReportWriter& w, const std::vector<EstimateRun>& runs) {
  if (!runs.front().allocator_model) return;
  std::uint64_t most = 0;
  for (const auto& r : runs) {
    most = std::max(most, r.allocator_model->run_reserved_peak);
    for (const auto& h : r.hf_allocator) most = std::max(most, h.model.run_reserved_peak);
  }
  const ByteUnit u = table_unit(most);
  w.blank();
  w.strong(
      "What PyTorch's caching allocator would reserve for the native step (a model fed "
      "its meta trace; --allocator " +
      runs.front().allocator_model->spec + "; " + u.name + ")");
  report::Table t({{"optimizer", report::Align::left},
                   {"checkpointing", report::Align::left},
                   {"native peak"},
                   {"allocated"},
                   {"reserved"},
                   {"cached, unused"}});
  for (const auto& r : runs) {
    const CachingAllocatorStats& s = r.allocator_model->step;
    t.add_row({optimizer_name(r.train.optimizer), checkpointing_name(r.train),
               format_bytes(r.traced_peak, u), format_bytes(s.allocated.peak, u),
               format_bytes(s.reserved.peak, u),
               format_bytes(s.reserved.peak - s.allocated_at_reserved_peak, u)});
  }
  w.table(t);
  w.line("the last of two traced steps, peaks reset at its start; docs/allocator.md");
  if (runs.front().hf_allocator.empty()) return;
  w.blank();
  w.strong(
      "What it would reserve for the HF step (its event sequence, step 2, peaks reset at "
      "its start; docs/hf-step.md; " +
      std::string(u.name) + ")");
  report::Table h({{"optimizer", report::Align::left},
                   {"checkpointing", report::Align::left},
                   {"profile", report::Align::left},
                   {"step peak"},
                   {"allocated"},
                   {"reserved"},
                   {"cached, unused"},
                   {"segments"}});
  for (const auto& r : runs)
    for (const auto& x : r.hf_allocator) {
      const CachingAllocatorStats& s = x.model.step;
      h.add_row({optimizer_name(r.train.optimizer), checkpointing_name(r.train), x.profile,
                 format_bytes(x.step_peak, u), format_bytes(s.allocated.peak, u),
                 format_bytes(s.reserved.peak, u),
                 format_bytes(s.reserved.peak - s.allocated_at_reserved_peak, u),
                 std::to_string(x.model.segments_at_reserved_peak.size())});
    }
  w.table(h);
}

json estimate_json(const EstimateResult& c, const std::vector<EstimateRun>& runs) {
  json doc;
  if (!several(runs)) {
    doc = run_object(c, runs.front());
  } else {
    doc = json{{schema::kSchemaKey, report::kSchema}, {schema::kRuns, json::array()}};
    for (const auto& r : runs) doc[schema::kRuns].push_back(run_object(c, r));
  }
  return doc;
}

// The page's chart: each profile's per-layer activation bytes, a bar per checkpointing mode
// (they do not depend on the optimizer: the first optimizer's runs).
std::string per_layer_chart(const std::vector<EstimateRun>& runs) {
  report::BarChart c;
  c.id = "per-layer-chart";
  c.title = "Per-layer activation bytes, profile by profile";
  c.axis_label = "activation bytes per transformer layer (end of forward)";
  std::vector<const EstimateRun*> modes;
  for (const auto& r : runs)
    if (r.train.optimizer == runs.front().train.optimizer) {
      modes.push_back(&r);
      c.series.push_back(std::string("checkpointing ") + checkpointing_name(r.train));
    }
  for (std::size_t e = 0; e < runs.front().estimates.size(); ++e) {
    report::BarGroup g{profile_name(runs.front().estimates[e].profile), {}};
    for (std::size_t m = 0; m < modes.size(); ++m)
      g.bars.push_back(report::per_layer_bar(modes[m]->estimates[e], c.series[m]));
    c.groups.push_back(std::move(g));
  }
  if (c.series.size() < 2) c.series.clear();  // one mode: the title says which
  return "<h2>Per-layer activations, profile by profile</h2>\n" + report::bar_chart_svg(c) +
         "<figcaption>Bytes one transformer layer keeps for backward, per analytic profile; "
         "hover a bar for the exact bytes, the formula and its s·b·h coefficient."
         "</figcaption>\n";
}

}  // namespace

// The report, described once for every format.
void write_estimate(ReportWriter& w, const EstimateResult& c, bool explain, bool paper) {
  const std::vector<EstimateRun>& runs = c.runs;
  w.document([&] { return estimate_json(c, runs); });
  w.csv_table(csv_table(c.model, runs, explain));
  w.strong(title(c, runs));
  // Mistral, Qwen and scaled-RoPE models: what departs from LLaMA (nothing for a LLaMA).
  const std::string family = report::family_line(c.model);
  if (!family.empty()) w.paragraph(family);
  w.blank();
  w.table(figures_table(runs));
  w.blank();
  w.line(kLegend);
  // The HF step's recipe, where its event sequence gives the peak (once per profile).
  for (const auto& e : runs.front().estimates)
    if (e.hf_step_peak)
      w.line(std::string(profile_name(e.profile)) + ": precision " +
             precision_name(e.hf.recipe(e.train.dtype)) +
             (e.hf.precision ? "" : " (the default; --precision pure|amp|mixed)") + ", AdamW " +
             adamw_impl_name(e.hf.adamw_impl) + ", peak in " +
             (e.peak_instant >= 0 ? e.instants[static_cast<std::size_t>(e.peak_instant)].name
                                  : std::string()) +
             " (docs/hf-step.md)");
  // The HTML page's HF step timelines (the other forms have --timeline).
  for (const auto& r : runs)
    for (const auto& t : r.hf_timelines)
      w.figure([&] {
        return "<h2>The " + t.profile + " step, event by event (" + optimizer_of(r) +
               ", checkpointing " + checkpointing_name(r.train) +
               "): live bytes by category</h2>\n" + timeline_html(t.data, t.tensors);
      });
  // What each policy re-runs in backward (the native step's; once per policy).
  for (const auto& r : runs)
    if (r.train.optimizer == runs.front().train.optimizer)
      for (const auto& e : r.estimates)
        if (e.profile == Profile::native)
          if (const std::string rc = report::recompute_text(e); !rc.empty())
            w.line("recompute (checkpointing " + checkpointing_name(r.train) + "): " + rc);
  for (const auto& e : runs.front().estimates)
    if (e.profile == Profile::native)
      if (const std::string off = report::offload_text(e); !off.empty())
        w.line("activation offload (native): " + off);
  // A paged bitsandbytes optimizer's managed memory: in no column above.
  for (const auto& r : runs)
    for (const auto& e : r.estimates)
      if (e.optimizer_states_managed > 0)
        w.line("managed memory (" + std::string(profile_name(e.profile)) + ", " + optimizer_of(r) +
               ", checkpointing " + checkpointing_name(r.train) +
               "): " + report::gib2(e.optimizer_states_managed) +
               " GiB of optimizer state in CUDA managed memory (bitsandbytes pages m and v of "
               "tensors of 100,000 elements or more), in neither Optimizer States nor Peak: it "
               "moves to the GPU when the step touches it and back to the host under memory "
               "pressure, outside PyTorch's allocator.");
  w.figure([&] { return per_layer_chart(runs); });
  write_allocator_table(w, runs);
  if (paper) {
    w.strong("The paper's table beside this estimate");
    w.table(paper_table(runs));
    w.blank();
    w.line(kPaperLegend);
  }
  if (!explain) return;
  const std::string ignored = report::ignored_fields_line(c.model);
  if (!ignored.empty()) {
    w.blank();
    w.paragraph(ignored);
  }
  // Activation lists depend on the checkpointing mode, not on the optimizer: explain each
  // mode once (with the first optimizer's figures).
  for (const auto& r : runs)
    if (r.train.optimizer == runs.front().train.optimizer)
      w.passage(explanation_text(c, r), explanation_markdown(r));
}

}  // namespace trainmem::report
