// The "trainmem/1" JSON document's analytic and measured parts, described once: the keys of the
// document and of a run object, the model and run blocks' keys diff reads, the figures with the
// MemoryFigures member each holds, the per-layer coefficients, the fields of a tensor entry and
// the groups of a per-tensor list.
//
// The writer (report.cpp: model_json, run_json, figures_json, coefficients_json,
// tensor_entry_json, analytic_profile_json) and diff's reader (diff.cpp: read_report,
// side_from_run_object) both go through these tables: the writer iterates them to write, the reader
// iterates the same tables to read and to name a missing field in its error. A key that is both
// written and read back is spelt here and nowhere else in report/ (keys only the writer writes,
// and diff's own output document, spell theirs where they are written).
//
// The document, as far as these tables describe it (docs/design.md has the whole of it):
//   {"schema": "trainmem/1", <run object>}  or  {"schema": "trainmem/1", "runs": [<run object>...]}
//   run object: {"model": {..., "layers", ...}, "run": {...},
//                "analytic": {<profile name>: <profile>}, "measured": {"ledger": <ledger>, ...}}
//   profile: <figures>, "peak_breakdown", "per_layer_activations", "label",
//            "coefficients": {"sbh", "sbi", "as2b", "sb", "other_bytes"}, "tensors": [<entry>...]
//            (and what only a reader of the page needs: notes, hf, largest_gradient, ...)
//   ledger:  <figures>, "peak_breakdown", "per_layer_activations" (and the ledger's own detail)
//   figures: "params", "gradients", ..., "sum", "peak" (kFigures)
//   entry:   "group", "name", "shape", "dtype", "bytes", "term", "coefficient", "kept_by", "why"
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/figures.hpp"

namespace trainmem::report {

// The value of the document's "schema" key.
constexpr const char* kSchema = "trainmem/1";

namespace schema {

// ---------------------------------------------------------------- the document
constexpr const char* kSchemaKey = "schema";  // its value: kSchema
constexpr const char* kRuns = "runs";         // several run objects (compare, sweep)

// ---------------------------------------------------------------- a run object
constexpr const char* kModel = "model";        // report::model_json
constexpr const char* kRun = "run";            // report::run_json
constexpr const char* kAnalytic = "analytic";  // {profile name: profile}, report::analytic_json
constexpr const char* kMeasured = "measured";  // {"ledger": ..., the device sources}
constexpr const char* kLedger = "ledger";      // in "measured": the ledger's figures
// The measured side's name in diff (`FILE:profile=measured`): the ledger of "measured".
constexpr const char* kMeasuredProfile = "measured";

// ---------------------------------------------------------------- "model" and "run"
// The model block's keys every model has (report::model_json; the keys of a family that departs
// from LLaMA are the writer's alone).
namespace model_key {
constexpr const char* kName = "name";
constexpr const char* kParams = "params";
constexpr const char* kLayers = "layers";  // a "layer" entry counts this many times
constexpr const char* kHidden = "hidden";
constexpr const char* kIntermediate = "intermediate";
constexpr const char* kHeads = "heads";
constexpr const char* kKvHeads = "kv_heads";
constexpr const char* kVocab = "vocab";
constexpr const char* kTiedEmbeddings = "tied_embeddings";
}  // namespace model_key
// What diff compares two models on ("hidden: 4096 vs 5120"), in this order (params follows).
inline constexpr std::array<const char*, 8> kModelCompared{{
    model_key::kName,
    model_key::kLayers,
    model_key::kHidden,
    model_key::kIntermediate,
    model_key::kHeads,
    model_key::kKvHeads,
    model_key::kVocab,
    model_key::kTiedEmbeddings,
}};

// The run block's keys (report::run_json).
namespace run_key {
constexpr const char* kBatch = "batch";
constexpr const char* kSeq = "seq";
constexpr const char* kDtype = "dtype";
constexpr const char* kOptimizer = "optimizer";
constexpr const char* kCheckpointing = "checkpointing";
constexpr const char* kAttention = "attention";
constexpr const char* kOffloadActivations = "offload_activations";  // bool
constexpr const char* kBackend = "backend";  // null when nothing ran (estimate)
constexpr const char* kSteps = "steps";      // null when nothing ran
}  // namespace run_key
// What diff compares two runs on, in this order: the shape, and the setup.
inline constexpr std::array<const char*, 3> kRunShape{{
    run_key::kBatch,
    run_key::kSeq,
    run_key::kDtype,
}};
inline constexpr std::array<const char*, 4> kRunSetup{{
    run_key::kOptimizer,
    run_key::kCheckpointing,
    run_key::kAttention,
    run_key::kOffloadActivations,
}};

// ---------------------------------------------------------------- figures
// The figures of an analytic profile and of the measured ledger, in the order reports list them
// (diff's categories: category_keys()).
struct Figure {
  const char* key;
  std::uint64_t MemoryFigures::*member;
};
inline constexpr std::array<Figure, 9> kFigures{{
    {"params", &MemoryFigures::params},
    {"gradients", &MemoryFigures::gradients},
    {"optimizer_states", &MemoryFigures::optimizer_states},
    {"activations", &MemoryFigures::activations},
    {"activations_peak", &MemoryFigures::activations_peak},
    {"workspace", &MemoryFigures::workspace},
    {"inputs", &MemoryFigures::inputs},
    {"sum", &MemoryFigures::sum},
    {"peak", &MemoryFigures::peak},
}};
// {category_name(c): bytes} for every c of all_categories() (base/categories.hpp names them):
// MemoryFigures::peak_breakdown.
constexpr const char* kPeakBreakdown = "peak_breakdown";

// One layer's activation bytes (an analytic profile's and the measured ledger's).
constexpr const char* kPerLayerActivations = "per_layer_activations";

// ---------------------------------------------------------------- an analytic profile
constexpr const char* kLabel = "label";  // what the profile is (Estimate::label)

// "coefficients": one layer's bytes per unit of each monomial, and the bytes that fit none.
constexpr const char* kCoefficients = "coefficients";
struct CoefficientTerm {
  const char* key;
  double Coefficients::*member;
};
inline constexpr std::array<CoefficientTerm, 4> kCoefficientTerms{{
    {"sbh", &Coefficients::sbh},
    {"sbi", &Coefficients::sbi},
    {"as2b", &Coefficients::as2b},
    {"sb", &Coefficients::sb},
}};
constexpr const char* kOtherBytes = "other_bytes";  // Coefficients::other_bytes

// ---------------------------------------------------------------- the per-tensor list
constexpr const char* kTensors = "tensors";  // [entry...], group by group in kTensorGroups order

// The groups of a per-tensor list, in the order the writer lists them and diff ranks groups
// whose differences are equal, each with the ActivationBreakdown list it holds.
// One layer's entries: counted model.layers times, less the checkpointed layers of a per-layer
// policy, whose entries are the second group, counted kCheckpointedLayers times.
constexpr const char* kLayerGroup = "layer";
constexpr const char* kCheckpointedLayerGroup = "layer_checkpointed";
constexpr const char* kCheckpointedLayers = "checkpointed_layers";  // an analytic profile's count
// hf-peft without checkpointing: layer 0's own list (counted once; `layer` then counts the
// other model.layers - 1).
constexpr const char* kFirstLayerGroup = "first_layer";
struct TensorGroup {
  const char* name;
  std::vector<TensorEntry> ActivationBreakdown::*entries;
};
inline constexpr std::array<TensorGroup, 9> kTensorGroups{{
    {"embedding", &ActivationBreakdown::embedding},
    {kFirstLayerGroup, &ActivationBreakdown::first_layer},
    {kLayerGroup, &ActivationBreakdown::layer},
    {kCheckpointedLayerGroup, &ActivationBreakdown::layer_checkpointed},
    {"shared", &ActivationBreakdown::shared},
    {"head", &ActivationBreakdown::head},
    {"loop", &ActivationBreakdown::loop},
    {"recompute", &ActivationBreakdown::recompute},
    {"inputs", &ActivationBreakdown::inputs},
}};
// The position of a group in kTensorGroups; kTensorGroups.size() for a name not there.
std::size_t group_rank(const std::string& group);

// The fields of one entry: its group, then the TensorEntry's fields.
constexpr const char* kEntryGroup = "group";
enum class EntryValue {
  text,         // a string member (TensorField::text)
  bytes,        // TensorEntry::bytes, an integer >= 0
  term,         // TensorEntry::term, written as term_name (one of kTerms)
  coefficient,  // TensorEntry::coefficient, a number
};
// What the reader does without the field: refuses the entry (required) or reads "" (optional).
enum class Need { required, optional };
struct TensorField {
  const char* key;
  EntryValue value;
  Need need;
  std::string TensorEntry::*text;  // the member of a text field; nullptr for the others
};
inline constexpr std::array<TensorField, 8> kTensorFields{{
    {"name", EntryValue::text, Need::required, &TensorEntry::name},
    {"shape", EntryValue::text, Need::optional, &TensorEntry::shape},
    {"dtype", EntryValue::text, Need::optional, &TensorEntry::dtype},
    {"bytes", EntryValue::bytes, Need::required, nullptr},
    {"term", EntryValue::term, Need::required, nullptr},
    {"coefficient", EntryValue::coefficient, Need::required, nullptr},
    {"kept_by", EntryValue::text, Need::optional, &TensorEntry::kept_by},
    {"why", EntryValue::text, Need::optional, &TensorEntry::why},
}};

// The values of an entry's "term" (term_name of each), in docs/formulas.md's order.
inline constexpr std::array<Term, 5> kTerms{
    {Term::sbh, Term::sbi, Term::as2b, Term::sb, Term::other}};
// The term whose term_name is `name`; nullopt for any other string.
std::optional<Term> parse_term(const std::string& name);
// "sbh, sbi, as2b, sb, other": the allowed values, for an error message.
std::string term_names();

}  // namespace schema
}  // namespace trainmem::report
