// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, the
// DeviceCachingAllocator class), to say what `torch.cuda.memory_reserved` would show for a
// sequence of allocations and frees, and whether PyTorch would raise an out-of-memory under a
// device of a given size. The rules, as the source defines them (docs/allocator.md states each):
//
//   round_size        requests below 512 B take 512 B, the rest round up to a multiple of 512
//                     (with roundup_power2_divisions d > 1 and size > 512·d: to the next 1/d step
//                     between two powers of two);
//   pools             rounded size <= 1 MiB: the small pool, else the large one; a free block is
//                     reused only by its own stream;
//   get_free_block    best fit: the smallest free block of the stream >= the size (ties by
//                     address); with max_split_size set, a request below it never takes a block
//                     >= it, and a request >= it only a block < request + max_non_split_rounding;
//   alloc_block       on a miss, a new segment (cudaMalloc) of get_allocation_size: <= 1 MiB ->
//                     2 MiB, < 10 MiB -> 20 MiB, else rounded up to 2 MiB;
//   the retries       if that cudaMalloc fails: release cached oversize blocks (only with
//                     max_split_size set) and retry; then release every cached segment that is
//                     one free block and retry; then out of memory;
//   should_split      small pool: split when >= 512 B remain; large pool: when the request is
//                     below max_split_size and more than 1 MiB remains; otherwise the request
//                     gets the whole block (allocated bytes count the block, requested bytes the
//                     request);
//   free_block        a freed block merges with its free neighbours of the same segment and goes
//                     back to its pool; memory returns to the device only through the retries or
//                     empty_cache.
//
// expandable_segments=true (PyTorch's ExpandableSegment): each pool and stream grows one virtual
// range of 1.125 x the device (unbounded without a device size) by mapping pages (2 MiB small,
// 20 MiB large) for the rounded request only; blocks split whenever >= 512 B remain, in both
// pools; a free never unmaps; the retries and empty_cache unmap the whole pages inside free
// blocks, and release a segment left wholly unmapped. docs/allocator.md, "Expandable segments".
//
// Not modelled (refused by the configuration check): the garbage collection threshold, CUDA
// graphs' private pools, events and recordStream delaying reuse.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace trainmem {

struct CachingAllocatorConfig {
  // max_split_size_mb (in bytes here); unset: unlimited (PyTorch's default).
  std::optional<std::uint64_t> max_split_size;
  // max_non_split_rounding_mb: how much larger than a request >= max_split_size a reused block
  // may be (20 MiB by default, kLargeBuffer in older releases).
  std::uint64_t max_non_split_rounding = 20971520;
  // roundup_power2_divisions (one value for every size); 0 or 1: plain 512-byte rounding.
  std::uint64_t roundup_power2_divisions = 0;
  // What cudaMalloc can hand out in total (the device's free memory); unset: unlimited.
  std::optional<std::uint64_t> device_bytes;
  bool expandable_segments = false;
  double garbage_collection_threshold = 0;  // not modelled: check() refuses a value > 0
  // InputError naming the option and what is allowed.
  void check() const;
};

// A figure's current value and its high-water mark.
struct StatPair {
  std::uint64_t current = 0;
  std::uint64_t peak = 0;
  void add(std::uint64_t v);
  void sub(std::uint64_t v);
};

struct CachingAllocatorStats {
  StatPair allocated;  // bytes of the blocks handed out (memory_allocated)
  StatPair reserved;   // bytes of the segments held (memory_reserved)
  StatPair requested;  // bytes the callers asked for
  // cudaMalloc'ed segments held; an expandable segment is not counted (PyTorch's "segment"
  // statistics do not count them either).
  StatPair segments;
  std::uint64_t alloc_retries = 0;  // cudaMalloc retried after releasing cached blocks
  // cudaMalloc / cudaFree calls; with expandable segments, the map and unmap calls
  // (num_device_alloc / num_device_free).
  std::uint64_t cuda_mallocs = 0, cuda_frees = 0;
  // The most bytes allocated while reserved stood at its peak (reserved.peak - this: what the
  // cache held unused then, at the least).
  std::uint64_t allocated_at_reserved_peak = 0;
};

// An allocation PyTorch would refuse: the numbers its message prints.
struct CachingAllocatorOom {
  std::uint64_t requested = 0;   // the caller's bytes
  std::uint64_t alloc_size = 0;  // the segment it tried to cudaMalloc ("Tried to allocate")
  std::uint64_t device_bytes = 0;
  std::uint64_t device_free = 0;  // device_bytes - reserved, after the retries
  std::uint64_t allocated = 0;    // "is allocated by PyTorch"
  std::uint64_t reserved = 0;     // reserved - allocated: "reserved by PyTorch but unallocated"
  std::string message;            // PyTorch's wording, with its size format
};

// PyTorch's format_size: "512 bytes", "1.50 KiB", "20.00 MiB", "1.25 GiB".
std::string torch_format_size(std::uint64_t bytes);

class CachingAllocatorModel {
 public:
  explicit CachingAllocatorModel(CachingAllocatorConfig config = {});
  ~CachingAllocatorModel();
  CachingAllocatorModel(const CachingAllocatorModel&) = delete;
  CachingAllocatorModel& operator=(const CachingAllocatorModel&) = delete;

  // Allocates `bytes` (> 0) under `id` on `stream`. Returns the out-of-memory PyTorch would
  // raise, with nothing allocated, or nullopt. InputError if `id` is already allocated.
  std::optional<CachingAllocatorOom> malloc(std::uint64_t id, std::uint64_t bytes, int stream = 0);
  // Frees the block of `id` (InputError if none is allocated under it).
  void free(std::uint64_t id);
  // torch.cuda.empty_cache(): every cached segment that is one free block goes back.
  void empty_cache();

  const CachingAllocatorStats& stats() const { return stats_; }
  // The segments held now: their sizes, in the order they were allocated.
  std::vector<std::uint64_t> segment_sizes() const;
  // The segments held at that instant (since the start or reset_peaks()).
  std::vector<std::uint64_t> segments_at_reserved_peak() const;
  // torch.cuda.reset_peak_memory_stats(): every peak becomes its current value.
  void reset_peaks();

  // The rules, exposed for the tests and the docs.
  std::uint64_t round_size(std::uint64_t bytes) const;
  static std::uint64_t allocation_size(std::uint64_t rounded);

 private:
  struct Block;
  struct BySize {
    bool operator()(const Block* a, const Block* b) const;
  };
  struct ByAddress {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BySize>;         // free, mapped blocks
  using Unmapped = std::set<Block*, ByAddress>;  // expandable segments' unmapped ranges

  Block* get_free_block(Pool& pool, std::uint64_t size, int stream);
  Block* alloc_block(Pool& pool, std::uint64_t alloc_size, std::uint64_t size, int stream,
                     bool retry);
  // Expandable segments (try_allocate_expandable_block and what it calls).
  Block* try_allocate_expandable_block(Pool& pool, std::uint64_t size, int stream);
  Block* find_expandable_block(Pool& pool, std::uint64_t size, int stream);
  bool map_block(Block* to_map, std::uint64_t size);
  void unmap_block(Block* b);
  Unmapped& unmapped_of(const Pool& pool) {
    return &pool == &small_ ? unmapped_small_ : unmapped_large_;
  }
  bool release_available_cached_blocks(Pool& pool, std::uint64_t size, int stream);
  void release_cached_blocks();
  void release_block(Block* b);
  bool should_split(const Block* b, std::uint64_t size) const;
  Block* split_block(Block* b, std::uint64_t keep);
  void free_block(Block* b);
  void try_merge(Block* dst, Block* src);

  CachingAllocatorConfig config_;
  CachingAllocatorStats stats_;
  Pool small_, large_;
  Unmapped unmapped_small_, unmapped_large_;
  // Every block is in a pool (free) or here (allocated); the model owns them (new/delete).
  std::map<std::uint64_t, Block*> active_;  // id -> block
  // Segment -> bytes held (cudaMalloc'ed, or the pages an expandable segment has mapped).
  std::map<std::uint64_t, std::uint64_t> held_;
  // Every change to held_ in order (segment, new size; 0: released), and how many of them had
  // happened when reserved last peaked: the segments at the peak are rebuilt from it on demand
  // (a copy of held_ at every new peak would make a growing sequence quadratic).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> segment_log_;
  std::size_t log_at_reserved_peak_ = 0;
  void set_segment(std::uint64_t address, std::uint64_t size);
  std::uint64_t next_segment_ = 0;  // ids of the segments, in the order they were made
};

// ---------------------------------------------------------------- replaying a sequence

// --allocator pytorch[:expandable_segments=true|false,max_split_size_mb=N,
// max_non_split_rounding_mb=N,roundup_power2_divisions=N,garbage_collection_threshold=F]:
// PYTORCH_CUDA_ALLOC_CONF's keys. InputError naming --allocator, the key and what is allowed.
CachingAllocatorConfig parse_allocator_spec(const std::string& spec);

struct AllocEvent {
  bool alloc = true;  // "alloc" (else "free")
  std::uint64_t id = 0;
  std::uint64_t bytes = 0;  // alloc only
  int stream = 0;
};

// The events of a JSON file: an array of {"op": "alloc"|"free", "id": N, "bytes": N (alloc),
// "stream": N (optional, default 0)}, or an object {"events": [...]}. InputError naming
// `source`, the event's index and the field.
std::vector<AllocEvent> parse_alloc_events(const std::string& json_text, const std::string& source);

struct ReplayResult {
  CachingAllocatorConfig config;
  std::size_t events = 0;    // events replayed (up to and including an out-of-memory)
  std::uint64_t allocs = 0;  // of which allocations
  CachingAllocatorStats stats;
  std::vector<std::uint64_t> segments_at_reserved_peak;  // sizes, when reserved peaked
  std::optional<CachingAllocatorOom> oom;
  std::size_t oom_event = 0;  // its index in the events (when oom)
};

// Replays `events` in order through a model of `config`; stops at the first out-of-memory.
// InputError for a free of an id not allocated, or an id allocated twice (naming the event).
ReplayResult replay(const std::vector<AllocEvent>& events, const CachingAllocatorConfig& config);

}  // namespace trainmem
