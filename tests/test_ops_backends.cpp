// The cpu and meta backends through the Backend interface: kinds, allocators, transfers, a few
// ops against naive references in the backend's dtype (cpu), and that the meta backend never
// touches memory (its ops run on MetaAllocator addresses that must not be dereferenced).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "ops_testing.hpp"
#include "trainmem/backend.hpp"

namespace trainmem {
namespace {
using namespace trainmem::testing;

TEST(OpsBackends, CpuBackendBasics) {
  auto be = make_cpu_backend(DType::bf16);
  EXPECT_EQ(be->kind(), BackendKind::cpu);
  EXPECT_EQ(be->dtype(), DType::bf16);
  EXPECT_TRUE(be->computes());
  EXPECT_STREQ(be->allocator().name(), "host");
  EXPECT_TRUE(be->allocator().touches_memory());
  void* p = be->allocator().allocate(64);
  ASSERT_NE(p, nullptr);
  const std::vector<unsigned char> src = {1, 2, 3, 4, 5, 6, 7, 8};
  be->upload(p, src.data(), 8);
  std::vector<unsigned char> back(8);
  be->download(back.data(), p, 8);
  EXPECT_EQ(back, src);
  be->copy(static_cast<char*>(p) + 8, p, 8);
  be->fill_zero(p, 4);
  be->download(back.data(), static_cast<char*>(p) + 8, 8);
  EXPECT_EQ(back, src);
  be->download(back.data(), p, 8);
  EXPECT_EQ(back, (std::vector<unsigned char>{0, 0, 0, 0, 5, 6, 7, 8}));
  be->allocator().deallocate(p, 64);
}

TEST(OpsBackends, CpuBackendRejectsInt32) {
  try {
    make_cpu_backend(DType::i32);
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "dtype: the cpu backend trains in fp32, fp16 or bf16, not int32");
  }
}

// A linear layer (x W^T) and SwiGLU through the interface, in each dtype, against fp64.
TEST(OpsBackends, CpuBackendOpsUseItsDtype) {
  for (DType dt : all_dtypes()) {
    SCOPED_TRACE(dtype_label(dt));
    auto be = make_cpu_backend(dt);
    const std::int64_t N = 5, K = 12, M = 7;
    Buf x = Buf::from(uniform(N * K, 171), dt), w = Buf::from(uniform(M * K, 172), dt);
    Buf y(N * M, dt), act(N * M, dt);
    be->matmul(y.data(), x.data(), w.data(), N, M, K, Trans::no, Trans::yes, 1.0f, 0.0f);
    std::vector<double> ref(N * M), ref_act(N * M);
    for (std::int64_t i = 0; i < N; ++i)
      for (std::int64_t j = 0; j < M; ++j) {
        double s = 0;
        for (std::int64_t p = 0; p < K; ++p) s += double(x.get(i * K + p)) * w.get(j * K + p);
        ref[i * M + j] = s;
      }
    EXPECT_TRUE(all_close("y", y.f32(), ref, tolerance(dt, 4)));
    be->swiglu_forward(act.data(), y.data(), y.data(), N * M);
    for (std::int64_t i = 0; i < N * M; ++i) {
      const double g = y.get(i);
      ref_act[i] = g * g / (1 + std::exp(-g));
    }
    EXPECT_TRUE(all_close("act", act.f32(), ref_act, tolerance(dt)));
  }
}

TEST(OpsBackends, MetaBackendNeverTouchesMemory) {
  for (DType dt : all_dtypes()) {
    auto be = make_meta_backend(dt);
    EXPECT_EQ(be->kind(), BackendKind::meta);
    EXPECT_EQ(be->dtype(), dt);
    EXPECT_FALSE(be->computes());
    EXPECT_FALSE(be->allocator().touches_memory());
    // Fake addresses: any dereference would crash the test.
    void* big = be->allocator().allocate(std::uint64_t(1) << 40);  // 1 TiB, not backed
    void* small = be->allocator().allocate(1024);
    ASSERT_NE(big, nullptr);
    ASSERT_NE(big, small);
    auto* f = static_cast<float*>(small);
    auto* t = static_cast<const std::int32_t*>(small);
    const std::int64_t b = 8, s = 4096, h = 8192, V = 128256, a = 64, kv = 8, d = 128;
    be->upload(big, small, 1 << 20);
    be->download(small, big, 1 << 20);
    be->fill_zero(big, std::uint64_t(1) << 40);
    be->copy(big, small, 1 << 20);
    be->embedding_forward(big, t, small, b, s, h, V);
    be->embedding_backward(big, small, t, b, s, h, V);
    be->rmsnorm_forward(big, f, small, small, b * s, h, 1e-5f);
    be->rmsnorm_backward(big, big, small, small, small, f, b * s, h);
    be->matmul(big, small, small, b * s, V, h, Trans::no, Trans::yes, 1.0f, 0.0f);
    be->rope_forward(big, small, b, s, a, kv, d, RopeSpec{5e5, {}});
    be->rope_backward(big, small, b, s, a, kv, d, RopeSpec{5e5, {}});
    for (Attention var : {Attention::eager, Attention::flash}) {
      be->attention_forward(big, big, f, small, small, small, b, s, a, kv, d, 0, var);
      be->attention_backward(big, big, big, big, f, small, small, small, small, small, small, f, b,
                             s, a, kv, d, 0, var);
    }
    be->swiglu_forward(big, small, small, b * s * h);
    be->swiglu_backward(big, big, small, small, small, b * s * h);
    be->cross_entropy_forward(f, f, small, t, b * s, V);
    be->cross_entropy_backward(big, big, f, t, b * s, V, 1.0f);
    be->adamw_update(big, small, f, f, f, std::int64_t(1) << 36, AdamWParams{}, 1, 1.0f);
    be->sgd_update(big, small, f, std::int64_t(1) << 36, 1e-3f, 1.0f);
    be->check_finite(big, std::int64_t(1) << 36);
    EXPECT_FALSE(be->take_nonfinite());
    be->synchronize();
    be->allocator().deallocate(small, 1024);
    be->allocator().deallocate(big, std::uint64_t(1) << 40);
  }
}

}  // namespace
}  // namespace trainmem
