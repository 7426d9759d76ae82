// The 16-bit conversions of dtype.hpp (shared by the cpu backend and the CUDA kernels):
// known bit patterns (round to nearest even at the halfway points, overflow, NaN/Inf, signed
// zero, fp16 subnormals), exhaustive round trips, and random floats against an independent
// reference written with frexp/nearbyint.
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <random>

#include "common/storage.hpp"
#include "trainmem/base/dtype.hpp"

namespace trainmem {
namespace {

float f(std::uint32_t bits) {
  return bits_f32(bits);
}

TEST(OpsDtype, Bf16KnownPatterns) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_bf16(f(0x3f808000)), 0x3f80);  // halfway, even below -> down
  EXPECT_EQ(f32_to_bf16(f(0x3f818000)), 0x3f82);  // halfway, odd below -> up
  EXPECT_EQ(f32_to_bf16(f(0x3f808001)), 0x3f81);  // just above halfway
  EXPECT_EQ(f32_to_bf16(f(0x3f807fff)), 0x3f80);  // just below halfway
  EXPECT_EQ(f32_to_bf16(f(0x7f7fffff)), 0x7f80);  // FLT_MAX rounds to +inf
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(f(0x7fc00000)), 0x7fc0);  // quiet NaN
  EXPECT_EQ(f32_to_bf16(f(0x7f800001)), 0x7fc0);  // signalling NaN: stays NaN, made quiet
  EXPECT_EQ(f32_to_bf16(f(0xff800001)), 0xffc0);  // sign kept
  EXPECT_EQ(f32_to_bf16(f(0x00010000)), 0x0001);  // fp32 subnormal -> bf16 subnormal
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(0x7fc1)));
  EXPECT_EQ(bf16_to_f32(0xff80), -INFINITY);
}

TEST(OpsDtype, Fp16KnownPatterns) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(0.1f), 0x2e66);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);   // largest finite
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);   // halfway, rounds to even = inf
  EXPECT_EQ(f32_to_f16(1e9f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e9f), 0xfc00);
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);      // halfway, even -> down
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  // halfway, odd -> up
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7c00);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xfc00);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(NAN) & 0x7fff, 0x7e00);
  EXPECT_EQ(f32_to_f16(f(0xff800001)), 0xfe00);
  // subnormals: unit 2^-24
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);            // halfway to 0: even -> 0
  EXPECT_EQ(f32_to_f16(0x1p-25f * 1.0001f), 0x0001);  // just above halfway
  EXPECT_EQ(f32_to_f16(1.5f * 0x1p-24f), 0x0002);     // halfway, odd -> up
  EXPECT_EQ(f32_to_f16(2.5f * 0x1p-24f), 0x0002);     // halfway, even -> down
  EXPECT_EQ(f32_to_f16(-3.0f * 0x1p-24f), 0x8003);
  EXPECT_EQ(f32_to_f16(1023.0f * 0x1p-24f), 0x03ff);  // largest subnormal
  EXPECT_EQ(f32_to_f16(1023.5f * 0x1p-24f), 0x0400);  // rounds up into the smallest normal
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);
  EXPECT_EQ(f32_to_f16(0x1p-26f), 0x0000);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x83ff), -1023.0f * 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x0400), 0x1p-14f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x7c00), INFINITY);
  EXPECT_EQ(f16_to_f32(0xfc00), -INFINITY);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
}

TEST(OpsDtype, ExhaustiveRoundTrip) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto h16 = std::uint16_t(h);
    const float x16 = f16_to_f32(h16), xb = bf16_to_f32(h16);
    if (std::isnan(x16)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(x16)))) << std::hex << h;
    } else {
      ASSERT_EQ(f32_to_f16(x16), h16) << "fp16 pattern 0x" << std::hex << h;
    }
    if (std::isnan(xb)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(xb)))) << std::hex << h;
    } else {
      ASSERT_EQ(f32_to_bf16(xb), h16) << "bf16 pattern 0x" << std::hex << h;
    }
  }
}

// Independent references: round |x| to the format's grid with nearbyint (ties to even in the
// default rounding mode), from the exponent given by frexp.
std::uint16_t ref_to_f16(float x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(double(x));
  if (a < 0x1p-14) return std::uint16_t(sign | std::uint16_t(std::nearbyint(a * 0x1p24)));
  int e;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1;                     // a = (2m) * 2^exp, 2m in [1, 2)
  double q = std::nearbyint((2 * m - 1) * 1024);
  if (q == 1024) {
    q = 0;
    ++exp;
  }
  if (exp > 15) return std::uint16_t(sign | 0x7c00);
  return std::uint16_t(sign | ((exp + 15) << 10) | int(q));
}
std::uint16_t ref_to_bf16(float x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(double(x));
  if (a < 0x1p-126) return std::uint16_t(sign | std::uint16_t(std::nearbyint(a * 0x1p133)));
  int e;
  const double m = std::frexp(a, &e);
  int exp = e - 1;
  double q = std::nearbyint((2 * m - 1) * 128);
  if (q == 128) {
    q = 0;
    ++exp;
  }
  if (exp > 127) return std::uint16_t(sign | 0x7f80);
  return std::uint16_t(sign | ((exp + 127) << 7) | int(q));
}

TEST(OpsDtype, RandomFloatsAgainstIndependentRounding) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  std::mt19937 gen(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  int checked = 0;
  for (int i = 0; i < 400000; ++i) {
    std::uint32_t u = bits(gen);
    // Spread over all exponents, and concentrate a quarter near fp16's range.
    if (i % 4 == 0) u = (u & 0x807fffffu) | (std::uint32_t(100 + (u >> 23) % 48) << 23);
    const float x = f(u);
    if (std::isnan(x) || std::isinf(x)) continue;
    ASSERT_EQ(f32_to_bf16(x), ref_to_bf16(x)) << "x bits 0x" << std::hex << u;
    ASSERT_EQ(f32_to_f16(x), ref_to_f16(x)) << "x bits 0x" << std::hex << u;
    ++checked;
  }
  EXPECT_GT(checked, 390000);
}

TEST(OpsDtype, StorageTagsMatchDtypeHelpers) {
  const float vals[] = {1.0f, -0.1f, 3.3e-6f, 70000.0f, 0x1p-20f};
  for (float v : vals) {
    std::uint16_t h = 0;
    float x = 0;
    BF16::store(&h, 0, v);
    EXPECT_EQ(h, f32_to_bf16(v));
    EXPECT_EQ(BF16::load(&h, 0), bf16_to_f32(h));
    EXPECT_EQ(BF16::round(v), round_to(DType::bf16, v));
    F16::store(&h, 0, v);
    EXPECT_EQ(h, f32_to_f16(v));
    EXPECT_EQ(F16::load(&h, 0), f16_to_f32(h));
    EXPECT_EQ(F16::round(v), round_to(DType::f16, v));
    F32::store(&x, 0, v);
    EXPECT_EQ(F32::load(&x, 0), v);
  }
}

TEST(OpsDtype, DispatchRejectsInt32) {
  auto run = [](DType dt) {
    return dispatch_storage(dt, "some_op", [](auto tag) { return int(decltype(tag)::dtype); });
  };
  EXPECT_EQ(run(DType::f32), int(DType::f32));
  EXPECT_EQ(run(DType::bf16), int(DType::bf16));
  EXPECT_EQ(run(DType::f16), int(DType::f16));
  try {
    run(DType::i32);
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("some_op: dtype must be fp32, fp16 or bf16, got int32"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace trainmem
