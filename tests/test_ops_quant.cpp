// bitsandbytes' 4-bit and 8-bit storage and 8-bit AdamW, against what the real library computed
// on the CPU
// (tests/data/bnb, made by tools/bnb_goldens.py with bitsandbytes 0.50.2 and torch 2.15; the
// release is in each file's metadata). Bit for bit: the code tables, the packed nibbles, the
// absmax (plain and double-quantized), the dequantized weights in fp32, bf16 and fp16, the 8-bit
// moments and their absmax. Stated differences: the double-quantization offset (torch's fp32
// mean sums in its own order; ours is the exact sum rounded once: within one ulp) and the AdamW
// parameter (torch's CPU sqrt is MKL's, not correctly rounded: within an ulp of the operands of
// the last addition).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "adamw8bit/adamw8bit.hpp"
#include "quant4/dynamic_map.hpp"
#include "quant4/quant4.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/safetensors.hpp"

namespace trainmem {
namespace {

using json = nlohmann::json;

std::string data_file(const char* name) {
  return std::string(TRAINMEM_TEST_DATA_DIR) + "/bnb/" + name;
}

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<std::uint8_t> read_u8(const SafeTensorsReader& r, const std::string& name) {
  const std::vector<std::int64_t> v = r.read_int(name);
  return std::vector<std::uint8_t>(v.begin(), v.end());
}

// The number of elements whose fp32 bits differ (every element is compared; NaN-safe).
std::int64_t bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) bad += bits(a[i]) != bits(b[i]);
  return bad;
}

// |a - b| in units in the last place of b (finite values of one sign or zero).
std::int64_t ulps(float a, float b) {
  return std::llabs(std::int64_t(std::int32_t(bits(a))) - std::int64_t(std::int32_t(bits(b))));
}

// The goldens' cases: metadata `count_key` holds their number, `<prefix><i>` each one as JSON.
json cases_of(const SafeTensorsReader& r, const char* count_key, const char* prefix) {
  json out = json::array();
  const int count = std::stoi(r.metadata().at(count_key));
  for (int i = 0; i < count; ++i)
    out.push_back(json::parse(r.metadata().at(prefix + std::to_string(i))));
  return out;
}

DType dtype_of(const std::string& s) {
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  return DType::f32;
}

// An fp32 vector stored into dtype dt's bytes (the golden input's own dtype: exact).
std::vector<std::uint8_t> as_bytes(const std::vector<float>& v, DType dt) {
  std::vector<std::uint8_t> out(v.size() * dtype_size(dt));
  for (std::size_t i = 0; i < v.size(); ++i) store_from_f32(out.data(), i, dt, v[i]);
  return out;
}
std::vector<float> from_bytes(const std::vector<std::uint8_t>& b, std::size_t n, DType dt) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = load_as_f32(b.data(), i, dt);
  return out;
}

TEST(OpsQuant, DynamicMapsAreBitsandbytes) {
  const SafeTensorsReader a(data_file("adamw8bit.safetensors"));
  const std::vector<float> q1 = a.read_f32("p1.s1.qmap1"), q2 = a.read_f32("p1.s1.qmap2");
  ASSERT_EQ(q1.size(), 256u);
  ASSERT_EQ(q2.size(), 256u);
  EXPECT_EQ(bit_mismatches(std::vector<float>(kDynamicMapSigned, kDynamicMapSigned + 256), q1), 0);
  EXPECT_EQ(bit_mismatches(std::vector<float>(kDynamicMapUnsigned, kDynamicMapUnsigned + 256), q2),
            0);
  // The nested absmax of a double-quantized weight uses the signed map too (left as it was: the
  // CPU quantizer no longer overwrites code[0] with -1, as its older BinSearch version did).
  const SafeTensorsReader q(data_file("quant4.safetensors"));
  EXPECT_EQ(bit_mismatches(q.read_f32("c3.nested_code"), q1), 0);
  EXPECT_TRUE(std::is_sorted(q1.begin(), q1.end()));
  EXPECT_TRUE(std::is_sorted(q2.begin(), q2.end()));
}

TEST(OpsQuant, FourBitCodesAndOrder) {
  const SafeTensorsReader r(data_file("quant4.safetensors"));
  const json cases = cases_of(r, "cases", "c");
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const Quant4Type t = cases[c]["qt"] == "nf4" ? Quant4Type::nf4 : Quant4Type::fp4;
    const std::vector<float> code = r.read_f32("c" + std::to_string(c) + ".code");
    ASSERT_EQ(code.size(), 16u);
    for (int j = 0; j < 16; ++j)
      EXPECT_EQ(bits(quant4_code(t, j)), bits(code[std::size_t(j)])) << "case " << c << " " << j;
  }
  // quant4_index's FP4 order is a stable sort of the code (the two zeros, nibbles 0 and 8, keep
  // their order), and each value is its own index.
  std::vector<int> order(16);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [](int x, int y) {
    return quant4_code(Quant4Type::fp4, x) < quant4_code(Quant4Type::fp4, y);
  });
  EXPECT_EQ(order, (std::vector<int>{11, 10, 13, 12, 15, 14, 9, 0, 8, 1, 6, 7, 4, 5, 2, 3}));
  for (Quant4Type t : {Quant4Type::nf4, Quant4Type::fp4})
    for (int j = 0; j < 16; ++j) {
      const int got = quant4_index(t, quant4_code(t, j));
      // FP4's +0 at nibble 8 equals nibble 0's: the first of the two wins.
      EXPECT_EQ(got, t == Quant4Type::fp4 && j == 8 ? 0 : j) << int(t) << " " << j;
    }
}

// Every golden case: quantize the recorded input and compare every stored byte; dequantize the
// recorded bytes into each dtype and compare the bits.
TEST(OpsQuant, FourBitMatchesBitsandbytes) {
  const SafeTensorsReader r(data_file("quant4.safetensors"));
  const json cases = cases_of(r, "cases", "c");
  ASSERT_GE(cases.size(), 16u);
  std::vector<std::uint8_t> lut(kQuantLutSize);
  blockwise8_build_lut(kDynamicMapSigned, lut.data());
  int offsets_exact = 0, offsets_total = 0;
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const json& cs = cases[c];
    const std::string p = "c" + std::to_string(c) + ".";
    SCOPED_TRACE(p + cs.dump());
    const Quant4Type t = cs["qt"] == "nf4" ? Quant4Type::nf4 : Quant4Type::fp4;
    const std::int64_t bs = cs["bs"].get<std::int64_t>();
    const DType dt = dtype_of(cs["dtype"].get<std::string>());
    const std::vector<std::int64_t> shape = cs["shape"].get<std::vector<std::int64_t>>();
    const std::int64_t n = shape[0] * shape[1], nb = quant_blocks(n, bs);
    const bool dq = cs["dq"].get<bool>();

    // Quantize.
    const std::vector<std::uint8_t> x = as_bytes(r.read_f32(p + "input"), dt);
    std::vector<std::uint8_t> packed(static_cast<std::size_t>(quant4_packed_bytes(n)));
    std::vector<float> absmax(static_cast<std::size_t>(nb));
    quantize_4bit_cpu(packed.data(), absmax.data(), x.data(), n, bs, t, dt);
    EXPECT_EQ(packed, read_u8(r, p + "packed"));
    if (!dq) {
      EXPECT_EQ(bit_mismatches(absmax, r.read_f32(p + "absmax")), 0);
    } else {
      // Double quantization: the offset, then the centred absmax in 8-bit blocks of 256.
      const float golden_offset = r.read_f32(p + "offset")[0];
      const float offset = double_quant_offset(absmax.data(), nb);
      EXPECT_LE(ulps(offset, golden_offset), 1) << offset << " vs " << golden_offset;
      offsets_exact += bits(offset) == bits(golden_offset);
      ++offsets_total;
      std::vector<std::uint8_t> qabs(static_cast<std::size_t>(nb));
      std::vector<float> absmax2(static_cast<std::size_t>(quant_blocks(nb, kBlockwise8Size)));
      quantize_blockwise8_cpu(qabs.data(), absmax2.data(), absmax.data(), golden_offset, nb,
                              kBlockwise8Size, lut.data());
      EXPECT_EQ(qabs, read_u8(r, p + "absmax"));
      EXPECT_EQ(bit_mismatches(absmax2, r.read_f32(p + "nested_absmax")), 0);
      // The fp32 absmax dequantize_4bit rebuilds: code[q] * absmax2, then + offset.
      std::vector<float> rebuilt(static_cast<std::size_t>(nb));
      dequantize_blockwise8_cpu(rebuilt.data(), read_u8(r, p + "absmax").data(),
                                r.read_f32(p + "nested_absmax").data(), kDynamicMapSigned, nb,
                                kBlockwise8Size, true, golden_offset);
      EXPECT_EQ(bit_mismatches(rebuilt, r.read_f32(p + "absmax_f32")), 0);
    }

    // Dequantize the recorded bytes with the recorded fp32 absmax, into every dtype.
    const std::vector<std::uint8_t> gp = read_u8(r, p + "packed");
    const std::vector<float> gabs = r.read_f32(p + "absmax_f32");
    const bool signed_zero = shape[1] % 2 == 0;  // bnb's CPU kernel; its fallback for odd ones
    for (const char* name : {"f32", "bf16", "f16"}) {
      const DType odt = dtype_of(name);
      std::vector<std::uint8_t> out(static_cast<std::size_t>(n) * dtype_size(odt));
      dequantize_4bit_cpu(out.data(), gp.data(), gabs.data(), n, bs, t, signed_zero, odt);
      EXPECT_EQ(bit_mismatches(from_bytes(out, std::size_t(n), odt), r.read_f32(p + "deq_" + name)),
                0)
          << name;
    }
    std::vector<std::uint8_t> own(static_cast<std::size_t>(n) * dtype_size(dt));
    dequantize_4bit_cpu(own.data(), gp.data(), gabs.data(), n, bs, t, signed_zero, dt);
    EXPECT_EQ(bit_mismatches(from_bytes(own, std::size_t(n), dt), r.read_f32(p + "deq_state")), 0);
  }
  // The goldens' offsets: say how many came out exact (the sum order is torch's own).
  RecordProperty("double_quant_offsets_exact", offsets_exact);
  RecordProperty("double_quant_offsets", offsets_total);
  EXPECT_GE(offsets_exact, offsets_total - 3);
}

// LLM.int8's frozen weight (--quant int8): what bitsandbytes' Int8Params stores (CB, SCB) and
// the weight MatMul8bitFp / MatMul8bitLt dequantize for their GEMMs, bit for bit, in every
// dtype: ties rounded half to even, the fp16 cast before the absmax (an fp32 weight's SCB is not
// its max|W|), values below fp16's range. A zero row (NaN in bnb, undefined in C) stores 0.
TEST(OpsQuant, Int8MatchesBitsandbytes) {
  const SafeTensorsReader r(data_file("int8.safetensors"));
  const json cases = cases_of(r, "cases", "c");
  ASSERT_GE(cases.size(), 4u);
  EXPECT_EQ(r.metadata().at("bitsandbytes"), "0.50.2");
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const json& cs = cases[c];
    const std::string p = "c" + std::to_string(c) + ".";
    SCOPED_TRACE(p + cs.dump());
    const DType dt = dtype_of(cs["dtype"].get<std::string>());
    const std::vector<std::int64_t> shape = cs["shape"].get<std::vector<std::int64_t>>();
    const std::int64_t rows = shape[0], cols = shape[1], n = rows * cols;
    const std::vector<std::uint8_t> w = as_bytes(r.read_f32(p + "input"), dt);
    std::vector<std::int8_t> cb(static_cast<std::size_t>(n));
    std::vector<float> scb(static_cast<std::size_t>(rows));
    quantize_int8_cpu(cb.data(), scb.data(), w.data(), rows, cols, dt);
    const std::vector<std::uint8_t> gcb = read_u8(r, p + "cb");
    ASSERT_EQ(gcb.size(), cb.size());
    EXPECT_EQ(std::memcmp(gcb.data(), cb.data(), cb.size()), 0);
    EXPECT_EQ(bit_mismatches(scb, r.read_f32(p + "scb")), 0);
    for (const char* name : {"f32", "bf16", "f16"}) {
      const DType odt = dtype_of(name);
      std::vector<std::uint8_t> out(static_cast<std::size_t>(n) * dtype_size(odt));
      const std::vector<float> gscb = r.read_f32(p + "scb");
      dequantize_int8_cpu(out.data(), reinterpret_cast<const std::int8_t*>(gcb.data()), gscb.data(),
                          rows, cols, odt);
      EXPECT_EQ(bit_mismatches(from_bytes(out, std::size_t(n), odt), r.read_f32(p + "deq_" + name)),
                0)
          << name;
    }
  }
  // The tie row of case 0 (absmax 127: scale 1): 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 126.5 -> 126.
  const std::vector<std::uint8_t> tie = read_u8(r, "c0.cb");
  EXPECT_EQ(std::vector<int>(tie.begin(), tie.begin() + 9),
            (std::vector<int>{127, 0, 2, 2, 4, 0, 254, 254, 126}));  // int8 bytes: -2 is 254
  // A zero row: SCB 0 and CB 0, next to an ordinary row.
  const std::vector<float> zw = {0, 0, 0, 1, -2, 4};
  const std::vector<std::uint8_t> zb = as_bytes(zw, DType::f32);
  std::vector<std::int8_t> zcb(6, 99);
  std::vector<float> zscb(2, -1);
  quantize_int8_cpu(zcb.data(), zscb.data(), zb.data(), 2, 3, DType::f32);
  EXPECT_EQ(zscb, (std::vector<float>{0.0f, 4.0f}));
  EXPECT_EQ(zcb, (std::vector<std::int8_t>{0, 0, 0, 32, -64, 127}));
}

// AdamW8bit, three steps of five parameters: 8-bit states for the tensors of 4,096 elements or
// more (one not a multiple of 256, one whose first gradient is zero), fp32 states below. Each
// step starts from our own previous states and from the golden parameter before it.
TEST(OpsQuant, AdamW8bitMatchesBitsandbytes) {
  const SafeTensorsReader r(data_file("adamw8bit.safetensors"));
  const json specs = cases_of(r, "params", "p");
  const json hyper = json::parse(r.metadata().at("hyper"));
  const int steps = std::stoi(r.metadata().at("steps"));
  ASSERT_EQ(std::stoi(r.metadata().at("min_8bit_size")), int(kBnbMin8BitSize));
  BnbAdamWParams hp;
  hp.lr = hyper["lr"].get<double>();
  hp.beta1 = hyper["beta1"].get<double>();
  hp.beta2 = hyper["beta2"].get<double>();
  hp.eps = hyper["eps"].get<double>();
  hp.weight_decay = hyper["weight_decay"].get<double>();
  std::vector<std::uint8_t> lut1(kQuantLutSize), lut2(kQuantLutSize);
  blockwise8_build_lut(kDynamicMapSigned, lut1.data());
  blockwise8_build_lut(kDynamicMapUnsigned, lut2.data());
  std::int64_t param_elems = 0, param_off = 0;
  for (std::size_t j = 0; j < specs.size(); ++j) {
    std::int64_t n = 1;
    for (auto e : specs[j]["shape"]) n *= e.get<std::int64_t>();
    const bool eight = n >= kBnbMin8BitSize;
    const std::int64_t nb = quant_blocks(n, kBlockwise8Size);
    std::vector<std::uint8_t> s1(static_cast<std::size_t>(n), 0),
        s2(static_cast<std::size_t>(n), 0);
    std::vector<float> a1(static_cast<std::size_t>(nb), 0.0f),
        a2(static_cast<std::size_t>(nb), 0.0f);
    std::vector<float> m(static_cast<std::size_t>(n), 0.0f), v(static_cast<std::size_t>(n), 0.0f);
    std::vector<float> p = r.read_f32("p" + std::to_string(j) + ".init");
    for (int step = 1; step <= steps; ++step) {
      const std::string pre = "p" + std::to_string(j) + ".s" + std::to_string(step) + ".";
      SCOPED_TRACE(pre + (eight ? " 8-bit" : " fp32 states"));
      const std::vector<float> g = r.read_f32(pre + "grad");
      if (step > 1)
        p = r.read_f32("p" + std::to_string(j) + ".s" + std::to_string(step - 1) + ".param");
      const std::vector<float> p_in = p;
      if (eight) {
        bnb_adamw8bit_update_cpu(p.data(), g.data(), s1.data(), s2.data(), a1.data(), a2.data(),
                                 kDynamicMapSigned, kDynamicMapUnsigned, lut1.data(), lut2.data(),
                                 n, hp, step, DType::f32);
        EXPECT_EQ(s1, read_u8(r, pre + "state1"));
        EXPECT_EQ(s2, read_u8(r, pre + "state2"));
        EXPECT_EQ(bit_mismatches(a1, r.read_f32(pre + "absmax1")), 0);
        EXPECT_EQ(bit_mismatches(a2, r.read_f32(pre + "absmax2")), 0);
      } else {
        bnb_adamw32_update_cpu(p.data(), g.data(), m.data(), v.data(), n, hp, step, DType::f32);
        EXPECT_EQ(bit_mismatches(m, r.read_f32(pre + "state1")), 0);
        EXPECT_EQ(bit_mismatches(v, r.read_f32(pre + "state2")), 0);
      }
      // The parameter: the last addition p + u rounds once; a last-bit difference in the
      // denominator moves u by about one ulp of u, so the bound is an ulp of the operands
      // (|p| before the step and |u| ~ the step's change), not of a result they cancel into.
      const std::vector<float> gp = r.read_f32(pre + "param");
      for (std::size_t i = 0; i < gp.size(); ++i) {
        const double before = std::fabs(double(p_in[i])),
                     change = std::fabs(double(gp[i]) - p_in[i]);
        EXPECT_LE(std::fabs(double(p[i]) - gp[i]), std::ldexp(before + change, -22))
            << "param " << i << ": " << p[i] << " vs " << gp[i] << " (was " << p_in[i] << ")";
        param_off += bits(p[i]) != bits(gp[i]);
      }
      param_elems += n;
    }
  }
  // torch's sqrt (MKL) against sqrtf: a last-bit difference in a few percent of the elements.
  RecordProperty("param_elements_one_ulp_off", int(param_off));
  RecordProperty("param_elements", int(param_elems));
  EXPECT_LT(param_off * 100, param_elems) << param_off << " of " << param_elems;
}

// gnorm_scale (the fp16 step's 1/S): the update with scale c on fp32 gradients g is the update
// with scale 1 on the gradients float(g)·c computed beforehand, bit for bit (bitsandbytes'
// g.float() * gnorm_scale, one fp32 multiply), for the 8-bit and the fp32-state paths; and it is
// not the unscaled update.
TEST(OpsQuant, GnormScaleIsOneMultiplyBeforeTheMoments) {
  std::vector<std::uint8_t> lut1(kQuantLutSize), lut2(kQuantLutSize);
  blockwise8_build_lut(kDynamicMapSigned, lut1.data());
  blockwise8_build_lut(kDynamicMapUnsigned, lut2.data());
  const float c = 1.0f / 30.0f;  // 1/S for b·(s − 1) = 30 positions
  for (std::int64_t n : {std::int64_t(1000), std::int64_t(5000)}) {
    SCOPED_TRACE(n);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const auto un = static_cast<std::size_t>(n);
    std::vector<float> g(un), gc(un), p0(un);
    for (std::size_t i = 0; i < g.size(); ++i) {
      g[i] = 30.0f * nd(rng);
      gc[i] = g[i] * c;
      p0[i] = 0.02f * nd(rng);
    }
    const std::int64_t nb = quant_blocks(n, kBlockwise8Size);
    auto run = [&](const std::vector<float>& grad, float scale) {
      BnbAdamWParams hp;
      hp.gnorm_scale = scale;
      std::vector<float> p = p0, m(std::size_t(n), 0.f), v(std::size_t(n), 0.f),
                         a1(std::size_t(nb), 0.f), a2(std::size_t(nb), 0.f);
      std::vector<std::uint8_t> s1(std::size_t(n), 0), s2(std::size_t(n), 0);
      for (int step = 1; step <= 2; ++step)
        if (n >= kBnbMin8BitSize)
          bnb_adamw8bit_update_cpu(p.data(), grad.data(), s1.data(), s2.data(), a1.data(),
                                   a2.data(), kDynamicMapSigned, kDynamicMapUnsigned, lut1.data(),
                                   lut2.data(), n, hp, step, DType::f32);
        else
          bnb_adamw32_update_cpu(p.data(), grad.data(), m.data(), v.data(), n, hp, step,
                                 DType::f32);
      return p;
    };
    const std::vector<float> scaled = run(g, c), prescaled = run(gc, 1.0f), raw = run(g, 1.0f);
    EXPECT_EQ(bit_mismatches(scaled, prescaled), 0);
    EXPECT_GT(bit_mismatches(scaled, raw), 0);
  }
}

TEST(OpsQuant, BadArgumentsAreErrors) {
  float absmax[1];
  std::uint8_t packed[1];
  float x[2] = {1.0f, 2.0f};
  EXPECT_THROW(quantize_4bit_cpu(packed, absmax, x, 2, 63, Quant4Type::nf4, DType::f32),
               InputError);
  EXPECT_THROW(quantize_4bit_cpu(packed, absmax, x, 2, 0, Quant4Type::nf4, DType::f32), InputError);
  EXPECT_THROW(bnb_adamw32_update_cpu(x, x, x, x, 1, BnbAdamWParams{}, 0, DType::f32), InputError);
  EXPECT_THROW(double_quant_offset(x, 0), InputError);
}

// Byte counts of docs/formulas.md ("4-bit weights"), from the sizes the functions give and the
// goldens' tensors: n/2 packed, one absmax per block, one nested absmax per 256 blocks.
TEST(OpsQuant, StoredBytesPerMatrix) {
  const SafeTensorsReader r(data_file("quant4.safetensors"));
  const json cases = cases_of(r, "cases", "c");
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const std::string p = "c" + std::to_string(c) + ".";
    const std::int64_t n =
        cases[c]["shape"][0].get<std::int64_t>() * cases[c]["shape"][1].get<std::int64_t>();
    const std::int64_t bs = cases[c]["bs"].get<std::int64_t>();
    EXPECT_EQ(std::int64_t(r.at(p + "packed").numel()), quant4_packed_bytes(n)) << p;
    EXPECT_EQ(std::int64_t(r.at(p + "absmax").numel()), quant_blocks(n, bs)) << p;
    if (cases[c]["dq"].get<bool>()) {
      EXPECT_EQ(std::int64_t(r.at(p + "nested_absmax").numel()),
                quant_blocks(quant_blocks(n, bs), kBlockwise8Size))
          << p;
    }
  }
  // Llama-3-8B's q_proj: 16,777,216 elements -> 8,388,608 + 262,144 + 4,096 bytes (plus the
  // offset and the two code tables, 4 + 64 + 1,024), docs/lora-plan.md 1.6.
  const std::int64_t n = 4096LL * 4096;
  EXPECT_EQ(quant4_packed_bytes(n) + quant_blocks(n, 64) +
                4 * quant_blocks(quant_blocks(n, 64), 256) + 4 + 64 + 1024,
            8655940);
}

}  // namespace
}  // namespace trainmem
