// The "trainmem/1" schema (include/trainmem/report/schema.hpp) as the one description the JSON
// writer (report.cpp) and diff's reader (diff.cpp) share: an estimate with a distinct value in
// every figure, coefficient and tensor field, written by the writer to a file, is read back by
// diff's reader into the same values, field by field; a document missing any key the reader
// needs is refused with diff's error naming that key; the keys themselves are pinned here, so a
// renamed key shows as a change to this test and not only as a changed table.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/report/diff.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/schema.hpp"

namespace trainmem {
namespace {

namespace schema = report::schema;
using nlohmann::json;

// A byte count of its own for each n, above 2^32 so a narrowing or a swapped member shows.
std::uint64_t distinct_bytes(std::size_t n) {
  return (std::uint64_t{1} << 33) + 1000 * (n + 1) + 7;
}

// The n-th tensor of the list, every field its own.
TensorEntry distinct_tensor(const std::string& group, std::size_t n) {
  TensorEntry t;
  t.name = group + ".tensor" + std::to_string(n);
  t.shape = "(b,s," + std::to_string(n) + ")";
  t.dtype = n % 2 ? "fp32" : "bf16";
  t.bytes = distinct_bytes(100 + n);
  t.term = schema::kTerms[n % schema::kTerms.size()];
  t.coefficient = 0.25 + static_cast<double>(n);
  t.kept_by = "op " + std::to_string(n);
  t.why = "why " + std::to_string(n);
  return t;
}

// The tiny model's native estimate with every figure, coefficient and tensor the writer writes
// and the reader reads replaced by a distinct value; two tensors in every group.
Estimate distinct_estimate() {
  TrainConfig t;
  t.seq = 16;
  Estimate e = estimate(Profile::native, resolve_model("tiny"), t);
  for (std::size_t n = 0; n < schema::kFigures.size(); ++n)
    e.figures.*schema::kFigures[n].member = distinct_bytes(n);
  for (std::size_t n = 0; n < schema::kCoefficientTerms.size(); ++n)
    e.activations.per_layer.*schema::kCoefficientTerms[n].member = 1.5 + static_cast<double>(n);
  e.activations.per_layer.other_bytes = distinct_bytes(50);
  e.activations.per_layer_bytes = distinct_bytes(60);
  e.label = "a profile with distinct figures";
  std::size_t n = 0;
  for (const auto& group : schema::kTensorGroups) {
    auto& list = e.activations.*group.entries;
    list.clear();
    for (int k = 0; k < 2; ++k) list.push_back(distinct_tensor(group.name, n++));
  }
  return e;
}

// A run object as `estimate --format json` writes it.
json estimate_document(const Estimate& e) {
  return json{{"schema", report::kSchema},
              {"model", report::model_json(e.model, e.param_count)},
              {"run", report::run_json(e.train, "", -1)},
              {"analytic", report::analytic_json({e})}};
}

std::string write_file(const std::string& name, const json& doc) {
  const std::string path = testing::TempDir() + name;
  std::ofstream(path) << doc.dump(2) << "\n";
  return path;
}

// diff's error for reading `profile` of the run object, or "no error".
std::string diff_error(const json& run_object, const std::string& profile) {
  try {
    (void)diff::side_from_run_object(run_object, profile, "A: f.json");
  } catch (const InputError& err) {
    return err.what();
  }
  return "no error";
}

TEST(ReportSchema, TheKeysAreTheDocumentedOnes) {
  EXPECT_EQ(diff::category_keys(),
            (std::vector<std::string>{"params", "gradients", "optimizer_states", "activations",
                                      "activations_peak", "workspace", "inputs", "sum", "peak"}));
  std::vector<std::string> coefficients, fields, groups;
  for (const auto& term : schema::kCoefficientTerms) coefficients.push_back(term.key);
  coefficients.push_back(schema::kOtherBytes);
  EXPECT_EQ(coefficients, (std::vector<std::string>{"sbh", "sbi", "as2b", "sb", "other_bytes"}));
  for (const auto& field : schema::kTensorFields) fields.push_back(field.key);
  EXPECT_EQ(fields, (std::vector<std::string>{"name", "shape", "dtype", "bytes", "term",
                                              "coefficient", "kept_by", "why"}));
  for (const auto& group : schema::kTensorGroups) groups.push_back(group.name);
  EXPECT_EQ(groups,
            (std::vector<std::string>{"embedding", "first_layer", "layer", "layer_checkpointed",
                                      "shared", "head", "loop", "recompute", "inputs"}));
  EXPECT_EQ(schema::term_names(), "sbh, sbi, as2b, sb, other");
  const std::vector<std::string> model(schema::kModelCompared.begin(),
                                       schema::kModelCompared.end());
  EXPECT_EQ(model, (std::vector<std::string>{"name", "layers", "hidden", "intermediate", "heads",
                                             "kv_heads", "vocab", "tied_embeddings"}));
  const std::vector<std::string> shape(schema::kRunShape.begin(), schema::kRunShape.end());
  EXPECT_EQ(shape, (std::vector<std::string>{"batch", "seq", "dtype"}));
  const std::vector<std::string> setup(schema::kRunSetup.begin(), schema::kRunSetup.end());
  EXPECT_EQ(setup, (std::vector<std::string>{"optimizer", "checkpointing", "attention",
                                             "offload_activations"}));

  // What the writer writes is what the tables say, and nothing the reader reads is missing.
  const Estimate e = distinct_estimate();
  const json profile = report::analytic_profile_json(e);
  for (const auto& figure : schema::kFigures) EXPECT_TRUE(profile.contains(figure.key));
  for (const char* key : {schema::kPeakBreakdown, schema::kPerLayerActivations, schema::kLabel,
                          schema::kCoefficients, schema::kTensors})
    EXPECT_TRUE(profile.contains(key)) << key;
  const json model_block = report::model_json(e.model, e.param_count);
  for (const char* key : schema::kModelCompared) EXPECT_TRUE(model_block.contains(key)) << key;
  const json run_block = report::run_json(e.train, "", -1);
  for (const char* key : schema::kRunShape) EXPECT_TRUE(run_block.contains(key)) << key;
  for (const char* key : schema::kRunSetup) EXPECT_TRUE(run_block.contains(key)) << key;
  std::vector<std::string> entry_keys;
  for (auto it = profile.at(schema::kTensors).at(0).begin();
       it != profile.at(schema::kTensors).at(0).end(); ++it)
    entry_keys.push_back(it.key());
  EXPECT_EQ(entry_keys, (std::vector<std::string>{"bytes", "coefficient", "dtype", "group",
                                                  "kept_by", "name", "shape", "term", "why"}));
}

TEST(ReportSchema, WriterAndDiffReaderRoundTripEveryField) {
  const Estimate e = distinct_estimate();
  const std::string path = write_file("schema_round_trip.json", estimate_document(e));
  const diff::Report saved = diff::read_report(path, "A: " + path);
  const diff::Side s =
      diff::side_from_run_object(diff::choose_run(saved, 0, "A"), "native", "A: " + path);

  ASSERT_EQ(s.categories.size(), schema::kFigures.size());
  EXPECT_EQ(s.categories[0], e.figures.params);
  EXPECT_EQ(s.categories[1], e.figures.gradients);
  EXPECT_EQ(s.categories[2], e.figures.optimizer_states);
  EXPECT_EQ(s.categories[3], e.figures.activations);
  EXPECT_EQ(s.categories[4], e.figures.activations_peak);
  EXPECT_EQ(s.categories[5], e.figures.workspace);
  EXPECT_EQ(s.categories[6], e.figures.inputs);
  EXPECT_EQ(s.categories[7], e.figures.sum);
  EXPECT_EQ(s.categories[8], e.figures.peak);
  EXPECT_EQ(s.per_layer_bytes, e.activations.per_layer_bytes);
  EXPECT_EQ(s.label, e.label);
  EXPECT_EQ(s.layers, e.model.layers);

  ASSERT_TRUE(s.per_layer.has_value());
  EXPECT_EQ(s.per_layer->sbh, e.activations.per_layer.sbh);
  EXPECT_EQ(s.per_layer->sbi, e.activations.per_layer.sbi);
  EXPECT_EQ(s.per_layer->as2b, e.activations.per_layer.as2b);
  EXPECT_EQ(s.per_layer->sb, e.activations.per_layer.sb);
  EXPECT_EQ(s.per_layer->other_bytes, e.activations.per_layer.other_bytes);

  // Every tensor of every group, in the writer's group order, every field.
  ASSERT_TRUE(s.has_tensors);
  std::vector<std::pair<std::string, TensorEntry>> want;
  for (const auto& group : schema::kTensorGroups)
    for (const auto& t : e.activations.*group.entries) want.emplace_back(group.name, t);
  ASSERT_EQ(s.entries.size(), want.size());
  for (std::size_t n = 0; n < want.size(); ++n) {
    const diff::Entry& got = s.entries[n];
    const TensorEntry& t = want[n].second;
    EXPECT_EQ(got.group, want[n].first) << n;
    EXPECT_EQ(got.name, t.name) << n;
    EXPECT_EQ(got.shape, t.shape) << n;
    EXPECT_EQ(got.dtype, t.dtype) << n;
    EXPECT_EQ(got.bytes, t.bytes) << n;
    EXPECT_EQ(got.term, t.term) << n;
    EXPECT_EQ(got.coefficient, t.coefficient) << n;
    EXPECT_EQ(got.kept_by, t.kept_by) << n;
    EXPECT_EQ(got.why, t.why) << n;
  }

  // The measured ledger: the same figures, read as the "measured" side.
  json ro = estimate_document(e);
  ro["measured"]["ledger"] = report::figures_json(e.figures, true);
  ro["measured"]["ledger"]["per_layer_activations"] = distinct_bytes(70);
  const diff::Side m = diff::side_from_run_object(ro, "measured", "B");
  for (std::size_t n = 0; n < schema::kFigures.size(); ++n)
    EXPECT_EQ(m.categories[n], e.figures.*schema::kFigures[n].member) << schema::kFigures[n].key;
  EXPECT_EQ(m.per_layer_bytes, distinct_bytes(70));
  EXPECT_FALSE(m.has_tensors);
}

TEST(ReportSchema, EachMissingKeyIsNamedInDiffsError) {
  json ro = estimate_document(distinct_estimate());
  ro["measured"]["ledger"] = report::figures_json(distinct_estimate().figures, true);
  ro["measured"]["ledger"]["per_layer_activations"] = 1;
  ASSERT_EQ(diff_error(ro, "native"), "no error");
  ASSERT_EQ(diff_error(ro, "measured"), "no error");

  for (const auto& figure : schema::kFigures) {
    json without = ro;
    without["analytic"]["native"].erase(figure.key);
    EXPECT_EQ(diff_error(without, "native"),
              std::string("diff A: f.json: analytic.native: missing \"") + figure.key + "\"");
    without = ro;
    without["measured"]["ledger"].erase(figure.key);
    EXPECT_EQ(diff_error(without, "measured"),
              std::string("diff A: f.json: measured.ledger: missing \"") + figure.key + "\"");
  }
  json without = ro;
  without["analytic"]["native"].erase("per_layer_activations");
  EXPECT_EQ(diff_error(without, "native"),
            "diff A: f.json: analytic.native: missing \"per_layer_activations\"");
  without = ro;
  without["analytic"]["native"].erase("coefficients");
  EXPECT_EQ(diff_error(without, "native"),
            "diff A: f.json: analytic.native: missing \"coefficients\"");
  for (const char* key : {"sbh", "sbi", "as2b", "sb", "other_bytes"}) {
    without = ro;
    without["analytic"]["native"]["coefficients"].erase(key);
    EXPECT_EQ(diff_error(without, "native"),
              std::string("diff A: f.json: analytic.native.coefficients: missing \"") + key + "\"");
  }
  without = ro;
  without["model"].erase("layers");
  EXPECT_EQ(diff_error(without, "native"), "diff A: f.json: model: missing \"layers\"");
  for (const char* key : {"model", "run"}) {
    without = ro;
    without.erase(key);
    EXPECT_EQ(diff_error(without, "native"),
              std::string("diff A: f.json: the run: missing \"") + key + "\"");
  }

  // A tensor entry: the required fields are named; the optional ones read as "".
  for (const char* key : {"group", "name", "bytes", "term", "coefficient"}) {
    without = ro;
    without["analytic"]["native"]["tensors"][3].erase(key);
    EXPECT_EQ(diff_error(without, "native"),
              std::string("diff A: f.json: analytic.native.tensors[3]: missing \"") + key + "\"");
  }
  for (const char* key : {"shape", "dtype", "kept_by", "why"}) {
    without = ro;
    without["analytic"]["native"]["tensors"][3].erase(key);
    EXPECT_EQ(diff_error(without, "native"), "no error") << key;
  }
}

// Groups whose differences are equal are listed in the writer's group order, "loop" included
// (diff's own list of groups had left it out, so it came after "inputs").
TEST(ReportSchema, DiffListsTiedGroupsInTheWritersOrder) {
  const Estimate e = distinct_estimate();
  const diff::Side s = diff::side_from_estimate(e);
  const diff::Result r = diff::compare(s, s);
  std::vector<std::string> groups, want;
  for (const auto& g : r.groups) groups.push_back(g.name);
  for (const auto& group : schema::kTensorGroups) want.push_back(group.name);
  EXPECT_EQ(groups, want);
}

}  // namespace
}  // namespace trainmem
