// cuda_unavailable_reason(), behind `--backend auto` and require_cuda_device(): never throws,
// "" exactly when the runtime counts a device, else a reason naming the call and the error.
#include <gtest/gtest.h>

#include "trainmem/backends/backend.hpp"

#ifdef TRAINMEM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace trainmem {
namespace {

TEST(CudaUnavailableReason, AgreesWithTheRuntime) {
  std::string reason;
  ASSERT_NO_THROW(reason = cuda_unavailable_reason());
#ifdef TRAINMEM_HAVE_CUDA
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  cudaGetLastError();
  const bool usable = e == cudaSuccess && count > 0;
  EXPECT_EQ(reason.empty(), usable) << reason;
  if (e != cudaSuccess) {
    // e.g. "cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime version
    // (cudaErrorInsufficientDriver, 35)" on a machine without a driver.
    EXPECT_NE(reason.find("cudaGetDeviceCount"), std::string::npos) << reason;
    EXPECT_NE(reason.find(cudaGetErrorName(e)), std::string::npos) << reason;
    EXPECT_NE(reason.find(", " + std::to_string(static_cast<int>(e)) + ")"), std::string::npos)
        << reason;
  }
  // Asking twice gives the same answer (no sticky state left behind).
  EXPECT_EQ(cuda_unavailable_reason(), reason);
#else
  EXPECT_NE(reason.find("without CUDA"), std::string::npos) << reason;
#endif
}

}  // namespace
}  // namespace trainmem
