// Check macros for the CUDA runtime, cuBLAS and CUPTI (include only from CUDA-built code).
// Each turns a failure into DeviceError carrying file, line, function and the library's
// error name; TM_CUDA_CHECK_NOTHROW logs instead (for destructors).
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "trainmem/error.hpp"

namespace trainmem::detail {
[[noreturn]] void throw_cuda_error(cudaError_t e, const char* expr, const char* file, int line,
                                   const char* func);
[[noreturn]] void throw_cublas_error(int status, const char* expr, const char* file, int line,
                                     const char* func);
[[noreturn]] void throw_cupti_error(int result, const char* expr, const char* file, int line,
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

#define TM_CUBLAS_CHECK(expr)                                                             \
  do {                                                                                    \
    int tm_s_ = static_cast<int>(expr);                                                   \
    if (tm_s_ != 0)                                                                       \
      ::trainmem::detail::throw_cublas_error(tm_s_, #expr, __FILE__, __LINE__, __func__); \
  } while (0)

#define TM_CUPTI_CHECK(expr)                                                             \
  do {                                                                                   \
    int tm_r_ = static_cast<int>(expr);                                                  \
    if (tm_r_ != 0)                                                                      \
      ::trainmem::detail::throw_cupti_error(tm_r_, #expr, __FILE__, __LINE__, __func__); \
  } while (0)
