// The trainmem command line: --help/--version, exit codes, logging, the common and run
// flags and their validation (through a test app carrying the same flags), --output, and
// the built binary itself.
#include <gtest/gtest.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include "cli/cli.hpp"
#include "cli_in_process.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem::cli {
namespace {

using testing_in_process::contains;
using testing_in_process::Result;

Result run(std::vector<std::string> args) {
  return testing_in_process::run_trainmem(std::move(args));
}

TEST(Cli, VersionPrintsNameAndVersionAndExitsZero) {
  const Result r = run({"--version"});
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(std::regex_match(r.out, std::regex("trainmem [0-9]+\\.[0-9]+\\.[0-9]+\n"))) << r.out;
  EXPECT_EQ(r.out, std::string("trainmem ") + TRAINMEM_VERSION + "\n");
}

TEST(Cli, HelpListsEverySubcommandAndExitsZero) {
  const Result r = run({"--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* sub : {"estimate", "profile", "compare", "sweep", "maxbatch"})
    EXPECT_TRUE(contains(r.out, sub)) << sub << "\n" << r.out;
  EXPECT_TRUE(contains(r.out, "--log-level")) << r.out;
  EXPECT_TRUE(contains(r.out, "Exit codes")) << r.out;
}

TEST(Cli, NoSubcommandPrintsHelpAndExitsTwo) {
  const Result r = run({});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "Usage: trainmem")) << r.err;
  EXPECT_TRUE(contains(r.err, "a subcommand is required")) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST(Cli, UnknownSubcommandOrFlagExitsTwo) {
  Result r = run({"frobnicate"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "frobnicate")) << r.err;
  r = run({"--no-such-flag"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "--no-such-flag")) << r.err;
}

TEST(Cli, BadLogLevelListsTheLevels) {
  const Result r = run({"--log-level", "loud"});
  EXPECT_EQ(r.code, 2);
  for (const char* l : {"trace", "debug", "info", "warn", "error", "off"})
    EXPECT_TRUE(contains(r.err, l)) << l << "\n" << r.err;
}

TEST(Cli, LogLevelSetsSpdlogLevel) {
  run({"--log-level", "error"});  // no subcommand: exit 2, but the level is set while parsing
  EXPECT_EQ(spdlog::get_level(), spdlog::level::err);
  run({"--log-level", "trace"});
  EXPECT_EQ(spdlog::get_level(), spdlog::level::trace);
  run({});  // each run starts at info
  EXPECT_EQ(spdlog::get_level(), spdlog::level::info);
}

TEST(Cli, LogsGoToStderr) {
  run({"--log-level", "info"});  // installs the CLI's logger
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  spdlog::warn("a warning for the test");
  const std::string out = testing::internal::GetCapturedStdout();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "");
  EXPECT_TRUE(contains(err, "a warning for the test")) << err;
}

// ---- exceptions -> exit codes ----

Result guarded(const std::function<int()>& body) {
  Result r;
  testing::internal::CaptureStderr();
  r.code = run_guarded(body);
  r.err = testing::internal::GetCapturedStderr();
  return r;
}

TEST(ExitCodes, ExceptionsMapToTheirCodes) {
  EXPECT_EQ(guarded([] { return 0; }).code, 0);
  EXPECT_EQ(guarded([] { return 7; }).code, 7);

  Result r = guarded([]() -> int { throw InputError("--batch must be >= 1"); });
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "--batch must be >= 1")) << r.err;

  r = guarded([]() -> int { throw OverflowError("vocab_size * hidden_size: overflow"); });
  EXPECT_EQ(r.code, 2);

  r = guarded([]() -> int {
    throw OutOfMemory(3ull << 30, "activations", "layers.3.probs", 70ull << 30, "budget 72 GiB");
  });
  EXPECT_EQ(r.code, 3);
  EXPECT_TRUE(contains(r.err, "3221225472 bytes")) << r.err;
  EXPECT_TRUE(contains(r.err, "layers.3.probs")) << r.err;
  EXPECT_TRUE(contains(r.err, "activations")) << r.err;
  EXPECT_TRUE(contains(r.err, "75161927680 bytes")) << r.err;
  EXPECT_TRUE(contains(r.err, "budget 72 GiB")) << r.err;

  r = guarded([]() -> int { throw DeviceError("cudaMalloc failed"); });
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "cudaMalloc failed")) << r.err;
  EXPECT_EQ(guarded([]() -> int { throw std::runtime_error("x"); }).code, 1);
  EXPECT_EQ(guarded([]() -> int { throw 5; }).code, 1);
}

TEST(ExitCodes, OutOfMemoryCarriesItsFields) {
  const OutOfMemory e(1024, "gradients", "lm_head.weight.grad", 4096, "");
  EXPECT_EQ(e.requested_bytes, 1024u);
  EXPECT_EQ(e.category, "gradients");
  EXPECT_EQ(e.tensor, "lm_head.weight.grad");
  EXPECT_EQ(e.live_bytes, 4096u);
  const std::string m = e.what();
  EXPECT_TRUE(contains(m, "1024 bytes")) << m;
  EXPECT_TRUE(contains(m, "4096 bytes")) << m;
  EXPECT_TRUE(contains(m, "lm_head.weight.grad")) << m;
}

// ---- common and run flags through a test app ----

struct Parsed {
  CommonFlags flags;
  RunFlags run;
};

// Parses args into a fresh subcommand-like app with the common and run flags.
std::unique_ptr<Parsed> parse(std::vector<std::string> args) {
  auto p = std::make_unique<Parsed>();
  CLI::App app{"test", "trainmem-test"};
  add_common_flags(app, p->flags);
  add_run_flags(app, p->run);
  std::reverse(args.begin(), args.end());  // CLI11's vector form takes argv reversed
  app.parse(args);
  return p;
}

Common resolve(std::vector<std::string> args, bool all_optimizers = false,
               bool both_modes = false) {
  return resolve_common(parse(std::move(args))->flags, all_optimizers, both_modes);
}

std::string input_error(std::vector<std::string> args, bool all_optimizers = false,
                        bool both_modes = false) {
  try {
    resolve(std::move(args), all_optimizers, both_modes);
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InputError";
  return "";
}

// The modes of the parsed --checkpointing policies.
std::vector<Checkpointing> modes(const Common& c) {
  std::vector<Checkpointing> out;
  for (const auto& p : c.checkpointing_modes) out.push_back(p.mode);
  return out;
}

TEST(CommonFlags, DefaultsFollowTheDesign) {
  const Common c = resolve({});
  EXPECT_EQ(c.model.name, "llama-7b");
  EXPECT_EQ(c.model.hidden, 4096);
  EXPECT_EQ(c.train.batch, 8);
  EXPECT_EQ(c.train.seq, 512);
  EXPECT_EQ(c.train.dtype, DType::bf16);
  EXPECT_EQ(c.train.optimizer, Optimizer::adamw);
  EXPECT_EQ(c.train.checkpointing, Checkpointing::none);
  EXPECT_EQ(c.train.attention, Attention::eager);
  EXPECT_EQ(c.optimizers, std::vector<Optimizer>{Optimizer::adamw});
  EXPECT_EQ(modes(c), std::vector<Checkpointing>{Checkpointing::none});
  EXPECT_EQ(c.profiles, (std::vector<std::string>{"native", "hf-eager", "megatron", "zero"}));
  EXPECT_EQ(c.format, Format::table);
  EXPECT_EQ(c.output, "");
  const auto p = parse({});
  EXPECT_EQ(p->run.backend, "auto");
  EXPECT_EQ(p->run.steps, 2);
  EXPECT_EQ(p->flags.log_level, "info");
}

TEST(CommonFlags, ValuesAreParsed) {
  const Common c = resolve({"--model", "tiny-gqa", "--batch", "3", "--seq", "17", "--dtype", "fp16",
                            "--optimizer", "lomo", "--attention", "flash", "--profile",
                            "zero,native,zero", "--format", "json", "--output", "x.json"});
  EXPECT_EQ(c.model.name, "tiny-gqa");
  EXPECT_EQ(c.train.batch, 3);
  EXPECT_EQ(c.train.seq, 17);
  EXPECT_EQ(c.train.dtype, DType::f16);
  EXPECT_EQ(c.train.optimizer, Optimizer::lomo);
  EXPECT_EQ(c.train.attention, Attention::flash);
  EXPECT_EQ(c.profiles, (std::vector<std::string>{"zero", "native"}));
  EXPECT_EQ(c.format, Format::json);
  EXPECT_EQ(c.output, "x.json");
  EXPECT_EQ(resolve({"--format", "csv"}).format, Format::csv);
  EXPECT_EQ(resolve({"--format", "markdown"}).format, Format::markdown);
  EXPECT_EQ(resolve({"--format", "html"}).format, Format::html);
  EXPECT_EQ(resolve({"--dtype", "fp32"}).train.dtype, DType::f32);
  EXPECT_EQ(resolve({"--profile", "hf-eager,all"}).profiles.size(), 4u);
}

TEST(CommonFlags, LogLevelTakesEffectWhileParsing) {
  parse({"--log-level", "warn"});
  EXPECT_EQ(spdlog::get_level(), spdlog::level::warn);
  parse({"--log-level", "off"});
  EXPECT_EQ(spdlog::get_level(), spdlog::level::off);
  EXPECT_THROW(parse({"--log-level", "verbose"}), CLI::ParseError);
  EXPECT_THROW(set_log_level("verbose"), InputError);
  set_log_level("info");
  EXPECT_EQ(spdlog::get_level(), spdlog::level::info);
}

TEST(CommonFlags, BareCheckpointingMeansFull) {
  EXPECT_EQ(resolve({"--checkpointing"}).train.checkpointing, Checkpointing::full);
  const Common c = resolve({"--checkpointing", "--batch", "4"});
  EXPECT_EQ(c.train.checkpointing, Checkpointing::full);
  EXPECT_EQ(c.train.batch, 4);
  EXPECT_EQ(resolve({"--checkpointing", "none"}).train.checkpointing, Checkpointing::none);
  EXPECT_EQ(resolve({"--checkpointing", "full"}).train.checkpointing, Checkpointing::full);
  EXPECT_EQ(resolve({"--checkpointing=full"}).train.checkpointing, Checkpointing::full);
}

TEST(CommonFlags, BothAndAllOnlyWhereAllowed) {
  const Common c = resolve({"--checkpointing", "both", "--optimizer", "all"}, true, true);
  EXPECT_EQ(modes(c), (std::vector<Checkpointing>{Checkpointing::none, Checkpointing::full}));
  EXPECT_EQ(c.optimizers,
            (std::vector<Optimizer>{Optimizer::adamw, Optimizer::sgd, Optimizer::lomo}));
  EXPECT_EQ(c.train.checkpointing, Checkpointing::none);
  EXPECT_EQ(c.train.optimizer, Optimizer::adamw);

  std::string m = input_error({"--checkpointing", "both"});
  EXPECT_TRUE(contains(m, "--checkpointing")) << m;
  EXPECT_TRUE(contains(m, "none, full")) << m;
  EXPECT_FALSE(contains(m, "full, both")) << m;
  m = input_error({"--optimizer", "all"});
  EXPECT_TRUE(contains(m, "adamw, sgd, lomo")) << m;
}

TEST(CommonFlags, UnknownModelListsThePresets) {
  const std::string m = input_error({"--model", "gpt-5"});
  EXPECT_TRUE(contains(m, "gpt-5")) << m;
  for (const auto& p : preset_names()) EXPECT_TRUE(contains(m, p)) << p << "\n" << m;
}

TEST(CommonFlags, JsonModelIsLoaded) {
  const std::string path = std::string(TRAINMEM_TEST_DATA_DIR) + "/configs/tiny.json";
  const Common c = resolve({"--model", path, "--seq", "64"});
  EXPECT_EQ(c.model.name, path);
  EXPECT_EQ(c.model.param_count(), 117056u);  // same shape as the tiny preset
  EXPECT_EQ(c.model.torch_dtype, DType::f32);
}

TEST(CommonFlags, BatchAndSeqBounds) {
  for (const char* b : {"0", "-1"}) {
    const std::string m = input_error({"--batch", b});
    EXPECT_TRUE(contains(m, "--batch")) << m;
  }
  for (const char* s : {"1", "0", "-5"}) {
    const std::string m = input_error({"--seq", s});
    EXPECT_TRUE(contains(m, "--seq")) << m;
  }
  EXPECT_THROW(parse({"--batch", "eight"}), CLI::ParseError);
  EXPECT_EQ(resolve({"--seq", "2"}).train.seq, 2);
}

TEST(CommonFlags, SeqAboveMaxPositionsWarnsButIsAccepted) {
  auto logger = std::make_shared<spdlog::logger>(
      "test", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::info);
  testing::internal::CaptureStderr();
  const Common c = resolve({"--model", "tiny", "--seq", "300"});  // tiny: 256 positions
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(c.train.seq, 300);
  EXPECT_TRUE(contains(err, "300")) << err;
  EXPECT_TRUE(contains(err, "256")) << err;

  testing::internal::CaptureStderr();
  resolve({"--model", "tiny", "--seq", "256"});
  err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "");
}

TEST(CommonFlags, BadNamesListTheAllowedValues) {
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> allowed;
  } cases[] = {
      {{"--dtype", "fp8"}, {"--dtype", "fp8", "bf16", "fp16", "fp32"}},
      {{"--dtype", "int32"}, {"--dtype", "bf16", "fp16", "fp32"}},
      {{"--optimizer", "adam"}, {"--optimizer", "adam", "adamw", "sgd", "lomo"}},
      {{"--checkpointing", "partial"},
       {"--checkpointing", "partial", "none", "full", "selective", "every:K", "layers:LIST",
        "budget:SIZE"}},
      {{"--attention", "sdpa"}, {"--attention", "sdpa", "eager", "flash"}},
      {{"--profile", "native,zer0"},
       {"--profile", "zer0", "native", "hf-eager", "megatron", "zero", "all"}},
      {{"--profile", ""}, {"--profile", "native"}},
      {{"--format", "yaml"}, {"--format", "yaml", "table", "json", "csv", "markdown", "html"}},
  };
  for (const auto& cs : cases) {
    const std::string m = input_error(cs.args);
    for (const auto& a : cs.allowed) EXPECT_TRUE(contains(m, a)) << a << "\n" << m;
  }
}

TEST(RunFlags, ValuesAndValidation) {
  const auto p = parse({"--backend", "meta", "--steps", "5", "--seed", "17", "--dump",
                        "g.safetensors", "--timeline", "t.svg"});
  EXPECT_EQ(p->run.backend, "meta");
  EXPECT_EQ(p->run.steps, 5);
  EXPECT_EQ(p->run.seed, 17u);
  EXPECT_EQ(p->run.dump, "g.safetensors");
  EXPECT_EQ(p->run.timeline, "t.svg");
  EXPECT_EQ(parse({"--timeline", "t.json"})->run.timeline, "t.json");

  auto parse_error = [](std::vector<std::string> args) -> std::string {
    try {
      parse(std::move(args));
    } catch (const CLI::ParseError& e) {
      return e.what();
    }
    ADD_FAILURE() << "accepted";
    return "";
  };
  std::string m = parse_error({"--backend", "gpu"});
  for (const char* b : {"--backend", "auto", "cuda", "cpu", "meta"})
    EXPECT_TRUE(contains(m, b)) << b << "\n" << m;
  EXPECT_TRUE(contains(parse_error({"--steps", "0"}), "--steps"));
  m = parse_error({"--timeline", "t.txt"});
  EXPECT_TRUE(contains(m, ".json")) << m;
  EXPECT_TRUE(contains(m, ".svg")) << m;
  EXPECT_TRUE(contains(parse_error({"--dump", "g.bin"}), ".safetensors"));
  EXPECT_TRUE(contains(parse_error({"--weights", "/nonexistent/w.safetensors"}), "--weights"));
  EXPECT_TRUE(contains(parse_error({"--tokens", "/nonexistent/tokens.bin"}), "--tokens"));
}

// ---- --output ----

TEST(WriteOutput, FileAndErrors) {
  const std::string path = testing::TempDir() + "trainmem_write_output_test.txt";
  write_output(path, "line 1\nline 2\n");
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  EXPECT_EQ(s.str(), "line 1\nline 2\n");
  std::remove(path.c_str());

  try {
    write_output("/nonexistent/dir/out.json", "x");
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_TRUE(contains(e.what(), "--output")) << e.what();
    EXPECT_TRUE(contains(e.what(), "/nonexistent/dir/out.json")) << e.what();
  }

  testing::internal::CaptureStdout();
  write_output("", "to stdout\n");
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "to stdout\n");
}

// ---- the built binary ----

Result run_binary(const std::string& args) {
  const std::string dir = testing::TempDir();
  const std::string out = dir + "trainmem_cli_out.txt", err = dir + "trainmem_cli_err.txt";
  const std::string cmd =
      std::string("'") + TRAINMEM_BINARY + "' " + args + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream o(out), e(err);
  std::stringstream so, se;
  so << o.rdbuf();
  se << e.rdbuf();
  r.out = so.str();
  r.err = se.str();
  return r;
}

TEST(Binary, VersionHelpAndErrors) {
  Result r = run_binary("--version");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, std::string("trainmem ") + TRAINMEM_VERSION + "\n");
  r = run_binary("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "maxbatch")) << r.out;
  r = run_binary("");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "a subcommand is required")) << r.err;
  r = run_binary("--log-level loud");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "trace")) << r.err;
}

}  // namespace
}  // namespace trainmem::cli
