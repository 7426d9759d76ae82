// AdamW, SGD and the LOMO update against hand-written references: one step worked by hand,
// several steps of PyTorch's AdamW written out in fp64 (bias correction, decoupled weight
// decay), with an fp32 master for 16-bit parameters and in place for fp32 ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "adamw/adamw.hpp"
#include "adamw/adamw_math.hpp"
#include "ops_testing.hpp"

namespace trainmem {
namespace {
using namespace trainmem::testing;

TEST(OpsAdamw, FirstStepWorkedByHand) {
  // p = 1, g = 0.5, m = v = 0, step 1: m = 0.05, v = 2.5e-4, m_hat = 0.5, v_hat = 0.25,
  // p = 1 * (1 - lr * wd) - lr * 0.5 / (0.5 + eps).
  AdamWParams hp;
  hp.lr = 1e-3f;
  hp.weight_decay = 0.1f;
  float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
  adamw_update_cpu(&p, &g, nullptr, &m, &v, 1, hp, 1, 1.0f, DType::f32);
  // fp32: 1 - 0.9f = 0.10000002 (exact, Sterbenz), so m = 0.050000012: 1.2e-8 off 0.05, plus
  // one rounding (2^-24·0.05 = 3e-9): 2e-8. v: 1 - 0.999f = 9.99987e-4, v = 2.499968e-4, 3.2e-9
  // off, plus 1.5e-11: 5e-9. p < 1 where an fp32 ulp is 6e-8: decay, m/denom, step_size and the
  // subtraction round ~3 times: 2e-7.
  EXPECT_NEAR(m, 0.05, 2e-8);  // fp32: (1 - 0.9f) is not 0.1 exactly
  EXPECT_NEAR(v, 2.5e-4, 5e-9);
  EXPECT_NEAR(p, 0.99890000002, 2e-7);
}

struct AdamCase {
  DType dt;
  float weight_decay;
};
void PrintTo(const AdamCase& c, std::ostream* os) {
  *os << dtype_label(c.dt) << " weight_decay " << c.weight_decay;
}
class OpsAdamwP : public ::testing::TestWithParam<AdamCase> {};

TEST_P(OpsAdamwP, ThreeStepsMatchReference) {
  const auto [dt, wd] = GetParam();
  const std::int64_t n = 40003;  // large enough for the parallel loop
  AdamWParams hp;
  hp.lr = 3e-3f;
  hp.beta1 = 0.8f;
  hp.beta2 = 0.95f;
  hp.eps = 1e-6f;
  hp.weight_decay = wd;
  const std::vector<float> p0 = uniform(n, 81);
  Buf param = Buf::from(p0, dt);
  std::vector<float> master = param.f32();  // the fp32 copy starts equal to the stored param
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<double> rp(master.begin(), master.end()), rm(n, 0.0), rv(n, 0.0);
  for (int step = 1; step <= 3; ++step) {
    Buf grad = Buf::from(uniform(n, 90 + step), dt);
    adamw_update_cpu(param.data(), grad.data(), dt == DType::f32 ? nullptr : master.data(),
                     m.data(), v.data(), n, hp, step, 1.0f, dt);
    const double b1 = hp.beta1, b2 = hp.beta2;
    for (std::int64_t i = 0; i < n; ++i) {
      const double g = grad.get(i);
      rp[i] *= 1.0 - double(hp.lr) * wd;  // decoupled weight decay
      rm[i] = b1 * rm[i] + (1 - b1) * g;
      rv[i] = b2 * rv[i] + (1 - b2) * g * g;
      const double m_hat = rm[i] / (1 - std::pow(b1, step));
      const double v_hat = rv[i] / (1 - std::pow(b2, step));
      rp[i] -= hp.lr * m_hat / (std::sqrt(v_hat) + hp.eps);
    }
  }
  // Against fp64 with the same float constants (u = 2^-24): m and v take 3 fp32 roundings per
  // step, so after 3 steps <= 9u·sum|terms|: m <= 9u·1 = 5e-7 (atol 1e-6), v <= 9u·0.15 = 8e-8
  // (atol 1e-7). p (|p| <= 1) rounds the decay constant, the decay product and the subtraction
  // each step (~9u = 5e-7 < atol 1e-6); the update (<= 3e-3) carries ~7u of itself, 1e-9.
  // So atol bounds the worst case alone; rtol 1e-5 is slack for |values| above 1.
  EXPECT_TRUE(all_close("m", m, rm, {1e-6, 1e-5}));
  EXPECT_TRUE(all_close("v", v, rv, {1e-7, 1e-5}));
  if (dt == DType::f32) {
    EXPECT_TRUE(all_close("param", param.f32(), rp, {1e-6, 1e-5}));
  } else {
    EXPECT_TRUE(all_close("master", master, rp, {1e-6, 1e-5}));
    // The stored parameter is the master rounded once.
    std::vector<float> expect(n);
    for (std::int64_t i = 0; i < n; ++i) expect[i] = round_to(dt, master[i]);
    EXPECT_EQ(param.f32(), expect);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtype, OpsAdamwP,
                         ::testing::Values(AdamCase{DType::f32, 0.0f}, AdamCase{DType::f32, 0.1f},
                                           AdamCase{DType::bf16, 0.1f},
                                           AdamCase{DType::f16, 0.01f}),
                         [](const auto& info) {
                           return dtype_label(info.param.dt) +
                                  (info.param.weight_decay == 0.0f ? "_nodecay" : "_decay");
                         });

TEST(OpsAdamw, StepZeroIsRejected) {
  float p = 0, g = 0, m = 0, v = 0;
  EXPECT_THROW(adamw_update_cpu(&p, &g, nullptr, &m, &v, 1, AdamWParams{}, 0, 1.0f, DType::f32),
               InputError);
}

TEST(OpsSgd, UpdateThroughMasterAndInPlace) {
  for (DType dt : all_dtypes()) {
    const std::int64_t n = 37;
    const float lr = 0.05f;
    Buf param = Buf::from(uniform(n, 101), dt), grad = Buf::from(uniform(n, 102), dt);
    std::vector<float> master = param.f32();
    std::vector<double> ref(n);
    for (std::int64_t i = 0; i < n; ++i) ref[i] = double(master[i]) - lr * double(grad.get(i));
    // Through the master copy (SGD under mixed precision).
    Buf p2 = param;
    sgd_update_cpu(p2.data(), grad.data(), master.data(), n, lr, 1.0f, dt);
    // master = fl(p - fl(lr·g)) in fp32 on exact inputs (p, g are dt values, lr·g exact in
    // fp64): |err| <= u·|lr·g| + u·|result| <= 3e-9 + 6e-8·|result| (u = 2^-24, |lr·g| <= 0.05);
    // atol 1e-8 and rtol 2e-7 hold it with 3x to spare (was {1e-7, 1e-6}: 30x and 17x).
    EXPECT_TRUE(all_close(dtype_label(dt) + " master", master, ref, {1e-8, 2e-7}));
    std::vector<double> rounded_ref(n);
    for (std::int64_t i = 0; i < n; ++i) rounded_ref[i] = round_to(dt, master[i]);
    EXPECT_TRUE(all_close(dtype_label(dt) + " param", p2.f32(), rounded_ref, {0, 0}));
    // LOMO: no master, the stored parameter is updated in fp32 and rounded once.
    sgd_update_cpu(param.data(), grad.data(), nullptr, n, lr, 1.0f, dt);
    EXPECT_TRUE(all_close(dtype_label(dt) + " lomo", param.f32(), rounded_ref, {0, 0}));
  }
}

// grad_scale 1 must leave the arithmetic exactly as it was before loss scaling existed: the
// reference below is that loop (the per-element math of adamw_math.hpp on the gradient as
// loaded), and the results must agree bit for bit, for every dtype, with and without master.
bool same_bits(const Buf& a, const Buf& b) {
  return a.size() == b.size() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(), a.size() * dtype_size(a.dtype())) == 0;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(OpsAdamw, GradScaleOneIsTheUnscaledUpdateBitForBit) {
  for (DType dt : all_dtypes()) {
    const std::int64_t n = 40003;  // the parallel loop
    AdamWParams hp;
    hp.lr = 3e-3f;
    hp.weight_decay = 0.01f;
    Buf param = Buf::from(uniform(n, 201), dt);
    std::vector<float> master = param.f32(), m(n, 0.0f), v(n, 0.0f);
    Buf ref_param = param;
    std::vector<float> ref_master = master, ref_m = m, ref_v = v;
    float* mp = dt == DType::f32 ? nullptr : master.data();
    for (int step = 1; step <= 2; ++step) {
      const Buf grad = Buf::from(uniform(n, 210 + step), dt);
      adamw_update_cpu(param.data(), grad.data(), mp, m.data(), v.data(), n, hp, step, 1.0f, dt);
      const AdamWStepConsts k =
          adamw_step_consts(hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, step);
      for (std::int64_t i = 0; i < n; ++i) {
        float p = mp ? ref_master[i] : ref_param.get(i);
        adamw_update_elem(&p, &ref_m[i], &ref_v[i], grad.get(i), k.beta1, k.beta2, k.eps,
                          k.step_size, k.inv_sqrt_bc2, k.decay);
        if (mp) ref_master[i] = p;
        ref_param.set(i, p);
      }
    }
    EXPECT_TRUE(same_bits(param, ref_param)) << dtype_label(dt) << " adamw param";
    EXPECT_TRUE(same_bits(master, ref_master)) << dtype_label(dt) << " adamw master";
    EXPECT_TRUE(same_bits(m, ref_m)) << dtype_label(dt) << " adamw m";
    EXPECT_TRUE(same_bits(v, ref_v)) << dtype_label(dt) << " adamw v";

    // SGD through the master, and LOMO in place.
    const Buf grad = Buf::from(uniform(n, 220), dt);
    std::vector<float> sgd_master = param.f32(), want_master(n);
    Buf sgd_param = param, lomo_param = param;
    Buf want_param(std::size_t(n), dt), want_lomo(std::size_t(n), dt);
    for (std::int64_t i = 0; i < n; ++i) {
      want_master[i] = sgd_update_elem(sgd_master[i], grad.get(i), 0.05f);
      want_param.set(i, want_master[i]);
      want_lomo.set(i, sgd_update_elem(lomo_param.get(i), grad.get(i), 0.05f));
    }
    sgd_update_cpu(sgd_param.data(), grad.data(), sgd_master.data(), n, 0.05f, 1.0f, dt);
    sgd_update_cpu(lomo_param.data(), grad.data(), nullptr, n, 0.05f, 1.0f, dt);
    EXPECT_TRUE(same_bits(sgd_master, want_master)) << dtype_label(dt) << " sgd master";
    EXPECT_TRUE(same_bits(sgd_param, want_param)) << dtype_label(dt) << " sgd param";
    EXPECT_TRUE(same_bits(lomo_param, want_lomo)) << dtype_label(dt) << " lomo";
  }
}

}  // namespace
}  // namespace trainmem
