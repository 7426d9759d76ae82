// Writing a report once for every output format: a command describes its report as a
// sequence of blocks on a ReportWriter, and the writer of the chosen format (make_writer)
// renders the blocks its format shows and ignores the others:
//   - prose and tables (title, headings, lines, items, tables, ...): the text form (TextWriter:
//     headings bold, toned cells and lines coloured when colour is on, nothing invisible
//     otherwise) and Markdown (MarkdownWriter: GitHub Markdown);
//   - the table of exact figures (csv_table): the CSV form (CsvWriter), RFC 4180;
//   - the "trainmem/1" document (document): the JSON form (JsonWriter), dumped with an indent
//     of two and a final newline;
//   - the prose, the tables and the figures (figure: markup only a page can show, e.g. the
//     profile's timeline, the charts of svg_chart.hpp): one self-contained HTML page
//     (HtmlWriter), inline CSS, no network, readable with JavaScript off; every text escaped,
//     a cell's tone its class.
// So a command never branches on the format: it says every block once, and the writer picks.
// Colour comes from the state of a cell or line (its Tone), never from its text.
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainmem/report/report.hpp"

namespace trainmem::report {

// The output formats of every report (--format table|markdown|csv|json|html).
enum class Format { table, json, csv, markdown, html };

// Every block is a no-op here: each writer overrides the blocks its format shows.
class ReportWriter {
 public:
  virtual ~ReportWriter() = default;

  // ---- prose and tables (text, Markdown)
  // The report's first line. Text: the line, bold; Markdown: "### title".
  virtual void title(const std::string&) {}
  // A section heading after a blank line. Text: the line, bold; Markdown: "#### heading" and a
  // blank line.
  void heading(const std::string& text) { heading(text, text); }
  // A heading with a full form, for the terminal (where it doubles as the legend of the table
  // under it), and a brief one, for Markdown.
  virtual void heading(const std::string& /*full*/, const std::string& /*brief*/) {}
  // A line standing out. Text: after a blank line, bold; Markdown: "**text**" and a blank line.
  virtual void strong(const std::string&) {}
  // The line saying what the figures are (PREDICTED on meta, measured elsewhere): a paragraph
  // in text and Markdown; the HTML page shows it as a banner at the top.
  virtual void banner(const std::string& text, Tone tone = Tone::neutral) { paragraph(text, tone); }
  // A paragraph: the text's line(s), then (Markdown only) a blank line.
  void paragraph(const std::string& text, Tone tone = Tone::neutral) {
    line(text, tone);
    paragraph_break();
  }
  // A list item. Text: the line; Markdown: "- text".
  virtual void item(const std::string&) {}
  // A list closed as a block (e.g. the sources a table could not show, under it). Text: each
  // item indented by two spaces; Markdown: "- item" lines, then a blank line. Nothing when
  // empty.
  virtual void list(const std::vector<std::string>&) {}
  // One line (or several, when `text` holds newlines) as it is; coloured by `tone` in the
  // text form with colour on.
  virtual void line(const std::string&, Tone = Tone::neutral) {}
  // A line of terminal detail (steps run, losses, overhead, a footnote) that the Markdown
  // form, a summary, leaves out. Text: as line().
  virtual void detail(const std::string&, Tone = Tone::neutral) {}
  // An alert: lines saying what failed, the first one the failure. Text: each line, the first
  // in the fail tone; Markdown: the lines as one bold paragraph. Nothing when empty.
  virtual void alert(const std::vector<std::string>&) {}
  virtual void table(const Table&) {}
  // A passage already written in each human form, appended as it is: for a part whose text
  // and Markdown forms say different things, not only differently (estimate --explain: the
  // terminal's worked formulas and instants; Markdown's coefficient and tensor tables).
  virtual void passage(const std::string& /*text*/, const std::string& /*markdown*/) {}
  // A blank line unless the report already ends with one (or is empty).
  virtual void blank() {}
  // Markdown only: a blank line (the end of a paragraph or a table); nothing in text.
  virtual void paragraph_break() {}

  // ---- exact figures (CSV)
  // The report's table of exact figures (bytes as integers): the whole CSV form.
  virtual void csv_table(const Table&) {}

  // ---- figures (HTML)
  // Markup only a page shows (an inline SVG, a script-driven list), already escaped by its
  // builder; built only by the HTML writer.
  virtual void figure(const std::function<std::string()>& /*html*/) {}

  // ---- the document (JSON)
  // The report's "trainmem/1" document: the whole JSON form. Built only by the JSON writer.
  virtual void document(const std::function<nlohmann::json()>&) {}

  // The report as written so far (the HTML writer closes its page here).
  virtual const std::string& str() const { return out_; }

 protected:
  // The blank line of blank(), for the writers that show prose.
  void blank_line();
  std::string out_;
};

class TextWriter : public ReportWriter {
 public:
  explicit TextWriter(Colour colour) : colour_(colour) {}
  using ReportWriter::heading;
  void title(const std::string& text) override;
  void heading(const std::string& full, const std::string& brief) override;
  void strong(const std::string& text) override;
  void item(const std::string& text) override;
  void list(const std::vector<std::string>& items) override;
  void line(const std::string& text, Tone tone = Tone::neutral) override;
  void detail(const std::string& text, Tone tone = Tone::neutral) override { line(text, tone); }
  void alert(const std::vector<std::string>& lines) override;
  void table(const Table& t) override;
  void passage(const std::string& text, const std::string&) override { out_ += text; }
  void blank() override { blank_line(); }

 private:
  Colour colour_;
};

class MarkdownWriter : public ReportWriter {
 public:
  using ReportWriter::heading;
  void title(const std::string& text) override;
  void heading(const std::string& full, const std::string& brief) override;
  void strong(const std::string& text) override;
  void item(const std::string& text) override;
  void list(const std::vector<std::string>& items) override;
  void line(const std::string& text, Tone tone = Tone::neutral) override;
  void alert(const std::vector<std::string>& lines) override;
  void table(const Table& t) override;
  void passage(const std::string&, const std::string& markdown) override { out_ += markdown; }
  void blank() override { blank_line(); }
  void paragraph_break() override { blank_line(); }
};

class CsvWriter : public ReportWriter {
 public:
  void csv_table(const Table& t) override;
};

class JsonWriter : public ReportWriter {
 public:
  void document(const std::function<nlohmann::json()>& build) override;
};

// One self-contained HTML page: the title in <title> and <h1>, the banner prominent, headings
// <h2>, lines and passages as preformatted blocks, tables as <table> whose cells carry their
// tone as a class ("ok", "fail"), figures as given. Inline CSS only; no script of its own.
class HtmlWriter : public ReportWriter {
 public:
  using ReportWriter::heading;
  void title(const std::string& text) override;
  void banner(const std::string& text, Tone tone = Tone::neutral) override;
  void heading(const std::string& full, const std::string& brief) override;
  void strong(const std::string& text) override;
  void item(const std::string& text) override;
  void list(const std::vector<std::string>& items) override;
  void line(const std::string& text, Tone tone = Tone::neutral) override;
  void detail(const std::string& text, Tone tone = Tone::neutral) override;
  void alert(const std::vector<std::string>& lines) override;
  void table(const Table& t) override;
  void passage(const std::string& text, const std::string&) override;
  void figure(const std::function<std::string()>& html) override;
  const std::string& str() const override;

 private:
  void close_items();
  std::string title_;  // the first title(), else the first strong()
  bool titled_ = false;
  bool in_items_ = false;
  mutable std::string page_;
};

// Text escaped for HTML element content and attribute values: & < > " '.
std::string html_escape(const std::string& s);
// The class of a tone: "ok", "fail", or "" (neutral).
const char* tone_class(Tone tone);

// The writer of `format`; `colour` matters to the text form only.
std::unique_ptr<ReportWriter> make_writer(Format format, Colour colour);

}  // namespace trainmem::report
