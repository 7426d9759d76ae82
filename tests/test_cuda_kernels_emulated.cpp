// The CUDA kernels' own code, run on the CPU under tests/cuda_emulator.hpp (a std::thread per
// CUDA thread, real barriers and warp shuffles), against the CPU references of
// kernels/<op>/<op>_cpu.cpp. This checks indexing, bounds, tiling, shared-memory layout, barrier
// placement and the warp reductions of every kernel without a GPU. The launch geometry is the
// launchers' (grid, block and dynamic shared memory from the same constants); grid-stride
// kernels get a deliberately small grid so the stride loop runs. Shapes are small (thread
// creation dominates) but cross every tile boundary: several query blocks and key tiles in
// attention, a partial last tile, head dims below and above 32, GQA.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_emulator.hpp"
// The kernel headers, compiled as host C++.
#include "adamw/adamw_kernels.cuh"
#include "adamw8bit/adamw8bit_kernels.cuh"
#include "attention/attention_eager_kernels.cuh"
#include "attention/attention_flash_kernels.cuh"
#include "attention/attention_ring_kernels.cuh"
#include "bias/bias_kernels.cuh"
#include "cross_entropy/cross_entropy_kernels.cuh"
#include "dropout/dropout_kernels.cuh"
#include "embedding/embedding_kernels.cuh"
#include "kernels/residual_kernels.cuh"
#include "moe/moe_kernels.cuh"
#include "nonfinite/nonfinite_kernels.cuh"
#include "quant4/quant4_kernels.cuh"
#include "rmsnorm/rmsnorm_kernels.cuh"
#include "rope/rope_kernels.cuh"
#include "swiglu/swiglu_kernels.cuh"
// The CPU references.
#include "adamw/adamw.hpp"
#include "adamw8bit/adamw8bit.hpp"
#include "attention/attention.hpp"
#include "attention/attention_ring.hpp"
#include "bias/bias.hpp"
#include "cross_entropy/cross_entropy.hpp"
#include "dropout/dropout.hpp"
#include "embedding/embedding.hpp"
#include "moe/moe.hpp"
#include "nonfinite/nonfinite.hpp"
#include "quant4/dynamic_map.hpp"
#include "quant4/quant4.hpp"
#include "rmsnorm/rmsnorm.hpp"
#include "rope/rope.hpp"
#include "swiglu/swiglu.hpp"
#include "trainmem/model/model.hpp"  // kGemmWorkspaceBytes, the scratch the cuda backend lends

namespace trainmem {
namespace {

using namespace trainmem::cuda;
using emu::launch;

// Launches an emulated kernel with a launcher's LaunchShape, with the shared memory opt-in
// exactly when the launcher makes it (allow_dynamic_smem). `only` runs just those blocks.
// A block index (dim3's defaults are for dimensions: 1, not 0).
dim3 block_index(unsigned x, unsigned y = 0) {
  return dim3(x, y, 0);
}

template <class Kernel, class... Args>
void launch_shape(const LaunchShape& L, const std::vector<dim3>& only, Kernel kernel,
                  Args... args) {
  emu::launch_with(emu::LaunchOptions{L.needs_smem_opt_in(), only}, dim3(L.grid_x, L.grid_y),
                   dim3(L.block_x, L.block_y), L.smem_bytes, kernel, args...);
}
template <class Kernel, class... Args>
void launch_shape(const LaunchShape& L, Kernel kernel, Args... args) {
  launch_shape(L, {}, kernel, args...);
}

// n elements of storage S (raw bits), filled uniformly in [lo, hi) and rounded to S.
template <class S>
std::vector<typename S::raw> random_storage(std::size_t n, std::mt19937& rng, float lo = -1,
                                            float hi = 1) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<typename S::raw> v(n);
  for (std::size_t i = 0; i < n; ++i) S::store(v.data(), i, d(rng));
  return v;
}
template <class S>
std::vector<float> to_f32(const std::vector<typename S::raw>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = S::load(v.data(), i);
  return out;
}

// |got - want| <= tol * (max|want| + |want|): scale-aware, and exact when tol is 0.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (float w : want)
    if (std::isfinite(w)) scale = std::max(scale, double(std::fabs(w)));
  std::size_t bad = 0, first = 0;
  double max_err = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    const double e = both_nan ? 0.0 : std::fabs(double(got[i]) - want[i]);
    if (!(e <= tol * (scale + std::fabs(want[i])))) {
      if (bad++ == 0) first = i;
    }
    if (e > max_err || std::isnan(e)) max_err = e;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " elements differ; first at [" << first << "]: got " << got[first]
                     << ", want " << want[first] << "; max abs error " << max_err;
}

// Kernel and reference both compute in fp32 and store in S once: each is within half an ulp
// of S of the exact value (2^-9 bf16, 2^-12 fp16, 2^-25 f32 relative), so they differ by <= one
// ulp; tol16 allows two ulps (bf16 2^-7·2 = 1.6e-2 with the scale term of expect_close, fp16
// 2^-10·2 = 2e-3; f32's 2e-6, ~16 ulps, covers fp32 sums in another order). Callers multiply
// it by the number of S-rounded values a result depends on:
// x2 where one stored intermediate enters (softmax probabilities, rope's inputs and output,
// flash out from rounded probabilities), x4 for backward passes that read two (dinp, dweight
// and dq/dk/dv from stored probabilities and outputs, summed over rows).
template <class S>
double tol16() {  // one fp32 computation rounded once on each side: two ulps of S
  if (S::dtype == DType::bf16) return 1.6e-2;
  if (S::dtype == DType::f16) return 2e-3;
  return 2e-6;
}

// ---------------------------------------------------------------- embedding

template <class S>
void check_embedding_forward() {
  std::mt19937 rng(1);
  const std::int64_t b = 2, s = 7, h = 70, V = 9, n = b * s;
  const auto wte = random_storage<S>(std::size_t(V * h), rng);
  std::vector<std::int32_t> tok(static_cast<std::size_t>(n));
  for (auto& t : tok) t = std::int32_t(rng() % V);  // 14 ids out of 9: repeats
  std::vector<typename S::raw> want(std::size_t(n * h)), got(std::size_t(n * h));
  embedding_forward_cpu(want.data(), tok.data(), wte.data(), b, s, h, V, S::dtype);
  launch(dim3(3), dim3(64), 0, embedding_forward_kernel<S>, static_cast<void*>(got.data()),
         static_cast<const std::int32_t*>(tok.data()), static_cast<const void*>(wte.data()), n, h,
         V);
  expect_close(to_f32<S>(got), to_f32<S>(want), 0, "embedding forward");
}
TEST(CudaKernelsEmulated, EmbeddingForward) {
  check_embedding_forward<F32>();
  check_embedding_forward<BF16>();
}

// The grouped sort as embedding.cu launches it: the launches of embedding_sort_launches on a
// key buffer that starts as garbage (the first launch must build every key).
std::vector<EmbSortKey> emulated_sort_keys(const std::vector<std::int32_t>& tok) {
  const std::int64_t n = std::int64_t(tok.size());
  std::vector<EmbSortKey> keys(tok.size(), 0x5555555555555555ull);
  for (const EmbeddingSortLaunch& launch : embedding_sort_launches(n, "test")) {
    if (launch.tile) {
      launch_shape(launch.shape, embedding_sort_tile_kernel<EmbSortKey>, keys.data(),
                   static_cast<const std::int32_t*>(tok.data()), n, launch.stage);
    } else {
      launch_shape(launch.shape, embedding_sort_step_kernel<EmbSortKey>, keys.data(), n,
                   launch.pairs, launch.half, launch.flip);
    }
  }
  return keys;
}
// What the sort must give: positions stably sorted by id as uint32 (embedding_cpu's order,
// invalid ids last), as keys.
std::vector<EmbSortKey> stable_sorted_keys(const std::vector<std::int32_t>& tok) {
  std::vector<std::int64_t> order(tok.size());
  std::iota(order.begin(), order.end(), std::int64_t(0));
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return std::uint32_t(tok[std::size_t(a)]) < std::uint32_t(tok[std::size_t(b)]);
  });
  std::vector<EmbSortKey> keys;
  for (std::int64_t n : order)
    keys.push_back((EmbSortKey(std::uint32_t(tok[std::size_t(n)])) << 32) | EmbSortKey(n));
  return keys;
}

// Whether two storage vectors hold the same bits (== would call 0 and -0 equal).
template <class Raw>
bool same_bits(const std::vector<Raw>& a, const std::vector<Raw>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(Raw)) == 0;
}

// The launcher's two paths on (n, h) dout, from the same dwte: the grouped sums over keys
// sorted by emulated_sort_keys, and the scan.
template <class S>
void emulated_backward_grouped(std::vector<typename S::raw>& dwte,
                               const std::vector<typename S::raw>& dout,
                               const std::vector<EmbSortKey>& keys, std::int64_t h,
                               std::int64_t V) {
  const std::int64_t n = std::int64_t(keys.size());
  launch_shape(embedding_backward_launch(n, h, "test"), embedding_backward_grouped_kernel<S>,
               static_cast<void*>(dwte.data()), static_cast<const void*>(dout.data()),
               static_cast<const EmbSortKey*>(keys.data()), n, h, V);
}
template <class S>
void emulated_backward_scan(std::vector<typename S::raw>& dwte,
                            const std::vector<typename S::raw>& dout,
                            const std::vector<std::int32_t>& tok, std::int64_t h, std::int64_t V) {
  const std::int64_t n = std::int64_t(tok.size());
  launch_shape(embedding_backward_scan_launch(n, h, "test"), embedding_backward_scan_kernel<S>,
               static_cast<void*>(dwte.data()), static_cast<const void*>(dout.data()),
               static_cast<const std::int32_t*>(tok.data()), n, h, V);
}

// embedding_backward_cpu over the rows whose id is in [0, V) (it refuses the others; the
// kernels skip them). Dropping rows keeps the others' order: the same fp32 sequence.
template <class S>
void cpu_backward_valid_rows(std::vector<typename S::raw>& dwte,
                             const std::vector<typename S::raw>& dout,
                             const std::vector<std::int32_t>& tok, std::int64_t h, std::int64_t V) {
  std::vector<std::int32_t> ids;
  std::vector<typename S::raw> rows;
  for (std::size_t n = 0; n < tok.size(); ++n) {
    if (tok[n] < 0 || tok[n] >= V) continue;
    ids.push_back(tok[n]);
    rows.insert(rows.end(), dout.begin() + std::ptrdiff_t(n * std::size_t(h)),
                dout.begin() + std::ptrdiff_t((n + 1) * std::size_t(h)));
  }
  if (ids.empty()) return;
  embedding_backward_cpu(dwte.data(), rows.data(), ids.data(), 1, std::int64_t(ids.size()), h, V,
                         S::dtype);
}

struct EmbBackwardCase {
  const char* name;
  std::int64_t h, V;
  std::vector<std::int32_t> tokens;
  bool invalid_ids = false;  // also compared with the scan kernel (today's behaviour)
};

// Ids drawn from `pool`, n of them.
std::vector<std::int32_t> draw_ids(std::mt19937& rng, std::size_t n,
                                   const std::vector<std::int32_t>& pool) {
  std::vector<std::int32_t> ids(n);
  for (auto& id : ids) id = pool[rng() % pool.size()];
  return ids;
}

std::vector<EmbBackwardCase> awkward_backward_cases() {
  std::mt19937 rng(7);
  const std::int32_t kMin = std::numeric_limits<std::int32_t>::min();
  const std::int32_t kMax = std::numeric_limits<std::int32_t>::max();
  std::vector<EmbBackwardCase> cases;
  cases.push_back({"one row", 70, 9, {8}});
  cases.push_back({"one row, id 0", 1, 1, {0}});
  // 14 rows over 9 ids, and 70 rows over 3 ids: groups run across the sums' 32-key ranges.
  cases.push_back({"repeats", 70, 9, draw_ids(rng, 14, {0, 1, 2, 3, 4, 5, 6, 7, 8})});
  cases.push_back({"many repeats", 37, 3, draw_ids(rng, 70, {0, 1, 2})});
  cases.push_back({"all equal", 70, 9, std::vector<std::int32_t>(70, 4)});
  // Four ids of 1000: the rows of the others must stay untouched.
  cases.push_back({"gaps", 5, 1000, draw_ids(rng, 77, {0, 7, 500, 999})});
  // h = 2049: a second column block with a single column.
  cases.push_back({"two column blocks", 2049, 5, draw_ids(rng, 40, {0, 2, 4})});
  cases.push_back({"h below the block", 3, 5, draw_ids(rng, 33, {1, 3})});
  // Invalid ids of every kind among repeated valid ones; all invalid; the last one invalid.
  cases.push_back({"invalid ids", 33, 6, draw_ids(rng, 20, {-1, 6, kMin, kMax, 0, 5, 5, 2}), true});
  cases.push_back({"all invalid", 33, 6, {-1, 6, kMax, kMin, -7}, true});
  cases.push_back({"last id invalid", 33, 6, {1, 1, 1, 6}, true});
  return cases;
}

// Bit for bit like embedding_backward_cpu (on the valid rows), with dwte starting from random
// gradients; with invalid ids, also like the scan kernel (the path without scratch).
template <class S>
void check_embedding_backward(const EmbBackwardCase& c, const std::vector<EmbSortKey>& keys,
                              bool with_scan) {
  std::mt19937 rng(3);
  const std::int64_t n = std::int64_t(c.tokens.size());
  const auto dout = random_storage<S>(std::size_t(n * c.h), rng);
  const auto dwte = random_storage<S>(std::size_t(c.V * c.h), rng);
  auto want = dwte, grouped = dwte, scan = dwte;
  cpu_backward_valid_rows<S>(want, dout, c.tokens, c.h, c.V);
  emulated_backward_grouped<S>(grouped, dout, keys, c.h, c.V);
  expect_close(to_f32<S>(grouped), to_f32<S>(want), 0,
               std::string("grouped backward, ") + c.name + " (bit for bit)");
  EXPECT_TRUE(same_bits(grouped, want)) << c.name << ": raw bits";
  if (with_scan) {
    emulated_backward_scan<S>(scan, dout, c.tokens, c.h, c.V);
    EXPECT_TRUE(same_bits(scan, grouped)) << c.name << ": the scan kernel's bits";
  }
}

// The sort (emulated once per case: it does not depend on the dtype), then the sums.
TEST(CudaKernelsEmulated, EmbeddingBackwardGroupedMatchesCpuBitForBitOnAwkwardShapes) {
  for (const EmbBackwardCase& c : awkward_backward_cases()) {
    const std::vector<EmbSortKey> keys = emulated_sort_keys(c.tokens);
    EXPECT_EQ(keys, stable_sorted_keys(c.tokens)) << c.name;
    check_embedding_backward<F32>(c, keys, c.invalid_ids);
    check_embedding_backward<BF16>(c, keys, false);
  }
}

TEST(CudaKernelsEmulated, EmbeddingSortOrdersKeysAsAStableSortById) {
  // Within one tile (1024 keys), just past it (stage 2048: its flip is a global launch), and
  // reversed ids over 2500 keys (stages 2048 and 4096: a flip and a distance-1024 step as
  // global launches), some invalid.
  std::mt19937 rng(11);
  for (std::int64_t n : {3, 1025}) {
    auto tok = draw_ids(rng, std::size_t(n), {0, 1, 2, 3, 5, 8, 13, -1, 40});
    for (auto& id : tok)
      if (rng() % 4 == 0) id = std::int32_t(rng() % 97);  // some ids once, many repeated
    EXPECT_EQ(emulated_sort_keys(tok), stable_sorted_keys(tok)) << "n = " << n;
  }
  std::vector<std::int32_t> down(2500);
  std::iota(down.rbegin(), down.rend(), -3);
  EXPECT_EQ(emulated_sort_keys(down), stable_sorted_keys(down));
}

TEST(CudaKernelsEmulated, EmbeddingBackwardGroupedAcrossGlobalMergeSteps) {
  // 2500 rows, ids repeated and not, some invalid: the keys go through global steps (above).
  std::mt19937 rng(5);
  EmbBackwardCase c{"2500 rows", 3, 300, {}};
  c.tokens = draw_ids(rng, 2500, {0, 1, 2, 3, -1});
  for (auto& id : c.tokens)
    if (rng() % 2 == 0) id = std::int32_t(rng() % 300);
  const std::vector<EmbSortKey> keys = emulated_sort_keys(c.tokens);
  EXPECT_EQ(keys, stable_sorted_keys(c.tokens));
  check_embedding_backward<BF16>(c, keys, false);
}

// ---------------------------------------------------------------- rmsnorm

template <class S>
void check_rmsnorm() {
  std::mt19937 rng(2);
  const std::int64_t n = 5, h = 300;
  const auto inp = random_storage<S>(std::size_t(n * h), rng, -3, 3);
  const auto w = random_storage<S>(std::size_t(h), rng, 0.5f, 1.5f);
  std::vector<typename S::raw> want(std::size_t(n * h)), got(std::size_t(n * h));
  std::vector<float> rstd_want(static_cast<std::size_t>(n)), rstd_got(static_cast<std::size_t>(n));
  rmsnorm_forward_cpu(want.data(), rstd_want.data(), inp.data(), w.data(), n, h, 1e-5f, S::dtype);
  launch_shape(rmsnorm_row_launch(n, "test"), rmsnorm_forward_kernel<S>,
               static_cast<void*>(got.data()), rstd_got.data(),
               static_cast<const void*>(inp.data()), static_cast<const void*>(w.data()), h, 1e-5f);
  expect_close(rstd_got, rstd_want, 1e-6, "rmsnorm rstd");
  expect_close(to_f32<S>(got), to_f32<S>(want), tol16<S>(), "rmsnorm out");

  const auto dout = random_storage<S>(std::size_t(n * h), rng);
  auto dinp_want = random_storage<S>(std::size_t(n * h), rng);
  auto dw_want = random_storage<S>(std::size_t(h), rng);
  auto dinp_got = dinp_want, dw_got = dw_want;
  rmsnorm_backward_cpu(dinp_want.data(), dw_want.data(), dout.data(), inp.data(), w.data(),
                       rstd_want.data(), n, h, S::dtype);
  launch_shape(rmsnorm_row_launch(n, "test"), rmsnorm_backward_dinp_kernel<S>,
               static_cast<void*>(dinp_got.data()), static_cast<const void*>(dout.data()),
               static_cast<const void*>(inp.data()), static_cast<const void*>(w.data()),
               static_cast<const float*>(rstd_want.data()), h);
  launch_shape(rmsnorm_dweight_launch(h, "test"), rmsnorm_backward_dweight_kernel<S>,
               static_cast<void*>(dw_got.data()), static_cast<const void*>(dout.data()),
               static_cast<const void*>(inp.data()), static_cast<const float*>(rstd_want.data()), n,
               h);
  expect_close(to_f32<S>(dinp_got), to_f32<S>(dinp_want), tol16<S>() * 2, "rmsnorm dinp");
  expect_close(to_f32<S>(dw_got), to_f32<S>(dw_want), tol16<S>() * 4, "rmsnorm dweight");
}
TEST(CudaKernelsEmulated, RmsNormForwardAndBackward) {
  check_rmsnorm<F32>();
  check_rmsnorm<BF16>();
}

// ---------------------------------------------------------------- rope

// Without scaling and under Llama 3.1's llama3 scaling at original 64 (d 12, theta 10000: the
// six pairs' wavelengths 6.3, 29, 135, ... 13500 fall in all three bands, < 16, 16..64, > 64),
// and at a context-parallel rank's positions (rows 0..3 at 4..7, rows 4..8 at 20..24).
template <class S>
void check_rope() {
  std::mt19937 rng(3);
  const std::int64_t b = 2, s = 9, a = 4, kv = 2, d = 12;
  RopeSpec scaled{10000.0, {}};
  scaled.scaling = {RopeScalingKind::llama3, 8.0, 1.0, 4.0, 64};
  RopeSpec chunks = scaled;
  chunks.positions = SeqPositions{4, 4, 20};
  for (const RopeSpec& spec : {RopeSpec{10000.0, {}}, scaled, chunks})
    for (float sign : {1.0f, -1.0f}) {
      auto q_want = random_storage<S>(std::size_t(b * s * a * d), rng);
      auto k_want = random_storage<S>(std::size_t(b * s * kv * d), rng);
      auto q_got = q_want, k_got = k_want;
      if (sign > 0) {
        rope_forward_cpu(q_want.data(), k_want.data(), b, s, a, kv, d, spec, S::dtype);
      } else {
        rope_backward_cpu(q_want.data(), k_want.data(), b, s, a, kv, d, spec, S::dtype);
      }
      const RopeFreqParams freq = rope_freq_params(spec);
      launch(dim3(2), dim3(64), 0, rope_kernel<S>, static_cast<void*>(q_got.data()),
             b * s * a * (d / 2), s, a, d, freq, spec.positions, sign);
      launch(dim3(2), dim3(64), 0, rope_kernel<S>, static_cast<void*>(k_got.data()),
             b * s * kv * (d / 2), s, kv, d, freq, spec.positions, sign);
      expect_close(to_f32<S>(q_got), to_f32<S>(q_want), tol16<S>() * 2, "rope q");
      expect_close(to_f32<S>(k_got), to_f32<S>(k_want), tol16<S>() * 2, "rope k");
    }
}
TEST(CudaKernelsEmulated, RopeForwardAndBackward) {
  check_rope<F32>();
  check_rope<F16>();
}

// ---------------------------------------------------------------- bias

// Both kernels against the CPU reference, bit for bit: the add is one fp32 addition rounded once,
// and the column sums follow the same order on both sides (bias_math.hpp). Columns off the
// 32-column block, rows off the 16 row lanes, a small grid so the forward's stride loop runs.
template <class S>
void check_bias(std::int64_t n, std::int64_t c) {
  std::mt19937 rng(9);
  auto out_w = random_storage<S>(std::size_t(n * c), rng);
  const auto bias = random_storage<S>(std::size_t(c), rng);
  auto out_g = out_w;
  bias_forward_cpu(out_w.data(), bias.data(), n, c, S::dtype);
  launch(dim3(3), dim3(64), 0, bias_forward_kernel<S>, static_cast<void*>(out_g.data()),
         static_cast<const void*>(bias.data()), n * c, c);
  expect_close(to_f32<S>(out_g), to_f32<S>(out_w), 0, "bias forward");

  const auto dout = random_storage<S>(std::size_t(n * c), rng, -4, 4);
  auto db_w = random_storage<S>(std::size_t(c), rng);
  auto db_g = db_w;
  bias_backward_cpu(db_w.data(), dout.data(), n, c, S::dtype);
  launch_shape(bias_backward_launch(c, "test"), bias_backward_kernel<S>,
               static_cast<void*>(db_g.data()), static_cast<const void*>(dout.data()), n, c);
  expect_close(to_f32<S>(db_g), to_f32<S>(db_w), 0, "bias backward");
}
TEST(CudaKernelsEmulated, BiasForwardAndBackwardBitIdentical) {
  check_bias<F32>(37, 70);
  check_bias<BF16>(5, 33);
  check_bias<F16>(100, 8);
}

// ---------------------------------------------------------------- elementwise

template <class S>
void check_elementwise() {
  std::mt19937 rng(4);
  const std::int64_t n = 1000;
  const auto gate = random_storage<S>(std::size_t(n), rng, -8, 8);
  const auto up = random_storage<S>(std::size_t(n), rng, -2, 2);
  const auto dout = random_storage<S>(std::size_t(n), rng);
  std::vector<typename S::raw> out_w(n), out_g(n), dg_w(n), dg_g(n), du_w(n), du_g(n);
  swiglu_forward_cpu(out_w.data(), gate.data(), up.data(), n, S::dtype);
  swiglu_backward_cpu(dg_w.data(), du_w.data(), dout.data(), gate.data(), up.data(), n, S::dtype);
  launch(dim3(3), dim3(64), 0, swiglu_forward_kernel<S>, static_cast<void*>(out_g.data()),
         static_cast<const void*>(gate.data()), static_cast<const void*>(up.data()), n);
  launch(dim3(3), dim3(64), 0, swiglu_backward_kernel<S>, static_cast<void*>(dg_g.data()),
         static_cast<void*>(du_g.data()), static_cast<const void*>(dout.data()),
         static_cast<const void*>(gate.data()), static_cast<const void*>(up.data()), n);
  expect_close(to_f32<S>(out_g), to_f32<S>(out_w), tol16<S>(), "swiglu out");
  expect_close(to_f32<S>(dg_g), to_f32<S>(dg_w), tol16<S>(), "swiglu dgate");
  expect_close(to_f32<S>(du_g), to_f32<S>(du_w), tol16<S>(), "swiglu dup");

  // residual: one fp32 add, one rounding (the host computes exactly the same)
  std::vector<typename S::raw> sum(n);
  launch(dim3(2), dim3(32), 0, residual_forward_kernel<S>, static_cast<void*>(sum.data()),
         static_cast<const void*>(gate.data()), static_cast<const void*>(up.data()), n);
  std::vector<float> want(n);
  for (std::int64_t i = 0; i < n; ++i)
    want[std::size_t(i)] = S::round(S::load(gate.data(), i) + S::load(up.data(), i));
  expect_close(to_f32<S>(sum), want, 0, "residual add");

  // cast to bf16 and back
  std::vector<std::uint16_t> b16(n);
  launch(dim3(2), dim3(32), 0, cast_kernel<BF16, S>, static_cast<void*>(b16.data()),
         static_cast<const void*>(gate.data()), n);
  for (std::int64_t i = 0; i < n; ++i)
    ASSERT_EQ(b16[std::size_t(i)], f32_to_bf16(S::load(gate.data(), i))) << "cast at " << i;
}
TEST(CudaKernelsEmulated, SwiGluResidualAndCast) {
  check_elementwise<F32>();
  check_elementwise<BF16>();
  check_elementwise<F16>();
}

// ---------------------------------------------------------------- cross-entropy

template <class S>
void check_cross_entropy() {
  std::mt19937 rng(5);
  const std::int64_t n = 4, V = 1300;
  const auto logits = random_storage<S>(std::size_t(n * V), rng, -6, 6);
  const std::vector<std::int32_t> tgt = {3, -1, std::int32_t(V - 1), 700};
  std::vector<float> loss_w(n), lse_w(n), loss_g(n), lse_g(n);
  cross_entropy_forward_cpu(loss_w.data(), lse_w.data(), logits.data(), tgt.data(), n, V, S::dtype);
  launch_shape(cross_entropy_launch(n, kCeFwdThreads, "test"), cross_entropy_forward_kernel<S>,
               loss_g.data(), lse_g.data(), static_cast<const void*>(logits.data()),
               static_cast<const std::int32_t*>(tgt.data()), V);
  expect_close(lse_g, lse_w, 1e-6, "cross-entropy lse");
  expect_close(loss_g, loss_w, 1e-6, "cross-entropy losses");
  std::vector<typename S::raw> d_w(std::size_t(n * V));
  auto d_g = logits;  // in place, as the model runs it
  cross_entropy_backward_cpu(d_w.data(), logits.data(), lse_w.data(), tgt.data(), n, V, 0.25f,
                             S::dtype);
  launch_shape(cross_entropy_launch(n, kCeBwdThreads, "test"), cross_entropy_backward_kernel<S>,
               static_cast<void*>(d_g.data()), static_cast<const void*>(d_g.data()),
               static_cast<const float*>(lse_w.data()),
               static_cast<const std::int32_t*>(tgt.data()), V, 0.25f);
  expect_close(to_f32<S>(d_g), to_f32<S>(d_w), tol16<S>(), "cross-entropy dlogits");
}
// LoRA dropout: the device's mask and its masked, scaled copy and accumulation are the CPU
// twin's bits (one per element, the same math).
template <class S>
void check_dropout() {
  std::mt19937 rng(8);
  const std::int64_t n = 2000;
  const auto x = random_storage<S>(std::size_t(n), rng);
  const auto base = random_storage<S>(std::size_t(n), rng);
  std::vector<std::uint8_t> mw(n), mg(n);
  dropout_mask_cpu(mw.data(), n, 0.3f, 11, 5);
  launch(dim3(3), dim3(64), 0, dropout_mask_kernel, mg.data(), n, 0.3f, std::uint64_t(11),
         std::uint64_t(5));
  EXPECT_EQ(mg, mw);
  for (bool acc : {false, true}) {
    auto ow = base, og = base;
    dropout_apply_cpu(ow.data(), x.data(), mw.data(), n, 1.0f / 0.7f, acc, S::dtype);
    launch(dim3(2), dim3(32), 0, dropout_apply_kernel<S>, static_cast<void*>(og.data()),
           static_cast<const void*>(x.data()), static_cast<const std::uint8_t*>(mw.data()), n,
           1.0f / 0.7f, acc);
    expect_close(to_f32<S>(og), to_f32<S>(ow), 0, acc ? "dropout accumulate" : "dropout copy");
  }
}
TEST(CudaKernelsEmulated, DropoutMaskAndApplyBitIdentical) {
  check_dropout<F32>();
  check_dropout<BF16>();
  check_dropout<F16>();
}

// Mixture of experts: the routing, its counting sort, the permute, the combine and its backward
// are the CPU twin's bits (per token, per choice or per element, the same math in the same
// order; the emulator runs the device code on the host).
template <class S>
void check_moe() {
  std::mt19937 rng(12);
  const std::int64_t n = 23, E = 6, K = 2, h = 9;
  const auto logits = random_storage<S>(std::size_t(n * E), rng);
  // Capacity 5 of 23·2/6 ≈ 7.7 choices per expert drops some (pos −1, skipped below).
  for (auto [normalize, cap] : {std::pair{true, 0}, {false, 0}, {true, 5}}) {
    std::vector<float> pw(std::size_t(n * E)), pg(pw.size()), ww(std::size_t(n * K)), wg(ww.size());
    std::vector<std::int32_t> iw(std::size_t(n * K)), ig(iw.size()), posw(iw.size()),
        posg(iw.size()), ow(std::size_t(E + 1)), og(ow.size());
    moe_route_cpu(pw.data(), iw.data(), ww.data(), posw.data(), ow.data(), logits.data(), n, E, K,
                  cap, normalize, S::dtype);
    launch(dim3(2), dim3(8), 0, moe_route_kernel<S>, pg.data(), ig.data(), wg.data(),
           static_cast<const void*>(logits.data()), n, E, K, normalize);
    launch(dim3(1), dim3(1), 0, moe_sort_kernel, posg.data(), og.data(),
           static_cast<const std::int32_t*>(ig.data()), n, E, K, std::int64_t(cap));
    if (cap > 0) {
      EXPECT_LT(ow[std::size_t(E)], n * K) << "no choice dropped";
    }
    EXPECT_EQ(pg, pw);
    EXPECT_EQ(ig, iw);
    EXPECT_EQ(wg, ww);
    EXPECT_EQ(posg, posw);
    EXPECT_EQ(og, ow);
    const auto dweight = random_storage<F32>(std::size_t(n * K), rng);
    auto dlw = random_storage<S>(std::size_t(n * E), rng), dlg = dlw;
    // With the load-balancing loss's term when normalised, without it otherwise.
    const auto aux = random_storage<F32>(std::size_t(E), rng);
    const float* a = normalize ? aux.data() : nullptr;
    moe_route_backward_cpu(dlw.data(), dweight.data(), pw.data(), iw.data(), a, n, E, K, normalize,
                           S::dtype);
    launch(dim3(2), dim3(8), 0, moe_route_backward_kernel<S>, static_cast<void*>(dlg.data()),
           static_cast<const float*>(dweight.data()), static_cast<const float*>(pw.data()),
           static_cast<const std::int32_t*>(iw.data()), a, n, E, K, normalize);
    expect_close(to_f32<S>(dlg), to_f32<S>(dlw), 0, "moe route backward");
    const auto x = random_storage<S>(std::size_t(n * h), rng);
    const auto res = random_storage<S>(std::size_t(n * h), rng);
    const auto y = random_storage<S>(std::size_t(n * K * h), rng);
    auto rw = y, rg = y;
    moe_permute_cpu(rw.data(), x.data(), posw.data(), n, K, h, S::dtype);
    launch(dim3(3), dim3(32), 0, moe_permute_kernel<S>, static_cast<void*>(rg.data()),
           static_cast<const void*>(x.data()), static_cast<const std::int32_t*>(posw.data()), n, K,
           h);
    expect_close(to_f32<S>(rg), to_f32<S>(rw), 0, "moe permute");
    for (bool weighted : {true, false}) {
      auto cw = res, cg = res;
      moe_combine_cpu(cw.data(), weighted ? res.data() : nullptr, y.data(),
                      weighted ? ww.data() : nullptr, posw.data(), n, K, h, S::dtype);
      launch(dim3(3), dim3(32), 0, moe_combine_kernel<S>, static_cast<void*>(cg.data()),
             static_cast<const void*>(weighted ? res.data() : nullptr),
             static_cast<const void*>(y.data()),
             static_cast<const float*>(weighted ? ww.data() : nullptr),
             static_cast<const std::int32_t*>(posw.data()), n, K, h);
      expect_close(to_f32<S>(cg), to_f32<S>(cw), 0, "moe combine");
    }
    auto drw = y, drg = y;
    std::vector<float> dww(std::size_t(n * K)), dwg(dww.size());
    moe_combine_backward_cpu(drw.data(), dww.data(), x.data(), y.data(), ww.data(), posw.data(), n,
                             K, h, S::dtype);
    launch(dim3(2), dim3(8), 0, moe_combine_backward_kernel<S>, static_cast<void*>(drg.data()),
           dwg.data(), static_cast<const void*>(x.data()), static_cast<const void*>(y.data()),
           static_cast<const float*>(ww.data()), static_cast<const std::int32_t*>(posw.data()), n,
           K, h);
    expect_close(to_f32<S>(drg), to_f32<S>(drw), 0, "moe combine backward rows");
    EXPECT_EQ(dwg, dww);
  }
  // Qwen2-MoE's shared expert gate and its backward.
  const auto score = random_storage<S>(std::size_t(n), rng);
  const auto ys = random_storage<S>(std::size_t(n * h), rng);
  auto gw = random_storage<S>(std::size_t(n * h), rng), gg = gw;
  moe_gate_add_cpu(gw.data(), ys.data(), score.data(), n, h, S::dtype);
  launch(dim3(3), dim3(32), 0, moe_gate_add_kernel<S>, static_cast<void*>(gg.data()),
         static_cast<const void*>(ys.data()), static_cast<const void*>(score.data()), n, h);
  expect_close(to_f32<S>(gg), to_f32<S>(gw), 0, "moe gate add");
  const auto dout = random_storage<S>(std::size_t(n * h), rng);
  auto dyw = ys, dyg = ys;
  auto dsw = score, dsg = score;
  moe_gate_backward_cpu(dyw.data(), dsw.data(), dout.data(), ys.data(), score.data(), n, h,
                        S::dtype);
  launch(dim3(2), dim3(8), 0, moe_gate_backward_kernel<S>, static_cast<void*>(dyg.data()),
         static_cast<void*>(dsg.data()), static_cast<const void*>(dout.data()),
         static_cast<const void*>(ys.data()), static_cast<const void*>(score.data()), n, h);
  expect_close(to_f32<S>(dyg), to_f32<S>(dyw), 0, "moe gate backward dy");
  expect_close(to_f32<S>(dsg), to_f32<S>(dsw), 0, "moe gate backward dscore");
}
TEST(CudaKernelsEmulated, MoeRoutingPermuteAndCombineBitIdentical) {
  check_moe<F32>();
  check_moe<BF16>();
}

TEST(CudaKernelsEmulated, CrossEntropyForwardAndInPlaceBackward) {
  check_cross_entropy<F32>();
  check_cross_entropy<BF16>();
}

// ---------------------------------------------------------------- optimizers

template <class S>
void check_optimizers() {
  std::mt19937 rng(6);
  const std::int64_t n = 777;
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  auto p_w = random_storage<S>(std::size_t(n), rng);
  auto p_g = p_w;
  std::vector<float> master_w = to_f32<S>(p_w), m_w(n, 0.0f), v_w(n, 0.0f);
  auto master_g = master_w, m_g = m_w, v_g = v_w;
  const bool with_master = S::dtype != DType::f32;
  for (int step = 1; step <= 3; ++step) {
    const auto grad = random_storage<S>(std::size_t(n), rng);
    // Step 2 undoes a loss scale (fp16 runs pass 1/S), the others pass 1.
    const float grad_scale = step == 2 ? 1.0f / 4088.0f : 1.0f;
    adamw_update_cpu(p_w.data(), grad.data(), with_master ? master_w.data() : nullptr, m_w.data(),
                     v_w.data(), n, hp, step, grad_scale, S::dtype);
    const AdamWStepConsts c =
        adamw_step_consts(hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, step);
    launch(dim3(2), dim3(128), 0, adamw_kernel<S>, static_cast<void*>(p_g.data()),
           static_cast<const void*>(grad.data()), with_master ? master_g.data() : nullptr,
           m_g.data(), v_g.data(), n, c, grad_scale);
    expect_close(m_g, m_w, 1e-6, "adamw m");
    expect_close(v_g, v_w, 1e-6, "adamw v");
    if (with_master) expect_close(master_g, master_w, 1e-6, "adamw master");
    expect_close(to_f32<S>(p_g), to_f32<S>(p_w), tol16<S>(), "adamw param");
  }
  const auto grad = random_storage<S>(std::size_t(n), rng);
  sgd_update_cpu(p_w.data(), grad.data(), nullptr, n, 0.05f, 0.125f, S::dtype);
  launch(dim3(2), dim3(128), 0, sgd_kernel<S>, static_cast<void*>(p_g.data()),
         static_cast<const void*>(grad.data()), static_cast<float*>(nullptr), n, 0.05f, 0.125f);
  expect_close(to_f32<S>(p_g), to_f32<S>(p_w), tol16<S>(), "sgd (LOMO, no master)");
}
TEST(CudaKernelsEmulated, AdamWAndSgd) {
  check_optimizers<F32>();
  check_optimizers<BF16>();
  check_optimizers<F16>();  // the dtype that runs with a loss scale
}

// ---------------------------------------------------------------- bitsandbytes quantization

// The 4-bit and 8-bit blockwise kernels against their CPU references, bit for bit (the same
// per-block and per-element functions of quant4_math.hpp): a partial last block, an odd count
// (the pad nibble), an all-zero block, a grid smaller than the blocks (grid-stride).
template <class S>
void check_quant4(Quant4Type t) {
  std::mt19937 rng(41);
  const std::int64_t n = 64 * 37 + 9, bs = 64, nb = quant_blocks(n, bs);
  auto x = random_storage<S>(std::size_t(n), rng, -3, 3);
  for (std::int64_t i = 128; i < 192; ++i) S::store(x.data(), std::size_t(i), 0.0f);
  std::vector<std::uint8_t> pw(static_cast<std::size_t>(quant4_packed_bytes(n))), pg(pw.size());
  std::vector<float> aw(static_cast<std::size_t>(nb)), ag(static_cast<std::size_t>(nb));
  quantize_4bit_cpu(pw.data(), aw.data(), x.data(), n, bs, t, S::dtype);
  launch(dim3(2), dim3(8), 0, quantize_4bit_kernel<S>, pg.data(), ag.data(),
         static_cast<const void*>(x.data()), n, bs, nb, t);
  EXPECT_EQ(pg, pw);
  expect_close(ag, aw, 0, "quant4 absmax");
  for (bool signed_zero : {false, true}) {
    std::vector<typename S::raw> ow(static_cast<std::size_t>(n)), og(static_cast<std::size_t>(n));
    dequantize_4bit_cpu(ow.data(), pw.data(), aw.data(), n, bs, t, signed_zero, S::dtype);
    launch(dim3(3), dim3(64), 0, dequantize_4bit_kernel<S>, static_cast<void*>(og.data()),
           static_cast<const std::uint8_t*>(pw.data()), static_cast<const float*>(aw.data()), n, bs,
           t, signed_zero);
    EXPECT_EQ(std::memcmp(ow.data(), og.data(), ow.size() * sizeof(ow[0])), 0);
  }
}
TEST(CudaKernelsEmulated, Quant4) {
  for (Quant4Type t : {Quant4Type::nf4, Quant4Type::fp4}) {
    check_quant4<F32>(t);
    check_quant4<BF16>(t);
    check_quant4<F16>(t);
  }
}

// The int8 base's kernels (--quant int8) against their CPU references, bit for bit: a zero row,
// a grid smaller than the rows and the elements (grid-stride).
template <class S>
void check_int8() {
  std::mt19937 rng(43);
  const std::int64_t rows = 37, cols = 45, n = rows * cols;
  auto w = random_storage<S>(std::size_t(n), rng, -3, 3);
  for (std::int64_t j = 0; j < cols; ++j) S::store(w.data(), std::size_t(5 * cols + j), 0.0f);
  std::vector<std::int8_t> cw(static_cast<std::size_t>(n)), cg(cw.size());
  std::vector<float> sw(static_cast<std::size_t>(rows)), sg(sw.size());
  quantize_int8_cpu(cw.data(), sw.data(), w.data(), rows, cols, S::dtype);
  launch(dim3(2), dim3(8), 0, quantize_int8_kernel<S>, cg.data(), sg.data(),
         static_cast<const void*>(w.data()), rows, cols);
  EXPECT_EQ(cg, cw);
  expect_close(sg, sw, 0, "int8 SCB");
  std::vector<typename S::raw> ow(static_cast<std::size_t>(n)), og(static_cast<std::size_t>(n));
  dequantize_int8_cpu(ow.data(), cw.data(), sw.data(), rows, cols, S::dtype);
  launch(dim3(3), dim3(64), 0, dequantize_int8_kernel<S>, static_cast<void*>(og.data()),
         static_cast<const std::int8_t*>(cw.data()), static_cast<const float*>(sw.data()), n, cols);
  EXPECT_EQ(std::memcmp(ow.data(), og.data(), ow.size() * sizeof(ow[0])), 0);
}
TEST(CudaKernelsEmulated, Int8) {
  check_int8<F32>();
  check_int8<BF16>();
  check_int8<F16>();
}

TEST(CudaKernelsEmulated, Blockwise8) {
  std::mt19937 rng(42);
  const std::int64_t n = 256 * 5 + 100, bs = 256, nb = quant_blocks(n, bs);
  std::vector<float> x(static_cast<std::size_t>(n));
  std::uniform_real_distribution<float> d(-2, 2);
  for (auto& e : x) e = d(rng);
  for (std::int64_t i = 256; i < 512; ++i) x[std::size_t(i)] = 0.5f;  // a block of equal values
  std::vector<std::uint8_t> lut(kQuantLutSize);
  blockwise8_build_lut(kDynamicMapSigned, lut.data());
  for (float sub : {0.0f, 0.5f}) {  // sub 0.5 makes the second block all zero
    std::vector<std::uint8_t> qw(static_cast<std::size_t>(n)), qg(static_cast<std::size_t>(n));
    std::vector<float> aw(static_cast<std::size_t>(nb)), ag(static_cast<std::size_t>(nb));
    quantize_blockwise8_cpu(qw.data(), aw.data(), x.data(), sub, n, bs, lut.data());
    launch(dim3(1), dim3(4), 0, quantize_blockwise8_kernel, qg.data(), ag.data(),
           static_cast<const float*>(x.data()), sub, n, bs, nb,
           static_cast<const std::uint8_t*>(lut.data()));
    EXPECT_EQ(qg, qw);
    expect_close(ag, aw, 0, "blockwise8 absmax");
    std::vector<float> ow(static_cast<std::size_t>(n)), og(static_cast<std::size_t>(n));
    dequantize_blockwise8_cpu(ow.data(), qw.data(), aw.data(), kDynamicMapSigned, n, bs, true, sub);
    launch(dim3(2), dim3(64), 0, dequantize_blockwise8_kernel, og.data(),
           static_cast<const std::uint8_t*>(qw.data()), static_cast<const float*>(aw.data()),
           static_cast<const float*>(kDynamicMapSigned), n, bs, true, sub);
    expect_close(og, ow, 0, "blockwise8 dequantize");
  }
}

template <class S>
void check_adamw8bit() {
  std::mt19937 rng(43);
  const std::int64_t n = 256 * 9 + 77, nb = quant_blocks(n, kBlockwise8Size);
  std::vector<std::uint8_t> lut1(kQuantLutSize), lut2(kQuantLutSize);
  blockwise8_build_lut(kDynamicMapSigned, lut1.data());
  blockwise8_build_lut(kDynamicMapUnsigned, lut2.data());
  BnbAdamWParams hp;
  auto pw = random_storage<S>(std::size_t(n), rng);
  auto pg = pw;
  std::vector<std::uint8_t> s1w(static_cast<std::size_t>(n), 0),
      s2w(static_cast<std::size_t>(n), 0);
  std::vector<float> a1w(static_cast<std::size_t>(nb), 0.0f),
      a2w(static_cast<std::size_t>(nb), 0.0f);
  auto s1g = s1w, s2g = s2w;
  auto a1g = a1w, a2g = a2w;
  std::vector<float> mw(static_cast<std::size_t>(n), 0.0f), vw(static_cast<std::size_t>(n), 0.0f);
  auto mg = mw, vg = vw;
  auto qw = pw, qg = pw;  // the fp32-state path's parameters
  for (int step = 1; step <= 3; ++step) {
    auto grad = random_storage<S>(std::size_t(n), rng);
    if (step == 1)  // a zero gradient over the first blocks (a fresh LoRA A): absmax 0
      for (std::int64_t i = 0; i < 512; ++i) S::store(grad.data(), std::size_t(i), 0.0f);
    bnb_adamw8bit_update_cpu(pw.data(), grad.data(), s1w.data(), s2w.data(), a1w.data(), a2w.data(),
                             kDynamicMapSigned, kDynamicMapUnsigned, lut1.data(), lut2.data(), n,
                             hp, step, S::dtype);
    launch(dim3(2), dim3(4), 0, bnb_adamw8bit_kernel<S>, static_cast<void*>(pg.data()),
           static_cast<const void*>(grad.data()), s1g.data(), s2g.data(), a1g.data(), a2g.data(),
           static_cast<const float*>(kDynamicMapSigned),
           static_cast<const float*>(kDynamicMapUnsigned),
           static_cast<const std::uint8_t*>(lut1.data()),
           static_cast<const std::uint8_t*>(lut2.data()), n, nb, bnb_adamw_consts(hp, step));
    EXPECT_EQ(s1g, s1w);
    EXPECT_EQ(s2g, s2w);
    expect_close(a1g, a1w, 0, "adamw8bit absmax1");
    expect_close(a2g, a2w, 0, "adamw8bit absmax2");
    expect_close(to_f32<S>(pg), to_f32<S>(pw), 0, "adamw8bit param");
    bnb_adamw32_update_cpu(qw.data(), grad.data(), mw.data(), vw.data(), n, hp, step, S::dtype);
    launch(dim3(3), dim3(64), 0, bnb_adamw32_kernel<S>, static_cast<void*>(qg.data()),
           static_cast<const void*>(grad.data()), mg.data(), vg.data(), n,
           bnb_adamw_consts(hp, step));
    expect_close(mg, mw, 0, "adamw32 m");
    expect_close(vg, vw, 0, "adamw32 v");
    expect_close(to_f32<S>(qg), to_f32<S>(qw), 0, "adamw32 param");
  }
}
TEST(CudaKernelsEmulated, AdamW8bit) {
  check_adamw8bit<F32>();
  check_adamw8bit<BF16>();
}

// ---------------------------------------------------------------- non-finite check

// The kernel and the CPU reference on finite data and with one +inf, -inf or NaN placed at the
// first element, inside the first grid pass, past it (the grid-stride loop) and at the last.
// In fp16 a value above 65504 stored from fp32 is the infinity an overflowing gradient becomes.
template <class S>
void check_nonfinite() {
  std::mt19937 rng(8);
  const std::int64_t n = 1000;  // 2 blocks of 128 threads: four grid passes
  const auto finite = random_storage<S>(std::size_t(n), rng, -60000, 60000);
  auto run_kernel = [&](const std::vector<typename S::raw>& x) {
    unsigned flag = 0;
    launch(dim3(2), dim3(128), 0, nonfinite_flag_kernel<S>, &flag,
           static_cast<const void*>(x.data()), n);
    return flag != 0;
  };
  EXPECT_FALSE(run_kernel(finite)) << dtype_name(S::dtype);
  EXPECT_FALSE(has_nonfinite_cpu(finite.data(), n, S::dtype)) << dtype_name(S::dtype);
  const float inf = std::numeric_limits<float>::infinity();
  const float big = S::dtype == DType::f16 ? 70000.0f : inf;
  for (float bad : {inf, -inf, std::numeric_limits<float>::quiet_NaN(), big}) {
    for (std::int64_t at : {std::int64_t(0), std::int64_t(200), std::int64_t(700), n - 1}) {
      auto x = finite;
      S::store(x.data(), std::size_t(at), bad);
      EXPECT_TRUE(run_kernel(x)) << dtype_name(S::dtype) << " " << bad << " at " << at;
      EXPECT_TRUE(has_nonfinite_cpu(x.data(), n, S::dtype))
          << dtype_name(S::dtype) << " " << bad << " at " << at;
    }
  }
}
TEST(CudaKernelsEmulated, NonFiniteCheck) {
  check_nonfinite<F32>();
  check_nonfinite<BF16>();
  check_nonfinite<F16>();
}

// ---------------------------------------------------------------- attention

struct AttnDims {
  std::int64_t b, s, a, kv, d;
};
constexpr std::int64_t kNoWindow = 0;  // full causal attention

// The eager path's two row kernels, fed scores / dP computed here in fp32 (the GEMMs are
// cuBLAS and checked in test_cuda_plans.cpp). window W > 0: row i keeps keys j with
// i - W < j <= i (written here from the definition, not with attention_math.hpp's helpers).
template <class S>
void check_causal_softmax(const AttnDims& dims, std::int64_t window = 0) {
  std::mt19937 rng(7);
  const std::int64_t rows = dims.b * dims.a * dims.s;
  auto visible = [&](std::int64_t i, std::int64_t j) {
    return j <= i && (window == 0 || i - j < window);
  };
  auto p = random_storage<S>(std::size_t(rows * dims.s), rng, -4, 4);  // scaled scores
  const auto scores = to_f32<S>(p);
  launch_shape(causal_softmax_launch(rows, "test"), causal_softmax_kernel<S>,
               static_cast<void*>(p.data()), rows, dims.s, window);
  std::vector<float> want(std::size_t(rows * dims.s));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = r % dims.s;
    double mx = -INFINITY, sum = 0;
    for (std::int64_t j = 0; j <= i; ++j)
      if (visible(i, j)) mx = std::max<double>(mx, scores[r * dims.s + j]);
    for (std::int64_t j = 0; j <= i; ++j)
      if (visible(i, j)) sum += std::exp(scores[r * dims.s + j] - mx);
    for (std::int64_t j = 0; j < dims.s; ++j)
      want[r * dims.s + j] =
          visible(i, j) ? float(std::exp(scores[r * dims.s + j] - mx) / sum) : 0.0f;
  }
  expect_close(to_f32<S>(p), want, tol16<S>() * 2, "causal softmax");

  auto dp = random_storage<S>(std::size_t(rows * dims.s), rng);
  const auto dpf = to_f32<S>(dp), pf = to_f32<S>(p);
  launch_shape(causal_softmax_launch(rows, "test"), causal_softmax_backward_kernel<S>,
               static_cast<void*>(dp.data()), static_cast<const void*>(p.data()), rows, dims.s,
               window);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = r % dims.s;
    double dot = 0;
    for (std::int64_t j = 0; j <= i; ++j)
      if (visible(i, j)) dot += double(pf[r * dims.s + j]) * dpf[r * dims.s + j];
    for (std::int64_t j = 0; j < dims.s; ++j)
      want[r * dims.s + j] =
          visible(i, j) ? float(pf[r * dims.s + j] * (dpf[r * dims.s + j] - dot)) : 0.0f;
  }
  expect_close(to_f32<S>(dp), want, tol16<S>() * 4, "causal softmax backward");
}

// The four flash kernels against the CPU reference (attention_flash_*_cpu) at the same window.
// kernel_window is what the kernels are given: the window itself, except in the mutation tests
// below, which give them window +- 1 and expect the comparison to fail.
// How many elements of got are outside expect_close's bound (no test failure: the mutation
// tests count).
std::size_t count_outside(const std::vector<float>& got, const std::vector<float>& want,
                          double tol) {
  double scale = 0;
  for (float w : want)
    if (std::isfinite(w)) scale = std::max(scale, double(std::fabs(w)));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - want[i]);
    bad += !(e <= tol * (scale + std::fabs(want[i])));
  }
  return bad;
}

// Runs the four flash kernels with kernel_window against the CPU reference at `window`. When the
// two are equal every output must match (test failures otherwise); returns the number of
// mismatching elements over out, lse, dq, dk and dv (the mutation tests give the kernels an
// off-by-one window and expect a positive count).
template <class S, int DMAX>
std::size_t run_flash(const AttnDims& dims, std::int64_t window, std::int64_t kernel_window) {
  std::mt19937 rng(8);
  const bool check = window == kernel_window;
  const auto [b, s, a, kv, d] = dims;
  const std::size_t nq = std::size_t(b * s * a * d), nkv = std::size_t(b * s * kv * d);
  const std::size_t nl = std::size_t(b * a * s);
  const auto q = random_storage<S>(nq, rng, -2, 2), k = random_storage<S>(nkv, rng),
             v = random_storage<S>(nkv, rng), dout = random_storage<S>(nq, rng);
  const float scale = attention_scale<float>(d);
  const int d_int = int(d);

  std::vector<typename S::raw> out_w(nq), out_g(nq);
  std::vector<float> lse_w(nl), lse_g(nl, NAN);
  attention_flash_forward_cpu(out_w.data(), lse_w.data(), q.data(), k.data(), v.data(), b, s, a, kv,
                              d, window, S::dtype);
  launch_shape(flash_forward_launch(b, a, s, d_int, "test"), flash_forward_kernel<S, DMAX>,
               static_cast<void*>(out_g.data()), lse_g.data(), static_cast<const void*>(q.data()),
               static_cast<const void*>(k.data()), static_cast<const void*>(v.data()), s, a, kv,
               d_int, scale, kernel_window);
  if (check) {
    expect_close(lse_g, lse_w, 1e-6, "flash lse");
    expect_close(to_f32<S>(out_g), to_f32<S>(out_w), tol16<S>() * 2, "flash out");
  }

  // Backward from the CPU's forward results, on both sides.
  std::vector<typename S::raw> dq_w(nq), dk_w(nkv), dv_w(nkv);
  std::vector<float> delta_w(nl), delta_g(nl, NAN);
  attention_flash_backward_cpu(dq_w.data(), dk_w.data(), dv_w.data(), delta_w.data(), dout.data(),
                               q.data(), k.data(), v.data(), out_w.data(), lse_w.data(), b, s, a,
                               kv, d, window, S::dtype);
  std::vector<typename S::raw> dq_g(nq), dk_g(nkv), dv_g(nkv);
  for (auto* buf : {&dq_g, &dk_g, &dv_g})
    for (std::size_t i = 0; i < buf->size(); ++i) S::store(buf->data(), i, NAN);
  const std::int64_t rows = b * s * a;
  launch_shape(flash_delta_launch(rows, "test"), flash_delta_kernel<S>, delta_g.data(),
               static_cast<const void*>(dout.data()), static_cast<const void*>(out_w.data()), rows,
               s, a, d_int);
  if (check) expect_close(delta_g, delta_w, 1e-6, "flash delta");
  launch_shape(flash_dkdv_launch(b, kv, s, d_int, "test"), flash_backward_dkdv_kernel<S, DMAX>,
               static_cast<void*>(dk_g.data()), static_cast<void*>(dv_g.data()),
               static_cast<const void*>(dout.data()), static_cast<const void*>(q.data()),
               static_cast<const void*>(k.data()), static_cast<const void*>(v.data()),
               static_cast<const float*>(lse_w.data()), static_cast<const float*>(delta_g.data()),
               s, a, kv, d_int, scale, kernel_window);
  launch_shape(flash_dq_launch(b, a, s, d_int, "test"), flash_backward_dq_kernel<S, DMAX>,
               static_cast<void*>(dq_g.data()), static_cast<const void*>(dout.data()),
               static_cast<const void*>(q.data()), static_cast<const void*>(k.data()),
               static_cast<const void*>(v.data()), static_cast<const float*>(lse_w.data()),
               static_cast<const float*>(delta_g.data()), s, a, kv, d_int, scale, kernel_window);
  // Window 1: p = 1 on the diagonal, so ds = dp - delta is 0 in exact arithmetic and dq, dk are
  // rounding noise on both sides (1e-8), not comparable relative to themselves: both must be
  // below 1e-5 instead.
  std::size_t bad = 0;
  if (window == 1 && check) {
    for (const auto* g : {&dq_g, &dk_g, &dq_w, &dk_w})
      for (float x : to_f32<S>(*g)) bad += !(std::fabs(x) <= 1e-5f);
    EXPECT_EQ(bad, 0u) << "window 1: dq and dk must vanish";
  } else {
    bad += count_outside(to_f32<S>(dk_g), to_f32<S>(dk_w), tol16<S>() * 4) +
           count_outside(to_f32<S>(dq_g), to_f32<S>(dq_w), tol16<S>() * 4);
    if (check) {
      expect_close(to_f32<S>(dk_g), to_f32<S>(dk_w), tol16<S>() * 4, "flash dk");
      expect_close(to_f32<S>(dq_g), to_f32<S>(dq_w), tol16<S>() * 4, "flash dq");
    }
  }
  if (check) expect_close(to_f32<S>(dv_g), to_f32<S>(dv_w), tol16<S>() * 4, "flash dv");
  return bad + count_outside(lse_g, lse_w, 1e-6) +
         count_outside(to_f32<S>(out_g), to_f32<S>(out_w), tol16<S>() * 2) +
         count_outside(to_f32<S>(dv_g), to_f32<S>(dv_w), tol16<S>() * 4);
}
template <class S, int DMAX>
void check_flash(const AttnDims& dims, std::int64_t window = 0) {
  EXPECT_EQ((run_flash<S, DMAX>(dims, window, window)), 0u) << "window " << window;
}

TEST(CudaKernelsEmulated, CausalSoftmaxForwardAndBackward) {
  check_causal_softmax<F32>({2, 11, 3, 3, 4});
  check_causal_softmax<BF16>({1, 45, 2, 1, 4});  // rows longer than a warp
}

TEST(CudaKernelsEmulated, FlashAttentionGqaAcrossTilesHeadDim24) {
  // 3 query blocks of 16, 2 key tiles of 32 (the last partial), GQA g = 2, d < 32.
  check_flash<F32, 32>({1, 37, 4, 2, 24});
}
TEST(CudaKernelsEmulated, FlashAttentionMqaOddHeadDimBf16) {
  // MQA (g = 3), odd d = 33 in the 64-wide lane layout, two batch rows.
  check_flash<BF16, 64>({2, 20, 3, 1, 33});
}
TEST(CudaKernelsEmulated, FlashAttentionLlamaHeadDim128Fp16) {
  // LLaMA-7B's head dim (the instantiation gpu_check runs), GQA g = 2, 3 query blocks, a
  // partial second key tile.
  check_flash<F16, 128>({1, 40, 4, 2, 128});
}
TEST(CudaKernelsEmulated, FlashAttentionHeadDim200In256LayoutBf16) {
  // The 256-wide lane layout with d < 256 (lanes past d idle), shared memory above 48 KiB.
  check_flash<BF16, 256>({1, 21, 2, 1, 200});
}

// ---------------------------------------------------------------- ring attention
// Context parallelism's block kernels (one thread per row, grid-stride with a small grid) against
// the CPU reference, which runs the same per-row code: equal bit for bit. Three ring steps of a
// rank of cp 3 (its own block first, `first` set), GQA, a sliding window, a block no row sees.

template <class S>
void check_ring(std::int64_t window) {
  std::mt19937 rng(21);
  const std::int64_t b = 2, s = 24, cp = 3, sl = s / cp, a = 4, kv = 2, d = 12;
  const std::size_t nq = std::size_t(b * sl * a * d), nk = std::size_t(b * sl * kv * d);
  const std::size_t nl = std::size_t(b * a * sl);
  const SeqPositions mine = SeqPositions::of_rank(s, cp, 1);
  std::vector<typename S::raw> q = random_storage<S>(nq, rng), dout = random_storage<S>(nq, rng);
  std::vector<std::vector<typename S::raw>> k, v;
  for (int r = 0; r < cp; ++r) {
    k.push_back(random_storage<S>(nk, rng));
    v.push_back(random_storage<S>(nk, rng));
  }
  const RingShape x{b, sl, sl, a, kv, d, window};
  std::vector<float> acc_w(nq), lse_w(nl), acc_g(nq), lse_g(nl);
  std::vector<typename S::raw> out(nq);
  for (std::int64_t j = 0; j < cp; ++j) {
    const std::size_t src = std::size_t((1 - j + cp) % cp);
    const SeqPositions kp = SeqPositions::of_rank(s, cp, std::int64_t(src));
    attention_ring_forward_cpu(acc_w.data(), lse_w.data(), q.data(), k[src].data(), v[src].data(),
                               b, sl, sl, a, kv, d, window, mine, kp, j == 0, S::dtype);
    launch(dim3(2), dim3(32), 0, ring_forward_kernel<S>, acc_g.data(), lse_g.data(),
           static_cast<const void*>(q.data()), static_cast<const void*>(k[src].data()),
           static_cast<const void*>(v[src].data()), x, mine, kp, j == 0);
    expect_close(acc_g, acc_w, 0, "ring forward acc, step " + std::to_string(j));
    expect_close(lse_g, lse_w, 0, "ring forward lse, step " + std::to_string(j));
  }
  launch(dim3(3), dim3(64), 0, round_from_f32_kernel<S>, static_cast<void*>(out.data()),
         static_cast<const float*>(acc_g.data()), std::int64_t(nq));
  std::vector<typename S::raw> out_w(nq);
  round_from_f32_cpu(out_w.data(), acc_w.data(), std::int64_t(nq), S::dtype);
  expect_close(to_f32<S>(out), to_f32<S>(out_w), 0, "ring round");
  // Backward: the steps in the same order, the key/value accumulators per source block.
  std::vector<float> dq_w(nq), dq_g(nq), delta_w(nl), delta_g(nl);
  const std::vector<std::vector<float>> zeros(static_cast<std::size_t>(cp), std::vector<float>(nk));
  std::vector<std::vector<float>> dk_w = zeros, dv_w = zeros, dk_g = zeros, dv_g = zeros;
  for (std::int64_t j = 0; j < cp; ++j) {
    const std::size_t src = std::size_t((1 - j + cp) % cp);
    const SeqPositions kp = SeqPositions::of_rank(s, cp, std::int64_t(src));
    attention_ring_backward_cpu(dq_w.data(), dk_w[src].data(), dv_w[src].data(), delta_w.data(),
                                dout.data(), q.data(), k[src].data(), v[src].data(), out.data(),
                                lse_w.data(), b, sl, sl, a, kv, d, window, mine, kp, j == 0,
                                S::dtype);
    launch(dim3(2), dim3(32), 0, ring_dq_kernel<S>, dq_g.data(), delta_g.data(),
           static_cast<const void*>(dout.data()), static_cast<const void*>(q.data()),
           static_cast<const void*>(k[src].data()), static_cast<const void*>(v[src].data()),
           static_cast<const void*>(out.data()), static_cast<const float*>(lse_g.data()), x, mine,
           kp, j == 0);
    launch(dim3(2), dim3(32), 0, ring_dkdv_kernel<S>, dk_g[src].data(), dv_g[src].data(),
           static_cast<const float*>(delta_g.data()), static_cast<const void*>(dout.data()),
           static_cast<const void*>(q.data()), static_cast<const void*>(k[src].data()),
           static_cast<const void*>(v[src].data()), static_cast<const float*>(lse_g.data()), x,
           mine, kp);
    const std::string step = ", step " + std::to_string(j);
    expect_close(dq_g, dq_w, 0, "ring dq" + step);
    expect_close(delta_g, delta_w, 0, "ring delta" + step);
    expect_close(dk_g[src], dk_w[src], 0, "ring dk" + step);
    expect_close(dv_g[src], dv_w[src], 0, "ring dv" + step);
  }
}

TEST(CudaKernelsEmulated, RingAttentionBlocksEqualTheCpuReference) {
  check_ring<F32>(0);
  check_ring<BF16>(0);
  check_ring<F16>(5);  // a window of 5: rank 1's late chunk sees nothing of block 0
}

// ---------------------------------------------------------------- sliding window
// Query blocks of 16 and key tiles of 32 (forward, dq), key blocks of 16 and query tiles of 32
// (dk/dv): windows of 1, inside a tile (7), cutting a tile (20, 33; 17 and 9 below) and past s
// (100 at s 75: the same as full causal).

TEST(CudaKernelsEmulated, CausalSoftmaxSlidingWindow) {
  for (std::int64_t w : {1, 5, 33, 200}) {
    SCOPED_TRACE("window " + std::to_string(w));
    check_causal_softmax<F32>({1, 45, 2, 1, 4}, w);  // windows shorter and longer than a warp
  }
  check_causal_softmax<BF16>({2, 11, 3, 3, 4}, 4);
}

TEST(CudaKernelsEmulated, FlashAttentionSlidingWindowAcrossTilesGqa) {
  // 5 query blocks, 3 key tiles (the last partial), GQA g = 2 (two query heads on one kv head:
  // the emulator's cost grows with the heads, and two show the head-to-kv mapping), d < 32.
  for (std::int64_t w : {1, 7, 20, 33, 100}) {
    SCOPED_TRACE("window " + std::to_string(w));
    check_flash<F32, 32>({1, 75, 2, 1, 24}, w);
  }
}
TEST(CudaKernelsEmulated, FlashAttentionSlidingWindowMqaBf16AndFp16) {
  check_flash<BF16, 64>({2, 40, 3, 1, 33}, 9);    // MQA, odd d in the 64-wide layout
  check_flash<F16, 128>({1, 50, 2, 1, 128}, 17);  // LLaMA/Mistral head dim
}

// Mutation sensitivity: kernels given window W - 1 or W + 1 disagree with the reference at W (so
// an off-by-one bound in the kernels, in either direction, fails the tests above), at windows
// that cut a key tile, a query block and a key block.
TEST(CudaKernelsEmulated, FlashAttentionWindowOffByOneIsDetected) {
  for (std::int64_t w : {20, 33}) {
    SCOPED_TRACE("window " + std::to_string(w));
    EXPECT_GT((run_flash<F32, 32>({1, 75, 2, 1, 24}, w, w - 1)), 0u);
    EXPECT_GT((run_flash<F32, 32>({1, 75, 2, 1, 24}, w, w + 1)), 0u);
  }
}

// ---------------------------------------------------------------- launch geometry, real sizes
// The launchers' shapes (kernels/*_kernels.cuh, launch_shape.hpp) at the sizes gpu_check and
// the maxbatch searches reach, which no emulated run covers: within the hardware limits, the
// grid covering every row / tile exactly, and the shared-memory opt-in where it is needed.

struct ModelShape {
  std::int64_t b, s, h, a, kv, d, i, V;
};
// LLaMA-7B at gpu_check's batch 8 / seq 512, its sweep corners, and the largest the maxbatch
// searches try (batch 64, seq 4096); one position as the degenerate end.
const ModelShape kRealShapes[] = {
    {8, 512, 4096, 32, 32, 128, 11008, 32000},  {1, 128, 4096, 32, 32, 128, 11008, 32000},
    {4, 512, 4096, 32, 32, 128, 11008, 32000},  {64, 4096, 4096, 32, 32, 128, 11008, 32000},
    {64, 4096, 8192, 64, 8, 128, 28672, 32000}, {1, 1, 4096, 32, 32, 128, 11008, 32000},
};

void expect_launchable(const LaunchShape& L, const std::string& what) {
  EXPECT_NO_THROW(emu::check_launch_limits(dim3(L.grid_x, L.grid_y), dim3(L.block_x, L.block_y),
                                           L.smem_bytes, L.needs_smem_opt_in()))
      << what;
}

TEST(CudaLaunchGeometry, RealSizesFitTheHardwareAndCoverEveryRow) {
  for (const ModelShape& m : kRealShapes) {
    const std::string at = "b=" + std::to_string(m.b) + " s=" + std::to_string(m.s);
    const std::int64_t n = m.b * m.s;
    // Row kernels: one block per row.
    for (const LaunchShape& L : {rmsnorm_row_launch(n, "t"), cross_entropy_launch(n, 512, "t")}) {
      expect_launchable(L, at);
      EXPECT_EQ(std::int64_t(L.grid_x), n) << at;
    }
    const LaunchShape dw = rmsnorm_dweight_launch(m.h, "t");
    expect_launchable(dw, at);
    EXPECT_GE(std::int64_t(dw.grid_x) * dw.block_x, m.h);
    EXPECT_LT(std::int64_t(dw.grid_x - 1) * dw.block_x, m.h);
    // Embedding backward: the grouped sums (32 sorted rows per block), its sort, the scan.
    const LaunchShape eb = embedding_backward_launch(n, m.h, "t");
    expect_launchable(eb, at);
    EXPECT_GE(std::int64_t(eb.grid_x) * kEmbBwdGroupRange, n) << at;
    EXPECT_LT(std::int64_t(eb.grid_x - 1) * kEmbBwdGroupRange, n) << at;
    EXPECT_GE(std::int64_t(eb.grid_y) * kEmbBwdColsPerBlock, m.h);
    for (const EmbeddingSortLaunch& launch : embedding_sort_launches(n, "t"))
      expect_launchable(launch.shape, at);
    EXPECT_LE(embedding_backward_scratch_bytes(n), kGemmWorkspaceBytes) << at;
    const LaunchShape es = embedding_backward_scan_launch(n, m.h, "t");
    expect_launchable(es, at);
    EXPECT_EQ(std::int64_t(es.grid_x), n);
    // Eager softmax: a warp per (bi, head, i) row.
    const std::int64_t rows = m.b * m.a * m.s;
    const LaunchShape sm = causal_softmax_launch(rows, "t");
    expect_launchable(sm, at);
    EXPECT_GE(std::int64_t(sm.grid_x) * kSoftmaxWarps, rows) << at;
    EXPECT_LT(std::int64_t(sm.grid_x - 1) * kSoftmaxWarps, rows) << at;
    // Flash: (b, head) on x, 16-row blocks on y.
    const int d_int = int(m.d);
    for (const LaunchShape& L : {flash_forward_launch(m.b, m.a, m.s, d_int, "t"),
                                 flash_dq_launch(m.b, m.a, m.s, d_int, "t"),
                                 flash_dkdv_launch(m.b, m.kv, m.s, d_int, "t")}) {
      expect_launchable(L, at);
      EXPECT_GE(std::int64_t(L.grid_y) * 16, m.s) << at;
      EXPECT_LT(std::int64_t(L.grid_y - 1) * 16, m.s) << at;
    }
    EXPECT_EQ(std::int64_t(flash_forward_launch(m.b, m.a, m.s, d_int, "t").grid_x), m.b * m.a);
    EXPECT_EQ(std::int64_t(flash_dkdv_launch(m.b, m.kv, m.s, d_int, "t").grid_x), m.b * m.kv);
    const LaunchShape dl = flash_delta_launch(rows, "t");
    expect_launchable(dl, at);
    EXPECT_GE(std::int64_t(dl.grid_x) * kFlashWarps, rows);
    // Grid-stride kernels: the largest elementwise tensor is (b, s, i).
    const LaunchShape gs = grid_stride_launch(n * m.i, kElementwiseThreads);
    expect_launchable(gs, at);
    EXPECT_GE(std::int64_t(gs.grid_x), 1);
  }
}

// The sort's launches, unrolled into the steps each runs, against the whole network over P
// (the power of two >= n): stage k = 2 .. P, its flip (distance k/2), then distances k/4 .. 1.
// A (stage, distance, flip) list per launch plan.
std::vector<std::tuple<std::int64_t, std::int64_t, bool>> network_steps(std::int64_t P) {
  std::vector<std::tuple<std::int64_t, std::int64_t, bool>> steps;
  for (std::int64_t k = 2; k <= P; k *= 2) {
    steps.emplace_back(k, k / 2, true);
    for (std::int64_t j = k / 4; j > 0; j /= 2) steps.emplace_back(k, j, false);
  }
  return steps;
}
std::vector<std::tuple<std::int64_t, std::int64_t, bool>> planned_steps(
    const std::vector<EmbeddingSortLaunch>& plan) {
  std::vector<std::tuple<std::int64_t, std::int64_t, bool>> steps;
  for (const EmbeddingSortLaunch& launch : plan) {
    if (!launch.tile) {
      steps.emplace_back(launch.stage, launch.half, launch.flip);
    } else if (launch.stage == 0) {  // the tile sort: stages 2 .. tile, as the kernel loops them
      for (const auto& st : network_steps(kEmbSortTile)) steps.push_back(st);
    } else {
      for (std::int64_t j = kEmbSortTile / 2; j > 0; j /= 2)
        steps.emplace_back(launch.stage, j, false);
    }
  }
  return steps;
}

TEST(CudaLaunchGeometry, EmbeddingBackwardGroupedAt131072TokensC4096) {
  // b*s = 131072 (e.g. batch 32, seq 4096), h = 4096: plain arithmetic, no run.
  const std::int64_t n = 131072, h = 4096;
  const std::vector<EmbeddingSortLaunch> plan = embedding_sort_launches(n, "t");
  // 1 tile sort, then stages 2^11 .. 2^17: each a flip, the steps at distances 2^(m-2) ..
  // 2^10, and one tile launch for the shorter ones: 1 + 7 tile launches, 7 + 21 step launches.
  ASSERT_EQ(plan.size(), 36u);
  EXPECT_EQ(std::count_if(plan.begin(), plan.end(), [](const auto& launch) { return launch.tile; }),
            8);
  EXPECT_EQ(planned_steps(plan), network_steps(n));
  for (const EmbeddingSortLaunch& launch : plan) {
    expect_launchable(launch.shape, "sort");
    EXPECT_EQ(launch.shape.smem_bytes, 0u);  // the tile's 8 KiB are static shared memory
    if (launch.tile) {
      EXPECT_EQ(launch.shape.grid_x, 128u);  // 131072 / 1024 keys
      EXPECT_EQ(launch.shape.block_x, unsigned(kEmbSortThreads));
    } else {
      EXPECT_EQ(launch.pairs, n / 2);
      EXPECT_GE(std::int64_t(launch.shape.grid_x) * launch.shape.block_x,
                launch.pairs);  // one pass, no stride
      EXPECT_GE(launch.half, kEmbSortTile);
    }
  }
  EXPECT_EQ(sizeof(EmbSortKey) * kEmbSortTile, 8192u);
  // The sums: 4096 blocks of 32 sorted rows by 2 column blocks of 2048.
  const LaunchShape sums = embedding_backward_launch(n, h, "t");
  expect_launchable(sums, "sums");
  EXPECT_EQ(sums.grid_x, 4096u);
  EXPECT_EQ(sums.grid_y, 2u);
  EXPECT_EQ(sums.block_x, unsigned(kEmbBwdThreads));
  // Scratch: 1 MiB of keys, inside the 32 MiB GEMM workspace the cuda backend lends; the
  // workspace holds up to 4 Mi rows.
  EXPECT_EQ(embedding_backward_scratch_bytes(n), std::uint64_t(1) << 20);
  alignas(256) static unsigned char buf[16];
  EXPECT_TRUE(embedding_backward_can_group(buf, kGemmWorkspaceBytes, n));
  EXPECT_TRUE(embedding_backward_can_group(buf, kGemmWorkspaceBytes, std::int64_t(4) << 20));
  EXPECT_FALSE(embedding_backward_can_group(buf, kGemmWorkspaceBytes, (std::int64_t(4) << 20) + 1));
  EXPECT_FALSE(embedding_backward_can_group(nullptr, kGemmWorkspaceBytes, n));
  EXPECT_FALSE(embedding_backward_can_group(buf + 4, kGemmWorkspaceBytes, n));  // keys are 8 bytes
}

TEST(CudaLaunchGeometry, EmbeddingSortPlansCoverTheNetworkUpToTheGridLimit) {
  for (std::int64_t n : {std::int64_t(1), std::int64_t(1024), std::int64_t(1025),
                         std::int64_t(4500), std::int64_t(1) << 22, kMaxGridX}) {
    std::int64_t P = 1;
    while (P < n) P *= 2;
    const std::vector<EmbeddingSortLaunch> plan = embedding_sort_launches(n, "t");
    // Below a tile the tile sort runs stages past P: comparators with a key at n or beyond
    // move nothing, so a longer network is the same sort.
    EXPECT_EQ(planned_steps(plan), network_steps(std::max<std::int64_t>(P, kEmbSortTile)))
        << "n = " << n;
    for (const EmbeddingSortLaunch& launch : plan)
      expect_launchable(launch.shape, "n = " + std::to_string(n));
    expect_launchable(embedding_backward_launch(n, 4096, "t"), "sums");
  }
  EXPECT_THROW(embedding_sort_launches(0, "op"), InputError);
  EXPECT_THROW(embedding_sort_launches(kMaxGridX + 1, "op"), InputError);
}

TEST(CudaLaunchGeometry, FlashSharedMemoryOptInWhereNeeded) {
  // Head dim 128 (LLaMA): forward fits the default 48 KiB, the backward kernels need the
  // opt-in; every head dim up to 256 stays within sm_86/sm_89's 99 KiB (and sm_80's 163 KiB).
  EXPECT_FALSE(flash_forward_launch(8, 32, 512, 128, "t").needs_smem_opt_in());
  EXPECT_TRUE(flash_dkdv_launch(8, 32, 512, 128, "t").needs_smem_opt_in());
  EXPECT_TRUE(flash_dq_launch(8, 32, 512, 128, "t").needs_smem_opt_in());
  for (int d_int = 1; d_int <= kFlashMaxHeadDim; ++d_int) {
    for (std::size_t bytes :
         {flash_forward_smem(d_int), flash_dkdv_smem(d_int), flash_dq_smem(d_int)}) {
      EXPECT_LE(bytes, kOptInDynamicSmemBytesSm86) << "d " << d_int;
    }
  }
  // Hand-computed from the layouts: dk/dv at d 128 holds sK, sV (16 x 128), sQ, sdO (32 x 129)
  // and sL, sD (32) floats.
  EXPECT_EQ(flash_dkdv_smem(128), 4u * (2 * 16 * 128 + 2 * 32 * 129 + 2 * 32));
  EXPECT_EQ(flash_forward_smem(128), 4u * (16 * 128 + 32 * 129 + 32 * 128));
}

TEST(CudaLaunchGeometry, BeyondTheGridLimitsIsInputErrorNamingTheDimension) {
  // 65535 blocks of 16 rows on gridDim.y: seq 1,048,560 is the flash limit.
  EXPECT_NO_THROW(flash_forward_launch(1, 1, 65535 * 16, 64, "op"));
  try {
    flash_forward_launch(1, 1, 65535 * 16 + 1, 64, "attention_flash_forward_cuda");
    ADD_FAILURE() << "no InputError past gridDim.y";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("attention_flash_forward_cuda: s/16"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(embedding_backward_launch(4, std::int64_t(65536) * kEmbBwdColsPerBlock, "op"),
               InputError);
  EXPECT_THROW(cross_entropy_launch(std::int64_t(1) << 31, 512, "op"), InputError);
  EXPECT_THROW(causal_softmax_launch(0, "op"), InputError);
  // Grid-stride launches cap the grid and stride instead.
  EXPECT_EQ(grid_stride_launch(std::int64_t(1) << 40, 256).grid_x, 1u << 20);
  EXPECT_EQ(grid_stride_launch(1, 256).grid_x, 1u);
}

// ---------------------------------------------------------------- real sizes, last blocks
// 32-bit index arithmetic wraps only at sizes no emulated run can allocate: eager attention's
// probabilities at batch 64, seq 4096 hold b*a*s*s = 34G elements, the logits b*s*V = 8.4G,
// the MLP activations b*s*i = 2.9G. These tests launch the kernels with the launchers' full
// grids but run only a few blocks (the last ones, and those whose rows straddle 2^31 and 2^32
// elements) on tensors that are never allocated: a VirtualTensor generates element i from i
// and keeps what is stored. The checks: exactly the expected elements were written, with the
// expected values, and nothing was read or written past the end.

enum class Access { read_only, read_write };

struct VirtualTensor {
  VirtualTensor(std::uint64_t n, Access access_, std::uint64_t seed_ = 0, float lo_ = 0,
                float hi_ = 0)
      : size(n), access(access_), seed(seed_), lo(lo_), hi(hi_) {}
  float generated(std::uint64_t i) const {  // splitmix64 of (seed, i) -> [lo, hi)
    std::uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return lo + (hi - lo) * float(double(z >> 11) / 9007199254740992.0);
  }
  const std::uint64_t size;
  const Access access;  // read-only tensors are read without a lock, and refuse stores
  const std::uint64_t seed;
  const float lo, hi;
  std::mutex m;
  std::map<std::uint64_t, float> stored;
  std::atomic<std::uint64_t> out_of_range{0}, stores_to_input{0};
};

// Storage tag for the kernels' S parameter: the element type of S, held in a VirtualTensor
// (the kernel's void* argument points at it).
template <class S>
struct Virtual {
  using raw = typename S::raw;
  static constexpr DType dtype = S::dtype;
  static float load(const void* p, std::size_t i) {
    auto& t = *static_cast<VirtualTensor*>(const_cast<void*>(p));
    if (i >= t.size) {
      ++t.out_of_range;
      return NAN;
    }
    if (t.access == Access::read_only) return S::round(t.generated(i));
    std::lock_guard<std::mutex> lock(t.m);
    const auto it = t.stored.find(i);
    return it != t.stored.end() ? it->second : S::round(t.generated(i));
  }
  static void store(void* p, std::size_t i, float v) {
    auto& t = *static_cast<VirtualTensor*>(p);
    if (i >= t.size) {
      ++t.out_of_range;
      return;
    }
    if (t.access == Access::read_only) {
      ++t.stores_to_input;
      return;
    }
    std::lock_guard<std::mutex> lock(t.m);
    t.stored[i] = S::round(v);
  }
  static float round(float v) { return S::round(v); }
};
using VF16 = Virtual<F16>;

// The elements stored in t are exactly `want` (index -> value), within tol * (1 + |value|).
void expect_stored(const VirtualTensor& t, const std::map<std::uint64_t, double>& want, double tol,
                   const std::string& what) {
  EXPECT_EQ(t.out_of_range.load(), 0u) << what << ": accesses past the end";
  EXPECT_EQ(t.stores_to_input.load(), 0u) << what << ": stores into an input";
  EXPECT_EQ(t.stored.size(), want.size()) << what << ": elements written";
  std::size_t bad = 0;
  for (const auto& [i, v] : want) {
    const auto it = t.stored.find(i);
    if (it == t.stored.end()) {
      if (bad++ == 0) ADD_FAILURE() << what << ": element " << i << " not written";
    } else if (!(std::fabs(it->second - v) <= tol * (1 + std::fabs(v)))) {
      if (bad++ == 0)
        ADD_FAILURE() << what << ": element " << i << " is " << it->second << ", want " << v;
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

TEST(CudaKernelsAtRealSizes, EagerSoftmaxRowsPast2To32Elements) {
  // probs (b, a, s, s) at batch 64, seq 4096: 34G elements. Blocks whose rows start at 2^31 and
  // 2^32 elements, and the last block.
  const std::int64_t b = 64, a = 32, s = 4096, rows = b * a * s;
  const LaunchShape L = causal_softmax_launch(rows, "test");
  const std::vector<dim3> blocks = {
      block_index(unsigned((std::int64_t(1) << 31) / s / kSoftmaxWarps)),
      block_index(unsigned((std::int64_t(1) << 32) / s / kSoftmaxWarps)),
      block_index(L.grid_x - 1)};
  VirtualTensor probs(std::uint64_t(rows) * s, Access::read_write, 11, -4, 4),
      dprobs(std::uint64_t(rows) * s, Access::read_write, 12, -1, 1);
  launch_shape(L, blocks, causal_softmax_kernel<VF16>, static_cast<void*>(&probs), rows, s,
               kNoWindow);
  std::map<std::uint64_t, double> want_p, want_ds;
  for (const dim3& blk : blocks) {
    for (std::int64_t r = std::int64_t(blk.x) * kSoftmaxWarps; r < (blk.x + 1) * kSoftmaxWarps;
         ++r) {
      const std::int64_t i = r % s;
      const std::uint64_t base = std::uint64_t(r) * s;
      double mx = -INFINITY, sum = 0;
      for (std::int64_t j = 0; j <= i; ++j)
        mx = std::max<double>(mx, F16::round(probs.generated(base + j)));
      for (std::int64_t j = 0; j <= i; ++j)
        sum += std::exp(F16::round(probs.generated(base + j)) - mx);
      for (std::int64_t j = 0; j < s; ++j)
        want_p[base + j] =
            j <= i ? std::exp(F16::round(probs.generated(base + j)) - mx) / sum : 0.0;
    }
  }
  expect_stored(probs, want_p, 2e-3, "causal softmax");

  launch_shape(L, blocks, causal_softmax_backward_kernel<VF16>, static_cast<void*>(&dprobs),
               static_cast<const void*>(&probs), rows, s, kNoWindow);
  for (const dim3& blk : blocks) {
    for (std::int64_t r = std::int64_t(blk.x) * kSoftmaxWarps; r < (blk.x + 1) * kSoftmaxWarps;
         ++r) {
      const std::int64_t i = r % s;
      const std::uint64_t base = std::uint64_t(r) * s;
      double dot = 0;
      for (std::int64_t j = 0; j <= i; ++j)
        dot += double(probs.stored.at(base + j)) * F16::round(dprobs.generated(base + j));
      for (std::int64_t j = 0; j < s; ++j)
        want_ds[base + j] =
            j <= i ? probs.stored.at(base + j) * (F16::round(dprobs.generated(base + j)) - dot)
                   : 0.0;
    }
  }
  expect_stored(dprobs, want_ds, 4e-3, "causal softmax backward");
}

TEST(CudaKernelsAtRealSizes, CrossEntropyRowsPast2To31Elements) {
  // logits (b*s, V) at batch 64, seq 4096, V 32000: 8.4G elements. Row 67108 straddles 2^31
  // elements; the last row ends at 8.4G.
  const std::int64_t n = 64 * 4096, V = 32000;
  const std::int64_t straddle = (std::int64_t(1) << 31) / V;
  ASSERT_LT(straddle * V, std::int64_t(1) << 31);
  ASSERT_GT((straddle + 1) * V, std::int64_t(1) << 31);
  const std::vector<dim3> blocks = {block_index(unsigned(straddle)), block_index(unsigned(n - 1))};
  VirtualTensor logits(std::uint64_t(n) * V, Access::read_write, 21, -6, 6);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(n));
  for (std::int64_t row = 0; row < n; ++row)
    targets[std::size_t(row)] = std::int32_t((row * 7919) % V);
  std::vector<float> losses(std::size_t(n), NAN), lse(std::size_t(n), NAN);
  launch_shape(cross_entropy_launch(n, kCeFwdThreads, "test"), blocks,
               cross_entropy_forward_kernel<VF16>, losses.data(), lse.data(),
               static_cast<const void*>(&logits), static_cast<const std::int32_t*>(targets.data()),
               V);
  const float scale = 1.0f / float(n);
  std::map<std::uint64_t, double> want_d;
  for (const dim3& blk : blocks) {
    const std::int64_t row = blk.x;
    const std::uint64_t base = std::uint64_t(row) * V;
    double mx = -INFINITY, sum = 0;
    for (std::int64_t j = 0; j < V; ++j)
      mx = std::max<double>(mx, F16::round(logits.generated(base + j)));
    for (std::int64_t j = 0; j < V; ++j)
      sum += std::exp(F16::round(logits.generated(base + j)) - mx);
    const double want_lse = mx + std::log(sum);
    const std::int32_t t = targets[std::size_t(row)];
    // fp32 max, V = 32000 exps and a tree/strided sum (~log2(V) + a few roundings on each path in
    // the block reduction, ~20u = 1.2e-6) and a log: 1e-5 relative is ~8x. The loss = lse - x_t
    // subtracts an exact fp16 logit: lse's absolute error (~1e-5·|lse| ~ 1e-4 at |lse| ~ 10).
    EXPECT_NEAR(lse[std::size_t(row)], want_lse, 1e-5 * std::fabs(want_lse)) << "row " << row;
    // loss = lse - x_t with x_t exact in fp16: lse's absolute error, 1e-5·|lse| ~ 1e-4 at |lse|
    // ~ 10.
    EXPECT_NEAR(losses[std::size_t(row)], want_lse - F16::round(logits.generated(base + t)), 1e-4)
        << "row " << row;
    for (std::int64_t j = 0; j < V; ++j)
      want_d[base + j] =
          scale * (std::exp(F16::round(logits.generated(base + j)) - lse[std::size_t(row)]) -
                   (j == t ? 1.0 : 0.0));
  }
  EXPECT_TRUE(logits.stored.empty()) << "the forward wrote into the logits";
  // Backward in place, as the model runs it.
  launch_shape(cross_entropy_launch(n, kCeBwdThreads, "test"), blocks,
               cross_entropy_backward_kernel<VF16>, static_cast<void*>(&logits),
               static_cast<const void*>(&logits), static_cast<const float*>(lse.data()),
               static_cast<const std::int32_t*>(targets.data()), V, scale);
  expect_stored(logits, want_d, 2e-3, "cross-entropy dlogits (scaled by n)");
}

TEST(CudaKernelsAtRealSizes, SwiGluGridStridePast2To31Elements) {
  // (b, s, i) at batch 64, seq 4096, i 11008: 2.9G elements over the launcher's capped grid,
  // so the last block's threads stride past 2^31.
  const std::int64_t n = std::int64_t(64) * 4096 * 11008;
  const LaunchShape L = grid_stride_launch(n, kElementwiseThreads);
  VirtualTensor gate(std::uint64_t(n), Access::read_only, 31, -8, 8),
      up(std::uint64_t(n), Access::read_only, 32, -2, 2),
      dout(std::uint64_t(n), Access::read_only, 33, -1, 1);
  VirtualTensor out(std::uint64_t(n), Access::read_write),
      dgate(std::uint64_t(n), Access::read_write), dup(std::uint64_t(n), Access::read_write);
  const std::vector<dim3> last = {block_index(L.grid_x - 1)};
  launch_shape(L, last, swiglu_forward_kernel<VF16>, static_cast<void*>(&out),
               static_cast<const void*>(&gate), static_cast<const void*>(&up), n);
  launch_shape(L, last, swiglu_backward_kernel<VF16>, static_cast<void*>(&dgate),
               static_cast<void*>(&dup), static_cast<const void*>(&dout),
               static_cast<const void*>(&gate), static_cast<const void*>(&up), n);
  std::map<std::uint64_t, double> want_out, want_dg, want_du;
  const std::int64_t stride = std::int64_t(L.grid_x) * L.block_x;
  for (std::int64_t i0 = std::int64_t(L.grid_x - 1) * L.block_x;
       i0 < std::int64_t(L.grid_x) * L.block_x; ++i0) {
    for (std::int64_t i = i0; i < n; i += stride) {
      const double g = F16::round(gate.generated(i)), u = F16::round(up.generated(i));
      const double dy = F16::round(dout.generated(i));
      const double sg = 1 / (1 + std::exp(-g));
      want_out[i] = g * sg * u;
      want_dg[i] = dy * u * sg * (1 + g * (1 - sg));
      want_du[i] = dy * g * sg;
    }
  }
  ASSERT_GT(want_out.rbegin()->first, std::uint64_t(1) << 31);
  expect_stored(out, want_out, 2e-3, "swiglu out");
  expect_stored(dgate, want_dg, 2e-3, "swiglu dgate");
  expect_stored(dup, want_du, 2e-3, "swiglu dup");
}

TEST(CudaKernelsAtRealSizes, FlashAttentionLastBatchAndHeadAtBatch64Seq4096) {
  // The last (batch, head) at batch 64, seq 4096, GQA 32/8 heads, d 128. Forward and dq: the
  // block of queries 0..15 (blockIdx.y = gridDim.y - 1: the query blocks run in reverse);
  // dk/dv: the block of the last 16 keys of kv head 7, which sums query heads 28..31 over
  // queries 4080..4095. (Blocks with long key loops are covered at small s above: here the
  // emulator's per-shuffle thread barriers would make them slow.)
  const std::int64_t b = 64, s = 4096, a = 32, kv = 8, d = 128, g = a / kv;
  const std::int64_t bi = b - 1, qh = a - 1, kh = kv - 1, k0 = s - kFlashBlockKeys;
  const int d_int = int(d);
  const float scale = attention_scale<float>(d);
  const std::uint64_t nq = std::uint64_t(b * s * a * d), nkv = std::uint64_t(b * s * kv * d);
  VirtualTensor q(nq, Access::read_only, 41, -2, 2), k(nkv, Access::read_only, 42, -1, 1),
      v(nkv, Access::read_only, 43, -1, 1), dout(nq, Access::read_only, 44, -1, 1);
  VirtualTensor out(nq, Access::read_write), dq(nq, Access::read_write),
      dk(nkv, Access::read_write), dv(nkv, Access::read_write);
  auto qe = [&](std::int64_t i, std::int64_t head, std::int64_t e) {
    return std::uint64_t(((bi * s + i) * a + head) * d + e);
  };
  auto ke = [&](std::int64_t j, std::int64_t e) {
    return std::uint64_t(((bi * s + j) * kv + kh) * d + e);
  };
  auto in = [](const VirtualTensor& t, std::uint64_t e) {
    return double(F16::round(t.generated(e)));
  };

  // Reference, in double, row by row: lse, delta, out and dq of row i of `head`, and its
  // contributions to dk, dv of keys k0..s-1.
  std::vector<float> lse(std::size_t(b * a * s), 0.0f), delta(lse.size(), 0.0f);
  std::map<std::uint64_t, double> want_out, want_dq, want_dk, want_dv;
  auto reference_row = [&](std::int64_t head, std::int64_t i, bool keep_row) {
    std::vector<double> sc(std::size_t(i + 1)), o(std::size_t(d), 0.0), dqi(std::size_t(d), 0.0);
    double mx = -INFINITY, l = 0;
    for (std::int64_t j = 0; j <= i; ++j) {
      double dot = 0;
      for (std::int64_t e = 0; e < d; ++e) dot += in(q, qe(i, head, e)) * in(k, ke(j, e));
      sc[std::size_t(j)] = dot * scale;
      mx = std::max(mx, sc[std::size_t(j)]);
    }
    for (std::int64_t j = 0; j <= i; ++j) l += std::exp(sc[std::size_t(j)] - mx);
    const double row_lse = mx + std::log(l);
    for (std::int64_t j = 0; j <= i; ++j)
      for (std::int64_t e = 0; e < d; ++e)
        o[std::size_t(e)] += std::exp(sc[std::size_t(j)] - row_lse) * in(v, ke(j, e));
    double dlt = 0;
    for (std::int64_t e = 0; e < d; ++e) dlt += in(dout, qe(i, head, e)) * o[std::size_t(e)];
    const std::size_t row = std::size_t((bi * a + head) * s + i);
    lse[row] = float(row_lse);
    delta[row] = float(dlt);
    for (std::int64_t j = 0; j <= i; ++j) {
      double dp = 0;
      for (std::int64_t e = 0; e < d; ++e) dp += in(dout, qe(i, head, e)) * in(v, ke(j, e));
      const double p = std::exp(sc[std::size_t(j)] - row_lse), ds = p * (dp - dlt);
      for (std::int64_t e = 0; e < d; ++e) {
        dqi[std::size_t(e)] += scale * ds * in(k, ke(j, e));
        if (j >= k0) {
          want_dk[ke(j, e)] += scale * ds * in(q, qe(i, head, e));
          want_dv[ke(j, e)] += p * in(dout, qe(i, head, e));
        }
      }
    }
    if (keep_row) {
      for (std::int64_t e = 0; e < d; ++e) {
        want_out[qe(i, head, e)] = o[std::size_t(e)];
        want_dq[qe(i, head, e)] = dqi[std::size_t(e)];
      }
    }
  };
  for (std::int64_t i = 0; i < kFlashBlockRows; ++i) reference_row(qh, i, true);
  for (std::int64_t head = kh * g; head < (kh + 1) * g; ++head)
    for (std::int64_t i = k0; i < s; ++i) reference_row(head, i, false);

  const LaunchShape fwd = flash_forward_launch(b, a, s, d_int, "test");
  const std::vector<dim3> first_query_block = {block_index(unsigned(bi * a + qh), fwd.grid_y - 1)};
  std::vector<float> lse_got(lse.size(), NAN);
  launch_shape(fwd, first_query_block, flash_forward_kernel<VF16, 128>, static_cast<void*>(&out),
               lse_got.data(), static_cast<const void*>(&q), static_cast<const void*>(&k),
               static_cast<const void*>(&v), s, a, kv, d_int, scale, kNoWindow);
  expect_stored(out, want_out, 4e-3, "flash out");
  for (std::int64_t i = 0; i < kFlashBlockRows; ++i) {
    const std::size_t row = std::size_t((bi * a + qh) * s + i);
    // Queries 0..15 see <= 16 keys: scores are d = 128 fp32 products (worst d·u·scale·sum|q·k|
    // ~2e-5, with random signs ~2e-6), the online softmax over <= 16 keys adds a few u:
    // 1e-5·(1 + |lse|), |lse| ~ 3; the 1 keeps lse near 0 from needing a relative bound.
    EXPECT_NEAR(lse_got[row], lse[row], 1e-5 * (1 + std::fabs(lse[row]))) << "lse row " << i;
  }
  launch_shape(flash_dq_launch(b, a, s, d_int, "test"), first_query_block,
               flash_backward_dq_kernel<VF16, 128>, static_cast<void*>(&dq),
               static_cast<const void*>(&dout), static_cast<const void*>(&q),
               static_cast<const void*>(&k), static_cast<const void*>(&v),
               static_cast<const float*>(lse.data()), static_cast<const float*>(delta.data()), s, a,
               kv, d_int, scale, kNoWindow);
  expect_stored(dq, want_dq, 8e-3, "flash dq");
  const LaunchShape kv_shape = flash_dkdv_launch(b, kv, s, d_int, "test");
  launch_shape(kv_shape, {block_index(unsigned(bi * kv + kh), kv_shape.grid_y - 1)},
               flash_backward_dkdv_kernel<VF16, 128>, static_cast<void*>(&dk),
               static_cast<void*>(&dv), static_cast<const void*>(&dout),
               static_cast<const void*>(&q), static_cast<const void*>(&k),
               static_cast<const void*>(&v), static_cast<const float*>(lse.data()),
               static_cast<const float*>(delta.data()), s, a, kv, d_int, scale, kNoWindow);
  expect_stored(dk, want_dk, 8e-3, "flash dk, last key block");
  expect_stored(dv, want_dv, 8e-3, "flash dv, last key block");
}

// ---------------------------------------------------------------- the emulator's own checks
// Kernels broken on purpose: what a GPU does with them is undefined (or a launch error), so
// the emulator must refuse them instead of computing a plausible answer.

// Threads 0..31 and 32..63 reach different __syncthreads (the conditional is not uniform).
__global__ void divergent_barrier_kernel(float* out) {
  __shared__ float s[64];
  s[threadIdx.x] = float(threadIdx.x);
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = s[63 - threadIdx.x];
}
// Lanes >= active return, then the others reduce over the full warp: the shuffles read lanes
// that have exited.
__global__ void partial_warp_sum_kernel(float* out, int active) {
  if (int(threadIdx.x) >= active) return;
  const float sum = warp_sum(1.0f);
  if (threadIdx.x == 0) out[0] = sum;
}
// Lanes take different shuffles (one per branch).
__global__ void divergent_shuffle_kernel(float* out) {
  float v = float(threadIdx.x);
  if (threadIdx.x < 16) {
    v = __shfl_xor_sync(kFullMask, v, 1);
  } else {
    v = __shfl_xor_sync(kFullMask, v, 1);
  }
  out[threadIdx.x] = v;
}
__global__ void store_one_kernel(float* out) {
  out[0] = 1.0f;
}

void expect_emulator_refuses(const std::function<void()>& run, const std::string& why) {
  try {
    run();
    ADD_FAILURE() << "the emulator ran a kernel it must refuse (" << why << ")";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

TEST(CudaEmulator, RefusesDivergentBarrier) {
  std::vector<float> out(64);
  expect_emulator_refuses(
      [&] { launch(dim3(1), dim3(64), 0, divergent_barrier_kernel, out.data()); },
      "divergent __syncthreads");
}
TEST(CudaEmulator, RefusesShuffleFromExitedLane) {
  std::vector<float> out(1);
  expect_emulator_refuses(
      [&] { launch(dim3(1), dim3(32), 0, partial_warp_sum_kernel, out.data(), 20); },
      "exited lane");
  launch(dim3(1), dim3(32), 0, partial_warp_sum_kernel, out.data(), 32);  // the whole warp: fine
  EXPECT_EQ(out[0], 32.0f);
}
TEST(CudaEmulator, RefusesDivergentShuffle) {
  std::vector<float> out(32);
  expect_emulator_refuses(
      [&] { launch(dim3(1), dim3(32), 0, divergent_shuffle_kernel, out.data()); },
      "divergent shuffle");
}
TEST(CudaEmulator, RefusesLaunchesBeyondHardwareLimits) {
  std::vector<float> out(1);
  expect_emulator_refuses([&] { launch(dim3(1), dim3(1056), 0, store_one_kernel, out.data()); },
                          "1024 threads");
  expect_emulator_refuses(
      [&] { launch(dim3(1, 65536), dim3(32), 0, store_one_kernel, out.data()); }, "gridDim.y");
  expect_emulator_refuses([&] { launch(dim3(0), dim3(32), 0, store_one_kernel, out.data()); },
                          "empty grid");
  // Dynamic shared memory: 48 KiB without opt-in, at most the sm_80 opt-in limit with it.
  expect_emulator_refuses(
      [&] { launch(dim3(1), dim3(32), 48 * 1024 + 4, store_one_kernel, out.data()); }, "opt-in");
  expect_emulator_refuses(
      [&] {
        launch(emu::SmemOptIn{}, dim3(1), dim3(32), 164 * 1024, store_one_kernel, out.data());
      },
      "163 KiB");
  launch(emu::SmemOptIn{}, dim3(1), dim3(32), 100 * 1024, store_one_kernel, out.data());
  EXPECT_EQ(out[0], 1.0f);
}

}  // namespace
}  // namespace trainmem
