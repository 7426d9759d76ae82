// The HF step per rank under FSDP2, in every format (include/trainmem/report/hf_fsdp2_report.hpp).
#include "trainmem/report/hf_fsdp2_report.hpp"

#include <algorithm>

#include "trainmem/base/bytes.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/report/replay_report.hpp"
#include "trainmem/report/schema.hpp"

namespace trainmem::report {

namespace {

using nlohmann::json;

// "0-2" or "3": the ranks of a group.
std::string rank_list(const HfStepRankGroup& g) {
  return g.first == g.last ? std::to_string(g.first)
                           : std::to_string(g.first) + "-" + std::to_string(g.last);
}

// A group's peak: allocated, or with --allocator what the caching allocator would reserve over
// the run (what an out-of-memory is about; maxbatch's figure).
std::uint64_t peak_of(const HfFsdp2Report& r, std::size_t i) {
  return r.reserved.empty() ? r.groups[i].step.peak : r.reserved[i].run_reserved_peak;
}

std::size_t worst(const HfFsdp2Report& r) {
  std::size_t w = 0;
  for (std::size_t i = 1; i < r.groups.size(); ++i)
    if (peak_of(r, i) > peak_of(r, w)) w = i;
  return w;
}

std::string setup_line(const HfFsdp2Report& r) {
  const TrainConfig& t = r.train;
  return r.model.name + ", batch " + std::to_string(t.batch) + " per rank, seq " +
         std::to_string(t.seq) + ", " + dtype_name(t.dtype) + ", checkpointing " +
         (t.checkpointing == Checkpointing::full ? "full" : "none") + "; FSDP2 over " +
         std::to_string(r.world) + " ranks: fully_shard(layer" +
         (r.reshard_after_forward ? "" : ", reshard_after_forward=False") +
         ") on every decoder layer, then fully_shard(model), " +
         (r.hf.recipe(t.dtype) == Precision::mixed
              ? std::string("an fp32 model under MixedPrecisionPolicy(param_dtype=") +
                    dtype_name(t.dtype) + ", reduce_dtype=float32)"
              : std::string("no MixedPrecisionPolicy (the model in ") + dtype_name(t.dtype) + ")");
}

json report_json(const HfFsdp2Report& r) {
  json groups = json::array();
  for (std::size_t i = 0; i < r.groups.size(); ++i) {
    const HfStep& st = r.groups[i].step;
    json at_peak = json::object(), at_start = json::object(), phases = json::object();
    const CategoryBytes cp = hf_step_categories(st.by_kind_at_peak),
                        cs = hf_step_categories(st.start_by_kind);
    for (Category c : all_categories()) {
      at_peak[category_name(c)] = cp[static_cast<int>(c)];
      at_start[category_name(c)] = cs[static_cast<int>(c)];
    }
    for (int p = 0; p < kHfStepPhases; ++p)
      if (st.phase_seen[p])
        phases[hf_step_phase_name(static_cast<HfStepPhase>(p))] = st.phase_max[p];
    json g{{"first_rank", r.groups[i].first},
           {"last_rank", r.groups[i].last},
           {"live_at_start", st.live_at_start},
           {"live_at_start_by_category", at_start},
           {"peak", st.peak},
           {"peak_phase", hf_step_phase_name(st.peak_phase)},
           {"peak_by_category", at_peak},
           {"phase_max", phases},
           {"events", st.events.size()}};
    if (!r.reserved.empty()) g["allocator_model"] = allocator_model_json(r.reserved[i]);
    groups.push_back(g);
  }
  const std::size_t w = worst(r);
  const Overheads& o = r.overheads;
  return json{{schema::kSchemaKey, kSchema},
              {"command", "estimate"},
              {"profile", r.profile},
              {"model", r.model.name},
              {"batch_per_rank", r.train.batch},
              {"seq", r.train.seq},
              {"dtype", dtype_name(r.train.dtype)},
              {"checkpointing", r.train.checkpointing == Checkpointing::full ? "full" : "none"},
              {"world_size", r.world},
              {"sharding", "per-parameter (FSDP2 fully_shard)"},
              {"reshard_after_forward", r.reshard_after_forward},
              {"precision", precision_name(r.hf.recipe(r.train.dtype))},
              {"adamw_implementation", adamw_impl_name(r.hf.adamw_impl)},
              {"loop", r.groups.front().step.recipe},
              {"rank_groups", groups},
              {"peak_kind", r.reserved.empty() ? "allocated" : "reserved"},
              {"worst_rank", r.groups[w].first},
              {"worst_peak", peak_of(r, w)},
              {"overheads",
               {{"cuda_context", o.cuda_context},
                {"cuda_context_source", o.cuda_context_source},
                {"nccl", o.nccl},
                {"nccl_source", o.nccl_source}}},
              {"worst_total", peak_of(r, w) + o.total()}};
}

}  // namespace

void write_hf_fsdp2(ReportWriter& w, const HfFsdp2Report& r) {
  w.document([&] { return report_json(r); });
  std::uint64_t most = 0;
  for (const auto& g : r.groups) most = std::max(most, g.step.peak);
  for (const auto& res : r.reserved) most = std::max(most, res.run_reserved_peak);
  const ByteUnit u = table_unit(most);
  w.title("trainmem estimate: the HF step per rank under FSDP2 (" + r.profile +
          ", transformers 5.25)");
  w.paragraph(setup_line(r));
  if (r.precision_defaulted)
    w.paragraph(
        "recipe pure: FSDP2 without a MixedPrecisionPolicy trains in the model's dtype "
        "(--precision pure, the default here)");
  w.paragraph("the loop modelled: " + r.groups.front().step.recipe);
  std::vector<Table::Column> cols = {{"ranks", Align::left},
                                     {std::string("at start (") + u.name + ")"},
                                     {std::string("peak (") + u.name + ")"},
                                     {"in", Align::left}};
  for (Category c : all_categories()) cols.push_back({category_name(c)});
  if (!r.reserved.empty()) cols.push_back({std::string("reserved (") + u.name + ")"});
  Table t(cols);
  Table csv({{"ranks", Align::left}, {"live_at_start"}, {"peak"}, {"peak_phase", Align::left}});
  for (std::size_t i = 0; i < r.groups.size(); ++i) {
    const HfStep& st = r.groups[i].step;
    std::vector<Cell> row = {rank_list(r.groups[i]), format_bytes(st.live_at_start, u),
                             format_bytes(st.peak, u), hf_step_phase_name(st.peak_phase)};
    const CategoryBytes c = hf_step_categories(st.by_kind_at_peak);
    for (Category k : all_categories()) row.push_back(format_bytes(c[static_cast<int>(k)], u));
    if (!r.reserved.empty()) row.push_back(format_bytes(r.reserved[i].run_reserved_peak, u));
    t.add_row(row);
    csv.add_row({rank_list(r.groups[i]), std::to_string(st.live_at_start), std::to_string(st.peak),
                 hf_step_phase_name(st.peak_phase)});
  }
  w.table(t);
  w.csv_table(csv);
  const std::size_t k = worst(r);
  const Overheads& o = r.overheads;
  w.line("worst rank " + std::to_string(r.groups[k].first) + ": peak " +
         format_bytes_with_unit(r.groups[k].step.peak, u) + " allocated in " +
         hf_step_phase_name(r.groups[k].step.peak_phase) +
         (r.reserved.empty()
              ? std::string()
              : ", " + format_bytes_with_unit(r.reserved[k].run_reserved_peak, u) + " reserved") +
         "; with the overheads outside the books " +
         format_bytes_with_unit(peak_of(r, k) + o.total(), u) +
         " (CUDA context: " + o.cuda_context_source + "; NCCL: " + o.nccl_source + ")");
  w.line(
      "the categories are those alive at the peak; communication: the all-gathered units, the "
      "prefetched all-gather, the reduce-scatter input");
  w.line(
      "the event sequence is proven against real FSDP2 (gloo, 2 and 4 ranks, on the CPU) "
      "within 1 KiB of every rank's peak (tests/test_hf_step_fsdp2.cpp); on a GPU NCCL's own "
      "buffers and the caching allocator's rounding are not in it (docs/hf-step.md)");
}

}  // namespace trainmem::report
