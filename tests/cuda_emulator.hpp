// A small CUDA emulator for the CPU tests: it lets the kernel headers (kernels/*_kernels.cuh)
// compile as host C++ and runs a launch with one std::thread per CUDA thread, so that the
// *real kernel code* — indexing, bounds, shared memory, barriers, warp shuffles — is checked
// against the CPU references on a machine without a GPU (tests/test_cuda_kernels_emulated.cpp).
//
// Semantics emulated (what trainmem's kernels use, nothing more):
//  - threadIdx, blockIdx, blockDim, gridDim; blocks run one after another, the threads of a
//    block concurrently;
//  - __shared__ arrays (function-local statics: one block runs at a time) and the dynamic
//    shared memory of TM_DYNAMIC_SHARED, filled with 0xff bytes (NaN as floats) before each
//    block so that reading an element nobody wrote shows up;
//  - __syncthreads / __syncthreads_or: a block-wide barrier; a thread that returns leaves the
//    barrier (as an exited thread does on the GPU);
//  - __shfl_sync / __shfl_xor_sync on 4-byte values: lanes are linear thread ids 32k..32k+31,
//    each shuffle is a warp-wide barrier exchange among the lanes that have not exited;
//  - __int_as_float, fmaxf, sincosf, INFINITY from the C library.
// What a GPU leaves undefined or refuses, the emulator refuses (std::logic_error from launch,
// naming the rule), instead of computing a plausible answer:
//  - threads of a block meeting at different __syncthreads (a non-uniform conditional around
//    a barrier); lanes of a warp at different shuffles;
//  - a shuffle reading a lane that has exited (its value is undefined on the GPU);
//  - launches past the hardware limits: more than 1024 threads per block, blockDim.z > 64,
//    an empty grid, gridDim.x > 2^31-1, gridDim.y/z > 65535, dynamic shared memory above
//    48 KiB without the opt-in (cudaFuncAttributeMaxDynamicSharedMemorySize; pass
//    emu::SmemOptIn{} first, as the launcher calls cudaFuncSetAttribute) or above sm_80's
//    163 KiB with it (the smallest limit of the architectures built).
// launch_with(LaunchOptions{..., only_blocks}) runs chosen blocks of a full-size grid, so that
// a kernel's index arithmetic runs at the real sizes (millions of blocks, tensors of 2^31+
// elements held virtually by the test's storage type) without running every block.
// Not emulated: memory ordering subtleties, races between blocks (there are none by design),
// registers and __launch_bounds__ (ptxas, docs/gpu.md), performance. Include this header
// before any kernel header, never with nvcc.
#pragma once
#if defined(__CUDACC__)
#error "tests/cuda_emulator.hpp is for host compilers only"
#endif
#include <array>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace emu {

// Where in the kernel source a barrier or shuffle was called from.
struct Site {
  const char* file = nullptr;
  int line = 0;
  bool operator!=(const Site& o) const {
    return line != o.line || std::string(file ? file : "") != std::string(o.file ? o.file : "");
  }
  std::string str() const { return std::string(file ? file : "?") + ":" + std::to_string(line); }
};

// The first rule a block broke (empty: none); launch throws it after the block's threads end.
struct Violation {
  void record(const std::string& what) {
    std::lock_guard<std::mutex> lock(m);
    if (message.empty()) message = what;
  }
  std::mutex m;
  std::string message;
};

// A reusable barrier whose participants may leave (arrive_and_drop), like std::barrier.
// Every participant of one phase must arrive from the same call site.
class Barrier {
 public:
  Barrier(int n, const char* what, Violation* violation)
      : expected_(n), what_(what), violation_(violation) {}
  void arrive_and_wait(Site site) {
    std::unique_lock<std::mutex> lock(m_);
    if (count_ == 0) {
      site_ = site;
    } else if (site != site_) {
      violation_->record(std::string("divergent ") + what_ + ": threads meet at " + site_.str() +
                         " and " + site.str());
    }
    const unsigned long gen = gen_;
    if (++count_ >= expected_) {
      release();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
  }
  void arrive_and_drop() {
    std::unique_lock<std::mutex> lock(m_);
    --expected_;
    if (expected_ > 0 && count_ >= expected_) release();
  }

 private:
  void release() {
    count_ = 0;
    ++gen_;
    cv_.notify_all();
  }
  std::mutex m_;
  std::condition_variable cv_;
  int expected_;
  int count_ = 0;
  unsigned long gen_ = 0;
  Site site_;
  const char* what_;
  Violation* violation_;
};

// One lane's entry in a warp exchange: its value and the exchange's sequence number (which
// exchanges the lane took part in; a lane that has exited stops counting).
struct Slot {
  std::uint32_t bits = 0;
  unsigned long seq = 0;
};

// What the threads of the running block share.
struct Block {
  explicit Block(int threads) : barrier(threads, "__syncthreads", &violation) {
    const int warps = (threads + 31) / 32;
    for (int w = 0; w < warps; ++w) {
      const int lanes = threads - 32 * w < 32 ? threads - 32 * w : 32;
      warp_barriers.push_back(std::make_unique<Barrier>(lanes, "shuffle", &violation));
    }
    warp_slots.resize(std::size_t(warps));
  }
  Violation violation;
  Barrier barrier;
  std::vector<std::unique_ptr<Barrier>> warp_barriers;
  std::vector<std::array<Slot, 32>> warp_slots;
  std::vector<unsigned char> dynamic_smem;
  std::mutex or_mutex;
  int or_acc = 0;
};

struct ThreadCtx {
  dim3 thread_idx, block_idx, block_dim, grid_dim;
  Block* block = nullptr;
  int linear = 0, lane = 0, warp = 0;
  unsigned long shuffles = 0;  // warp exchanges this thread took part in
};
inline ThreadCtx& ctx() {
  thread_local ThreadCtx c;
  return c;
}

template <class T>
T shfl(T v, int src_lane, Site site) {
  static_assert(sizeof(T) == 4, "the emulator shuffles 4-byte values");
  ThreadCtx& c = ctx();
  auto& slots = c.block->warp_slots[std::size_t(c.warp)];
  Barrier& bar = *c.block->warp_barriers[std::size_t(c.warp)];
  Slot& mine = slots[std::size_t(c.lane)];
  std::memcpy(&mine.bits, &v, 4);
  mine.seq = ++c.shuffles;
  bar.arrive_and_wait(site);
  // Every lane of the warp has now either arrived or exited.
  const int src = src_lane & 31;
  const Slot& from = slots[std::size_t(src)];
  if (from.seq != c.shuffles) {
    c.block->violation.record("shuffle at " + site.str() + " reads exited lane " +
                              std::to_string(src) + " (undefined on a GPU)");
  }
  const std::uint32_t got = from.bits;
  bar.arrive_and_wait(site);  // nobody overwrites its slot before every lane has read
  T out;
  std::memcpy(&out, &got, 4);
  return out;
}

inline void syncthreads(Site site) {
  ctx().block->barrier.arrive_and_wait(site);
}

inline int syncthreads_or(int predicate, Site site) {
  Block& b = *ctx().block;
  {
    std::lock_guard<std::mutex> lock(b.or_mutex);
    b.or_acc |= predicate != 0;
  }
  b.barrier.arrive_and_wait(site);
  const int result = b.or_acc;
  b.barrier.arrive_and_wait(site);
  if (ctx().linear == 0) b.or_acc = 0;
  b.barrier.arrive_and_wait(site);
  return result;
}

// Passed first to launch: the launcher raised the kernel's dynamic shared memory limit
// (cudaFuncSetAttribute with cudaFuncAttributeMaxDynamicSharedMemorySize).
struct SmemOptIn {};

constexpr std::size_t kDefaultDynamicSmem = 48 * 1024;
constexpr std::size_t kOptInDynamicSmemSm80 = 163 * 1024;

// What cudaLaunchKernel would refuse (or what no trainmem target supports).
inline void check_launch_limits(dim3 grid, dim3 block, std::size_t smem_bytes, bool opt_in) {
  const unsigned long long threads = static_cast<unsigned long long>(block.x) * block.y * block.z;
  auto refuse = [](const std::string& why) { throw std::logic_error("launch refused: " + why); };
  if (threads == 0 || threads > 1024)
    refuse("a block has " + std::to_string(threads) + " threads (1..1024 threads allowed)");
  if (block.z > 64) refuse("blockDim.z = " + std::to_string(block.z) + " > 64");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) refuse("empty grid");
  if (grid.x > 2147483647u) refuse("gridDim.x = " + std::to_string(grid.x) + " > 2^31-1");
  if (grid.y > 65535u) refuse("gridDim.y = " + std::to_string(grid.y) + " > 65535");
  if (grid.z > 65535u) refuse("gridDim.z = " + std::to_string(grid.z) + " > 65535");
  if (!opt_in && smem_bytes > kDefaultDynamicSmem)
    refuse(std::to_string(smem_bytes) +
           " bytes of dynamic shared memory need the opt-in above 48 KiB "
           "(cudaFuncAttributeMaxDynamicSharedMemorySize)");
  if (smem_bytes > kOptInDynamicSmemSm80)
    refuse(std::to_string(smem_bytes) +
           " bytes of dynamic shared memory exceed sm_80's 163 KiB per block");
}

// Runs one block of a launch: a std::thread per CUDA thread. Throws the first exception a
// thread threw, or std::logic_error for the first undefined behaviour (list above) it showed.
template <class Kernel, class... Args>
void run_block(dim3 grid, dim3 block, dim3 block_idx, std::size_t smem_bytes, Kernel kernel,
               Args... args) {
  const int threads = int(block.x * block.y * block.z);
  std::exception_ptr failure;
  std::mutex failure_mutex;
  Block blk(threads);
  blk.dynamic_smem.assign(smem_bytes, 0xff);
  std::vector<std::thread> pool;
  pool.reserve(std::size_t(threads));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ThreadCtx& c = ctx();
      c.thread_idx = dim3(unsigned(t) % block.x, (unsigned(t) / block.x) % block.y,
                          unsigned(t) / (block.x * block.y));
      c.block_idx = block_idx;
      c.block_dim = block;
      c.grid_dim = grid;
      c.block = &blk;
      c.linear = t;
      c.lane = t % 32;
      c.warp = t / 32;
      c.shuffles = 0;
      try {
        kernel(args...);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
      // Leaving: the barriers stop waiting for this thread.
      blk.warp_barriers[std::size_t(c.warp)]->arrive_and_drop();
      blk.barrier.arrive_and_drop();
    });
  }
  for (auto& th : pool) th.join();
  if (failure) std::rethrow_exception(failure);
  if (!blk.violation.message.empty())
    throw std::logic_error("block (" + std::to_string(block_idx.x) + "," +
                           std::to_string(block_idx.y) + "," + std::to_string(block_idx.z) +
                           "): " + blk.violation.message);
}

// How to run a launch: with the shared-memory opt-in or not, and all blocks (in order) or
// only the listed ones. The latter runs the last blocks of a launch at the real sizes (a grid
// of millions of blocks) where 32-bit index arithmetic would wrap.
struct LaunchOptions {
  bool smem_opt_in = false;
  std::vector<dim3> only_blocks;
};

// kernel<<<grid, block, smem_bytes>>>(args...). Throws std::logic_error for a launch the GPU
// would refuse (check_launch_limits) or for undefined behaviour in a block (run_block).
template <class Kernel, class... Args>
void launch_with(const LaunchOptions& opt, dim3 grid, dim3 block, std::size_t smem_bytes,
                 Kernel kernel, Args... args) {
  check_launch_limits(grid, block, smem_bytes, opt.smem_opt_in);
  if (!opt.only_blocks.empty()) {
    for (const dim3& b : opt.only_blocks) {
      if (b.x >= grid.x || b.y >= grid.y || b.z >= grid.z)
        throw std::logic_error("launch: block (" + std::to_string(b.x) + "," + std::to_string(b.y) +
                               "," + std::to_string(b.z) + ") is outside the grid");
      run_block(grid, block, b, smem_bytes, kernel, args...);
    }
    return;
  }
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx)
        run_block(grid, block, dim3(bx, by, bz), smem_bytes, kernel, args...);
}
template <class Kernel, class... Args>
void launch(dim3 grid, dim3 block, std::size_t smem_bytes, Kernel kernel, Args... args) {
  launch_with(LaunchOptions{}, grid, block, smem_bytes, kernel, args...);
}
template <class Kernel, class... Args>
void launch(SmemOptIn, dim3 grid, dim3 block, std::size_t smem_bytes, Kernel kernel, Args... args) {
  launch_with(LaunchOptions{true, {}}, grid, block, smem_bytes, kernel, args...);
}

inline float int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}

}  // namespace emu

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define threadIdx (::emu::ctx().thread_idx)
#define blockIdx (::emu::ctx().block_idx)
#define blockDim (::emu::ctx().block_dim)
#define gridDim (::emu::ctx().grid_dim)
#define TM_EMU_SITE (::emu::Site{__FILE__, __LINE__})
#define __syncthreads() ::emu::syncthreads(TM_EMU_SITE)
#define __syncthreads_or(p) ::emu::syncthreads_or((p), TM_EMU_SITE)
#define __shfl_sync(mask, v, src) ::emu::shfl((v), (src), TM_EMU_SITE)
#define __shfl_xor_sync(mask, v, o) ::emu::shfl((v), ::emu::ctx().lane ^ (o), TM_EMU_SITE)
#define __int_as_float(i) ::emu::int_as_float(i)
#define TM_DYNAMIC_SHARED(T, name) \
  T* name = reinterpret_cast<T*>(::emu::ctx().block->dynamic_smem.data())
