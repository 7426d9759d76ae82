// `trainmem diff`'s report, described once for every format, and its JSON document (see
// include/trainmem/report/diff.hpp).
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "diff_internal.hpp"
#include "trainmem/base/bytes.hpp"
#include "trainmem/report/diff.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/report/svg_chart.hpp"

namespace trainmem::diff {

using nlohmann::json;
using namespace detail;

namespace {

// CSV: one row per category and per tensor, exact bytes.
report::Table exact_table(const Result& r) {
  using report::Align;
  report::Table t({{"kind", Align::left},
                   {"group", Align::left},
                   {"name", Align::left},
                   {"count_a", Align::right},
                   {"count_b", Align::right},
                   {"a_bytes", Align::right},
                   {"b_bytes", Align::right},
                   {"delta", Align::right},
                   {"coefficient_change", Align::left},
                   {"change", Align::left},
                   {"why", Align::left}});
  for (const auto& c : r.categories)
    t.add_row({"category", "", c.name, "", "", std::to_string(c.a), std::to_string(c.b),
               std::to_string(c.delta), "", "", ""});
  for (const auto& row : r.rows)
    t.add_row({"tensor", row.group, row.name, std::to_string(row.count_a),
               std::to_string(row.count_b), std::to_string(row.a_bytes),
               std::to_string(row.b_bytes), std::to_string(row.delta), row.coefficient_change,
               row.change, row.why});
  return t;
}

// The page's chart of the tensor-by-tensor difference: the rows that change, largest |Δ|
// first (at most kChartRows), as bars diverging from zero; each bar's data-v is the row's Δ
// in bytes, its tooltip the row's figures and reason.
constexpr std::size_t kChartRows = 24;

std::string tensor_chart_html(const Result& r) {
  std::vector<const Row*> rows;
  for (const auto& row : r.rows)
    if (row.delta != 0) rows.push_back(&row);
  std::stable_sort(rows.begin(), rows.end(), [](const Row* x, const Row* y) {
    return std::llabs(x->delta) > std::llabs(y->delta);
  });
  const std::size_t changed = rows.size();
  if (rows.size() > kChartRows) rows.resize(kChartRows);
  report::BarChart c;
  c.id = "diff-chart";
  c.title = "Tensor-by-tensor difference, B − A, largest first";
  c.axis_label = "Δ bytes (B − A; layer rows count L times)";
  c.diverging = true;
  for (const Row* row : rows) {
    const std::uint64_t mag = static_cast<std::uint64_t>(std::llabs(row->delta));
    std::string tip = row->group + " / " + row->name + ": Δ " + signed_commas(row->delta) +
                      " B (A " + (row->a ? report::with_commas(row->a_bytes) + " B" : "-") +
                      ", B " + (row->b ? report::with_commas(row->b_bytes) + " B" : "-") + ")";
    if (!row->coefficient_change.empty() && row->coefficient_change != "0")
      tip += "\nΔ coefficient: " + row->coefficient_change;
    if (!row->change.empty()) tip += "\n" + row->change;
    if (!row->why.empty()) tip += "\nwhy: " + row->why;
    c.groups.push_back({row->group + " / " + row->name,
                        {{static_cast<double>(row->delta), std::to_string(row->delta),
                          (row->delta < 0 ? "-" : "+") + format_bytes_human(mag), tip}}});
  }
  std::string caption = "Red: B keeps more bytes than A; green: fewer. ";
  caption += changed > rows.size() ? "The " + std::to_string(rows.size()) + " largest of " +
                                         std::to_string(changed) + " changed tensors"
                                   : "Every changed tensor (" + std::to_string(changed) + ")";
  caption += "; hover a bar for its exact bytes, coefficient change and reason.";
  return "<h2>The difference, drawn: tensor by tensor</h2>\n" + report::bar_chart_svg(c) +
         "<figcaption>" + report::html_escape(caption) + "</figcaption>\n";
}

// The page's chart of the two sides' per-layer activation bytes, side by side.
std::string per_layer_chart_html(const Result& r) {
  report::BarChart c;
  c.id = "per-layer-chart";
  c.title = "Per-layer activation bytes, A and B";
  c.axis_label = "activation bytes per transformer layer";
  for (const Side* s : {&r.a, &r.b}) {
    const char* which = s == &r.a ? "A" : "B";
    c.groups.push_back(
        {std::string(which) + ": " + s->spec,
         {{static_cast<double>(s->per_layer_bytes), std::to_string(s->per_layer_bytes),
           format_bytes_human(s->per_layer_bytes),
           std::string(which) + " (" + s->spec + "): " + report::with_commas(s->per_layer_bytes) +
               " B per layer = " + formula(*s->per_layer)}}});
  }
  return "<h2>Per-layer activations, A and B</h2>\n" + report::bar_chart_svg(c);
}

}  // namespace

void write_report(const Result& r, report::ReportWriter& w, bool all_rows) {
  using report::Align;
  using report::Table;
  w.document([&] { return to_json(r); });
  w.csv_table(exact_table(r));
  w.title("trainmem diff: A = " + r.a.spec + ", B = " + r.b.spec +
          "  (Δ = B − A; GiB = 2^30 bytes)");
  // Items: one line each in text, a list in Markdown (consecutive lines would join there).
  w.item("A: " + describe_side(r.a));
  w.item("B: " + describe_side(r.b));
  if (!r.same_model())
    w.item("Note: A and B are different models (" + join(r.model_differences, "; ") +
           "); compared all the same");
  if (!r.same_shape())
    w.item("Note: A and B have different shapes (" + join(r.shape_differences, "; ") +
           "); compared all the same");
  if (!r.setup_differences.empty()) w.item("Setup differs: " + join(r.setup_differences, "; "));
  for (const auto& n : r.notes) w.item("Note: " + n);
  w.paragraph_break();

  std::uint64_t most = 0;
  for (const auto& c : r.categories) most = std::max({most, c.a, c.b});
  const ByteUnit cu = table_unit(most);
  w.heading("By category");
  Table cats({{"Category", Align::left},
              {std::string("A ") + cu.name, Align::right},
              {std::string("B ") + cu.name, Align::right},
              {std::string("Δ ") + cu.name, Align::right},
              {"Δ bytes", Align::right}});
  for (const auto& c : r.categories)
    cats.add_row({c.name, format_bytes(c.a, cu), format_bytes(c.b, cu), signed_unit(c.delta, cu),
                  signed_commas(c.delta)});
  w.table(cats);
  w.paragraph_break();

  if (r.a.per_layer && r.b.per_layer) {
    const Coefficients& ca = *r.a.per_layer;
    const Coefficients& cb = *r.b.per_layer;
    w.heading("Per-layer activation coefficients (bytes per unit of each monomial)");
    Table co(
        {{"Monomial", Align::left}, {"A", Align::right}, {"B", Align::right}, {"Δ", Align::right}});
    auto row = [&](const char* name, double x, double y) {
      co.add_row({name, report::coef(x), report::coef(y),
                  nonzero(y - x) ? signed_coef(y - x) : std::string("0")});
    };
    row("sbh", ca.sbh, cb.sbh);
    row("sbi", ca.sbi, cb.sbi);
    row("as²b", ca.as2b, cb.as2b);
    row("sb", ca.sb, cb.sb);
    co.add_row({"other B", report::with_commas(ca.other_bytes), report::with_commas(cb.other_bytes),
                signed_commas(signed_delta(cb.other_bytes, ca.other_bytes))});
    co.add_row({"bytes per layer", report::with_commas(r.a.per_layer_bytes),
                report::with_commas(r.b.per_layer_bytes),
                signed_commas(signed_delta(r.b.per_layer_bytes, r.a.per_layer_bytes))});
    w.table(co);
    w.paragraph_break();
    w.paragraph("per layer: A = " + formula(ca) + "; B = " + formula(cb) +
                "; Δ = " + formula_change(ca, cb));
    w.figure([&] { return per_layer_chart_html(r); });
  }

  if (!r.by_tensor) return;
  w.heading("By group (a layer entry counts L times, once per layer)");
  std::uint64_t gmost = 0;
  for (const auto& g : r.groups) gmost = std::max({gmost, g.a, g.b});
  const ByteUnit gu = table_unit(gmost);
  Table gt({{"Group", Align::left},
            {std::string("A ") + gu.name, Align::right},
            {std::string("B ") + gu.name, Align::right},
            {std::string("Δ ") + gu.name, Align::right},
            {"Δ bytes", Align::right}});
  for (const auto& g : r.groups)
    gt.add_row({g.name, format_bytes(g.a, gu), format_bytes(g.b, gu), signed_unit(g.delta, gu),
                signed_commas(g.delta)});
  w.table(gt);
  w.paragraph_break();

  std::vector<const Row*> shown;
  std::uint64_t tmost = 0;
  for (const auto& row : r.rows)
    if (all_rows || row.changed()) {
      shown.push_back(&row);
      tmost = std::max({tmost, row.a_bytes, row.b_bytes});
    }
  const ByteUnit tu = table_unit(tmost);
  if (std::any_of(r.rows.begin(), r.rows.end(), [](const Row& x) { return x.delta != 0; }))
    w.figure([&] { return tensor_chart_html(r); });
  w.heading(
      "Tensors by group, largest |Δ| first (A, B: bytes counted, L× for layer rows; "
      "Δ coefficient: per instance, i.e. per layer for layer rows)");
  if (shown.empty()) {
    w.paragraph("No tensor differs (" + std::to_string(r.rows.size()) + " compared).");
    return;
  }
  Table tt({{"Group", Align::left},
            {"Tensor", Align::left},
            {std::string("A ") + tu.name, Align::right},
            {std::string("B ") + tu.name, Align::right},
            {std::string("Δ ") + tu.name, Align::right},
            {"Δ coefficient", Align::left},
            {"A -> B", Align::left},
            {"Why (B's, or A's when only in A)", Align::left}});
  const std::string* group = nullptr;
  for (const Row* row : shown) {
    if (group && *group != row->group) tt.add_rule();
    group = &row->group;
    tt.add_row({row->group, row->name, row->a ? format_bytes(row->a_bytes, tu) : "-",
                row->b ? format_bytes(row->b_bytes, tu) : "-", signed_unit(row->delta, tu),
                row->coefficient_change, row->change, row->why});
  }
  w.table(tt);
  w.paragraph_break();
  const std::size_t hidden = r.rows.size() - shown.size();
  if (hidden)
    w.paragraph(std::to_string(hidden) + " of " + std::to_string(r.rows.size()) +
                " tensors are the same on both sides and not listed (--all lists them).");
}

json to_json(const Result& r) {
  auto side = [](const Side& s) {
    return json{{"spec", s.spec},
                {"file", s.file.empty() ? json(nullptr) : json(s.file)},
                {"profile", s.profile},
                {"label", s.label},
                {"tensors_available", s.has_tensors},
                {"model", s.model},
                {"run", s.run}};
  };
  auto entry = [](const std::optional<Entry>& e) {
    if (!e) return json(nullptr);
    return json{{"shape", e->shape},
                {"dtype", e->dtype},
                {"bytes", e->bytes},
                {"term", term_name(e->term)},
                {"coefficient", e->coefficient},
                {"kept_by", e->kept_by},
                {"why", e->why}};
  };
  json j{{report::schema::kSchemaKey, report::kSchema},
         {"a", side(r.a)},
         {"b", side(r.b)},
         {"same_model", r.same_model()},
         {"same_shape", r.same_shape()},
         {"differences", json{{"model", r.model_differences},
                              {"shape", r.shape_differences},
                              {"setup", r.setup_differences}}},
         {"granularity", r.by_tensor ? "tensor" : "category"},
         {"notes", r.notes}};
  json cats = json::array();
  for (const auto& c : r.categories)
    cats.push_back(json{{"category", c.name}, {"a", c.a}, {"b", c.b}, {"delta", c.delta}});
  j["categories"] = cats;
  if (r.a.per_layer && r.b.per_layer) {
    const Coefficients& ca = *r.a.per_layer;
    const Coefficients& cb = *r.b.per_layer;
    json delta = json::object();
    for (const auto& term : report::schema::kCoefficientTerms)
      delta[term.key] = cb.*term.member - ca.*term.member;
    delta[report::schema::kOtherBytes] = signed_delta(cb.other_bytes, ca.other_bytes);
    j["per_layer"] = json{{"a", report::coefficients_json(ca)},
                          {"b", report::coefficients_json(cb)},
                          {"delta", delta},
                          {"change", formula_change(ca, cb)},
                          {"a_bytes", r.a.per_layer_bytes},
                          {"b_bytes", r.b.per_layer_bytes},
                          {"delta_bytes", signed_delta(r.b.per_layer_bytes, r.a.per_layer_bytes)}};
  } else {
    j["per_layer"] = nullptr;
  }
  json groups = json::array();
  for (const auto& g : r.groups)
    groups.push_back(json{{"group", g.name}, {"a", g.a}, {"b", g.b}, {"delta", g.delta}});
  j["groups"] = groups;
  json rows = json::array();
  for (const auto& row : r.rows)
    rows.push_back(json{{"group", row.group},
                        {"name", row.name},
                        {"count_a", row.count_a},
                        {"count_b", row.count_b},
                        {"a_bytes", row.a_bytes},
                        {"b_bytes", row.b_bytes},
                        {"delta", row.delta},
                        {"coefficient_change", row.coefficient_change},
                        {"change", row.change},
                        {"why", row.why},
                        {"a", entry(row.a)},
                        {"b", entry(row.b)}});
  j["tensors"] = rows;
  return j;
}

}  // namespace trainmem::diff
