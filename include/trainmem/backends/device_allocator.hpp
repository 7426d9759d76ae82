// The device allocator: cudaMallocFromPoolAsync / cudaFreeAsync from a dedicated pool on the
// model's stream (include only from CUDA-built code).
//
// The pool is trainmem's own (cudaMemPoolCreate), not the device's default pool, so the
// pool probe's high-water marks see our allocations and nothing else; its release threshold
// is UINT64_MAX, so freed memory stays in the pool and ReservedMemHigh is the footprint.
// Out of memory (cudaErrorMemoryAllocation, or a request above the device's total memory,
// refused without asking the driver) returns nullptr and the ledger throws OutOfMemory, with
// failure_detail() saying why (device free/total, the pool's used/reserved bytes); any other
// CUDA error throws DeviceError. The failed call's error is cleared (cudaGetLastError).
// It knows no probe: CUPTI attribution wraps it (CuptiTagAllocator, cupti_tag_allocator.hpp).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "trainmem/ledger/ledger.hpp"

namespace trainmem {

class DeviceAllocator final : public Allocator {
 public:
  // Creates the pool on `device`; allocations and frees are ordered on `stream`.
  DeviceAllocator(int device, cudaStream_t stream);
  ~DeviceAllocator() override;
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  void* allocate(std::uint64_t bytes) override;
  void deallocate(void* ptr, std::uint64_t bytes) override;
  const char* name() const override { return "device"; }
  std::string failure_detail() const override { return failure_; }

  cudaMemPool_t pool() const { return pool_; }
  cudaStream_t stream() const { return stream_; }
  void set_stream(cudaStream_t stream) { stream_ = stream; }
  int device() const { return device_; }
  std::uint64_t device_total_bytes() const { return device_total_; }

 private:
  int device_;
  cudaStream_t stream_;
  cudaMemPool_t pool_ = nullptr;
  std::uint64_t device_total_ = 0;  // cudaMemGetInfo's total at construction
  std::string failure_;
};

// CUDA managed memory (cudaMallocManaged, attached globally), as bitsandbytes' paged optimizers
// take their large states (get_paged: cudaMallocManaged). Outside the pool: the pool probe and
// CUPTI's device-memory records do not see it; pages migrate to the device when a kernel touches
// them (bitsandbytes also prefetches them before each update: a timing matter, not a byte one)
// and the driver may evict them under pressure. Out of memory returns nullptr with
// failure_detail(); any other error throws DeviceError. cudaFree synchronises the device.
class ManagedAllocator final : public Allocator {
 public:
  void* allocate(std::uint64_t bytes) override;
  void deallocate(void* ptr, std::uint64_t bytes) override;
  const char* name() const override { return "managed"; }
  std::string failure_detail() const override { return failure_; }

 private:
  std::string failure_;
};

}  // namespace trainmem
