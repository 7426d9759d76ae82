// Device probes: three driver-side sources that check the ledger independently.
//
//   memgetinfo  cudaMemGetInfo at named points (the caller's marks and every phase end) and a
//               background sampler (1 ms by default) that catches peaks inside a phase.
//   pool        cudaMemPoolAttrUsedMemHigh / ReservedMemHigh of the device allocator's pool,
//               reset at begin_step and at every phase end, read at every phase end: each
//               phase_end() closes a window, and the step's figure is the max over windows.
//   cupti       CUPTI activity records (MEMORY2, MEMORY_POOL, EXTERNAL_CORRELATION, RUNTIME)
//               folded into per-category live and peak bytes; the category comes from the
//               external correlation id the device allocator pushes around each allocation.
//
// Use (one ProbeSet per run, constructed before the model allocates anything):
//   ProbeOptions o; o.device = 0; o.allocator = &backend.allocator();
//   ProbeSet probes(o);              // never throws for a missing device or CUPTI refusal
//   probes.mark("after_context");    // after the context and the cuBLAS handle exist
//   probes.mark("after_params");
//   probes.begin_step(1);
//   ... forward ...  probes.phase_end(Phase::forward);
//   ... backward ... probes.phase_end(Phase::backward);
//   ... optimizer ... probes.phase_end(Phase::optimizer);
//   backend.synchronize();
//   probes.end_step();
//   probes.pool(), probes.cupti(), probes.memgetinfo(): a result per source, each with
//   `available` and, when false, `reason`; to_json() for each and for the whole set.
//
// A source that cannot work (no device, built without CUDA, a CUPTI error with its code and
// name, another profiler subscribed, an allocator that is not the device pool) is reported
// unavailable with the reason; the run goes on. Probes never throw from their methods.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainmem/ledger/ledger.hpp"

namespace trainmem {

// ---------------------------------------------------------------- per-source results

// One pool window: [previous phase end or begin_step, this phase end].
struct PoolPhaseFigure {
  Phase phase = Phase::setup;
  std::uint64_t used_high = 0;      // cudaMemPoolAttrUsedMemHigh over the window
  std::uint64_t reserved_high = 0;  // cudaMemPoolAttrReservedMemHigh over the window
};

struct PoolResult {
  bool available = false;
  std::string reason;                   // why not, when !available
  std::vector<PoolPhaseFigure> phases;  // in phase_end() order, last step
  std::uint64_t used_high = 0;          // max over the last step's windows
  std::uint64_t reserved_high = 0;
  std::uint64_t used_current = 0;  // at end_step()
  std::uint64_t reserved_current = 0;
  nlohmann::json to_json() const;
};

struct CuptiPhaseFigure {
  Phase phase = Phase::setup;
  std::uint64_t peak = 0;  // attributed live bytes, max over the window
};

// CUPTI's own allocation log folded into books. "Attributed" bytes carry one of our
// categories through the external correlation id; "unattributed" bytes are device
// allocations in this process made outside the ledger (cuBLAS, the runtime, ...).
struct CuptiFigures {
  CategoryBytes live{};            // at the last record folded
  CategoryBytes peak{};            // per category, since the step began
  std::uint64_t peak_total = 0;    // attributed bytes, max since the step began
  CategoryBytes peak_breakdown{};  // per category at that instant
  std::uint64_t unattributed_live = 0;
  std::uint64_t unattributed_peak = 0;
  std::vector<CuptiPhaseFigure> phases;  // windows closed by phase_end()
  // Counters over everything folded.
  std::uint64_t memory_records = 0;  // MEMORY2 records of device memory
  std::uint64_t allocations = 0;
  std::uint64_t releases = 0;
  std::uint64_t unknown_correlation = 0;  // allocations with no external id (unattributed)
  std::uint64_t unmatched_releases = 0;   // releases of an address never seen allocated
  std::uint64_t reused_live_address = 0;  // allocation at an address still live (lost release)
  std::uint64_t pool_records = 0;         // MEMORY_POOL records (created, destroyed, trimmed)
  std::uint64_t other_records = 0;        // runtime API, non-device memory, other kinds
  std::uint64_t dropped = 0;              // records CUPTI reported as dropped
};

struct CuptiResult {
  bool available = false;
  std::string reason;
  CuptiFigures figures;
  nlohmann::json to_json() const;
};

struct MemSnapshot {
  std::string name;  // "after_context", "after_params", "after_forward", ...
  int step = 0;      // ledger-style step index at the snapshot (0 before the first step)
  std::uint64_t free = 0;
  std::uint64_t used = 0;         // total - free
  bool has_ledger = false;        // ProbeOptions::ledger was given
  std::uint64_t ledger_live = 0;  // the ledger's live bytes at the same instant
};

struct MemPhaseSample {
  Phase phase = Phase::setup;
  std::uint64_t max_used = 0;  // the sampler's max of (total - free) over the window
};

struct MemGetInfoResult {
  bool available = false;
  std::string reason;
  std::uint64_t total = 0;
  std::vector<MemSnapshot> snapshots;  // in order taken
  bool sampler_running = false;
  std::chrono::microseconds sample_interval{1000};
  std::uint64_t samples = 0;                  // taken over the probe's life
  std::uint64_t sampler_max_used = 0;         // max over the last step
  std::vector<MemPhaseSample> phase_samples;  // windows closed by phase_end(), last step
  nlohmann::json to_json() const;
};

// ---------------------------------------------------------------- the probe set

struct ProbeOptions {
  int device = 0;
  // The allocator the ledger uses. The pool probe needs it to be the DeviceAllocator
  // (include/trainmem/backends/device_allocator.hpp); any other allocator makes `pool` unavailable.
  const Allocator* allocator = nullptr;
  // Optional: the ledger, read (live bytes) at every memgetinfo snapshot, from the caller's
  // thread only, so that the overhead can be computed per snapshot.
  const Ledger* ledger = nullptr;
  std::chrono::microseconds sample_interval{1000};
  bool enable_cupti = true;
  bool enable_sampler = true;
};

class ProbeSet {
 public:
  // Starts every source it can; the others are unavailable with a reason.
  explicit ProbeSet(const ProbeOptions& options);
  // A set whose every source is unavailable with `reason` (e.g. the meta backend).
  static std::unique_ptr<ProbeSet> unavailable(const std::string& reason);
  ~ProbeSet();
  ProbeSet(const ProbeSet&) = delete;
  ProbeSet& operator=(const ProbeSet&) = delete;

  void mark(const std::string& name);  // a memgetinfo snapshot (and a CUPTI flush)
  void begin_step(int step);           // resets pool marks, sampler max, CUPTI peaks
  void phase_end(Phase phase);         // closes a window in every source
  void end_step();                     // final flush and reads; call it after synchronising
                                       // the device (CUPTI's forced flush then hands back
                                       // only complete records)

  PoolResult pool() const;
  CuptiResult cupti() const;
  MemGetInfoResult memgetinfo() const;
  // {"pool": {...}, "cupti": {...}, "memgetinfo": {...}}; each source's own to_json().
  nlohmann::json to_json() const;

  struct Impl;

 private:
  ProbeSet();
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------- CUPTI external ids

// The external correlation id the device allocator pushes around an allocation: the
// category in the low 8 bits (category + 1, so 0 means none) and the ledger's tensor id
// above. The CUPTI fold reads the category back from it.
constexpr std::uint64_t encode_external_id(Category c, std::uint64_t tensor_id) {
  return (tensor_id << 8) | (static_cast<std::uint64_t>(c) + 1);
}
// Category index of an external id, or -1 when it carries none of ours.
constexpr int external_id_category(std::uint64_t external_id) {
  const std::uint64_t code = external_id & 0xff;
  return code >= 1 && code <= static_cast<std::uint64_t>(kNumCategories)
             ? static_cast<int>(code - 1)
             : -1;
}
constexpr std::uint64_t external_id_tensor(std::uint64_t external_id) {
  return external_id >> 8;
}

}  // namespace trainmem
