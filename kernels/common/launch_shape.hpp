// Launch geometry of the CUDA kernels as plain C++: every launcher takes its grid, block and
// dynamic shared memory from a function returning a LaunchShape (the generic ones here, the
// per-op ones next to their kernels in kernels/<op>/<op>_kernels.cuh). The CPU tests
// (tests/test_cuda_kernels_emulated.cpp) launch the emulated kernels with the same shapes and
// check them at the real sizes (LLaMA-7B, batch 64, seq 4096) against the hardware limits,
// which no small emulated run reaches.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "trainmem/base/error.hpp"

namespace trainmem::cuda {

constexpr std::int64_t kMaxGridX = 2147483647;  // 2^31 - 1
constexpr std::int64_t kMaxGridY = 65535;       // also gridDim.z
// Dynamic shared memory a block may use without cudaFuncAttributeMaxDynamicSharedMemorySize.
constexpr std::size_t kDefaultDynamicSmemBytes = 48 * 1024;
// With the opt-in: the smallest per-block limit of the architectures trainmem is built for
// (sm_80: 163 KiB; sm_86/sm_89: 99 KiB; sm_90: 227 KiB).
constexpr std::size_t kOptInDynamicSmemBytesSm80 = 163 * 1024;
constexpr std::size_t kOptInDynamicSmemBytesSm86 = 99 * 1024;

// One launch: a grid of grid_x * grid_y blocks of block_x * block_y threads.
struct LaunchShape {
  unsigned grid_x = 1, grid_y = 1;
  unsigned block_x = 1, block_y = 1;
  std::size_t smem_bytes = 0;  // dynamic shared memory per block
  // Whether the launcher must raise the kernel's dynamic shared memory limit first.
  bool needs_smem_opt_in() const { return smem_bytes > kDefaultDynamicSmemBytes; }
};

// A dimension that becomes a grid dimension or a 32-bit loop bound. `what` names it.
inline void require_fits(std::int64_t value, std::int64_t limit, const char* op, const char* what) {
  if (value < 0 || value > limit)
    throw InputError(std::string(op) + ": " + what + " = " + std::to_string(value) +
                     " is outside what the CUDA kernel supports (0.." + std::to_string(limit) +
                     ")");
}
inline void require_positive(std::int64_t value, const char* op, const char* what) {
  if (value <= 0)
    throw InputError(std::string(op) + ": " + what + " must be > 0, got " + std::to_string(value));
}

// ceil(n / d) for n >= 0, d > 0.
inline std::int64_t ceil_div(std::int64_t n, std::int64_t d) {
  return (n + d - 1) / d;
}

// Threads per block of the grid-stride (one thread per element) kernels.
constexpr int kElementwiseThreads = 256;

// Grid for a grid-stride loop over n elements with `block` threads per block. The grid is
// capped at 2^20 blocks (the loops stride), so any n >= 1 is fine.
inline unsigned grid_for(std::int64_t n, int block) {
  const std::int64_t want = ceil_div(n, block);
  const std::int64_t cap = std::int64_t(1) << 20;
  return static_cast<unsigned>(want < 1 ? 1 : (want > cap ? cap : want));
}
inline LaunchShape grid_stride_launch(std::int64_t n, int block) {
  LaunchShape shape;
  shape.grid_x = grid_for(n, block);
  shape.block_x = unsigned(block);
  return shape;
}

// A warp per row, `warps` rows per block of 32 * warps threads. `what` names the rows in
// messages (e.g. "b*a*s").
inline LaunchShape warp_per_row_launch(std::int64_t rows, int warps, const char* op,
                                       const std::string& what) {
  require_positive(rows, op, what.c_str());
  const std::int64_t blocks = ceil_div(rows, warps);
  require_fits(blocks, kMaxGridX, op,
               (what + "/" + std::to_string(warps) + " (blocks of a warp per row)").c_str());
  LaunchShape shape;
  shape.grid_x = unsigned(blocks);
  shape.block_x = unsigned(32 * warps);
  return shape;
}

}  // namespace trainmem::cuda
