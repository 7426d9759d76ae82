// The HTML writer: one self-contained page, every block rendered, every text escaped, a cell's
// tone its class.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "trainmem/report_writer.hpp"

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

}  // namespace
}  // namespace trainmem::report
