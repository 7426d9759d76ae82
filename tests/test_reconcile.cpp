// Reconciliation primitives on hand-made source results: the bounds of reconcile.hpp.
#include <gtest/gtest.h>

#include <limits>

#include "trainmem/run/reconcile.hpp"

namespace trainmem {
namespace {

const SourceCheck* find(const std::vector<SourceCheck>& v, const std::string& what) {
  for (const auto& c : v)
    if (c.what == what) return &c;
  return nullptr;
}

LedgerSummary three_tensor_ledger() {
  // 3 allocations of 1000, 2000 and 4000 bytes alive together: peak 7000, 3 live.
  MetaAllocator meta;
  Ledger l(meta);
  l.begin_step(1);
  void* a = l.allocate_bytes(1000, "a", Category::params, -1);
  void* b = l.allocate_bytes(2000, "b", Category::activations, 0);
  void* c = l.allocate_bytes(4000, "c", Category::workspace, 0);
  LedgerSummary s = LedgerSummary::of(l);
  l.release(c);
  l.release(b);
  l.release(a);
  return s;
}

TEST(Reconcile, LedgerSummaryTakesTheLedgersFigures) {
  const LedgerSummary s = three_tensor_ledger();
  EXPECT_EQ(s.peak_total, 7000u);
  EXPECT_EQ(s.live_total, 7000u);
  EXPECT_EQ(s.peak_live_count, 3u);
  EXPECT_EQ(s.live[static_cast<int>(Category::activations)], 2000u);
  EXPECT_EQ(s.peak_breakdown[static_cast<int>(Category::workspace)], 4000u);
}

TEST(Reconcile, PoolUsedHighWithinRoundingOfTheLivePeak) {
  const LedgerSummary s = three_tensor_ledger();
  PoolResult pool;
  pool.available = true;
  pool.reserved_high = 2u << 20;
  // Rounded to 512: 1024 + 2048 + 4096 = 7168, within 3 x 511 = 1533 of 7000.
  pool.used_high = 7168;
  auto checks = reconcile_pool(s, pool);
  const SourceCheck* used = find(checks, "used_high vs peak");
  ASSERT_NE(used, nullptr);
  EXPECT_TRUE(used->ok);
  EXPECT_EQ(used->difference, 168);
  EXPECT_EQ(used->upper, 3 * 511);
  EXPECT_NE(used->bound.find("512"), std::string::npos) << used->bound;
  pool.used_high = 7000 + 3 * 511;  // the edge
  EXPECT_TRUE(find(reconcile_pool(s, pool), "used_high vs peak")->ok);
  pool.used_high = 7000 + 3 * 511 + 1;  // one byte more than rounding can explain
  EXPECT_FALSE(find(reconcile_pool(s, pool), "used_high vs peak")->ok);
  pool.used_high = 6999;  // the pool cannot hold less than the ledger's live bytes
  const auto low = reconcile_pool(s, pool);
  EXPECT_FALSE(find(low, "used_high vs peak")->ok);
  EXPECT_EQ(find(low, "used_high vs peak")->difference, -1);
  EXPECT_TRUE(find(low, "reserved_high vs peak")->ok);
  pool.reserved_high = 6000;
  EXPECT_FALSE(find(reconcile_pool(s, pool), "reserved_high vs peak")->ok);
  pool.available = false;
  EXPECT_TRUE(reconcile_pool(s, pool).empty());
}

TEST(Reconcile, CuptiExactPerCategoryAndNoDrops) {
  const LedgerSummary s = three_tensor_ledger();
  CuptiResult cu;
  cu.available = true;
  cu.figures.live = s.live;
  cu.figures.peak = s.peak;
  cu.figures.peak_total = 7000;
  auto checks = reconcile_cupti(s, cu);
  EXPECT_EQ(checks.size(), 2u * kNumCategories + 1);
  for (const auto& c : checks) EXPECT_TRUE(c.ok) << c.what;
  cu.figures.peak[static_cast<int>(Category::activations)] += 1;
  checks = reconcile_cupti(s, cu);
  EXPECT_FALSE(find(checks, "activations peak")->ok);
  EXPECT_EQ(find(checks, "activations peak")->difference, 1);
  EXPECT_TRUE(find(checks, "activations live")->ok);
  cu.figures.peak = s.peak;
  cu.figures.dropped = 4;
  checks = reconcile_cupti(s, cu);
  const SourceCheck* d = find(checks, "dropped records");
  ASSERT_NE(d, nullptr);
  EXPECT_FALSE(d->ok);
  EXPECT_EQ(d->device, 4u);
}

TEST(Reconcile, MemGetInfoOverheadPerSnapshot) {
  const LedgerSummary s = three_tensor_ledger();
  MemGetInfoResult m;
  m.available = true;
  m.total = 80ull << 30;
  MemSnapshot a{"after_params", 0, 0, 600ull << 20, true, 100ull << 20};
  MemSnapshot b{"after_forward", 1, 0, 50ull << 20, true, 100ull << 20};  // impossible: < ledger
  MemSnapshot c{"no_ledger", 1, 0, 1, false, 0};
  m.snapshots = {a, b, c};
  m.sampler_running = true;
  m.samples = 10;
  m.sampler_max_used = 9000;
  const auto checks = reconcile_memgetinfo(s, m);
  ASSERT_EQ(checks.size(), 3u);
  EXPECT_EQ(checks[0].what, "overhead at after_params");
  EXPECT_EQ(checks[0].difference, 500ll << 20);
  EXPECT_TRUE(checks[0].ok);
  EXPECT_FALSE(checks[1].ok);
  EXPECT_EQ(checks[2].what, "overhead at the sampled peak");
  EXPECT_EQ(checks[2].difference, 2000);
  const nlohmann::json j = checks[0].to_json();
  EXPECT_EQ(j["upper"], nullptr);
  EXPECT_EQ(j["difference"], 500ll << 20);
}

TEST(Reconcile, DifferenceSaturatesInsteadOfWrapping) {
  const auto c = make_check("x", "y", 0, std::numeric_limits<std::uint64_t>::max(), 0, 0, "");
  EXPECT_EQ(c.difference, std::numeric_limits<std::int64_t>::max());
  EXPECT_FALSE(c.ok);
}

}  // namespace
}  // namespace trainmem
