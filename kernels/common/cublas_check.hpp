// TM_CUBLAS_CHECK: a failed cuBLAS call becomes DeviceError carrying file, line, function and
// cuBLAS's status name (include only from CUDA-built code). In the kernels layer, which links
// cuBLAS; the backends' cuda backend uses it for the handle's set-up calls.
#pragma once

namespace trainmem::detail {
[[noreturn]] void throw_cublas_error(int status, const char* expr, const char* file, int line,
                                     const char* func);
}  // namespace trainmem::detail

#define TM_CUBLAS_CHECK(expr)                                                             \
  do {                                                                                    \
    int tm_s_ = static_cast<int>(expr);                                                   \
    if (tm_s_ != 0)                                                                       \
      ::trainmem::detail::throw_cublas_error(tm_s_, #expr, __FILE__, __LINE__, __func__); \
  } while (0)
