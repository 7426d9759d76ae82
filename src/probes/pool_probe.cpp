// The pool probe: the device allocator's pool high-water marks, reset at begin_step and at
// every phase end, read at every phase end.
#include <spdlog/spdlog.h>

#include "device_probes.hpp"
#include "trainmem/backends/device_allocator.hpp"
#include "trainmem/base/cuda_check.hpp"

namespace trainmem::probes {

bool PoolProbe::start(const Allocator* allocator, std::string* reason) {
  const auto* dev = dynamic_cast<const DeviceAllocator*>(allocator);
  if (dev == nullptr) {
    *reason = allocator == nullptr ? "no allocator given to the probes"
                                   : std::string("the ledger's allocator is '") +
                                         allocator->name() + "', not the device pool allocator";
    return false;
  }
  pool_ = dev->pool();
  std::uint64_t v = 0;
  if (!read(cudaMemPoolAttrUsedMemCurrent, &v)) {
    *reason = "cudaMemPoolGetAttribute(cudaMemPoolAttrUsedMemCurrent) failed";
    pool_ = nullptr;
    return false;
  }
  r_.available = true;
  return true;
}

bool PoolProbe::read(cudaMemPoolAttr attr, std::uint64_t* out) {
  std::uint64_t v = 0;  // cuuint64_t for every attribute read here
  const cudaError_t e = cudaMemPoolGetAttribute(pool_, attr, &v);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    spdlog::warn("pool probe: cudaMemPoolGetAttribute({}): {}", static_cast<int>(attr),
                 detail::cuda_error_string(e));
    return false;
  }
  *out = v;
  return true;
}

void PoolProbe::reset_highs() {
  // The high-water marks can only be reset to zero, which restarts them at the current value.
  for (cudaMemPoolAttr a : {cudaMemPoolAttrUsedMemHigh, cudaMemPoolAttrReservedMemHigh}) {
    std::uint64_t zero = 0;
    const cudaError_t e = cudaMemPoolSetAttribute(pool_, a, &zero);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      spdlog::warn("pool probe: resetting a high-water mark: {}", detail::cuda_error_string(e));
    }
  }
}

void PoolProbe::begin_step() {
  if (!r_.available) return;
  r_.phases.clear();
  r_.used_high = r_.reserved_high = 0;
  reset_highs();
}

void PoolProbe::phase_end(Phase phase) {
  if (!r_.available) return;
  PoolPhaseFigure f;
  f.phase = phase;
  read(cudaMemPoolAttrUsedMemHigh, &f.used_high);
  read(cudaMemPoolAttrReservedMemHigh, &f.reserved_high);
  r_.phases.push_back(f);
  r_.used_high = std::max(r_.used_high, f.used_high);
  r_.reserved_high = std::max(r_.reserved_high, f.reserved_high);
  reset_highs();
}

void PoolProbe::end_step() {
  if (!r_.available) return;
  read(cudaMemPoolAttrUsedMemCurrent, &r_.used_current);
  read(cudaMemPoolAttrReservedMemCurrent, &r_.reserved_current);
  // A step with no phase_end: the whole step is one window.
  if (r_.phases.empty()) {
    read(cudaMemPoolAttrUsedMemHigh, &r_.used_high);
    read(cudaMemPoolAttrReservedMemHigh, &r_.reserved_high);
  }
}

}  // namespace trainmem::probes
