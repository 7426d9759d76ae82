// GPU tests: bitsandbytes' 4-bit storage and 8-bit AdamW kernels (kernels/quant4,
// kernels/adamw8bit) against their CPU references, bit for bit: both compute the functions of
// quant4_math.hpp and adamw8bit_math.hpp, whose CPU side tests/test_ops_quant.cpp checks against
// the real bitsandbytes. Skips without a device.
#include <cuda_runtime.h>

#include <cstring>
#include <random>
#include <vector>

#include "adamw8bit/adamw8bit.hpp"
#include "gpu_test_util.hpp"
#include "quant4/dynamic_map.hpp"
#include "quant4/quant4.hpp"

namespace trainmem::gputest {
namespace {

// A device copy of a host vector, and back.
template <class T>
DevBuf to_device(Backend& be, const std::vector<T>& v) {
  DevBuf d(be, v.size() * sizeof(T));
  be.upload(d.get(), v.data(), v.size() * sizeof(T));
  be.synchronize();
  return d;
}
template <class T>
std::vector<T> to_host(Backend& be, const DevBuf& d, std::size_t n) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<T> v(n);
  be.download(v.data(), d.get(), n * sizeof(T));
  be.synchronize();
  return v;
}

TEST(Quant4Gpu, QuantizeAndDequantizeMatchCpu) {
  require_cuda_device();
  Backend& be = cuda_backend(DType::f32);
  std::mt19937 rng{28};
  std::normal_distribution<float> d(0.0f, 1.0f);
  // A LLaMA-like row count and an odd total (the pad nibble), a partial last block.
  const std::int64_t n = 4096 * 33 + 7, bs = 64, nb = quant_blocks(n, bs);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (Quant4Type t : {Quant4Type::nf4, Quant4Type::fp4}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (t == Quant4Type::nf4 ? " nf4" : " fp4"));
      std::vector<std::uint8_t> x(std::size_t(n) * dtype_size(dt));
      for (std::int64_t i = 0; i < n; ++i) store_from_f32(x.data(), std::size_t(i), dt, d(rng));
      std::vector<std::uint8_t> packed(static_cast<std::size_t>(quant4_packed_bytes(n)));
      std::vector<float> absmax(static_cast<std::size_t>(nb));
      quantize_4bit_cpu(packed.data(), absmax.data(), x.data(), n, bs, t, dt);
      DevBuf dx = to_device(be, x), dp(be, packed.size()), da(be, absmax.size() * 4);
      quantize_4bit_cuda(dp.as<std::uint8_t>(), da.as<float>(), dx.get(), n, bs, t, dt, nullptr);
      EXPECT_EQ(to_host<std::uint8_t>(be, dp, packed.size()), packed);
      const std::vector<float> ga = to_host<float>(be, da, absmax.size());
      EXPECT_EQ(std::memcmp(ga.data(), absmax.data(), absmax.size() * 4), 0);
      std::vector<std::uint8_t> out(x.size());
      dequantize_4bit_cpu(out.data(), packed.data(), absmax.data(), n, bs, t, true, dt);
      DevBuf dout(be, out.size());
      dequantize_4bit_cuda(dout.get(), dp.as<std::uint8_t>(), da.as<float>(), n, bs, t, true, dt,
                           nullptr);
      EXPECT_EQ(to_host<std::uint8_t>(be, dout, out.size()), out);
    }
  }
}

// The int8 base (--quant int8): CB, SCB and the dequantized weight, a zero row included.
TEST(Quant4Gpu, Int8MatchesCpu) {
  require_cuda_device();
  Backend& be = cuda_backend(DType::f32);
  std::mt19937 rng{29};
  std::normal_distribution<float> d(0.0f, 1.0f);
  const std::int64_t rows = 1024 + 3, cols = 4096 + 5, n = rows * cols;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<std::uint8_t> w(std::size_t(n) * dtype_size(dt));
    for (std::int64_t i = 0; i < n; ++i)
      store_from_f32(w.data(), std::size_t(i), dt, i / cols == 7 ? 0.0f : d(rng));
    std::vector<std::int8_t> cb(static_cast<std::size_t>(n));
    std::vector<float> scb(static_cast<std::size_t>(rows));
    quantize_int8_cpu(cb.data(), scb.data(), w.data(), rows, cols, dt);
    DevBuf dw = to_device(be, w), dcb(be, cb.size()), dscb(be, scb.size() * 4);
    quantize_int8_cuda(dcb.as<std::int8_t>(), dscb.as<float>(), dw.get(), rows, cols, dt, nullptr);
    EXPECT_EQ(to_host<std::int8_t>(be, dcb, cb.size()), cb);
    const std::vector<float> gs = to_host<float>(be, dscb, scb.size());
    EXPECT_EQ(std::memcmp(gs.data(), scb.data(), scb.size() * 4), 0);
    std::vector<std::uint8_t> out(w.size());
    dequantize_int8_cpu(out.data(), cb.data(), scb.data(), rows, cols, dt);
    DevBuf dout(be, out.size());
    dequantize_int8_cuda(dout.get(), dcb.as<std::int8_t>(), dscb.as<float>(), rows, cols, dt,
                         nullptr);
    EXPECT_EQ(to_host<std::uint8_t>(be, dout, out.size()), out);
  }
}

TEST(Quant4Gpu, AdamW8bitMatchesCpu) {
  require_cuda_device();
  Backend& be = cuda_backend(DType::f32);
  std::mt19937 rng{29};
  std::normal_distribution<float> d(0.0f, 0.1f);
  const std::int64_t n = 256 * 300 + 77, nb = quant_blocks(n, kBlockwise8Size);
  std::vector<std::uint8_t> lut1(kQuantLutSize), lut2(kQuantLutSize);
  blockwise8_build_lut(kDynamicMapSigned, lut1.data());
  blockwise8_build_lut(kDynamicMapUnsigned, lut2.data());
  const std::vector<float> q1(kDynamicMapSigned, kDynamicMapSigned + 256),
      q2(kDynamicMapUnsigned, kDynamicMapUnsigned + 256);
  DevBuf dq1 = to_device(be, q1), dq2 = to_device(be, q2), dl1 = to_device(be, lut1),
         dl2 = to_device(be, lut2);
  std::vector<float> p(static_cast<std::size_t>(n));
  for (auto& e : p) e = d(rng);
  std::vector<std::uint8_t> s1(static_cast<std::size_t>(n), 0), s2(s1);
  std::vector<float> a1(static_cast<std::size_t>(nb), 0.0f), a2(a1);
  DevBuf dp = to_device(be, p), ds1 = to_device(be, s1), ds2 = to_device(be, s2),
         da1 = to_device(be, a1), da2 = to_device(be, a2);
  const BnbAdamWParams hp;
  for (int step = 1; step <= 3; ++step) {
    std::vector<float> g(static_cast<std::size_t>(n));
    for (auto& e : g) e = step == 1 ? 0.0f : d(rng);  // step 1: a fresh LoRA A's zero gradient
    DevBuf dg = to_device(be, g);
    bnb_adamw8bit_update_cpu(p.data(), g.data(), s1.data(), s2.data(), a1.data(), a2.data(),
                             kDynamicMapSigned, kDynamicMapUnsigned, lut1.data(), lut2.data(), n,
                             hp, step, DType::f32);
    bnb_adamw8bit_update_cuda(dp.get(), dg.get(), ds1.as<std::uint8_t>(), ds2.as<std::uint8_t>(),
                              da1.as<float>(), da2.as<float>(), dq1.as<float>(), dq2.as<float>(),
                              dl1.as<std::uint8_t>(), dl2.as<std::uint8_t>(), n, hp, step,
                              DType::f32, nullptr);
    EXPECT_EQ(to_host<std::uint8_t>(be, ds1, s1.size()), s1) << "step " << step;
    EXPECT_EQ(to_host<std::uint8_t>(be, ds2, s2.size()), s2) << "step " << step;
    const std::vector<float> gp = to_host<float>(be, dp, p.size());
    EXPECT_EQ(std::memcmp(gp.data(), p.data(), p.size() * 4), 0) << "step " << step;
  }
}

}  // namespace
}  // namespace trainmem::gputest
