// GPU test: parameters initialised on the device (CudaBackend::init_param, kernels/init/init.cu)
// equal the cpu backend's host-generated ones. The device's double log/cos/sqrt may differ
// from the host C library's by an ulp of double, which changes a float result only when it
// lies that close to a rounding boundary: the test allows one float ulp on a handful of
// elements and nothing else.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "gpu_test_util.hpp"

namespace trainmem::gputest {
namespace {

TEST(InitParamGpu, DeviceValuesEqualTheHostPath) {
  require_cuda_device();
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    auto cpu = make_cpu_backend(dt);
    Backend& gpu = cuda_backend(dt);
    const std::int64_t n = (1 << 22) + 77;  // past the host path's 1 Mi-element chunks
    ParamInit init;
    init.kind = ParamInit::Kind::normal;
    init.scale = 0.02f;
    init.seed = 1234;
    init.stream = 9;
    HostBuf want(dt, n);
    std::vector<float> want_master(static_cast<std::size_t>(n));
    cpu->init_param(want.data(), want_master.data(), std::uint64_t(n), init);

    DevBuf d_param(gpu, want.bytes()), d_master(gpu, std::uint64_t(n) * 4);
    gpu.init_param(d_param.get(), static_cast<float*>(d_master.get()), std::uint64_t(n), init);
    const std::vector<float> got_master = d_master.f32(DType::f32, n);
    const std::vector<float> got = d_param.f32(dt, n);
    const std::vector<float> want_vals = want.to_f32();
    std::int64_t off_by_ulp = 0, wrong = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const float g = got_master[std::size_t(i)], w = want_master[std::size_t(i)];
      if (g == w) {
        if (got[std::size_t(i)] != want_vals[std::size_t(i)])
          ++wrong;  // same master, other rounding
        continue;
      }
      if (std::nextafter(w, g) == g)
        ++off_by_ulp;
      else
        ++wrong;
    }
    EXPECT_EQ(wrong, 0) << dtype_name(dt);
    EXPECT_LE(off_by_ulp, 16) << dtype_name(dt) << ": master values one float ulp apart";

    ParamInit ones;
    ones.kind = ParamInit::Kind::constant;
    ones.value = 1.0f;
    gpu.init_param(d_param.get(), nullptr, std::uint64_t(n), ones);
    const std::vector<float> one_vals = d_param.f32(dt, n);
    EXPECT_EQ(std::count(one_vals.begin(), one_vals.end(), 1.0f), n) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace trainmem::gputest
