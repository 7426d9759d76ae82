// End to end: --format html of every command is one well-formed, self-contained page whose
// tables are the Markdown report's cell for cell, and whose key figures are the JSON report's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "test_cli_e2e_helpers.hpp"

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
  EXPECT_EQ(count(h.out, "<svg "), 1u);
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
  EXPECT_EQ(count(cpage, "<svg "), cj["runs"].size());
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
