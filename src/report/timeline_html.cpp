// The profile page's timeline: the SVG with inspectable instants, the tensors live at the peak
// as a table, and the data and the small script that list the live tensors of any instant
// (see include/trainmem/run/timeline.hpp).
#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trainmem/base/bytes.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/run/timeline.hpp"

namespace trainmem {

namespace {

using report::html_escape;

bool live_after(const TensorRecord& t, std::uint64_t seq) {
  return t.alloc_seq != 0 && t.alloc_seq <= seq && (t.free_seq == 0 || t.free_seq > seq);
}

// Lists the tensors of `rows` (indices into `recs`) as the instant's table; the script
// rebuilds the same markup for another instant.
void tensor_table(std::ostringstream& o, const std::vector<const TensorRecord*>& recs,
                  std::vector<std::size_t> rows) {
  std::stable_sort(rows.begin(), rows.end(),
                   [&](std::size_t a, std::size_t b) { return recs[a]->bytes > recs[b]->bytes; });
  o << "<table id=\"live-table\" class=\"sortable\">\n<thead><tr>"
    << "<th class=\"left\" data-key=\"0\">tensor</th><th class=\"right\" data-key=\"1\">layer</th>"
    << "<th class=\"left\" data-key=\"2\">category</th>"
    << "<th class=\"right\" data-key=\"3\">bytes</th><th class=\"left\" data-key=\"4\">phase</th>"
    << "</tr></thead>\n<tbody>\n";
  for (std::size_t r : rows) {
    const TensorRecord& t = *recs[r];
    o << "<tr><td class=\"left\">" << html_escape(t.name) << "</td><td class=\"right\">"
      << (t.layer >= 0 ? std::to_string(t.layer) : "") << "</td><td class=\"left\">"
      << category_name(t.category) << "</td><td class=\"right\" data-v=\"" << t.bytes << "\">"
      << report::with_commas(t.bytes) << "</td><td class=\"left\">" << phase_name(t.phase)
      << "</td></tr>\n";
  }
  o << "</tbody>\n</table>\n";
}

constexpr const char* kStyle = R"(<style>
#timeline svg { max-width: 100%; height: auto; }
#timeline rect.instant:hover, #timeline rect.instant.selected { fill-opacity: .18; }
#timeline rect.instant { cursor: pointer; }
#live-controls { margin: .4em 0; }
#live-table th[data-key] { cursor: pointer; }
#live-table td:first-child { font-family: ui-monospace, Menlo, Consolas, monospace; }
</style>
)";

// Lists the tensors live after the instant hovered or clicked, from #tm-timeline-data;
// sorts the table by a header clicked and filters its rows by the text typed. Without it the
// page shows the peak's table and the SVG's tooltips.
constexpr const char* kScript = R"(<script>
(function () {
  var D = JSON.parse(document.getElementById('tm-timeline-data').textContent);
  var box = document.getElementById('live-controls');
  box.hidden = false;
  var filter = document.getElementById('live-filter');
  var heading = document.getElementById('live-heading');
  var sortKey = 3, sortDesc = true, shown = D.peak;
  function esc(s) {
    return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
      .replace(/"/g, '&quot;').replace(/'/g, '&#39;');
  }
  function commas(n) { return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ','); }
  function liveAt(k) {
    if (k < 0) return D.tensors.slice();
    var seq = D.instants[k][0], out = [];
    D.tensors.forEach(function (t) { if (t[5] <= seq && (t[6] === 0 || t[6] > seq)) out.push(t); });
    return out;
  }
  function render(k) {
    shown = k;
    var rows = liveAt(k), f = filter.value.toLowerCase();
    var caption = k < 0 ? 'Every tensor live during the step' : D.instants[k][2];
    rows.sort(function (a, b) {
      var x = sortKey === 2 ? D.categories[a[2]] : sortKey === 4 ? D.phases[a[4]] : a[sortKey];
      var y = sortKey === 2 ? D.categories[b[2]] : sortKey === 4 ? D.phases[b[4]] : b[sortKey];
      var c = x < y ? -1 : x > y ? 1 : 0;
      return sortDesc ? -c : c;
    });
    var html = '';
    var n = 0;
    rows.forEach(function (t) {
      var cat = D.categories[t[2]], ph = D.phases[t[4]];
      if (f && (t[0] + ' ' + cat + ' ' + ph + ' ' + t[1]).toLowerCase().indexOf(f) < 0) return;
      n++;
      html += '<tr><td class="left">' + esc(t[0]) + '</td><td class="right">' +
        (t[1] >= 0 ? t[1] : '') + '</td><td class="left">' + esc(cat) +
        '</td><td class="right" data-v="' + t[3] + '">' + commas(t[3]) +
        '</td><td class="left">' + esc(ph) + '</td></tr>';
    });
    document.querySelector('#live-table tbody').innerHTML = html;
    heading.textContent = caption + ' (' + n + ' of ' + rows.length + ' tensors shown)';
    document.querySelectorAll('#timeline rect.instant').forEach(function (r) {
      r.classList.toggle('selected', Number(r.dataset.k) === k);
    });
  }
  document.querySelectorAll('#timeline rect.instant').forEach(function (r) {
    var k = Number(r.dataset.k);
    r.addEventListener('mouseenter', function () { render(k); });
    r.addEventListener('click', function () { render(k); });
  });
  document.querySelectorAll('#live-table th[data-key]').forEach(function (th) {
    th.addEventListener('click', function () {
      var key = Number(th.dataset.key);
      sortDesc = key === sortKey ? !sortDesc : key === 3;
      sortKey = key;
      render(shown);
    });
  });
  filter.addEventListener('input', function () { render(shown); });
  document.getElementById('live-peak').addEventListener('click', function () { render(D.peak); });
  document.getElementById('live-all').addEventListener('click', function () { render(-1); });
  render(D.peak);
})();
</script>
)";

}  // namespace

std::string timeline_html(const TimelineData& d, const std::vector<TensorRecord>& tensors,
                          std::size_t max_instants) {
  const std::size_t n = d.points.size();
  const std::uint64_t first = d.points.front().seq, last = d.points.back().seq;

  // The instants: evenly spread over the points, the peak always one.
  std::vector<std::size_t> idx;
  const std::size_t want = std::max<std::size_t>(1, std::min(max_instants, n));
  for (std::size_t k = 0; k < want; ++k) idx.push_back(k * n / want);
  idx.push_back(d.peak_index);
  std::sort(idx.begin(), idx.end());
  idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  std::size_t peak_k = 0;
  for (std::size_t k = 0; k < idx.size(); ++k)
    if (idx[k] == d.peak_index) peak_k = k;

  // The records live at some point of the window, once.
  std::vector<const TensorRecord*> recs;
  for (const auto& t : tensors)
    if (t.alloc_seq != 0 && t.alloc_seq <= last && (t.free_seq == 0 || t.free_seq > first))
      recs.push_back(&t);

  auto describe = [&](std::size_t i) {
    const TimelinePoint& p = d.points[i];
    std::string s = "event " + std::to_string(p.seq) + ", " + phase_name(p.phase);
    if (p.layer >= 0) s += ", layer " + std::to_string(p.layer);
    s += ": " + format_bytes_with_unit(p.live_total, byte_unit_for(p.live_total)) + " live";
    return s;
  };

  SvgInstants inst;
  nlohmann::json instants = nlohmann::json::array();
  for (std::size_t k = 0; k < idx.size(); ++k) {
    const TimelinePoint& p = d.points[idx[k]];
    std::size_t count = 0;
    const TensorRecord* largest = nullptr;
    for (const TensorRecord* t : recs)
      if (live_after(*t, p.seq)) {
        ++count;
        if (t->category != Category::params && t->category != Category::optimizer_states &&
            (!largest || t->bytes > largest->bytes))
          largest = t;
      }
    std::string tip = (idx[k] == d.peak_index ? "PEAK — " : "") + describe(idx[k]);
    if (!p.tensor.empty())
      tip += "\n" + std::string(p.delta >= 0 ? "allocates " : "releases ") + p.tensor;
    tip += "\n" + std::to_string(count) + " tensors live";
    if (largest)
      tip += "; the largest transient: " + largest->name + " (" +
             format_bytes_with_unit(largest->bytes, byte_unit_for(largest->bytes)) + ")";
    inst.index.push_back(idx[k]);
    inst.tooltip.push_back(tip);
    instants.push_back(
        {p.seq, idx[k],
         (idx[k] == d.peak_index ? "Live at the peak: " : "Live after ") + describe(idx[k])});
  }

  nlohmann::json data;
  data["peak"] = peak_k;
  data["instants"] = instants;
  nlohmann::json cats = nlohmann::json::array(), phases = nlohmann::json::array();
  for (int c = 0; c < kNumCategories; ++c) cats.push_back(category_name(static_cast<Category>(c)));
  for (int p = 0; p < kNumPhases; ++p) phases.push_back(phase_name(static_cast<Phase>(p)));
  data["categories"] = cats;
  data["phases"] = phases;
  nlohmann::json rows = nlohmann::json::array();
  for (const TensorRecord* t : recs)
    rows.push_back({t->name, t->layer, static_cast<int>(t->category), t->bytes,
                    static_cast<int>(t->phase), t->alloc_seq, t->free_seq});
  data["tensors"] = rows;
  std::string json_text = data.dump();
  // Inside <script>: "</" could end it; "<\/" is the same JSON string.
  for (auto p = json_text.find("</"); p != std::string::npos; p = json_text.find("</", p + 3))
    json_text.insert(p + 1, "\\");

  std::vector<std::size_t> peak_rows;
  for (std::size_t r = 0; r < recs.size(); ++r)
    if (live_after(*recs[r], d.points[d.peak_index].seq)) peak_rows.push_back(r);

  std::ostringstream o;
  o << kStyle;
  o << "<div id=\"timeline\">\n" << timeline_svg(d, inst) << "</div>\n";
  o << "<figcaption>Hover or click an instant of the plot to list the tensors live after it "
       "(without JavaScript: each instant's tooltip; the table lists the peak's).</figcaption>\n";
  o << "<h3 id=\"live-heading\">"
    << html_escape("Live at the peak: " + describe(d.peak_index) + " (" +
                   std::to_string(peak_rows.size()) + " tensors)")
    << "</h3>\n";
  o << "<div id=\"live-controls\" hidden><label>filter <input id=\"live-filter\" "
       "type=\"search\" placeholder=\"name, category, phase, layer\"></label> "
       "<button id=\"live-peak\" type=\"button\">the peak</button> "
       "<button id=\"live-all\" type=\"button\">every tensor of the step</button> "
       "(click a header to sort)</div>\n";
  tensor_table(o, recs, peak_rows);
  o << "<script type=\"application/json\" id=\"tm-timeline-data\">" << json_text << "</script>\n";
  o << kScript;
  return o.str();
}

}  // namespace trainmem
