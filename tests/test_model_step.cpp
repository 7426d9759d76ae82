// The training step's invariants: checkpointing changes memory, not numbers (bitwise on the
// cpu backend); eager and flash attention agree; the meta backend's ledger is the cpu
// backend's, event for event; LOMO's gradients and memory; the constant categories against
// independent formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "model_helpers.hpp"

using namespace trainmem;
using namespace trainmem::test;

namespace {

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

struct TwoSteps {
  float loss1 = 0, loss2 = 0;
  GradMap grads1, grads2;
  std::map<std::string, std::vector<float>> params_after;
};

TwoSteps run_two_steps(const ModelConfig& m, const TrainConfig& t,
                       const OptimizerSettings* settings = nullptr) {
  ModelRun run(BackendKind::cpu, m, t, settings);
  run.model->init_random(7);
  run.model->random_tokens(3);
  TwoSteps r;
  r.loss1 = run.model->train_step(capture_into(r.grads1));
  r.loss2 = run.model->train_step(capture_into(r.grads2));
  for (const auto& p : run.model->parameters())
    r.params_after[p.name] = run.model->parameter_values(p.name);
  return r;
}

// ------------------------------------------------------------------------------ checkpointing

struct CkptCase {
  std::string preset;
  DType dtype;
  Attention attention;
  Optimizer optimizer;
};

class CheckpointingBitwise : public testing::TestWithParam<CkptCase> {};

TEST_P(CheckpointingBitwise, SameLossGradientsAndWeightsAsWithout) {
  const auto& c = GetParam();
  const ModelConfig m = preset(c.preset);
  const auto off =
      run_two_steps(m, train_config(2, 13, c.dtype, c.optimizer, Checkpointing::none, c.attention));
  const auto on =
      run_two_steps(m, train_config(2, 13, c.dtype, c.optimizer, Checkpointing::full, c.attention));
  EXPECT_EQ(std::memcmp(&off.loss1, &on.loss1, 4), 0) << off.loss1 << " vs " << on.loss1;
  EXPECT_EQ(std::memcmp(&off.loss2, &on.loss2, 4), 0) << off.loss2 << " vs " << on.loss2;
  EXPECT_NE(off.loss1, off.loss2);  // the optimizer did something
  ASSERT_EQ(off.grads1.size(), on.grads1.size());
  for (const auto& [name, g] : off.grads1) {
    EXPECT_TRUE(bitwise_equal(g, on.grads1.at(name))) << "step 1 gradient " << name;
    EXPECT_TRUE(bitwise_equal(off.grads2.at(name), on.grads2.at(name))) << "step 2 " << name;
    EXPECT_TRUE(bitwise_equal(off.params_after.at(name), on.params_after.at(name))) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Model, CheckpointingBitwise,
    testing::Values(CkptCase{"tiny-gqa", DType::f32, Attention::eager, Optimizer::adamw},
                    CkptCase{"tiny-gqa", DType::bf16, Attention::flash, Optimizer::adamw},
                    CkptCase{"tiny-tied", DType::f16, Attention::eager, Optimizer::lomo},
                    CkptCase{"tiny-awkward", DType::f32, Attention::flash, Optimizer::sgd}),
    [](const testing::TestParamInfo<CkptCase>& i) {
      std::string n = i.param.preset + "_" + dtype_name(i.param.dtype) + "_" +
                      attention_name(i.param.attention) + "_" + optimizer_name(i.param.optimizer);
      std::replace(n.begin(), n.end(), '-', '_');
      return n;
    });

// ------------------------------------------------------------------------------ eager vs flash

TEST(Model, EagerAndFlashAttentionAgree) {
  // Stated tolerance: loss within 1e-5 relative; gradients within 1e-4·|ref| + 1e-5·max|ref|.
  for (const char* name : {"tiny-gqa", "tiny-awkward"}) {
    const ModelConfig m = preset(name);
    const auto eager = run_two_steps(m, train_config(3, 17, DType::f32, Optimizer::adamw,
                                                     Checkpointing::none, Attention::eager));
    const auto flash = run_two_steps(m, train_config(3, 17, DType::f32, Optimizer::adamw,
                                                     Checkpointing::none, Attention::flash));
    // Both fp32: softmax sums of s terms in another order (~s·u ~ 1e-6 relative per
    // probability), the loss averages them: ~1e-6, 1e-5 is 10x.
    EXPECT_NEAR(eager.loss1, flash.loss1, 1e-5 * std::abs(eager.loss1)) << name;
    EXPECT_NEAR(eager.loss2, flash.loss2, 1e-5 * std::abs(eager.loss2)) << name;
    for (const auto& [pname, g] : eager.grads1) {
      double mx = 0;
      for (float v : g) mx = std::max(mx, double(std::abs(v)));
      const Diff d = compare(flash.grads1.at(pname), g, 1e-5 * mx, 1e-4);
      EXPECT_LT(d.first_bad, 0) << name << " " << pname << " max abs " << d.max_abs;
    }
  }
}

// ------------------------------------------------------------------------------ meta == cpu

struct LedgerCase {
  std::string preset;
  DType dtype;
  Optimizer optimizer;
  Checkpointing checkpointing;
  Attention attention;
};

class MetaLedger : public testing::TestWithParam<LedgerCase> {};

TEST_P(MetaLedger, EqualsCpuLedgerEventForEvent) {
  const auto& c = GetParam();
  const ModelConfig m = preset(c.preset);
  const TrainConfig t = train_config(2, 11, c.dtype, c.optimizer, c.checkpointing, c.attention);
  ModelRun cpu(BackendKind::cpu, m, t);
  ModelRun meta(BackendKind::meta, m, t);
  cpu.model->init_random(1);
  cpu.model->random_tokens(2);
  meta.model->init_random(1);
  meta.model->random_tokens(2);
  for (int step = 0; step < 2; ++step) {
    cpu.model->train_step();
    const float meta_loss = meta.model->train_step();
    EXPECT_TRUE(std::isnan(meta_loss));
  }
  const auto& ce = cpu.ledger->timeline();
  const auto& me = meta.ledger->timeline();
  ASSERT_EQ(cpu.ledger->dropped_events(), 0u);
  ASSERT_EQ(ce.size(), me.size());
  ASSERT_GT(ce.size(), 100u);
  std::map<std::uint64_t, const TensorRecord*> cpu_rec, meta_rec;
  for (const auto& r : cpu.ledger->tensors()) cpu_rec[r.id] = &r;
  for (const auto& r : meta.ledger->tensors()) meta_rec[r.id] = &r;
  for (std::size_t i = 0; i < ce.size(); ++i) {
    const auto& a = ce[i];
    const auto& b = me[i];
    const auto* ra = cpu_rec.at(a.tensor_id);
    const auto* rb = meta_rec.at(b.tensor_id);
    ASSERT_TRUE(a.seq == b.seq && a.delta == b.delta && a.category == b.category &&
                a.layer == b.layer && a.phase == b.phase && ra->name == rb->name &&
                ra->shape == rb->shape && ra->dtype == rb->dtype && a.live_total == b.live_total)
        << "event " << i << ": cpu " << ra->name << " " << a.delta << " "
        << category_name(a.category) << " layer " << a.layer << " " << phase_name(a.phase)
        << " | meta " << rb->name << " " << b.delta << " " << category_name(b.category) << " layer "
        << b.layer << " " << phase_name(b.phase);
  }
  EXPECT_EQ(cpu.ledger->peak_total().bytes, meta.ledger->peak_total().bytes);
  EXPECT_EQ(cpu.ledger->activations_end_of_forward(), meta.ledger->activations_end_of_forward());
}

INSTANTIATE_TEST_SUITE_P(Model, MetaLedger,
                         testing::Values(LedgerCase{"tiny", DType::bf16, Optimizer::adamw,
                                                    Checkpointing::none, Attention::eager},
                                         LedgerCase{"tiny-gqa", DType::f32, Optimizer::sgd,
                                                    Checkpointing::full, Attention::flash},
                                         LedgerCase{"tiny-tied", DType::bf16, Optimizer::lomo,
                                                    Checkpointing::full, Attention::eager},
                                         LedgerCase{"tiny-awkward", DType::f16, Optimizer::lomo,
                                                    Checkpointing::none, Attention::flash},
                                         LedgerCase{"tiny-tied", DType::f32, Optimizer::adamw,
                                                    Checkpointing::none, Attention::flash}),
                         [](const testing::TestParamInfo<LedgerCase>& i) {
                           std::string n = i.param.preset + "_" + dtype_name(i.param.dtype) + "_" +
                                           optimizer_name(i.param.optimizer) + "_" +
                                           checkpointing_name(i.param.checkpointing) + "_" +
                                           attention_name(i.param.attention);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// ------------------------------------------------------------------------------ LOMO

// Independent of the model: element counts from the HF shapes.
std::vector<std::uint64_t> hf_param_elements(const ModelConfig& m) {
  const std::uint64_t V = m.vocab, h = m.hidden, i = m.intermediate,
                      kd = std::uint64_t(m.kv_heads) * (m.hidden / m.heads);
  std::vector<std::uint64_t> e = {V * h};
  for (int l = 0; l < m.layers; ++l) {
    for (std::uint64_t x : {h, h * h, kd * h, kd * h, h * h, h, i * h, i * h, h * i})
      e.push_back(x);
  }
  e.push_back(h);
  if (!m.tied_embeddings) e.push_back(V * h);
  return e;
}

TEST(Model, LomoGradientPeakIsTheLargestSingleGradient) {
  for (const char* name : {"tiny-gqa", "tiny-tied", "tiny-awkward"}) {
    const ModelConfig m = preset(name);
    for (DType dt : {DType::f32, DType::bf16}) {
      ModelRun run(BackendKind::meta, m,
                   train_config(2, 8, dt, Optimizer::lomo, Checkpointing::none, Attention::eager));
      auto elems = hf_param_elements(m);
      const std::uint64_t w = dtype_size(dt);
      std::uint64_t expect;
      if (m.tied_embeddings) {  // embedding gradient alive from the head to the end + one more
        expect = (elems[0] + *std::max_element(elems.begin() + 1, elems.end())) * w;
      } else {
        expect = *std::max_element(elems.begin(), elems.end()) * w;
      }
      EXPECT_EQ(run.ledger->live(Category::gradients), 0u);  // nothing at setup
      for (int step = 1; step <= 2; ++step) {
        run.model->train_step();
        EXPECT_EQ(run.ledger->peak(Category::gradients), expect) << name << " step " << step;
        EXPECT_EQ(run.ledger->live(Category::gradients), 0u);
        EXPECT_EQ(run.ledger->live(Category::optimizer_states), 0u);
      }
    }
  }
}

TEST(Model, LomoComputesAdamWsFirstGradientsAndAppliesSgdInBackward) {
  for (const char* name : {"tiny-gqa", "tiny-tied"}) {
    const ModelConfig m = preset(name);
    const auto adamw = run_two_steps(
        m, train_config(2, 9, DType::f32, Optimizer::adamw, Checkpointing::none, Attention::eager));
    ModelRun lomo(
        BackendKind::cpu, m,
        train_config(2, 9, DType::f32, Optimizer::lomo, Checkpointing::none, Attention::eager));
    lomo.model->init_random(7);
    lomo.model->random_tokens(3);
    std::map<std::string, std::vector<float>> before;
    for (const auto& p : lomo.model->parameters())
      before[p.name] = lomo.model->parameter_values(p.name);
    GradMap g;
    const float loss = lomo.model->train_step(capture_into(g));
    EXPECT_EQ(loss, adamw.loss1);
    const float lr = lomo.model->optimizer().settings().lomo_lr;
    ASSERT_EQ(g.size(), adamw.grads1.size());
    for (const auto& [pname, grad] : g) {
      // Updates inside backward do not change later gradients: each weight is updated only
      // after its last use.
      EXPECT_TRUE(bitwise_equal(grad, adamw.grads1.at(pname))) << pname;
      const auto after = lomo.model->parameter_values(pname);
      const auto& w0 = before.at(pname);
      for (std::size_t e = 0; e < w0.size(); ++e)
        // fl(w0 - fl(lr·g)) in fp32: u = 6e-8 of |after| ~ |w0| (lr·g is far smaller) plus u of
        // lr·g: 1e-7·|w0|; 1e-12 absolute so w0 = 0 does not demand bit equality.
        ASSERT_NEAR(after[e], w0[e] - lr * grad[e], 1e-7 * std::abs(w0[e]) + 1e-12)
            << pname << " element " << e;
    }
  }
}

// ------------------------------------------------------------------------------ constant books

TEST(Model, ConstantCategoriesMatchParameterCountFormulas) {
  struct C {
    const char* preset;
    DType dt;
    Optimizer o;
    std::uint64_t state_bytes_per_param;  // docs/design.md: AdamW 12 (8 in fp32), SGD 4 (0), LOMO 0
    bool holds_gradients;
  };
  for (const C& c : {C{"tiny-gqa", DType::bf16, Optimizer::adamw, 12, true},
                     C{"tiny-gqa", DType::f32, Optimizer::adamw, 8, true},
                     C{"tiny-tied", DType::f16, Optimizer::sgd, 4, true},
                     C{"tiny-tied", DType::f32, Optimizer::sgd, 0, true},
                     C{"tiny-awkward", DType::bf16, Optimizer::lomo, 0, false}}) {
    const ModelConfig m = preset(c.preset);
    const std::int64_t b = 3, s = 10;
    ModelRun run(BackendKind::meta, m,
                 train_config(b, s, c.dt, c.o, Checkpointing::none, Attention::eager));
    run.model->train_step();
    std::uint64_t P = 0;
    for (auto e : hf_param_elements(m)) P += e;
    ASSERT_EQ(P, m.param_count()) << c.preset;
    const std::uint64_t w = dtype_size(c.dt);
    EXPECT_EQ(run.ledger->live(Category::params), P * w);
    EXPECT_EQ(run.ledger->peak(Category::params), P * w);
    EXPECT_EQ(run.ledger->live(Category::optimizer_states), P * c.state_bytes_per_param);
    if (c.holds_gradients) {
      EXPECT_EQ(run.ledger->peak(Category::gradients), P * w);
    }
    EXPECT_EQ(run.ledger->live(Category::inputs), std::uint64_t(2 * b * s * 4));
    // Only persistent things remain alive after the step.
    EXPECT_EQ(run.ledger->live(Category::activations), 0u);
    EXPECT_EQ(run.ledger->live(Category::workspace), 32ull << 20);
  }
}

}  // namespace

// ------------------------------------------------------------------------------ workspace

namespace {

// A meta backend that records set_gemm_workspace calls and what the ledger held then.
class WorkspaceRecorder final : public Backend {
 public:
  explicit WorkspaceRecorder(DType dt) : Backend(dt), inner_(make_meta_backend(dt)) {}
  struct Call {
    void* ptr;
    std::uint64_t bytes;
    std::uint64_t workspace_live;
  };
  std::vector<Call> calls;
  const Ledger* ledger = nullptr;

  BackendKind kind() const override { return BackendKind::meta; }
  Allocator& allocator() override { return inner_->allocator(); }
  bool computes() const override { return false; }
  void set_gemm_workspace(void* ptr, std::uint64_t bytes) override {
    calls.push_back({ptr, bytes, ledger ? ledger->live(Category::workspace) : 0});
  }
  void upload(void*, const void*, std::uint64_t) override {}
  void download(void*, const void*, std::uint64_t) override {}
  void fill_zero(void*, std::uint64_t) override {}
  void copy(void*, const void*, std::uint64_t) override {}
  void embedding_forward(void*, const std::int32_t*, const void*, std::int64_t, std::int64_t,
                         std::int64_t, std::int64_t) override {}
  void embedding_backward(void*, const void*, const std::int32_t*, std::int64_t, std::int64_t,
                          std::int64_t, std::int64_t) override {}
  void rmsnorm_forward(void*, float*, const void*, const void*, std::int64_t, std::int64_t,
                       float) override {}
  void rmsnorm_backward(void*, void*, const void*, const void*, const void*, const float*,
                        std::int64_t, std::int64_t) override {}
  void matmul(void*, const void*, const void*, std::int64_t, std::int64_t, std::int64_t, Trans,
              Trans, float, float) override {}
  void bias_forward(void*, const void*, std::int64_t, std::int64_t) override {}
  void bias_backward(void*, const void*, std::int64_t, std::int64_t) override {}
  void rope_forward(void*, void*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                    std::int64_t, const RopeSpec&) override {}
  void rope_backward(void*, void*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                     std::int64_t, const RopeSpec&) override {}
  void attention_forward(void*, void*, float*, const void*, const void*, const void*, std::int64_t,
                         std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         Attention) override {}
  void attention_backward(void*, void*, void*, void*, float*, const void*, const void*, const void*,
                          const void*, const void*, const void*, const float*, std::int64_t,
                          std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                          Attention) override {}
  void swiglu_forward(void*, const void*, const void*, std::int64_t) override {}
  void swiglu_backward(void*, void*, const void*, const void*, const void*, std::int64_t) override {
  }
  void cross_entropy_forward(float*, float*, const void*, const std::int32_t*, std::int64_t,
                             std::int64_t) override {}
  void cross_entropy_backward(void*, const void*, const float*, const std::int32_t*, std::int64_t,
                              std::int64_t, float) override {}
  void adamw_update(void*, const void*, float*, float*, float*, std::int64_t, const AdamWParams&,
                    int, float) override {}
  void sgd_update(void*, const void*, float*, std::int64_t, float, float) override {}
  void bnb_adamw8bit_tables(float*, float*, std::uint8_t*, std::uint8_t*) override {}
  void bnb_adamw8bit_update(void*, const void*, std::uint8_t*, std::uint8_t*, float*, float*,
                            const float*, const float*, const std::uint8_t*, const std::uint8_t*,
                            std::int64_t, const BnbAdamWParams&, int) override {}
  void bnb_adamw32_update(void*, const void*, float*, float*, std::int64_t, const BnbAdamWParams&,
                          int) override {}
  void quant4_tables(float*, float*, std::uint8_t*, Quant4Type) override {}
  void quantize_4bit(std::uint8_t*, float*, const void*, std::int64_t, std::int64_t,
                     Quant4Type) override {}
  void dequantize_4bit(void*, const std::uint8_t*, const float*, std::int64_t, std::int64_t,
                       Quant4Type, bool) override {}
  void quantize_blockwise8(std::uint8_t*, float*, const float*, float, std::int64_t, std::int64_t,
                           const std::uint8_t*) override {}
  void dequantize_blockwise8(float*, const std::uint8_t*, const float*, const float*, std::int64_t,
                             std::int64_t, float) override {}
  void quantize_int8(std::int8_t*, float*, const void*, std::int64_t, std::int64_t) override {}
  void dequantize_int8(void*, const std::int8_t*, const float*, std::int64_t,
                       std::int64_t) override {}
  float double_quant_offset(const float*, std::int64_t) override { return 0.0f; }
  void dropout_mask(std::uint8_t*, std::int64_t, float, std::uint64_t, std::uint64_t) override {}
  void dropout_apply(void*, const void*, const std::uint8_t*, std::int64_t, float, bool) override {}
  void moe_route(float*, std::int32_t*, float*, std::int32_t*, std::int32_t*, const void*,
                 std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool) override {}
  void moe_route_backward(void*, const float*, const float*, const std::int32_t*, const float*,
                          std::int64_t, std::int64_t, std::int64_t, bool) override {}
  void moe_permute(void*, const void*, const std::int32_t*, std::int64_t, std::int64_t,
                   std::int64_t) override {}
  void moe_combine(void*, const void*, const void*, const float*, const std::int32_t*, std::int64_t,
                   std::int64_t, std::int64_t) override {}
  void moe_combine_backward(void*, float*, const void*, const void*, const float*,
                            const std::int32_t*, std::int64_t, std::int64_t,
                            std::int64_t) override {}
  void moe_gate_add(void*, const void*, const void*, std::int64_t, std::int64_t) override {}
  void moe_gate_backward(void*, void*, const void*, const void*, const void*, std::int64_t,
                         std::int64_t) override {}
  void check_finite(const void*, std::int64_t) override {}
  bool take_nonfinite() override { return false; }
  void attention_ring_forward(float*, float*, const void*, const void*, const void*, std::int64_t,
                              std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                              std::int64_t, SeqPositions, SeqPositions, bool) override {}
  void attention_ring_backward(float*, float*, float*, float*, const void*, const void*,
                               const void*, const void*, const void*, const float*, std::int64_t,
                               std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                               std::int64_t, SeqPositions, SeqPositions, bool) override {}
  void round_from_f32(void*, const float*, std::int64_t) override {}

 private:
  std::unique_ptr<Backend> inner_;
};

}  // namespace

TEST(Model, GemmWorkspaceIsHandedBackBeforeItIsReleased) {
  WorkspaceRecorder be(DType::bf16);
  Ledger ledger(be.allocator());
  be.ledger = &ledger;
  {
    LlamaModel model(
        preset("tiny"),
        train_config(1, 8, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::eager),
        be, ledger, default_optimizer_settings(Optimizer::adamw));
    model.train_step();
    ASSERT_EQ(be.calls.size(), 1u);
    EXPECT_NE(be.calls[0].ptr, nullptr);
    EXPECT_EQ(be.calls[0].bytes, 32ull << 20);
  }
  ASSERT_EQ(be.calls.size(), 2u);
  EXPECT_EQ(be.calls[1].ptr, nullptr);
  EXPECT_EQ(be.calls[1].bytes, 0u);
  EXPECT_EQ(be.calls[1].workspace_live, 32ull << 20);  // still allocated at that moment
  EXPECT_EQ(ledger.live(Category::workspace), 0u);     // and released after
}
