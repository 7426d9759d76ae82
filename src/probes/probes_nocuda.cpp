// ProbeSet in a build without CUDA: the same API, every source unavailable.
#ifndef TRAINMEM_HAVE_CUDA
#include "cupti_tag.hpp"
#include "trainmem/probes/probes.hpp"

namespace trainmem {

namespace {
constexpr const char* kNoCuda = "trainmem was built without CUDA (TRAINMEM_CUDA=OFF)";
}

struct ProbeSet::Impl {
  std::string reason = kNoCuda;
};

ProbeSet::ProbeSet() : impl_(std::make_unique<Impl>()) {}
ProbeSet::ProbeSet(const ProbeOptions&) : impl_(std::make_unique<Impl>()) {}
ProbeSet::~ProbeSet() = default;

std::unique_ptr<ProbeSet> ProbeSet::unavailable(const std::string& reason) {
  std::unique_ptr<ProbeSet> p(new ProbeSet());
  p->impl_->reason = reason;
  return p;
}

void ProbeSet::mark(const std::string&) {}
void ProbeSet::begin_step(int) {}
void ProbeSet::phase_end(Phase) {}
void ProbeSet::end_step() {}

PoolResult ProbeSet::pool() const {
  PoolResult r;
  r.reason = impl_->reason;
  return r;
}
CuptiResult ProbeSet::cupti() const {
  CuptiResult r;
  r.reason = impl_->reason;
  return r;
}
MemGetInfoResult ProbeSet::memgetinfo() const {
  MemGetInfoResult r;
  r.reason = impl_->reason;
  return r;
}

namespace probes {
// The CUPTI tagging of CuptiTagAllocator (cupti_tag.hpp): never active without CUDA.
bool cupti_tagging_active() {
  return false;
}
bool cupti_push_external_id(std::uint64_t) {
  return false;
}
void cupti_pop_external_id() {}
}  // namespace probes

}  // namespace trainmem
#endif  // TRAINMEM_HAVE_CUDA
