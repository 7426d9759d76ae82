// Whole runs of the cpu backend give the same bits for any OpenMP team size. Each case runs the
// built binary three times with dynamic teams off (OMP_DYNAMIC=false) and 1, 2 and 4 threads
// (4 oversubscribes a 2-core machine on purpose), and compares the three JSON reports whole
// (losses, every ledger figure, tensors, reconciliation), apart from wall-clock timings, and
// for `profile` the --dump files (loss and every parameter gradient, fp32) byte for byte.
// Sizes are chosen so that the GEMMs, the attention and the elementwise ops all pass their
// parallel thresholds (kernels/common/cpu_parallel.hpp): small-256 has h 256, i 688, V 2048.
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "test_cli_e2e_helpers.hpp"

namespace trainmem::e2e {
namespace {

struct TeamCase {
  std::string name;  // test name suffix
  std::string args;  // trainmem arguments without --dtype and --format
};

void PrintTo(const TeamCase& c, std::ostream* os) {
  *os << c.args;
}

class ThreadTeams : public ::testing::TestWithParam<std::tuple<TeamCase, std::string>> {};

void expect_same_bits(const TeamCase& c, const std::string& dtype) {
  const bool dump = c.args.rfind("profile", 0) == 0;
  json first;
  std::string first_dump;
  for (int threads : {1, 2, 4}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    const std::string dump_path = temp_path("teams-" + c.name + dtype + ".safetensors");
    std::string args = c.args + " --dtype " + dtype + " --format json";
    if (dump) args += " --dump " + dump_path;
    const Result r =
        trainmem_env("OMP_DYNAMIC=false OMP_NUM_THREADS=" + std::to_string(threads), args);
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = without_timings(r.j());
    const std::string dumped = dump ? slurp(dump_path) : std::string();
    std::remove(dump_path.c_str());
    if (threads == 1) {
      first = j;
      first_dump = dumped;
      if (dump) ASSERT_GT(first_dump.size(), 1000u) << "no gradients dumped";
      continue;
    }
    if (j != first) {
      // Name the first differing field (json::diff gives JSON-pointer paths).
      const json d = json::diff(first, j);
      ADD_FAILURE() << "reports differ from the 1-thread run, first difference: " << d.at(0).dump()
                    << " (" << d.size() << " in all)";
    }
    if (dump) EXPECT_TRUE(dumped == first_dump) << "--dump gradients differ from the 1-thread run";
  }
  // The runs computed something: losses are finite numbers, not NaN from a meta trace.
  const json& runs = first.contains("runs") ? first["runs"] : json::array({first});
  for (const auto& run : runs) {
    ASSERT_TRUE(run["run"].contains("losses"));
    for (const auto& loss : run["run"]["losses"]) EXPECT_TRUE(loss.is_number_float()) << loss;
  }
}

TEST_P(ThreadTeams, SameBitsWithOneTwoAndFourThreads) {
  const auto& [c, dtype] = GetParam();
  expect_same_bits(c, dtype);
}

// bitsandbytes' 8-bit AdamW update runs its 256-element blocks in parallel (each block by one
// thread): the losses and the dumped gradients of steps 2 and 3 follow from the weights the
// earlier updates wrote (and so from their 8-bit states), in bf16 and fp32 (no fp16 step).
TEST(ThreadTeamsAdamW8bit, SameBitsWithOneTwoAndFourThreads) {
  const TeamCase c{"profile_adamw8bit",
                   "profile --backend cpu --model small-256 --batch 2 --seq 64 --steps 3 --seed 5 "
                   "--optimizer adamw8bit"};
  for (const char* dtype : {"bf16", "fp32"}) {
    SCOPED_TRACE(dtype);
    expect_same_bits(c, dtype);
  }
}

const TeamCase kCases[] = {
    {"profile", "profile --backend cpu --model small-256 --batch 2 --seq 64 --steps 2 --seed 5"},
    {"profile_flash",
     "profile --backend cpu --model small-256 --batch 2 --seq 64 --steps 1 --attention flash"},
    {"compare", "compare --backend cpu --model small-256 --batch 2 --seq 64 --steps 2"},
    {"sweep", "sweep --backend cpu --model small-256 --batch 1,2 --seq 32,64 --steps 1 --fit"},
};

INSTANTIATE_TEST_SUITE_P(Cpu, ThreadTeams,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values("fp32", "bf16", "fp16")),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace trainmem::e2e
