// The writers of a report, one per output format (see include/trainmem/report/report_writer.hpp).
#include "trainmem/report/report_writer.hpp"

namespace trainmem::report {

void ReportWriter::blank_line() {
  const std::size_t n = out_.size();
  if (n == 0 || (n >= 2 && out_[n - 1] == '\n' && out_[n - 2] == '\n')) return;
  out_ += "\n";
}

// ---------------------------------------------------------------- text

void TextWriter::title(const std::string& text) {
  out_ += (colour_ == Colour::on ? bold(text) : text) + "\n";
}

void TextWriter::heading(const std::string& full, const std::string&) {
  blank_line();
  out_ += (colour_ == Colour::on ? bold(full) : full) + "\n";
}

void TextWriter::strong(const std::string& text) {
  heading(text);
}

void TextWriter::item(const std::string& text) {
  out_ += text + "\n";
}

void TextWriter::list(const std::vector<std::string>& items) {
  for (const auto& s : items) out_ += "  " + s + "\n";
}

void TextWriter::line(const std::string& text, Tone tone) {
  out_ += (colour_ == Colour::on ? toned(text, tone) : text) + "\n";
}

void TextWriter::alert(const std::vector<std::string>& lines) {
  for (std::size_t i = 0; i < lines.size(); ++i)
    line(lines[i], i == 0 ? Tone::fail : Tone::neutral);
}

void TextWriter::table(const Table& t) {
  out_ += t.text(colour_);
}

// ---------------------------------------------------------------- Markdown

void MarkdownWriter::title(const std::string& text) {
  out_ += "### " + text + "\n";
}

void MarkdownWriter::heading(const std::string&, const std::string& brief) {
  blank_line();
  out_ += "#### " + brief + "\n\n";
}

void MarkdownWriter::strong(const std::string& text) {
  blank_line();
  out_ += "**" + text + "**\n\n";
}

void MarkdownWriter::item(const std::string& text) {
  out_ += "- " + text + "\n";
}

void MarkdownWriter::list(const std::vector<std::string>& items) {
  for (const auto& s : items) item(s);
  if (!items.empty()) blank_line();
}

void MarkdownWriter::line(const std::string& text, Tone) {
  out_ += text + "\n";
}

void MarkdownWriter::alert(const std::vector<std::string>& lines) {
  if (lines.empty()) return;
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  strong(text);
}

void MarkdownWriter::table(const Table& t) {
  out_ += t.markdown();
}

// ---------------------------------------------------------------- CSV and JSON

void CsvWriter::csv_table(const Table& t) {
  out_ += t.csv();
}

void JsonWriter::document(const std::function<nlohmann::json()>& build) {
  out_ += build().dump(2) + "\n";
}

std::unique_ptr<ReportWriter> make_writer(Format format, Colour colour) {
  switch (format) {
    case Format::markdown:
      return std::make_unique<MarkdownWriter>();
    case Format::csv:
      return std::make_unique<CsvWriter>();
    case Format::json:
      return std::make_unique<JsonWriter>();
    case Format::html:
      return std::make_unique<HtmlWriter>();
    case Format::table:
      break;
  }
  return std::make_unique<TextWriter>(colour);
}

}  // namespace trainmem::report
