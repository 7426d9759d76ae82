// Check macros for the CUDA runtime (include only from CUDA-built code): a failure becomes
// DeviceError carrying file, line, function and the runtime's error name; TM_CUDA_CHECK_NOTHROW
// logs instead (for destructors). cuBLAS's twin, TM_CUBLAS_CHECK, is the kernels layer's
// (kernels/common/cublas_check.hpp): base links the CUDA runtime only.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "trainmem/base/error.hpp"

namespace trainmem::detail {
[[noreturn]] void throw_cuda_error(cudaError_t e, const char* expr, const char* file, int line,
                                   const char* func);
void log_cuda_error(cudaError_t e, const char* expr, const char* file, int line);
// "cudaErrorInsufficientDriver (35): CUDA driver version is insufficient ..."
std::string cuda_error_string(cudaError_t e);
}  // namespace trainmem::detail

#define TM_CUDA_CHECK(expr)                                                             \
  do {                                                                                  \
    cudaError_t tm_e_ = (expr);                                                         \
    if (tm_e_ != cudaSuccess)                                                           \
      ::trainmem::detail::throw_cuda_error(tm_e_, #expr, __FILE__, __LINE__, __func__); \
  } while (0)

#define TM_CUDA_CHECK_NOTHROW(expr)                                         \
  do {                                                                      \
    cudaError_t tm_e_ = (expr);                                             \
    if (tm_e_ != cudaSuccess)                                               \
      ::trainmem::detail::log_cuda_error(tm_e_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: catches launch-configuration errors.
#define TM_CUDA_CHECK_LAUNCH() TM_CUDA_CHECK(cudaGetLastError())
