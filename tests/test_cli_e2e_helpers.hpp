// Helpers for the end-to-end CLI tests: run the built `trainmem` binary (TRAINMEM_BINARY)
// with arguments, capture exit code, stdout and stderr; parse CSV and Markdown tables back;
// temporary paths; and the native plan's per-layer bytes written out independently of the
// analytic model (docs/native-plan.md).
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace trainmem::e2e {

using json = nlohmann::json;

inline std::string temp_path(const std::string& leaf) {
  return (std::filesystem::temp_directory_path() /
          ("trainmem_e2e_" + std::to_string(::getpid()) + "_" + leaf))
      .string();
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Result {
  int code = -1;
  std::string out, err;
  json j() const { return json::parse(out); }
};

// Runs the shell command `prefix 'TRAINMEM_BINARY' args` with stdout and stderr redirected to
// files (so neither is a terminal: no colour, no progress bar). The OpenMP team size is the
// caller's environment (tools/test.sh fixes it; results do not depend on it). `prefix` may set
// the environment or change folder ("cd X &&").
inline Result run_redirected(const std::string& prefix, const std::string& args) {
  static int counter = 0;
  const std::string tag = std::to_string(counter++);
  const std::string out = temp_path("out" + tag), err = temp_path("err" + tag);
  const std::string cmd =
      prefix + " '" + TRAINMEM_BINARY + "' " + args + " >'" + out + "' 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  return r;
}

// The report without its wall-clock figures (every key containing "seconds" or
// "recompute_cost", at any depth: they differ between any two runs). With `losses`, the
// "losses" arrays are taken out too and appended there, for a toleranced comparison.
inline json without_timings(const json& j, std::vector<double>* losses = nullptr) {
  if (j.is_object()) {
    json out = json::object();
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& k = it.key();
      if (k.find("seconds") != std::string::npos || k.find("recompute_cost") != std::string::npos)
        continue;
      if (losses && k == "losses" && it.value().is_array()) {
        for (const auto& l : it.value()) losses->push_back(l.is_number() ? l.get<double>() : NAN);
        continue;
      }
      out[k] = without_timings(it.value(), losses);
    }
    return out;
  }
  if (j.is_array()) {
    json out = json::array();
    for (const auto& e : j) out.push_back(without_timings(e, losses));
    return out;
  }
  return j;
}

// Runs `trainmem <args>`; `env`: extra environment assignments ("NAME=value ...").
inline Result trainmem_env(const std::string& env, const std::string& args) {
  return run_redirected(env, args);
}

inline Result trainmem(const std::string& args) {
  return trainmem_env("", args);
}

// RFC 4180 CSV: rows of fields (quoted fields may hold commas, quotes and newlines).
inline std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, any = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"') {
      quoted = true;
      any = true;
    } else if (c == ',') {
      row.push_back(field);
      field.clear();
      any = true;
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      if (any || !field.empty()) {
        row.push_back(field);
        rows.push_back(row);
      }
      row.clear();
      field.clear();
      any = false;
    } else {
      field += c;
      any = true;
    }
  }
  if (any || !field.empty()) {
    row.push_back(field);
    rows.push_back(row);
  }
  return rows;
}

// The GitHub-Markdown tables of a document: each as rows of trimmed cells (header first,
// the |---| row dropped). Fails the test when a table's rows differ in cell count or the
// alignment row is missing.
inline std::vector<std::vector<std::vector<std::string>>> parse_markdown_tables(
    const std::string& text) {
  std::vector<std::vector<std::vector<std::string>>> tables;
  std::istringstream in(text);
  std::string line;
  std::vector<std::vector<std::string>> cur;
  auto cells_of = [](const std::string& l) {
    std::vector<std::string> cells;
    std::string cell;
    for (std::size_t i = 1; i < l.size(); ++i) {
      if (l[i] == '|') {
        const auto b = cell.find_first_not_of(' '), e = cell.find_last_not_of(' ');
        cells.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
        cell.clear();
      } else {
        cell += l[i];
      }
    }
    return cells;
  };
  auto flush = [&] {
    if (!cur.empty()) tables.push_back(cur);
    cur.clear();
  };
  bool expect_rule = false;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '|') {
      flush();
      continue;
    }
    auto cells = cells_of(line);
    if (cur.empty()) {
      cur.push_back(cells);
      expect_rule = true;
      continue;
    }
    if (expect_rule) {
      expect_rule = false;
      for (const auto& c : cells)
        if (c.find("---") == std::string::npos) ADD_FAILURE() << "bad alignment row: " << line;
      if (cells.size() != cur.front().size()) ADD_FAILURE() << "alignment row width: " << line;
      continue;
    }
    if (cells.size() != cur.front().size()) ADD_FAILURE() << "ragged markdown row: " << line;
    cur.push_back(cells);
  }
  flush();
  return tables;
}

// Splits a text-table line into cells separated by two or more spaces.
inline std::vector<std::string> split_columns(const std::string& line) {
  std::vector<std::string> out;
  std::size_t i = line.find_first_not_of(' ');
  while (i != std::string::npos && i < line.size()) {
    std::size_t j = line.find("  ", i);
    if (j == std::string::npos) j = line.size();
    out.push_back(line.substr(i, j - i));
    i = line.find_first_not_of(' ', j);
  }
  return out;
}

// The lines of the text table whose header line starts with `header_start`: header first,
// then rows up to the first empty line or the first line with a different number of cells
// (rules of '-' dropped).
inline std::vector<std::string> text_table(const std::string& text,
                                           const std::string& header_start) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  bool on = false;
  while (std::getline(in, line)) {
    if (!on && line.rfind(header_start, 0) == 0) on = true;
    if (!on) continue;
    if (line.empty()) break;
    if (line.find_first_not_of('-') == std::string::npos) continue;
    if (!out.empty() && split_columns(line).size() != split_columns(out.front()).size()) break;
    out.push_back(line);
  }
  return out;
}

// Per-layer activation bytes of the native plan, from docs/native-plan.md: xn1, q, attn_out,
// h_mid, xn2, out at w·s·b·h; k, v at w·s·b·(k·h/a); gate, up, act at w·s·b·i; eager probs at
// w·a·s²·b (flash: lse, 4·a·s·b); rstd1, rstd2 at 4·s·b.
inline std::uint64_t native_layer_bytes(const json& model, std::uint64_t b, std::uint64_t s,
                                        std::uint64_t w, bool eager) {
  const std::uint64_t h = model["hidden"], i = model["intermediate"], a = model["heads"],
                      k = model["kv_heads"];
  const std::uint64_t kd = k * (h / a);
  return 6 * w * s * b * h + 2 * w * s * b * kd + 3 * w * s * b * i +
         (eager ? w * a * s * s * b : 4 * a * s * b) + 8 * s * b;
}

}  // namespace trainmem::e2e
