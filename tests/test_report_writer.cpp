// The report writers: one description, each format's writer rendering the blocks it shows.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "trainmem/report/report_writer.hpp"

namespace trainmem::report {
namespace {

// One report using every block.
void describe(ReportWriter& w, int* built) {
  w.document([built] {
    ++*built;
    return nlohmann::json{{"schema", kSchema}, {"n", 1}};
  });
  Table exact({{"name", Align::left}, {"bytes"}});
  exact.add_row({"a", "1024"});
  w.csv_table(exact);
  w.title("Title");
  w.paragraph_break();
  w.paragraph("para");
  w.detail("detail");
  w.alert({"FAILED", "  why"});
  w.heading("Full heading", "Brief");
  Table t({{"row", Align::left}, {"ok", Align::left}});
  t.add_row({"r", check_cell(false)});
  w.table(t);
  w.paragraph_break();
  w.list({"one", "two"});
  w.item("item");
  w.strong("strong");
  w.passage("text passage\n", "markdown passage\n");
  w.blank();
  w.line("end", Tone::ok);
}

std::string render(Format f, Colour colour, int* built) {
  const auto w = make_writer(f, colour);
  describe(*w, built);
  return w->str();
}

TEST(ReportWriter, EachFormatRendersItsBlocks) {
  int built = 0;
  EXPECT_EQ(render(Format::table, Colour::off, &built),
            "Title\npara\ndetail\nFAILED\n  why\n\nFull heading\nrow  ok\n-------\nr    NO\n"
            "  one\n  two\nitem\n\nstrong\ntext passage\n\nend\n");
  EXPECT_EQ(render(Format::markdown, Colour::off, &built),
            "### Title\n\npara\n\n**FAILED\n  why\n**\n\n#### Brief\n\n| row | ok |\n"
            "| :--- | :--- |\n| r | NO |\n\n- one\n- two\n\n- item\n\n**strong**\n\n"
            "markdown passage\n\nend\n");
  EXPECT_EQ(render(Format::csv, Colour::on, &built), "name,bytes\na,1024\n");
  EXPECT_EQ(built, 0);  // the document is built for the JSON form only
  EXPECT_EQ(render(Format::json, Colour::on, &built),
            "{\n  \"n\": 1,\n  \"schema\": \"trainmem/1\"\n}\n");
  EXPECT_EQ(built, 1);
}

TEST(ReportWriter, ColourComesFromTheTone) {
  int built = 0;
  const std::string on = render(Format::table, Colour::on, &built);
  EXPECT_NE(on.find("\033[1;31mFAILED\033[0m\n  why\n"), std::string::npos) << on;
  EXPECT_NE(on.find("\033[1;31mNO\033[0m"), std::string::npos) << on;
  EXPECT_NE(on.find("\033[32mend\033[0m"), std::string::npos) << on;
  EXPECT_NE(on.find("\033[1mFull heading\033[0m"), std::string::npos) << on;
  // Markdown shows no tone.
  EXPECT_EQ(render(Format::markdown, Colour::on, &built).find('\033'), std::string::npos);
}

TEST(ReportWriter, EmptyAlertAndListWriteNothing) {
  for (Format f : {Format::table, Format::markdown}) {
    const auto w = make_writer(f, Colour::off);
    w->alert({});
    w->list({});
    EXPECT_EQ(w->str(), "");
  }
}

}  // namespace
}  // namespace trainmem::report
