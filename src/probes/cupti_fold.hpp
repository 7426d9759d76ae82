// Folding CUPTI activity records into per-category live and peak bytes, independently of the
// ledger. Pure host code, no CUPTI header, no device: it is built and tested in every build
// (CUDA or not). cupti_records.hpp (CUDA builds) decodes the records CUPTI hands back into the
// calls below (add_memory, add_external, add_pool_record, add_other_record); the collector
// (cupti_collector.cpp) feeds it through that decoder, the tests feed it events directly and,
// in CUDA builds, records built in a buffer through the decoder.
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
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trainmem/probes/probes.hpp"

namespace trainmem::probes {

// One device allocation or release (a CUPTI_ACTIVITY_KIND_MEMORY2 record of memory kind
// DEVICE and operation ALLOCATION or RELEASE).
struct CuptiMemEvent {
  std::uint64_t timestamp;
  std::uint64_t address;
  std::uint64_t bytes;
  std::uint32_t correlation;  // the runtime call's correlation id
  bool allocation;            // false: a release
};

class CuptiFold {
 public:
  void add_memory(const CuptiMemEvent& e) { events_.push_back(e); }
  // An external correlation of our kind (CUSTOM0): runtime correlation id -> external id.
  void add_external(std::uint32_t correlation, std::uint64_t external_id) {
    external_[correlation] = external_id;
  }
  void add_pool_record() { ++pool_records_; }    // counted only
  void add_other_record() { ++other_records_; }  // any other record: counted only
  void add_dropped(std::uint64_t n) { dropped_ += n; }

  // Folds everything added so far. Peaks restart (at the live bytes) at step_start_ns
  // (0: from the first record); each (phase, end timestamp) closes a window that starts at
  // the previous end or at step_start_ns.
  CuptiFigures fold(std::uint64_t step_start_ns,
                    const std::vector<std::pair<Phase, std::uint64_t>>& phase_ends) const;

  std::size_t memory_events() const { return events_.size(); }
  void clear();

 private:
  std::vector<CuptiMemEvent> events_;
  std::unordered_map<std::uint32_t, std::uint64_t> external_;  // correlation -> external id
  std::uint64_t pool_records_ = 0;
  std::uint64_t other_records_ = 0;
  std::uint64_t dropped_ = 0;
};

}  // namespace trainmem::probes
