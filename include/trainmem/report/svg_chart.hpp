// Charts for the HTML report (issue 17): the project's own inline SVG, no chart library
// (docs/decisions.md, "The HTML report"). Each builder returns markup for
// ReportWriter::figure, so a command describes its chart once and only the page draws it.
// Every mark carries its exact figure twice: as a data attribute (data-v, data-x, ...: the
// same number the JSON report holds, for tests and scripts) and in a native <title> tooltip
// (shown on hover with JavaScript off). Every text is escaped; the colours of the series
// (classes s0, s1, ...) are in the page's style (HtmlWriter).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trainmem/analytic/analytic.hpp"

namespace trainmem::report {

// How an axis labels its ticks: bytes in a unit that suits the range ("1.5 MiB"), or plain
// numbers ("2,048").
enum class Axis { bytes, number };

// One bar: its value, the exact figure written as data-v (e.g. "12582912", or a double's
// round-trip digits), the short label drawn at its end, and the tooltip.
struct Bar {
  double value = 0;
  std::string exact;
  std::string label;
  std::string tip;
};

// One row of bars: a label on the left and one bar per series (in the chart's series order;
// fewer bars than series leaves the last ones out).
struct BarGroup {
  std::string label;
  std::vector<Bar> bars;
};

// Horizontal bars, grouped: the series of a group side by side (one under the other), each
// series its colour (class s0, s1, ...). Negative values extend left of the zero line, so a
// chart of differences diverges around it.
struct BarChart {
  std::string id;          // the <svg>'s id
  std::string title;       // the <svg>'s <title> and aria-label
  std::string axis_label;  // under the axis ("bytes per layer")
  Axis axis = Axis::bytes;
  std::vector<std::string> series;  // the legend (none drawn for one series)
  std::vector<BarGroup> groups;
  double min_extent = 0;  // the smallest range the axis shows (e.g. 1 byte for residuals)
  // A chart of differences: a bar above zero in the fail colour (more bytes), below zero in
  // the ok colour (fewer), whatever its series.
  bool diverging = false;
};
std::string bar_chart_svg(const BarChart& c);

// A measured point of a scatter chart: x, y, its series, its exact figures as data
// attributes (name without "data-", value), and the tooltip.
struct ScatterPoint {
  double x = 0, y = 0;
  std::size_t series = 0;
  std::vector<std::pair<std::string, std::string>> data;
  std::string tip;
};

// A fitted line from (x0, y0) to (x1, y1), its series' colour, data attributes and tooltip.
struct ScatterLine {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  std::size_t series = 0;
  std::vector<std::pair<std::string, std::string>> data;
  std::string tip;
  std::string label;  // drawn at its end ("s=128"); none when empty
};

struct ScatterChart {
  std::string id, title;
  std::string x_label, y_label;
  Axis x_axis = Axis::number, y_axis = Axis::bytes;
  std::vector<std::string> series;
  std::vector<ScatterPoint> points;
  std::vector<ScatterLine> lines;
};
std::string scatter_chart_svg(const ScatterChart& c);

// A double written so that it reads back as the same double ("%.17g"); integers exactly.
std::string exact_number(double v);

// A profile's per-layer activation bar: bytes per layer, labelled in a unit, the tooltip
// giving the exact bytes, the formula and its s·b·h equivalent (as the text report prints).
Bar per_layer_bar(const Estimate& e, const std::string& series);
// A measured per-layer figure (the ledger's per-layer activation bytes).
Bar measured_per_layer_bar(std::uint64_t bytes, const std::string& what);

}  // namespace trainmem::report
