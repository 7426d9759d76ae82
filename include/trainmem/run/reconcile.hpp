// Reconciliation primitives: the ledger against each device source, with the bound each
// comparison is held to (docs/measurement.md explains the bounds).
//
//   ledger vs pool        0 <= pool used_high - ledger peak <= peak_live_count * (g - 1),
//                         g = kPoolAllocationGranularity (512 bytes): the stream-ordered
//                         pool rounds every allocation up to a multiple of g, and at most
//                         peak_live_count allocations are alive at any instant of the step.
//                         Pool reserved_high >= used_high always; the difference is pool slack.
//   ledger vs cupti       per category, live at the end and peak over the step: exact (CUPTI
//                         logs the requested bytes of every cudaMallocFromPoolAsync), and no
//                         dropped record.
//   ledger vs memgetinfo  overhead = device used - ledger live at the same instant (context,
//                         cuBLAS workspace and modules, pool slack, other processes). Only
//                         its sign is checked (>= 0); its size is reported.
#pragma once
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainmem/ledger/ledger.hpp"
#include "trainmem/probes/probes.hpp"

namespace trainmem {

// Rounding unit of cudaMallocAsync / cudaMallocFromPoolAsync allocations in the pool's
// used-memory count (an allocation of 1..512 bytes counts 512).
constexpr std::uint64_t kPoolAllocationGranularity = 512;

// The ledger's figures a reconciliation needs (taken right after end of the step).
struct LedgerSummary {
  CategoryBytes live{};
  CategoryBytes peak{};
  std::uint64_t live_total = 0;
  std::uint64_t peak_total = 0;
  CategoryBytes peak_breakdown{};
  std::uint64_t peak_live_count = 0;
  std::array<std::uint64_t, kNumPhases> phase_peak{};
  static LedgerSummary of(const Ledger& ledger);
};

struct SourceCheck {
  std::string source;  // "pool", "cupti", "memgetinfo"
  std::string what;    // "used_high vs peak", "activations peak", "overhead at after_params", ...
  std::uint64_t ledger = 0;
  std::uint64_t device = 0;
  std::int64_t difference = 0;  // device - ledger
  std::int64_t lower = 0;       // allowed range of the difference, inclusive
  std::int64_t upper = 0;       // INT64_MAX: no upper bound
  bool ok = false;
  std::string bound;  // the bound in words
  nlohmann::json to_json() const;
};

// Difference device - ledger checked against [lower, upper].
SourceCheck make_check(std::string source, std::string what, std::uint64_t ledger,
                       std::uint64_t device, std::int64_t lower, std::int64_t upper,
                       std::string bound);

// Empty when the source is unavailable.
std::vector<SourceCheck> reconcile_pool(const LedgerSummary& ledger, const PoolResult& pool,
                                        std::uint64_t granularity = kPoolAllocationGranularity);
std::vector<SourceCheck> reconcile_cupti(const LedgerSummary& ledger, const CuptiResult& cupti);
std::vector<SourceCheck> reconcile_memgetinfo(const LedgerSummary& ledger,
                                              const MemGetInfoResult& mem);

}  // namespace trainmem
