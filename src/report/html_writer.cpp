// The HTML form of every report: one self-contained page (see
// include/trainmem/report/report_writer.hpp). Inline CSS, no network, no script of its own (a
// figure may bring a small one); every text escaped; a cell's or a line's tone is its class, so the
// page reads the same with JavaScript off.
#include "trainmem/report/report_writer.hpp"

namespace trainmem::report {

namespace {

constexpr const char* kStyle = R"(
:root { --ok: #1a7f37; --fail: #cf222e; --rule: #d0d7de; --muted: #57606a; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328;
       margin: 1.5em auto; max-width: 1200px; padding: 0 1em; }
h1 { font-size: 1.35em; margin: 0 0 .6em; }
h2 { font-size: 1.1em; margin: 1.6em 0 .5em; border-bottom: 1px solid var(--rule); }
.banner { font-size: 1.1em; font-weight: 600; padding: .6em .9em; border-radius: 6px;
          background: #fff8c5; border: 1px solid #d4a72c; white-space: pre-wrap; }
.line, .detail, .passage { white-space: pre-wrap; font-family: ui-monospace, SFMono-Regular,
          Menlo, Consolas, monospace; font-size: 12.5px; margin: .25em 0; }
.detail { color: var(--muted); }
.passage { background: #f6f8fa; padding: .6em; border-radius: 6px; overflow-x: auto; }
.alert { border: 1px solid var(--fail); background: #ffebe9; padding: .5em .9em;
         border-radius: 6px; white-space: pre-wrap; }
p.strong { font-weight: 700; margin: 1em 0 .4em; }
table { border-collapse: collapse; margin: .4em 0 .8em; font-variant-numeric: tabular-nums; }
th, td { padding: .22em .7em; border-bottom: 1px solid var(--rule); }
th { background: #f6f8fa; text-align: left; }
th.right, td.right { text-align: right; }
tbody + tbody { border-top: 2px solid #8c959f; }
.ok { color: var(--ok); font-weight: 600; }
.fail { color: var(--fail); font-weight: 700; }
ul { margin: .3em 0; }
figure { margin: .6em 0 1em; }
figure svg { max-width: 100%; height: auto; }
.side-by-side { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
svg.chart { font: 11px system-ui, -apple-system, "Segoe UI", sans-serif; display: block; }
svg.chart .grid { stroke: #eaeef2; }
svg.chart .zero { stroke: #57606a; }
svg.chart .tick, svg.chart .value { fill: var(--muted); }
svg.chart .s0 { fill: #0969da; stroke: #0969da; } svg.chart .s1 { fill: #bf8700; stroke: #bf8700; }
svg.chart .s2 { fill: #8250df; stroke: #8250df; } svg.chart .s3 { fill: #1a7f37; stroke: #1a7f37; }
svg.chart .s4 { fill: #cf222e; stroke: #cf222e; } svg.chart .s5 { fill: #57606a; stroke: #57606a; }
svg.chart rect.bar { stroke: none; }
svg.chart.diverging rect.bar { fill: var(--fail); } svg.chart.diverging rect.bar.neg { fill: var(--ok); }
svg.chart rect.bar:hover, svg.chart circle.point:hover { fill-opacity: .65; }
svg.chart circle.point { stroke: #fff; stroke-width: 1; }
svg.chart line.fit { stroke-width: 1.6; stroke-dasharray: 5 3; }
figcaption { color: var(--muted); font-size: .92em; }
)";

}  // namespace

std::string html_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      case '\'':
        o += "&#39;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

const char* tone_class(Tone tone) {
  switch (tone) {
    case Tone::ok:
      return "ok";
    case Tone::fail:
      return "fail";
    case Tone::neutral:
      break;
  }
  return "";
}

namespace {
std::string classes(const std::string& base, Tone tone) {
  const std::string t = tone_class(tone);
  return t.empty() ? base : base + " " + t;
}
}  // namespace

void HtmlWriter::close_items() {
  if (!in_items_) return;
  out_ += "</ul>\n";
  in_items_ = false;
}

void HtmlWriter::title(const std::string& text) {
  close_items();
  if (!titled_) title_ = text;
  titled_ = true;
  out_ += "<h1>" + html_escape(text) + "</h1>\n";
}

void HtmlWriter::banner(const std::string& text, Tone tone) {
  close_items();
  out_ += "<p class=\"" + classes("banner", tone) + "\" id=\"provenance\">" + html_escape(text) +
          "</p>\n";
}

void HtmlWriter::heading(const std::string& full, const std::string& brief) {
  close_items();
  out_ += "<h2";
  if (full != brief) out_ += " title=\"" + html_escape(full) + "\"";
  out_ += ">" + html_escape(brief) + "</h2>\n";
  if (full != brief) out_ += "<p class=\"detail\">" + html_escape(full) + "</p>\n";
}

void HtmlWriter::strong(const std::string& text) {
  close_items();
  if (title_.empty()) title_ = text;  // the page's name until a title() says otherwise
  out_ += "<p class=\"strong\">" + html_escape(text) + "</p>\n";
}

void HtmlWriter::item(const std::string& text) {
  if (!in_items_) out_ += "<ul class=\"items\">\n";
  in_items_ = true;
  out_ += "<li>" + html_escape(text) + "</li>\n";
}

void HtmlWriter::list(const std::vector<std::string>& items) {
  close_items();
  if (items.empty()) return;
  out_ += "<ul class=\"list\">\n";
  for (const auto& s : items) out_ += "<li>" + html_escape(s) + "</li>\n";
  out_ += "</ul>\n";
}

void HtmlWriter::line(const std::string& text, Tone tone) {
  close_items();
  out_ += "<div class=\"" + classes("line", tone) + "\">" + html_escape(text) + "</div>\n";
}

void HtmlWriter::detail(const std::string& text, Tone tone) {
  close_items();
  out_ += "<div class=\"" + classes("detail", tone) + "\">" + html_escape(text) + "</div>\n";
}

void HtmlWriter::alert(const std::vector<std::string>& lines) {
  close_items();
  if (lines.empty()) return;
  out_ += "<div class=\"alert\" role=\"alert\">";
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (i) out_ += "\n";
    out_ += i == 0 ? "<strong class=\"fail\">" + html_escape(lines[i]) + "</strong>"
                   : html_escape(lines[i]);
  }
  out_ += "</div>\n";
}

void HtmlWriter::table(const Table& t) {
  close_items();
  const auto& cols = t.columns();
  auto align = [&](std::size_t c) { return cols[c].align == Align::left ? "left" : "right"; };
  out_ += "<table>\n<thead><tr>";
  for (std::size_t c = 0; c < cols.size(); ++c)
    out_ += std::string("<th class=\"") + align(c) + "\">" + html_escape(cols[c].header) + "</th>";
  out_ += "</tr></thead>\n<tbody>\n";
  bool open_body = true;
  for (const auto& row : t.rows()) {
    if (row.empty()) {  // a rule: the next group of rows
      if (open_body) out_ += "</tbody>\n";
      open_body = false;
      continue;
    }
    if (!open_body) out_ += "<tbody>\n";
    open_body = true;
    out_ += "<tr>";
    for (std::size_t c = 0; c < row.size(); ++c)
      out_ += "<td class=\"" + classes(align(c), row[c].tone) + "\">" + html_escape(row[c].text) +
              "</td>";
    out_ += "</tr>\n";
  }
  if (open_body) out_ += "</tbody>\n";
  out_ += "</table>\n";
}

void HtmlWriter::passage(const std::string& text, const std::string&) {
  close_items();
  out_ += "<pre class=\"passage\">" + html_escape(text) + "</pre>\n";
}

void HtmlWriter::figure(const std::function<std::string()>& html) {
  close_items();
  out_ += "<figure>\n" + html() + "\n</figure>\n";
}

const std::string& HtmlWriter::str() const {
  page_ = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  page_ += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  page_ += "<meta name=\"generator\" content=\"trainmem\">\n";
  page_ += "<title>" + html_escape(title_.empty() ? "trainmem report" : title_) + "</title>\n";
  page_ += std::string("<style>") + kStyle + "</style>\n</head>\n<body>\n<main>\n";
  page_ += out_;
  if (in_items_) page_ += "</ul>\n";
  page_ += "</main>\n</body>\n</html>\n";
  return page_;
}

}  // namespace trainmem::report
