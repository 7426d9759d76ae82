// Error reporting behind TM_CUBLAS_CHECK (kernels/common/cublas_check.hpp).
#include <cublas_v2.h>

#include <string>

#include "common/cublas_check.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem::detail {

void throw_cublas_error(int status, const char* expr, const char* file, int line,
                        const char* func) {
  const char* name = cublasGetStatusName(static_cast<cublasStatus_t>(status));
  throw DeviceError(std::string(file) + ":" + std::to_string(line) + " in " + func + ": " + expr +
                    " failed: " + (name ? name : "cuBLAS error") + " (" + std::to_string(status) +
                    ")");
}

}  // namespace trainmem::detail
