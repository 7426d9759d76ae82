// The HTML writer: one self-contained page, every block rendered, every text escaped, a cell's
// tone its class.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "trainmem/report/report_writer.hpp"
#include "trainmem/report/svg_chart.hpp"

namespace trainmem::report {
namespace {

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

bool has(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

TEST(HtmlWriter, EscapesEveryText) {
  EXPECT_EQ(html_escape("a&b<c>d\"e'f"), "a&amp;b&lt;c&gt;d&quot;e&#39;f");
  EXPECT_EQ(html_escape("plain · ²"), "plain · ²");
  HtmlWriter w;
  const std::string bad = "<script>alert('x')</script> & \"q\"";
  w.title(bad);
  w.banner(bad);
  w.heading(bad, bad + "!");
  w.strong(bad);
  w.item(bad);
  w.list({bad});
  w.line(bad);
  w.detail(bad);
  w.alert({bad, bad});
  Table t({{bad, Align::left}});
  t.add_row({Cell(bad, Tone::ok)});
  w.table(t);
  w.passage(bad, "unused");
  const std::string page = w.str();
  EXPECT_FALSE(has(page, "<script>")) << page;
  EXPECT_FALSE(has(page, "'x'")) << page;
  const std::string esc = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;";
  // title (twice: <title> and <h1>), banner, heading (brief, full as title and detail), strong,
  // item, list, line, detail, alert (two lines), header, cell, passage.
  EXPECT_EQ(count(page, esc), 16u) << page;
}

TEST(HtmlWriter, EveryBlockIsAPageElement) {
  HtmlWriter w;
  int built = 0;
  w.document([&] {
    ++built;
    return nlohmann::json{{"n", 1}};
  });
  Table exact({{"name", Align::left}, {"bytes"}});
  exact.add_row({"a", "1024"});
  w.csv_table(exact);
  w.title("Title");
  w.banner("backend meta — PREDICTED");
  w.paragraph("para");
  w.detail("detail");
  w.alert({"FAILED", "  why"});
  w.heading("Full heading", "Brief");
  Table t({{"row", Align::left}, {"ok", Align::left}, {"bytes"}});
  t.add_row({"r", check_cell(false), "1"});
  t.add_rule();
  t.add_row({"s", check_cell(true), "2"});
  w.table(t);
  w.list({"one", "two"});
  w.item("item1");
  w.item("item2");
  w.strong("strong");
  w.passage("text passage\n", "markdown passage\n");
  w.figure([] { return std::string("<svg id=\"fig\"></svg>"); });
  w.line("end", Tone::ok);
  const std::string page = w.str();

  EXPECT_EQ(built, 0);  // the document is the JSON form's only
  EXPECT_FALSE(has(page, "1024"));
  EXPECT_EQ(page.rfind("<!DOCTYPE html>\n", 0), 0u) << page;
  EXPECT_EQ(count(page, "<html"), 1u);
  EXPECT_EQ(count(page, "</html>"), 1u);
  EXPECT_EQ(page.substr(page.size() - 8), "</html>\n");
  EXPECT_TRUE(has(page, "<title>Title</title>"));
  EXPECT_TRUE(has(page, "<meta charset=\"utf-8\">"));
  EXPECT_TRUE(has(page, "<style>"));
  // Nothing fetched at view time, and no script of the writer's own.
  for (const char* net : {"http://", "https://", "<link", "src=", "<script"})
    EXPECT_FALSE(has(page, net)) << net;
  EXPECT_TRUE(has(page, "<h1>Title</h1>"));
  EXPECT_TRUE(has(page, "<p class=\"banner\" id=\"provenance\">backend meta — PREDICTED</p>"));
  EXPECT_TRUE(has(page, "<div class=\"line\">para</div>"));
  EXPECT_TRUE(has(page, "<div class=\"detail\">detail</div>"));
  EXPECT_TRUE(has(page,
                  "<div class=\"alert\" role=\"alert\"><strong class=\"fail\">FAILED</strong>"
                  "\n  why</div>"));
  EXPECT_TRUE(has(page, "<h2 title=\"Full heading\">Brief</h2>"));
  // The table: header cells with their alignment, a cell's tone its class, a rule a new tbody.
  EXPECT_TRUE(has(page,
                  "<th class=\"left\">row</th><th class=\"left\">ok</th>"
                  "<th class=\"right\">bytes</th>"));
  EXPECT_TRUE(has(page, "<td class=\"left fail\">NO</td>"));
  EXPECT_TRUE(has(page, "<td class=\"left ok\">yes</td>"));
  EXPECT_TRUE(has(page, "<td class=\"right\">2</td>"));
  EXPECT_EQ(count(page, "<tbody>"), 2u);
  EXPECT_EQ(count(page, "</tbody>"), 2u);
  EXPECT_TRUE(has(page, "<ul class=\"list\">\n<li>one</li>\n<li>two</li>\n</ul>"));
  EXPECT_TRUE(has(page, "<ul class=\"items\">\n<li>item1</li>\n<li>item2</li>\n</ul>"));
  EXPECT_TRUE(has(page, "<p class=\"strong\">strong</p>"));
  EXPECT_TRUE(has(page, "<pre class=\"passage\">text passage\n</pre>"));
  EXPECT_FALSE(has(page, "markdown passage"));
  EXPECT_TRUE(has(page, "<figure>\n<svg id=\"fig\"></svg>\n</figure>"));
  EXPECT_TRUE(has(page, "<div class=\"line ok\">end</div>"));
  EXPECT_EQ(count(page, "<ul"), count(page, "</ul>"));
  EXPECT_EQ(count(page, "<table"), count(page, "</table>"));
}

TEST(HtmlWriter, ItemsAtTheEndAreClosed) {
  const auto w = make_writer(Format::html, Colour::on);
  w->item("last");
  const std::string page = w->str();
  EXPECT_TRUE(has(page, "<li>last</li>\n</ul>\n</main>")) << page;
  EXPECT_TRUE(has(page, "<title>trainmem report</title>"));
  // str() may be asked twice and gives the same page.
  EXPECT_EQ(w->str(), page);
}

TEST(HtmlWriter, TheBannerIsAParagraphElsewhere) {
  for (Format f : {Format::table, Format::markdown}) {
    const auto a = make_writer(f, Colour::off);
    const auto b = make_writer(f, Colour::off);
    a->banner("backend meta", Tone::ok);
    b->paragraph("backend meta", Tone::ok);
    EXPECT_EQ(a->str(), b->str());
  }
}

// The numeric attribute `name` of each element of `svg` whose tag opens with `opener`.
std::vector<double> attr_of(const std::string& svg, const std::string& opener,
                            const std::string& name) {
  std::vector<double> out;
  const std::regex re(" " + name + "=\"([^\"]*)\"");
  for (auto p = svg.find(opener); p != std::string::npos; p = svg.find(opener, p + 1)) {
    const std::string head = svg.substr(p, svg.find('>', p) - p);
    std::smatch m;
    if (std::regex_search(head, m, re)) out.push_back(std::stod(m[1]));
  }
  return out;
}

TEST(SvgChart, BarsCarryTheirFiguresAndScaleWithThem) {
  BarChart c;
  c.id = "c";
  c.title = "t <&>";
  c.axis_label = "bytes";
  c.series = {"none", "full"};
  c.groups = {{"native", {{4096, "4096", "4 KiB", "native none"}, {1024, "1024", "1 KiB", "nf"}}},
              {"hf <eager>", {{2048, "2048", "2 KiB", "tip \"q\" & <b>"}}}};
  const std::string svg = bar_chart_svg(c);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart bars\" id=\"c\"", 0),
            0u)
      << svg;
  EXPECT_EQ(count(svg, "<rect class=\"bar"), 3u);
  // Every figure as given, in data-v, and every tooltip as a native <title>, escaped.
  EXPECT_EQ(attr_of(svg, "<rect class=\"bar", "data-v"), (std::vector<double>{4096, 1024, 2048}));
  EXPECT_TRUE(has(svg, "<title>tip &quot;q&quot; &amp; &lt;b&gt;</title></rect>")) << svg;
  EXPECT_TRUE(has(svg, "data-group=\"hf &lt;eager&gt;\""));
  EXPECT_TRUE(has(svg, "<title>t &lt;&amp;&gt;</title>"));
  EXPECT_FALSE(has(svg, "<eager>"));
  // Series: a colour class each, a legend entry each, data-series on the bar.
  EXPECT_TRUE(has(svg, "class=\"bar s0\"") && has(svg, "class=\"bar s1\""));
  EXPECT_TRUE(has(svg, "data-series=\"full\""));
  EXPECT_TRUE(has(svg, ">none</text>") && has(svg, ">full</text>"));
  // Widths proportional to the values, from the same zero line.
  const auto w = attr_of(svg, "<rect class=\"bar", "width");
  const auto x = attr_of(svg, "<rect class=\"bar", "x");
  ASSERT_EQ(w.size(), 3u);
  // Widths are written to 0.1 px (±0.05): w0/w1 is off by <= 0.05·(1 + 4)/w1, <= 0.02 while the
  // reference bar is >= 12.5 px wide (it is ~170 px here).
  EXPECT_NEAR(w[0] / w[1], 4.0, 0.02);
  EXPECT_NEAR(w[2] / w[1], 2.0, 0.02);
  EXPECT_EQ(x[0], x[1]);
  EXPECT_EQ(x[0], x[2]);
  // The axis's ticks in a binary unit: 0 KiB ... 4 KiB.
  EXPECT_TRUE(has(svg, ">0 KiB</text>")) << svg;
  EXPECT_TRUE(has(svg, ">4 KiB</text>")) << svg;
  EXPECT_FALSE(has(svg, "nan"));
  EXPECT_EQ(count(svg, "<svg"), count(svg, "</svg>"));
}

TEST(SvgChart, DivergingBarsSplitAtZero) {
  BarChart c;
  c.id = "d";
  c.diverging = true;
  c.groups = {{"more", {{300, "300", "+300 B", "m"}}},
              {"fewer", {{-100, "-100", "-100 B", "f"}}},
              {"same", {{0, "0", "0", "s"}}}};
  const std::string svg = bar_chart_svg(c);
  EXPECT_TRUE(has(svg, "class=\"chart bars diverging\""));
  const auto x = attr_of(svg, "<rect class=\"bar", "x");
  const auto w = attr_of(svg, "<rect class=\"bar", "width");
  ASSERT_EQ(x.size(), 3u);
  const double zero = x[0];  // the positive bar starts at zero
  // Three %.1f roundings (x, w, zero: ±0.05 each) could reach 0.15 in the worst case; x and w
  // come from the same exact edges, so their sum straddles at most one 0.1 step: 0.1 + slack.
  EXPECT_NEAR(x[1] + w[1], zero, 0.11);  // the negative one ends there
  EXPECT_NEAR(w[0] / w[1], 3.0, 0.02);
  EXPECT_TRUE(has(svg, "class=\"bar s0 neg\""));
  EXPECT_EQ(count(svg, " neg\""), 1u);
  EXPECT_GT(w[2], 0);  // a zero still shows (and has its tooltip)
  EXPECT_LT(w[2], 1);
  // An all-zero chart has an axis all the same, and no NaN.
  BarChart z;
  z.groups = {{"r", {{0, "0", "", "zero"}}}};
  z.min_extent = 1;
  const std::string zs = bar_chart_svg(z);
  EXPECT_FALSE(has(zs, "nan")) << zs;
  EXPECT_FALSE(has(zs, "inf")) << zs;
}

TEST(SvgChart, ScatterPointsLieOnTheirLines) {
  ScatterChart c;
  c.id = "s";
  c.series = {"ledger", "cupti"};
  c.points = {{10, 1000, 0, {{"y", "1000"}}, "p0"}, {20, 2000, 1, {{"y", "2000"}}, "p1"}};
  c.lines = {{0, 0, 20, 2000, 0, {{"slope", "100"}}, "l0", "s=8"}};
  const std::string svg = scatter_chart_svg(c);
  EXPECT_EQ(count(svg, "<circle class=\"point"), 2u);
  EXPECT_TRUE(has(svg, "class=\"point s1\""));
  EXPECT_EQ(attr_of(svg, "<circle class=\"point", "data-y"), (std::vector<double>{1000, 2000}));
  EXPECT_TRUE(has(svg, "<title>p0</title></circle>"));
  EXPECT_TRUE(has(svg, "<title>l0</title></line>"));
  EXPECT_TRUE(has(svg, ">s=8</text>"));
  const auto cx = attr_of(svg, "<circle class=\"point", "cx");
  const auto cy = attr_of(svg, "<circle class=\"point", "cy");
  const auto x1 = attr_of(svg, "<line class=\"fit", "x1");
  const auto y1 = attr_of(svg, "<line class=\"fit", "y1");
  const auto x2 = attr_of(svg, "<line class=\"fit", "x2");
  const auto y2 = attr_of(svg, "<line class=\"fit", "y2");
  ASSERT_EQ(x2.size(), 1u);
  // The line ends on the point at (20, 2000) and passes through (10, 1000) halfway.
  // Coordinates to 0.1 px: the same value through two computations rounds to neighbouring 0.1
  // steps at worst (0.1); the midpoint's three roundings give <= 0.05 + 0.05 = 0.1. Plus slack.
  EXPECT_NEAR(cx[1], x2[0], 0.11);
  EXPECT_NEAR(cy[1], y2[0], 0.11);
  EXPECT_NEAR(cx[0], (x1[0] + x2[0]) / 2, 0.11);
  EXPECT_NEAR(cy[0], (y1[0] + y2[0]) / 2, 0.11);
  EXPECT_LT(cy[1], cy[0]);  // more bytes higher up
}

TEST(SvgChart, ExactNumbersReadBackAsTheSameDouble) {
  for (double v :
       {0.0, 35456.0, -524292.0, 1.0658141036401503e-14, 32.625, 1.0 / 3.0, -2.5e-9, 6359678980.0})
    EXPECT_EQ(std::stod(exact_number(v)), v) << exact_number(v);
  EXPECT_EQ(exact_number(35456), "35456");
  EXPECT_EQ(exact_number(-4), "-4");
}

// Commands hand a chart to figure(): only the page shows it; no other writer even builds it.
TEST(SvgChart, OnlyThePageDrawsAFigure) {
  for (Format f : {Format::table, Format::markdown, Format::csv, Format::json}) {
    const auto w = make_writer(f, Colour::off);
    bool built = false;
    w->figure([&] {
      built = true;
      return bar_chart_svg({});
    });
    EXPECT_FALSE(built);
  }
  HtmlWriter w;
  BarChart c;
  c.id = "x";
  c.groups = {{"g", {{1, "1", "1 B", "one"}}}};
  w.figure([&] { return bar_chart_svg(c); });
  EXPECT_TRUE(
      has(w.str(),
          "<figure>\n<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart bars\" id=\"x\""));
  EXPECT_TRUE(has(w.str(), "svg.chart .s0"));  // the page's style colours the series
}

}  // namespace
}  // namespace trainmem::report
