// Whether a CUDA device is usable (CUDA builds; src/backends.cpp answers for CPU-only ones).
#include <cuda_runtime_api.h>

#include <string>

#include "cuda/device_rules.hpp"
#include "trainmem/backend.hpp"

namespace trainmem {

std::string cuda_unavailable_reason() {
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

}  // namespace trainmem
