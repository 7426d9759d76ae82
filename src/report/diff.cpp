// `trainmem diff`: reading the two sides and the difference B − A (see
// include/trainmem/report/diff.hpp; its reports: diff_report.cpp).
#include "trainmem/report/diff.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

#include "diff_internal.hpp"
#include "trainmem/base/bytes.hpp"
#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/input_file.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/schema.hpp"

namespace trainmem::diff {

using nlohmann::json;
using namespace detail;
namespace schema = report::schema;

namespace {

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw InputError("diff " + where + ": " + what);
}

std::string quoted(const std::string& key) {
  return "\"" + key + "\"";
}

const json& need(const json& obj, const std::string& key, const std::string& where,
                 const std::string& path) {
  if (!obj.is_object()) bad(where, path + " is not a JSON object");
  const auto it = obj.find(key);
  if (it == obj.end()) bad(where, path + ": missing \"" + key + "\"");
  return *it;
}

std::uint64_t need_bytes(const json& obj, const std::string& key, const std::string& where,
                         const std::string& path) {
  const json& v = need(obj, key, where, path);
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0)
    return static_cast<std::uint64_t>(v.get<std::int64_t>());
  bad(where, path + "." + key + " is " + v.dump() + ", not a byte count (an integer >= 0)");
}

double need_number(const json& obj, const std::string& key, const std::string& where,
                   const std::string& path) {
  const json& v = need(obj, key, where, path);
  if (!v.is_number()) bad(where, path + "." + key + " is " + v.dump() + ", not a number");
  return v.get<double>();
}

std::string need_string(const json& obj, const std::string& key, const std::string& where,
                        const std::string& path) {
  const json& v = need(obj, key, where, path);
  if (!v.is_string()) bad(where, path + "." + key + " is " + v.dump() + ", not a string");
  return v.get<std::string>();
}

std::string optional_string(const json& obj, const std::string& key) {
  const auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string describe_run(const json& run_object) {
  namespace key = schema::run_key;
  const json& r = run_object.contains(schema::kRun) ? run_object.at(schema::kRun) : json::object();
  auto get = [&](const char* k) { return r.contains(k) ? plain(r.at(k)) : std::string("?"); };
  return get(key::kOptimizer) + ", checkpointing " + get(key::kCheckpointing) + ", batch " +
         get(key::kBatch) + ", seq " + get(key::kSeq);
}

std::string runs_list(const Report& report) {
  std::vector<std::string> items;
  for (std::size_t n = 0; n < report.runs.size(); ++n)
    items.push_back(std::to_string(n + 1) + ": " + describe_run(report.runs[n]));
  return join(items, "; ");
}

Coefficients entry_coefficients(const std::optional<Entry>& e) {
  Coefficients c;
  if (!e) return c;
  switch (e->term) {
    case Term::sbh:
      c.sbh = e->coefficient;
      break;
    case Term::sbi:
      c.sbi = e->coefficient;
      break;
    case Term::as2b:
      c.as2b = e->coefficient;
      break;
    case Term::sb:
      c.sb = e->coefficient;
      break;
    case Term::other:
      c.other_bytes = e->bytes;  // an `other` entry's coefficient is its bytes
      break;
  }
  return c;
}

}  // namespace

const std::vector<std::string>& category_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    for (const auto& figure : report::schema::kFigures) out.emplace_back(figure.key);
    return out;
  }();
  return keys;
}

Report read_report(const std::string& path, const std::string& where) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    bad(where, "cannot read " + path + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) bad(where, path + " is a directory, not a trainmem JSON report");
  if (::access(path.c_str(), R_OK) != 0)
    bad(where, "cannot read " + path + ": " + std::strerror(errno));
  json doc;
  try {
    // A regular file under the reports' cap, read once; strict JSON (no duplicate keys).
    doc = parse_json_strict<json>(read_input_file(path, "the file", kMaxReportBytes), path,
                                  kMaxReportString);
  } catch (const InputError& e) {
    bad(where, e.what());
  }
  const std::string not_ours = path + " is not a trainmem report: ";
  const std::string schema_key = quoted(schema::kSchemaKey);
  const std::string schema_pair = schema_key + ": " + quoted(report::kSchema);
  if (!doc.is_object())
    bad(where, not_ours + "the document is a JSON " + std::string(doc.type_name()) +
                   ", not an object with " + schema_pair);
  if (!doc.contains(schema::kSchemaKey))
    bad(where,
        not_ours + "no " + schema_key + " key (trainmem's JSON reports have " + schema_pair + ")");
  if (doc.at(schema::kSchemaKey) != report::kSchema)
    bad(where, not_ours + "its schema is " + doc.at(schema::kSchemaKey).dump() + ", not " +
                   quoted(report::kSchema));
  Report r;
  r.path = path;
  auto usable = [](const json& o) {
    return o.is_object() && o.contains(schema::kModel) && o.contains(schema::kRun) &&
           (o.contains(schema::kAnalytic) || o.contains(schema::kMeasured));
  };
  if (doc.contains(schema::kRuns)) {
    if (!doc.at(schema::kRuns).is_array())
      bad(where, path + ": " + quoted(schema::kRuns) + " is not an array");
    for (const auto& o : doc.at(schema::kRuns))
      if (usable(o)) r.runs.push_back(o);
  } else if (usable(doc)) {
    r.runs.push_back(doc);
  }
  if (r.runs.empty())
    bad(where, path +
                   " holds no run with analytic profiles (diff reads the JSON reports of "
                   "estimate, profile, compare and sweep)");
  return r;
}

const json& choose_run(const Report& report, int run, const std::string& where) {
  const std::size_t n = report.runs.size();
  if (run == 0) {
    if (n == 1) return report.runs.front();
    bad(where, report.path + " holds " + std::to_string(n) + " runs (" + runs_list(report) +
                   "); choose one with " + report.path + ":run=N");
  }
  if (run < 1 || static_cast<std::size_t>(run) > n)
    bad(where, report.path + ": run=" + std::to_string(run) + " is not one of its " +
                   std::to_string(n) + " runs (" + runs_list(report) + ")");
  return report.runs[static_cast<std::size_t>(run - 1)];
}

std::vector<std::string> profiles_of(const json& run_object) {
  std::vector<std::string> out;
  if (run_object.contains(schema::kAnalytic) && run_object.at(schema::kAnalytic).is_object()) {
    const json& analytic = run_object.at(schema::kAnalytic);
    for (auto it = analytic.begin(); it != analytic.end(); ++it) out.push_back(it.key());
  }
  if (run_object.contains(schema::kMeasured) && run_object.at(schema::kMeasured).is_object() &&
      run_object.at(schema::kMeasured).contains(schema::kLedger) &&
      run_object.at(schema::kMeasured).at(schema::kLedger).is_object())
    out.push_back(schema::kMeasuredProfile);
  return out;
}

namespace {

// One entry of a per-tensor list, field by field as schema::kTensorFields lists them.
Entry read_entry(const json& t, const std::string& where, const std::string& tp) {
  Entry e;
  e.group = need_string(t, schema::kEntryGroup, where, tp);
  for (const auto& field : schema::kTensorFields) {
    switch (field.value) {
      case schema::EntryValue::text:
        e.*field.text = field.need == schema::Need::required ? need_string(t, field.key, where, tp)
                                                             : optional_string(t, field.key);
        break;
      case schema::EntryValue::bytes:
        e.bytes = need_bytes(t, field.key, where, tp);
        break;
      case schema::EntryValue::term: {
        const std::string term = need_string(t, field.key, where, tp);
        const auto parsed = schema::parse_term(term);
        if (!parsed)
          bad(where, tp + "." + field.key + " is '" + term + "'; allowed: " + schema::term_names());
        e.term = *parsed;
        break;
      }
      case schema::EntryValue::coefficient:
        e.coefficient = need_number(t, field.key, where, tp);
        break;
    }
  }
  return e;
}

}  // namespace

Side side_from_run_object(const json& ro, const std::string& profile, const std::string& where) {
  Side s;
  s.profile = profile;
  s.model = need(ro, schema::kModel, where, "the run");
  s.run = need(ro, schema::kRun, where, "the run");
  const json& layers = need(s.model, schema::model_key::kLayers, where, schema::kModel);
  if (!layers.is_number_integer() || layers.get<std::int64_t>() < 1)
    bad(where, std::string(schema::kModel) + "." + schema::model_key::kLayers + " is " +
                   layers.dump() + ", not a layer count (an integer >= 1)");
  s.layers = layers.get<std::int64_t>();

  const json* p = nullptr;
  std::string path;
  if (profile == schema::kMeasuredProfile) {
    const json& measured = need(ro, schema::kMeasured, where, "the run");
    path = std::string(schema::kMeasured) + "." + schema::kLedger;
    p = &need(measured, schema::kLedger, where, schema::kMeasured);
    s.label = "the ledger of a run on the " +
              plain(s.run.value(schema::run_key::kBackend, json("?"))) + " backend";
  } else {
    const auto names = profiles_of(ro);
    if (std::find(names.begin(), names.end(), profile) == names.end())
      bad(where, "the run holds no profile '" + profile +
                     "'; it holds: " + (names.empty() ? std::string("none") : join(names, ", ")));
    path = std::string(schema::kAnalytic) + "." + profile;
    p = &ro.at(schema::kAnalytic).at(profile);
    s.label = optional_string(*p, schema::kLabel);
  }
  for (const auto& figure : schema::kFigures)
    s.categories.push_back(need_bytes(*p, figure.key, where, path));
  s.per_layer_bytes = need_bytes(*p, schema::kPerLayerActivations, where, path);
  if (profile == schema::kMeasuredProfile) return s;

  const json& c = need(*p, schema::kCoefficients, where, path);
  const std::string cp = path + "." + schema::kCoefficients;
  Coefficients co;
  for (const auto& term : schema::kCoefficientTerms)
    co.*term.member = need_number(c, term.key, where, cp);
  co.other_bytes = need_bytes(c, schema::kOtherBytes, where, cp);
  s.per_layer = co;

  if (p->contains(schema::kCheckpointedLayers)) {  // written since per-layer policies
    const json& n = p->at(schema::kCheckpointedLayers);
    if (!n.is_number_integer() || n.get<std::int64_t>() < 0 || n.get<std::int64_t>() > s.layers)
      bad(where, path + "." + schema::kCheckpointedLayers + " is " + n.dump() +
                     ", not a count of the model's layers (0 to " + std::to_string(s.layers) + ")");
    s.checkpointed_layers = n.get<std::int64_t>();
  }
  if (!p->contains(schema::kTensors)) return s;  // per-category figures only
  const json& tensors = p->at(schema::kTensors);
  if (!tensors.is_array()) bad(where, path + "." + schema::kTensors + " is not an array");
  s.has_tensors = true;
  for (std::size_t n = 0; n < tensors.size(); ++n) {
    const std::string tp = path + "." + schema::kTensors + "[" + std::to_string(n) + "]";
    s.entries.push_back(read_entry(tensors[n], where, tp));
  }
  return s;
}

Side side_from_estimate(const Estimate& e) {
  const json ro{{schema::kSchemaKey, report::kSchema},
                {schema::kModel, report::model_json(e.model, e.param_count)},
                {schema::kRun, report::run_json(e.train, "", -1)},
                {schema::kAnalytic, report::analytic_json({e})}};
  Side s = side_from_run_object(ro, profile_name(e.profile), profile_name(e.profile));
  s.spec = profile_name(e.profile);
  return s;
}

std::string coefficient_change(const std::optional<Entry>& a, const std::optional<Entry>& b) {
  return formula_change(entry_coefficients(a), entry_coefficients(b));
}

bool Row::changed() const {
  return delta != 0 || !a || !b || coefficient_change != "0" || !change.empty();
}

Result compare(const Side& a, const Side& b) {
  Result r;
  r.a = a;
  r.b = b;
  auto differ = [](const json& x, const json& y, const auto& keys, std::vector<std::string>& out) {
    for (const char* k : keys) {
      const json vx = x.is_object() && x.contains(k) ? x.at(k) : json(nullptr);
      const json vy = y.is_object() && y.contains(k) ? y.at(k) : json(nullptr);
      if (vx != vy) out.push_back(std::string(k) + ": " + plain(vx) + " vs " + plain(vy));
    }
  };
  differ(a.model, b.model, schema::kModelCompared, r.model_differences);
  differ(a.run, b.run, schema::kRunShape, r.shape_differences);
  differ(a.run, b.run, schema::kRunSetup, r.setup_differences);

  const auto& keys = category_keys();
  for (std::size_t n = 0; n < keys.size(); ++n)
    r.categories.push_back({keys[n], a.categories[n], b.categories[n],
                            signed_delta(b.categories[n], a.categories[n])});

  r.by_tensor = a.has_tensors && b.has_tensors;
  if (!r.by_tensor) {
    std::vector<std::string> without;
    for (const Side* s : {&a, &b})
      if (!s->has_tensors)
        without.push_back(std::string(s == &a ? "A" : "B") + " (" + s->profile +
                          (s->file.empty() ? "" : " from " + s->file) + ")");
    r.notes.push_back("compared per category only: " + join(without, " and ") +
                      (without.size() > 1 ? " hold" : " holds") + " no per-tensor list");
    return r;
  }

  // Rows keyed by (group, name, occurrence): the n-th entry of a name in a group pairs with
  // the n-th of the other side.
  using Key = std::tuple<std::string, std::string, int>;
  std::map<Key, std::size_t> index;
  auto place = [&](const Side& s, bool is_a) {
    std::map<std::pair<std::string, std::string>, int> seen;
    const bool first_layer = std::any_of(s.entries.begin(), s.entries.end(), [](const Entry& e) {
      return e.group == schema::kFirstLayerGroup;
    });
    for (const auto& e : s.entries) {
      const Key key{e.group, e.name, seen[{e.group, e.name}]++};
      auto it = index.find(key);
      if (it == index.end()) {
        it = index.emplace(key, r.rows.size()).first;
        r.rows.push_back(Row{});
        r.rows.back().group = e.group;
        r.rows.back().name = e.name;
      }
      Row& row = r.rows[it->second];
      const std::uint64_t count =
          e.group == schema::kLayerGroup
              ? static_cast<std::uint64_t>(s.layers - s.checkpointed_layers - (first_layer ? 1 : 0))
          : e.group == schema::kCheckpointedLayerGroup
              ? static_cast<std::uint64_t>(s.checkpointed_layers)
              : 1;
      const std::uint64_t bytes = checked_mul(e.bytes, count, "diff bytes");
      if (is_a) {
        row.a = e;
        row.count_a = count;
        row.a_bytes = bytes;
      } else {
        row.b = e;
        row.count_b = count;
        row.b_bytes = bytes;
      }
    }
  };
  place(a, true);
  place(b, false);

  std::map<std::string, Total> groups;
  for (auto& row : r.rows) {
    row.delta = signed_delta(row.b_bytes, row.a_bytes);
    row.coefficient_change = coefficient_change(row.a, row.b);
    if (row.a && row.b) {
      std::vector<std::string> ch;
      if (row.a->dtype != row.b->dtype) ch.push_back(row.a->dtype + " -> " + row.b->dtype);
      if (row.a->shape != row.b->shape) ch.push_back(row.a->shape + " -> " + row.b->shape);
      row.change = join(ch, ", ");
    } else {
      row.change = row.a ? "only in A" : "only in B";
    }
    row.why = row.b ? row.b->why : row.a->why;
    Total& g = groups[row.group];
    g.name = row.group;
    g.a = checked_add(g.a, row.a_bytes, "diff group bytes");
    g.b = checked_add(g.b, row.b_bytes, "diff group bytes");
  }
  for (auto& [name, g] : groups) {
    g.delta = signed_delta(g.b, g.a);
    r.groups.push_back(g);
  }
  std::stable_sort(r.groups.begin(), r.groups.end(), [](const Total& x, const Total& y) {
    if (magnitude(x.delta) != magnitude(y.delta)) return magnitude(x.delta) > magnitude(y.delta);
    return schema::group_rank(x.name) < schema::group_rank(y.name);
  });
  std::map<std::string, std::size_t> order;
  for (std::size_t n = 0; n < r.groups.size(); ++n) order[r.groups[n].name] = n;
  std::stable_sort(r.rows.begin(), r.rows.end(), [&](const Row& x, const Row& y) {
    if (x.group != y.group) return order[x.group] < order[y.group];
    if (magnitude(x.delta) != magnitude(y.delta)) return magnitude(x.delta) > magnitude(y.delta);
    return std::max(x.a_bytes, x.b_bytes) > std::max(y.a_bytes, y.b_bytes);
  });
  return r;
}

}  // namespace trainmem::diff
