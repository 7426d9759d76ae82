// The documentation against the binary: every `$ trainmem ...` example in README.md and
// docs/faq.md prints the lines the page shows (in order; "..." elides), and every command
// line of README.md's fenced blocks runs. Runs that need no GPU are forced onto the meta
// backend, as the pages show them (on a GPU `auto` would pick cuda). Timing columns of cpu
// runs vary from run to run: rows are compared up to the `native` column.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include "test_cli_e2e_helpers.hpp"

namespace trainmem::e2e {
namespace {

const std::string kRoot = std::string(TRAINMEM_TEST_DATA_DIR) + "/../..";

std::string rstrip(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(rstrip(line));
  return out;
}

struct Example {
  std::string page;
  std::string command;                // after "trainmem "
  std::vector<std::string> expected;  // shown output lines, "..." and blanks dropped
};

// The fenced blocks of a Markdown page, as lines.
std::vector<std::vector<std::string>> fenced_blocks(const std::string& page) {
  std::vector<std::vector<std::string>> blocks;
  std::vector<std::string> cur;
  bool in = false;
  for (const auto& l : lines_of(slurp(kRoot + "/" + page))) {
    if (l.rfind("```", 0) == 0) {
      if (in) blocks.push_back(cur);
      cur.clear();
      in = !in;
      continue;
    }
    if (in) cur.push_back(l);
  }
  return blocks;
}

std::vector<Example> examples(const std::string& page) {
  std::vector<Example> out;
  for (const auto& b : fenced_blocks(page)) {
    if (b.empty() || b[0].rfind("$ trainmem ", 0) != 0) continue;
    Example e{page, b[0].substr(std::string("$ trainmem ").size()), {}};
    for (std::size_t k = 1; k < b.size(); ++k)
      if (!b[k].empty() && b[k] != "...") e.expected.push_back(b[k]);
    out.push_back(e);
  }
  return out;
}

bool has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// profile, compare and sweep without --backend run on meta here, as documented without a GPU.
std::string pinned(const std::string& command) {
  const bool runs = command.rfind("profile", 0) == 0 || command.rfind("compare", 0) == 0 ||
                    command.rfind("sweep", 0) == 0;
  return runs && !has(command, "--backend") ? command + " --backend meta" : command;
}

Result run_in_root(const std::string& command) {
  return run_redirected("cd '" + kRoot + "' &&", command);
}

// A table row of a cpu run up to its `native` cell ("yes"): the step-time columns after it
// differ from run to run.
std::string untimed(const std::string& line) {
  const auto at = line.find("  yes  ");
  return at == std::string::npos ? line : line.substr(0, at + 5);
}

void check_example(const Example& e) {
  SCOPED_TRACE(e.page + ": trainmem " + e.command);
  const Result r = run_in_root(pinned(e.command));
  ASSERT_EQ(r.code, 0) << r.err;
  const bool timed = has(e.command, "--backend cpu");
  const auto actual = lines_of(r.out);
  std::size_t from = 0;
  for (const auto& want : e.expected) {
    const std::string w = timed ? untimed(want) : want;
    std::size_t k = from;
    while (k < actual.size() && (timed ? untimed(actual[k]) : actual[k]) != w) ++k;
    if (k == actual.size()) {
      ADD_FAILURE() << "the page shows a line the command does not print (in this order):\n"
                    << want << "\n--- actual output:\n"
                    << r.out;
      return;
    }
    from = k + 1;
  }
}

TEST(CliDocs, ReadmeExamplesPrintWhatTheReadmeShows) {
  const auto ex = examples("README.md");
  ASSERT_GE(ex.size(), 1u) << "README.md shows no `$ trainmem` example";
  for (const auto& e : ex) check_example(e);
}

TEST(CliDocs, FaqExamplesPrintWhatTheFaqShows) {
  const auto ex = examples("docs/faq.md");
  ASSERT_GE(ex.size(), 5u);
  for (const auto& e : ex) check_example(e);
}

// The tour's command lines (continuations joined, comments dropped) all run. Files they
// write go to a temporary folder.
TEST(CliDocs, ReadmeCommandLinesRun) {
  std::vector<std::string> commands;
  for (const auto& b : fenced_blocks("README.md")) {
    if (!b.empty() && b[0].rfind("$ ", 0) == 0) continue;  // an example with its output
    std::string pending;
    for (auto l : b) {
      if (!pending.empty()) {
        l = pending + " " + l.substr(l.find_first_not_of(' '));
        pending.clear();
      }
      if (l.rfind("trainmem ", 0) != 0) continue;
      if (!l.empty() && l.back() == '\\') {
        pending = rstrip(l.substr(0, l.size() - 1));
        continue;
      }
      const auto hash = l.find(" #");
      if (hash != std::string::npos) l = rstrip(l.substr(0, hash));
      if (has(l, "[") || has(l, "|")) continue;  // the synopsis, not a command
      commands.push_back(l.substr(std::string("trainmem ").size()));
    }
  }
  ASSERT_GE(commands.size(), 8u);
  const std::string dir = temp_path("readme_files");
  std::filesystem::create_directories(dir);
  for (auto c : commands) {
    const auto t = c.find("--timeline ");
    if (t != std::string::npos) {
      const auto end = c.find(' ', t + 11);
      c = c.substr(0, t) + "--timeline '" + dir + "/" + c.substr(t + 11, end - t - 11) + "'" +
          (end == std::string::npos ? "" : c.substr(end));
    }
    SCOPED_TRACE("trainmem " + c);
    const Result r = run_in_root(pinned(c));
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_FALSE(r.out.empty());
  }
  std::filesystem::remove_all(dir);
}

// docs/formulas.md's worked example (LLaMA-7B, b 8, s 512, fp16, AdamW) against the binary
// and against the per-layer lists written out here from the page's own tables.
TEST(CliDocs, FormulasWorkedExampleMatchesEstimate) {
  const Result r =
      run_in_root("estimate --model llama-7b --batch 8 --seq 512 --dtype fp16 --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  const std::uint64_t b = 8, s = 512, h = 4096, i = 11008, a = 32, L = 32, V = 32000, d = h / a;
  const std::uint64_t sbh = s * b * h, sbi = s * b * i, as2b = a * s * s * b, sb = s * b;
  // Parameters: embed, 32 × (2 norms, q k v o, gate up down), final norm, untied head.
  const std::uint64_t P = V * h + L * (2 * h + 4 * h * h + 3 * h * i) + h + V * h;
  EXPECT_EQ(P, 6738415616u);
  EXPECT_EQ(j["model"]["params"].get<std::uint64_t>(), P);
  const std::map<std::string, std::uint64_t> per_layer = {
      {"zero", 24 * sbh},
      {"megatron", 34 * sbh + 5 * as2b},
      {"native", 16 * sbh + 6 * sbi + 2 * as2b + 8 * sb},
      {"hf-eager", 40 * sbh + 8 * sbi + 8 * as2b + 8 * sb + 4 * s * d + 4}};
  // Outside the layers: native embed_out, final norm out, 1/rms, logits, lse; hf-eager the
  // final norm's five tensors, its 1/rms, lm_head's input, the log-softmax, labels, weight,
  // and the (b,s,V) logits the training loop holds.
  const std::map<std::string, std::uint64_t> outside = {
      {"zero", 0},
      {"megatron", 0},
      {"native", 2 * sbh + 2 * sbh + 4 * sb + 2 * sb * V + 4 * sb},
      {"hf-eager", (2 + 4 + 4 + 4) * sbh + 4 * sb + 2 * sbh + 2 * b * (s - 1) * V +
                       8 * b * (s - 1) + 2 + 2 * sb * V}};
  // The page's worked-example table: "| profile | c_sbh | ... | per layer | X | activations |".
  std::map<std::string, std::vector<std::string>> page;
  bool in_example = false;
  for (const auto& l : lines_of(slurp(kRoot + "/docs/formulas.md"))) {
    if (l.rfind("## Worked example", 0) == 0) in_example = true;
    if (!in_example || l.rfind("| ", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream in(l.substr(1));
    std::string c;
    while (std::getline(in, c, '|')) {
      const auto f = c.find_first_not_of(' '), e = c.find_last_not_of(' ');
      cells.push_back(f == std::string::npos ? "" : c.substr(f, e - f + 1));
    }
    if (per_layer.count(cells[0]) && !page.count(cells[0])) page[cells[0]] = cells;
  }
  ASSERT_EQ(page.size(), 4u) << "the worked example's table was not found";
  for (const auto& [name, bytes] : per_layer) {
    SCOPED_TRACE(name);
    const json& an = j["analytic"][name];
    EXPECT_EQ(an["per_layer_activations"].get<std::uint64_t>(), bytes);
    EXPECT_EQ(an["activations"].get<std::uint64_t>(), L * bytes + outside.at(name));
    std::string shown = page[name][6];
    shown.erase(std::remove(shown.begin(), shown.end(), ','), shown.end());
    EXPECT_EQ(shown, std::to_string(bytes)) << "per layer on the page";
    char gib[32];
    std::snprintf(gib, sizeof gib, "**%.2f GiB**",
                  double(L * bytes + outside.at(name)) / (1u << 30));
    EXPECT_EQ(page[name][8], gib) << "activations on the page";
  }
  // The peak of native: head backward step 2 (params, gradients, states, inputs, the 32 MiB
  // GEMM workspace, activations but the 4·sb loss buffer, d_final_norm_out).
  EXPECT_EQ(j["analytic"]["native"]["peak"].get<std::uint64_t>(),
            2 * P + 2 * P + 12 * P + 8 * sb + (32u << 20) +
                (L * per_layer.at("native") + outside.at("native") - 4 * sb) + 2 * sbh);
}

}  // namespace
}  // namespace trainmem::e2e
