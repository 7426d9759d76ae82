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
//    each shuffle is a warp-wide barrier exchange (all lanes must take part, as the kernels'
//    warp-uniform control flow guarantees);
//  - __int_as_float, fmaxf, sincosf, INFINITY from the C library.
// Not emulated: memory ordering subtleties, races between blocks (there are none by design),
// performance. Include this header before any kernel header, never with nvcc.
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
#include <thread>
#include <vector>

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace emu {

// A reusable barrier whose participants may leave (arrive_and_drop), like std::barrier.
class Barrier {
 public:
  explicit Barrier(int n) : expected_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(m_);
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
};

// What the threads of the running block share.
struct Block {
  explicit Block(int threads) : barrier(threads) {
    const int warps = (threads + 31) / 32;
    for (int w = 0; w < warps; ++w) {
      const int lanes = threads - 32 * w < 32 ? threads - 32 * w : 32;
      warp_barriers.push_back(std::make_unique<Barrier>(lanes));
    }
    warp_slots.resize(std::size_t(warps));
  }
  Barrier barrier;
  std::vector<std::unique_ptr<Barrier>> warp_barriers;
  std::vector<std::array<std::uint32_t, 32>> warp_slots;
  std::vector<unsigned char> dynamic_smem;
  std::mutex or_mutex;
  int or_acc = 0;
};

struct ThreadCtx {
  dim3 thread_idx, block_idx, block_dim, grid_dim;
  Block* block = nullptr;
  int linear = 0, lane = 0, warp = 0;
};
inline ThreadCtx& ctx() {
  thread_local ThreadCtx c;
  return c;
}

template <class T>
T shfl(T v, int src_lane) {
  static_assert(sizeof(T) == 4, "the emulator shuffles 4-byte values");
  ThreadCtx& c = ctx();
  auto& slots = c.block->warp_slots[std::size_t(c.warp)];
  Barrier& bar = *c.block->warp_barriers[std::size_t(c.warp)];
  std::uint32_t bits;
  std::memcpy(&bits, &v, 4);
  slots[std::size_t(c.lane)] = bits;
  bar.arrive_and_wait();
  const std::uint32_t got = slots[std::size_t(src_lane & 31)];
  bar.arrive_and_wait();  // nobody overwrites its slot before every lane has read
  T out;
  std::memcpy(&out, &got, 4);
  return out;
}

inline void syncthreads() {
  ctx().block->barrier.arrive_and_wait();
}

inline int syncthreads_or(int predicate) {
  Block& b = *ctx().block;
  {
    std::lock_guard<std::mutex> lock(b.or_mutex);
    b.or_acc |= predicate != 0;
  }
  b.barrier.arrive_and_wait();
  const int result = b.or_acc;
  b.barrier.arrive_and_wait();
  if (ctx().linear == 0) b.or_acc = 0;
  b.barrier.arrive_and_wait();
  return result;
}

// kernel<<<grid, block, smem_bytes>>>(args...): blocks in order, a std::thread per CUDA thread.
template <class Kernel, class... Args>
void launch(dim3 grid, dim3 block, std::size_t smem_bytes, Kernel kernel, Args... args) {
  const int threads = int(block.x * block.y * block.z);
  std::exception_ptr failure;
  std::mutex failure_mutex;
  for (unsigned bz = 0; bz < grid.z; ++bz) {
    for (unsigned by = 0; by < grid.y; ++by) {
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        Block blk(threads);
        blk.dynamic_smem.assign(smem_bytes, 0xff);
        std::vector<std::thread> pool;
        pool.reserve(std::size_t(threads));
        for (int t = 0; t < threads; ++t) {
          pool.emplace_back([&, t] {
            ThreadCtx& c = ctx();
            c.thread_idx = dim3(unsigned(t) % block.x, (unsigned(t) / block.x) % block.y,
                                unsigned(t) / (block.x * block.y));
            c.block_idx = dim3(bx, by, bz);
            c.block_dim = block;
            c.grid_dim = grid;
            c.block = &blk;
            c.linear = t;
            c.lane = t % 32;
            c.warp = t / 32;
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
      }
    }
  }
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
#define __syncthreads() ::emu::syncthreads()
#define __syncthreads_or(p) ::emu::syncthreads_or(p)
#define __shfl_sync(mask, v, src) ::emu::shfl((v), (src))
#define __shfl_xor_sync(mask, v, o) ::emu::shfl((v), ::emu::ctx().lane ^ (o))
#define __int_as_float(i) ::emu::int_as_float(i)
#define TM_DYNAMIC_SHARED(T, name) \
  T* name = reinterpret_cast<T*>(::emu::ctx().block->dynamic_smem.data())
