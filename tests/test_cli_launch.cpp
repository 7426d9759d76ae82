// Multi-rank launches without a launcher (src/cli/launch.hpp,
// include/trainmem/comm/collective.hpp): the launch detection from the launchers' variables, the
// exit-2 messages that say what to run instead (not under MPI, built without MPI, --world-size not
// the MPI size), and the local collective and end_job on one rank. The runs under a real mpirun are
// tests/mpi_test.py's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "cli/launch.hpp"
#include "cli_in_process.hpp"
#include "trainmem/comm/collective.hpp"

namespace trainmem::cli {
namespace {

using testing_in_process::contains;
using testing_in_process::run_trainmem;

LaunchInfo launch_from(const std::map<std::string, std::string>& vars) {
  return detect_launch([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(CliLaunch, DetectsEachLauncherFromItsVariables) {
  EXPECT_FALSE(launch_from({}).under_mpi);
  EXPECT_FALSE(launch_from({{"HOME", "/root"}}).under_mpi);

  const auto ompi = launch_from({{"OMPI_COMM_WORLD_SIZE", "4"},
                                 {"OMPI_COMM_WORLD_RANK", "2"},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  EXPECT_TRUE(ompi.under_mpi);
  EXPECT_EQ(ompi.size, 4);
  EXPECT_EQ(ompi.rank, 2);
  EXPECT_EQ(ompi.local_rank, 1);
  EXPECT_EQ(ompi.evidence, "OMPI_COMM_WORLD_SIZE=4");

  const auto pmi = launch_from({{"PMI_SIZE", "8"}, {"PMI_RANK", "7"}, {"MPI_LOCALRANKID", "3"}});
  EXPECT_TRUE(pmi.under_mpi);
  EXPECT_EQ(pmi.size, 8);
  EXPECT_EQ(pmi.rank, 7);
  EXPECT_EQ(pmi.local_rank, 3);

  const auto slurm =
      launch_from({{"SLURM_NTASKS", "16"}, {"SLURM_PROCID", "5"}, {"SLURM_LOCALID", "1"}});
  EXPECT_TRUE(slurm.under_mpi);
  EXPECT_EQ(slurm.size, 16);
  EXPECT_EQ(slurm.rank, 5);
  EXPECT_EQ(slurm.local_rank, 1);

  const auto pmix = launch_from({{"PMIX_RANK", "3"}});
  EXPECT_TRUE(pmix.under_mpi);
  EXPECT_EQ(pmix.rank, 3);
  EXPECT_EQ(pmix.size, 1);  // PMIx says no size: MPI will
  EXPECT_EQ(pmix.local_rank, -1);
}

TEST(CliLaunch, NotUnderMpiSaysTheMpirunAndSrunLinesAndWhatIsMeasured) {
  const std::string cmd = "trainmem profile --backend cpu --model tiny --world-size 4";
  const auto msg = launch_problem(LaunchInfo{}, true, 4, "cpu", cmd);
  ASSERT_TRUE(msg);
  EXPECT_TRUE(contains(*msg, "--backend cpu --world-size 4: ")) << *msg;
  EXPECT_TRUE(contains(*msg, "\n  mpirun -np 4 " + cmd + "\n")) << *msg;
  EXPECT_TRUE(contains(*msg, "\n  srun -n 4 " + cmd + "\n")) << *msg;
  EXPECT_TRUE(contains(*msg, "--allow-run-as-root")) << *msg;
  EXPECT_TRUE(
      contains(*msg, "Measured multi-rank runs cover data, tensor and pipeline parallelism"))
      << *msg;
  EXPECT_FALSE(contains(*msg, "built without MPI")) << *msg;
}

TEST(CliLaunch, BuiltWithoutMpiSaysSoEvenUnderALauncher) {
  LaunchInfo under;
  under.under_mpi = true;
  under.size = 2;
  for (const LaunchInfo& li : {LaunchInfo{}, under}) {
    const auto msg = launch_problem(li, false, 2, "cuda", "trainmem profile --world-size 2");
    ASSERT_TRUE(msg);
    EXPECT_TRUE(contains(*msg,
                         "--backend cuda --world-size 2: this trainmem was built without "
                         "MPI"))
        << *msg;
    EXPECT_TRUE(contains(*msg, "tools/setup.sh")) << *msg;
    EXPECT_TRUE(contains(*msg, "--pp with --zero 0 or 1) on the cpu and cuda backends")) << *msg;
  }
}

TEST(CliLaunch, UnderALauncherWithMpiTheLaunchCanStart) {
  LaunchInfo under;
  under.under_mpi = true;
  under.size = 4;
  EXPECT_FALSE(launch_problem(under, true, 4, "cpu", "trainmem"));
}

TEST(CliLaunch, WorldSizeAgainstTheMpiSizeSaysWhatToRun) {
  EXPECT_FALSE(world_size_problem(4, 4, "trainmem"));
  const auto msg =
      world_size_problem(4, 2, "trainmem profile --world-size 4 --backend cpu --model tiny");
  ASSERT_TRUE(msg);
  EXPECT_TRUE(contains(*msg, "--world-size 4 but the MPI launcher started 2 process(es)")) << *msg;
  EXPECT_TRUE(
      contains(*msg, "`mpirun -np 4 trainmem profile --world-size 4 --backend cpu --model tiny`"))
      << *msg;
  EXPECT_TRUE(
      contains(*msg, "`mpirun -np 2 trainmem profile --world-size 2 --backend cpu --model tiny`"))
      << *msg;
  EXPECT_TRUE(contains(*world_size_problem(2, 3, "trainmem profile --world-size=2"),
                       "mpirun -np 3 trainmem profile --world-size=3"));
}

// Clears the launchers' variables for the test (as a plain shell would have them) and restores
// them after.
class CliLaunchEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars)
      if (const char* s = std::getenv(v)) saved_[v] = s;
    for (const char* v : kVars) unsetenv(v);
  }
  void TearDown() override {
    for (const auto& [k, v] : saved_) setenv(k.c_str(), v.c_str(), 1);
  }
  static constexpr const char* kVars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                          "SLURM_NTASKS"};
  std::map<std::string, std::string> saved_;
};

TEST_F(CliLaunchEnv, ProfileCpuOnSeveralRanksWithoutMpirunExits2WithTheLine) {
  for (const std::string be : {"cpu", "cuda"}) {
    const auto r = run_trainmem({"profile", "--backend", be, "--model", "tiny", "--batch", "2",
                                 "--seq", "16", "--world-size", "2"});
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "trainmem: error: --backend " + be + " --world-size 2: ")) << r.err;
    EXPECT_TRUE(
        contains(r.err, "Measured multi-rank runs cover data, tensor and pipeline parallelism"))
        << r.err;
    if (mpi_built()) {
      EXPECT_TRUE(contains(r.err, "mpirun -np 2 trainmem profile --backend " + be +
                                      " --model tiny --batch 2 --seq 16 --world-size 2"))
          << r.err;
      EXPECT_TRUE(contains(r.err, "srun -n 2 trainmem profile")) << r.err;
    } else {
      EXPECT_TRUE(contains(r.err, "built without MPI")) << r.err;
    }
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  // meta needs no launcher: every rank traced in this process.
  const auto meta = run_trainmem({"profile", "--backend", "meta", "--model", "tiny", "--batch", "2",
                                  "--seq", "16", "--world-size", "2"});
  EXPECT_EQ(meta.code, 0) << meta.err;
}

TEST_F(CliLaunchEnv, CollectiveTimeoutMustBePositive) {
  const auto r = run_trainmem({"profile", "--backend", "cpu", "--model", "tiny", "--world-size",
                               "2", "--collective-timeout", "0"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "--collective-timeout")) << r.err;
}

TEST(CliLaunch, LocalCollectiveMovesNothingAndEndJobKeepsTheStatus) {
  auto c = make_local_collective();
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->rank(), 0);
  float x[3] = {1.5f, -2.0f, 3.25f};
  c->all_reduce_sum(x, 3, DType::f32);
  EXPECT_EQ(x[0], 1.5f);
  EXPECT_EQ(x[2], 3.25f);
  float y[3] = {};
  c->all_gather(x, y, 3, DType::f32);
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_THROW(c->send(x, 1, DType::f32, 0), InputError);
  EXPECT_THROW(c->broadcast(x, 1, DType::f32, 1), InputError);
  // all_to_all_v on one rank: its own rows copied (int32 too); counts that disagree refused.
  const std::int32_t rows[4] = {7, 8, 9, 10};
  std::int32_t got[4] = {};
  const std::size_t two = 2, one = 1;
  c->all_to_all_v(rows, &two, got, &two, 2, DType::i32);
  EXPECT_EQ(got[3], 10);
  EXPECT_THROW(c->all_to_all_v(rows, &two, got, &one, 2, DType::i32), InputError);
  EXPECT_THROW(c->all_to_all_v(rows, &two, got, &two, 0, DType::i32), InputError);
  std::ostringstream err;
  EXPECT_EQ(end_job(*c, 2, "trainmem: error: bad input", err), 2);
  EXPECT_EQ(err.str(), "trainmem: error: bad input\n");  // one rank: no rank prefix
  std::ostringstream quiet;
  EXPECT_EQ(end_job(*c, 0, "", quiet), 0);
  EXPECT_EQ(quiet.str(), "");
}

}  // namespace
}  // namespace trainmem::cli

// ----------------------------------------------------------------------------- the ranks agree
namespace trainmem {
namespace {

TEST(RankAgreement, EqualRequestsAgree) {
  const RequestLines a = {{"the subcommand", "profile"}, {"--seed", "1"}};
  EXPECT_FALSE(request_disagreement({a, a, a}).has_value());
  EXPECT_FALSE(request_disagreement({a}).has_value());
  // One rank: nothing to exchange, nothing thrown.
  auto local = make_local_collective();
  EXPECT_NO_THROW(agree_on_request(*local, a));
}

TEST(RankAgreement, NamesTheFirstDifferingFlagItsValuesAndTheRanks) {
  const RequestLines base = {
      {"the subcommand", "profile"}, {"--batch", "2"}, {"--model", "tiny"}, {"--seed", "1"}};
  RequestLines other = base;
  other[2].second = "tiny-gqa";  // --model
  other[3].second = "2";         // --seed: later in the order, not the first named
  const auto why = request_disagreement({base, other, base, other});
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why,
            "the ranks were started with different requests: --model is 'tiny' on ranks 0, 2 and "
            "'tiny-gqa' on ranks 1, 3; every rank must run the same command with the same files "
            "(mpirun's `A : B` form started different ones)");
}

TEST(RankAgreement, AFlagGivenOnOneRankOnlyIsADifference) {
  const RequestLines a = {{"the subcommand", "profile"}, {"--batch", "2"}};
  RequestLines b = a;
  b.push_back({"--zero", "3"});
  const auto why = request_disagreement({a, a, b});
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("--zero is (not given) on ranks 0, 1 and '3' on rank 2"), std::string::npos)
      << *why;
}

TEST(RankAgreement, TheRequestOfAProcessSortsItsFlagsAndAddsTheResolvedModelAndFileSizes) {
  const std::string dir = ::testing::TempDir();
  const std::string tokens = dir + "/trainmem_agree_tokens.bin";
  {
    std::ofstream out(tokens, std::ios::binary);
    out << std::string(24, '\0');
  }
  const char* argv1[] = {"trainmem",     "profile",  "--seed",      "3",
                         "--model=tiny", "--tokens", tokens.c_str()};
  const char* argv2[] = {"trainmem", "profile", "--tokens", tokens.c_str(),
                         "--model",  "tiny",    "--seed",   "3"};
  cli::CommonFlags cf;
  cf.model = "tiny";
  cf.seq = 16;
  const cli::Common c = cli::resolve_common(cf, false, false);
  cli::RunFlags run;
  run.tokens = tokens;
  cli::set_command_line(7, const_cast<char**>(argv1));
  const RequestLines r1 = cli::rank_request(c, run);
  cli::set_command_line(8, const_cast<char**>(argv2));
  const RequestLines r2 = cli::rank_request(c, run);
  EXPECT_EQ(r1, r2) << "the order flags were typed in does not matter";
  ASSERT_GE(r1.size(), 5u);
  EXPECT_EQ(r1[0], (std::pair<std::string, std::string>{"the subcommand", "profile"}));
  EXPECT_EQ(r1[1], (std::pair<std::string, std::string>{"--model", "tiny"}));
  EXPECT_EQ(r1[2], (std::pair<std::string, std::string>{"--seed", "3"}));
  EXPECT_EQ(r1[3].first, "--tokens");
  EXPECT_EQ(r1[4].first, "--model's configuration");
  EXPECT_NE(r1[4].second.find("llama V 128 h 64 i 176 L 2 a 4 k 4"), std::string::npos)
      << r1[4].second;
  EXPECT_EQ(r1.back(), (std::pair<std::string, std::string>{"--tokens's size in bytes", "24"}));
  std::remove(tokens.c_str());
}

TEST(RankAgreement, CollectiveTimeoutHasASaneFloor) {
  EXPECT_NO_THROW(check_collective_timeout(1));
  EXPECT_NO_THROW(check_collective_timeout(604800));
  for (double bad : {1e-300, 1e-9, 0.5, 0.0, -1.0, 604801.0, std::nan("")}) {
    try {
      check_collective_timeout(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--collective-timeout must be between 1 and 604800"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace trainmem
