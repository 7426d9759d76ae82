// Optimizers: state allocation through the ledger (names, categories, bytes) and the updates
// on the cpu backend against a float64 re-statement of PyTorch's AdamW / SGD algorithms.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "trainmem/backends/backend.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/safetensors.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/optimizer.hpp"

using namespace trainmem;

namespace {

std::vector<float> grads_for_step(int step, std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i)
    g[i] = float(std::sin(0.7 * double(i) + 1.3 * step) * (i % 3 == 0 ? 1e-3 : 0.5));
  return g;
}

std::vector<float> initial_weights(std::size_t n) {
  std::vector<float> w(n);
  for (std::size_t i = 0; i < n; ++i) w[i] = float(0.1 * std::cos(1.1 * double(i)) + 0.01 * i);
  return w;
}

struct OneParam {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Ledger> ledger;
  std::unique_ptr<ParameterOptimizer> opt;
  Tensor param, grad;
  std::size_t index = 0;
  OneParam(DType dt, const OptimizerSettings& s, std::size_t n, const std::vector<float>& w0) {
    be = make_cpu_backend(dt);
    ledger = std::make_unique<Ledger>(be->allocator());
    opt = std::make_unique<ParameterOptimizer>(s, *be, *ledger);
    param = ledger->allocate("w", Category::params, 0, {std::int64_t(n)}, dt);
    grad = ledger->allocate("w.grad", Category::gradients, 0, {std::int64_t(n)}, dt);
    index = opt->add_parameter("w", 0, {std::int64_t(n)});
    for (std::size_t i = 0; i < n; ++i) store_from_f32(param.data(), i, dt, w0[i]);
    if (float* m = opt->master(index))
      for (std::size_t i = 0; i < n; ++i) m[i] = w0[i];
  }
  void set_grad(const std::vector<float>& g) {
    for (std::size_t i = 0; i < g.size(); ++i) store_from_f32(grad.data(), i, be->dtype(), g[i]);
  }
  std::vector<float> weights() const {
    std::vector<float> w(param.numel());
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = load_as_f32(param.data(), i, be->dtype());
    return w;
  }
  ~OneParam() {
    param.reset();
    grad.reset();
    opt.reset();
  }
};

}  // namespace

TEST(Optimizer, StatesAreAllocatedPerParameterWithTheirNames) {
  struct C {
    Optimizer o;
    DType dt;
    std::vector<std::string> suffixes;
  };
  for (const C& c : {C{Optimizer::adamw, DType::bf16, {".master", ".exp_avg", ".exp_avg_sq"}},
                     C{Optimizer::adamw, DType::f32, {".exp_avg", ".exp_avg_sq"}},
                     C{Optimizer::sgd, DType::f16, {".master"}}, C{Optimizer::sgd, DType::f32, {}},
                     C{Optimizer::lomo, DType::bf16, {}}}) {
    auto be = make_meta_backend(c.dt);
    Ledger ledger(be->allocator());
    ParameterOptimizer opt(default_optimizer_settings(c.o), *be, ledger);
    opt.add_parameter("a", 3, {5, 7});
    opt.add_parameter("b", -1, {11});
    std::vector<std::string> names;
    for (const auto& r : ledger.tensors()) {
      EXPECT_EQ(r.category, Category::optimizer_states);
      EXPECT_EQ(r.dtype, DType::f32);
      names.push_back(r.name);
    }
    std::vector<std::string> want;
    for (const char* p : {"a", "b"})
      for (const auto& s : c.suffixes) want.push_back(p + s);
    EXPECT_EQ(names, want) << optimizer_name(c.o) << " " << dtype_name(c.dt);
    EXPECT_EQ(ledger.live(Category::optimizer_states),
              (35 + 11) * optimizer_state_bytes_per_param(c.o, c.dt));
    EXPECT_EQ(opt.master(0) != nullptr, !c.suffixes.empty() && c.suffixes[0] == ".master");
    EXPECT_EQ(opt.fused_into_backward(), c.o == Optimizer::lomo);
  }
  EXPECT_EQ(optimizer_state_bytes_per_param(Optimizer::adamw, DType::bf16), 12u);
  EXPECT_EQ(optimizer_state_bytes_per_param(Optimizer::sgd, DType::f16), 4u);
  EXPECT_EQ(optimizer_state_bytes_per_param(Optimizer::lomo, DType::f32), 0u);
}

TEST(Optimizer, AdamWMatchesPyTorchsAlgorithmWithMasterWeights) {
  OptimizerSettings s = default_optimizer_settings(Optimizer::adamw);
  s.adamw = AdamWParams{1e-2f, 0.9f, 0.95f, 1e-6f, 0.1f};
  const std::size_t n = 37;
  const auto w0 = initial_weights(n);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    OneParam st(dt, s, n, w0);
    std::vector<double> p(w0.begin(), w0.end()), m(n, 0), v(n, 0);
    for (int t = 1; t <= 4; ++t) {
      const auto g = grads_for_step(t, n);
      st.set_grad(g);
      st.opt->update(st.index, st.param.data(), st.grad.data(), t, 1.0f);
      for (std::size_t i = 0; i < n; ++i) {
        const double gi = round_to(dt, g[i]);  // the gradient as stored in D
        p[i] *= 1.0 - 1e-2 * 0.1;              // decoupled weight decay
        m[i] = 0.9 * m[i] + 0.1 * gi;
        v[i] = 0.95 * v[i] + 0.05 * gi * gi;
        const double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.95, t));
        p[i] -= 1e-2 * mh / (std::sqrt(vh) + 1e-6);
      }
    }
    const auto w = st.weights();
    const float* master = st.opt->master(st.index);
    for (std::size_t i = 0; i < n; ++i) {
      if (master) {
        // 4 fp32 steps vs fp64 with the decimal constants: 0.9f, 0.95f, 1e-2f differ from them by
        // <= 2.4e-7 relative (1 - 0.9f vs 0.1); p rounds ~2u per step (8u = 5e-7·|p|) and the
        // update
        // (~1e-2) carries ~5e-7 of itself: ~5e-7·(1 + |p|), 2e-6 is 4x.
        EXPECT_NEAR(master[i], p[i], 2e-6 * (1 + std::abs(p[i]))) << dtype_name(dt) << " " << i;
        EXPECT_EQ(w[i], round_to(dt, master[i])) << "param = round(master)";
      } else {
        EXPECT_NEAR(w[i], p[i], 2e-6 * (1 + std::abs(p[i]))) << i;
      }
    }
  }
  OneParam st(DType::f32, s, n, w0);
  EXPECT_THROW(st.opt->update(st.index, st.param.data(), st.grad.data(), 0, 1.0f), Error);
}

TEST(Optimizer, SgdAndLomoStepAgainstTheGradient) {
  const std::size_t n = 29;
  const auto w0 = initial_weights(n);
  const auto g = grads_for_step(1, n);
  for (Optimizer o : {Optimizer::sgd, Optimizer::lomo}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      OptimizerSettings s = default_optimizer_settings(o);
      s.sgd_lr = 0.25f;
      s.lomo_lr = 0.125f;
      const double lr = o == Optimizer::sgd ? 0.25 : 0.125;
      OneParam st(dt, s, n, w0);
      st.set_grad(g);
      st.opt->update(st.index, st.param.data(), st.grad.data(), 1, 1.0f);
      const auto w = st.weights();
      const float* master = st.opt->master(st.index);
      for (std::size_t i = 0; i < n; ++i) {
        // SGD goes through the fp32 master when D is 16-bit; LOMO updates the D weights.
        const double start = master ? w0[i] : round_to(dt, w0[i]);
        const double want = start - lr * round_to(dt, g[i]);
        // lr is a power of two, so lr·g is exact in fp32: one rounding of the difference, u·|want|
        // = 6e-8·|want| < 1e-7·(1 + |want|). The stored weight rounds that same fp32 value to D, as
        // the reference does.
        if (master) {
          EXPECT_NEAR(master[i], want, 1e-7 * (1 + std::abs(want)));
        }
        EXPECT_NEAR(w[i], round_to(dt, float(want)), 1e-7 * (1 + std::abs(want)))
            << optimizer_name(o) << " " << dtype_name(dt) << " " << i;
      }
    }
  }
}

// Loss scaling: gradients stored S times larger and updated with grad_scale 1/S must give the
// update of the unscaled gradients. Under bf16/fp16, S = 1024 is a power of two, so the scaled
// gradients are exactly S·round(g) in D and 1/S is exact: the results must agree bit for bit.
// Under fp32, S = 4088 (b·(s−1) of LLaMA-7B at b 8, s 512, the scale an fp16 run of that shape
// uses) rounds: g·S and 1/S are each rounded once in fp32, so the gradient the update sees is
// g·(1 + δ), |δ| <= 2^-23. Stated bound: each weight within 2^-21 (four times that) of the sum
// of its step sizes, plus one ulp of the result where the final rounding falls the other way.
// Measured: AdamW 0 ulps of the result, LOMO 1, SGD 4 (lr 0.25 moves weights by more than
// their own size), all inside the bound.
TEST(Optimizer, LossScaledGradientsWithGradScaleOneOverSGiveTheUnscaledUpdate) {
  const std::size_t n = 41;
  const auto w0 = initial_weights(n);
  for (Optimizer o : {Optimizer::adamw, Optimizer::sgd, Optimizer::lomo}) {
    OptimizerSettings s = default_optimizer_settings(o);
    s.adamw = AdamWParams{1e-2f, 0.9f, 0.95f, 1e-6f, 0.1f};
    s.sgd_lr = 0.25f;
    s.lomo_lr = 0.125f;
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(optimizer_name(o)) + " " + dtype_name(dt));
      const float S = dt == DType::f32 ? 4088.0f : 1024.0f;
      OneParam plain(dt, s, n, w0), scaled(dt, s, n, w0);
      std::vector<double> moved(n, 0.0);  // sum over steps of |step size|, the plain run's
      auto before = plain.weights();
      for (int t = 1; t <= 4; ++t) {
        const auto g = grads_for_step(t, n);
        std::vector<float> gs(n);
        for (std::size_t i = 0; i < n; ++i) gs[i] = round_to(dt, g[i]) * S;
        plain.set_grad(g);
        scaled.set_grad(gs);
        plain.opt->update(plain.index, plain.param.data(), plain.grad.data(), t, 1.0f);
        scaled.opt->update(scaled.index, scaled.param.data(), scaled.grad.data(), t, 1.0f / S);
        const auto after = plain.weights();
        for (std::size_t i = 0; i < n; ++i) moved[i] += std::abs(double(after[i]) - before[i]);
        before = after;
      }
      const auto wp = plain.weights(), ws = scaled.weights();
      const float* mp = plain.opt->master(plain.index);
      const float* ms = scaled.opt->master(scaled.index);
      for (std::size_t i = 0; i < n; ++i) {
        if (dt != DType::f32) {
          ASSERT_EQ(ws[i], wp[i]) << i;
          if (mp) {
            ASSERT_EQ(ms[i], mp[i]) << i;
          }
        } else {
          const double ulp = std::nextafter(std::abs(wp[i]), INFINITY) - std::abs(wp[i]);
          EXPECT_LE(std::abs(double(ws[i]) - double(wp[i])), std::ldexp(moved[i], -21) + ulp)
              << i << ": " << ws[i] << " vs " << wp[i];
        }
      }
    }
  }
}

// AdamW8bit's books: a tensor of 4,096 elements or more keeps uint8 state1/state2 and one fp32
// absmax per 256-element block for each; a smaller one fp32 state1/state2; the two quantile
// maps (256 fp32) and their lookup tables (65,536 bytes each) come once, with the first 8-bit
// tensor; no master copy (the weights are updated in place, as bitsandbytes does).
TEST(Optimizer, AdamW8bitStatesFollowBitsandbytesSizes) {
  auto be = make_meta_backend(DType::bf16);
  Ledger ledger(be->allocator());
  ParameterOptimizer opt(default_optimizer_settings(Optimizer::adamw8bit), *be, ledger);
  opt.add_parameter("small", 0, {4095});   // one under min_8bit_size: fp32 states
  opt.add_parameter("big", 1, {50, 100});  // 5,000: 8-bit, 20 blocks (the last partial)
  opt.add_parameter("edge", 1, {4096});    // exactly min_8bit_size: 8-bit, 16 blocks
  struct Want {
    const char* name;
    DType dt;
    std::uint64_t bytes;
  };
  const Want want[] = {
      {"small.state1", DType::f32, 4095 * 4},    {"small.state2", DType::f32, 4095 * 4},
      {"optimizer.qmap1", DType::f32, 1024},     {"optimizer.qmap2", DType::f32, 1024},
      {"optimizer.qmap1_lut", DType::u8, 65536}, {"optimizer.qmap2_lut", DType::u8, 65536},
      {"big.state1", DType::u8, 5000},           {"big.state2", DType::u8, 5000},
      {"big.absmax1", DType::f32, 20 * 4},       {"big.absmax2", DType::f32, 20 * 4},
      {"edge.state1", DType::u8, 4096},          {"edge.state2", DType::u8, 4096},
      {"edge.absmax1", DType::f32, 16 * 4},      {"edge.absmax2", DType::f32, 16 * 4}};
  const auto& got = ledger.tensors();
  ASSERT_EQ(got.size(), std::size(want));
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name) << i;
    EXPECT_EQ(got[i].dtype, want[i].dt) << want[i].name;
    EXPECT_EQ(got[i].bytes, want[i].bytes) << want[i].name;
    EXPECT_EQ(got[i].category, Category::optimizer_states) << want[i].name;
    total += want[i].bytes;
  }
  EXPECT_EQ(ledger.live(Category::optimizer_states), total);
  EXPECT_EQ(total, 2u * 16380 + 2048 + 131072 + 10160 + 8320);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(opt.master(i), nullptr);
  EXPECT_FALSE(opt.fused_into_backward());
}

// bitsandbytes' paged optimizers (get_state_buffer): state1/state2 of a tensor of 100,000
// elements or more come from the managed ledger, everything else (a smaller tensor's moments,
// the absmax blocks, the shared maps and tables) from the device ledger as AdamW8bit keeps it;
// PagedAdamW keeps fp32 moments for every tensor and no maps. No master copy either way.
TEST(Optimizer, PagedOptimizersTakeLargeMomentsFromTheManagedLedger) {
  auto be = make_meta_backend(DType::bf16);
  struct Want {
    std::string name;
    DType dt;
    std::uint64_t bytes;
    bool managed;
  };
  for (Optimizer o : {Optimizer::paged_adamw8bit, Optimizer::paged_adamw}) {
    SCOPED_TRACE(optimizer_name(o));
    Ledger device(be->allocator()), managed(be->managed_allocator());
    ParameterOptimizer opt(default_optimizer_settings(o), *be, device, &managed);
    opt.add_parameter("small", 0, {4095});   // under min_8bit_size
    opt.add_parameter("under", 0, {99999});  // one under the paging size
    opt.add_parameter("at", 1, {400, 250});  // exactly 100,000: paged
    const bool eight = o == Optimizer::paged_adamw8bit;
    const DType md = eight ? DType::u8 : DType::f32;
    const std::uint64_t w = eight ? 1 : 4;
    std::vector<Want> want = {{"small.state1", DType::f32, 4095 * 4, false},
                              {"small.state2", DType::f32, 4095 * 4, false}};
    if (eight)
      for (const char* m : {"optimizer.qmap1", "optimizer.qmap2"})
        want.push_back({m, DType::f32, 1024, false});
    if (eight)
      for (const char* m : {"optimizer.qmap1_lut", "optimizer.qmap2_lut"})
        want.push_back({m, DType::u8, 65536, false});
    for (const char* s : {"under.state1", "under.state2"})
      want.push_back({s, md, 99999 * w, false});
    if (eight)
      for (const char* a : {"under.absmax1", "under.absmax2"})
        want.push_back({a, DType::f32, 391 * 4, false});  // ceil(99,999 / 256) = 391
    for (const char* s : {"at.state1", "at.state2"}) want.push_back({s, md, 100000 * w, true});
    if (eight)
      for (const char* a : {"at.absmax1", "at.absmax2"})
        want.push_back({a, DType::f32, 391 * 4, false});  // ceil(100,000 / 256) = 391
    std::vector<const TensorRecord*> got_device, got_managed;
    for (const auto& r : device.tensors()) got_device.push_back(&r);
    for (const auto& r : managed.tensors()) got_managed.push_back(&r);
    std::size_t d = 0, m = 0;
    for (const Want& x : want) {
      auto& list = x.managed ? got_managed : got_device;
      std::size_t& at = x.managed ? m : d;
      ASSERT_LT(at, list.size()) << x.name;
      const TensorRecord& r = *list[at++];
      EXPECT_EQ(r.name, x.name);
      EXPECT_EQ(r.dtype, x.dt) << x.name;
      EXPECT_EQ(r.bytes, x.bytes) << x.name;
      EXPECT_EQ(r.category, Category::optimizer_states) << x.name;
    }
    EXPECT_EQ(d, got_device.size());
    EXPECT_EQ(m, got_managed.size());
    EXPECT_EQ(managed.live_total(), 2 * 100000 * w);
    for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(opt.master(i), nullptr);
  }
  Ledger device(be->allocator());
  try {
    ParameterOptimizer opt(default_optimizer_settings(Optimizer::paged_adamw), *be, device);
    FAIL() << "a paged optimizer without its managed ledger";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("paged-adamw: a paged optimizer needs the managed-memory "
                                         "ledger"),
              std::string::npos)
        << e.what();
  }
}

// The update of a paged optimizer is the unpaged one: PagedAdamW8bit's equals AdamW8bit's bit for
// bit on a paged tensor; PagedAdamW's on 100,000 elements equals bitsandbytes' 32-bit update that
// AdamW8bit applies to tensors under 4,096 elements, run here on 25 slices of 4,000 (the 32-bit
// update is elementwise, so the slices must give the same bits), over three steps.
TEST(Optimizer, PagedOptimizersStepLikeTheirUnpagedTwins) {
  auto be = make_cpu_backend(DType::bf16);
  const std::int64_t n = 100000, slice = 4000;
  auto init = [](std::int64_t i) { return 0.01f * float(i % 37) - 0.17f; };
  auto grad = [](std::int64_t i, int step) { return 0.002f * float((i * 11 + step) % 29) - 0.03f; };
  auto run = [&](Optimizer o, std::int64_t parts) {
    Ledger device(be->allocator()), managed(be->managed_allocator());
    ParameterOptimizer opt(default_optimizer_settings(o), *be, device, &managed);
    const std::int64_t len = n / parts;
    std::vector<Tensor> p, g;
    for (std::int64_t k = 0; k < parts; ++k) {
      p.push_back(device.allocate("p", Category::params, 0, {len}, DType::bf16));
      g.push_back(device.allocate("g", Category::gradients, 0, {len}, DType::bf16));
      opt.add_parameter("p" + std::to_string(k), 0, {len});
      std::vector<float> v(static_cast<std::size_t>(len));
      for (std::int64_t i = 0; i < len; ++i) v[std::size_t(i)] = init(k * len + i);
      be->round_from_f32(p.back().data(), v.data(), len);
    }
    EXPECT_EQ(managed.live_total() > 0, paged_optimizer(o) && parts == 1);
    for (int step = 1; step <= 3; ++step)
      for (std::int64_t k = 0; k < parts; ++k) {
        std::vector<float> v(static_cast<std::size_t>(len));
        for (std::int64_t i = 0; i < len; ++i) v[std::size_t(i)] = grad(k * len + i, step);
        be->round_from_f32(g[std::size_t(k)].data(), v.data(), len);
        opt.update(std::size_t(k), p[std::size_t(k)].data(), g[std::size_t(k)].data(), step, 1.0f);
      }
    std::vector<std::uint16_t> out;
    for (auto& t : p) out.insert(out.end(), t.as<std::uint16_t>(), t.as<std::uint16_t>() + len);
    return out;
  };
  EXPECT_EQ(run(Optimizer::paged_adamw8bit, 1), run(Optimizer::adamw8bit, 1));
  const auto paged32 = run(Optimizer::paged_adamw, 1);
  EXPECT_EQ(paged32, run(Optimizer::adamw8bit, n / slice));
  EXPECT_NE(paged32, run(Optimizer::adamw8bit, 1)) << "8-bit moments must differ from fp32 ones";
}

// The optimizer's wiring (which map serves which moment, the hyperparameters, the 8-bit and
// fp32-state paths by size, the states carried from step to step) against the real
// bitsandbytes: tests/data/bnb/adamw8bit.safetensors, three steps of five parameters recorded
// by tools/bnb_goldens.py. Each step starts from the golden parameter before it and from the
// states this optimizer carried; the result must equal bnb's within the bound
// tests/test_ops_quant.cpp derives (torch's MKL sqrt against sqrtf: about one ulp).
TEST(Optimizer, AdamW8bitStepsLikeBitsandbytes) {
  const SafeTensorsReader r(std::string(TRAINMEM_TEST_DATA_DIR) + "/bnb/adamw8bit.safetensors");
  const nlohmann::json hyper = nlohmann::json::parse(r.metadata().at("hyper"));
  const int steps = std::stoi(r.metadata().at("steps"));
  const int count = std::stoi(r.metadata().at("params"));
  ASSERT_GE(steps, 2);
  OptimizerSettings s = default_optimizer_settings(Optimizer::adamw8bit);
  s.adamw8bit.lr = hyper["lr"].get<double>();
  s.adamw8bit.beta1 = hyper["beta1"].get<double>();
  s.adamw8bit.beta2 = hyper["beta2"].get<double>();
  s.adamw8bit.eps = hyper["eps"].get<double>();
  s.adamw8bit.weight_decay = hyper["weight_decay"].get<double>();
  auto be = make_cpu_backend(DType::f32);
  Ledger ledger(be->allocator());
  ParameterOptimizer opt(s, *be, ledger);
  std::vector<Tensor> params, grads;
  std::vector<std::int64_t> sizes;
  bool eight = false, small = false;
  for (int j = 0; j < count; ++j) {
    const auto spec = nlohmann::json::parse(r.metadata().at("p" + std::to_string(j)));
    std::vector<std::int64_t> shape = spec["shape"].get<std::vector<std::int64_t>>();
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    (n >= 4096 ? eight : small) = true;
    sizes.push_back(n);
    params.push_back(
        ledger.allocate("p" + std::to_string(j), Category::params, 0, shape, DType::f32));
    grads.push_back(ledger.allocate("p" + std::to_string(j) + ".grad", Category::gradients, 0,
                                    shape, DType::f32));
    EXPECT_EQ(opt.add_parameter("p" + std::to_string(j), 0, shape), std::size_t(j));
  }
  ASSERT_TRUE(eight && small) << "the goldens cover both paths";
  std::int64_t off = 0, total = 0;
  for (int step = 1; step <= steps; ++step) {
    for (int j = 0; j < count; ++j) {
      const std::string p = "p" + std::to_string(j);
      const std::string pre = p + ".s" + std::to_string(step) + ".";
      SCOPED_TRACE(pre);
      const auto before =
          r.read_f32(step == 1 ? p + ".init" : p + ".s" + std::to_string(step - 1) + ".param");
      const auto g = r.read_f32(pre + "grad");
      ASSERT_EQ(std::int64_t(before.size()), sizes[j]);
      std::memcpy(params[j].data(), before.data(), before.size() * 4);
      std::memcpy(grads[j].data(), g.data(), g.size() * 4);
      opt.update(std::size_t(j), params[j].data(), grads[j].data(), step, 1.0f);
      const auto want = r.read_f32(pre + "param");
      const float* got = params[j].as<float>();
      for (std::size_t i = 0; i < want.size(); ++i) {
        const double change = std::fabs(double(want[i]) - before[i]);
        ASSERT_LE(std::fabs(double(got[i]) - want[i]),
                  std::ldexp(std::fabs(double(before[i])) + change, -22))
            << "element " << i << ": " << got[i] << " vs bitsandbytes " << want[i];
        off += got[i] != want[i];
      }
      total += sizes[j];
    }
  }
  EXPECT_LT(off * 100, total) << off << " of " << total << " elements off by the last bit";
}

// The fp16 step's grad_scale reaches bitsandbytes' update as its gnorm_scale: an update with
// scale 1/30 on gradients g leaves the parameters that scale 1 leaves on float(g)·(1/30), bit for
// bit, for an 8-bit tensor and an fp32-state one, over two steps.
TEST(Optimizer, AdamW8bitTakesTheLossScaleAsGnormScale) {
  auto be = make_cpu_backend(DType::f32);
  const float c = 1.0f / 30.0f;
  for (std::int64_t n : {std::int64_t(5000), std::int64_t(300)}) {
    SCOPED_TRACE(n);
    std::vector<std::vector<float>> result;
    for (bool prescale : {false, true}) {
      Ledger ledger(be->allocator());
      ParameterOptimizer opt(default_optimizer_settings(Optimizer::adamw8bit), *be, ledger);
      Tensor p = ledger.allocate("p", Category::params, 0, {n}, DType::f32);
      Tensor g = ledger.allocate("p.grad", Category::gradients, 0, {n}, DType::f32);
      ASSERT_EQ(opt.add_parameter("p", 0, {n}), 0u);
      for (std::int64_t i = 0; i < n; ++i) p.as<float>()[i] = 0.01f * float(i % 17) - 0.08f;
      for (int step = 1; step <= 2; ++step) {
        for (std::int64_t i = 0; i < n; ++i) {
          const float raw = 30.0f * (0.003f * float((i * 7 + step) % 23) - 0.03f);
          g.as<float>()[i] = prescale ? raw * c : raw;
        }
        opt.update(0, p.data(), g.data(), step, prescale ? 1.0f : c);
      }
      result.emplace_back(p.as<float>(), p.as<float>() + n);
    }
    EXPECT_EQ(result[0], result[1]);
  }
}
