// Hostile inputs as a user meets them through the CLI (issue 26, points 3-6): files that are
// not regular files (a FIFO must not block, /dev/zero must not be read without bound), a
// sparse 3 GB config, JSON with numbers out of range, duplicate keys and a 10 MB key; two
// outputs that are one file; flag values whose run time grew with their magnitude; writes
// that fail (a full device, a full filesystem, a file-size limit, a read-only folder), which
// must leave the old file or none and never a temporary one; and weights holding NaN, whose
// losses are reported as non-finite rather than dropped. Each case checks the exit code, the
// message (the flag, file or field it names) and, for writes, the folder's listing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sharded_helpers.hpp"
#include "test_cli_e2e_helpers.hpp"
#include "trainmem/base/config.hpp"

namespace trainmem::e2e {
namespace {

namespace fs = std::filesystem;

bool has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// A fresh folder for one test, removed (with anything mounted on its sub-folders unmounted
// first by their owners) when the test ends.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& leaf) {
    path = temp_path("hostile_" + leaf);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    // A folder made read-only by a test: writable again so that it can be removed.
    for (auto it = fs::recursive_directory_iterator(path, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_directory(ec))
        fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
    }
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& leaf) const { return path + "/" + leaf; }
};

// The names in a folder, sorted ("." and ".." left out; hidden files included: the atomic
// writer's temporaries are ".<leaf>.tmp-XXXXXX").
std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

std::string read_text(const std::string& path) {
  return slurp(path);
}

// A real-looking config.json (the golden tiny llama3, rope_scaling and all) for mutations.
std::string tiny_config() {
  return read_text(std::string(TRAINMEM_TEST_DATA_DIR) + "/golden_tiny_llama3_config.json");
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "the config no longer holds " << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// Runs trainmem under `timeout` (a regression that blocks fails instead of hanging the suite)
// and measures the wall time.
struct Timed {
  Result r;
  double seconds = 0;
};
Timed timed(const std::string& args, int limit_s = 20, const std::string& prefix = "") {
  const auto t0 = std::chrono::steady_clock::now();
  Timed t;
  t.r = trainmem_env(prefix + " timeout -s KILL " + std::to_string(limit_s), args);
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return t;
}

// A short profile run on the cpu backend (the writes' tests: report, timeline, dump).
const std::string kCpuFlags = "--backend cpu --batch 1 --seq 16 --steps 1 ";
const std::string kCpuRun = "profile --model tiny " + kCpuFlags;

// ---------------------------------------------------------------- 3. input files

TEST(CliE2EHostile, FifoAsModelTokensWeightsOrReportIsRefusedWithoutBlocking) {
  TempDir d("fifo");
  const std::string fifo_json = d / "config.json", fifo_bin = d / "tokens.bin",
                    fifo_st = d / "w.safetensors";
  ASSERT_EQ(::mkfifo(fifo_json.c_str(), 0600), 0) << std::strerror(errno);
  ASSERT_EQ(::mkfifo(fifo_bin.c_str(), 0600), 0) << std::strerror(errno);
  ASSERT_EQ(::mkfifo(fifo_st.c_str(), 0600), 0) << std::strerror(errno);
  struct Case {
    std::string args, flag, path;
  };
  const Case cases[] = {
      {"estimate --model '" + fifo_json + "'", "--model", fifo_json},
      {kCpuRun + "--tokens '" + fifo_bin + "'", "--tokens", fifo_bin},
      {kCpuRun + "--weights '" + fifo_st + "'", "--weights", fifo_st},
      {"diff '" + fifo_json + "' llama-7b", "diff", fifo_json},
  };
  for (const auto& c : cases) {
    // Opening a FIFO for reading waits for a writer: a regression blocks until the timeout
    // (exit 137). The refusal comes from stat, at once: well under a second plus the start.
    const Timed t = timed(c.args, 10);
    EXPECT_EQ(t.r.code, 2) << c.args << "\n" << t.r.err;
    EXPECT_LT(t.seconds, 5.0) << c.args << " took " << t.seconds << " s";
    EXPECT_TRUE(has(t.r.err, "FIFO")) << c.args << "\n" << t.r.err;
    EXPECT_TRUE(has(t.r.err, c.path)) << c.args << "\n" << t.r.err;
    if (!c.flag.empty()) {
      EXPECT_TRUE(has(t.r.err, c.flag)) << c.args << "\n" << t.r.err;
    }
    EXPECT_TRUE(t.r.out.empty()) << c.args << " wrote a report";
  }
}

TEST(CliE2EHostile, DevZeroBehindAJsonNameIsRefusedNotReadWithoutBound) {
  TempDir d("devzero");
  for (const std::string leaf : {"x.json", "tokens.bin", "w.safetensors"}) {
    ASSERT_EQ(::symlink("/dev/zero", (d / leaf).c_str()), 0) << std::strerror(errno);
  }
  struct Case {
    std::string args, flag, path;
  };
  const Case cases[] = {
      {"estimate --model '" + (d / "x.json") + "'", "--model", d / "x.json"},
      {"profile " + kCpuFlags + "--model '" + (d / "x.json") + "'", "--model", d / "x.json"},
      {kCpuRun + "--tokens '" + (d / "tokens.bin") + "'", "--tokens", d / "tokens.bin"},
      {kCpuRun + "--weights '" + (d / "w.safetensors") + "'", "--weights", d / "w.safetensors"},
  };
  for (const auto& c : cases) {
    // Before the fix: 22.7 GB RSS in 60 s. The limit on the address space makes a regression
    // fail fast instead of eating the machine.
    const Timed t = timed(c.args, 20);
    EXPECT_EQ(t.r.code, 2) << c.args << "\n" << t.r.err;
    EXPECT_LT(t.seconds, 10.0) << c.args;
    EXPECT_TRUE(has(t.r.err, "character device")) << c.args << "\n" << t.r.err;
    EXPECT_TRUE(has(t.r.err, c.path)) << c.args << "\n" << t.r.err;
    if (!c.flag.empty()) {
      EXPECT_TRUE(has(t.r.err, c.flag)) << c.args << "\n" << t.r.err;
    }
  }
}

TEST(CliE2EHostile, SparseThreeGigabyteConfigIsOverTheCapAndNotRead) {
  TempDir d("sparse");
  const std::string path = d / "config.json";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  const std::uint64_t size = 3ull << 30;
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0) << std::strerror(errno);
  ::close(fd);
  const Timed t = timed("estimate --model '" + path + "'", 20);
  EXPECT_EQ(t.r.code, 2) << t.r.err;
  EXPECT_LT(t.seconds, 10.0);
  EXPECT_TRUE(has(t.r.err, "--model " + path)) << t.r.err;
  EXPECT_TRUE(has(t.r.err, std::to_string(size) + " bytes")) << t.r.err;
  EXPECT_TRUE(has(t.r.err, "16 MiB")) << t.r.err;
  // Just over the cap is refused the same way; a config.json of 16 MiB exactly is read.
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>((16ull << 20) + 1)), 0);
  const Result over = trainmem("estimate --model '" + path + "'");
  EXPECT_EQ(over.code, 2) << over.err;
  EXPECT_TRUE(has(over.err, std::to_string((16ull << 20) + 1) + " bytes")) << over.err;
}

TEST(CliE2EHostile, NumberOutOfRangeInAConfigNamesTheFileAndTheField) {
  TempDir d("range");
  struct Case {
    std::string from, to, field;
  };
  const Case cases[] = {
      {"\"rope_theta\": 500000.0", "\"rope_theta\": 1e309", "rope_theta"},
      {"\"vocab_size\": 96", "\"vocab_size\": -1e309", "vocab_size"},
      {"\"factor\": 8.0", "\"factor\": 1e400", "rope_scaling.factor"},
  };
  for (const auto& c : cases) {
    const std::string path = d / "config.json";
    write_text(path, replaced(tiny_config(), c.from, c.to));
    const Result r = trainmem("estimate --model '" + path + "' --seq 16");
    EXPECT_EQ(r.code, 2) << c.to << "\n" << r.err;  // was exit 1, the JSON library's message
    EXPECT_TRUE(has(r.err, path)) << r.err;
    EXPECT_TRUE(has(r.err, "field " + c.field)) << r.err;
    EXPECT_TRUE(has(r.err, "out of range")) << r.err;
  }
}

TEST(CliE2EHostile, DuplicateKeysInAConfigAreRefusedNamingTheKey) {
  TempDir d("dup");
  struct Case {
    std::string from, to, field;
  };
  const Case cases[] = {
      // The last one used to win silently.
      {"\"vocab_size\": 96,", "\"vocab_size\": 96,\n  \"vocab_size\": 128,", "vocab_size"},
      {"\"factor\": 8.0,", "\"factor\": 8.0, \"factor\": 2.0,", "rope_scaling.factor"},
  };
  for (const auto& c : cases) {
    const std::string path = d / "config.json";
    write_text(path, replaced(tiny_config(), c.from, c.to));
    const Result r = trainmem("estimate --model '" + path + "' --seq 16");
    EXPECT_EQ(r.code, 2) << c.to << "\n" << r.err;
    EXPECT_TRUE(has(r.err, path)) << r.err;
    EXPECT_TRUE(has(r.err, "field " + c.field)) << r.err;
    EXPECT_TRUE(has(r.err, "twice")) << r.err;
    EXPECT_TRUE(r.out.empty());
  }
}

TEST(CliE2EHostile, TenMegabyteKeyOrStringIsNotEchoedWhole) {
  TempDir d("longkey");
  const std::string path = d / "config.json";
  const std::string huge(10'000'000, 'k');
  write_text(path, replaced(tiny_config(), "{", "{\"" + huge + "\": 1,"));
  Result r = trainmem("estimate --model '" + path + "' --seq 16");
  EXPECT_EQ(r.code, 2) << r.err.substr(0, 2000);
  EXPECT_LT(r.err.size(), 2048u) << "the key was echoed: " << r.err.size() << " bytes of stderr";
  EXPECT_TRUE(has(r.err, path)) << r.err.substr(0, 2000);
  EXPECT_TRUE(has(r.err, "10000000 characters")) << r.err.substr(0, 2000);
  EXPECT_TRUE(has(r.err, "at most 1024")) << r.err.substr(0, 2000);

  // A 10 MB string value under a real key: the field is named, the value clipped.
  write_text(path,
             replaced(tiny_config(), "\"llama\"", "\"" + std::string(10'000'000, 'l') + "\""));
  r = trainmem("estimate --model '" + path + "' --seq 16");
  EXPECT_EQ(r.code, 2) << r.err.substr(0, 2000);
  EXPECT_LT(r.err.size(), 2048u) << "the value was echoed: " << r.err.size() << " bytes";
  EXPECT_TRUE(has(r.err, "field model_type")) << r.err.substr(0, 2000);
}

// FAIL (found by tests/fuzz_cli.py, seed 26, cases 125/381/580/834; left failing for the
// source to be fixed): a valid report for `diff` carrying an extra key whose value nests a
// million arrays deep parses (the parser is iterative) but is then copied, and nlohmann's copy
// constructor recurses once per level: the stack overflows, SIGSEGV (exit 139). Under ASan the
// depth that overflows is lower. The strict parser should refuse nesting past a stated depth
// (exit 2 naming the file), whatever the kind of file.
TEST(CliE2EHostile, DeeplyNestedJsonIsRefusedNotACrash) {
  TempDir d("deep");
  const Result base = trainmem("estimate --model tiny --seq 16 --format json");
  ASSERT_EQ(base.code, 0) << base.err;
  const std::size_t depth = 1'000'000;
  const std::string nested = std::string(depth, '[') + "1" + std::string(depth, ']');
  std::string report = base.out;
  report.replace(report.find('{'), 1, "{\"nested\": " + nested + ", ");
  write_text(d / "a.json", report);
  Result r = trainmem("diff '" + (d / "a.json") + "' native");
  EXPECT_TRUE(r.code == 0 || r.code == 2)
      << "FAIL: diff of a report nesting " << depth << " deep: exit " << r.code
      << " (139: SIGSEGV, the stack overflowed)\n"
      << r.err.substr(0, 1000);
  if (r.code == 2) {
    EXPECT_TRUE(has(r.err, d / "a.json")) << r.err.substr(0, 1000);
  }

  std::string config = tiny_config();
  config.replace(config.find('{'), 1, "{\"nested\": " + nested + ", ");
  write_text(d / "config.json", config);
  r = trainmem("estimate --model '" + (d / "config.json") + "' --seq 16");
  EXPECT_TRUE(r.code == 0 || r.code == 2) << "exit " << r.code << "\n" << r.err.substr(0, 1000);
  EXPECT_LT(r.err.size(), 2048u);
}

// FAIL (found by tests/fuzz_cli.py, seed 1, case 570; left failing for the source to be
// fixed): num_hidden_layers is not bounded. A config.json with 2^40 layers makes `estimate`
// run for longer than 30 s (time linear in the layer count), `profile --backend meta` with
// 10^6 layers also runs past 30 s, and with 10^8 layers it exits 1 (std::bad_alloc). Like the
// flags, a config's sizes need bounds that keep every command's run time bounded: exit 2
// naming the file and the field (or a run that finishes in bounded time).
TEST(CliE2EHostile, HugeLayerCountInAConfigIsRefusedOrBoundedInTime) {
  TempDir d("layers");
  struct Case {
    std::string layers, command;
  };
  const Case cases[] = {
      {"1099511627776", "estimate --seq 16 --batch 1"},
      {"1099511627776", "profile --backend meta --seq 16 --batch 1 --steps 1"},
      {"100000000", "profile --backend meta --seq 16 --batch 1 --steps 1"},
      {"1000000", "profile --backend meta --seq 16 --batch 1 --steps 1"},
  };
  for (const auto& c : cases) {
    const std::string path = d / "config.json";
    write_text(path, replaced(tiny_config(), "\"num_hidden_layers\": 2",
                              "\"num_hidden_layers\": " + c.layers));
    const std::string args = c.command + " --model '" + path + "'";
    const Timed t = timed(args, 30);
    EXPECT_TRUE(t.r.code == 0 || t.r.code == 2 || t.r.code == 3)
        << "FAIL: " << c.layers << " layers: " << args << ": exit " << t.r.code
        << (t.r.code == 137 ? " (killed after 30 s)" : "") << "\n"
        << t.r.err.substr(0, 500);
    EXPECT_LT(t.seconds, 20.0) << "FAIL: " << c.layers << " layers: " << args;
    if (t.r.code == 2) {
      EXPECT_TRUE(has(t.r.err, "num_hidden_layers")) << t.r.err;
    }
  }
}

// ---------------------------------------------------------------- 4. flags

TEST(CliE2EHostile, TwoOutputsThatAreOneFileAreRefusedBeforeAnythingIsWritten) {
  TempDir d("samefile");
  const std::string x = d / "x.json";
  // A symbolic link to an existing report (the dangling case: the test below).
  write_text(x, "old report\n");
  ASSERT_EQ(::symlink("x.json", (d / "link.json").c_str()), 0);
  // Inputs the run must not overwrite.
  const std::string weights = d / "w.safetensors", tokens = d / "t.bin";
  test::write_weights_file(weights, *find_preset("tiny"), 7);
  test::write_tokens_file(tokens, 16, find_preset("tiny")->vocab, 3);
  const std::string weights_before = read_text(weights), tokens_before = read_text(tokens);
  const std::string d_json = d / "d.safetensors";
  struct Case {
    std::string args;
    std::vector<std::string> message;
  };
  const Case cases[] = {
      {kCpuRun + "--output '" + x + "' --timeline '" + x + "'",
       {"--output", "--timeline", "same file"}},
      {kCpuRun + "--output '" + x + "' --timeline '" + d.path + "/./x.json'",
       {"--output", "--timeline", "same file"}},
      {kCpuRun + "--output '" + x + "' --timeline '" + (d / "link.json") + "'",
       {"--output", "--timeline", "same file"}},
      {"profile --model tiny --backend meta --seq 16 --format json --output '" + x +
           "' --timeline '" + x + "'",
       {"--output", "--timeline", "same file"}},
      {kCpuRun + "--output '" + d_json + "' --dump '" + d_json + "'",
       {"--output", "--dump", "same file"}},
      {kCpuRun + "--weights '" + weights + "' --output '" + weights + "'",
       {"--output", "--weights", "its own input"}},
      {kCpuRun + "--weights '" + weights + "' --dump '" + weights + "'",
       {"--dump", "--weights", "its own input"}},
      {kCpuRun + "--tokens '" + tokens + "' --output '" + tokens + "'",
       {"--output", "--tokens", "its own input"}},
  };
  const std::vector<std::string> before = listing(d.path);
  for (const auto& c : cases) {
    const Result r = trainmem(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    for (const auto& m : c.message) EXPECT_TRUE(has(r.err, m)) << c.args << "\n" << r.err;
    EXPECT_EQ(listing(d.path), before) << c.args;
  }
  EXPECT_EQ(read_text(x), "old report\n") << "--output was overwritten";
  EXPECT_TRUE(fs::is_symlink(d / "link.json"));
  EXPECT_EQ(read_text(weights), weights_before) << "--weights was overwritten";
  EXPECT_EQ(read_text(tokens), tokens_before) << "--tokens was overwritten";
}

// An output path that is a symbolic link whose target does not exist yet (found while writing
// these tests; fixed in the atomic writer since): open(O_CREAT) would create the target, so
// must the atomic writer, not replace the link by a regular file; and the same-file check
// must resolve the dangling link, so `--output x.json --timeline link.json` (link.json ->
// x.json) is refused rather than writing both.
TEST(CliE2EHostile, DanglingSymlinkOutputIsFollowedAndCountsAsTheSameFile) {
  TempDir d("dangling");
  ASSERT_EQ(::symlink("x.json", (d / "link.json").c_str()), 0);
  Result r = trainmem("estimate --model tiny --seq 16 --output '" + (d / "link.json") + "'");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(d / "link.json")) << "the link was replaced by a regular file";
  EXPECT_TRUE(fs::exists(d / "x.json")) << "the link's target was not written";
  EXPECT_EQ(listing(d.path), (std::vector<std::string>{"link.json", "x.json"}));

  TempDir e("dangling2");
  ASSERT_EQ(::symlink("x.json", (e / "link.json").c_str()), 0);
  r = trainmem(kCpuRun + "--output '" + (e / "x.json") + "' --timeline '" + (e / "link.json") +
               "'");
  EXPECT_EQ(r.code, 2) << "--output x.json --timeline link.json (-> x.json, dangling) "
                          "were both written:\n"
                       << r.err;
  EXPECT_TRUE(has(r.err, "same file")) << r.err;
  EXPECT_EQ(listing(e.path), std::vector<std::string>{"link.json"});
  EXPECT_TRUE(fs::is_symlink(e / "link.json")) << "the link was replaced by a regular file";
}

TEST(CliE2EHostile, MaxbatchStepIsBoundedNotAnInternalError) {
  for (const std::string vary : {"", " --vary seq"}) {
    const std::string args =
        "maxbatch --model tiny --seq 16 --budget 1GiB --step 2147483647" + vary;
    const Timed t = timed(args, 30);
    EXPECT_EQ(t.r.code, 2) << args << "\n" << t.r.err;  // was 1, an internal precondition
    EXPECT_TRUE(has(t.r.err, "--step must be between 1 and")) << args << "\n" << t.r.err;
    EXPECT_TRUE(has(t.r.err, "2147483647")) << t.r.err;
    EXPECT_FALSE(has(t.r.err, "precondition")) << t.r.err;
  }
  const Result zero = trainmem("maxbatch --model tiny --seq 16 --budget 1GiB --step 0");
  EXPECT_EQ(zero.code, 2) << zero.err;
  EXPECT_TRUE(has(zero.err, "--step")) << zero.err;
}

TEST(CliE2EHostile, MaxbatchChecksLayoutFlagsLikeEstimate) {
  for (const std::string layout : {"--tp 2", "--zero 3", "--pp 2"}) {
    const Result m = trainmem("maxbatch --model tiny --seq 16 --budget 1GiB " + layout);
    const Result e = trainmem("estimate --model tiny --seq 16 " + layout);
    EXPECT_EQ(e.code, 2) << layout << "\n" << e.err;
    EXPECT_EQ(m.code, 2) << layout << ": maxbatch gave the single-GPU answer\n" << m.out << m.err;
    EXPECT_TRUE(m.out.empty()) << layout;
    // The same check, the same words.
    const auto last_line = [](const std::string& s) {
      const auto at = s.find("trainmem: error:");
      return at == std::string::npos ? s : s.substr(at, s.find('\n', at) - at);
    };
    EXPECT_EQ(last_line(m.err), last_line(e.err)) << layout;
    EXPECT_TRUE(has(m.err, layout.substr(0, 4))) << m.err;
  }
  // With the ranks given, maxbatch answers (fits: 0, or nothing fits: 3).
  for (const std::string layout : {"--tp 2 --world-size 2", "--zero 3 --world-size 2"}) {
    const Result m = trainmem("maxbatch --model tiny --seq 16 --budget 1GiB " + layout);
    EXPECT_TRUE(m.code == 0 || m.code == 3) << layout << "\n" << m.err;
  }
}

TEST(CliE2EHostile, PlanBoundsGpusAndGlobalBatchAndStaysFast) {
  struct Case {
    std::string args, flag, bound;
  };
  const Case cases[] = {
      {"plan --model tiny --seq 16 --gpu-memory 80GiB --global-batch 8 --gpus 9223372036854775807",
       "--gpus", "65536"},
      {"plan --model tiny --seq 16 --gpu-memory 80GiB --global-batch 8 --gpus 65537", "--gpus",
       "65536"},
      {"plan --model tiny --seq 16 --gpu-memory 80GiB --gpus 8 --global-batch 4294967296",
       "--global-batch", "16777216"},
      {"plan --model tiny --seq 16 --gpu-memory 80GiB --gpus 8 --global-batch 16777217",
       "--global-batch", "16777216"},
  };
  for (const auto& c : cases) {
    const Timed t = timed(c.args, 30);  // was over a minute, linear in the value
    EXPECT_EQ(t.r.code, 2) << c.args << "\n" << t.r.err;
    EXPECT_LT(t.seconds, 10.0) << c.args;
    EXPECT_TRUE(has(t.r.err, c.flag)) << c.args << "\n" << t.r.err;
    EXPECT_TRUE(has(t.r.err, c.bound)) << c.args << "\n" << t.r.err;
  }
  // The largest values allowed run in bounded time.
  const Timed top = timed(
      "plan --model tiny --seq 16 --gpu-memory 80GiB --gpus 65536 --global-batch 16777216", 60);
  EXPECT_EQ(top.r.code, 0) << top.r.err;
  EXPECT_LT(top.seconds, 30.0);
}

TEST(CliE2EHostile, StepsAndMicrobatchesAreBounded) {
  struct Case {
    std::string args, flag, bound;
  };
  const Case cases[] = {
      {"profile --model tiny --seq 16 --backend meta --steps 1073741824", "--steps", "10000"},
      {"profile --model tiny --seq 16 --backend meta --steps 10001", "--steps", "10000"},
      {"profile --model tiny --seq 16 --backend meta --steps 0", "--steps", "10000"},
      {"profile --model tiny --seq 16 --backend cpu --steps 1073741824", "--steps", "10000"},
      {"profile --model tiny --seq 16 --backend meta --microbatches 16385", "--microbatches",
       "16384"},
  };
  for (const auto& c : cases) {
    const Timed t = timed(c.args, 30);  // was minutes on meta
    EXPECT_EQ(t.r.code, 2) << c.args << "\n" << t.r.err;
    EXPECT_LT(t.seconds, 10.0) << c.args;
    EXPECT_TRUE(has(t.r.err, c.flag)) << c.args << "\n" << t.r.err;
    EXPECT_TRUE(has(t.r.err, c.bound)) << c.args << "\n" << t.r.err;
  }
}

TEST(CliE2EHostile, CollectiveTimeoutBelowAFloorOrAboveAWeekIsRefused) {
  for (const std::string v :
       {"1e-300", "1e-9", "0", "-1", "0.5", "604801", "nan", "inf", "1e309"}) {
    const std::string args =
        "profile --model tiny --seq 16 --backend meta --collective-timeout " + v;
    const Result r = trainmem(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "--collective-timeout")) << args << "\n" << r.err;
    EXPECT_FALSE(has(r.err, "--collective-timeout: --collective-timeout")) << r.err;
  }
  for (const std::string v : {"1", "604800"}) {
    const Result r =
        trainmem("profile --model tiny --seq 16 --backend meta --collective-timeout " + v);
    EXPECT_EQ(r.code, 0) << v << "\n" << r.err;
  }
}

// ---------------------------------------------------------------- 5. writes

// Every output through a name that is a symbolic link to /dev/full: not a regular file, so
// written in place, and the write fails with ENOSPC, which the message must say.
TEST(CliE2EHostile, WritesToAFullDeviceExitTwoSayingWhy) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  TempDir d("devfull");
  for (const std::string leaf : {"r.json", "t.json", "t.svg", "d.safetensors"})
    ASSERT_EQ(::symlink("/dev/full", (d / leaf).c_str()), 0);
  struct Case {
    std::string args, flag, path;
  };
  const Case cases[] = {
      {"estimate --model tiny --seq 16 --output /dev/full", "--output", "/dev/full"},
      {"estimate --model tiny --seq 16 --format json --output '" + (d / "r.json") + "'", "--output",
       d / "r.json"},
      {kCpuRun + "--format json --output '" + (d / "r.json") + "'", "--output", d / "r.json"},
      {kCpuRun + "--timeline '" + (d / "t.json") + "'", "--timeline", d / "t.json"},
      {kCpuRun + "--timeline '" + (d / "t.svg") + "'", "--timeline", d / "t.svg"},
      {kCpuRun + "--dump '" + (d / "d.safetensors") + "'", "--dump", d / "d.safetensors"},
  };
  const std::vector<std::string> before = listing(d.path);
  for (const auto& c : cases) {
    const Result r = trainmem(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;  // --timeline was 1, with no reason
    EXPECT_TRUE(has(r.err, "No space left on device")) << c.args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, c.flag + ": " + c.path)) << c.args << "\n" << r.err;
    EXPECT_EQ(listing(d.path), before) << c.args;
    EXPECT_TRUE(fs::is_symlink(c.path) || c.path == "/dev/full") << "the link was replaced";
  }
}

// Writes that fail half way on a regular file. Without root: a file-size limit (ulimit -f,
// SIGXFSZ ignored), so write(2) fails with EFBIG after the first blocks. The old file stays
// whole, no temporary file is left.
TEST(CliE2EHostile, AWriteThatFailsHalfWayLeavesTheOldFileOrNone) {
  TempDir d("fsize");
  const std::string old_report = d / "r.json";
  write_text(old_report, "old report\n");
  struct Case {
    std::string args, flag, path;
  };
  const Case cases[] = {
      {kCpuRun + "--format json --output '" + old_report + "'", "--output", old_report},
      {kCpuRun + "--timeline '" + (d / "t.json") + "'", "--timeline", d / "t.json"},
      {kCpuRun + "--timeline '" + (d / "t.svg") + "'", "--timeline", d / "t.svg"},
      {kCpuRun + "--dump '" + (d / "d.safetensors") + "'", "--dump", d / "d.safetensors"},
  };
  for (const auto& c : cases) {
    // 16 blocks (8 KiB in dash, 16 KiB in bash): the report (~77 KB), timeline (~39 KB) and
    // dump (~470 KB) do not fit; stdout and stderr do.
    const Result r = trainmem_env("trap '' XFSZ; ulimit -f 16;", c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "File too large")) << c.args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, c.flag)) << c.args << "\n" << r.err;
    EXPECT_EQ(listing(d.path), std::vector<std::string>{"r.json"}) << c.args;
    EXPECT_EQ(read_text(old_report), "old report\n") << c.args << ": the old report was touched";
  }
}

// A tmpfs too small for the outputs: the real "full disk" (root and mount(2) only; skipped,
// saying why, elsewhere: the file-size limit above covers the same path without root).
struct SmallTmpfs {
  std::string dir;
  bool mounted = false;
  std::string why;
  SmallTmpfs(const std::string& path, const std::string& options) : dir(path) {
    fs::create_directories(dir);
    if (::geteuid() != 0) {
      why = "not root";
      return;
    }
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      why = std::string("mount -t tmpfs -o ") + options + ": " + std::strerror(errno);
      return;
    }
    mounted = true;
  }
  bool remount_read_only() {
    return ::mount("tmpfs", dir.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, nullptr) == 0;
  }
  ~SmallTmpfs() {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
  }
};

TEST(CliE2EHostile, AFullFilesystemLeavesTheOldFileOrNoneAndSaysWhy) {
  TempDir d("tmpfs");
  SmallTmpfs small(d / "full", "size=16k");
  if (!small.mounted) GTEST_SKIP() << "no tmpfs: " << small.why;
  const std::string old_report = small.dir + "/r.json";
  write_text(old_report, "old report\n");
  struct Case {
    std::string args, flag, path;
  };
  const Case cases[] = {
      {"estimate --model tiny-llama3 --seq 16 --format json --output '" + old_report + "'",
       "--output", old_report},
      {kCpuRun + "--format json --output '" + old_report + "'", "--output", old_report},
      {kCpuRun + "--timeline '" + small.dir + "/t.json'", "--timeline", small.dir + "/t.json"},
      {kCpuRun + "--timeline '" + small.dir + "/t.svg'", "--timeline", small.dir + "/t.svg"},
      {kCpuRun + "--dump '" + small.dir + "/d.safetensors'", "--dump",
       small.dir + "/d.safetensors"},
  };
  for (const auto& c : cases) {
    const Result r = trainmem(c.args);
    if (c.args.rfind("estimate", 0) == 0 && r.code == 0) {
      // estimate's report may fit in 16 KiB: then it was written whole.
      EXPECT_NE(read_text(old_report), "old report\n");
      EXPECT_NO_THROW(EXPECT_FALSE(json::parse(read_text(old_report)).is_discarded()));
      write_text(old_report, "old report\n");
      continue;
    }
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "No space left on device")) << c.args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, c.flag)) << c.args << "\n" << r.err;
    EXPECT_EQ(listing(small.dir), std::vector<std::string>{"r.json"}) << c.args;
    EXPECT_EQ(read_text(old_report), "old report\n") << c.args << ": the old report was touched";
  }
}

// A read-only folder: a read-only tmpfs as root (root ignores permissions), mode 0555
// otherwise. Refused with the OS's reason, nothing created, the old file untouched.
TEST(CliE2EHostile, AReadOnlyFolderIsRefusedAndLeavesNoTemporaryFile) {
  TempDir d("readonly");
  const std::string ro = d / "ro";
  std::unique_ptr<SmallTmpfs> mounted;
  if (::geteuid() == 0) {
    mounted = std::make_unique<SmallTmpfs>(ro, "size=64k");
    if (!mounted->mounted) GTEST_SKIP() << "root, and no tmpfs to make read-only: " << mounted->why;
    write_text(ro + "/r.json", "old report\n");
    ASSERT_TRUE(mounted->remount_read_only()) << std::strerror(errno);
  } else {
    fs::create_directories(ro);
    write_text(ro + "/r.json", "old report\n");
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                            fs::perms::group_exec | fs::perms::others_read |
                            fs::perms::others_exec);
  }
  struct Case {
    std::string args, flag;
  };
  const Case cases[] = {
      {"estimate --model tiny --seq 16 --output '" + ro + "/r.json'", "--output"},
      {"estimate --model tiny --seq 16 --output '" + ro + "/new.json'", "--output"},
      {kCpuRun + "--format json --output '" + ro + "/r.json'", "--output"},
      {kCpuRun + "--timeline '" + ro + "/t.json'", "--timeline"},
      {kCpuRun + "--dump '" + ro + "/d.safetensors'", "--dump"},
  };
  for (const auto& c : cases) {
    const Result r = trainmem(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, c.flag)) << c.args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "Read-only file system") || has(r.err, "Permission denied"))
        << c.args << "\n"
        << r.err;
    EXPECT_EQ(listing(ro), std::vector<std::string>{"r.json"}) << c.args;
    EXPECT_EQ(read_text(ro + "/r.json"), "old report\n") << c.args;
  }
}

// A successful write leaves exactly the file (no temporary beside it), readable like any file
// the user creates.
TEST(CliE2EHostile, ASuccessfulWriteLeavesOnlyItsFile) {
  TempDir d("ok");
  write_text(d / "r.json", "old report\n");
  const Result r =
      trainmem(kCpuRun + "--format json --output '" + (d / "r.json") + "' --timeline '" +
               (d / "t.svg") + "' --dump '" + (d / "d.safetensors") + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(listing(d.path), (std::vector<std::string>{"d.safetensors", "r.json", "t.svg"}));
  EXPECT_NO_THROW(EXPECT_FALSE(json::parse(read_text(d / "r.json")).is_discarded()));
  const auto perms = fs::status(d / "r.json").permissions();
  EXPECT_NE(perms & fs::perms::owner_read, fs::perms::none);
}

// ---------------------------------------------------------------- 6. numbers

TEST(CliE2EHostile, WeightsHoldingNaNAreReportedAsNonFiniteNotDropped) {
  TempDir d("nan");
  const std::string weights = d / "w.safetensors";
  test::write_weights_file(weights, *find_preset("tiny"), 11);
  // One tensor's first elements set to NaN, in place in the file's data section.
  const std::string victim = "model.layers.0.mlp.up_proj.weight";
  {
    std::string bytes = read_text(weights);
    ASSERT_GT(bytes.size(), 8u);
    std::uint64_t header = 0;
    std::memcpy(&header, bytes.data(), 8);
    const json h = json::parse(bytes.substr(8, header));
    ASSERT_TRUE(h.contains(victim)) << h.dump();
    ASSERT_EQ(h[victim]["dtype"], "F32");
    const std::uint64_t begin = h[victim]["data_offsets"][0].get<std::uint64_t>();
    const float nan = std::nanf("");
    for (int i = 0; i < 3; ++i) std::memcpy(bytes.data() + 8 + header + begin + 4 * i, &nan, 4);
    write_text(weights, bytes);
  }
  const std::string report = d / "r.json";
  const Result r = trainmem(kCpuRun.substr(0, kCpuRun.find("--steps")) + "--steps 2 --weights '" +
                            weights + "' --format json --output '" + report + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "[warning]")) << r.err;
  EXPECT_TRUE(has(r.err, victim)) << "the warning names the tensor:\n" << r.err;
  EXPECT_TRUE(has(r.err, "NaN")) << r.err;
  const json j = json::parse(read_text(report));
  ASSERT_TRUE(j.contains("run")) << j.dump().substr(0, 500);
  const json& run = j["run"];
  ASSERT_TRUE(run.contains("losses"));
  ASSERT_EQ(run["losses"].size(), 2u) << run["losses"].dump();
  for (const auto& l : run["losses"]) EXPECT_EQ(l, "non_finite") << run["losses"].dump();
  ASSERT_TRUE(run.contains("non_finite")) << "run.non_finite is missing";
  EXPECT_EQ(run["non_finite"]["steps"], json::array({1, 2})) << run["non_finite"].dump();
  EXPECT_TRUE(has(run["non_finite"].dump(), victim)) << run["non_finite"].dump();
  EXPECT_EQ(listing(d.path), (std::vector<std::string>{"r.json", "w.safetensors"}));

  // The table says so too, not a blank loss line.
  const Result table = trainmem(kCpuRun + "--weights '" + weights + "'");
  EXPECT_EQ(table.code, 0) << table.err;
  EXPECT_TRUE(has(table.out + table.err, "NaN") || has(table.out + table.err, "non-finite") ||
              has(table.out + table.err, "not finite"))
      << table.out << table.err;
}

}  // namespace
}  // namespace trainmem::e2e
