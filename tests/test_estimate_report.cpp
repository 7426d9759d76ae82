// report.hpp: GiB numbers, the aligned table in its three forms, and the JSON blocks of
// schema "trainmem/1".
#include <gtest/gtest.h>

#include <string>

#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/report/report.hpp"

namespace trainmem {
namespace {

using nlohmann::json;

TEST(ReportNumbers, GibTwoDecimals) {
  EXPECT_EQ(report::gib2(0), "0.00");
  EXPECT_EQ(report::gib2(1ull << 30), "1.00");
  EXPECT_EQ(report::gib2(6738415616ull * 2), "12.55");  // LLaMA-7B fp16 params
  EXPECT_EQ(report::gib2(6738415616ull * 12), "75.31");
  EXPECT_EQ(report::gib2(262144000), "0.24");
  EXPECT_EQ(report::coef(40.0), "40");
  EXPECT_EQ(report::coef(4.0 / 3.0), "1.3333");
  EXPECT_EQ(report::coef(0.5), "0.5");
  EXPECT_EQ(report::with_commas(6738415616ull), "6,738,415,616");
  EXPECT_EQ(report::with_commas(12), "12");
  EXPECT_EQ(format_bytes_human(33554432), "32.00 MiB");
  EXPECT_EQ(format_bytes_human(12), "12 B");
}

report::Table sample() {
  report::Table t({{"Profile", report::Align::left}, {"Params", report::Align::right}});
  t.add_row({"native", "12.55"});
  t.add_rule();
  t.add_row({"hf-eager", "1.5"});
  return t;
}

TEST(ReportTable, TextAlignsColumns) {
  EXPECT_EQ(sample().text(),
            "Profile   Params\n"
            "----------------\n"
            "native     12.55\n"
            "----------------\n"
            "hf-eager     1.5\n");
  EXPECT_EQ(sample().row_count(), 2u);
}

TEST(ReportTable, WidthCountsUtf8CodePoints) {
  report::Table t({{"f", report::Align::left}, {"x", report::Align::right}});
  t.add_row({"as²b", "1"});
  t.add_row({"sbh", "2"});
  EXPECT_EQ(t.text(), "f     x\n-------\nas²b  1\nsbh   2\n");
}

TEST(ReportTable, MarkdownAndCsv) {
  EXPECT_EQ(sample().markdown(),
            "| Profile | Params |\n| :--- | ---: |\n| native | 12.55 |\n| hf-eager | 1.5 |\n");
  report::Table t({{"a", report::Align::left}, {"b", report::Align::left}});
  t.add_row({"x,y", "say \"hi\""});
  EXPECT_EQ(t.csv(), "a,b\n\"x,y\",\"say \"\"hi\"\"\"\n");
}

TEST(ReportTable, RowOfTheWrongWidthIsRefused) {
  report::Table t({{"a", report::Align::left}});
  EXPECT_THROW(t.add_row({"1", "2"}), Error);
}

TEST(ReportJson, AnalyticBlockHasTheSchemaFields) {
  ModelConfig m;
  m.name = "tiny";
  m.vocab = 256;
  m.hidden = 64;
  m.intermediate = 176;
  m.layers = 2;
  m.heads = 4;
  m.kv_heads = 2;
  m.max_positions = 2048;
  TrainConfig t;
  t.batch = 2;
  t.seq = 16;
  std::vector<Estimate> es;
  for (Profile p : all_profiles()) es.push_back(estimate(p, m, t));
  const json a = report::analytic_json(es);
  for (const char* p : {"native", "hf-eager", "megatron", "zero"}) {
    ASSERT_TRUE(a.contains(p)) << p;
    const json& x = a.at(p);
    for (const char* k : {"params", "gradients", "optimizer_states", "activations",
                          "activations_peak", "workspace", "sum", "peak", "per_layer_activations",
                          "coefficients", "peak_breakdown", "tensors", "label", "notes"})
      EXPECT_TRUE(x.contains(k)) << p << " lacks " << k;
    for (const char* k : {"sbh", "sbi", "as2b", "sb"})
      EXPECT_TRUE(x.at("coefficients").at(k).is_number()) << k;
    for (const char* k :
         {"params", "gradients", "optimizer_states", "activations", "workspace", "inputs"})
      EXPECT_TRUE(x.at("peak_breakdown").at(k).is_number_unsigned()) << k;
    EXPECT_TRUE(x.at("peak").is_number_unsigned());
  }
  EXPECT_EQ(a.at("native").at("activations").get<std::uint64_t>(), es[0].figures.activations);
  EXPECT_EQ(a.at("native").at("workspace").get<std::uint64_t>(), es[0].figures.workspace);

  const json model = report::model_json(m, 12345);
  for (const char* k :
       {"name", "params", "layers", "hidden", "intermediate", "heads", "kv_heads", "vocab"})
    EXPECT_TRUE(model.contains(k)) << k;
  EXPECT_EQ(model.at("kv_heads"), 2);
  const json run = report::run_json(t, "", -1);
  for (const char* k :
       {"batch", "seq", "dtype", "optimizer", "checkpointing", "attention", "backend", "steps"})
    EXPECT_TRUE(run.contains(k)) << k;
  EXPECT_TRUE(run.at("backend").is_null());
  EXPECT_EQ(run.at("dtype"), "bf16");
  EXPECT_EQ(report::run_json(t, "meta", 2).at("steps"), 2);
}

TEST(ReportExplain, FormulaAndSbhEquivalent) {
  ModelConfig m;
  m.name = "llama-7b";
  m.vocab = 32000;
  m.hidden = 4096;
  m.intermediate = 11008;
  m.layers = 32;
  m.heads = 32;
  m.kv_heads = 32;
  m.max_positions = 2048;
  TrainConfig t;
  t.batch = 8;
  t.seq = 512;
  t.dtype = DType::f16;
  const Estimate z = estimate(Profile::zero, m, t);
  EXPECT_EQ(report::per_layer_formula(z), "24·sbh");
  EXPECT_DOUBLE_EQ(report::sbh_equivalent(z), 24.0);
  const Estimate mg = estimate(Profile::megatron, m, t);
  EXPECT_EQ(report::per_layer_formula(mg), "34·sbh + 5·as²b");
  EXPECT_DOUBLE_EQ(report::sbh_equivalent(mg), 34.0 + 5.0 * 32 * 512 / 4096);  // 54
  const Estimate n = estimate(Profile::native, m, t);
  // 16 + 6·i/h + 2·a·s/h + 8/h
  // A handful of double operations on ~40 (ulp 7e-15): 1e-12 is slack over a few ulps.
  EXPECT_NEAR(report::sbh_equivalent(n), 16 + 6 * 2.6875 + 2 * 4 + 8.0 / 4096, 1e-12);
  const std::string text = report::explain_text(n);
  EXPECT_NE(text.find("16·sbh + 6·sbi + 2·as²b + 8·sb"), std::string::npos) << text;
  EXPECT_NE(text.find("probs"), std::string::npos);
}

}  // namespace
}  // namespace trainmem
