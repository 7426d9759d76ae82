// The CUDA path's host-side rules (include/trainmem/backends/device_rules.hpp), checked without a
// device: what cublasSetWorkspace accepts, when the device allocator says "out of memory" without
// asking the driver, and the no-device hint in cuda_unavailable_reason().
#include <gtest/gtest.h>

#include <string>

#include "trainmem/backends/backend.hpp"
#include "trainmem/backends/device_rules.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/model.hpp"

#ifdef TRAINMEM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace trainmem {
namespace {

using device_rules::gemm_workspace_problem;
using device_rules::no_device_hint;
using device_rules::request_exceeds_device;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// cuBLAS documentation, cublasSetWorkspace: "The workspace pointer has to be aligned to at
// least 256 bytes, otherwise CUBLAS_STATUS_INVALID_VALUE error is returned"; "Workspace size
// equal to or larger than 16KiB is enough to prevent CUBLAS_STATUS_ALLOC_FAILED error".
TEST(GemmWorkspace, AcceptsA256ByteAlignedBufferOfAtLeast16KiB) {
  EXPECT_EQ(gemm_workspace_problem(0x7f0000000000, std::uint64_t(32) << 20), "");
  EXPECT_EQ(gemm_workspace_problem(0x100, 16384), "");
  EXPECT_EQ(gemm_workspace_problem(0x7f0000000200, 16384), "");
}

TEST(GemmWorkspace, RefusesAPointerOffThe256ByteGrid) {
  for (std::uintptr_t off : {1u, 16u, 128u, 255u}) {
    const std::string why = gemm_workspace_problem(0x7f0000000000 + off, std::uint64_t(32) << 20);
    EXPECT_TRUE(contains(why, "aligned to 256 bytes")) << why;
    EXPECT_TRUE(contains(why, "offset " + std::to_string(off))) << why;
  }
}

TEST(GemmWorkspace, RefusesFewerThan16KiBAndANullPointerWithASize) {
  const std::string small = gemm_workspace_problem(0x100, 16383);
  EXPECT_TRUE(contains(small, "16383 bytes")) << small;
  EXPECT_TRUE(contains(small, "at least 16384")) << small;
  const std::string null = gemm_workspace_problem(0, 4096);
  EXPECT_TRUE(contains(null, "null")) << null;
  EXPECT_TRUE(contains(null, "4096")) << null;
}

// The buffer the model hands to set_gemm_workspace comes from the ledger: with the host and
// meta allocators (and the device pool, 256-byte aligned per the CUDA programming guide) it
// must be a workspace cuBLAS accepts.
TEST(GemmWorkspace, TheModelsLedgerWorkspaceIsAcceptable) {
  HostAllocator host;
  MetaAllocator meta;
  for (Allocator* a : {static_cast<Allocator*>(&host), static_cast<Allocator*>(&meta)}) {
    SCOPED_TRACE(a->name());
    Ledger ledger(*a);
    Tensor other = ledger.allocate("odd", Category::workspace, -1, {37}, DType::bf16);
    Tensor ws = ledger.allocate("cublas_workspace", Category::workspace, -1,
                                {std::int64_t(kGemmWorkspaceBytes / 4)}, DType::f32);
    EXPECT_EQ(gemm_workspace_problem(reinterpret_cast<std::uintptr_t>(ws.data()), ws.bytes()), "");
    EXPECT_EQ(ws.bytes(), std::uint64_t(32) << 20);  // cuBLAS's recommendation for Hopper
  }
}

TEST(DeviceOutOfMemory, ARequestAboveTheDevicesTotalIsRefusedWithBothFigures) {
  const std::uint64_t total = 150'000'000'000;  // an H200's order of magnitude
  const std::string why = request_exceeds_device(total + 1, total);
  EXPECT_TRUE(contains(why, std::to_string(total + 1) + " bytes")) << why;
  EXPECT_TRUE(contains(why, "total memory of " + std::to_string(total))) << why;
  EXPECT_FALSE(request_exceeds_device(std::uint64_t(1) << 50, total).empty());
}

TEST(DeviceOutOfMemory, RequestsUpToTheTotalGoToTheDriver) {
  EXPECT_EQ(request_exceeds_device(1000, 1000), "");
  EXPECT_EQ(request_exceeds_device(1, 1000), "");
  EXPECT_EQ(request_exceeds_device(std::uint64_t(1) << 50, 0), "");  // total unknown
}

TEST(NoDeviceHint, NamesTheMissingDriverOrDevice) {
  EXPECT_TRUE(contains(no_device_hint(35), "no NVIDIA driver")) << no_device_hint(35);
  EXPECT_TRUE(contains(no_device_hint(100), "no CUDA-capable device")) << no_device_hint(100);
  EXPECT_EQ(std::string(no_device_hint(2)), "");  // out of memory is not "no device"
  EXPECT_EQ(std::string(no_device_hint(0)), "");
}

#ifdef TRAINMEM_HAVE_CUDA
// On a machine without a driver (cudaErrorInsufficientDriver) or device the reason carries the
// hint; where a device is usable there is no reason at all.
TEST(NoDeviceHint, CudaUnavailableReasonCarriesItHere) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  (void)cudaGetLastError();
  const std::string reason = cuda_unavailable_reason();
  if (e == cudaSuccess && n > 0) {
    EXPECT_EQ(reason, "");
    return;
  }
  const std::string hint = no_device_hint(static_cast<int>(e));
  if (hint.empty()) GTEST_SKIP() << "this machine's error " << int(e) << " has no hint";
  EXPECT_TRUE(contains(reason, hint)) << reason;
  EXPECT_TRUE(contains(reason, cudaGetErrorName(e))) << reason;
}
#endif

}  // namespace
}  // namespace trainmem
