// The model families of issue 16 on the native model: Mistral (sliding window), Qwen2 (q/k/v
// biases, tied, a window from layer 1), Qwen3 (per-head q/k RMSNorm, head dim 16 != h/a = 12),
// Llama 3 (rope scaling). The parameter list against HF's names and shapes (written here from
// the HF classes' definitions, not from the model), HF's initialisation, loading by name, and
// on the cpu backend: gradients against central finite differences of the loss (every parameter
// tensor, in fp32, along its own gradient and along a random direction), checkpointing changing
// no bit of the gradients, and the cpu ledger equal to the meta ledger event for event.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "family_configs.hpp"
#include "model_helpers.hpp"
#include "trainmem/base/safetensors.hpp"
#include "trainmem/model/model_io.hpp"

using namespace trainmem;
using namespace trainmem::test;

namespace {

std::string temp_path(const std::string& leaf) {
  return (std::filesystem::temp_directory_path() /
          ("trainmem_families_" + std::to_string(::getpid()) + "_" + leaf))
      .string();
}

// ------------------------------------------------------------------------------ configurations

TEST(ModelFamilies, PresetsWhenPresentEqualTheSpecifiedValues) {
  for (const std::string& name : family_names()) {
    const auto p = find_preset(name);
    if (!p) continue;  // the presets land on another branch
    const ModelConfig c = family_config(name);
    SCOPED_TRACE(name);
    EXPECT_EQ(p->vocab, c.vocab);
    EXPECT_EQ(p->hidden, c.hidden);
    EXPECT_EQ(p->intermediate, c.intermediate);
    EXPECT_EQ(p->layers, c.layers);
    EXPECT_EQ(p->heads, c.heads);
    EXPECT_EQ(p->kv_heads, c.kv_heads);
    EXPECT_EQ(p->head_dim(), c.head_dim());
    EXPECT_EQ(p->max_positions, c.max_positions);
    EXPECT_EQ(p->rms_eps, c.rms_eps);
    EXPECT_EQ(p->rope_theta, c.rope_theta);
    EXPECT_EQ(p->tied_embeddings, c.tied_embeddings);
    EXPECT_EQ(p->qkv_bias, c.qkv_bias);
    EXPECT_EQ(p->qk_norm, c.qk_norm);
    for (int l = 0; l < c.layers; ++l) EXPECT_EQ(p->window_of(l), c.window_of(l));
    EXPECT_EQ(int(p->rope_scaling.kind), int(c.rope_scaling.kind));
    EXPECT_EQ(p->rope_scaling.factor, c.rope_scaling.factor);
    EXPECT_EQ(p->rope_scaling.low_freq_factor, c.rope_scaling.low_freq_factor);
    EXPECT_EQ(p->rope_scaling.high_freq_factor, c.rope_scaling.high_freq_factor);
    EXPECT_EQ(p->rope_scaling.original_max_positions, c.rope_scaling.original_max_positions);
  }
}

// HF's parameter names and shapes for one layer (Qwen2Attention: q/k/v Linear with bias=True;
// Qwen3Attention: q_norm, k_norm = RMSNorm(head_dim) after o_proj), in trainmem's setup order.
std::vector<std::pair<std::string, std::vector<std::int64_t>>> hf_layer(const std::string& fam,
                                                                        int l) {
  const std::string p = "model.layers." + std::to_string(l) + ".";
  const std::int64_t h = 48, i = 128;
  const std::int64_t ad = fam == "tiny-qwen3" ? 64 : 48;  // 4·16 | 6·8
  const std::int64_t kd = fam == "tiny-qwen3" ? 32 : 16;  // 2·16 | 2·8
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> v = {
      {p + "input_layernorm.weight", {h}}, {p + "self_attn.q_proj.weight", {ad, h}}};
  const bool bias = fam == "tiny-qwen2";
  if (bias) v.push_back({p + "self_attn.q_proj.bias", {ad}});
  v.push_back({p + "self_attn.k_proj.weight", {kd, h}});
  if (bias) v.push_back({p + "self_attn.k_proj.bias", {kd}});
  v.push_back({p + "self_attn.v_proj.weight", {kd, h}});
  if (bias) v.push_back({p + "self_attn.v_proj.bias", {kd}});
  v.push_back({p + "self_attn.o_proj.weight", {h, ad}});
  if (fam == "tiny-qwen3") {
    v.push_back({p + "self_attn.q_norm.weight", {16}});
    v.push_back({p + "self_attn.k_norm.weight", {16}});
  }
  v.push_back({p + "post_attention_layernorm.weight", {h}});
  v.push_back({p + "mlp.gate_proj.weight", {i, h}});
  v.push_back({p + "mlp.up_proj.weight", {i, h}});
  v.push_back({p + "mlp.down_proj.weight", {h, i}});
  return v;
}

TEST(ModelFamilies, ParametersHaveHfNamesShapesAndInitialisation) {
  for (const std::string& name : family_names()) {
    SCOPED_TRACE(name);
    const ModelConfig m = family_config(name);
    std::vector<std::pair<std::string, std::vector<std::int64_t>>> want = {
        {"model.embed_tokens.weight", {96, 48}}};
    for (int l = 0; l < 2; ++l)
      for (auto& x : hf_layer(name, l)) want.push_back(x);
    want.push_back({"model.norm.weight", {48}});
    if (!m.tied_embeddings) want.push_back({"lm_head.weight", {96, 48}});

    const TrainConfig t =
        train_config(1, 4, DType::f32, Optimizer::adamw, Checkpointing::none, Attention::eager);
    ModelRun run(BackendKind::cpu, m, t);
    const auto& params = run.model->parameters();
    ASSERT_EQ(params.size(), want.size());
    std::uint64_t total = 0;
    for (std::size_t j = 0; j < want.size(); ++j) {
      EXPECT_EQ(params[j].name, want[j].first);
      EXPECT_EQ(params[j].shape, want[j].second) << want[j].first;
      total += params[j].numel();
    }
    // Gradients and AdamW states follow the list: 4 + 4 + 8 bytes per element in fp32.
    EXPECT_EQ(run.ledger->live(Category::params), total * 4);
    EXPECT_EQ(run.ledger->live(Category::gradients), total * 4);
    EXPECT_EQ(run.ledger->live(Category::optimizer_states), total * 8);

    // HF's _init_weights: Linear biases zero, RMSNorm weights (q_norm, k_norm too) one.
    run.model->init_random(5);
    for (const auto& p : params) {
      const auto v = run.model->parameter_values(p.name);
      const bool bias = p.name.size() > 5 && p.name.substr(p.name.size() - 5) == ".bias";
      const bool norm = p.name.find("norm") != std::string::npos;
      if (bias || norm) {
        for (float x : v) ASSERT_EQ(x, bias ? 0.0f : 1.0f) << p.name;
      } else {
        double ss = 0;
        for (float x : v) ss += double(x) * x;
        // rms of n >= ~1500 N(0, 0.02^2) samples: standard error 0.02/sqrt(2n) <= 3.6e-4, so 0.004
        // is ~11 sigma: it only has to tell 0.02 from another std (1/sqrt(h) = 0.14, 1.0).
        EXPECT_NEAR(std::sqrt(ss / double(v.size())), 0.02, 0.004) << p.name;
      }
    }
  }
}

// ------------------------------------------------------------------------------ weights in files

using Values = std::map<std::string, std::vector<float>>;

void write_weights(const std::string& path, const LlamaModel& model, const Values& values) {
  SafeTensorsWriter w;
  for (const auto& p : model.parameters()) w.declare(p.name, SafeDType::F32, p.shape);
  w.open(path);
  for (const auto& p : model.parameters()) w.put(p.name, values.at(p.name).data());
  w.close();
}

// Weights with every family tensor away from its initial constant, so that the biases and the
// q/k norm weights take part: init_random's values, biases N(0, 0.1), norm weights 1 + N(0, 0.1).
Values varied_weights(LlamaModel& model, std::uint64_t seed) {
  model.init_random(seed);
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> n01(0.f, 1.f);
  Values v;
  for (const auto& p : model.parameters()) {
    auto x = model.parameter_values(p.name);
    if (p.shape.size() == 1)
      for (auto& e : x) e += 0.1f * n01(gen);
    v[p.name] = std::move(x);
  }
  return v;
}

TEST(ModelFamilies, LoadWeightsReadsBiasesAndNormsByNameAndNamesAMissingOne) {
  for (const char* name : {"tiny-qwen2", "tiny-qwen3"}) {
    SCOPED_TRACE(name);
    const ModelConfig m = family_config(name);
    const TrainConfig t =
        train_config(1, 4, DType::f32, Optimizer::sgd, Checkpointing::none, Attention::eager);
    ModelRun src(BackendKind::cpu, m, t);
    const Values v = varied_weights(*src.model, 11);
    const std::string path = temp_path(std::string(name) + ".safetensors");
    write_weights(path, *src.model, v);
    ModelRun dst(BackendKind::cpu, m, t);
    dst.model->load_weights(path);
    for (const auto& p : dst.model->parameters())
      EXPECT_EQ(dst.model->parameter_values(p.name), v.at(p.name)) << p.name;

    // The same file without one family tensor: an InputError naming it.
    const std::string missing = std::string(name) == "tiny-qwen2"
                                    ? "model.layers.1.self_attn.v_proj.bias"
                                    : "model.layers.0.self_attn.k_norm.weight";
    {
      SafeTensorsWriter w;
      for (const auto& p : src.model->parameters())
        if (p.name != missing) w.declare(p.name, SafeDType::F32, p.shape);
      w.open(path);
      for (const auto& p : src.model->parameters())
        if (p.name != missing) w.put(p.name, v.at(p.name).data());
      w.close();
    }
    try {
      dst.model->load_weights(path);
      ADD_FAILURE() << "no error for the missing " << missing;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
    }
    std::filesystem::remove(path);
  }
}

// ------------------------------------------------------------------------------ numerics (cpu)

// The loss at given weights and its gradients: SGD with lr 0 in fp32 leaves the weights as loaded.
struct LossAt {
  ModelRun run;
  std::string path;
  LossAt(const ModelConfig& m, const TrainConfig& t, const std::string& leaf)
      : run(BackendKind::cpu, m, t, &settings()), path(temp_path(leaf)) {}
  ~LossAt() { std::filesystem::remove(path); }
  static const OptimizerSettings& settings() {
    static OptimizerSettings s = [] {
      OptimizerSettings o = default_optimizer_settings(Optimizer::sgd);
      o.sgd_lr = 0.0f;
      return o;
    }();
    return s;
  }
  float operator()(const Values& v, GradMap* grads = nullptr) {
    write_weights(path, *run.model, v);
    run.model->load_weights(path);
    run.model->set_dropout_key(17, 0);  // LoRA dropout: every evaluation the same masks
    return run.model->train_step(grads ? capture_into(*grads) : GradientCapture());
  }
};

class FamilyGradients : public testing::TestWithParam<std::string> {};

// Every parameter tensor: the analytic gradient g against central differences of the loss along
// u = g/|g| (must give |g|) and along a random unit u (must give g·u, about |g|/√n), each
// compared relative to that directional value D itself. The bound is the arithmetic's:
//
//   The loss is a float: per-position fp32 cross-entropies summed in double, the mean rounded
//   once to fp32 (model.cpp), so a computed loss is within ρ of the exact-arithmetic loss, with
//   ρ = 2 ulp(L): half an ulp from the final rounding and 1.5 ulp allowed for the fp32 forward's
//   roundings (measured: over steps of 2e-4 the loss's noise has a standard deviation of about
//   ulp/√12, the final rounding's alone). The weights are floats too: fl(w ± εu) moves each
//   element by a rounded amount, so the expected value is g·(w⁺ − w⁻)/2ε with those floats'
//   actual differences (exact in double), not g·u.
//   Central difference at step ε: F(ε) = D + a·ε² + b·ε⁴ + N(ε), a = (third derivative of L
//   along u)/6, |N(ε)| ≤ 2ρ/2ε = ρ/ε. Richardson: R = (4·F(ε/2) − F(ε))/3 = D − b·ε⁴/4 + noise,
//   the noise at most (4·2ρ/ε + ρ/ε)/3 = 3ρ/ε. The remaining truncation is bounded by the
//   standard Richardson estimate |F(ε) − F(ε/2)|/3 (≈ |a|ε²/4, the error of F(ε/2) itself,
//   which exceeds |b|ε⁴/4 while the series converges, |b|ε² < |a|; it carries ≤ ρ/ε of noise).
//   So |R − D| ≤ |F(ε) − F(ε/2)|/3 + 3ρ/ε. The analytic g's own fp32 rounding (a relative
//   ~1e-6 here) is negligible beside these.
//   ε = 2e-3/|D| moves the loss by ~2e-3 (≈ 4000 ulp), so the noise term is ~0.15% of D;
//   clamped to [1e-3, 0.1]: above 0.1 the truncation along the embedding's random direction
//   is too large for the estimate (measured: F(0.2) 24% off, F(0.1) 6%, R(0.1) 0.2%).
// A random direction with |D| below |g|/(2√n) (a draw nearly orthogonal to g, whose loss change
// the rounding would swamp) is drawn again. Measured bound/|D|: ≤ 0.5% along the gradient of
// every weight matrix (≤ 4.4% for the q/k biases, |g| ~ 7e-4), ≤ 0.7% along a random direction
// for the embedding, lm_head, o_proj and v_proj, ≤ 4% for the MLP and most norms; it is the
// loss's resolution 3ρ/ε ≈ 3e-5 (up to ~35% of D) only where D itself is ~1e-4 (along a random
// direction: q/k projections and biases, a post-attention norm). |R − D| stays below 0.28 of the
// bound in every check, under OPENBLAS_CORETYPE Haswell, SkylakeX and Zen, TRAINMEM_CPU_GEMM auto
// and generic, 1 or 3 threads. The embedding's gradient scaled by 1.01 fails along both directions,
// in every family.
// The check above for every trained tensor of `name` under `base` (its attention set here);
// `lora`: the LoRA step, whose B starts at zero (then dA is zero): B is drawn like the other
// matrices, 0.02·N(0,1), so that every adapter has a gradient.
constexpr float kMoeRouterScale = 10.0f;
constexpr double kMoeMaxStep = 3e-3;
constexpr double kMoeLossMove = 4e-4;
void check_every_gradient(const std::string& name, TrainConfig base, bool lora) {
  // The MoE families are presets (tiny-mixtral, tiny-qwen3-moe, tiny-qwen2-moe-all); the dense
  // ones built here.
  const bool moe =
      name.find("mixtral") != std::string::npos || name.find("moe") != std::string::npos;
  ModelConfig m = moe ? any_config(name) : family_config(name);
  // Qwen2-MoE's shared expert on two of its six layers: the run stays short. A model with dense
  // layers among MoE ones keeps three (tiny-qwen2-moe: dense, MoE, dense).
  if (moe) {
    m.layers = std::min<std::int64_t>(m.layers, m.moe_layer_count() < m.layers ? 3 : 2);
    auto& dense = m.mlp_only_layers;
    dense.erase(
        std::remove_if(dense.begin(), dense.end(), [&](std::int64_t l) { return l >= m.layers; }),
        dense.end());
  }
  // s = 13 exceeds the windows (5, 6): windowed layers mask keys.
  for (Attention at : {Attention::eager, Attention::flash}) {
    SCOPED_TRACE(attention_name(at));
    TrainConfig t = base;
    t.attention = at;
    LossAt loss(m, t, name + "_fd.safetensors");
    loss.run.model->random_tokens(3);
    Values w0 = varied_weights(*loss.run.model, 21);
    // A mixture of experts routes by a top-K: the loss is smooth only while no perturbation
    // changes an expert choice. The router's weights scaled by kMoeRouterScale spread its logits
    // (std ~ 0.02·10·√h ≈ 1.4 instead of 0.14), so the K-th and the next probability stand
    // apart, and the steps move the loss by kMoeLossMove (not 2e-3), capped at kMoeMaxStep (a
    // logit moves by ~0.003 at most): the rounding's share of the bound grows up to 30-fold.
    if (m.moe())
      for (auto& [pname, x] : w0)
        if (pname.find(".mlp.gate.weight") != std::string::npos)
          for (auto& e : x) e *= kMoeRouterScale;
    if (lora) {
      std::mt19937_64 bgen(5);
      std::normal_distribution<float> b01(0.f, 1.f);
      for (auto& [pname, x] : w0)
        if (pname.find(".lora_B.") != std::string::npos)
          for (auto& e : x) e += 0.02f * b01(bgen);
    }
    GradMap g;
    const float L0 = loss(w0, &g);
    EXPECT_TRUE(std::isfinite(L0));
    // A mixture of experts: the routing at w0, layer by layer. A perturbed evaluation whose
    // routing differs crossed a point where the loss jumps; its difference quotient means
    // nothing, so the check retries with steps a quarter as long (three times), and is counted
    // as skipped when every try crosses.
    auto fingerprints = [&] {
      std::vector<std::uint64_t> f;
      for (const auto& r : loss.run.model->routing()) f.push_back(r.fingerprint);
      return f;
    };
    const std::vector<std::uint64_t> routed = fingerprints();
    ASSERT_EQ(routed.size(), m.moe() ? std::size_t(m.layers) : 0u);
    int checked = 0, skipped = 0;
    std::size_t trained = 0;
    for (const auto& p : loss.run.model->parameters()) trained += p.trainable ? 1 : 0;
    ASSERT_EQ(g.size(), trained);
    if (lora) {  // only the adapters: A and B of each target in every layer
      ASSERT_EQ(trained, std::size_t(2 * m.layers * __builtin_popcount(t.lora_targets)));
      for (const auto& [pname, grad] : g)
        EXPECT_NE(pname.find(".lora_"), std::string::npos) << pname << " was trained";
    }
    std::mt19937_64 gen(99);
    std::normal_distribution<double> n01(0.0, 1.0);
    for (const auto& p : loss.run.model->parameters()) {
      if (!p.trainable) continue;
      const std::vector<float>& gp = g.at(p.name);
      const std::size_t n = gp.size();
      double norm = 0;
      for (float x : gp) norm += double(x) * x;
      norm = std::sqrt(norm);
      ASSERT_GT(norm, 0.0) << p.name << ": zero gradient";
      for (int dir = 0; dir < 2; ++dir) {
        std::vector<double> u(n);
        double Du = 0;  // g·u
        for (int draw = 0; draw < 20; ++draw) {
          double rn = 0, dot = 0;
          for (std::size_t e = 0; e < n; ++e) {
            u[e] = dir == 0 ? gp[e] : n01(gen);
            rn += u[e] * u[e];
          }
          rn = std::sqrt(rn);
          for (std::size_t e = 0; e < n; ++e) dot += (u[e] /= rn) * gp[e];
          Du = dot;
          if (dir == 0 || std::fabs(dot) >= norm / (2 * std::sqrt(double(n)))) break;
        }
        double eps = m.moe() ? std::clamp(kMoeLossMove / std::fabs(Du), 1e-4, kMoeMaxStep)
                             : std::clamp(2e-3 / std::fabs(Du), 1e-3, 0.1);
        double rho = 0;        // 2 ulp of the largest loss seen
        bool crossed = false;  // an evaluation routed differently from w0
        // The central difference at step e, and in *want the value it must give for the
        // weights as rounded to floats.
        auto central = [&](double e, double* want) {
          Values plus = w0, minus = w0;
          double w = 0;
          for (std::size_t k = 0; k < n; ++k) {
            const float x = w0.at(p.name)[k];
            plus[p.name][k] = float(double(x) + e * u[k]);
            minus[p.name][k] = float(double(x) - e * u[k]);
            w += double(gp[k]) * (double(plus[p.name][k]) - double(minus[p.name][k]));
          }
          *want = w / (2 * e);
          const float lp = loss(plus);
          crossed = crossed || fingerprints() != routed;
          const float lm = loss(minus);
          crossed = crossed || fingerprints() != routed;
          for (float l : {lp, lm}) {
            const float a = std::fabs(l);
            rho = std::max(rho, 2.0 * double(std::nextafter(a, INFINITY) - a));
          }
          return (double(lp) - double(lm)) / (2 * e);
        };
        double want1 = 0, want2 = 0, f1 = 0, f2 = 0;
        for (int tries = 0;; ++tries) {
          crossed = false;
          f1 = central(eps, &want1);
          f2 = central(eps / 2, &want2);
          if (!crossed || tries == 3) break;
          eps /= 4;
        }
        if (crossed) {
          ++skipped;
          continue;
        }
        ++checked;
        const double richardson = (4 * f2 - f1) / 3, want = (4 * want2 - want1) / 3;
        const double bound = std::fabs(f1 - f2) / 3 + 3 * rho / eps;
        EXPECT_NEAR(richardson, want, bound)
            << p.name << (dir == 0 ? " along its gradient" : " along a random direction")
            << ": |g| " << norm << ", eps " << eps << ", F(eps) " << f1 << ", F(eps/2) " << f2;
      }
    }
    // Every routing crossing is the data's, not the code's: few, and said.
    EXPECT_LE(skipped * 10, checked) << skipped << " checks crossed a routing change";
    if (m.moe())
      std::printf("[fd] %s %s: %d directional checks, %d skipped (routing changed)\n", name.c_str(),
                  attention_name(at), checked, skipped);
  }
}

TEST_P(FamilyGradients, MatchFiniteDifferencesForEveryTensor) {
  check_every_gradient(
      GetParam(),
      train_config(2, 13, DType::f32, Optimizer::sgd, Checkpointing::none, Attention::eager),
      false);
}

// LoRA (issue 28) on every projection at rank 3, alpha 5 (scaling 5/3, not 1): the gradients
// of each adapter's A and B through the frozen base, by the same bound. The base weights get
// none (the count above).
TEST_P(FamilyGradients, LoraAdaptersMatchFiniteDifferences) {
  TrainConfig t =
      train_config(2, 13, DType::f32, Optimizer::sgd, Checkpointing::none, Attention::eager);
  t.lora_rank = 3;
  t.lora_targets = 0x7f;
  t.lora_alpha = 5.0f;
  check_every_gradient(GetParam(), t, true);
}

// LoRA dropout p 0.3 (issue 28): under one step's masks the loss is a smooth function of the
// adapters again, and their gradients (A's from the dropped input, dx through the mask) match its
// finite differences by the same bound. Two families: the path is the same in every one.
TEST(FamilyGradientsDropout, LoraDropoutAdaptersMatchFiniteDifferences) {
  for (const char* name : {"tiny-qwen2", "tiny-llama3"}) {
    SCOPED_TRACE(name);
    TrainConfig t =
        train_config(2, 13, DType::f32, Optimizer::sgd, Checkpointing::none, Attention::eager);
    t.lora_rank = 3;
    t.lora_targets = 0x7f;
    t.lora_alpha = 5.0f;
    t.lora_dropout = 0.3f;
    check_every_gradient(name, t, true);
  }
}

// Mixture of experts (issue 29): the router (through its softmax, top-K and renormalisation, and
// with tiny-mixtral-aux the load-balancing loss's term),
// each expert's three matrices (their slices of gate_up_proj and down_proj) and the rest, by the
// same bound; b·s·K = 52 choices reach every expert, so no expert's gradient is zero;
// tiny-qwen2-moe keeps a dense layer on either side of its MoE one.
TEST(FamilyGradientsMoe, MatchFiniteDifferencesForEveryTensor) {
  for (const char* name : {"tiny-mixtral", "tiny-qwen3-moe", "tiny-qwen2-moe-all",
                           "tiny-mixtral-aux", "tiny-qwen2-moe"}) {
    SCOPED_TRACE(name);
    check_every_gradient(
        name,
        train_config(2, 13, DType::f32, Optimizer::sgd, Checkpointing::none, Attention::eager),
        false);
  }
  // --capacity-factor 0.6: ⌈52/5·0.6⌉ = 7 rows per expert for 10.4 choices on average, so that
  // choices are dropped (their weight's gradient 0, the others' through the renormalisation).
  SCOPED_TRACE("tiny-mixtral, capacity factor 0.6");
  TrainConfig t =
      train_config(2, 13, DType::f32, Optimizer::sgd, Checkpointing::none, Attention::eager);
  t.capacity_factor = 0.6;
  check_every_gradient("tiny-mixtral", t, false);
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyGradients, testing::ValuesIn(family_names()),
                         [](const testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (auto& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

struct Run2 {
  float loss1 = 0, loss2 = 0;
  GradMap grads1, grads2;
};

Run2 two_steps(const ModelConfig& m, const TrainConfig& t) {
  ModelRun run(BackendKind::cpu, m, t);
  const Values v = varied_weights(*run.model, 7);
  const std::string path = temp_path(m.name + "_ckpt.safetensors");
  write_weights(path, *run.model, v);
  run.model->load_weights(path);
  std::filesystem::remove(path);
  run.model->random_tokens(3);
  Run2 r;
  r.loss1 = run.model->train_step(capture_into(r.grads1));
  r.loss2 = run.model->train_step(capture_into(r.grads2));
  return r;
}

TEST(ModelFamilies, CheckpointingChangesNoBitOfLossOrGradients) {
  // The recompute redoes the biases, the q/k norms, the windows and the scaled RoPE.
  for (const std::string& name : family_names())
    for (DType dt : {DType::f32, DType::bf16})
      for (Attention at : {Attention::eager, Attention::flash}) {
        SCOPED_TRACE(name + " " + dtype_name(dt) + " " + attention_name(at));
        const ModelConfig m = family_config(name);
        const Optimizer o = dt == DType::f32 ? Optimizer::adamw : Optimizer::lomo;
        const auto off = two_steps(m, train_config(2, 11, dt, o, Checkpointing::none, at));
        const auto on = two_steps(m, train_config(2, 11, dt, o, Checkpointing::full, at));
        EXPECT_EQ(std::memcmp(&off.loss1, &on.loss1, 4), 0) << off.loss1 << " vs " << on.loss1;
        EXPECT_EQ(std::memcmp(&off.loss2, &on.loss2, 4), 0) << off.loss2 << " vs " << on.loss2;
        ASSERT_EQ(off.grads1.size(), on.grads1.size());
        for (const auto& [pname, gr] : off.grads1) {
          const auto& o1 = on.grads1.at(pname);
          EXPECT_TRUE(gr.size() == o1.size() &&
                      std::memcmp(gr.data(), o1.data(), gr.size() * 4) == 0)
              << "step 1 " << pname;
          const auto& a2 = off.grads2.at(pname);
          const auto& b2 = on.grads2.at(pname);
          EXPECT_TRUE(a2.size() == b2.size() &&
                      std::memcmp(a2.data(), b2.data(), a2.size() * 4) == 0)
              << "step 2 " << pname;
        }
      }
}

TEST(ModelFamilies, CpuLedgerEqualsMetaLedgerEventForEvent) {
  for (const std::string& name : family_names())
    for (Optimizer o : {Optimizer::adamw, Optimizer::lomo})
      for (Checkpointing c : {Checkpointing::none, Checkpointing::full}) {
        SCOPED_TRACE(name + " " + optimizer_name(o) + " " + checkpointing_name(c));
        const ModelConfig m = family_config(name);
        const TrainConfig t =
            train_config(2, 9, DType::bf16, o, c,
                         c == Checkpointing::full ? Attention::flash : Attention::eager);
        ModelRun cpu(BackendKind::cpu, m, t);
        ModelRun meta(BackendKind::meta, m, t);
        for (ModelRun* r : {&cpu, &meta}) {
          r->model->init_random(1);
          r->model->random_tokens(2);
          r->model->train_step();
          r->model->train_step();
        }
        const auto& ce = cpu.ledger->timeline();
        const auto& me = meta.ledger->timeline();
        ASSERT_EQ(cpu.ledger->dropped_events(), 0u);
        ASSERT_EQ(ce.size(), me.size());
        std::map<std::uint64_t, const TensorRecord*> cr, mr;
        for (const auto& r : cpu.ledger->tensors()) cr[r.id] = &r;
        for (const auto& r : meta.ledger->tensors()) mr[r.id] = &r;
        for (std::size_t j = 0; j < ce.size(); ++j) {
          const auto* a = cr.at(ce[j].tensor_id);
          const auto* b = mr.at(me[j].tensor_id);
          ASSERT_TRUE(ce[j].delta == me[j].delta && ce[j].phase == me[j].phase &&
                      ce[j].layer == me[j].layer && a->name == b->name && a->shape == b->shape &&
                      ce[j].live_total == me[j].live_total)
              << "event " << j << ": cpu " << a->name << " | meta " << b->name;
        }
        EXPECT_EQ(cpu.ledger->peak_total().bytes, meta.ledger->peak_total().bytes);
      }
}

}  // namespace
