// Parameter initialisation (include/trainmem/base/param_init.hpp, Backend::init_param): the values
// are N(0, scale²) and constants as documented, do not depend on how the tensor is chunked or
// threaded, differ between streams, and the CUDA kernel's own code (run under the emulator)
// writes exactly what the host path writes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cuda_emulator.hpp"
#include "init/init_kernels.cuh"
#include "trainmem/backends/backend.hpp"

namespace trainmem {
namespace {

struct Filled {
  std::vector<unsigned char> stored;
  std::vector<float> master;
  std::vector<float> values() const {  // the stored values, as f32
    std::vector<float> out(stored.size() / dtype_size(dt));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = load_as_f32(stored.data(), i, dt);
    return out;
  }
  DType dt;
};

Filled fill_on(Backend& be, std::uint64_t n, const ParamInit& init, bool with_master = true) {
  Filled f{std::vector<unsigned char>(n * dtype_size(be.dtype())),
           with_master ? std::vector<float>(n) : std::vector<float>(), be.dtype()};
  be.init_param(f.stored.data(), with_master ? f.master.data() : nullptr, n, init);
  return f;
}

ParamInit normal(float scale, std::uint64_t seed, std::uint64_t stream) {
  ParamInit p;
  p.kind = ParamInit::Kind::normal;
  p.scale = scale;
  p.seed = seed;
  p.stream = stream;
  return p;
}

TEST(ParamInit, NormalValuesHaveTheRequestedMomentsAndShape) {
  auto be = make_cpu_backend(DType::f32);
  const std::uint64_t n = 1 << 21;  // two host chunks
  const float scale = 0.02f;
  const auto f = fill_on(*be, n, normal(scale, 1234, 7));
  double sum = 0, sum2 = 0, sum4 = 0;
  std::uint64_t within1 = 0, within2 = 0;
  for (float x : f.master) {
    const double z = double(x) / scale;
    sum += z;
    sum2 += z * z;
    sum4 += z * z * z * z;
    within1 += std::fabs(z) < 1.0;
    within2 += std::fabs(z) < 2.0;
  }
  const double mean = sum / double(n), var = sum2 / double(n) - mean * mean;
  // Standard errors for 2M samples: mean 7e-4, variance 1e-3, fractions 3e-4.
  EXPECT_NEAR(mean, 0.0, 4e-3);
  EXPECT_NEAR(var, 1.0, 6e-3);
  EXPECT_NEAR(sum4 / double(n), 3.0, 3e-2);  // kurtosis of a normal
  EXPECT_NEAR(double(within1) / double(n), 0.682689, 2e-3);
  EXPECT_NEAR(double(within2) / double(n), 0.954500, 1.5e-3);
}

TEST(ParamInit, StreamsAndSeedsAreIndependent) {
  auto be = make_cpu_backend(DType::f32);
  const std::uint64_t n = 1 << 18;
  const auto a = fill_on(*be, n, normal(1, 1, 1)).master;
  const auto b = fill_on(*be, n, normal(1, 1, 2)).master;
  const auto c = fill_on(*be, n, normal(1, 2, 1)).master;
  auto corr = [&](const std::vector<float>& x, const std::vector<float>& y) {
    double s = 0;
    for (std::size_t i = 0; i < x.size(); ++i) s += double(x[i]) * y[i];
    return s / double(x.size());
  };
  // 5 standard errors (independent streams: 1/sqrt(n) ~ 2e-3).
  EXPECT_NEAR(corr(a, b), 0.0, 1e-2);  // standard error 2e-3
  EXPECT_NEAR(corr(a, c), 0.0, 1e-2);
  EXPECT_NE(a, b);
  // Neighbouring elements of one stream are uncorrelated too.
  EXPECT_NEAR(
      corr(std::vector<float>(a.begin(), a.end() - 1), std::vector<float>(a.begin() + 1, a.end())),
      0.0, 1e-2);
}

TEST(ParamInit, ValuesDependOnTheIndexOnlyNotOnTheTensorLengthOrChunking) {
  auto be = make_cpu_backend(DType::bf16);
  const ParamInit init = normal(0.02f, 99, 3);
  const std::uint64_t big = (1 << 20) + 12345, small = 1000;  // big crosses a host chunk
  const auto f_big = fill_on(*be, big, init);
  const auto f_small = fill_on(*be, small, init);
  ASSERT_EQ(std::memcmp(f_big.master.data(), f_small.master.data(), small * 4), 0);
  ASSERT_EQ(std::memcmp(f_big.stored.data(), f_small.stored.data(), small * 2), 0);
  // Each element, computed alone, is what the chunked and threaded fill wrote.
  for (std::uint64_t i :
       {std::uint64_t(0), std::uint64_t(1 << 20) - 1, std::uint64_t(1 << 20), big - 1})
    EXPECT_EQ(f_big.master[i], param_init_value(init, i)) << "element " << i;
}

TEST(ParamInit, StoredValuesAreTheMasterRoundedOnceAndConstantsAreExact) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    auto be = make_cpu_backend(dt);
    const auto f = fill_on(*be, 5000, normal(0.02f, 5, 11));
    const auto stored = f.values();
    for (std::size_t i = 0; i < stored.size(); ++i) {
      std::vector<unsigned char> one(dtype_size(dt));
      store_from_f32(one.data(), 0, dt, f.master[i]);
      ASSERT_EQ(stored[i], load_as_f32(one.data(), 0, dt)) << dtype_name(dt) << " element " << i;
    }
    ParamInit ones;
    ones.kind = ParamInit::Kind::constant;
    ones.value = 1.0f;
    const auto g = fill_on(*be, 777, ones);
    EXPECT_TRUE(std::all_of(g.master.begin(), g.master.end(), [](float x) { return x == 1.0f; }));
    const auto gv = g.values();
    EXPECT_TRUE(std::all_of(gv.begin(), gv.end(), [](float x) { return x == 1.0f; }));
    // Without a master only the parameter is written.
    const auto h = fill_on(*be, 10, normal(1, 1, 1), /*with_master=*/false);
    EXPECT_TRUE(h.master.empty());
    const auto hv = h.values();
    ASSERT_EQ(hv.size(), 10u);
    for (std::size_t i = 0; i < hv.size(); ++i) {
      std::vector<unsigned char> one(dtype_size(dt));
      store_from_f32(one.data(), 0, dt, param_init_value(normal(1, 1, 1), i));
      EXPECT_EQ(hv[i], load_as_f32(one.data(), 0, dt)) << dtype_name(dt) << " element " << i;
    }
  }
}

template <class S>
void check_kernel_matches_host(DType dt) {
  auto be = make_cpu_backend(dt);
  const ParamInit init = normal(0.02f, 42, 5);
  const std::int64_t n = 3000;  // grid below: 2 blocks x 128 threads, so the stride loop runs
  const auto want = fill_on(*be, std::uint64_t(n), init);
  std::vector<unsigned char> stored(std::size_t(n) * dtype_size(dt), 0xab);
  std::vector<float> master(std::size_t(n), -7.0f);
  emu::launch(dim3(2), dim3(128), 0, cuda::init_param_kernel<S>, static_cast<void*>(stored.data()),
              master.data(), n, init);
  EXPECT_EQ(std::memcmp(stored.data(), want.stored.data(), stored.size()), 0) << dtype_name(dt);
  EXPECT_EQ(std::memcmp(master.data(), want.master.data(), master.size() * 4), 0) << dtype_name(dt);
  // No master: the kernel must not touch it (nullptr), and still write the parameter.
  std::vector<unsigned char> stored2(stored.size(), 0);
  emu::launch(dim3(1), dim3(64), 0, cuda::init_param_kernel<S>, static_cast<void*>(stored2.data()),
              static_cast<float*>(nullptr), n, init);
  EXPECT_EQ(stored2, stored) << dtype_name(dt);
}

TEST(ParamInit, CudaKernelCodeWritesWhatTheHostPathWrites) {
  check_kernel_matches_host<F32>(DType::f32);
  check_kernel_matches_host<BF16>(DType::bf16);
  check_kernel_matches_host<F16>(DType::f16);
}

}  // namespace
}  // namespace trainmem
