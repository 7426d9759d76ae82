// Writing a report once for every human-readable format: a command describes its report as a
// sequence of blocks (a title, headings, paragraphs, list items, lines, tables) on a
// ReportWriter, and the writer of the chosen format renders them. TextWriter writes the
// terminal form (headings bold and toned cells and lines coloured when colour is on, nothing
// invisible otherwise); MarkdownWriter writes GitHub Markdown. CSV is one table of exact
// figures (Table::csv) and JSON the schema's documents (report.hpp), both written directly.
#pragma once
#include <memory>
#include <string>

#include "trainmem/report.hpp"

namespace trainmem::report {

class ReportWriter {
 public:
  virtual ~ReportWriter() = default;

  // The report's first line. Text: the line, bold; Markdown: "### title".
  virtual void title(const std::string& text) = 0;
  // A section heading after a blank line. Text: the line, bold; Markdown: "#### heading" and a
  // blank line.
  virtual void heading(const std::string& text) = 0;
  // A line standing out. Text: after a blank line, bold; Markdown: "**text**" and a blank line.
  virtual void strong(const std::string& text) = 0;
  // A paragraph: the text's line(s), then (Markdown only) a blank line.
  void paragraph(const std::string& text, Tone tone = Tone::neutral) {
    line(text, tone);
    paragraph_break();
  }
  // A list item. Text: the line; Markdown: "- text".
  virtual void item(const std::string& text) = 0;
  // One line (or several, when `text` holds newlines) as it is; coloured by `tone` in the
  // text form with colour on.
  virtual void line(const std::string& text, Tone tone = Tone::neutral) = 0;
  virtual void table(const Table& t) = 0;
  // A blank line unless the report already ends with one (or is empty).
  void blank();
  // Markdown only: a blank line (the end of a paragraph or a table); nothing in text.
  virtual void paragraph_break() = 0;

  const std::string& str() const { return out_; }

 protected:
  std::string out_;
};

class TextWriter : public ReportWriter {
 public:
  explicit TextWriter(Colour colour) : colour_(colour) {}
  void title(const std::string& text) override;
  void heading(const std::string& text) override;
  void strong(const std::string& text) override;
  void item(const std::string& text) override;
  void line(const std::string& text, Tone tone = Tone::neutral) override;
  void table(const Table& t) override;
  void paragraph_break() override {}

 private:
  Colour colour_;
};

class MarkdownWriter : public ReportWriter {
 public:
  void title(const std::string& text) override;
  void heading(const std::string& text) override;
  void strong(const std::string& text) override;
  void item(const std::string& text) override;
  void line(const std::string& text, Tone tone = Tone::neutral) override;
  void table(const Table& t) override;
  void paragraph_break() override { blank(); }
};

}  // namespace trainmem::report
