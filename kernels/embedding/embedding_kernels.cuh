// Token embedding kernels (launchers in embedding.cu). Device code only: also compiled as host
// C++ by the CPU emulator tests (tests/test_cuda_kernels_emulated.cpp).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/cuda_device.cuh"
#include "common/launch_shape.hpp"
#include "common/storage.hpp"

namespace trainmem::cuda {

// ---------------------------------------------------------------- kernels

// One thread per element of out (n, h), grid-stride.
template <class S>
__global__ void embedding_forward_kernel(void* out, const std::int32_t* tokens, const void* wte,
                                         std::int64_t n, std::int64_t h, std::int64_t V) {
  const std::int64_t total = n * h;
  for (std::int64_t i = global_thread_index(); i < total; i += global_thread_count()) {
    const std::int64_t row = i / h;
    const std::int64_t c = i - row * h;
    const std::int32_t tok = tokens[row];
    const float val =
        (tok >= 0 && tok < V) ? S::load(wte, std::size_t(tok) * h + c) : cuda::quiet_nan();
    S::store(out, i, val);
  }
}

// ---------------------------------------------------------------- backward
// dwte[v] += the sum of dout's rows with tokens[row] == v, in fp32 starting from dwte, in
// position order, rounded once: embedding_cpu's sequence, so the bits are the same. Rows whose
// id is outside [0, V) are skipped; dwte's rows of ids no row holds are not written. Two ways
// to find the rows of an id (embedding.cu picks one):
//  - grouped, as embedding_cpu: sort the positions by id once (O(n log^2 n) comparisons in
//    O(log^2 n) launches), then one sum per group (O(n * h)). Needs 8 * n bytes of scratch.
//  - scan, without scratch: the block of every row scans the ids before and after it, O(n^2)
//    id reads.

constexpr int kEmbBwdThreads = 256;
constexpr int kEmbBwdColsPerThread = 8;  // a block covers 2048 columns
constexpr int kEmbBwdColsPerBlock = kEmbBwdThreads * kEmbBwdColsPerThread;

// One id's sum over the kEmbBwdColsPerThread columns c0, c0 + kEmbBwdThreads, ... of a thread
// (columns at h or beyond are left alone), shared by both backward kernels: start from dwte's row,
// add dout's rows in position order, store once. The same fp32 sequence as embedding_cpu, so
// both round to the same value.
template <class S>
struct EmbRowSum {
  float acc[kEmbBwdColsPerThread];
  std::int64_t c0, h;

  __device__ __forceinline__ EmbRowSum(const void* dwte, std::size_t dst, std::int64_t c0_,
                                       std::int64_t h_)
      : c0(c0_), h(h_) {
    TM_UNROLL
    for (int k = 0; k < kEmbBwdColsPerThread; ++k) {
      const std::int64_t c = c0 + std::int64_t(k) * kEmbBwdThreads;
      acc[k] = c < h ? S::load(dwte, dst + c) : 0.0f;
    }
  }
  // Adds dout's row starting at element `row`.
  __device__ __forceinline__ void add(const void* dout, std::size_t row) {
    TM_UNROLL
    for (int k = 0; k < kEmbBwdColsPerThread; ++k) {
      const std::int64_t c = c0 + std::int64_t(k) * kEmbBwdThreads;
      if (c < h) acc[k] += S::load(dout, row + c);
    }
  }
  __device__ __forceinline__ void store(void* dwte, std::size_t dst) const {
    TM_UNROLL
    for (int k = 0; k < kEmbBwdColsPerThread; ++k) {
      const std::int64_t c = c0 + std::int64_t(k) * kEmbBwdThreads;
      if (c < h) S::store(dwte, dst + c, acc[k]);
    }
  }
};

// ---- grouped: the sort
// A key is (id as uint32) << 32 | position. Keys are distinct (positions are), so any correct
// sort puts them in the order of a stable sort of positions by id: the sort need not be stable.
// An id outside [0, V) is >= V as uint32 (negative ids become >= 2^31): those keys sort after
// every valid one. The sort is a bitonic network whose comparators all put the smaller key
// first (stage k = 2, 4, .. P first compares i with i ^ (k-1), then i with i + j for
// j = k/4 .. 1) over P, the power of two >= n. Positions n..P-1 would hold keys above every
// real key, so their comparators would move nothing: they are skipped, nothing is padded.
using EmbSortKey = unsigned long long;

constexpr int kEmbSortThreads = 512;
constexpr int kEmbSortTile = 2 * kEmbSortThreads;  // keys a tile launch sorts in shared memory
constexpr int kEmbSortStepThreads = 256;

__device__ __forceinline__ EmbSortKey emb_sort_key(std::int32_t id, std::int64_t pos) {
  return (EmbSortKey(std::uint32_t(id)) << 32) | EmbSortKey(pos);
}
__device__ __forceinline__ std::uint32_t emb_key_id(EmbSortKey key) {
  return std::uint32_t(key >> 32);
}
__device__ __forceinline__ std::int64_t emb_key_pos(EmbSortKey key) {
  return std::int64_t(key & 0xffffffffull);
}

// The p-th comparator (i, l), i < l, of a step at distance `half` (l = i + half) or of the
// first step of stage 2 * half (flip: l = i ^ (2 * half - 1), the mirror image in its k-block).
__device__ __forceinline__ void emb_sort_pair(std::int64_t p, std::int64_t half, bool flip,
                                              std::int64_t& i, std::int64_t& l) {
  i = ((p & ~(half - 1)) << 1) | (p & (half - 1));
  l = flip ? (i ^ (2 * half - 1)) : (i + half);
}

// A block per kEmbSortTile consecutive keys, held in shared memory (in the last tile, slots at
// n or beyond hold the all-ones key, above every real one, and are not written back).
// stage == 0: builds the keys from tokens and runs stages 2 .. kEmbSortTile (sorts the tile).
// stage > kEmbSortTile: the steps of that stage at distances below kEmbSortTile, which stay
// inside a tile (the longer ones are embedding_sort_step_kernel launches before it).
// (The sort kernels are templates on the key type, as every kernel in these headers is a
// template: one definition per program, not one from nvcc and one from the emulator tests.)
template <class Key>
__global__ void __launch_bounds__(kEmbSortThreads)
    embedding_sort_tile_kernel(Key* keys, const std::int32_t* tokens, std::int64_t n,
                               std::int64_t stage) {
  __shared__ Key s_key[kEmbSortTile];
  const std::int64_t base = std::int64_t(blockIdx.x) * kEmbSortTile;
  for (int t = int(threadIdx.x); t < kEmbSortTile; t += kEmbSortThreads) {
    const std::int64_t g = base + t;
    s_key[t] = g >= n ? ~Key(0) : stage == 0 ? emb_sort_key(tokens[g], g) : keys[g];
  }
  // Each step: every thread runs one comparator (kEmbSortThreads = kEmbSortTile / 2).
  for (std::int64_t k = stage == 0 ? 2 : stage; k <= (stage == 0 ? kEmbSortTile : stage); k *= 2) {
    for (std::int64_t j = stage == 0 ? k / 2 : kEmbSortTile / 2; j > 0; j /= 2) {
      __syncthreads();
      std::int64_t i, l;
      emb_sort_pair(threadIdx.x, j, stage == 0 && j == k / 2, i, l);
      const Key a = s_key[i], b = s_key[l];
      if (b < a) {
        s_key[i] = b;
        s_key[l] = a;
      }
    }
  }
  __syncthreads();
  for (int t = int(threadIdx.x); t < kEmbSortTile; t += kEmbSortThreads) {
    const std::int64_t g = base + t;
    if (g < n) keys[g] = s_key[t];
  }
}

// One step of the network over all keys: grid-stride over its `pairs` = P / 2 comparators,
// skipping those that reach n or beyond.
template <class Key>
__global__ void __launch_bounds__(kEmbSortStepThreads)
    embedding_sort_step_kernel(Key* keys, std::int64_t n, std::int64_t pairs, std::int64_t half,
                               bool flip) {
  for (std::int64_t p = global_thread_index(); p < pairs; p += global_thread_count()) {
    std::int64_t i, l;
    emb_sort_pair(p, half, flip, i, l);
    if (l >= n) continue;
    const Key a = keys[i], b = keys[l];
    if (b < a) {
      keys[i] = b;
      keys[l] = a;
    }
  }
}

// ---- grouped: the sums
constexpr int kEmbBwdGroupRange = 32;  // sorted positions per block of the sums

// grid (ceil(n / kEmbBwdGroupRange), ceil(h / 2048)), block kEmbBwdThreads, over the sorted
// keys. Block (x, y) owns the groups whose first key lies in its range of kEmbBwdGroupRange
// keys (a group may run on past the range) and is the only writer of their 2048 columns y of
// dwte: no atomics. Blocks do about kEmbBwdGroupRange rows each on average (a group of
// repeated ids is summed by one block, as embedding_cpu sums it in one thread). Every thread
// reads the same keys: the control flow is uniform.
template <class S>
__global__ void __launch_bounds__(kEmbBwdThreads)
    embedding_backward_grouped_kernel(void* dwte, const void* dout, const EmbSortKey* keys,
                                      std::int64_t n, std::int64_t h, std::int64_t V) {
  const std::int64_t first = std::int64_t(blockIdx.x) * kEmbBwdGroupRange;
  const std::int64_t end = first + kEmbBwdGroupRange < n ? first + kEmbBwdGroupRange : n;
  const std::int64_t c0 = std::int64_t(blockIdx.y) * kEmbBwdColsPerBlock + threadIdx.x;
  for (std::int64_t g = first; g < end; ++g) {
    const std::uint32_t id = emb_key_id(keys[g]);
    if (g > 0 && emb_key_id(keys[g - 1]) == id) continue;  // not the first key of its group
    if (id >= std::uint64_t(V)) return;  // invalid: so is every later key (they sort last)

    // The keys of a group are in position order: the rows are added in position order.
    const std::size_t dst = std::size_t(id) * h;
    EmbRowSum<S> sum(dwte, dst, c0, h);
    std::int64_t last = g + 1;  // the group is keys [g, last)
    while (last < n && emb_key_id(keys[last]) == id) ++last;
    for (std::int64_t m = g; m < last; ++m) sum.add(dout, std::size_t(emb_key_pos(keys[m])) * h);
    sum.store(dwte, dst);
    g = last - 1;  // on to the next group's first key
  }
}

// ---- scan (no scratch)
// grid (n, ceil(h / 2048)), block kEmbBwdThreads. Block (row, y) works only if that row is the
// first row holding its id: it then sums dout over all rows m >= row with that id, for its 2048
// columns, and is the only writer of those elements of dwte. No atomics, no scratch.
template <class S>
__global__ void __launch_bounds__(kEmbBwdThreads)
    embedding_backward_scan_kernel(void* dwte, const void* dout, const std::int32_t* tokens,
                                   std::int64_t n, std::int64_t h, std::int64_t V) {
  __shared__ std::int32_t s_tok[kEmbBwdThreads];
  const std::int64_t row = blockIdx.x;
  const std::int32_t tok = tokens[row];  // same value in every thread: the returns are uniform
  if (tok < 0 || tok >= V) return;
  int earlier = 0;
  for (std::int64_t m = threadIdx.x; m < row; m += kEmbBwdThreads) {
    if (tokens[m] == tok) {
      earlier = 1;
      break;
    }
  }
  if (__syncthreads_or(earlier)) return;

  // The rows are added in position order (the chunks of s_tok go forward).
  const std::int64_t c0 = std::int64_t(blockIdx.y) * kEmbBwdColsPerBlock + threadIdx.x;
  const std::size_t dst = std::size_t(tok) * h;
  EmbRowSum<S> sum(dwte, dst, c0, h);

  for (std::int64_t m0 = row; m0 < n; m0 += kEmbBwdThreads) {
    __syncthreads();  // every thread is done with the previous chunk of s_tok
    const std::int64_t m = m0 + threadIdx.x;
    s_tok[threadIdx.x] = m < n ? tokens[m] : -1;
    __syncthreads();
    const std::int64_t left = n - m0;
    const int count = left < kEmbBwdThreads ? int(left) : kEmbBwdThreads;
    for (int r = 0; r < count; ++r) {
      if (s_tok[r] != tok) continue;  // uniform: every thread reads the same s_tok[r]
      sum.add(dout, std::size_t(m0 + r) * h);
    }
  }
  sum.store(dwte, dst);
}

// ---------------------------------------------------------------- launch geometry

// Column blocks of 2048 on gridDim.y, shared by both backward kernels.
inline std::int64_t embedding_backward_col_blocks(std::int64_t h, const char* op) {
  require_positive(h, op, "h");
  const std::int64_t col_blocks = ceil_div(h, kEmbBwdColsPerBlock);
  require_fits(col_blocks, kMaxGridY, op, "h / 2048 (gridDim.y)");
  return col_blocks;
}

// The grouped sums: grid (ceil(n / 32), ceil(h / 2048)), kEmbBwdThreads threads.
inline LaunchShape embedding_backward_launch(std::int64_t n, std::int64_t h, const char* op) {
  require_positive(n, op, "b*s");
  require_fits(n, kMaxGridX, op, "b*s");
  LaunchShape shape;
  shape.grid_x = unsigned(ceil_div(n, kEmbBwdGroupRange));
  shape.grid_y = unsigned(embedding_backward_col_blocks(h, op));
  shape.block_x = kEmbBwdThreads;
  return shape;
}

// The scan: grid (n, ceil(h / 2048)), kEmbBwdThreads threads.
inline LaunchShape embedding_backward_scan_launch(std::int64_t n, std::int64_t h, const char* op) {
  require_positive(n, op, "b*s");
  require_fits(n, kMaxGridX, op, "b*s");
  LaunchShape shape;
  shape.grid_x = unsigned(n);
  shape.grid_y = unsigned(embedding_backward_col_blocks(h, op));
  shape.block_x = kEmbBwdThreads;
  return shape;
}

// Scratch the grouped backward needs: a key per row (n < 2^31: no overflow).
inline std::uint64_t embedding_backward_scratch_bytes(std::int64_t n) {
  return std::uint64_t(n) * sizeof(EmbSortKey);
}
// Whether `scratch` can hold the keys of n rows (enough bytes, aligned for 8-byte keys).
inline bool embedding_backward_can_group(const void* scratch, std::uint64_t scratch_bytes,
                                         std::int64_t n) {
  return scratch != nullptr &&
         reinterpret_cast<std::uintptr_t>(scratch) % sizeof(EmbSortKey) == 0 &&
         scratch_bytes >= embedding_backward_scratch_bytes(n);
}

// One launch of the sort, in order: embedding_sort_tile_kernel(keys, tokens, n, stage) when
// `tile`, else embedding_sort_step_kernel(keys, n, pairs, half, flip).
struct EmbeddingSortLaunch {
  bool tile = true;
  std::int64_t stage = 0;
  std::int64_t pairs = 0, half = 0;
  bool flip = false;
  LaunchShape shape;
};

// The sort of n keys: the tiles sorted (stage 0), then for each stage k = 2 * kEmbSortTile .. P
// its flip and its steps at distances >= kEmbSortTile as step launches, then its shorter steps
// as one tile launch. n = 131072: 1 + 7 tile launches and 28 step launches.
inline std::vector<EmbeddingSortLaunch> embedding_sort_launches(std::int64_t n, const char* op) {
  require_positive(n, op, "b*s");
  require_fits(n, kMaxGridX, op, "b*s");  // positions fit a key's low 32 bits
  std::int64_t P = 1;
  while (P < n) P *= 2;
  LaunchShape tiles;
  tiles.grid_x = unsigned(ceil_div(n, kEmbSortTile));
  tiles.block_x = kEmbSortThreads;
  const LaunchShape steps = grid_stride_launch(P / 2, kEmbSortStepThreads);
  std::vector<EmbeddingSortLaunch> out;
  out.push_back({true, 0, 0, 0, false, tiles});
  for (std::int64_t k = 2 * kEmbSortTile; k <= P; k *= 2) {
    out.push_back({false, k, P / 2, k / 2, true, steps});
    for (std::int64_t j = k / 4; j >= kEmbSortTile; j /= 2)
      out.push_back({false, k, P / 2, j, false, steps});
    out.push_back({true, k, 0, 0, false, tiles});
  }
  return out;
}

}  // namespace trainmem::cuda
