// End to end, as a user meets them: flags that are not integers, sizes past 64 bits, paths
// that cannot be written, a backend that cannot run the step here, a model folder; what a
// failed run in compare and sweep reports; the warnings sweep and maxbatch give about --seq;
// host memory on the meta backend; log lines beside the progress bar on a terminal.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>

#include "test_cli_e2e_helpers.hpp"

namespace trainmem::e2e {
namespace {

bool has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

struct BadInput {
  std::string args;
  std::vector<std::string> message;  // every piece must appear on stderr
};

TEST(CliE2EInput, NonIntegersAndOverflowsNameTheFlagAndWhatIsAllowed) {
  const BadInput cases[] = {
      {"estimate --model tiny --batch abc",
       {"trainmem: error: --batch: 'abc' is not an integer", "an integer >= 1",
        "trainmem estimate --help"}},
      {"estimate --model tiny --batch 4.5", {"--batch: '4.5' is not an integer"}},
      {"estimate --model tiny --seq 1e3", {"--seq: '1e3' is not an integer", ">= 2"}},
      {"estimate --model tiny --batch 99999999999999999999",
       {"--batch: '99999999999999999999' is not an integer"}},
      // 10^12 sequences of llama-7b: every figure is past 2^64 bytes.
      {"estimate --model llama-7b --batch 1000000000000",
       {"--batch 1000000000000, --seq 512", "do not fit 64-bit", "smaller --batch or --seq"}},
      {"profile --model tiny --seq 16 --backend meta --seed -1",
       {"--seed: '-1'", "0 to 18446744073709551615"}},
      {"profile --model tiny --seq 16 --backend meta --steps two",
       {"--steps: 'two' is not an integer"}},
      {"maxbatch --model tiny --budget 1GiB --step x", {"--step: 'x' is not an integer"}},
      {"profile --model tiny --seq 16 --backend meta --device-budget -5",
       {"--device-budget", "negative"}},
      {"sweep --model tiny --seq 1", {"--seq: '1'"}},
  };
  for (const auto& c : cases) {
    const Result r = trainmem(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    for (const auto& m : c.message) EXPECT_TRUE(has(r.err, m)) << c.args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args << " wrote a report: " << r.out;
  }
  // The example a refusal suggests must itself be valid.
  const Result r = trainmem("sweep --model tiny --seq 1");
  EXPECT_FALSE(has(r.err, "--seq 1,2,4")) << r.err;
}

// The HF step's recipe flags: unknown values, a profile that has no HF step, and what the
// event sequence does not model are refused naming the flag (exit 2, no report).
TEST(CliE2EInput, HfStepRecipeFlagsNameWhatIsAllowed) {
  const BadInput cases[] = {
      {"estimate --model tiny --profile hf-sdpa --precision half",
       {"--precision: unknown recipe 'half'", "pure, amp, mixed"}},
      {"estimate --model tiny --profile hf-sdpa --adamw-impl apex",
       {"--adamw-impl: unknown implementation 'apex'", "foreach, fused, forloop"}},
      {"estimate --model tiny --profile native --precision amp",
       {"--precision: applies to the HF step", "hf-eager or hf-sdpa"}},
      {"estimate --model tiny --profile zero --adamw-impl fused", {"--adamw-impl: applies"}},
      {"estimate --model tiny --profile hf-sdpa --precision amp --dtype fp32",
       {"--precision amp needs a 16-bit --dtype"}},
      {"estimate --model tiny --profile hf-sdpa --precision pure --optimizer sgd",
       {"--optimizer", "torch.optim.AdamW only"}},
      {"estimate --model tiny --profile hf-eager --hf-version 4.30 --precision pure",
       {"--hf-version", "5.25 only"}},
  };
  for (const auto& c : cases) {
    const Result r = trainmem(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    for (const auto& m : c.message) EXPECT_TRUE(has(r.err, m)) << c.args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args << " wrote a report: " << r.out;
  }
}

TEST(CliE2EInput, UnwritablePathsAreRefusedBeforeTheRunWritesAnything) {
  const std::string dump = temp_path("first.safetensors");
  std::remove(dump.c_str());
  const std::string run =
      "profile --model tiny --batch 1 --seq 16 --backend cpu --steps 1 --dump '" + dump + "' ";
  Result r = trainmem(run + "--timeline /nonexistent-dir/t.svg");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--timeline: cannot open /nonexistent-dir/t.svg")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dump)) << "the run went ahead and wrote --dump";
  r = trainmem(run + "--output /nonexistent-dir/report.txt");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--output")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dump)) << "the run went ahead and wrote --dump";
  r = trainmem(run + "--output /tmp");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--output: /tmp is a directory")) << r.err;
  std::remove(dump.c_str());

  r = trainmem(
      "profile --model tiny --batch 1 --seq 16 --backend cpu --dump "
      "/nonexistent-dir/g.safetensors");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--dump: cannot open /nonexistent-dir/g.safetensors")) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;

  // compare writes one timeline per run, next to the name given.
  r = trainmem(
      "compare --model tiny --batch 1 --seq 16 --backend meta --timeline /nonexistent-dir/t.svg");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--timeline: cannot open /nonexistent-dir/t-ckpt-none.svg")) << r.err;

  // A write that fails after the file opened (a full disk) is bad input too, not a crash.
  if (std::filesystem::exists("/dev/full")) {
    r = trainmem("estimate --model tiny --seq 16 --output /dev/full");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(has(r.err, "--output: /dev/full: writing failed: No space left on device"))
        << r.err;
  }
}

// Without a device: the cpu-only build has none; on a GPU machine TRAINMEM_FORCE_NO_DEVICE=1
// makes the device probe report none (docs/gpu.md), so the test runs everywhere.
TEST(CliE2EInput, CudaWithoutADeviceIsBadInputNamingTheAlternatives) {
  const auto trainmem = [](const std::string& args) {
    return trainmem_env("TRAINMEM_FORCE_NO_DEVICE=1", args);
  };
  Result r = trainmem("profile --model tiny --seq 16 --backend cuda");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--backend cuda: no usable CUDA device")) << r.err;
  EXPECT_TRUE(has(r.err, "--backend meta")) << r.err;
  for (const char* cmd : {"compare", "sweep"}) {
    r = trainmem(std::string(cmd) + " --model tiny --batch 1 --seq 16 --backend cuda");
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "--backend cuda")) << r.err;
  }
  r = trainmem("maxbatch --model tiny --seq 16 --budget 1GiB --overhead measure");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--overhead measure: no usable CUDA device")) << r.err;
  EXPECT_TRUE(has(r.err, "--overhead 1GiB")) << r.err;
}

// tiny at b 8, s 16 needs about 34 MiB (the 32 MiB GEMM workspace and the model).
TEST(CliE2EInput, CpuRunThatCannotFitHostMemoryIsRefusedBeforeItStarts) {
  const std::string args = " --model tiny --batch 8 --seq 16 --backend cpu";
  for (const char* cmd : {"profile", "compare"}) {
    const Result r = trainmem_env("TRAINMEM_HOST_MEMORY=16MiB", cmd + args);
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "--backend cpu: this step needs")) << r.err;
    EXPECT_TRUE(has(r.err, "16.00 MiB is available")) << r.err;
    EXPECT_TRUE(has(r.err, "--backend meta")) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  Result r = trainmem_env("TRAINMEM_HOST_MEMORY=16MiB",
                          "sweep --model tiny --batch 1,8 --seq 16,32 --backend cpu");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(r.out.empty()) << "a grid point ran before the refusal: " << r.out;
  // Enough memory: it runs.
  r = trainmem_env("TRAINMEM_HOST_MEMORY=1GiB", "profile" + args + " --steps 1");
  EXPECT_EQ(r.code, 0) << r.err;
  // A device budget below the host memory bounds what the run can take: it runs, and stops
  // at the budget (exit 3).
  r = trainmem_env("TRAINMEM_HOST_MEMORY=16MiB", "profile" + args + " --device-budget 8MiB");
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(has(r.out, "OUT OF MEMORY")) << r.out;
}

TEST(CliE2EInput, ModelFolderWithConfigJson) {
  const std::string dir = temp_path("hf_model_dir");
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(std::string(TRAINMEM_TEST_DATA_DIR) + "/configs/tiny.json",
                             dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  Result r = trainmem("estimate --model '" + dir + "' --seq 16 --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["model"]["params"], 117056);  // the tiny preset's shape
  std::filesystem::remove(dir + "/config.json");
  r = trainmem("estimate --model '" + dir + "' --seq 16");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "is a directory without a config.json")) << r.err;
  std::filesystem::remove_all(dir);
}

// tiny, b 2, s 16 on meta: peak 35,596,032 B without checkpointing, 35,529,216 B with.
TEST(CliE2EInput, CompareDoesNotReportASavingFromARunThatRanOutOfMemory) {
  const std::string args =
      "compare --model tiny --batch 2 --seq 16 --backend meta --device-budget 35550000 ";
  Result r = trainmem(args + "--format json");
  ASSERT_EQ(r.code, 3) << r.err;
  const json cmp = r.j()["comparisons"][0];
  EXPECT_TRUE(cmp["activations_saved"].is_null()) << cmp.dump();
  EXPECT_TRUE(cmp["peak_saved"].is_null()) << cmp.dump();
  EXPECT_TRUE(cmp["activations_saved_ok"].is_null()) << cmp.dump();
  EXPECT_EQ(cmp["out_of_memory"], "the run without checkpointing");
  r = trainmem(args);
  ASSERT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(
      has(r.out, "AdamW, full: not compared: the run without checkpointing ran out of memory"))
      << r.out;
  EXPECT_FALSE(has(r.out, "(saves -")) << r.out;
  r = trainmem(args + "--format csv");
  ASSERT_EQ(r.code, 3) << r.err;
  const auto rows = parse_csv(r.out);
  ASSERT_EQ(rows.size(), 3u) << r.out;
  EXPECT_EQ(rows[0].back(), "out_of_memory");
  EXPECT_EQ(rows[1][1], "none");
  EXPECT_EQ(rows[1].back(), "true");
  EXPECT_EQ(rows[2][1], "full");
  EXPECT_EQ(rows[2].back(), "false");
}

// --checkpointing on compare names the policies run against none (none itself first, once);
// without it, none against full.
TEST(CliE2EInput, CompareRunsNoneAgainstTheGivenPolicies) {
  for (const std::string& flag :
       {std::string(" --checkpointing full"), std::string(),
        std::string(" --checkpointing none,full"), std::string(" --checkpointing")}) {
    SCOPED_TRACE(flag);
    const Result r =
        trainmem("compare --model tiny --batch 1 --seq 16 --backend meta --format json" + flag);
    ASSERT_EQ(r.code, 0) << r.err;
    const json runs = r.j()["runs"];
    ASSERT_EQ(runs.size(), 2u);
    EXPECT_EQ(runs[0]["run"]["checkpointing"], "none");
    EXPECT_EQ(runs[1]["run"]["checkpointing"], "full");
    EXPECT_FALSE(has(r.err, "--checkpointing")) << r.err;
  }
}

// tiny, s 16 on meta: peak 35,511,680 B at b 1, 35,596,032 B at b 2.
TEST(CliE2EInput, SweepCsvMarksTheRunsThatRanOutOfMemory) {
  const Result r = trainmem(
      "sweep --model tiny --batch 1,2 --seq 16 --backend meta --device-budget 35550000 "
      "--format csv");
  ASSERT_EQ(r.code, 3) << r.err;
  const auto rows = parse_csv(r.out);
  ASSERT_EQ(rows.size(), 3u) << r.out;
  EXPECT_EQ(rows[0].back(), "out_of_memory");
  EXPECT_EQ(rows[1][4], "1");
  EXPECT_EQ(rows[1].back(), "false");
  EXPECT_EQ(rows[2][4], "2");
  EXPECT_EQ(rows[2].back(), "true");
}

TEST(CliE2EInput, SeqWarningsNameTheSequencesThatRun) {
  // tiny has 256 positions; --seq's single-value default (512) plays no part in a sweep.
  Result r = trainmem("sweep --model tiny --batch 1 --seq 16,32 --backend meta");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "--seq 512")) << r.err;
  r = trainmem("sweep --model tiny --batch 1 --seq 16,300 --backend meta");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "--seq 300 is longer than tiny's max_position_embeddings 256")) << r.err;
  // maxbatch --vary seq searches the sequence: the --seq default is not a warning either.
  r = trainmem("maxbatch --model tiny --batch 1 --budget 40MiB --vary seq --step 16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "--seq 512")) << r.err;
}

// The meta backend touches no memory for the step: a batch of four million sequences of tiny
// (64M tokens, 768 MB as the int32 token, target and id vectors of a computing run) traces in
// a few MB of host memory.
TEST(CliE2EInput, MetaHostMemoryDoesNotGrowWithTheBatch) {
  // The binary's own footprint depends on the build (a CUDA build maps cuBLAS and CUPTI), so
  // compare a batch of 1 with a batch of 4,000,000 (64 M tokens: random ids for them were
  // 768 MB). ru_maxrss of RUSAGE_CHILDREN is the largest child so far; ctest runs each test in
  // its own process, so the first run below sets the baseline.
  struct rusage small {
  }, big{};
  const Result r1 = trainmem("profile --model tiny --batch 1 --seq 16 --backend meta --steps 1");
  ASSERT_EQ(r1.code, 0) << r1.err;
  ASSERT_EQ(getrusage(RUSAGE_CHILDREN, &small), 0);
  const Result r2 =
      trainmem("profile --model tiny --batch 4000000 --seq 16 --backend meta --steps 1");
  ASSERT_EQ(r2.code, 0) << r2.err;
  ASSERT_EQ(getrusage(RUSAGE_CHILDREN, &big), 0);
  EXPECT_LT(big.ru_maxrss - small.ru_maxrss, 64 * 1024)
      << "resident set (KiB) of batch 4,000,000 over batch 1: " << big.ru_maxrss << " vs "
      << small.ru_maxrss;
}

// A log line written while the progress bar is on a terminal starts by clearing that line,
// so it is not glued to the bar's text. stderr is a pseudo-terminal here.
TEST(CliE2EInput, LogLinesClearTheProgressBarOnATerminal) {
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(grantpt(master), 0);
  ASSERT_EQ(unlockpt(master), 0);
  const std::string slave = ptsname(master);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int s = open(slave.c_str(), O_RDWR);
    const int null = open("/dev/null", O_WRONLY);
    if (s < 0 || null < 0) _exit(127);
    dup2(null, STDOUT_FILENO);
    dup2(s, STDERR_FILENO);
    close(master);
    // b 2 runs out of memory while the bar shows it: the error is logged then.
    execl(TRAINMEM_BINARY, "trainmem", "sweep", "--model", "tiny", "--batch", "1,2", "--seq", "16",
          "--backend", "meta", "--device-budget", "35550000", static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string tty;
  char buf[4096];
  while (true) {
    const ssize_t n = read(master, buf, sizeof buf);
    if (n > 0) {
      tty.append(buf, std::size_t(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // EIO once the child closed the terminal
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  close(master);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
  ASSERT_TRUE(has(tty, "sweep 2/2")) << "no progress bar on the terminal:\n" << tty;
  std::size_t logs = 0;
  for (std::size_t at = tty.find("trainmem: ["); at != std::string::npos;
       at = tty.find("trainmem: [", at + 1)) {
    ++logs;
    const std::string before = tty.substr(at >= 4 ? at - 4 : 0, at >= 4 ? 4 : at);
    EXPECT_TRUE(before == "\r\033[K" || at == 0 || tty[at - 1] == '\n')
        << "log line glued to what was on the line: ..." << tty.substr(at >= 40 ? at - 40 : 0, 80);
  }
  EXPECT_GE(logs, 1u) << tty;
}

}  // namespace
}  // namespace trainmem::e2e
