// Whether a CUDA device is usable (CUDA builds; src/backends.cpp answers for CPU-only ones).
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "trainmem/backends/backend.hpp"
#include "trainmem/backends/device_rules.hpp"
#include "trainmem/base/cuda_check.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {

// TRAINMEM_FORCE_NO_DEVICE set (to anything but "" or "0"): the probe reports no device
// without asking the driver, so that a GPU machine can exercise the no-device paths (the tests
// do; docs/gpu.md). Every caller (--backend auto|cuda, --budget device, --overhead measure,
// make_cuda_backend, cuda_use_device) goes through here.
std::string cuda_unavailable_reason() {
  if (const char* v = std::getenv("TRAINMEM_FORCE_NO_DEVICE");
      v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0)
    return "TRAINMEM_FORCE_NO_DEVICE is set: the device probe reports no CUDA device (unset it "
           "to use the GPU)";
  try {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so later calls start clean
      std::string reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e) + " (" +
                           cudaGetErrorName(e) + ", " + std::to_string(static_cast<int>(e)) + ")";
      const std::string hint = device_rules::no_device_hint(static_cast<int>(e));
      if (!hint.empty()) reason += "; " + hint;
      return reason;
    }
    if (count <= 0) return "cudaGetDeviceCount: no CUDA devices (0 found)";
    return "";
  } catch (const std::exception& ex) {
    return std::string("cudaGetDeviceCount threw: ") + ex.what();
  } catch (...) {
    return "cudaGetDeviceCount threw an unknown exception";
  }
}

int cuda_use_device(int local_rank) {
  const std::string reason = cuda_unavailable_reason();
  if (!reason.empty()) throw InputError("--backend cuda: no usable CUDA device (" + reason + ")");
  int count = 0;
  TM_CUDA_CHECK(cudaGetDeviceCount(&count));
  const int device = (local_rank < 0 ? 0 : local_rank) % count;
  TM_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

int cuda_current_device() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return device;
}

std::uint64_t cuda_device_total_bytes(std::string* reason) {
  *reason = cuda_unavailable_reason();
  if (!reason->empty()) return 0;
  std::size_t free_b = 0, total_b = 0;
  const cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    *reason =
        std::string("cudaMemGetInfo: ") + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")";
    return 0;
  }
  if (total_b == 0) *reason = "cudaMemGetInfo reported a total of 0 bytes";
  return total_b;
}

}  // namespace trainmem
