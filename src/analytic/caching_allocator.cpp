// A model of PyTorch's CUDA caching allocator (include/trainmem/analytic/caching_allocator.hpp).
// Names follow c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator) so that each function
// can be read beside the one it models.
#include "trainmem/analytic/caching_allocator.hpp"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <limits>

#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

constexpr std::uint64_t kMinBlockSize = 512;        // all sizes are rounded to at least 512 B
constexpr std::uint64_t kSmallSize = 1048576;       // largest "small" allocation: 1 MiB
constexpr std::uint64_t kSmallBuffer = 2097152;     // small allocations' segments: 2 MiB
constexpr std::uint64_t kMinLargeAlloc = 10485760;  // allocations below 10 MiB take 20 MiB
constexpr std::uint64_t kLargeBuffer = 20971520;    // ... segments of 20 MiB
constexpr std::uint64_t kRoundLarge = 2097152;      // larger ones round up to 2 MiB

std::uint64_t round_up(std::uint64_t v, std::uint64_t m) {
  return checked_mul(checked_add(v, m - 1, "allocation size") / m, m, "allocation size");
}

std::uint64_t floor_pow2(std::uint64_t v) {
  std::uint64_t p = 1;
  while (p <= v / 2) p *= 2;
  return p;
}

}  // namespace

struct CachingAllocatorModel::Block {
  // Where it lies: its segment and its offset in it (the model's address: segments are ordered
  // by when they were made, as PyTorch's pointers order them only by chance).
  std::uint64_t segment = 0, address = 0, size = 0;
  int stream = 0;
  bool small = false;      // its pool
  bool allocated = false;  // handed out (else in its pool, or unmapped)
  // Expandable segments: the page size of its segment (0: a cudaMalloc'ed segment), and
  // whether its range is mapped (an unmapped block is in unmapped_small_/unmapped_large_).
  std::uint64_t page = 0;
  bool mapped = true;
  std::uint64_t requested = 0;
  Block* prev = nullptr;  // neighbours within the segment
  Block* next = nullptr;
};

// BlockComparatorSize: by stream, then size, then address.
bool CachingAllocatorModel::BySize::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  if (a->segment != b->segment) return a->segment < b->segment;
  return a->address < b->address;
}

// BlockComparatorAddress (the unmapped blocks): by stream, then address.
bool CachingAllocatorModel::ByAddress::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->segment != b->segment) return a->segment < b->segment;
  return a->address < b->address;
}

void StatPair::add(std::uint64_t v) {
  current = checked_add(current, v, "allocator statistics");
  if (current > peak) peak = current;
}

void StatPair::sub(std::uint64_t v) {
  if (v > current) throw Error("caching allocator model: a statistic went below zero");
  current -= v;
}

void CachingAllocatorConfig::check() const {
  if (garbage_collection_threshold > 0)
    throw InputError(
        "--allocator pytorch:garbage_collection_threshold is not modelled yet (it needs "
        "set_per_process_memory_fraction and block ages); leave it unset");
  // PyTorch's parser (AcceleratorAllocatorConfig): both at least kLargeBuffer, 20 MB.
  if (max_split_size && *max_split_size < kLargeBuffer)
    throw InputError(
        "--allocator pytorch:max_split_size_mb must be at least 20 (PyTorch's own floor), got " +
        std::to_string(*max_split_size >> 20));
  if (max_non_split_rounding < kLargeBuffer)
    throw InputError(
        "--allocator pytorch:max_non_split_rounding_mb must be at least 20 (PyTorch's own "
        "floor), got " +
        std::to_string(max_non_split_rounding >> 20));
}

std::string torch_format_size(std::uint64_t size) {
  char buf[64];
  if (size <= 1024)
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(size));
  else if (size <= 1048576)
    std::snprintf(buf, sizeof buf, "%.2f KiB", double(size) / 1024.0);
  else if (size <= 1073741824ULL)
    std::snprintf(buf, sizeof buf, "%.2f MiB", double(size) / 1048576.0);
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(size) / 1073741824.0);
  return buf;
}

CachingAllocatorModel::CachingAllocatorModel(CachingAllocatorConfig config)
    : config_(std::move(config)) {
  config_.check();
}

CachingAllocatorModel::~CachingAllocatorModel() {
  for (Pool* pool : {&small_, &large_})
    for (Block* b : *pool) delete b;
  for (Unmapped* u : {&unmapped_small_, &unmapped_large_})
    for (Block* b : *u) delete b;
  for (auto& [id, b] : active_) delete b;
}

// round_size: 512 B at least, then multiples of 512, or the next power-of-2 division.
std::uint64_t CachingAllocatorModel::round_size(std::uint64_t size) const {
  if (size < kMinBlockSize) return kMinBlockSize;
  const std::uint64_t d = config_.roundup_power2_divisions;
  if (d > 1 && size > kMinBlockSize * d) {
    // roundup_power2_next_division: a power of two stays; else the next of d equal steps
    // between the powers of two around it (d is taken down to a power of two, as the
    // source's shift by floor(log2(d)) does).
    if ((size & (size - 1)) == 0) return size;
    const std::uint64_t floor = floor_pow2(size);
    const std::uint64_t step = floor / floor_pow2(d);
    if (step == 0) return floor * 2;
    const std::uint64_t below = size & ~(step - 1);
    return below == size ? size : checked_add(below, step, "allocation size");
  }
  return round_up(size, kMinBlockSize);
}

// get_allocation_size: the segment a miss asks cudaMalloc for.
std::uint64_t CachingAllocatorModel::allocation_size(std::uint64_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return round_up(size, kRoundLarge);
}

CachingAllocatorModel::Block* CachingAllocatorModel::get_free_block(Pool& pool, std::uint64_t size,
                                                                    int stream) {
  Block key;
  key.stream = stream;
  key.size = size;
  key.address = 0;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  if ((*it)->page) {
    // Expandable segments: a free block followed by unmapped space counts as the size it can
    // grow to, so the walk moves on while the next block's such size is smaller.
    auto expandable_size = [](const Block* b) {
      return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
    };
    auto next = std::next(it);
    while ((*it)->page && next != pool.end() && (*next)->stream == stream &&
           expandable_size(*next) < expandable_size(*it))
      it = next++;
  }
  if (config_.max_split_size) {
    const std::uint64_t max_split = *config_.max_split_size;
    // Do not return an oversized block for a request below max_split_size; a request above it
    // takes a block at most max_non_split_rounding larger.
    if (size < max_split && (*it)->size >= max_split) return nullptr;
    if (size >= max_split && (*it)->size >= size + config_.max_non_split_rounding) return nullptr;
  }
  Block* b = *it;
  pool.erase(it);
  return b;
}

CachingAllocatorModel::Block* CachingAllocatorModel::alloc_block(Pool& pool,
                                                                 std::uint64_t alloc_size,
                                                                 std::uint64_t size, int stream,
                                                                 bool retry) {
  if (retry) ++stats_.alloc_retries;
  if (config_.expandable_segments) return try_allocate_expandable_block(pool, size, stream);
  if (config_.device_bytes &&
      checked_add(stats_.reserved.current, alloc_size, "reserved bytes") > *config_.device_bytes)
    return nullptr;  // cudaMalloc fails
  Block* b = new Block;
  b->segment = next_segment_++;
  b->size = alloc_size;
  b->stream = stream;
  b->small = &pool == &small_;
  set_segment(b->segment, alloc_size);
  ++stats_.cuda_mallocs;
  stats_.segments.add(1);
  stats_.reserved.add(alloc_size);
  return b;
}

// Cuts `b` after its first `keep` bytes: the rest becomes a block of its own (the same segment,
// stream, pool and mapping), linked after `b`, in no set yet.
CachingAllocatorModel::Block* CachingAllocatorModel::split_block(Block* b, std::uint64_t keep) {
  Block* rest = new Block(*b);
  rest->address = b->address + keep;
  rest->size = b->size - keep;
  rest->prev = b;
  rest->next = b->next;
  if (rest->next) rest->next->prev = rest;
  b->next = rest;
  b->size = keep;
  return rest;
}

// ---------------------------------------------------------------- expandable segments

// try_allocate_expandable_block: the lowest-address run of free and unmapped space of the pool
// and stream that holds `size` (or a new segment), mapped as far as `size` needs.
CachingAllocatorModel::Block* CachingAllocatorModel::try_allocate_expandable_block(
    Pool& pool, std::uint64_t size, int stream) {
  Block* candidate = find_expandable_block(pool, size, stream);
  // candidate: unmapped, or free -> unmapped -> ...
  if (!candidate->mapped && !map_block(candidate, std::min(candidate->size, size))) return nullptr;
  while (candidate->size < size) {
    // free -> unmapped: map what is missing; the mapped range merges with the free block.
    Block* next = candidate->next;
    if (!next || next->mapped)
      throw Error("caching allocator model: an expandable candidate without unmapped space");
    if (!map_block(next, std::min(size - candidate->size, next->size))) return nullptr;
    candidate = next;
  }
  pool.erase(candidate);
  return candidate;
}

// find_expandable_block: first fit by address over the pool's unmapped blocks of the stream,
// each with the free block before it; else a new segment of one unmapped block.
CachingAllocatorModel::Block* CachingAllocatorModel::find_expandable_block(Pool& pool,
                                                                           std::uint64_t size,
                                                                           int stream) {
  Unmapped& unmapped = unmapped_of(pool);
  auto allocatable = [](const Block* b) { return b && !b->allocated; };
  auto has_space = [&](const Block* b) {
    std::uint64_t bytes = 0;
    while (bytes < size && allocatable(b)) {
      bytes += b->size;
      b = b->next;
    }
    return bytes >= size;
  };
  Block key;
  key.stream = stream;
  for (auto it = unmapped.lower_bound(&key); it != unmapped.end() && (*it)->stream == stream;
       ++it) {
    Block* c = *it;
    if (allocatable(c->prev)) c = c->prev;
    if (has_space(c)) return c;
  }
  // A new segment: its address range covers 1 1/8 of the device, in whole pages.
  const bool small = &pool == &small_;
  const std::uint64_t page = small ? kSmallBuffer : kLargeBuffer;
  std::uint64_t range = std::uint64_t(1) << 62;  // no device size: room for any request
  if (config_.device_bytes && *config_.device_bytes <= (std::uint64_t(1) << 61)) {
    const std::uint64_t t = *config_.device_bytes;
    range = std::min(range, round_up(t / 8 + t, page));
  }
  Block* b = new Block;
  b->segment = next_segment_++;
  b->size = std::max(range, page);
  b->stream = stream;
  b->small = small;
  b->page = page;
  b->mapped = false;
  unmapped.insert(b);
  return b;
}

// map_block: maps [to_map, to_map + size) rounded up to pages (all or nothing: false when the
// device has no room); the rest of the unmapped block stays unmapped after it, and the mapped
// range merges with the free blocks around it.
bool CachingAllocatorModel::map_block(Block* to_map, std::uint64_t size) {
  const std::uint64_t mapped = std::min(round_up(size, to_map->page), to_map->size);
  if (config_.device_bytes &&
      checked_add(stats_.reserved.current, mapped, "reserved bytes") > *config_.device_bytes)
    return false;  // cuMemCreate fails
  Unmapped& unmapped = to_map->small ? unmapped_small_ : unmapped_large_;
  unmapped.erase(to_map);
  if (to_map->size > mapped) unmapped.insert(split_block(to_map, mapped));
  to_map->mapped = true;
  try_merge(to_map, to_map->prev);
  try_merge(to_map, to_map->next);
  (to_map->small ? small_ : large_).insert(to_map);
  ++stats_.cuda_mallocs;
  stats_.reserved.add(mapped);
  set_segment(to_map->segment, checked_add(held_[to_map->segment], mapped, "reserved bytes"));
  return true;
}

// unmap_block: the whole pages inside the free block `b` are unmapped; what is left of it on
// either side stays a free, mapped block. `b` becomes the unmapped range (merged with unmapped
// neighbours).
void CachingAllocatorModel::unmap_block(Block* b) {
  const std::uint64_t begin = round_up(b->address, b->page);
  const std::uint64_t end = (b->address + b->size) / b->page * b->page;
  if (begin >= end) return;
  Pool& pool = b->small ? small_ : large_;
  pool.erase(b);
  if (b->address < begin) {
    Block* before = new Block(*b);
    before->size = begin - b->address;
    before->next = b;
    if (before->prev) before->prev->next = before;
    b->prev = before;
    pool.insert(before);
  }
  if (b->address + b->size > end) pool.insert(split_block(b, end - b->address));
  b->size = end - begin;
  b->address = begin;
  b->mapped = false;
  try_merge(b, b->prev);
  try_merge(b, b->next);
  (b->small ? unmapped_small_ : unmapped_large_).insert(b);
  ++stats_.cuda_frees;
  stats_.reserved.sub(end - begin);
  set_segment(b->segment, held_[b->segment] - (end - begin));
}

// ---------------------------------------------------------------- the cudaMalloc'ed segments

// release_available_cached_blocks: with max_split_size set, free the smallest cached oversize
// block that covers the request, or the largest ones until they do. Expandable blocks are not
// released this way (PyTorch skips them since pull request 134338).
bool CachingAllocatorModel::release_available_cached_blocks(Pool& pool, std::uint64_t size,
                                                            int stream) {
  if (!config_.max_split_size || config_.expandable_segments) return false;
  const std::uint64_t max_split = *config_.max_split_size;
  Block key;
  key.stream = stream;
  key.size = size < max_split ? max_split : size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) {
    if (it == pool.begin()) return false;
    std::uint64_t released = 0;
    --it;  // the largest block of the stream, if any
    while (released < key.size && (*it)->size >= max_split && (*it)->stream == stream) {
      auto cur = it;
      released += (*it)->size;
      const bool first = it == pool.begin();
      if (!first) --it;
      release_block(*cur);
      if (first) break;
    }
    return released >= key.size;
  }
  release_block(*it);
  return true;
}

// release_cached_blocks (release_blocks of each pool): every cached block that is a whole
// segment goes back to the device; in an expandable segment, the whole pages inside each free
// block are unmapped, and a segment left wholly unmapped is released.
void CachingAllocatorModel::release_cached_blocks() {
  for (Pool* pool : {&large_, &small_}) {
    std::vector<Block*> to_unmap;
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it++;
      if (b->page)
        to_unmap.push_back(b);
      else if (!b->prev && !b->next)
        release_block(b);
    }
    for (Block* b : to_unmap) {
      unmap_block(b);
      if (!b->prev && !b->next && !b->mapped) {
        (b->small ? unmapped_small_ : unmapped_large_).erase(b);
        delete b;  // release_expandable_segment: its address range goes
      }
    }
  }
}

// release_block: a cached whole-segment block is cudaFree'd (its segment's bytes leave the
// reserve). In the source only unsplit blocks reach it.
void CachingAllocatorModel::release_block(Block* b) {
  if (b->prev || b->next || b->allocated)
    throw Error("caching allocator model: releasing a block that is not a whole free segment");
  (b->small ? small_ : large_).erase(b);
  set_segment(b->segment, 0);
  ++stats_.cuda_frees;
  stats_.segments.sub(1);
  stats_.reserved.sub(b->size);
  delete b;
}

bool CachingAllocatorModel::should_split(const Block* b, std::uint64_t size) const {
  const std::uint64_t remaining = b->size - size;
  if (b->small || config_.expandable_segments) return remaining >= kMinBlockSize;
  const bool below_max_split = !config_.max_split_size || size < *config_.max_split_size;
  return below_max_split && remaining > kSmallSize;
}

std::optional<CachingAllocatorOom> CachingAllocatorModel::malloc(std::uint64_t id,
                                                                 std::uint64_t bytes, int stream) {
  if (active_.count(id))
    throw InputError("allocation id " + std::to_string(id) + " is already allocated");
  if (bytes == 0) throw InputError("allocation id " + std::to_string(id) + ": 0 bytes");
  const std::uint64_t size = round_size(bytes);
  Pool& pool = size <= kSmallSize ? small_ : large_;
  const std::uint64_t alloc_size = allocation_size(size);
  const std::uint64_t reserved_peak_before = stats_.reserved.peak;
  Block* b = get_free_block(pool, size, stream);
  if (!b) b = alloc_block(pool, alloc_size, size, stream, false);
  if (!b && release_available_cached_blocks(pool, size, stream))
    b = alloc_block(pool, alloc_size, size, stream, false);
  if (!b) {
    release_cached_blocks();
    b = alloc_block(pool, alloc_size, size, stream, true);
  }
  if (!b) {
    CachingAllocatorOom oom;
    oom.requested = bytes;
    oom.alloc_size = alloc_size;
    oom.device_bytes = *config_.device_bytes;
    oom.device_free = oom.device_bytes - stats_.reserved.current;
    oom.allocated = stats_.allocated.current;
    oom.reserved = stats_.reserved.current;
    oom.message = "CUDA out of memory. Tried to allocate " + torch_format_size(alloc_size) +
                  ". GPU 0 has a total capacity of " + torch_format_size(oom.device_bytes) +
                  " of which " + torch_format_size(oom.device_free) +
                  " is free. Of the allocated memory " + torch_format_size(oom.allocated) +
                  " is allocated by PyTorch, and " +
                  torch_format_size(oom.reserved - oom.allocated) +
                  " is reserved by PyTorch but unallocated.";
    return oom;
  }
  // The block keeps the front `size` bytes; the rest goes back to the pool.
  if (should_split(b, size)) pool.insert(split_block(b, size));
  b->allocated = true;
  b->requested = bytes;
  active_[id] = b;
  stats_.allocated.add(b->size);
  stats_.requested.add(bytes);
  // The instant of the reserved peak with the most allocated: a new peak, or more allocated
  // while reserved still stands at it.
  if (stats_.reserved.peak > reserved_peak_before ||
      (stats_.reserved.current == stats_.reserved.peak &&
       stats_.allocated.current > stats_.allocated_at_reserved_peak)) {
    stats_.allocated_at_reserved_peak = stats_.allocated.current;
    log_at_reserved_peak_ = segment_log_.size();
  }
  return std::nullopt;
}

void CachingAllocatorModel::free(std::uint64_t id) {
  auto it = active_.find(id);
  if (it == active_.end())
    throw InputError("free of allocation id " + std::to_string(id) + ", which is not allocated");
  Block* b = it->second;
  active_.erase(it);
  stats_.allocated.sub(b->size);
  stats_.requested.sub(b->requested);
  free_block(b);
}

// free_block: merge with the free neighbours of the segment, then back to the pool.
void CachingAllocatorModel::free_block(Block* b) {
  b->allocated = false;
  b->requested = 0;
  Block* prev = b->prev;
  Block* next = b->next;
  try_merge(b, prev);
  try_merge(b, next);
  (b->small ? small_ : large_).insert(b);
}

void CachingAllocatorModel::try_merge(Block* dst, Block* src) {
  if (!src || src->allocated || src->mapped != dst->mapped) return;
  if (src->mapped)
    (src->small ? small_ : large_).erase(src);
  else
    (src->small ? unmapped_small_ : unmapped_large_).erase(src);
  if (dst->prev == src) {
    dst->address = src->address;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
  } else {
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  dst->size += src->size;
  delete src;
}

void CachingAllocatorModel::empty_cache() {
  release_cached_blocks();
}

std::vector<std::uint64_t> CachingAllocatorModel::segment_sizes() const {
  std::vector<std::uint64_t> out;
  for (const auto& [address, size] : held_) out.push_back(size);
  return out;
}

void CachingAllocatorModel::set_segment(std::uint64_t segment, std::uint64_t size) {
  if (size)
    held_[segment] = size;
  else
    held_.erase(segment);
  segment_log_.emplace_back(segment, size);
}

std::vector<std::uint64_t> CachingAllocatorModel::segments_at_reserved_peak() const {
  std::map<std::uint64_t, std::uint64_t> held;
  for (std::size_t n = 0; n < log_at_reserved_peak_; ++n) {
    const auto& [address, size] = segment_log_[n];
    if (size)
      held[address] = size;
    else
      held.erase(address);
  }
  std::vector<std::uint64_t> out;
  for (const auto& [address, size] : held) out.push_back(size);
  return out;
}

void CachingAllocatorModel::reset_peaks() {
  for (StatPair* p : {&stats_.allocated, &stats_.reserved, &stats_.requested, &stats_.segments})
    p->peak = p->current;
  stats_.allocated_at_reserved_peak = stats_.allocated.current;
  log_at_reserved_peak_ = segment_log_.size();
}

}  // namespace trainmem
