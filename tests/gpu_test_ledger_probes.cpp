// Real cudaMallocFromPoolAsync allocations through the ledger show up identically in the
// ledger, the pool's high-water marks (within its rounding) and CUPTI's folded records.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu_helpers.hpp"
#include "trainmem/backends/device_allocator.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/probes/cupti_tag_allocator.hpp"
#include "trainmem/probes/probes.hpp"
#include "trainmem/run/reconcile.hpp"

namespace trainmem {
namespace {

class LedgerProbesGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    require_cuda_device();
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

Tensor touch(Tensor t, cudaStream_t s) {
  EXPECT_EQ(cudaMemsetAsync(t.data(), 0x5a, t.bytes(), s), cudaSuccess);
  return t;
}

TEST_F(LedgerProbesGpu, AllocationsAgreeAcrossLedgerPoolAndCupti) {
  DeviceAllocator dev(0, stream_);
  CuptiTagAllocator tagged(dev);  // CUPTI attribution, as a run wires it
  Ledger ledger(tagged);
  ProbeOptions o;
  o.device = 0;
  o.allocator = &dev;
  o.ledger = &ledger;
  ProbeSet probes(o);
  ASSERT_TRUE(probes.pool().available) << probes.pool().reason;
  ASSERT_TRUE(probes.memgetinfo().available) << probes.memgetinfo().reason;
  const CuptiResult first = probes.cupti();
  if (!first.available) GTEST_SKIP() << "CUPTI unavailable: " << first.reason;

  probes.mark("after_context");
  // Sizes on and off the 512-byte grid, small and large.
  std::vector<Tensor> params;
  params.push_back(
      touch(ledger.allocate("wte", Category::params, -1, {1000, 257}, DType::bf16), stream_));
  params.push_back(
      touch(ledger.allocate("norm", Category::params, -1, {257}, DType::f32), stream_));
  params.push_back(
      touch(ledger.allocate("tokens", Category::inputs, -1, {3, 129}, DType::i32), stream_));
  probes.mark("after_params");

  ledger.begin_step(1);
  probes.begin_step(1);
  std::vector<Tensor> acts;
  {
    auto f = ledger.scope(Phase::forward);
    for (int l = 0; l < 3; ++l)
      acts.push_back(touch(
          ledger.allocate("act", Category::activations, l, {4, 333, 77}, DType::bf16), stream_));
    Tensor scratch =
        touch(ledger.allocate("scratch", Category::workspace, 0, {5 << 20}, DType::f32), stream_);
    ledger.mark_end_of_forward();
  }
  probes.phase_end(Phase::forward);
  std::vector<Tensor> grads;
  {
    auto b = ledger.scope(Phase::backward);
    grads.push_back(
        touch(ledger.allocate("dwte", Category::gradients, -1, {1000, 257}, DType::bf16), stream_));
    while (!acts.empty()) {
      Tensor d = touch(ledger.allocate("dact", Category::workspace, 0, {4, 333, 77}, DType::bf16),
                       stream_);
      acts.pop_back();
    }
  }
  probes.phase_end(Phase::backward);
  std::vector<Tensor> states;
  {
    auto opt = ledger.scope(Phase::optimizer);
    states.push_back(touch(
        ledger.allocate("m", Category::optimizer_states, -1, {1000, 257}, DType::f32), stream_));
    states.push_back(touch(
        ledger.allocate("v", Category::optimizer_states, -1, {1000, 257}, DType::f32), stream_));
  }
  probes.phase_end(Phase::optimizer);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  probes.end_step();

  const LedgerSummary ls = LedgerSummary::of(ledger);
  const CuptiResult cu = probes.cupti();
  ASSERT_TRUE(cu.available);
  EXPECT_EQ(cu.figures.dropped, 0u);
  for (Category c : all_categories()) {
    const int k = static_cast<int>(c);
    EXPECT_EQ(cu.figures.live[k], ls.live[k]) << category_name(c);
    EXPECT_EQ(cu.figures.peak[k], ls.peak[k]) << category_name(c);
  }
  EXPECT_EQ(cu.figures.peak_total, ls.peak_total);
  EXPECT_EQ(cu.figures.peak_breakdown, ls.peak_breakdown);
  ASSERT_EQ(cu.figures.phases.size(), 3u);
  EXPECT_EQ(cu.figures.phases[0].peak, ledger.phase_peak(Phase::forward));
  EXPECT_EQ(cu.figures.phases[1].peak, ledger.phase_peak(Phase::backward));
  EXPECT_EQ(cu.figures.phases[2].peak, ledger.phase_peak(Phase::optimizer));
  for (const auto& c : reconcile_cupti(ls, cu)) EXPECT_TRUE(c.ok) << c.what;

  const PoolResult pool = probes.pool();
  ASSERT_TRUE(pool.available) << pool.reason;
  ASSERT_EQ(pool.phases.size(), 3u);
  for (const auto& c : reconcile_pool(ls, pool))
    EXPECT_TRUE(c.ok) << c.what << ": ledger " << c.ledger << " device " << c.device << " bound "
                      << c.bound;
  EXPECT_GE(pool.used_current, ledger.live_total());

  const MemGetInfoResult mem = probes.memgetinfo();
  ASSERT_TRUE(mem.available) << mem.reason;
  EXPECT_GT(mem.samples, 0u);
  EXPECT_GE(mem.sampler_max_used, ls.peak_total);
  for (const auto& c : reconcile_memgetinfo(ls, mem)) EXPECT_TRUE(c.ok) << c.what;
  // A second set in the same process cannot have CUPTI, and says so.
  ProbeSet second(o);
  EXPECT_FALSE(second.cupti().available);
  EXPECT_NE(second.cupti().reason.find("already running"), std::string::npos)
      << second.cupti().reason;
}

TEST_F(LedgerProbesGpu, DeviceOutOfMemoryBecomesOutOfMemoryAndIsRecoverable) {
  DeviceAllocator dev(0, stream_);
  Ledger ledger(dev);
  Tensor before = ledger.allocate("before", Category::params, -1, {4096}, DType::f32);
  std::size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  ASSERT_EQ(dev.device_total_bytes(), total_b);
  // More than the device has: refused up front, no driver call.
  const std::uint64_t too_much = static_cast<std::uint64_t>(total_b) * 2;
  try {
    ledger.allocate_bytes(too_much, "huge", Category::activations, 3);
    FAIL() << "allocating twice the device's memory succeeded";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested_bytes, too_much);
    EXPECT_EQ(e.tensor, "huge");
    EXPECT_EQ(e.category, "activations");
    EXPECT_EQ(e.live_bytes, 4096u * 4);
    EXPECT_NE(std::string(e.what()).find("exceeds the device's total memory"), std::string::npos)
        << e.what();
  }
  // Within the device's total but beyond what it can give (the CUDA context alone holds far
  // more than 1 MiB): the driver's own cudaErrorMemoryAllocation, with the pool's figures.
  const std::uint64_t beyond_free = static_cast<std::uint64_t>(total_b) - (1u << 20);
  ASSERT_GT(beyond_free, free_b);
  try {
    ledger.allocate_bytes(beyond_free, "almost_all", Category::gradients, 1);
    FAIL() << "allocating total - 1 MiB succeeded (free was " << free_b << ")";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested_bytes, beyond_free);
    EXPECT_EQ(e.tensor, "almost_all");
    EXPECT_EQ(e.category, "gradients");
    EXPECT_EQ(e.live_bytes, 4096u * 4);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cudaErrorMemoryAllocation"), std::string::npos) << msg;
    EXPECT_NE(msg.find("pool in use"), std::string::npos) << msg;
  }
  // No error left behind: the next allocation and a kernel on the stream work.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  Tensor ok = ledger.allocate("after", Category::workspace, -1, {1024}, DType::f32);
  EXPECT_TRUE(ok);
  EXPECT_EQ(cudaMemsetAsync(ok.data(), 0, ok.bytes(), stream_), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(ledger.live_total(), 4096u * 4 + 1024u * 4);
}

}  // namespace
}  // namespace trainmem
