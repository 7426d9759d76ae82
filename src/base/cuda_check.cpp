// Error reporting behind the check macros of include/trainmem/cuda_check.hpp.
#include "trainmem/cuda_check.hpp"

#include <cublas_v2.h>
#include <cupti.h>
#include <spdlog/spdlog.h>

namespace trainmem::detail {

std::string cuda_error_string(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + std::to_string(static_cast<int>(e)) +
         "): " + cudaGetErrorString(e);
}

void throw_cuda_error(cudaError_t e, const char* expr, const char* file, int line,
                      const char* func) {
  throw DeviceError(std::string(file) + ":" + std::to_string(line) + " in " + func + ": " + expr +
                    " failed: " + cuda_error_string(e));
}

void throw_cublas_error(int status, const char* expr, const char* file, int line,
                        const char* func) {
  const char* name = cublasGetStatusName(static_cast<cublasStatus_t>(status));
  throw DeviceError(std::string(file) + ":" + std::to_string(line) + " in " + func + ": " + expr +
                    " failed: " + (name ? name : "cuBLAS error") + " (" + std::to_string(status) +
                    ")");
}

void throw_cupti_error(int result, const char* expr, const char* file, int line, const char* func) {
  const char* msg = nullptr;
  cuptiGetResultString(static_cast<CUptiResult>(result), &msg);
  throw DeviceError(std::string(file) + ":" + std::to_string(line) + " in " + func + ": " + expr +
                    " failed: " + (msg ? msg : "CUPTI error") + " (" + std::to_string(result) +
                    ")");
}

void log_cuda_error(cudaError_t e, const char* expr, const char* file, int line) {
  spdlog::error("{}:{}: {} failed: {}", file, line, expr, cuda_error_string(e));
}

}  // namespace trainmem::detail
