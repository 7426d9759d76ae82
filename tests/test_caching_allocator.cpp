// The model of PyTorch's CUDA caching allocator (analytic/caching_allocator.hpp) against cases
// worked by hand from the rules of c10/cuda/CUDACachingAllocator.cpp (each case names the rule
// it exercises: round_size, get_allocation_size, get_free_block, should_split, free_block and
// try_merge_blocks, the release-and-retry path before an out-of-memory, release_cached_blocks).
#include <gtest/gtest.h>

#include <string>

#include "trainmem/analytic/caching_allocator.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

constexpr std::uint64_t KiB = 1024, MiB = 1024 * KiB;

TEST(CachingAllocator, RoundSizeAndSegmentSizes) {
  CachingAllocatorModel m;
  // round_size: below 512 B -> 512; else up to a multiple of 512.
  EXPECT_EQ(m.round_size(1), 512u);
  EXPECT_EQ(m.round_size(512), 512u);
  EXPECT_EQ(m.round_size(513), 1024u);
  // get_allocation_size: <= 1 MiB -> 2 MiB; < 10 MiB -> 20 MiB; else up to 2 MiB.
  EXPECT_EQ(CachingAllocatorModel::allocation_size(1 * MiB), 2 * MiB);
  EXPECT_EQ(CachingAllocatorModel::allocation_size(1 * MiB + 512), 20 * MiB);
  EXPECT_EQ(CachingAllocatorModel::allocation_size(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(CachingAllocatorModel::allocation_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(CachingAllocatorModel::allocation_size(10 * MiB + 512), 12 * MiB);
}

TEST(CachingAllocator, RoundupPower2Divisions) {
  CachingAllocatorConfig c;
  c.roundup_power2_divisions = 4;
  CachingAllocatorModel m(c);
  // 1,200,000 > 512·4: floor power of two 1 MiB, step 1 MiB / 4 = 256 KiB; 1,200,000 lies
  // above 1 MiB, so the next step is 1 MiB + 256 KiB = 1,310,720.
  EXPECT_EQ(m.round_size(1200000), 1310720u);
  EXPECT_EQ(m.round_size(1310720), 1310720u);  // on a step: unchanged
  EXPECT_EQ(m.round_size(2 * MiB), 2 * MiB);   // a power of two: unchanged
  EXPECT_EQ(m.round_size(1500), 1536u);        // 1500 <= 512·4: plain 512-byte rounding
}

TEST(CachingAllocator, SmallAllocationsShareATwoMiBSegment) {
  CachingAllocatorModel m;
  ASSERT_FALSE(m.malloc(1, 1000));  // 1024 B of a new 2 MiB segment (split: 2 MiB - 1 KiB left)
  ASSERT_FALSE(m.malloc(2, 3000));  // 3072 B from the remainder, no new segment
  EXPECT_EQ(m.stats().allocated.current, 1024u + 3072u);
  EXPECT_EQ(m.stats().requested.current, 4000u);
  EXPECT_EQ(m.stats().reserved.current, 2 * MiB);
  EXPECT_EQ(m.stats().segments.current, 1u);
  // Frees merge the blocks back into one: empty_cache then returns the whole segment.
  m.free(1);
  m.free(2);
  EXPECT_EQ(m.stats().allocated.current, 0u);
  EXPECT_EQ(m.stats().reserved.current, 2 * MiB);  // cached, not returned
  m.empty_cache();
  EXPECT_EQ(m.stats().reserved.current, 0u);
  EXPECT_EQ(m.stats().reserved.peak, 2 * MiB);
}

TEST(CachingAllocator, LargeBlocksSplitOnlyWhenMoreThanOneMiBRemains) {
  CachingAllocatorModel m;
  // 11 MiB: a 12 MiB segment; 1 MiB would remain, not more than 1 MiB: no split, the whole
  // 12 MiB block is allocated.
  ASSERT_FALSE(m.malloc(1, 11 * MiB));
  EXPECT_EQ(m.stats().allocated.current, 12 * MiB);
  EXPECT_EQ(m.stats().requested.current, 11 * MiB);
  // 12 MiB + 1 B: rounded to 12 MiB + 512; a 14 MiB segment; 2 MiB - 512 remain: split.
  ASSERT_FALSE(m.malloc(2, 12 * MiB + 1));
  EXPECT_EQ(m.stats().allocated.current, 12 * MiB + 12 * MiB + 512);
  EXPECT_EQ(m.stats().reserved.current, 12 * MiB + 14 * MiB);
  // 1.5 MiB: the large pool; the 2 MiB - 512 remainder fits it (best fit): no new segment, and
  // 512 KiB - 512 would remain: no split.
  ASSERT_FALSE(m.malloc(3, 1536 * KiB));
  EXPECT_EQ(m.stats().reserved.current, 26 * MiB);
  EXPECT_EQ(m.stats().segments.current, 2u);
  EXPECT_EQ(m.stats().allocated.current, 24 * MiB + 512 + (2 * MiB - 512));
}

TEST(CachingAllocator, BestFitTakesTheSmallestBlockOfTheStream) {
  CachingAllocatorModel m;
  ASSERT_FALSE(m.malloc(1, 30 * MiB));
  ASSERT_FALSE(m.malloc(2, 24 * MiB));
  m.free(1);
  m.free(2);                            // cached: a 30 MiB and a 24 MiB segment
  ASSERT_FALSE(m.malloc(3, 22 * MiB));  // the 24 MiB one (2 MiB left: split)
  EXPECT_EQ(m.stats().segments.current, 2u);
  EXPECT_EQ(m.stats().allocated.current, 22 * MiB);
  // Another stream never reuses them: a new 22 MiB segment.
  ASSERT_FALSE(m.malloc(4, 22 * MiB, /*stream=*/1));
  EXPECT_EQ(m.stats().segments.current, 3u);
  EXPECT_EQ(m.stats().reserved.current, 30 * MiB + 24 * MiB + 22 * MiB);
}

TEST(CachingAllocator, CachedSegmentsAreReleasedAndTheMallocRetriedBeforeAnOom) {
  CachingAllocatorConfig c;
  c.device_bytes = 40 * MiB;
  CachingAllocatorModel m(c);
  ASSERT_FALSE(m.malloc(1, 20 * MiB));
  m.free(1);  // cached: 20 MiB
  // 30 MiB: the cached block is too small, cudaMalloc of 30 MiB fails (20 + 30 > 40), the
  // cached segment is released and the retry succeeds.
  ASSERT_FALSE(m.malloc(2, 30 * MiB));
  EXPECT_EQ(m.stats().alloc_retries, 1u);
  EXPECT_EQ(m.stats().reserved.current, 30 * MiB);
  EXPECT_EQ(m.stats().reserved.peak, 30 * MiB);
  EXPECT_EQ(m.stats().cuda_frees, 1u);
}

TEST(CachingAllocator, OutOfMemoryPrintsPyTorchsFigures) {
  CachingAllocatorConfig c;
  c.device_bytes = 40 * MiB;
  CachingAllocatorModel m(c);
  ASSERT_FALSE(m.malloc(1, 30 * MiB));
  const auto oom = m.malloc(2, 5 * MiB);  // a 20 MiB segment: 30 + 20 > 40, nothing cached
  ASSERT_TRUE(oom);
  EXPECT_EQ(oom->alloc_size, 20 * MiB);
  EXPECT_EQ(oom->device_free, 10 * MiB);
  EXPECT_EQ(oom->message,
            "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
            "40.00 MiB of which 10.00 MiB is free. Of the allocated memory 30.00 MiB is "
            "allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated.");
  EXPECT_EQ(m.stats().allocated.current, 30 * MiB);  // nothing allocated for the failed call
}

TEST(CachingAllocator, FreedNeighboursMergeWithinTheirSegment) {
  CachingAllocatorModel m;
  ASSERT_FALSE(m.malloc(1, 512));
  ASSERT_FALSE(m.malloc(2, 512));
  ASSERT_FALSE(m.malloc(3, 512));
  m.free(2);
  m.free(1);  // merges with 2's block
  // A 1 KiB request fits the merged 1 KiB hole exactly (best fit over the 2 MiB - 1.5 KiB tail).
  ASSERT_FALSE(m.malloc(4, 1024));
  EXPECT_EQ(m.stats().segments.current, 1u);
  m.free(3);
  m.free(4);
  m.empty_cache();  // everything merged back into the one segment block: released
  EXPECT_EQ(m.stats().reserved.current, 0u);
}

TEST(CachingAllocator, MaxSplitSizeKeepsOversizeBlocksForLargeRequests) {
  CachingAllocatorConfig c;
  c.max_split_size = 30 * MiB;
  CachingAllocatorModel m(c);
  ASSERT_FALSE(m.malloc(1, 40 * MiB));
  m.free(1);  // a cached 40 MiB block, >= max_split_size
  // 10 MiB < max_split_size never takes a block >= it: a new 10 MiB segment.
  ASSERT_FALSE(m.malloc(2, 10 * MiB));
  EXPECT_EQ(m.stats().segments.current, 2u);
  // 32 MiB >= max_split_size may take a block < 32 + 20 MiB: the 40 MiB one, unsplit.
  ASSERT_FALSE(m.malloc(3, 32 * MiB));
  EXPECT_EQ(m.stats().segments.current, 2u);
  EXPECT_EQ(m.stats().allocated.current, 10 * MiB + 40 * MiB);
}

TEST(CachingAllocator, BadInputNamesWhatIsWrong) {
  CachingAllocatorModel m;
  ASSERT_FALSE(m.malloc(7, 100));
  try {
    m.malloc(7, 100);
    ADD_FAILURE() << "a second allocation under the same id was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("id 7 is already allocated"), std::string::npos);
  }
  try {
    m.free(8);
    ADD_FAILURE() << "a free of an unknown id was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("id 8, which is not allocated"), std::string::npos);
  }
  CachingAllocatorConfig c;
  c.expandable_segments = true;
  EXPECT_THROW(CachingAllocatorModel{c}, InputError);
  c = {};
  c.max_split_size = 19 * MiB;  // PyTorch's floor is 20 MB
  EXPECT_THROW(CachingAllocatorModel{c}, InputError);
  c.max_split_size = 20 * MiB;
  EXPECT_NO_THROW(CachingAllocatorModel{c});
  c = {};
  c.max_non_split_rounding = 19 * MiB;
  EXPECT_THROW(CachingAllocatorModel{c}, InputError);
}

TEST(CachingAllocator, TorchFormatSize) {
  EXPECT_EQ(torch_format_size(512), "512 bytes");
  EXPECT_EQ(torch_format_size(1024), "1024 bytes");
  EXPECT_EQ(torch_format_size(1536), "1.50 KiB");
  EXPECT_EQ(torch_format_size(20 * MiB), "20.00 MiB");
  EXPECT_EQ(torch_format_size(1280 * MiB), "1.25 GiB");
}

}  // namespace
}  // namespace trainmem
