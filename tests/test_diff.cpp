// trainmem diff's library (include/trainmem/report/diff.hpp) and side parser (cli/cli.hpp): rows
// paired by group and name, counted L times in a layer, sorted by |Δ| within groups sorted by
// |Δ|; coefficient changes in formulas.md's monomials; profile and report sides read by one
// reader; the side syntax and its refusals.
#include <gtest/gtest.h>

#include "cli/cli.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/report/diff.hpp"
#include "trainmem/report/report.hpp"

namespace trainmem {
namespace {

diff::Entry entry(const std::string& group, const std::string& name, std::uint64_t bytes, Term term,
                  double coefficient, const std::string& dtype = "fp16") {
  diff::Entry e;
  e.group = group;
  e.name = name;
  e.shape = "(b,s,h)";
  e.dtype = dtype;
  e.bytes = bytes;
  e.term = term;
  e.coefficient = coefficient;
  e.why = "why " + name;
  return e;
}

diff::Side side(std::int64_t layers, std::vector<diff::Entry> entries) {
  diff::Side s;
  s.spec = "test";
  s.profile = "test";
  s.layers = layers;
  s.model = {{"name", "m"}, {"layers", layers}, {"hidden", 8}};
  s.run = {{"batch", 2}, {"seq", 4}, {"dtype", "fp16"}};
  s.categories.assign(diff::category_keys().size(), 0);
  s.per_layer = Coefficients{};
  s.has_tensors = true;
  s.entries = std::move(entries);
  return s;
}

TEST(DiffCoefficients, ChangesAreWrittenInTheFormulaMonomials) {
  using diff::coefficient_change;
  const auto a = entry("layer", "y", 64, Term::sbh, 2);
  auto b = a;
  b.coefficient = 4;
  b.bytes = 128;
  EXPECT_EQ(coefficient_change(a, b), "+2·sbh");
  EXPECT_EQ(coefficient_change(b, a), "-2·sbh");
  EXPECT_EQ(coefficient_change(a, a), "0");
  EXPECT_EQ(coefficient_change(std::nullopt, a), "+2·sbh");
  EXPECT_EQ(coefficient_change(a, std::nullopt), "-2·sbh");
  const auto scores = entry("layer", "s", 1, Term::as2b, 0.5);
  EXPECT_EQ(coefficient_change(a, scores), "-2·sbh +0.5·as²b");
  const auto cos = entry("layer", "rope.cos", 262144, Term::other, 262144);
  EXPECT_EQ(coefficient_change(std::nullopt, cos), "+262,144 B");
}

TEST(DiffCompare, RowsCountLTimesInALayerAndSortByTheSizeOfTheirChange) {
  // A: 3 layers keeping x (10 B) and y (5 B, fp16), a head tensor h (7 B).
  // B: the same x, y in fp32 (8 B), a new z (100 B); no h.
  const diff::Side a =
      side(3, {entry("layer", "x", 10, Term::sbh, 2), entry("layer", "y", 5, Term::sbh, 1),
               entry("head", "h", 7, Term::other, 7)});
  const diff::Side b = side(
      3, {entry("layer", "x", 10, Term::sbh, 2), entry("layer", "y", 8, Term::sbh, 1.6, "fp32"),
          entry("layer", "z", 100, Term::sbi, 4)});
  const diff::Result r = diff::compare(a, b);
  ASSERT_TRUE(r.by_tensor);
  EXPECT_TRUE(r.same_model());
  EXPECT_TRUE(r.same_shape());
  ASSERT_EQ(r.groups.size(), 2u);
  EXPECT_EQ(r.groups[0].name, "layer");  // |+309| before |-7|
  EXPECT_EQ(r.groups[0].a, 3u * (10 + 5));
  EXPECT_EQ(r.groups[0].b, 3u * (10 + 8 + 100));
  EXPECT_EQ(r.groups[0].delta, 309);
  EXPECT_EQ(r.groups[1].name, "head");
  EXPECT_EQ(r.groups[1].delta, -7);

  ASSERT_EQ(r.rows.size(), 4u);
  EXPECT_EQ(r.rows[0].name, "z");
  EXPECT_EQ(r.rows[0].delta, 300);
  EXPECT_EQ(r.rows[0].count_b, 3u);
  EXPECT_EQ(r.rows[0].count_a, 0u);
  EXPECT_EQ(r.rows[0].change, "only in B");
  EXPECT_EQ(r.rows[0].coefficient_change, "+4·sbi");
  EXPECT_EQ(r.rows[1].name, "y");
  EXPECT_EQ(r.rows[1].delta, 9);
  EXPECT_EQ(r.rows[1].change, "fp16 -> fp32");
  EXPECT_EQ(r.rows[1].coefficient_change, "+0.6·sbh");
  EXPECT_EQ(r.rows[1].why, "why y");
  EXPECT_EQ(r.rows[2].name, "x");
  EXPECT_EQ(r.rows[2].delta, 0);
  EXPECT_FALSE(r.rows[2].changed());
  EXPECT_EQ(r.rows[3].name, "h");
  EXPECT_EQ(r.rows[3].delta, -7);
  EXPECT_EQ(r.rows[3].count_b, 0u);
  EXPECT_EQ(r.rows[3].change, "only in A");
  EXPECT_EQ(r.rows[3].coefficient_change, "-7 B");
  EXPECT_EQ(r.rows[3].why, "why h");

  // Unchanged rows are listed only when asked for.
  report::TextWriter brief(report::Colour::off), all(report::Colour::off);
  diff::write_report(r, brief, false);
  diff::write_report(r, all, true);
  EXPECT_NE(brief.str().find("1 of 4 tensors are the same on both sides"), std::string::npos)
      << brief.str();
  EXPECT_EQ(all.str().find("are the same on both sides"), std::string::npos) << all.str();
}

TEST(DiffCompare, DifferentLayerCountsCountEachSideItsOwn) {
  const diff::Side a = side(2, {entry("layer", "x", 10, Term::sbh, 2)});
  const diff::Side b = side(5, {entry("layer", "x", 10, Term::sbh, 2)});
  const diff::Result r = diff::compare(a, b);
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(r.rows[0].a_bytes, 20u);
  EXPECT_EQ(r.rows[0].b_bytes, 50u);
  EXPECT_EQ(r.rows[0].delta, 30);
  ASSERT_EQ(r.model_differences.size(), 1u);
  EXPECT_EQ(r.model_differences[0], "layers: 2 vs 5");
  EXPECT_FALSE(r.same_model());
}

TEST(DiffCompare, ASideWithoutTensorsIsComparedPerCategoryAndSaysSo) {
  diff::Side a = side(2, {entry("layer", "x", 10, Term::sbh, 2)});
  diff::Side b = a;
  b.has_tensors = false;
  b.entries.clear();
  b.profile = "measured";
  b.categories[3] = 99;  // activations
  const diff::Result r = diff::compare(a, b);
  EXPECT_FALSE(r.by_tensor);
  EXPECT_TRUE(r.rows.empty());
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("per category only: B (measured) holds no per-tensor list"),
            std::string::npos)
      << r.notes[0];
  EXPECT_EQ(r.categories[3].name, "activations");
  EXPECT_EQ(r.categories[3].delta, 99);
  EXPECT_EQ(diff::to_json(r)["granularity"], "category");
}

// A profile side is the estimate's JSON read back: the entries are the estimate's, each
// counted as reported, and the category figures its figures.
TEST(DiffSides, AProfileSideHoldsTheEstimatesEntriesAndFigures) {
  TrainConfig t;
  t.batch = 2;
  t.seq = 16;
  t.dtype = DType::f16;
  const ModelConfig m = resolve_model("tiny");
  const Estimate e = estimate(Profile::hf_eager, m, t);
  const diff::Side s = diff::side_from_estimate(e);
  EXPECT_EQ(s.profile, "hf-eager");
  EXPECT_EQ(s.layers, m.layers);
  ASSERT_TRUE(s.per_layer.has_value());
  EXPECT_EQ(s.per_layer->sbh, e.activations.per_layer.sbh);
  EXPECT_EQ(s.categories[3], e.figures.activations);
  EXPECT_EQ(s.categories[8], e.figures.peak);
  const std::size_t n = e.activations.embedding.size() + e.activations.layer.size() +
                        e.activations.shared.size() + e.activations.head.size() +
                        e.activations.recompute.size() + e.activations.inputs.size() +
                        e.activations.loop.size();
  ASSERT_EQ(s.entries.size(), n);
  // The layer entries, in order, with their bytes and terms.
  std::size_t k = 0;
  for (const auto& x : s.entries) {
    if (x.group != "layer") continue;
    ASSERT_LT(k, e.activations.layer.size());
    EXPECT_EQ(x.name, e.activations.layer[k].name);
    EXPECT_EQ(x.bytes, e.activations.layer[k].bytes);
    EXPECT_EQ(x.term, e.activations.layer[k].term);
    ++k;
  }
  EXPECT_EQ(k, e.activations.layer.size());
  // Compared with itself: nothing changes.
  const diff::Result r = diff::compare(s, s);
  for (const auto& row : r.rows) EXPECT_FALSE(row.changed()) << row.name;
  for (const auto& c : r.categories) EXPECT_EQ(c.delta, 0) << c.name;
}

TEST(DiffSides, ReportFieldsThatAreMissingOrWrongAreNamed) {
  TrainConfig t;
  t.seq = 16;
  const Estimate e = estimate(Profile::native, resolve_model("tiny"), t);
  nlohmann::json ro{{"schema", report::kSchema},
                    {"model", report::model_json(e.model, e.param_count)},
                    {"run", report::run_json(e.train, "", -1)},
                    {"analytic", report::analytic_json({e})}};
  auto message = [](const nlohmann::json& o, const std::string& profile) {
    try {
      (void)diff::side_from_run_object(o, profile, "A: f.json");
    } catch (const InputError& err) {
      return std::string(err.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(ro, "zero"),
            "diff A: f.json: the run holds no profile 'zero'; it holds: native");
  auto no_bytes = ro;
  no_bytes["analytic"]["native"]["tensors"][2].erase("bytes");
  EXPECT_EQ(message(no_bytes, "native"),
            "diff A: f.json: analytic.native.tensors[2]: missing \"bytes\"");
  auto negative = ro;
  negative["analytic"]["native"]["activations"] = -5;
  EXPECT_EQ(message(negative, "native"),
            "diff A: f.json: analytic.native.activations is -5, not a byte count (an integer "
            ">= 0)");
  auto term = ro;
  term["analytic"]["native"]["tensors"][0]["term"] = "sbv";
  EXPECT_EQ(message(term, "native"),
            "diff A: f.json: analytic.native.tensors[0].term is 'sbv'; allowed: sbh, sbi, as2b, "
            "sb, other");
  auto layers = ro;
  layers["model"]["layers"] = 0;
  EXPECT_EQ(message(layers, "native"),
            "diff A: f.json: model.layers is 0, not a layer count (an integer >= 1)");
}

TEST(DiffSideSpec, ProfilesWithOptionsAndReportsWithTheirs) {
  using cli::DiffSideSpec;
  using cli::parse_diff_side;
  DiffSideSpec s = parse_diff_side("native", "A");
  EXPECT_EQ(s.kind, DiffSideSpec::Kind::profile);
  EXPECT_EQ(s.name, "native");
  EXPECT_TRUE(s.options.empty());

  s = parse_diff_side("hf-eager:dtype=fp32,batch=4", "B");
  EXPECT_EQ(s.kind, DiffSideSpec::Kind::profile);
  EXPECT_EQ(s.name, "hf-eager");
  ASSERT_EQ(s.options.size(), 2u);
  EXPECT_EQ(s.options[0], std::make_pair(std::string("dtype"), std::string("fp32")));
  EXPECT_EQ(s.options[1], std::make_pair(std::string("batch"), std::string("4")));

  s = parse_diff_side("/no/such/dir/old.json:profile=native,run=2", "A");
  EXPECT_EQ(s.kind, DiffSideSpec::Kind::report);
  EXPECT_EQ(s.name, "/no/such/dir/old.json");
  ASSERT_EQ(s.options.size(), 2u);
  EXPECT_EQ(s.options[1].first, "run");

  s = parse_diff_side("reports/a:b.json", "A");  // a ':' not followed by key=value
  EXPECT_EQ(s.kind, DiffSideSpec::Kind::report);
  EXPECT_EQ(s.name, "reports/a:b.json");
  EXPECT_TRUE(s.options.empty());

  auto refused = [](const std::string& text) {
    try {
      (void)parse_diff_side(text, "A");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refused("natve").find("diff A: 'natve' is neither a profile (native, hf-eager, "
                                  "megatron, zero, hf-sdpa, hf-peft) nor a file"),
            std::string::npos);
  EXPECT_NE(refused("hf-eager:dtype").find("'dtype' in 'hf-eager:dtype' is not key=value"),
            std::string::npos);
  EXPECT_NE(refused("native:").find("'' in 'native:' is not key=value"), std::string::npos);
  EXPECT_NE(refused("").find("diff A: empty"), std::string::npos);
}

}  // namespace
}  // namespace trainmem
