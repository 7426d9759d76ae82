// DeviceAllocator (include/trainmem/backends/device_allocator.hpp).
#include "trainmem/backends/device_allocator.hpp"

#include <limits>

#include "trainmem/backends/device_rules.hpp"
#include "trainmem/base/cuda_check.hpp"

namespace trainmem {

DeviceAllocator::DeviceAllocator(int device, cudaStream_t stream)
    : device_(device), stream_(stream) {
  TM_CUDA_CHECK(cudaSetDevice(device));
  std::size_t free_b = 0, total_b = 0;
  TM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  device_total_ = total_b;
  cudaMemPoolProps props{};  // zeroed: maxSize 0 (the system's default), reserved fields 0
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  TM_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
  // Keep every freed byte in the pool: reserved memory then only grows, and the pool's
  // ReservedMemHigh is the step's footprint.
  std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();  // cuuint64_t attribute
  const cudaError_t e = cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold);
  if (e != cudaSuccess) {
    TM_CUDA_CHECK_NOTHROW(cudaMemPoolDestroy(pool_));  // the destructor will not run
    pool_ = nullptr;
    TM_CUDA_CHECK(e);
  }
}

DeviceAllocator::~DeviceAllocator() {
  if (pool_ == nullptr) return;
  TM_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(stream_));
  TM_CUDA_CHECK_NOTHROW(cudaMemPoolDestroy(pool_));
}

void* DeviceAllocator::allocate(std::uint64_t bytes) {
  failure_ = device_rules::request_exceeds_device(bytes, device_total_);
  if (!failure_.empty()) return nullptr;  // can never succeed: no driver call
  if (bytes > std::numeric_limits<std::size_t>::max()) {
    failure_ = "request does not fit in size_t";
    return nullptr;
  }
  void* p = nullptr;
  const cudaError_t e =
      cudaMallocFromPoolAsync(&p, static_cast<std::size_t>(bytes), pool_, stream_);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it so later calls do not report it
    failure_ = "cudaMallocFromPoolAsync: " + detail::cuda_error_string(e);
    std::size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      failure_ +=
          "; device free " + std::to_string(free_b) + " of " + std::to_string(total_b) + " bytes";
    else
      (void)cudaGetLastError();
    std::uint64_t used = 0, reserved = 0;
    if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess &&
        cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved) == cudaSuccess)
      failure_ += "; pool in use " + std::to_string(used) + ", reserved " +
                  std::to_string(reserved) + " bytes";
    else
      (void)cudaGetLastError();
    return nullptr;
  }
  TM_CUDA_CHECK(e);
  return p;
}

void DeviceAllocator::deallocate(void* ptr, std::uint64_t) {
  TM_CUDA_CHECK(cudaFreeAsync(ptr, stream_));
}

void* ManagedAllocator::allocate(std::uint64_t bytes) {
  failure_.clear();
  if (bytes > std::numeric_limits<std::size_t>::max()) {
    failure_ = "request does not fit in size_t";
    return nullptr;
  }
  void* p = nullptr;
  const cudaError_t e = cudaMallocManaged(&p, static_cast<std::size_t>(bytes), cudaMemAttachGlobal);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    failure_ = "cudaMallocManaged: " + detail::cuda_error_string(e);
    return nullptr;
  }
  TM_CUDA_CHECK(e);
  return p;
}

void ManagedAllocator::deallocate(void* ptr, std::uint64_t) {
  TM_CUDA_CHECK(cudaFree(ptr));
}

}  // namespace trainmem
