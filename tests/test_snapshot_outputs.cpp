// The outputs of a fixed list of commands (tests/data/snapshots/commands.txt: estimate, profile,
// compare, sweep, maxbatch on cpu and meta, every attention and checkpointing mode, --explain,
// every format) must not change unless a change means them to: a restructuring of the code has
// to leave them byte-identical, apart from these documented fields of the JSON reports:
// - wall-clock figures (every key containing "seconds", and "recompute_cost"), removed;
// - losses of cpu runs (run.losses), compared to a relative 1e-5 in fp32 and 2e-3 in 16-bit:
//   they are real arithmetic whose last bits depend on the GEMM kernel the CPU gets (OpenBLAS
//   picks it by core type; bf16 products take AVX512-BF16 where the CPU has it), and a 16-bit
//   run rounds each of those differences to its own precision.
// Text, Markdown and CSV snapshots are compared byte for byte (none of them holds a timing).
// TRAINMEM_UPDATE_SNAPSHOTS=1 rewrites the expected files instead of comparing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "test_cli_e2e_helpers.hpp"

namespace trainmem::e2e {
namespace {

struct Snapshot {
  std::string name, args;
};

void PrintTo(const Snapshot& s, std::ostream* os) {
  *os << s.args;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::string snapshot_dir() {
  return std::string(TRAINMEM_TEST_DATA_DIR) + "/snapshots";
}

std::vector<Snapshot> load_snapshots() {
  std::vector<Snapshot> out;
  std::ifstream in(snapshot_dir() + "/commands.txt");
  std::string line;
  while (std::getline(in, line)) {
    if (trim(line).empty() || trim(line)[0] == '#') continue;
    const auto bar = line.find('|');
    if (bar == std::string::npos) continue;
    out.push_back({trim(line.substr(0, bar)), trim(line.substr(bar + 1))});
  }
  return out;
}

class SnapshotOutputs : public ::testing::TestWithParam<Snapshot> {};

TEST_P(SnapshotOutputs, Unchanged) {
  const Snapshot& s = GetParam();
  const Result r = trainmem_env("OMP_DYNAMIC=false", s.args);
  ASSERT_EQ(r.code, 0) << s.args << "\n" << r.err;
  const std::string path = snapshot_dir() + "/" + s.name + ".out";
  if (std::getenv("TRAINMEM_UPDATE_SNAPSHOTS")) {
    std::ofstream(path, std::ios::binary) << r.out;
    GTEST_SKIP() << "TRAINMEM_UPDATE_SNAPSHOTS set: wrote " << path;
  }
  const std::string expected = slurp(path);
  ASSERT_FALSE(expected.empty()) << "no snapshot " << path
                                 << " (TRAINMEM_UPDATE_SNAPSHOTS=1 writes it)";
  const bool is_json = s.args.find("--format json") != std::string::npos;
  if (!is_json) {
    EXPECT_EQ(r.out, expected) << s.args;
    return;
  }
  std::vector<double> got_losses, want_losses;
  const json got = without_timings(json::parse(r.out), &got_losses);
  const json want = without_timings(json::parse(expected), &want_losses);
  if (got != want) {
    const json d = json::diff(want, got);
    ADD_FAILURE() << s.args << "\nfirst difference: " << d.at(0).dump() << " (" << d.size()
                  << " in all)";
  }
  ASSERT_EQ(got_losses.size(), want_losses.size());
  for (std::size_t i = 0; i < got_losses.size(); ++i) {
    if (std::isnan(want_losses[i])) {
      EXPECT_TRUE(std::isnan(got_losses[i])) << "loss " << i;
    } else {
      const double rel = s.args.find("--dtype fp32") != std::string::npos ? 1e-5 : 2e-3;
      EXPECT_NEAR(got_losses[i], want_losses[i], rel * std::fabs(want_losses[i])) << "loss " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Commands, SnapshotOutputs, ::testing::ValuesIn(load_snapshots()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace trainmem::e2e
