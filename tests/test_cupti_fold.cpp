// The CUPTI fold (src/probes/cupti_fold.hpp: host code, built in every build) fed memory and
// external-correlation events directly, with the expected books worked out by hand or by a
// naive replay; and, in CUDA builds, the decoding of CUpti_ActivityMemory4,
// CUpti_ActivityExternalCorrelation and CUpti_ActivityMemoryPool3 structs built in a buffer, as
// CUPTI would hand them back (src/probes/cupti_records.hpp). No device either way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "probes/cupti_fold.hpp"
#ifdef TRAINMEM_HAVE_CUDA
#include "probes/cupti_records.hpp"
#endif

namespace trainmem::probes {
namespace {

// What the decoder hands the fold, one call per record.
struct Rec {
  enum Kind { memory, external, pool, other } kind;
  CuptiMemEvent mem{};
  std::uint32_t correlation = 0;
  std::uint64_t external_id = 0;
};

class RecordBuffer {
 public:
  void append(const Rec& r) { recs_.push_back(r); }
  std::vector<Rec> records() const { return recs_; }

 private:
  std::vector<Rec> recs_;
};

Rec mem_record(bool alloc, std::uint64_t address, std::uint64_t bytes, std::uint64_t ts,
               std::uint32_t corr) {
  Rec r{Rec::memory};
  r.mem = CuptiMemEvent{ts, address, bytes, corr, alloc};
  return r;
}
Rec ext_record(std::uint32_t corr, std::uint64_t external_id) {
  Rec r{Rec::external};
  r.correlation = corr;
  r.external_id = external_id;
  return r;
}
Rec pool_record() {
  return Rec{Rec::pool};
}
Rec other_record() {
  return Rec{Rec::other};
}

void add(CuptiFold& f, const Rec& r) {
  switch (r.kind) {
    case Rec::memory:
      f.add_memory(r.mem);
      break;
    case Rec::external:
      f.add_external(r.correlation, r.external_id);
      break;
    case Rec::pool:
      f.add_pool_record();
      break;
    case Rec::other:
      f.add_other_record();
      break;
  }
}

constexpr int P = static_cast<int>(Category::params);
constexpr int A = static_cast<int>(Category::activations);
constexpr int W = static_cast<int>(Category::workspace);
constexpr int G = static_cast<int>(Category::gradients);

void feed(CuptiFold& f, const RecordBuffer& b) {
  for (const Rec& r : b.records()) add(f, r);
}

TEST(CuptiFold, ExternalIdEncodingRoundTrips) {
  for (Category c : all_categories()) {
    const auto id = encode_external_id(c, 12345);
    EXPECT_EQ(external_id_category(id), static_cast<int>(c));
    EXPECT_EQ(external_id_tensor(id), 12345u);
  }
  EXPECT_EQ(external_id_category(0), -1);
  // The codes are category + 1 (1..kNumCategories): the next code names no category.
  EXPECT_EQ(external_id_category((7ull << 8) | (kNumCategories + 1)), -1);
}

// A small step: params 1000 B (setup), activations 4000 + 2000 B, workspace 500 B, and
// releases. Expected figures are worked out by hand in the comments.
RecordBuffer small_step() {
  RecordBuffer b;
  b.append(ext_record(1, encode_external_id(Category::params, 1)));
  b.append(mem_record(true, 0x1000, 1000, 10, 1));  // live P=1000            total 1000
  b.append(ext_record(2, encode_external_id(Category::activations, 2)));
  b.append(mem_record(true, 0x2000, 4000, 20, 2));  // A=4000                total 5000
  b.append(ext_record(3, encode_external_id(Category::workspace, 3)));
  b.append(mem_record(true, 0x3000, 500, 30, 3));   // W=500                 total 5500
  b.append(mem_record(false, 0x3000, 500, 40, 4));  // W=0                   total 5000
  b.append(ext_record(5, encode_external_id(Category::activations, 4)));
  b.append(mem_record(true, 0x4000, 2000, 50, 5));   // A=6000                total 7000
  b.append(mem_record(false, 0x2000, 4000, 60, 6));  // A=2000                total 3000
  return b;
}

TEST(CuptiFold, AllocationAndReleaseIntoCategoryBooks) {
  CuptiFold f;
  feed(f, small_step());
  const CuptiFigures r = f.fold(0, {});
  EXPECT_EQ(r.live[P], 1000u);
  EXPECT_EQ(r.live[A], 2000u);
  EXPECT_EQ(r.live[W], 0u);
  EXPECT_EQ(r.peak[P], 1000u);
  EXPECT_EQ(r.peak[A], 6000u);
  EXPECT_EQ(r.peak[W], 500u);
  EXPECT_EQ(r.peak_total, 7000u);
  EXPECT_EQ(r.peak_breakdown[P], 1000u);
  EXPECT_EQ(r.peak_breakdown[A], 6000u);
  EXPECT_EQ(r.peak_breakdown[W], 0u);
  EXPECT_EQ(r.allocations, 4u);
  EXPECT_EQ(r.releases, 2u);
  EXPECT_EQ(r.memory_records, 6u);
  EXPECT_EQ(r.unknown_correlation, 0u);
  EXPECT_EQ(r.unmatched_releases, 0u);
  EXPECT_EQ(r.unattributed_live, 0u);
  EXPECT_EQ(r.dropped, 0u);
}

TEST(CuptiFold, OutOfOrderRecordsFoldLikeOrderedOnes) {
  // Same records, shuffled: external correlations after the memory records they name,
  // a release before its allocation in arrival order.
  const auto ordered = small_step().records();
  std::vector<Rec> shuffled(ordered.rbegin(), ordered.rend());
  CuptiFold a, b;
  for (const Rec& r : ordered) add(a, r);
  for (const Rec& r : shuffled) add(b, r);
  const auto fa = a.fold(0, {});
  const auto fb = b.fold(0, {});
  EXPECT_EQ(fa.live, fb.live);
  EXPECT_EQ(fa.peak, fb.peak);
  EXPECT_EQ(fa.peak_total, fb.peak_total);
  EXPECT_EQ(fb.peak_total, 7000u);
  EXPECT_EQ(fb.unmatched_releases, 0u);
  std::mt19937 rng(7);
  for (int i = 0; i < 20; ++i) {
    std::vector<Rec> s = ordered;
    std::shuffle(s.begin(), s.end(), rng);
    CuptiFold c;
    for (const Rec& r : s) add(c, r);
    const auto fc = c.fold(0, {});
    EXPECT_EQ(fc.live, fa.live);
    EXPECT_EQ(fc.peak, fa.peak);
    EXPECT_EQ(fc.peak_breakdown, fa.peak_breakdown);
  }
}

TEST(CuptiFold, UnknownCorrelationIdsAreUnattributed) {
  RecordBuffer b;
  b.append(mem_record(true, 0x1000, 300, 10, 1));  // no external record at all
  b.append(ext_record(2, 0));                      // external id without a category
  b.append(mem_record(true, 0x2000, 200, 20, 2));
  b.append(other_record());  // e.g. an OPENACC correlation (decoded below): not ours
  b.append(mem_record(true, 0x3000, 100, 30, 3));
  b.append(ext_record(4, encode_external_id(Category::gradients, 10)));
  b.append(mem_record(true, 0x4000, 64, 40, 4));
  b.append(mem_record(false, 0x2000, 200, 50, 5));
  CuptiFold f;
  feed(f, b);
  const auto r = f.fold(0, {});
  EXPECT_EQ(r.unknown_correlation, 3u);
  EXPECT_EQ(r.unattributed_live, 400u);  // 300 + 100
  EXPECT_EQ(r.unattributed_peak, 600u);
  EXPECT_EQ(r.live[G], 64u);
  EXPECT_EQ(r.peak_total, 64u);  // attributed bytes only
  EXPECT_EQ(r.other_records, 1u);
}

TEST(CuptiFold, UnmatchedReleasesReusedAddressesAndOtherKinds) {
  RecordBuffer b;
  b.append(mem_record(false, 0x9000, 128, 5, 1));  // allocated before collection began
  b.append(ext_record(2, encode_external_id(Category::activations, 1)));
  b.append(mem_record(true, 0x1000, 1000, 10, 2));
  b.append(ext_record(3, encode_external_id(Category::activations, 2)));
  b.append(mem_record(true, 0x1000, 700, 20, 3));  // same address: the release was lost
  b.append(other_record());                        // e.g. a pinned host allocation (decoded below)
  b.append(pool_record());
  b.append(pool_record());
  CuptiFold f;
  feed(f, b);
  f.add_dropped(5);
  f.add_dropped(3);
  const auto r = f.fold(0, {});
  EXPECT_EQ(r.unmatched_releases, 1u);
  EXPECT_EQ(r.reused_live_address, 1u);
  EXPECT_EQ(r.live[A], 700u);
  EXPECT_EQ(r.peak[A], 1000u);
  EXPECT_EQ(r.memory_records, 3u);  // device records only
  EXPECT_EQ(r.other_records, 1u);
  EXPECT_EQ(r.pool_records, 2u);
  EXPECT_EQ(r.dropped, 8u);
}

TEST(CuptiFold, StepStartAndPhaseWindows) {
  // Setup before t=100: params 1000. Step from t=100; forward ends at 200, backward at 300,
  // optimizer at 400 (no records in the optimizer window).
  RecordBuffer b;
  b.append(ext_record(1, encode_external_id(Category::params, 1)));
  b.append(mem_record(true, 0x1000, 1000, 10, 1));
  b.append(ext_record(9, encode_external_id(Category::workspace, 9)));
  b.append(mem_record(true, 0x9000, 5000, 20, 9));    // setup-time scratch...
  b.append(mem_record(false, 0x9000, 5000, 30, 10));  // ...gone before the step
  b.append(ext_record(2, encode_external_id(Category::activations, 2)));
  b.append(mem_record(true, 0x2000, 3000, 150, 2));  // forward: total 4000
  b.append(ext_record(3, encode_external_id(Category::gradients, 3)));
  b.append(mem_record(true, 0x3000, 1000, 250, 3));   // backward: total 5000
  b.append(mem_record(false, 0x2000, 3000, 260, 4));  // backward: total 2000
  CuptiFold f;
  feed(f, b);
  const auto r =
      f.fold(100, {{Phase::forward, 200}, {Phase::backward, 300}, {Phase::optimizer, 400}});
  EXPECT_EQ(r.peak[static_cast<int>(Category::workspace)], 0u);  // before the step
  EXPECT_EQ(r.peak[P], 1000u);                                   // live at step start
  EXPECT_EQ(r.peak_total, 5000u);
  ASSERT_EQ(r.phases.size(), 3u);
  EXPECT_EQ(r.phases[0].phase, Phase::forward);
  EXPECT_EQ(r.phases[0].peak, 4000u);
  EXPECT_EQ(r.phases[1].phase, Phase::backward);
  EXPECT_EQ(r.phases[1].peak, 5000u);
  EXPECT_EQ(r.phases[2].phase, Phase::optimizer);
  EXPECT_EQ(r.phases[2].peak, 2000u);  // nothing happened: what was live
  // Without a step start the setup scratch is the peak.
  EXPECT_EQ(f.fold(0, {}).peak_total, 6000u);
}

// Random sequences against a naive replay in timestamp order.
TEST(CuptiFold, RandomSequencesMatchNaiveReplay) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    RecordBuffer b;
    struct Ev {
      std::uint64_t ts;
      bool alloc;
      std::uint64_t addr, bytes;
      int cat;
    };
    std::vector<Ev> evs;
    std::map<std::uint64_t, std::pair<std::uint64_t, int>> live;  // addr -> bytes, cat
    std::uint64_t next_addr = 0x1000, ts = 0;
    std::uint32_t corr = 1;
    for (int i = 0; i < 300; ++i) {
      ts += 1 + rng() % 5;
      if (live.empty() || rng() % 3 != 0) {
        const int cat = static_cast<int>(rng() % kNumCategories);
        const std::uint64_t bytes = 1 + rng() % 10000;
        const std::uint64_t addr = next_addr;
        next_addr += 0x10000;
        b.append(ext_record(corr, encode_external_id(static_cast<Category>(cat), i)));
        b.append(mem_record(true, addr, bytes, ts, corr++));
        live[addr] = {bytes, cat};
        evs.push_back({ts, true, addr, bytes, cat});
      } else {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        b.append(mem_record(false, it->first, it->second.first, ts, corr++));
        evs.push_back({ts, false, it->first, it->second.first, it->second.second});
        live.erase(it);
      }
    }
    // Naive replay, peaks from the step start at the middle timestamp.
    const std::uint64_t start = ts / 2;
    CategoryBytes cur{}, peak{};
    std::uint64_t total = 0, peak_total = 0;
    bool started = false;
    for (const Ev& e : evs) {
      if (!started && e.ts >= start) {
        started = true;
        peak = cur;
        peak_total = total;
      }
      if (e.alloc) {
        cur[e.cat] += e.bytes;
        total += e.bytes;
      } else {
        cur[e.cat] -= e.bytes;
        total -= e.bytes;
      }
      if (started) {
        for (int c = 0; c < kNumCategories; ++c) peak[c] = std::max(peak[c], cur[c]);
        peak_total = std::max(peak_total, total);
      }
    }
    auto recs = b.records();
    std::shuffle(recs.begin(), recs.end(), rng);
    CuptiFold f;
    for (const Rec& r : recs) add(f, r);
    const auto r = f.fold(start, {});
    EXPECT_EQ(r.live, cur) << "trial " << trial;
    EXPECT_EQ(r.peak, peak) << "trial " << trial;
    EXPECT_EQ(r.peak_total, peak_total) << "trial " << trial;
    EXPECT_EQ(r.unmatched_releases, 0u);
    EXPECT_EQ(r.unknown_correlation, 0u);
  }
}

#ifdef TRAINMEM_HAVE_CUDA
// ------------------------------------------------------- CUPTI records (CUDA builds: headers)

// Records laid out back to back in one 8-byte aligned buffer.
class CuptiBuffer {
 public:
  template <class T>
  void append(const T& rec) {
    const std::size_t words = (sizeof(T) + 7) / 8;
    offsets_.push_back(storage_.size());
    storage_.resize(storage_.size() + words, 0);
    std::memcpy(&storage_[offsets_.back()], &rec, sizeof(T));
  }
  std::vector<const CUpti_Activity*> records() const {
    std::vector<const CUpti_Activity*> out;
    for (auto o : offsets_) out.push_back(reinterpret_cast<const CUpti_Activity*>(&storage_[o]));
    return out;
  }

 private:
  std::vector<std::uint64_t> storage_;
  std::vector<std::size_t> offsets_;
};

CUpti_ActivityMemory4 cupti_mem(bool alloc, std::uint64_t address, std::uint64_t bytes,
                                std::uint64_t ts, std::uint32_t corr,
                                CUpti_ActivityMemoryKind kind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE) {
  CUpti_ActivityMemory4 m;
  std::memset(&m, 0, sizeof m);
  m.kind = CUPTI_ACTIVITY_KIND_MEMORY2;
  m.memoryOperationType = alloc ? CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION
                                : CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE;
  m.memoryKind = kind;
  m.correlationId = corr;
  m.address = address;
  m.bytes = bytes;
  m.timestamp = ts;
  m.isAsync = 1;
  return m;
}

CUpti_ActivityExternalCorrelation cupti_ext(
    std::uint32_t corr, std::uint64_t external_id,
    CUpti_ExternalCorrelationKind kind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) {
  CUpti_ActivityExternalCorrelation e;
  std::memset(&e, 0, sizeof e);
  e.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
  e.externalKind = kind;
  e.externalId = external_id;
  e.correlationId = corr;
  return e;
}

CUpti_ActivityMemoryPool3 cupti_pool(CUpti_ActivityMemoryPoolOperationType op) {
  CUpti_ActivityMemoryPool3 p;
  std::memset(&p, 0, sizeof p);
  p.kind = CUPTI_ACTIVITY_KIND_MEMORY_POOL;
  p.memoryPoolOperationType = op;
  p.memoryPoolType = CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL;
  return p;
}

TEST(CuptiRecords, ForeignKindsAreCountedNotFolded) {
  CuptiBuffer b;
  b.append(cupti_mem(true, 0x1000, 300, 10, 1));  // no external record at all
  b.append(cupti_ext(3, encode_external_id(Category::gradients, 9),
                     CUPTI_EXTERNAL_CORRELATION_KIND_OPENACC));  // not our kind
  b.append(cupti_mem(true, 0x3000, 100, 30, 3));
  b.append(cupti_ext(4, encode_external_id(Category::gradients, 10)));
  b.append(cupti_mem(true, 0x4000, 64, 40, 4));
  b.append(cupti_mem(true, 0x5000, 999, 25, 5, CUPTI_ACTIVITY_MEMORY_KIND_PINNED));  // host
  b.append(cupti_pool(CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_CREATED));
  b.append(cupti_pool(CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_TRIMMED));
  CuptiFold f;
  for (const CUpti_Activity* r : b.records()) add_cupti_record(f, r);
  add_cupti_record(f, nullptr);
  const auto r = f.fold(0, {});
  EXPECT_EQ(r.memory_records, 3u);  // device records only
  EXPECT_EQ(r.other_records, 2u);   // the OPENACC correlation, the pinned allocation
  EXPECT_EQ(r.pool_records, 2u);
  EXPECT_EQ(r.unknown_correlation, 2u);  // correlations 1 and 3
  EXPECT_EQ(r.unattributed_live, 400u);
  EXPECT_EQ(r.live[G], 64u);
}

TEST(CuptiRecords, DecodedRecordsFoldLikeTheEventsTheyCarry) {
  // small_step() as CUPTI records: the same books as the events fed directly.
  CuptiBuffer b;
  for (const Rec& r : small_step().records()) {
    if (r.kind == Rec::memory)
      b.append(cupti_mem(r.mem.allocation, r.mem.address, r.mem.bytes, r.mem.timestamp,
                         r.mem.correlation));
    else if (r.kind == Rec::external)
      b.append(cupti_ext(r.correlation, r.external_id));
  }
  CuptiFold decoded, direct;
  for (const CUpti_Activity* r : b.records()) add_cupti_record(decoded, r);
  feed(direct, small_step());
  const auto x = decoded.fold(0, {}), y = direct.fold(0, {});
  EXPECT_EQ(x.live, y.live);
  EXPECT_EQ(x.peak, y.peak);
  EXPECT_EQ(x.peak_total, 7000u);
  EXPECT_EQ(x.memory_records, 6u);
}
#endif  // TRAINMEM_HAVE_CUDA

}  // namespace
}  // namespace trainmem::probes
