// CuptiTagAllocator: the probes' side of CUPTI attribution, as a wrapper around the allocator a
// ledger allocates through (the adaptor style of rmm's resource adaptors).
//
// The ledger calls annotate(category, tensor id) just before each allocate(). While a ProbeSet
// collects CUPTI records, this wrapper brackets the inner allocation with a push and a pop of a
// CUPTI external correlation id carrying both (probes.hpp: encode_external_id), so the CUPTI
// fold books the driver's allocation record under the ledger's category. When no collection
// runs, it forwards and never touches (nor initialises) CUPTI. The wrapped allocator knows
// nothing of it: the device allocator has no probe in it.
//
// Chain of a run on the cuda backend (src/run/run.cpp):
//   ledger -> BudgetAllocator (--device-budget) -> CuptiTagAllocator -> DeviceAllocator
// The probes' pool source reads the DeviceAllocator itself (ProbeOptions::allocator).
#pragma once
#include <cstdint>
#include <string>

#include "trainmem/ledger/ledger.hpp"

namespace trainmem {

class CuptiTagAllocator final : public Allocator {
 public:
  explicit CuptiTagAllocator(Allocator& inner) : inner_(inner) {}

  void* allocate(std::uint64_t bytes) override;
  void deallocate(void* ptr, std::uint64_t bytes) override { inner_.deallocate(ptr, bytes); }
  const char* name() const override { return inner_.name(); }
  bool touches_memory() const override { return inner_.touches_memory(); }
  std::string failure_detail() const override { return inner_.failure_detail(); }
  void annotate(Category category, std::uint64_t tensor_id) override;

  Allocator& inner() { return inner_; }
  // The external id the next allocate() will push (0 when none is pending).
  std::uint64_t pending_external_id() const { return pending_; }

 private:
  Allocator& inner_;
  std::uint64_t pending_ = 0;  // from annotate(), used (and cleared) by the next allocate()
};

}  // namespace trainmem
