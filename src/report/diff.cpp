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

namespace trainmem::diff {

using nlohmann::json;
using namespace detail;

namespace {

// The groups of an analytic per-tensor list, in the order reports list them.
const std::vector<std::string> kGroups = {"embedding", "layer",     "shared",
                                          "head",      "recompute", "inputs"};

std::size_t group_rank(const std::string& g) {
  const auto it = std::find(kGroups.begin(), kGroups.end(), g);
  return static_cast<std::size_t>(it - kGroups.begin());
}

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw InputError("diff " + where + ": " + what);
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

std::optional<Term> parse_term(const std::string& s) {
  for (Term t : {Term::sbh, Term::sbi, Term::as2b, Term::sb, Term::other})
    if (s == term_name(t)) return t;
  return std::nullopt;
}

std::string describe_run(const json& run_object) {
  const json& r = run_object.contains("run") ? run_object.at("run") : json::object();
  auto get = [&](const char* k) { return r.contains(k) ? plain(r.at(k)) : std::string("?"); };
  return get("optimizer") + ", checkpointing " + get("checkpointing") + ", batch " + get("batch") +
         ", seq " + get("seq");
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
  static const std::vector<std::string> keys = {"params",
                                                "gradients",
                                                "optimizer_states",
                                                "activations",
                                                "activations_peak",
                                                "workspace",
                                                "inputs",
                                                "sum",
                                                "peak"};
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
  if (!doc.is_object())
    bad(where, not_ours + "the document is a JSON " + std::string(doc.type_name()) +
                   ", not an object with \"schema\": \"" + report::kSchema + "\"");
  if (!doc.contains("schema"))
    bad(where, not_ours + "no \"schema\" key (trainmem's JSON reports have \"schema\": \"" +
                   report::kSchema + "\")");
  if (doc.at("schema") != report::kSchema)
    bad(where, not_ours + "its schema is " + doc.at("schema").dump() + ", not \"" +
                   report::kSchema + "\"");
  Report r;
  r.path = path;
  auto usable = [](const json& o) {
    return o.is_object() && o.contains("model") && o.contains("run") &&
           (o.contains("analytic") || o.contains("measured"));
  };
  if (doc.contains("runs")) {
    if (!doc.at("runs").is_array()) bad(where, path + ": \"runs\" is not an array");
    for (const auto& o : doc.at("runs"))
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
  if (run_object.contains("analytic") && run_object.at("analytic").is_object())
    for (auto it = run_object.at("analytic").begin(); it != run_object.at("analytic").end(); ++it)
      out.push_back(it.key());
  if (run_object.contains("measured") && run_object.at("measured").is_object() &&
      run_object.at("measured").contains("ledger") &&
      run_object.at("measured").at("ledger").is_object())
    out.push_back("measured");
  return out;
}

Side side_from_run_object(const json& ro, const std::string& profile, const std::string& where) {
  Side s;
  s.profile = profile;
  s.model = need(ro, "model", where, "the run");
  s.run = need(ro, "run", where, "the run");
  const json& layers = need(s.model, "layers", where, "model");
  if (!layers.is_number_integer() || layers.get<std::int64_t>() < 1)
    bad(where, "model.layers is " + layers.dump() + ", not a layer count (an integer >= 1)");
  s.layers = layers.get<std::int64_t>();

  const json* p = nullptr;
  std::string path;
  if (profile == "measured") {
    const json& measured = need(ro, "measured", where, "the run");
    path = "measured.ledger";
    p = &need(measured, "ledger", where, "measured");
    s.label = "the ledger of a run on the " + plain(s.run.value("backend", json("?"))) + " backend";
  } else {
    const auto names = profiles_of(ro);
    if (std::find(names.begin(), names.end(), profile) == names.end())
      bad(where, "the run holds no profile '" + profile +
                     "'; it holds: " + (names.empty() ? std::string("none") : join(names, ", ")));
    path = "analytic." + profile;
    p = &ro.at("analytic").at(profile);
    s.label = optional_string(*p, "label");
  }
  for (const auto& k : category_keys()) s.categories.push_back(need_bytes(*p, k, where, path));
  s.per_layer_bytes = need_bytes(*p, "per_layer_activations", where, path);
  if (profile == "measured") return s;

  const json& c = need(*p, "coefficients", where, path);
  const std::string cp = path + ".coefficients";
  Coefficients co;
  co.sbh = need_number(c, "sbh", where, cp);
  co.sbi = need_number(c, "sbi", where, cp);
  co.as2b = need_number(c, "as2b", where, cp);
  co.sb = need_number(c, "sb", where, cp);
  co.other_bytes = need_bytes(c, "other_bytes", where, cp);
  s.per_layer = co;

  if (!p->contains("tensors")) return s;  // per-category figures only
  const json& tensors = p->at("tensors");
  if (!tensors.is_array()) bad(where, path + ".tensors is not an array");
  s.has_tensors = true;
  for (std::size_t n = 0; n < tensors.size(); ++n) {
    const json& t = tensors[n];
    const std::string tp = path + ".tensors[" + std::to_string(n) + "]";
    Entry e;
    e.group = need_string(t, "group", where, tp);
    e.name = need_string(t, "name", where, tp);
    e.shape = optional_string(t, "shape");
    e.dtype = optional_string(t, "dtype");
    e.bytes = need_bytes(t, "bytes", where, tp);
    const std::string term = need_string(t, "term", where, tp);
    const auto parsed = parse_term(term);
    if (!parsed) bad(where, tp + ".term is '" + term + "'; allowed: sbh, sbi, as2b, sb, other");
    e.term = *parsed;
    e.coefficient = need_number(t, "coefficient", where, tp);
    e.kept_by = optional_string(t, "kept_by");
    e.why = optional_string(t, "why");
    s.entries.push_back(std::move(e));
  }
  return s;
}

Side side_from_estimate(const Estimate& e) {
  const json ro{{"schema", report::kSchema},
                {"model", report::model_json(e.model, e.param_count)},
                {"run", report::run_json(e.train, "", -1)},
                {"analytic", report::analytic_json({e})}};
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
  auto differ = [](const json& x, const json& y, const std::vector<std::string>& keys,
                   std::vector<std::string>& out) {
    for (const auto& k : keys) {
      const json vx = x.is_object() && x.contains(k) ? x.at(k) : json(nullptr);
      const json vy = y.is_object() && y.contains(k) ? y.at(k) : json(nullptr);
      if (vx != vy) out.push_back(k + ": " + plain(vx) + " vs " + plain(vy));
    }
  };
  differ(
      a.model, b.model,
      {"name", "layers", "hidden", "intermediate", "heads", "kv_heads", "vocab", "tied_embeddings"},
      r.model_differences);
  differ(a.run, b.run, {"batch", "seq", "dtype"}, r.shape_differences);
  differ(a.run, b.run, {"optimizer", "checkpointing", "attention"}, r.setup_differences);

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
      const std::uint64_t count = e.group == "layer" ? static_cast<std::uint64_t>(s.layers) : 1;
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
    return group_rank(x.name) < group_rank(y.name);
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
