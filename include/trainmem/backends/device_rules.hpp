// Host-side rules of the CUDA path that need no device, as plain C++ so that the CPU tests
// (tests/test_device_rules.cpp) check them in every build:
//   - what cublasSetWorkspace accepts (cuBLAS docs, cublasSetWorkspace: the pointer must be
//     aligned to at least 256 bytes, else CUBLAS_STATUS_INVALID_VALUE; below 16 KiB some
//     routines fail with CUBLAS_STATUS_ALLOC_FAILED; Hopper's recommended size is 32 MiB);
//   - when the device allocator answers "out of memory" without asking the driver (a request
//     above the device's total memory can never succeed);
//   - which cudaGetDeviceCount errors mean "no device on this machine" (a hint in the message).
#pragma once
#include <cstdint>
#include <string>

namespace trainmem::device_rules {

constexpr std::uint64_t kCublasWorkspaceAlignment = 256;
constexpr std::uint64_t kCublasWorkspaceMinBytes = 16 << 10;

// "" when cuBLAS accepts (ptr, bytes) as a user workspace, else why not. (nullptr, 0) is not a
// workspace: it means "hand cuBLAS its default one back" and is handled before this check.
inline std::string gemm_workspace_problem(std::uintptr_t ptr, std::uint64_t bytes) {
  if (ptr == 0) return "the workspace pointer is null but its size is " + std::to_string(bytes);
  if (ptr % kCublasWorkspaceAlignment != 0)
    return "the workspace pointer is not aligned to " + std::to_string(kCublasWorkspaceAlignment) +
           " bytes (cublasSetWorkspace requires it; offset " +
           std::to_string(ptr % kCublasWorkspaceAlignment) + ")";
  if (bytes < kCublasWorkspaceMinBytes)
    return "the workspace has " + std::to_string(bytes) + " bytes; cuBLAS needs at least " +
           std::to_string(kCublasWorkspaceMinBytes) + " (32 MiB recommended on Hopper)";
  return "";
}

// The OutOfMemory detail for a request that exceeds the whole device, or "" when the driver
// must be asked. Such a request is refused without a driver call: its answer for absurd sizes
// is not documented to be cudaErrorMemoryAllocation.
inline std::string request_exceeds_device(std::uint64_t bytes, std::uint64_t device_total) {
  if (device_total == 0 || bytes <= device_total) return "";
  return "request of " + std::to_string(bytes) + " bytes exceeds the device's total memory of " +
         std::to_string(device_total) + " bytes";
}

// A hint appended to the reason when cudaGetDeviceCount's error means the machine has no
// usable NVIDIA GPU or driver at all (rather than a broken one): cudaErrorInsufficientDriver
// (35, also what a machine without any driver reports), cudaErrorNoDevice (100).
inline const char* no_device_hint(int cuda_error) {
  switch (cuda_error) {
    case 35:
      return "no NVIDIA driver on this machine, or one older than this CUDA runtime needs";
    case 100:
      return "no CUDA-capable device on this machine";
    default:
      return "";
  }
}

}  // namespace trainmem::device_rules
