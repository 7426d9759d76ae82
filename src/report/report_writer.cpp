// The text and Markdown writers of a report (see include/trainmem/report_writer.hpp).
#include "trainmem/report_writer.hpp"

namespace trainmem::report {

void ReportWriter::blank() {
  const std::size_t n = out_.size();
  if (n == 0 || (n >= 2 && out_[n - 1] == '\n' && out_[n - 2] == '\n')) return;
  out_ += "\n";
}

// ---------------------------------------------------------------- text

void TextWriter::title(const std::string& text) {
  out_ += (colour_ == Colour::on ? bold(text) : text) + "\n";
}

void TextWriter::heading(const std::string& text) {
  blank();
  out_ += (colour_ == Colour::on ? bold(text) : text) + "\n";
}

void TextWriter::strong(const std::string& text) {
  heading(text);
}

void TextWriter::item(const std::string& text) {
  out_ += text + "\n";
}

void TextWriter::line(const std::string& text, Tone tone) {
  out_ += (colour_ == Colour::on ? toned(text, tone) : text) + "\n";
}

void TextWriter::table(const Table& t) {
  out_ += t.text(colour_);
}

// ---------------------------------------------------------------- Markdown

void MarkdownWriter::title(const std::string& text) {
  out_ += "### " + text + "\n";
}

void MarkdownWriter::heading(const std::string& text) {
  blank();
  out_ += "#### " + text + "\n\n";
}

void MarkdownWriter::strong(const std::string& text) {
  blank();
  out_ += "**" + text + "**\n\n";
}

void MarkdownWriter::item(const std::string& text) {
  out_ += "- " + text + "\n";
}

void MarkdownWriter::line(const std::string& text, Tone) {
  out_ += text + "\n";
}

void MarkdownWriter::table(const Table& t) {
  out_ += t.markdown();
}

}  // namespace trainmem::report
