// The model of PyTorch's CUDA caching allocator (analytic/caching_allocator.hpp) against cases
// worked by hand from the rules of c10/cuda/CUDACachingAllocator.cpp (each case names the rule
// it exercises: round_size, get_allocation_size, get_free_block, should_split, free_block and
// try_merge_blocks, the release-and-retry path before an out-of-memory, release_cached_blocks).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

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
  c.max_split_size = 19 * MiB;  // PyTorch's floor is 20 MB
  EXPECT_THROW(CachingAllocatorModel{c}, InputError);
  c.max_split_size = 20 * MiB;
  EXPECT_NO_THROW(CachingAllocatorModel{c});
  c = {};
  c.max_non_split_rounding = 19 * MiB;
  EXPECT_THROW(CachingAllocatorModel{c}, InputError);
}

// ---------------------------------------------------------------- expandable segments
// Rules (c10/cuda/CUDACachingAllocator.cpp): find_expandable_block takes the lowest unmapped
// block of the pool and stream with the free block before it; try_allocate_expandable_block
// maps only the rounded request (ExpandableSegment::map rounds the end up to a page: 20 MiB in
// the large pool, 2 MiB in the small one), never get_allocation_size; should_split splits
// whenever >= 512 B remain; free_block never unmaps; release_cached_blocks unmaps the whole
// pages inside free blocks (ExpandableSegment::unmap rounds inwards); reserved_bytes counts the
// mapped pages; the "segment" statistics do not count expandable segments.

CachingAllocatorConfig expandable(std::optional<std::uint64_t> device = std::nullopt) {
  CachingAllocatorConfig c;
  c.expandable_segments = true;
  c.device_bytes = device;
  return c;
}

TEST(CachingAllocatorExpandable, MapsPagesForTheRequestOnly) {
  CachingAllocatorModel m(expandable());
  // 11 MiB: a new large segment, one 20 MiB page mapped; split (9 MiB remain, >= 512 B), so
  // memory_allocated grows by 11 MiB exactly (not the 12 MiB block of the cudaMalloc path).
  ASSERT_FALSE(m.malloc(1, 11 * MiB));
  EXPECT_EQ(m.stats().allocated.current, 11 * MiB);
  EXPECT_EQ(m.stats().reserved.current, 20 * MiB);
  // 30 MiB: the free 9 MiB at the end plus the unmapped tail; 21 MiB more rounds to two pages.
  ASSERT_FALSE(m.malloc(2, 30 * MiB));
  EXPECT_EQ(m.stats().allocated.current, 41 * MiB);
  EXPECT_EQ(m.stats().reserved.current, 60 * MiB);
  // A free never unmaps.
  m.free(1);
  EXPECT_EQ(m.stats().reserved.current, 60 * MiB);
  // 5 MiB: best fit is the free [0, 11) MiB (the block before the tail counts as the size it
  // can grow to, so it is not smaller): no new page.
  ASSERT_FALSE(m.malloc(3, 5 * MiB));
  EXPECT_EQ(m.stats().allocated.current, 35 * MiB);
  EXPECT_EQ(m.stats().reserved.current, 60 * MiB);
  // 600 KiB: the small pool's own segment, one 2 MiB page.
  ASSERT_FALSE(m.malloc(4, 600 * KiB));
  EXPECT_EQ(m.stats().allocated.current, 35 * MiB + 600 * KiB);
  EXPECT_EQ(m.stats().reserved.current, 62 * MiB);
  EXPECT_EQ(m.stats().allocated.peak, 41 * MiB);
  EXPECT_EQ(m.stats().reserved.peak, 62 * MiB);
  EXPECT_EQ(m.stats().segments.peak, 0u);  // not counted as cudaMalloc'ed segments
  EXPECT_EQ(m.stats().cuda_mallocs, 3u);   // three map calls
  // Two ranges: the large one (60 MiB mapped) and the small one (2 MiB).
  EXPECT_EQ(m.segment_sizes(), (std::vector<std::uint64_t>{60 * MiB, 2 * MiB}));
  // empty_cache: no whole page lies inside a free block ([5, 11) MiB, [41, 60) MiB and the
  // small page's rest): nothing is unmapped.
  m.empty_cache();
  EXPECT_EQ(m.stats().reserved.current, 62 * MiB);
  // Freeing the 30 MiB block merges [5, 60) MiB; empty_cache unmaps pages [20, 60) MiB.
  m.free(2);
  m.empty_cache();
  EXPECT_EQ(m.stats().reserved.current, 22 * MiB);
  EXPECT_EQ(m.stats().cuda_frees, 1u);
  // Freeing the 5 MiB block: [0, 20) MiB is one free page, unmapped; the large segment, wholly
  // unmapped, is released. The small page stays.
  m.free(3);
  m.empty_cache();
  EXPECT_EQ(m.stats().reserved.current, 2 * MiB);
  EXPECT_EQ(m.segment_sizes(), (std::vector<std::uint64_t>{2 * MiB}));
}

TEST(CachingAllocatorExpandable, SmallRequestsSharePagesAcrossTheirBoundaries) {
  // Ten 600 KiB requests: one growing range of 6000 KiB, three 2 MiB pages (the cudaMalloc
  // path puts three in each 2 MiB segment: four segments, 8 MiB).
  CachingAllocatorModel e(expandable());
  CachingAllocatorModel plain;
  for (std::uint64_t id = 1; id <= 10; ++id) {
    ASSERT_FALSE(e.malloc(id, 600 * KiB));
    ASSERT_FALSE(plain.malloc(id, 600 * KiB));
  }
  EXPECT_EQ(e.stats().reserved.current, 6 * MiB);
  EXPECT_EQ(plain.stats().reserved.current, 8 * MiB);
}

TEST(CachingAllocatorExpandable, BestFitPrefersABlockThatCannotGrow) {
  CachingAllocatorModel m(expandable());
  // Layout: A [0, 15) MiB, B [15, 28), C [28, 40) and the unmapped tail from 40 MiB (two pages).
  ASSERT_FALSE(m.malloc(1, 15 * MiB));
  ASSERT_FALSE(m.malloc(2, 13 * MiB));
  ASSERT_FALSE(m.malloc(3, 12 * MiB));
  EXPECT_EQ(m.stats().reserved.current, 40 * MiB);
  m.free(1);  // free [0, 15): cannot grow
  m.free(3);  // free [28, 40): 12 MiB, before the unmapped tail
  // 10 MiB: lower_bound gives the 12 MiB block, but its size counting the tail is larger than
  // the 15 MiB block's, so the walk moves on and takes the 15 MiB block.
  ASSERT_FALSE(m.malloc(4, 10 * MiB));
  // The 12 MiB block is still free: 12 MiB more fit without mapping a page.
  ASSERT_FALSE(m.malloc(5, 12 * MiB));
  EXPECT_EQ(m.stats().reserved.current, 40 * MiB);
  EXPECT_EQ(m.stats().allocated.current, 13 * MiB + 10 * MiB + 12 * MiB);
}

TEST(CachingAllocatorExpandable, OutOfMemoryAndTheUnmapRetry) {
  // A 40 MiB device: 11 MiB maps one page (20 MiB); 30 MiB needs two more (60 > 40); nothing
  // whole is free to unmap, the retry fails. "Tried to allocate" is get_allocation_size of the
  // request, 30 MiB, not the 40 MiB the map needed.
  CachingAllocatorModel m(expandable(40 * MiB));
  ASSERT_FALSE(m.malloc(1, 11 * MiB));
  const auto oom = m.malloc(2, 30 * MiB);
  ASSERT_TRUE(oom);
  EXPECT_EQ(oom->alloc_size, 30 * MiB);
  EXPECT_EQ(oom->reserved, 20 * MiB);
  EXPECT_EQ(oom->allocated, 11 * MiB);
  EXPECT_EQ(m.stats().alloc_retries, 1u);
  // 29 MiB needs one page: 20 + 20 = 40 fits exactly.
  ASSERT_FALSE(m.malloc(3, 29 * MiB));
  EXPECT_EQ(m.stats().reserved.current, 40 * MiB);

  // A 60 MiB device: 11 + 30 MiB map 60 MiB; the 30 MiB block freed, a small request needs a
  // 2 MiB page (62 > 60); the retry unmaps pages [20, 60) MiB inside the free [11, 60) and maps
  // the small page: reserved 22 MiB, its peak still 60 MiB.
  CachingAllocatorModel n(expandable(60 * MiB));
  ASSERT_FALSE(n.malloc(1, 11 * MiB));
  ASSERT_FALSE(n.malloc(2, 30 * MiB));
  n.free(2);
  ASSERT_FALSE(n.malloc(3, 600 * KiB));
  EXPECT_EQ(n.stats().reserved.current, 22 * MiB);
  EXPECT_EQ(n.stats().reserved.peak, 60 * MiB);
  EXPECT_EQ(n.stats().alloc_retries, 1u);
  // Now 30 MiB: the free [11, 20) MiB plus two pages: 22 + 40 > 60, nothing whole to unmap.
  const auto oom2 = n.malloc(4, 30 * MiB);
  ASSERT_TRUE(oom2);
  EXPECT_NE(oom2->message.find("Tried to allocate 30.00 MiB"), std::string::npos);
}

TEST(CachingAllocatorExpandable, EveryAllocationFreedLeavesNothingAfterEmptyCache) {
  CachingAllocatorModel m(expandable(1024 * MiB));
  std::uint64_t id = 1;
  for (std::uint64_t bytes :
       {3 * MiB, std::uint64_t{100}, 700 * KiB, 45 * MiB, 1 * MiB + 1, 21 * MiB})
    ASSERT_FALSE(m.malloc(id++, bytes));
  for (std::uint64_t n = 1; n < id; n += 2) m.free(n);  // every other one first
  for (std::uint64_t n = 2; n < id; n += 2) m.free(n);
  EXPECT_EQ(m.stats().allocated.current, 0u);
  m.empty_cache();
  EXPECT_EQ(m.stats().reserved.current, 0u);
  EXPECT_TRUE(m.segment_sizes().empty());
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
