// The probes without a usable device: every source reports `unavailable` with a reason, the
// whole API is callable, nothing throws or crashes. On a machine with a device the
// no-device path cannot be exercised and these tests skip (the GPU tests cover that case).
#include <gtest/gtest.h>

#include <string>

#include "trainmem/ledger/ledger.hpp"
#include "trainmem/probes/probes.hpp"

#ifdef TRAINMEM_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <cupti.h>

#include "probes/cupti_collector.hpp"
#endif

namespace trainmem {
namespace {

// The text the no-device reason must contain here, or "" when a device is usable.
std::string expected_reason_fragment() {
#ifdef TRAINMEM_HAVE_CUDA
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return cudaGetErrorName(e);  // e.g. cudaErrorInsufficientDriver
  }
  return n == 0 ? "no CUDA device" : "";
#else
  return "built without CUDA";
#endif
}

void drive_a_step(ProbeSet& p) {
  p.mark("after_context");
  p.mark("after_params");
  p.begin_step(1);
  p.phase_end(Phase::forward);
  p.phase_end(Phase::backward);
  p.phase_end(Phase::optimizer);
  p.end_step();
}

TEST(Probes, UnavailableWithoutADeviceAndSayWhy) {
  const std::string fragment = expected_reason_fragment();
  if (fragment.empty()) GTEST_SKIP() << "a CUDA device is usable here; see the GPU tests";
  MetaAllocator meta;
  Ledger ledger(meta);
  ProbeOptions o;
  o.allocator = &meta;
  o.ledger = &ledger;
  ProbeSet probes(o);
  ASSERT_NO_THROW(drive_a_step(probes));
  const PoolResult pool = probes.pool();
  const CuptiResult cupti = probes.cupti();
  const MemGetInfoResult mem = probes.memgetinfo();
  EXPECT_FALSE(pool.available);
  EXPECT_FALSE(cupti.available);
  EXPECT_FALSE(mem.available);
  for (const std::string* why : {&pool.reason, &cupti.reason, &mem.reason})
    EXPECT_NE(why->find(fragment), std::string::npos) << *why;
  EXPECT_TRUE(mem.snapshots.empty());
  EXPECT_EQ(cupti.figures.allocations, 0u);

  const nlohmann::json j = probes.to_json();
  for (const char* source : {"pool", "cupti", "memgetinfo"}) {
    ASSERT_TRUE(j.contains(source)) << source;
    EXPECT_EQ(j[source]["available"], false) << source;
    EXPECT_NE(j[source]["reason"].get<std::string>().find(fragment), std::string::npos);
  }
}

TEST(Probes, ExplicitlyUnavailableSetCarriesTheReason) {
  auto p = ProbeSet::unavailable("meta backend: nothing is allocated on a device");
  ASSERT_NO_THROW(drive_a_step(*p));
  EXPECT_FALSE(p->pool().available);
  EXPECT_EQ(p->pool().reason, "meta backend: nothing is allocated on a device");
  EXPECT_EQ(p->cupti().reason, "meta backend: nothing is allocated on a device");
  EXPECT_EQ(p->memgetinfo().reason, "meta backend: nothing is allocated on a device");
  EXPECT_EQ(p->to_json()["cupti"],
            nlohmann::json({{"available", false},
                            {"reason", "meta backend: nothing is allocated on a device"}}));
}

#ifdef TRAINMEM_HAVE_CUDA
// CUPTI itself, asked directly without a driver: it must refuse with the call and CUPTI's
// error name, leave nothing running, and allow another attempt.
TEST(Probes, CuptiRefusalIsReportedWithTheCallAndError) {
  if (expected_reason_fragment().empty())
    GTEST_SKIP() << "a CUDA device is usable here; CUPTI will not refuse";
  probes::CuptiCollector c;
  std::string why;
  EXPECT_FALSE(c.start(&why));
  EXPECT_FALSE(c.running());
  EXPECT_NE(why.find("cuptiActivity"), std::string::npos) << why;
  EXPECT_NE(why.find("CUPTI_ERROR_"), std::string::npos) << why;
  EXPECT_FALSE(c.flush(probes::CuptiCollector::Flush::completed));
  EXPECT_FALSE(c.flush(probes::CuptiCollector::Flush::forced));
  probes::CuptiCollector again;
  std::string why2;
  EXPECT_FALSE(again.start(&why2));
  EXPECT_EQ(why2, why);  // the same refusal, not "already running"
}

TEST(Probes, CuptiResultStringNamesTheError) {
  const std::string s = probes::cupti_result_string(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
  EXPECT_NE(s.find("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"), std::string::npos) << s;
  EXPECT_NE(s.find("another profiler"), std::string::npos) << s;
}
#endif

}  // namespace
}  // namespace trainmem
