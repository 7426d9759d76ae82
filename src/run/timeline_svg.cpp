// The memory timeline as a self-contained SVG stacked-area plot
// (include/trainmem/run/timeline.hpp): the full stack and a zoom on what changes within the step,
// the phases, the x axis, the peak's label, the legend, and the columns a page inspects.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>

#include "trainmem/base/bytes.hpp"
#include "trainmem/run/timeline.hpp"

namespace trainmem {
namespace {

// The SVG stacks categories bottom to top in this order: persistent state first, then what
// comes and goes, so the activations' rise and fall sits on top where it can be read.
constexpr std::array<Category, kNumCategories> kStackOrder = {
    Category::params,        Category::optimizer_states, Category::gradients,  Category::inputs,
    Category::communication, Category::workspace,        Category::activations};

const char* category_colour(Category c) {
  switch (c) {  // Okabe-Ito palette: distinguishable with common colour-vision deficiencies
    case Category::params:
      return "#0072B2";
    case Category::gradients:
      return "#E69F00";
    case Category::optimizer_states:
      return "#009E73";
    case Category::activations:
      return "#D55E00";
    case Category::workspace:
      return "#CC79A7";
    case Category::inputs:
      return "#56B4E9";
    case Category::communication:
      return "#F0E442";
  }
  return "#888888";
}

const char* phase_colour(Phase p) {
  switch (p) {
    case Phase::setup:
      return "#f0f0f0";
    case Phase::forward:
      return "#e3edf9";
    case Phase::backward:
      return "#fbeadb";
    case Phase::recompute:
      return "#efe2f3";
    case Phase::optimizer:
      return "#e2f3e8";
  }
  return "#ffffff";
}

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// "12.5 GiB" with at most two decimals, trailing zeros dropped.
std::string tick_label(double value, const char* unit) {
  std::string s = fmt("%.2f", value);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s + " " + unit;
}

std::string bytes_label(std::uint64_t bytes) {
  return format_bytes_with_unit(bytes, byte_unit_for(bytes));
}

// A "nice" tick step (1, 2, 2.5 or 5 × 10^k) giving about `target` intervals over [0, max].
double nice_step(double max, int target) {
  if (max <= 0) return 1;
  const double raw = max / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

// The event columns to draw: every event when they fit, else the event with the largest
// `weight` in each half-pixel bucket (the envelope, and the peak, survive the thinning).
struct Columns {
  std::vector<std::size_t> index;  // point index per column
  std::vector<double> start;       // column k spans [start[k], start[k+1]) on the event axis
};

Columns choose_columns(const TimelineData& d, std::size_t max_cols,
                       const std::function<std::uint64_t(const TimelinePoint&)>& weight) {
  const std::size_t n = d.points.size();
  Columns c;
  if (n <= max_cols) {
    for (std::size_t i = 0; i < n; ++i) c.index.push_back(i), c.start.push_back(double(i));
  } else {
    for (std::size_t b = 0; b < max_cols; ++b) {
      const std::size_t lo = b * n / max_cols, hi = std::max(lo + 1, (b + 1) * n / max_cols);
      std::size_t best = lo;
      for (std::size_t i = lo; i < hi && i < n; ++i)
        if (weight(d.points[i]) > weight(d.points[best])) best = i;
      if (d.peak_index >= lo && d.peak_index < hi) best = d.peak_index;
      c.index.push_back(best);
      c.start.push_back(double(lo));
    }
  }
  c.start.push_back(double(n));
  return c;
}

struct Panel {
  double x0, x1, y0, y1;
  std::vector<Category> categories;  // stacked bottom to top
  std::string caption;
};

// One stacked-area panel: phase bands, grid and y axis, areas, the total outline, the frame.
void draw_panel(std::ostringstream& o, const TimelineData& d, const Panel& p, bool label_phases,
                const std::string& id) {
  const std::size_t n = d.points.size();
  auto stack_of = [&](const TimelinePoint& pt) {
    std::uint64_t t = 0;
    for (Category c : p.categories) t += pt.live[static_cast<int>(c)];
    return t;
  };
  std::uint64_t max_bytes = 0;
  for (const auto& pt : d.points) max_bytes = std::max(max_bytes, stack_of(pt));
  const ByteUnit unit = byte_unit_for(max_bytes);
  const double max_u = double(max_bytes) / unit.bytes;
  const double ystep = nice_step(max_u, p.y1 - p.y0 > 250 ? 5 : 3);
  const double ytop = std::max(ystep, std::ceil(max_u / ystep - 1e-9) * ystep);
  auto X = [&](double idx) { return p.x0 + (p.x1 - p.x0) * idx / double(n); };
  auto Y = [&](double bytes) { return p.y1 - (p.y1 - p.y0) * (bytes / unit.bytes) / ytop; };
  const Columns cols = choose_columns(d, static_cast<std::size_t>(2 * (p.x1 - p.x0)), stack_of);

  o << "<g id=\"" << id << "\">\n";
  for (const PhaseSlice& s : d.phases) {
    const double bx0 = X(double(s.first)), bx1 = X(double(s.last + 1));
    o << "<rect class=\"phase\" data-phase=\"" << phase_name(s.phase) << "\" x=\""
      << fmt("%.1f", bx0) << "\" y=\"" << p.y0 << "\" width=\"" << fmt("%.1f", bx1 - bx0)
      << "\" height=\"" << (p.y1 - p.y0) << "\" fill=\"" << phase_colour(s.phase) << "\"/>\n";
    if (label_phases && bx1 - bx0 >= 8.0 * std::string(phase_name(s.phase)).size())
      o << "<text x=\"" << fmt("%.1f", (bx0 + bx1) / 2) << "\" y=\"" << (p.y0 - 8)
        << "\" text-anchor=\"middle\" fill=\"#333333\">" << phase_name(s.phase) << "</text>\n";
  }
  for (const QuietPhase& q : d.quiet_phases) {
    const double bx = std::min(X(double(q.before)), p.x1 - 3.0);
    o << "<rect class=\"phase\" data-phase=\"" << phase_name(q.phase) << "\" x=\""
      << fmt("%.1f", bx) << "\" y=\"" << p.y0 << "\" width=\"3\" height=\"" << (p.y1 - p.y0)
      << "\" fill=\"" << phase_colour(q.phase) << "\" stroke=\"#666666\" stroke-width=\"0.5\"/>\n";
    if (label_phases)
      o << "<text x=\"" << fmt("%.1f", bx) << "\" y=\"" << (p.y0 - 8)
        << "\" text-anchor=\"end\" fill=\"#333333\">" << phase_name(q.phase)
        << " (no allocations)</text>\n";
  }
  for (double v = 0; v <= ytop + 1e-9; v += ystep) {
    const double y = p.y1 - (p.y1 - p.y0) * v / ytop;
    o << "<line x1=\"" << p.x0 << "\" y1=\"" << fmt("%.1f", y) << "\" x2=\"" << p.x1 << "\" y2=\""
      << fmt("%.1f", y) << "\" stroke=\"#d0d0d0\" stroke-width=\"1\"/>\n";
    o << "<text x=\"" << (p.x0 - 6) << "\" y=\"" << fmt("%.1f", y + 4)
      << "\" text-anchor=\"end\" fill=\"#333333\">" << tick_label(v, unit.name) << "</text>\n";
  }
  o << "<text transform=\"translate(18," << fmt("%.1f", (p.y0 + p.y1) / 2)
    << ") rotate(-90)\" text-anchor=\"middle\" fill=\"#333333\">" << xml_escape(p.caption)
    << "</text>\n";

  std::vector<double> below(cols.index.size(), 0.0);
  for (Category c : p.categories) {
    const int ci = static_cast<int>(c);
    bool any = false;
    for (std::size_t k = 0; k < cols.index.size(); ++k) any |= d.points[cols.index[k]].live[ci] > 0;
    if (!any) continue;
    std::vector<double> above(cols.index.size());
    for (std::size_t k = 0; k < cols.index.size(); ++k)
      above[k] = below[k] + double(d.points[cols.index[k]].live[ci]);
    o << "<path class=\"area\" data-category=\"" << category_name(c) << "\" fill=\""
      << category_colour(c) << "\" fill-opacity=\"0.85\" stroke=\"none\" d=\"M";
    for (std::size_t k = 0; k < cols.index.size(); ++k)
      o << fmt("%.1f", X(cols.start[k])) << "," << fmt("%.1f", Y(above[k])) << " "
        << fmt("%.1f", X(cols.start[k + 1])) << "," << fmt("%.1f", Y(above[k])) << " ";
    for (std::size_t k = cols.index.size(); k-- > 0;)
      o << fmt("%.1f", X(cols.start[k + 1])) << "," << fmt("%.1f", Y(below[k])) << " "
        << fmt("%.1f", X(cols.start[k])) << "," << fmt("%.1f", Y(below[k])) << " ";
    o << "Z\"/>\n";
    below = above;
  }
  o << "<path class=\"total\" fill=\"none\" stroke=\"#222222\" stroke-width=\"1\" d=\"M";
  for (std::size_t k = 0; k < cols.index.size(); ++k)
    o << fmt("%.1f", X(cols.start[k])) << "," << fmt("%.1f", Y(below[k])) << " "
      << fmt("%.1f", X(cols.start[k + 1])) << "," << fmt("%.1f", Y(below[k])) << " ";
  o << "\"/>\n";
  o << "<rect x=\"" << p.x0 << "\" y=\"" << p.y0 << "\" width=\"" << (p.x1 - p.x0) << "\" height=\""
    << (p.y1 - p.y0) << "\" fill=\"none\" stroke=\"#333333\" stroke-width=\"1\"/>\n";
  // The peak: a dashed line through the panel and a dot on the top of this panel's stack.
  const TimelinePoint& pk = d.points[d.peak_index];
  const double px = X(double(d.peak_index) + 0.5);
  o << "<line class=\"peak-line\" x1=\"" << fmt("%.1f", px) << "\" y1=\"" << p.y0 << "\" x2=\""
    << fmt("%.1f", px) << "\" y2=\"" << p.y1
    << "\" stroke=\"#000000\" stroke-width=\"1.2\" stroke-dasharray=\"5,3\"/>\n";
  o << "<circle class=\"peak-dot\" cx=\"" << fmt("%.1f", px) << "\" cy=\""
    << fmt("%.1f", Y(double(stack_of(pk)))) << "\" r=\"4.5\" fill=\"#000000\"/>\n";
  o << "</g>\n";
}

// The x axis under the last panel (its bottom at y_axis).
void draw_x_axis(std::ostringstream& o, const TimelineData& d, double x0, double x1,
                 double y_axis) {
  const std::size_t n = d.points.size();
  o << "<g id=\"x-axis\" fill=\"#333333\">\n";
  const double xstep = nice_step(double(n), 8);
  for (double v = 0; v <= double(n) + 1e-9; v += xstep) {
    const double x = x0 + (x1 - x0) * v / double(n);
    o << "<line x1=\"" << fmt("%.1f", x) << "\" y1=\"" << y_axis << "\" x2=\"" << fmt("%.1f", x)
      << "\" y2=\"" << (y_axis + 5) << "\" stroke=\"#333333\"/>\n";
    o << "<text x=\"" << fmt("%.1f", x) << "\" y=\"" << (y_axis + 19)
      << "\" text-anchor=\"middle\">" << fmt("%.0f", v) << "</text>\n";
  }
  o << "<text x=\"" << fmt("%.1f", (x0 + x1) / 2) << "\" y=\"" << (y_axis + 42)
    << "\" text-anchor=\"middle\">ledger events in the step (allocations and releases, in "
       "order)</text>\n";
  o << "</g>\n";
}

// The peak's label, beside its dot in the full panel (its top at y0).
void draw_peak_label(std::ostringstream& o, const TimelineData& d, double x0, double x1,
                     double y0) {
  const std::size_t n = d.points.size();
  const TimelinePoint& pk = d.points[d.peak_index];
  const double px = x0 + (x1 - x0) * (double(d.peak_index) + 0.5) / double(n);
  std::string where = phase_name(pk.phase);
  if (pk.layer >= 0) where += ", layer " + std::to_string(pk.layer);
  if (!pk.tensor.empty()) where += ", " + pk.tensor;
  const bool label_left = px > (x0 + x1) / 2;
  const double lx = label_left ? px - 8 : px + 8;
  const char* anchor = label_left ? "end" : "start";
  const double ly = y0 + 16;
  o << "<g id=\"peak\">\n";
  o << "<text x=\"" << fmt("%.1f", lx) << "\" y=\"" << fmt("%.1f", ly) << "\" text-anchor=\""
    << anchor << "\" font-weight=\"bold\" stroke=\"#ffffff\" stroke-width=\"3\" "
    << "paint-order=\"stroke\">" << xml_escape("peak " + bytes_label(pk.live_total)) << "</text>\n";
  o << "<text x=\"" << fmt("%.1f", lx) << "\" y=\"" << fmt("%.1f", ly + 15) << "\" text-anchor=\""
    << anchor << "\" stroke=\"#ffffff\" stroke-width=\"3\" paint-order=\"stroke\">"
    << xml_escape("(" + where + ")") << "</text>\n";
  o << "</g>\n";
}

// The legend right of the plot, from (lx, top): categories top to bottom in the stack's visual
// order with their bytes at the peak, the total, the phases, the events not shown.
void draw_legend(std::ostringstream& o, const TimelineData& d, double lx, double top, int width) {
  const TimelinePoint& pk = d.points[d.peak_index];
  o << "<g id=\"legend\">\n";
  double ly = top;
  o << "<text x=\"" << lx << "\" y=\"" << ly << "\" font-weight=\"bold\">at the peak</text>\n";
  ly += 12;
  for (auto it = kStackOrder.rbegin(); it != kStackOrder.rend(); ++it) {
    const Category c = *it;
    const std::uint64_t b = pk.live[static_cast<int>(c)];
    o << "<rect x=\"" << lx << "\" y=\"" << ly << "\" width=\"14\" height=\"14\" fill=\""
      << category_colour(c) << "\" fill-opacity=\"0.85\"/>\n";
    o << "<text x=\"" << (lx + 20) << "\" y=\"" << (ly + 11) << "\">" << category_name(c)
      << "</text>\n";
    o << "<text x=\"" << (width - 12) << "\" y=\"" << (ly + 11) << "\" text-anchor=\"end\">"
      << (b ? bytes_label(b) : std::string("0")) << "</text>\n";
    ly += 22;
  }
  o << "<line x1=\"" << lx << "\" y1=\"" << (ly - 2) << "\" x2=\"" << (width - 12) << "\" y2=\""
    << (ly - 2) << "\" stroke=\"#999999\"/>\n";
  o << "<text x=\"" << (lx + 20) << "\" y=\"" << (ly + 12) << "\" font-weight=\"bold\">total"
    << "</text>\n";
  o << "<text x=\"" << (width - 12) << "\" y=\"" << (ly + 12)
    << "\" text-anchor=\"end\" font-weight=\"bold\">" << bytes_label(pk.live_total) << "</text>\n";
  ly += 40;
  o << "<text x=\"" << lx << "\" y=\"" << ly << "\" font-weight=\"bold\">phases</text>\n";
  ly += 12;
  std::vector<Phase> seen;
  for (const PhaseSlice& s : d.phases)
    if (std::find(seen.begin(), seen.end(), s.phase) == seen.end()) seen.push_back(s.phase);
  for (const QuietPhase& q : d.quiet_phases)
    if (std::find(seen.begin(), seen.end(), q.phase) == seen.end()) seen.push_back(q.phase);
  for (Phase p : seen) {
    o << "<rect x=\"" << lx << "\" y=\"" << ly << "\" width=\"14\" height=\"14\" fill=\""
      << phase_colour(p) << "\" stroke=\"#999999\"/>\n";
    o << "<text x=\"" << (lx + 20) << "\" y=\"" << (ly + 11) << "\">" << phase_name(p)
      << "</text>\n";
    ly += 20;
  }
  if (d.dropped_events > 0) {
    ly += 10;
    o << "<text x=\"" << lx << "\" y=\"" << ly << "\" fill=\"#aa0000\">" << d.dropped_events
      << " events past the ledger's cap not shown</text>\n";
  }
  o << "</g>\n";
}

// The instants a page inspects: transparent columns over the plot, each from its point to the
// next one's, with its tooltip.
void draw_instants(std::ostringstream& o, const TimelineData& d, const SvgInstants& instants,
                   double x0, double x1, double y0, double y_axis) {
  const std::size_t n = d.points.size();
  if (instants.index.empty()) return;
  o << "<g id=\"instants\">\n";
  for (std::size_t k = 0; k < instants.index.size(); ++k) {
    const std::size_t i = instants.index[k];
    const std::size_t next = k + 1 < instants.index.size() ? instants.index[k + 1] : n;
    const double ix0 = x0 + (x1 - x0) * double(i) / double(n);
    const double ix1 = std::max(ix0 + 1.0, x0 + (x1 - x0) * double(next) / double(n));
    o << "<rect class=\"instant" << (i == d.peak_index ? " peak" : "") << "\" id=\"instant-" << k
      << "\" data-k=\"" << k << "\" data-seq=\"" << d.points[i].seq << "\" x=\"" << fmt("%.2f", ix0)
      << "\" y=\"" << y0 << "\" width=\"" << fmt("%.2f", ix1 - ix0) << "\" height=\""
      << (y_axis - y0) << "\" fill=\"#000000\" fill-opacity=\"0\">"
      << "<title>" << xml_escape(k < instants.tooltip.size() ? instants.tooltip[k] : "")
      << "</title></rect>\n";
  }
  o << "</g>\n";
}

}  // namespace

std::string timeline_svg(const TimelineData& d, int width, int height) {
  return timeline_svg(d, SvgInstants{}, width, height);
}

std::string timeline_svg(const TimelineData& d, const SvgInstants& instants, int width,
                         int height) {
  const TimelinePoint& pk = d.points[d.peak_index];
  // Categories whose live bytes change within the step get a second, zoomed panel: the
  // persistent state (params, optimizer states, ...) dwarfs them in the full stack.
  std::vector<Category> moving;
  for (Category c : kStackOrder) {
    const int ci = static_cast<int>(c);
    std::uint64_t lo = d.initial[ci], hi = d.initial[ci];
    for (const auto& pt : d.points) lo = std::min(lo, pt.live[ci]), hi = std::max(hi, pt.live[ci]);
    if (hi != lo) moving.push_back(c);
  }
  const bool zoom = !moving.empty();
  const double left = 84, right = 270, top = 78, bottom = 64, gap = 46;
  const double x0 = left, x1 = width - right;
  const double plot_h = height - top - bottom - (zoom ? gap : 0);
  const Panel all{x0,
                  x1,
                  top,
                  top + (zoom ? plot_h * 0.6 : plot_h),
                  std::vector<Category>(kStackOrder.begin(), kStackOrder.end()),
                  "all live memory"};
  const Panel part{x0, x1, all.y1 + gap, height - bottom, moving, "what changes in the step"};
  const double y_axis = zoom ? part.y1 : all.y1;

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << " " << height
    << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  o << "<title>" << xml_escape("trainmem memory timeline: " + d.title) << "</title>\n";
  o << "<rect x=\"0\" y=\"0\" width=\"" << width << "\" height=\"" << height
    << "\" fill=\"#ffffff\"/>\n";
  o << "<text x=\"" << x0 << "\" y=\"24\" font-size=\"16\" font-weight=\"bold\">"
    << xml_escape(d.title) << "</text>\n";
  o << "<text x=\"" << x0 << "\" y=\"44\" fill=\"#444444\">"
    << xml_escape("Live bytes per category over the step (ledger); peak " +
                  bytes_label(pk.live_total))
    << "</text>\n";

  draw_panel(o, d, all, true, "panel-all");
  if (zoom) {
    std::string names;
    for (Category c : moving) names += std::string(names.empty() ? "" : " + ") + category_name(c);
    o << "<text x=\"" << x0 << "\" y=\"" << (part.y0 - 10) << "\" fill=\"#444444\">"
      << xml_escape("Zoom on what changes within the step: " + names) << "</text>\n";
    draw_panel(o, d, part, false, "panel-changing");
  }

  draw_x_axis(o, d, x0, x1, y_axis);
  draw_peak_label(o, d, x0, x1, all.y0);
  draw_legend(o, d, x1 + 22, all.y0 + 4, width);
  draw_instants(o, d, instants, x0, x1, all.y0, y_axis);
  o << "</svg>\n";
  return o.str();
}

}  // namespace trainmem
