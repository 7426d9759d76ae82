// The HTML report's charts: horizontal bars and a scatter with fitted lines, as inline SVG
// (see include/trainmem/report/svg_chart.hpp).
#include "trainmem/report/svg_chart.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "trainmem/base/bytes.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/report_writer.hpp"

namespace trainmem::report {

namespace {

// A coordinate with one decimal (enough for a screen, short in the page).
std::string px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// Ticks at 1, 2 or 5 × 10^k covering [lo, hi], about `want` of them.
std::vector<double> ticks(double lo, double hi, int want) {
  const double span = hi - lo;
  const double raw = span / want;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
    out.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  return out;
}

// The range an axis shows: [lo, hi] of the values and zero, widened to the next ticks.
std::pair<double, double> range(double lo, double hi, double min_extent) {
  lo = std::min(lo, 0.0);
  hi = std::max(hi, 0.0);
  if (hi - lo < min_extent || hi - lo <= 0) {
    const double e = std::max(min_extent, hi - lo > 0 ? hi - lo : 1.0);
    if (lo < 0 && hi <= 0)
      lo = -e;
    else if (lo < 0)
      lo = std::min(lo, -e / 2), hi = std::max(hi, e / 2);
    else
      hi = e;
  }
  const auto t = ticks(lo, hi, 5);
  const double step = t.size() > 1 ? t[1] - t[0] : hi - lo;
  if (lo < t.front() - step * 1e-9) lo = t.front() - step;
  if (hi > t.back() + step * 1e-9) hi = t.back() + step;
  return {lo, hi};
}

// An axis's unit: for bytes, the largest of B, KiB, ... TiB that keeps `extent` at 1 or more
// (ticks fall on round numbers of it); plain numbers as they are.
struct Scale {
  double div = 1;
  const char* unit = "";
};
Scale scale_of(Axis axis, double extent) {
  if (axis == Axis::number) return {};
  static const char* const names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  Scale s{1, names[0]};
  for (int k = 1; k < 5 && extent >= s.div * 1024; ++k) s = {s.div * 1024, names[k]};
  return s;
}

// A tick's label, `v` in the axis's unit: "1.5 MiB", "2,048".
std::string tick_label(double v, const Scale& s) {
  char buf[48];
  if (std::fabs(v - std::round(v)) < 1e-9 * std::max(1.0, std::fabs(v))) {
    const long long n = std::llround(v);
    std::string o = (n < 0 ? "-" : "") + with_commas(static_cast<std::uint64_t>(n < 0 ? -n : n));
    return *s.unit ? o + " " + s.unit : o;
  }
  std::snprintf(buf, sizeof buf, "%.3g%s%s", v, *s.unit ? " " : "", s.unit);
  return buf;
}

std::string data_attrs(const std::vector<std::pair<std::string, std::string>>& data) {
  std::string o;
  for (const auto& [k, v] : data) o += " data-" + k + "=\"" + html_escape(v) + "\"";
  return o;
}

// The legend: a swatch and a name per series, in a row at (x, y).
std::string legend(const std::vector<std::string>& series, double x, double y) {
  std::string o = "<g class=\"legend\">";
  for (std::size_t s = 0; s < series.size(); ++s) {
    o += "<rect class=\"s" + std::to_string(s % 6) + "\" x=\"" + px(x) + "\" y=\"" + px(y - 9) +
         "\" width=\"10\" height=\"10\"/><text x=\"" + px(x + 14) + "\" y=\"" + px(y) + "\">" +
         html_escape(series[s]) + "</text>";
    x += 28 + 6.6 * static_cast<double>(series[s].size());
  }
  return o + "</g>\n";
}

}  // namespace

std::string exact_number(double v) {
  if (std::fabs(v) < 9e15 && v == std::floor(v)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string bar_chart_svg(const BarChart& c) {
  constexpr double kWidth = 760, kBar = 14, kBarGap = 2, kGroupGap = 10, kRight = 90;
  std::size_t longest = 0;
  double lo = 0, hi = 0;
  for (const auto& g : c.groups) {
    longest = std::max(longest, g.label.size());
    for (const auto& b : g.bars) {
      lo = std::min(lo, b.value);
      hi = std::max(hi, b.value);
    }
  }
  const double left = std::clamp(12 + 6.6 * static_cast<double>(longest), 80.0, 300.0);
  const double top = c.series.size() > 1 ? 28 : 8;
  double plot_h = 0;
  for (const auto& g : c.groups)
    plot_h += static_cast<double>(g.bars.size()) * (kBar + kBarGap) - kBarGap + kGroupGap;
  const double height = top + plot_h + 40;
  // Labels at the ends of negative bars need room on the left of the zero line too.
  const double plot_l = left + (lo < 0 ? 70 : 0), plot_r = kWidth - kRight;
  const Scale sc = scale_of(c.axis, std::max({-lo, hi, c.min_extent}));
  const auto [x_lo, x_hi] = range(lo / sc.div, hi / sc.div, c.min_extent / sc.div);
  auto X = [&, x_lo = x_lo, x_hi = x_hi](double v) {  // v in bytes (or the number)
    return plot_l + (v / sc.div - x_lo) / (x_hi - x_lo) * (plot_r - plot_l);
  };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart bars"
    << (c.diverging ? " diverging" : "") << "\" id=\"" << html_escape(c.id) << "\" viewBox=\"0 0 "
    << kWidth << " " << px(height) << "\" width=\"" << kWidth << "\" height=\"" << px(height)
    << "\" role=\"img\" aria-label=\"" << html_escape(c.title) << "\">\n<title>"
    << html_escape(c.title) << "</title>\n";
  if (c.series.size() > 1) o << legend(c.series, left, 16);
  // Grid and ticks.
  const double axis_y = top + plot_h;
  o << "<g class=\"axis\">";
  for (double t : ticks(x_lo, x_hi, 5)) {
    const std::string x = px(X(t * sc.div));
    o << "<line class=\"grid\" x1=\"" << x << "\" x2=\"" << x << "\" y1=\"" << px(top) << "\" y2=\""
      << px(axis_y) << "\"/>";
    o << "<text class=\"tick\" x=\"" << x << "\" y=\"" << px(axis_y + 14)
      << "\" text-anchor=\"middle\">" << html_escape(tick_label(t, sc)) << "</text>";
  }
  o << "<line class=\"zero\" x1=\"" << px(X(0)) << "\" x2=\"" << px(X(0)) << "\" y1=\""
    << px(top - 4) << "\" y2=\"" << px(axis_y) << "\"/>";
  o << "<text class=\"axis-label\" x=\"" << px((plot_l + plot_r) / 2) << "\" y=\""
    << px(axis_y + 32) << "\" text-anchor=\"middle\">" << html_escape(c.axis_label)
    << "</text></g>\n";

  double y = top;
  for (std::size_t gi = 0; gi < c.groups.size(); ++gi) {
    const BarGroup& g = c.groups[gi];
    const double gh = static_cast<double>(g.bars.size()) * (kBar + kBarGap) - kBarGap;
    o << "<g class=\"group\" data-label=\"" << html_escape(g.label) << "\">";
    o << "<text class=\"group-label\" x=\"" << px(left - 8) << "\" y=\"" << px(y + gh / 2 + 4)
      << "\" text-anchor=\"end\">" << html_escape(g.label) << "</text>\n";
    for (std::size_t s = 0; s < g.bars.size(); ++s) {
      const Bar& b = g.bars[s];
      const double x0 = X(std::min(0.0, b.value)), x1 = X(std::max(0.0, b.value));
      const double w = std::max(x1 - x0, 0.75);  // a zero still shows, as a hairline
      const std::string series = s < c.series.size() ? c.series[s] : "";
      o << "<rect class=\"bar s" << s % 6 << (b.value < 0 ? " neg" : "") << "\" x=\"" << px(x0)
        << "\" y=\"" << px(y) << "\" width=\"" << px(w) << "\" height=\"" << kBar
        << "\" data-group=\"" << html_escape(g.label) << "\" data-series=\"" << html_escape(series)
        << "\" data-v=\"" << html_escape(b.exact) << "\"><title>" << html_escape(b.tip)
        << "</title></rect>";
      if (!b.label.empty())
        o << "<text class=\"value\" x=\"" << px(b.value < 0 ? x0 - 4 : x0 + w + 4) << "\" y=\""
          << px(y + kBar - 3) << "\" text-anchor=\"" << (b.value < 0 ? "end" : "start") << "\">"
          << html_escape(b.label) << "</text>";
      o << "\n";
      y += kBar + kBarGap;
    }
    y += kGroupGap - kBarGap;
    o << "</g>\n";
  }
  o << "</svg>\n";
  return o.str();
}

std::string scatter_chart_svg(const ScatterChart& c) {
  constexpr double kWidth = 760, kHeight = 380, kLeft = 84, kBottom = 46;
  std::size_t longest = 0;  // the lines' labels sit right of their ends
  for (const auto& l : c.lines) longest = std::max(longest, l.label.size());
  const double kRight = std::min(260.0, 20 + 6.6 * static_cast<double>(longest));
  const double top = c.series.size() > 1 ? 30 : 12;
  double xl = 0, xh = 0, yl = 0, yh = 0;
  for (const auto& p : c.points) {
    xh = std::max(xh, p.x);
    xl = std::min(xl, p.x);
    yh = std::max(yh, p.y);
    yl = std::min(yl, p.y);
  }
  for (const auto& l : c.lines) {
    xh = std::max({xh, l.x0, l.x1});
    yh = std::max({yh, l.y0, l.y1});
    yl = std::min({yl, l.y0, l.y1});
  }
  const Scale xs = scale_of(c.x_axis, std::max(-xl, xh)),
              ys = scale_of(c.y_axis, std::max(-yl, yh));
  const auto [x_lo, x_hi] = range(xl / xs.div, xh / xs.div, 0);
  const auto [y_lo, y_hi] = range(yl / ys.div, yh / ys.div, 0);
  const double pl = kLeft, pr = kWidth - kRight, pt = top, pb = kHeight - kBottom;
  auto X = [&, x_lo = x_lo, x_hi = x_hi](double v) {  // v as given (bytes or the number)
    return pl + (v / xs.div - x_lo) / (x_hi - x_lo) * (pr - pl);
  };
  auto Y = [&, y_lo = y_lo, y_hi = y_hi](double v) {
    return pb - (v / ys.div - y_lo) / (y_hi - y_lo) * (pb - pt);
  };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart scatter\" id=\""
    << html_escape(c.id) << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" width=\""
    << kWidth << "\" height=\"" << kHeight << "\" role=\"img\" aria-label=\""
    << html_escape(c.title) << "\">\n<title>" << html_escape(c.title) << "</title>\n";
  if (c.series.size() > 1) o << legend(c.series, pl, 16);
  o << "<g class=\"axis\">";
  for (double t : ticks(x_lo, x_hi, 6)) {
    const std::string x = px(X(t * xs.div));
    o << "<line class=\"grid\" x1=\"" << x << "\" x2=\"" << x << "\" y1=\"" << px(pt) << "\" y2=\""
      << px(pb) << "\"/><text class=\"tick\" x=\"" << x << "\" y=\"" << px(pb + 14)
      << "\" text-anchor=\"middle\">" << html_escape(tick_label(t, xs)) << "</text>";
  }
  for (double t : ticks(y_lo, y_hi, 6)) {
    const double y = Y(t * ys.div);
    o << "<line class=\"grid\" x1=\"" << px(pl) << "\" x2=\"" << px(pr) << "\" y1=\"" << px(y)
      << "\" y2=\"" << px(y) << "\"/><text class=\"tick\" x=\"" << px(pl - 6) << "\" y=\""
      << px(y + 4) << "\" text-anchor=\"end\">" << html_escape(tick_label(t, ys)) << "</text>";
  }
  o << "<line class=\"zero\" x1=\"" << px(pl) << "\" x2=\"" << px(pr) << "\" y1=\"" << px(Y(0))
    << "\" y2=\"" << px(Y(0)) << "\"/><line class=\"zero\" x1=\"" << px(X(0)) << "\" x2=\""
    << px(X(0)) << "\" y1=\"" << px(pt) << "\" y2=\"" << px(pb) << "\"/>";
  o << "<text class=\"axis-label\" x=\"" << px((pl + pr) / 2) << "\" y=\"" << px(kHeight - 8)
    << "\" text-anchor=\"middle\">" << html_escape(c.x_label) << "</text>";
  o << "<text class=\"axis-label\" transform=\"translate(14 " << px((pt + pb) / 2)
    << ") rotate(-90)\" text-anchor=\"middle\">" << html_escape(c.y_label) << "</text></g>\n";
  for (const auto& l : c.lines)
    o << "<line class=\"fit s" << l.series % 6 << "\" x1=\"" << px(X(l.x0)) << "\" y1=\""
      << px(Y(l.y0)) << "\" x2=\"" << px(X(l.x1)) << "\" y2=\"" << px(Y(l.y1)) << "\""
      << data_attrs(l.data) << "><title>" << html_escape(l.tip) << "</title></line>"
      << (l.label.empty() ? ""
                          : "<text class=\"line-label\" x=\"" + px(X(l.x1) + 6) + "\" y=\"" +
                                px(Y(l.y1) + 4) + "\">" + html_escape(l.label) + "</text>")
      << "\n";
  for (const auto& p : c.points)
    o << "<circle class=\"point s" << p.series % 6 << "\" cx=\"" << px(X(p.x)) << "\" cy=\""
      << px(Y(p.y)) << "\" r=\"4.5\"" << data_attrs(p.data) << "><title>" << html_escape(p.tip)
      << "</title></circle>\n";
  o << "</svg>\n";
  return o.str();
}

Bar per_layer_bar(const Estimate& e, const std::string& series) {
  const std::uint64_t b = e.activations.per_layer_bytes;
  Bar bar;
  bar.value = static_cast<double>(b);
  bar.exact = std::to_string(b);
  bar.label = format_bytes_human(b);
  bar.tip = std::string(profile_name(e.profile)) + (series.empty() ? "" : ", " + series) + ": " +
            with_commas(b) + " B per layer (" + format_bytes_human(b) +
            ")\n= " + per_layer_formula(e) + "\n= " + fixed(sbh_equivalent(e), 2) + "·sbh";
  return bar;
}

Bar measured_per_layer_bar(std::uint64_t bytes, const std::string& what) {
  Bar bar;
  bar.value = static_cast<double>(bytes);
  bar.exact = std::to_string(bytes);
  bar.label = format_bytes_human(bytes);
  bar.tip = what + ": " + with_commas(bytes) + " B per layer (" + format_bytes_human(bytes) + ")";
  return bar;
}

}  // namespace trainmem::report
