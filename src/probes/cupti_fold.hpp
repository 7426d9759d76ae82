// Folding CUPTI activity records into per-category live and peak bytes, independently of the
// ledger. Pure: no CUPTI call, no device; the collector (cupti_collector.cpp) feeds it the
// records CUPTI hands back, the tests feed it records built in a buffer.
//
// Records used (CUDA 13 cupti_activity.h):
//   CUPTI_ACTIVITY_KIND_MEMORY2               CUpti_ActivityMemory4: one record per allocation
//                                             and one per release, with address, bytes,
//                                             timestamp and the runtime call's correlation id
//   CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION  CUpti_ActivityExternalCorrelation: runtime
//                                             correlation id -> our external id (category)
//   CUPTI_ACTIVITY_KIND_MEMORY_POOL           CUpti_ActivityMemoryPool3: counted only
// Records may arrive in any order across buffers: folding sorts the memory records by
// timestamp (ties by correlation id) and resolves external ids only when it folds.
#pragma once
#include <cupti_activity.h>

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trainmem/probes.hpp"

namespace trainmem::probes {

class CuptiFold {
 public:
  // Copies what it needs from one record; any kind is accepted (others are only counted).
  void add(const CUpti_Activity* record);
  void add_dropped(std::uint64_t n) { dropped_ += n; }

  // Folds everything added so far. Peaks restart (at the live bytes) at step_start_ns
  // (0: from the first record); each (phase, end timestamp) closes a window that starts at
  // the previous end or at step_start_ns.
  CuptiFigures fold(std::uint64_t step_start_ns,
                    const std::vector<std::pair<Phase, std::uint64_t>>& phase_ends) const;

  std::size_t memory_events() const { return events_.size(); }
  void clear();

 private:
  struct MemEvent {
    std::uint64_t timestamp;
    std::uint64_t address;
    std::uint64_t bytes;
    std::uint32_t correlation;
    bool allocation;
  };
  std::vector<MemEvent> events_;
  std::unordered_map<std::uint32_t, std::uint64_t> external_;  // correlation -> external id
  std::uint64_t pool_records_ = 0;
  std::uint64_t other_records_ = 0;
  std::uint64_t dropped_ = 0;
};

}  // namespace trainmem::probes
