// Error reporting behind the check macros of include/trainmem/base/cuda_check.hpp.
#include "trainmem/base/cuda_check.hpp"

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

void log_cuda_error(cudaError_t e, const char* expr, const char* file, int line) {
  spdlog::error("{}:{}: {} failed: {}", file, line, expr, cuda_error_string(e));
}

}  // namespace trainmem::detail
