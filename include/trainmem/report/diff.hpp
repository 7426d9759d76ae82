// `trainmem diff A B`: where the bytes of one setup differ from another's, tensor by tensor.
//
// Each side is one analytic profile of one configuration: computed now (a profile spec on the
// command line) or read back from a saved "trainmem/1" report (estimate, profile, compare or
// sweep JSON). A profile computed now is first written as the run object `estimate --format
// json` writes and then read by the same reader as a saved report, so both kinds of side are
// compared from the same fields: the per-tensor list ("tensors": group, name, shape, dtype,
// bytes, term, coefficient, why), the per-layer coefficients and the category figures.
//
// The difference: one row per (group, tensor name) present on either side, with the bytes it
// counts for on each side (a "layer" entry counts L times, every other entry once), Δ = B − A,
// the change of its coefficient in the monomials of docs/formulas.md ("+2·sbh", "-4·as²b") and
// the entry's `why` as the reason; totals per group and per category; the per-layer
// coefficients of both sides. A side without a per-tensor list (a report's measured ledger,
// `profile=measured`) is compared per category only, and the report says so. Sides of
// different models, shapes or setups are compared all the same; the report lists what differs.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainmem/analytic/analytic.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/report/schema.hpp"

namespace trainmem::diff {

// One per-tensor entry of a side, as an analytic profile's "tensors" list holds it: the
// TensorEntry the writer wrote (its fields: schema::kTensorFields), with its group. `bytes` is
// one instance's (one layer's, for group "layer"); `coefficient` the bytes per unit of the term's
// monomial (`other`: the bytes).
struct Entry : TensorEntry {
  std::string group;  // one of schema::kTensorGroups: embedding, layer, shared, head, loop, ...
};

// The category figures a side is compared on, in this order: the keys of schema::kFigures
// (params ... peak, as figures_json writes them).
const std::vector<std::string>& category_keys();

// One side of a diff.
struct Side {
  std::string spec;      // as given on the command line ("native", "hf-eager:dtype=fp32", FILE)
  std::string file;      // the report it was read from; empty for a profile computed now
  std::string profile;   // the profile's name ("hf-eager"), or "measured"
  std::string label;     // what the profile is
  nlohmann::json model;  // the "model" block (name, params, layers, hidden, ...)
  nlohmann::json run;    // the "run" block (batch, seq, dtype, optimizer, checkpointing, ...)
  std::int64_t layers = 0;
  std::int64_t checkpointed_layers = 0;   // a per-layer policy's (the layer_checkpointed group)
  std::vector<std::uint64_t> categories;  // in category_keys() order
  std::optional<Coefficients> per_layer;  // absent for measured figures
  std::uint64_t per_layer_bytes = 0;
  bool has_tensors = false;
  std::vector<Entry> entries;
};

// A saved report: its run objects ({"model", "run", "analytic", ...}): the document itself, or
// each element of its "runs".
struct Report {
  std::string path;
  std::vector<nlohmann::json> runs;
};

// Reads and checks a report. InputError starting with `where` (e.g. "A: old.json") saying what
// is wrong: the file cannot be read, is not JSON, is not a "trainmem/1" report, holds no run
// with analytic profiles.
Report read_report(const std::string& path, const std::string& where);
// The run object at 1-based `run`; 0 takes the only one (InputError listing them when several).
const nlohmann::json& choose_run(const Report& report, int run, const std::string& where);
// The profile names a run object holds, in its order ("measured" last when it has a ledger).
std::vector<std::string> profiles_of(const nlohmann::json& run_object);

// One side from a run object and a profile name ("measured": the ledger's category figures).
// InputError starting with `where` and naming the field when something is missing.
Side side_from_run_object(const nlohmann::json& run_object, const std::string& profile,
                          const std::string& where);
// A side computed now: the estimate as `estimate --format json` writes it, read back.
Side side_from_estimate(const Estimate& e);

// One row of the difference: a (group, tensor) of either side.
struct Row {
  std::string group, name;
  std::optional<Entry> a, b;               // absent on the side that does not have it
  std::uint64_t count_a = 0, count_b = 0;  // times the entry counts (L for "layer", else 1)
  std::uint64_t a_bytes = 0, b_bytes = 0;  // entry bytes × count
  std::int64_t delta = 0;                  // b_bytes − a_bytes
  std::string coefficient_change;          // "+2·sbh", "-4·sb +8·sbi", "+262,148 B", "0"
  std::string change;                      // "fp16 -> fp32", "only in A", "only in B", ""
  std::string why;                         // B's reason (A's when only in A)
  bool changed() const;
};

struct Total {
  std::string name;  // a category or a group
  std::uint64_t a = 0, b = 0;
  std::int64_t delta = 0;
};

struct Result {
  Side a, b;
  // What differs between the two configurations, one "key: A vs B" each ("hidden: 4096 vs
  // 5120"): the model block (name and every width), the shape (batch, seq, dtype), the setup
  // (optimizer, checkpointing, attention). Empty lists: the same.
  std::vector<std::string> model_differences, shape_differences, setup_differences;
  bool same_model() const { return model_differences.empty(); }
  bool same_shape() const { return shape_differences.empty(); }
  bool by_tensor = true;  // false: a side has no per-tensor list, compared per category only
  std::vector<std::string> notes;
  std::vector<Total> categories;  // category_keys() order
  std::vector<Total> groups;      // sorted by |Δ| descending
  std::vector<Row> rows;          // in the order of `groups`, each group by |Δ| descending
};

// The difference B − A. Signed differences past 63 bits throw OverflowError.
Result compare(const Side& a, const Side& b);

// The report, described once for every format (report_writer.hpp): text and Markdown (where
// `all_rows` also lists the tensors that did not change), CSV (one row per category and per
// tensor, exact bytes) and JSON (to_json).
void write_report(const Result& r, report::ReportWriter& w, bool all_rows);
// The "trainmem/1" JSON document (docs/output-formats.md, `diff`).
nlohmann::json to_json(const Result& r);

// "+2·sbh" / "-4·as²b" / "+262,148 B" joined by spaces, "0" when nothing changes: B's terms
// minus A's (an absent side counts 0).
std::string coefficient_change(const std::optional<Entry>& a, const std::optional<Entry>& b);

}  // namespace trainmem::diff
