// End to end: `trainmem replay EVENTS.json` — a sequence of allocations and frees through the
// model of PyTorch's caching allocator (docs/allocator.md). The figures are worked by hand from
// the allocator's rules; bad input exits 2 naming the file, the event and the field; an
// out-of-memory under --budget exits 3 after the report, with PyTorch's message.
#include <gtest/gtest.h>

#include <fstream>

#include "test_cli_e2e_helpers.hpp"

namespace trainmem::e2e {
namespace {

constexpr std::uint64_t MiB = 1048576;

std::string events_file(const std::string& leaf, const std::string& text) {
  const std::string path = temp_path(leaf);
  std::ofstream(path) << text;
  return path;
}

// 20 MiB allocated and freed (cached); 30 MiB (a new segment: the cached 20 MiB is too small);
// 1000 B (the small pool: 1 KiB of a new 2 MiB segment); 11 MiB (the cached 20 MiB block, split:
// 9 MiB remain, more than 1 MiB).
const char* kEvents =
    "[{\"op\":\"alloc\",\"id\":1,\"bytes\":20971520},{\"op\":\"free\",\"id\":1},"
    "{\"op\":\"alloc\",\"id\":2,\"bytes\":31457280},{\"op\":\"alloc\",\"id\":3,\"bytes\":1000},"
    "{\"op\":\"alloc\",\"id\":4,\"bytes\":11534336}]";

TEST(CliE2EReplay, FiguresFollowTheAllocatorsRules) {
  const std::string path = events_file("replay_rules.json", kEvents);
  const Result r = trainmem("replay " + path + " --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  EXPECT_EQ(j["events"], 5);
  EXPECT_EQ(j["allocations"], 4);
  EXPECT_EQ(j["reserved"]["peak"].get<std::uint64_t>(), 20 * MiB + 30 * MiB + 2 * MiB);
  EXPECT_EQ(j["allocated"]["peak"].get<std::uint64_t>(), 30 * MiB + 1024 + 11 * MiB);
  EXPECT_EQ(j["requested"]["peak"].get<std::uint64_t>(), 30 * MiB + 1000 + 11 * MiB);
  EXPECT_EQ(j["segments"]["peak"], 3);
  // The reserved peak is reached by the 2 MiB segment (30 MiB + 1 KiB allocated then); the
  // 11 MiB block is then taken from the cache while reserved stays at its peak: the most
  // allocated at the reserved peak is 30 MiB + 1 KiB + 11 MiB.
  EXPECT_EQ(j["allocated_at_reserved_peak"].get<std::uint64_t>(), 30 * MiB + 1024 + 11 * MiB);
  EXPECT_EQ(j["segments_at_reserved_peak"],
            json::array({20 * MiB, 30 * MiB, 2 * MiB}));  // in allocation order
  EXPECT_TRUE(j["oom"].is_null());
  EXPECT_EQ(j["schema"], "trainmem/1");
}

TEST(CliE2EReplay, AnOutOfMemoryUnderTheBudgetExits3WithPyTorchsMessage) {
  const std::string path = events_file("replay_oom.json", kEvents);
  // 40 MiB: the 30 MiB request frees the cached 20 MiB segment and retries; the 11 MiB one
  // needs a 12 MiB segment, 32 + 12 > 40, nothing whole is cached: PyTorch raises.
  const Result r = trainmem("replay " + path + " --budget 40MiB --format json");
  ASSERT_EQ(r.code, 3) << r.err;
  const json j = r.j();
  ASSERT_FALSE(j["oom"].is_null());
  EXPECT_EQ(j["oom"]["event"], 4);
  EXPECT_EQ(j["oom"]["alloc_size"].get<std::uint64_t>(), 12 * MiB);
  EXPECT_EQ(j["oom"]["device_free"].get<std::uint64_t>(), 8 * MiB);
  EXPECT_EQ(j["alloc_retries"], 2);
  EXPECT_EQ(j["oom"]["message"],
            "CUDA out of memory. Tried to allocate 12.00 MiB. GPU 0 has a total capacity of "
            "40.00 MiB of which 8.00 MiB is free. Of the allocated memory 30.00 MiB is allocated "
            "by PyTorch, and 2.00 MiB is reserved by PyTorch but unallocated.");
  const Result text = trainmem("replay " + path + " --budget 40MiB");
  EXPECT_EQ(text.code, 3);
  EXPECT_NE(text.out.find("OUT OF MEMORY at event 4"), std::string::npos) << text.out;
}

TEST(CliE2EReplay, BadInputNamesTheFlagTheEventAndTheField) {
  struct Case {
    const char* args;      // after the events file
    const char* events;    // the file's text
    const char* expected;  // in stderr
  };
  const Case cases[] = {
      {"--allocator foo", kEvents, "--allocator: unknown allocator 'foo'"},
      {"--allocator pytorch:expandable_segments=maybe", kEvents, "expandable_segments=maybe"},
      {"--allocator pytorch:max_split_size_mb=10", kEvents,
       "max_split_size_mb must be at least 20"},
      {"--allocator pytorch:max_non_split_rounding_mb=0", kEvents,
       "max_non_split_rounding_mb must be at least 20"},
      {"--allocator \"pytorch:roundup_power2_divisions= -9\"", kEvents, "is not an integer"},
      {"", "[{\"op\":\"alloc\",\"id\":1,\"bytes\":18446744073709551615}]",
       "\"bytes\" must be at most 2^60"},
      {"--allocator pytorch:roundup_power2_divisions=3", kEvents, "a power of two"},
      {"--allocator pytorch:colour=blue", kEvents, "unknown key 'colour'"},
      {"--budget lots", kEvents, "--budget"},
      {"", "{\"op\":\"alloc\"}", "an object needs \"events\""},
      {"", "[{\"op\":\"alloc\",\"id\":1}]", "event 0: missing \"bytes\""},
      {"", "[{\"op\":\"grab\",\"id\":1,\"bytes\":5}]", "event 0: \"op\" must be \"alloc\" or"},
      {"", "[{\"op\":\"alloc\",\"id\":-1,\"bytes\":5}]", "\"id\" is -1, not an integer >= 0"},
      {"", "[{\"op\":\"alloc\",\"id\":1,\"bytes\":0}]", "\"bytes\" must be at least 1"},
      {"", "[{\"op\":\"free\",\"id\":3}]", "event 0: free of allocation id 3"},
      {"", "[{\"op\":\"alloc\",\"id\":3,\"bytes\":5},{\"op\":\"alloc\",\"id\":3,\"bytes\":5}]",
       "event 1: allocation id 3 is already allocated"},
      {"", "[1, 2", "replay_bad.json"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.args) + " | " + c.events);
    const std::string path = events_file("replay_bad.json", c.events);
    const Result r = trainmem("replay " + path + " " + c.args);
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << r.err;
  }
  const Result missing = trainmem("replay " + temp_path("replay_none.json"));
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("the events file"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace trainmem::e2e
