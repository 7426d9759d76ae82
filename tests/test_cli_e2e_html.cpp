// End to end: --format html of every command is one well-formed, self-contained page whose
// tables are the Markdown report's cell for cell, and whose key figures are the JSON report's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <regex>
#include <set>

#include "test_cli_e2e_helpers.hpp"
#include "trainmem/report/report.hpp"

namespace trainmem::e2e {
namespace {

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

bool has(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

std::string unescape(const std::string& s) {
  static const std::pair<const char*, const char*> kEntities[] = {
      {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&#39;", "'"}, {"&amp;", "&"}};
  std::string o;
  for (std::size_t i = 0; i < s.size();) {
    bool done = false;
    for (const auto& [e, c] : kEntities)
      if (s.compare(i, std::strlen(e), e) == 0) {
        o += c;
        i += std::strlen(e);
        done = true;
        break;
      }
    if (!done) o += s[i++];
  }
  return o;
}

// The page's <table>s: rows of cell texts (header row first), entities decoded; the Markdown
// parser's shape. A cell's text is what lies between its tags (the writer nests none).
std::vector<std::vector<std::vector<std::string>>> parse_html_tables(const std::string& page) {
  std::vector<std::vector<std::vector<std::string>>> tables;
  for (auto t = page.find("<table"); t != std::string::npos; t = page.find("<table", t + 1)) {
    const auto end = page.find("</table>", t);
    const std::string body = page.substr(t, end - t);
    std::vector<std::vector<std::string>> rows;
    for (auto r = body.find("<tr"); r != std::string::npos; r = body.find("<tr", r + 1)) {
      const auto rend = body.find("</tr>", r);
      const std::string row = body.substr(r, rend - r);
      std::vector<std::string> cells;
      for (auto c = row.find("<t", 1); c != std::string::npos; c = row.find("<t", c + 1)) {
        const auto open_end = row.find('>', c);
        const auto close = row.find("</t", open_end);
        cells.push_back(unescape(row.substr(open_end + 1, close - open_end - 1)));
        c = close;
      }
      rows.push_back(cells);
    }
    tables.push_back(rows);
  }
  return tables;
}

// One page, complete and self-contained: the doctype first, one html, head and body, the
// elements the writer opens all closed, nothing fetched at view time.
void expect_page(const std::string& page, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(page.rfind("<!DOCTYPE html>\n", 0), 0u) << page.substr(0, 200);
  EXPECT_EQ(count(page, "<html"), 1u);
  EXPECT_EQ(count(page, "</html>"), 1u);
  EXPECT_EQ(page.substr(page.size() - 8), "</html>\n");
  EXPECT_EQ(count(page, "<head>"), 1u);
  EXPECT_EQ(count(page, "<body>"), 1u);
  // One <title> in the head (an inline SVG has its own).
  EXPECT_EQ(count(page.substr(0, page.find("</head>")), "<title>"), 1u);
  for (const char* tag : {"table", "tbody", "thead", "tr", "ul", "figure", "h1", "h2", "svg"})
    EXPECT_EQ(count(page, std::string("<") + tag + ">") + count(page, std::string("<") + tag + " "),
              count(page, std::string("</") + tag + ">"))
        << tag;
  for (const char* net : {"<link", "src=\"http", "href=\"http", "url(http", "@import"})
    EXPECT_FALSE(has(page, net)) << net;
  EXPECT_FALSE(has(page, "\033")) << "no terminal colour in a page";
}

// The marks of the chart whose <svg> has id `id`: each element of `tag` with class `cls`
// (e.g. "rect", "bar"), as its attributes (entities decoded) plus "title", its tooltip.
using Attrs = std::map<std::string, std::string>;
std::vector<Attrs> chart_marks(const std::string& page, const std::string& id,
                               const std::string& tag, const std::string& cls) {
  std::vector<Attrs> out;
  const auto start = page.find("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart");
  for (auto s = start; s != std::string::npos; s = page.find("<svg ", s + 1)) {
    const auto open_end = page.find('>', s);
    if (page.substr(s, open_end - s).find("id=\"" + id + "\"") == std::string::npos) continue;
    const std::string svg = page.substr(s, page.find("</svg>", s) - s);
    static const std::regex attr("([a-z][a-z0-9-]*)=\"([^\"]*)\"");
    const std::string opener = "<" + tag + " class=\"" + cls;
    for (auto m = svg.find(opener); m != std::string::npos; m = svg.find(opener, m + 1)) {
      const auto end = svg.find('>', m);
      const std::string head = svg.substr(m, end - m);
      Attrs a;
      for (std::sregex_iterator it(head.begin(), head.end(), attr), e; it != e; ++it)
        a[(*it)[1]] = unescape((*it)[2]);
      const auto t = svg.find("<title>", end);
      const auto close = svg.find("</" + tag + ">", end);
      if (t != std::string::npos && t < close)
        a["title"] = unescape(svg.substr(t + 7, svg.find("</title>", t) - t - 7));
      out.push_back(a);
    }
    return out;
  }
  return out;
}

std::uint64_t u64(const std::string& s) {
  return std::stoull(s);
}

struct Case {
  std::string name;
  std::string args;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"estimate", "estimate --model tiny --batch 2 --seq 64 --optimizer all --profile all "},
      {"estimate-ranks", "estimate --model tiny --batch 2 --seq 32 --world-size 4 --tp 2 "},
      {"profile", "profile --model tiny --batch 2 --seq 24 --backend meta "},
      {"profile-ranks", "profile --model tiny --batch 2 --seq 32 --world-size 4 --tp 2 "},
      {"compare", "compare --model tiny --batch 2 --seq 16 --backend meta --optimizer all "},
      {"sweep", "sweep --model tiny --backend meta --batch 1,2 --seq 16,24 --fit "},
      {"maxbatch", "maxbatch --model tiny --seq 32 --budget 40MiB "},
      {"maxbatch-ranks", "maxbatch --model tiny --seq 32 --budget 1GiB --world-size 2 --tp 2 "},
      {"diff", "diff zero megatron --model tiny --batch 2 --seq 32 "},
  };
  return c;
}

TEST(CliE2EHtml, EveryCommandWritesAPageWithTheMarkdownTables) {
  for (const auto& cs : cases()) {
    SCOPED_TRACE(cs.name);
    const Result h = trainmem(cs.args + "--format html");
    ASSERT_EQ(h.code, 0) << h.err;
    expect_page(h.out, cs.name);
    const Result m = trainmem(cs.args + "--format markdown");
    ASSERT_EQ(m.code, 0) << m.err;
    // The report's tables (profile's page adds the live tensors' table under its timeline).
    auto ht = parse_html_tables(h.out);
    const auto mt = parse_markdown_tables(m.out);
    ht.erase(std::remove_if(ht.begin(), ht.end(),
                            [](const auto& t) {
                              return !t.empty() && t[0].size() > 1 && t[0][0] == "tensor" &&
                                     t[0][1] == "layer";
                            }),
             ht.end());
    ASSERT_FALSE(ht.empty());
    ASSERT_EQ(ht.size(), mt.size());
    for (std::size_t k = 0; k < ht.size(); ++k) {
      ASSERT_EQ(ht[k].size(), mt[k].size()) << "table " << k;
      for (std::size_t r = 0; r < ht[k].size(); ++r) {
        std::vector<std::string> md = mt[k][r];
        for (auto& cell : md)  // Markdown escapes '|' in a cell
          for (auto p = cell.find("\\|"); p != std::string::npos; p = cell.find("\\|", p))
            cell.erase(p, 1);
        EXPECT_EQ(ht[k][r], md) << "table " << k << " row " << r;
      }
    }
  }
}

TEST(CliE2EHtml, ProfileFiguresAreTheJsonReports) {
  const std::string args = cases()[2].args;
  const json j = trainmem(args + "--format json").j();
  const Result h = trainmem(args + "--format html");
  ASSERT_EQ(h.code, 0) << h.err;
  // The provenance banner, prominent, says PREDICTED on meta.
  EXPECT_TRUE(has(h.out, "<p class=\"banner\" id=\"provenance\">backend meta — PREDICTED"))
      << h.out.substr(0, 3000);
  std::map<std::string, json> rec;
  for (const auto& row : j["reconciliation"]) rec[row["category"]] = row;
  const auto tables = parse_html_tables(h.out);
  ASSERT_FALSE(tables.empty());
  const auto& t0 = tables[0];
  ASSERT_EQ(t0.size(), rec.size() + 1);
  EXPECT_EQ(t0[0][0], "category");
  for (std::size_t k = 1; k < t0.size(); ++k) {
    const json& want = rec.at(t0[k][0]);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.2f", want["measured"].get<double>() / 1048576.0);
    EXPECT_EQ(t0[k][1], buf) << t0[k][0];
    EXPECT_EQ(t0[k].back(), want["ok"].get<bool>() ? "yes" : "NO");
  }
  // Every check cell carries its tone as a class.
  EXPECT_EQ(count(h.out, ">yes</td>"), count(h.out, "ok\">yes</td>"));
  EXPECT_GT(count(h.out, "ok\">yes</td>"), 0u);
  EXPECT_TRUE(has(h.out, "<title>trainmem profile: tiny"));

  // The timeline: the SVG inline with the peak instant, and the tensors live at the peak,
  // which add up, category by category, to the ledger's peak breakdown.
  EXPECT_EQ(count(h.out, "<svg "), 2u);  // the timeline and the per-layer chart
  EXPECT_EQ(count(h.out, "<div id=\"timeline\">\n<svg "), 1u);
  EXPECT_EQ(count(h.out, "class=\"instant peak\""), 1u);
  EXPECT_TRUE(has(h.out, "<script type=\"application/json\" id=\"tm-timeline-data\">"));
  const auto live = *std::find_if(tables.begin(), tables.end(), [](const auto& t) {
    return !t.empty() && !t[0].empty() && t[0][0] == "tensor";
  });
  ASSERT_EQ(live[0], (std::vector<std::string>{"tensor", "layer", "category", "bytes", "phase"}));
  std::map<std::string, std::uint64_t> by_cat;
  bool peak_tensor = false;
  const json& led = j["measured"]["ledger"];
  for (std::size_t k = 1; k < live.size(); ++k) {
    std::string b = live[k][3];
    b.erase(std::remove(b.begin(), b.end(), ','), b.end());
    by_cat[live[k][2]] += std::stoull(b);
    peak_tensor |= live[k][0] == led["peak_at"]["tensor"].get<std::string>();
  }
  std::map<std::string, std::uint64_t> want;
  for (const auto& [cat, bytes] : led["peak_breakdown"].items())
    if (bytes.get<std::uint64_t>()) want[cat] = bytes.get<std::uint64_t>();
  EXPECT_EQ(by_cat, want);
  EXPECT_TRUE(peak_tensor);
  // Only the page asks for the timeline: the other formats are as they were.
  EXPECT_EQ(trainmem(args).out.find("Timeline"), std::string::npos);
}

// estimate's page draws the HF step's timeline (hf-eager/hf-sdpa in transformers 5.25) as the
// profile page draws the native step's: one peak instant, and the tensors live at the peak add
// up to the profile's peak in the JSON report.
TEST(CliE2EHtml, EstimatePageDrawsTheHfStepTimeline) {
  const std::string args =
      "estimate --model tiny --batch 2 --seq 64 --profile hf-sdpa --precision amp ";
  const json j = trainmem(args + "--format json").j();
  const Result h = trainmem(args + "--format html");
  ASSERT_EQ(h.code, 0) << h.err;
  EXPECT_TRUE(has(h.out, "<h2>The hf-sdpa step, event by event (adamw, checkpointing none)"));
  EXPECT_EQ(count(h.out, "class=\"instant peak\""), 1u);
  const auto tables = parse_html_tables(h.out);
  const auto live = std::find_if(tables.begin(), tables.end(), [](const auto& t) {
    return !t.empty() && !t[0].empty() && t[0][0] == "tensor";
  });
  ASSERT_NE(live, tables.end());
  std::uint64_t sum = 0;
  for (std::size_t k = 1; k < live->size(); ++k) {
    std::string b = (*live)[k][3];
    b.erase(std::remove(b.begin(), b.end(), ','), b.end());
    sum += std::stoull(b);
  }
  EXPECT_EQ(sum, j["analytic"]["hf-sdpa"]["peak"].get<std::uint64_t>());
  // A profile without an event sequence draws none (the older era's category maxima).
  const Result older = trainmem(
      "estimate --model tiny --batch 2 --seq 64 --profile hf-eager --hf-version 4.35 --format "
      "html");
  ASSERT_EQ(older.code, 0) << older.err;
  EXPECT_FALSE(has(older.out, "event by event"));
}

// The bound docs/output-formats.md states: LLaMA-2-70B's profile page on meta stays under
// 3 MiB (its timeline downsampled, the tensor records embedded once).
TEST(CliE2EHtml, Llama70bProfilePageStaysUnderItsBound) {
  for (const char* extra : {"", "--checkpointing full ", "--batch 1 --seq 4096 "}) {
    const Result h = trainmem(std::string("profile --model llama2-70b --backend meta ") + extra +
                              "--format html");
    ASSERT_EQ(h.code, 0) << h.err;
    expect_page(h.out, extra);
    EXPECT_TRUE(has(h.out, "class=\"instant peak\""));
    EXPECT_LT(h.out.size(), 3u << 20) << extra;
  }
}

TEST(CliE2EHtml, MaxbatchAndCompareFiguresAreTheJsonReports) {
  const std::string mb = cases()[6].args;
  const json mj = trainmem(mb + "--format json").j();
  const auto mt = parse_html_tables(trainmem(mb + "--format html").out);
  ASSERT_EQ(mt.size(), 1u);
  ASSERT_EQ(mt[0].size(), 3u);
  EXPECT_EQ(mt[0][1][0], std::to_string(mj["batch"].get<std::int64_t>()));
  EXPECT_EQ(mt[0][2][0], std::to_string(mj["batch"].get<std::int64_t>() + 1));

  const std::string cmp = cases()[4].args;
  const json cj = trainmem(cmp + "--format json").j();
  const std::string cpage = trainmem(cmp + "--format html").out;
  const auto ct = parse_html_tables(cpage);
  // Every run's timeline, the two modes of each optimizer side by side.
  EXPECT_EQ(count(cpage, "<div><svg "), cj["runs"].size());
  EXPECT_EQ(count(cpage, "<svg "), cj["runs"].size() + 1);  // and the per-layer chart
  EXPECT_EQ(count(cpage, "<div class=\"side-by-side\">"), 1u);
  // Only the page asks for the timelines.
  EXPECT_EQ(trainmem(cmp).out.find("<svg"), std::string::npos);
  ASSERT_FALSE(ct.empty());
  ASSERT_EQ(ct[0].size(), cj["runs"].size() + 1);
  for (std::size_t k = 1; k < ct[0].size(); ++k) {
    const json& run = cj["runs"][k - 1];
    std::string optimizer = ct[0][k][0];  // the display name: AdamW, SGD, LOMO
    std::transform(optimizer.begin(), optimizer.end(), optimizer.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    EXPECT_EQ(optimizer, run["run"]["optimizer"]);
    EXPECT_EQ(ct[0][k][1], run["run"]["checkpointing"]);
  }
}

// ---- the charts (issue 17): every bar and point carries the JSON report's figure

// estimate: a bar per profile and checkpointing mode, its data-v the profile's
// per_layer_activations in that mode's run object.
TEST(CliE2EHtml, EstimatePerLayerBarsAreTheJsonReports) {
  const std::string args =
      "estimate --model llama2-7b --batch 2 --seq 512 --optimizer adamw --checkpointing both "
      "--profile all ";
  const json j = trainmem(args + "--format json").j();
  const std::string page = trainmem(args + "--format html").out;
  const auto bars = chart_marks(page, "per-layer-chart", "rect", "bar");
  ASSERT_EQ(j["runs"].size(), 2u);
  std::size_t want = 0;
  for (const auto& run : j["runs"]) want += run["analytic"].size();
  ASSERT_EQ(bars.size(), want);
  std::size_t seen = 0;
  for (const auto& run : j["runs"]) {
    const std::string series = "checkpointing " + run["run"]["checkpointing"].get<std::string>();
    for (const auto& [profile, a] : run["analytic"].items()) {
      const auto it = std::find_if(bars.begin(), bars.end(), [&](const Attrs& b) {
        return b.at("data-group") == profile && b.at("data-series") == series;
      });
      ASSERT_NE(it, bars.end()) << profile << " " << series;
      EXPECT_EQ(u64(it->at("data-v")), a["per_layer_activations"].get<std::uint64_t>())
          << profile << " " << series;
      // The tooltip gives the exact bytes and the s·b·h coefficient the JSON holds.
      EXPECT_TRUE(has(it->at("title"),
                      report::with_commas(a["per_layer_activations"].get<std::uint64_t>()) + " B"))
          << it->at("title");
      EXPECT_TRUE(
          has(it->at("title"), report::fixed(a["sbh_equivalent"].get<double>(), 2) + "·sbh"))
          << it->at("title");
      ++seen;
    }
  }
  EXPECT_EQ(seen, want);
  // Longer bars for more bytes: the widths keep the figures' order.
  for (const auto& x : bars)
    for (const auto& y : bars)
      if (u64(x.at("data-v")) > u64(y.at("data-v"))) {
        EXPECT_GT(std::stod(x.at("width")), std::stod(y.at("width")));
      }
  // Only the page draws it.
  EXPECT_FALSE(has(trainmem(args + "--format markdown").out, "per-layer-chart"));
}

// profile and compare: the measured (ledger) per-layer bytes first, then every profile.
TEST(CliE2EHtml, ProfileAndComparePerLayerBarsAreTheJsonReports) {
  {
    const std::string args = cases()[2].args + "--profile all ";
    const json j = trainmem(args + "--format json").j();
    const auto bars =
        chart_marks(trainmem(args + "--format html").out, "per-layer-chart", "rect", "bar");
    ASSERT_EQ(bars.size(), j["analytic"].size() + 1);
    EXPECT_EQ(bars[0].at("data-group"), "measured (meta, predicted)");
    EXPECT_EQ(u64(bars[0].at("data-v")),
              j["measured"]["ledger"]["per_layer_activations"].get<std::uint64_t>());
    for (std::size_t k = 1; k < bars.size(); ++k)
      EXPECT_EQ(
          u64(bars[k].at("data-v")),
          j["analytic"].at(bars[k].at("data-group"))["per_layer_activations"].get<std::uint64_t>())
          << bars[k].at("data-group");
  }
  const std::string cmp = cases()[4].args;
  const json cj = trainmem(cmp + "--format json").j();
  const auto bars =
      chart_marks(trainmem(cmp + "--format html").out, "per-layer-chart", "rect", "bar");
  ASSERT_FALSE(bars.empty());
  std::size_t matched = 0;
  for (const auto& b : bars) {
    // The first optimizer's run of that checkpointing mode.
    const json* run = nullptr;
    for (const auto& r : cj["runs"])
      if ("checkpointing " + r["run"]["checkpointing"].get<std::string>() == b.at("data-series") &&
          r["run"]["optimizer"] == cj["runs"][0]["run"]["optimizer"]) {
        run = &r;
        break;
      }
    ASSERT_NE(run, nullptr) << b.at("data-series");
    const std::uint64_t want =
        b.at("data-group").rfind("measured", 0) == 0
            ? (*run)["measured"]["ledger"]["per_layer_activations"].get<std::uint64_t>()
            : (*run)["analytic"]
                  .at(b.at("data-group"))["per_layer_activations"]
                  .get<std::uint64_t>();
    EXPECT_EQ(u64(b.at("data-v")), want) << b.at("data-group") << " " << b.at("data-series");
    ++matched;
  }
  EXPECT_EQ(matched, 2 * (cj["runs"][0]["analytic"].size() + 1));
}

// sweep --fit: a point per run (its measured per-layer bytes, fitted value and residual the
// JSON report's), a fitted line per sequence length through the fitted values, a residual bar
// per run.
TEST(CliE2EHtml, SweepFitChartsAreTheJsonReports) {
  const std::string args = cases()[5].args;
  const json j = trainmem(args + "--format json").j();
  const std::string page = trainmem(args + "--format html").out;
  const auto points = chart_marks(page, "fit-chart", "circle", "point");
  const auto lines = chart_marks(page, "fit-chart", "line", "fit");
  const auto residuals = chart_marks(page, "residual-chart", "rect", "bar");
  const json& runs = j["runs"];
  const json& res = j["fit"]["ledger"]["residuals"];
  ASSERT_EQ(points.size(), runs.size());
  ASSERT_EQ(residuals.size(), runs.size());
  ASSERT_EQ(res.size(), runs.size());
  std::map<std::string, const Attrs*> line_of_seq;
  for (const auto& l : lines) line_of_seq[l.at("data-seq")] = &l;
  std::set<std::int64_t> seqs;
  for (const auto& r : runs) seqs.insert(r["run"]["seq"].get<std::int64_t>());
  EXPECT_EQ(line_of_seq.size(), seqs.size());
  for (std::size_t k = 0; k < runs.size(); ++k) {
    SCOPED_TRACE(k);
    const Attrs& p = points[k];
    const json& run = runs[k]["run"];
    EXPECT_EQ(p.at("data-source"), "ledger");
    EXPECT_EQ(p.at("data-batch"), std::to_string(run["batch"].get<std::int64_t>()));
    EXPECT_EQ(p.at("data-seq"), std::to_string(run["seq"].get<std::int64_t>()));
    const double y = std::stod(p.at("data-y"));
    EXPECT_EQ(y, runs[k]["measured"]["ledger"]["per_layer_activations"].get<double>());
    EXPECT_EQ(std::stod(p.at("data-residual")), res[k].get<double>());
    EXPECT_EQ(std::stod(residuals[k].at("data-v")), res[k].get<double>());
    // measured − fitted = residual, and the point's fitted value lies on its line.
    const double fitted = std::stod(p.at("data-fitted"));
    // data-* numbers are written with %.17g (exact_number: a double round-trips), so these two
    // only differ by the fit's own double arithmetic (a few ulps, ~1e-15 relative); 1e-6 is far
    // looser than that, kept because the fit's residual is not required to be computed as y -
    // fitted.
    EXPECT_NEAR(y - fitted, res[k].get<double>(), 1e-6 * y);
    const Attrs& l = *line_of_seq.at(p.at("data-seq"));
    const double tokens = run["batch"].get<double>() * run["seq"].get<double>();
    // slope·tokens (coefficients at b = 1 over s, times b·s) vs the fit's X·c: a few double
    // roundings, ~1e-15 relative; 1e-6 as above.
    EXPECT_NEAR(std::stod(l.at("data-slope")) * tokens, fitted, 1e-6 * fitted);
    // Drawn where it says: the point sits on the line's segment from the origin.
    const double x1 = std::stod(l.at("x2")) - std::stod(l.at("x1"));
    const double y1 = std::stod(l.at("y2")) - std::stod(l.at("y1"));
    const double px = std::stod(p.at("cx")) - std::stod(l.at("x1"));
    const double py = std::stod(p.at("cy")) - std::stod(l.at("y1"));
    // Pixel coordinates are written to 0.1 px (%.1f, ±0.05 each): the point's distance from the
    // line, |cross|/|line|, is then off by <= ~0.05·(1 + |p|/|line|)·sqrt 2 <= 0.15 px for a point
    // on the segment; 0.5 px is 3x.
    EXPECT_NEAR(px * y1 - py * x1, 0.0, 0.5 * std::hypot(x1, y1)) << "off its line";
  }
  // The fitted line's slope: the JSON's coefficients at b = 1 over s (one model: sbh, as2b).
  const json& m = runs[0]["model"];
  const json& c = j["fit"]["ledger"]["coefficients"];
  for (const auto& [seq, l] : line_of_seq) {
    const double s = std::stod(seq);
    const double want = c["sbh"].get<double>() * m["hidden"].get<double>() +
                        c["as2b"].get<double>() * m["heads"].get<double>() * s;
    // %.17g on both sides; the sum sbh·h + as2b·a·s in double: a few ulps, 1e-9 is slack.
    EXPECT_NEAR(std::stod(l->at("data-slope")), want, 1e-9 * want) << seq;
  }
  // Without --fit, no chart.
  EXPECT_FALSE(has(trainmem("sweep --model tiny --backend meta --batch 1,2 --seq 16 "
                            "--format html")
                       .out,
                   "fit-chart"));
}

// diff: a bar per changed tensor, largest |Δ| first, its data-v the JSON row's delta.
TEST(CliE2EHtml, DiffTensorBarsAreTheJsonReports) {
  const std::string args = "diff hf-eager native --model llama2-7b --batch 1 --seq 1024 ";
  const json j = trainmem(args + "--format json").j();
  const std::string page = trainmem(args + "--format html").out;
  const auto bars = chart_marks(page, "diff-chart", "rect", "bar");
  std::vector<std::pair<std::int64_t, std::string>> changed;  // (delta, group / name)
  for (const auto& t : j["tensors"])
    if (t["delta"].get<std::int64_t>() != 0)
      changed.push_back({t["delta"].get<std::int64_t>(),
                         t["group"].get<std::string>() + " / " + t["name"].get<std::string>()});
  ASSERT_GT(changed.size(), 24u);  // so the chart shows the largest only
  ASSERT_EQ(bars.size(), 24u);
  std::int64_t prev = INT64_MAX;
  for (const auto& b : bars) {
    const auto it = std::find_if(changed.begin(), changed.end(),
                                 [&](const auto& c) { return c.second == b.at("data-group"); });
    ASSERT_NE(it, changed.end()) << b.at("data-group");
    EXPECT_EQ(std::stoll(b.at("data-v")), it->first) << b.at("data-group");
    EXPECT_LE(std::llabs(it->first), prev);
    prev = std::llabs(it->first);
    // Fewer bytes in B: drawn left of zero, as a "neg" bar.
    EXPECT_EQ(has(b.at("class"), "neg"), it->first < 0) << b.at("data-group");
  }
  // No changed tensor left out has a larger |Δ| than the smallest shown.
  std::size_t larger = 0;
  for (const auto& c : changed) larger += std::llabs(c.first) > prev;
  EXPECT_LE(larger, 24u);
  // The per-layer bars of A and B: the JSON's per_layer bytes.
  const auto pl = chart_marks(page, "per-layer-chart", "rect", "bar");
  ASSERT_EQ(pl.size(), 2u);
  EXPECT_EQ(u64(pl[0].at("data-v")), j["per_layer"]["a_bytes"].get<std::uint64_t>());
  EXPECT_EQ(u64(pl[1].at("data-v")), j["per_layer"]["b_bytes"].get<std::uint64_t>());
  // Two sides that do not differ: no difference chart.
  EXPECT_FALSE(has(trainmem("diff native native --model tiny --batch 1 --seq 16 --format html").out,
                   "diff-chart"));
}

TEST(CliE2EHtml, OutputFileHoldsWhatStdoutWouldAndBadOutputExits2) {
  const std::string args = cases()[2].args;
  const std::string path = temp_path("report.html");
  const Result a = trainmem(args + "--format html --output " + path);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_TRUE(a.out.empty());
  EXPECT_EQ(slurp(path), trainmem(args + "--format html").out);
  const Result bad = trainmem(args + "--format html --output /nonexistent-dir/r.html");
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(has(bad.err, "--output")) << bad.err;
  EXPECT_TRUE(bad.out.empty());
}

}  // namespace
}  // namespace trainmem::e2e
