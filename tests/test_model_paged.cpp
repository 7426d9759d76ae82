// bitsandbytes' paged optimizers in trainmem's own step (issue 28; docs/formulas.md, "Paged
// optimizers in the native step"): the states of a tensor of 100,000 elements or more live in a
// second ledger (CUDA managed memory on cuda), the rest where AdamW8bit keeps them. The meta
// trace's two ledgers against the closed form, the managed bytes against a count written here
// from the parameter list, the cpu ledgers against the meta trace, and the step's arithmetic
// against the unpaged optimizer (the placement changes no bit).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "family_configs.hpp"
#include "model_helpers.hpp"
#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/lora.hpp"
#include "trainmem/model/optimizer.hpp"

namespace trainmem {
namespace {

using test::ModelRun;

struct Case {
  const char* preset;
  std::int64_t b, s;
  std::int64_t lora_rank;  // 0: the full fine-tune
  unsigned targets;
  Quant quant;
};

TrainConfig case_train(const Case& c, Optimizer o, DType dt, Checkpointing ck) {
  TrainConfig t = test::train_config(c.b, c.s, dt, o, ck, Attention::eager);
  t.lora_rank = c.lora_rank;
  t.lora_targets = c.lora_rank ? c.targets : 0;
  t.quant = c.quant;
  return t;
}

// The managed bytes counted from the parameter list, independently of state_figures: each
// trained tensor of n >= 100,000 elements pages its two moments, 4 B (PagedAdamW) or 1 B
// (PagedAdamW8bit) per element each. `trained` is every tensor, or the adapters under LoRA.
std::uint64_t managed_from_specs(const ModelConfig& m, const TrainConfig& t) {
  const std::uint64_t per = t.optimizer == Optimizer::paged_adamw ? 8 : 2;
  std::uint64_t sum = 0;
  if (t.lora()) {
    const std::uint64_t r = std::uint64_t(t.lora_rank), h = m.hidden, i = m.intermediate;
    const std::uint64_t ad = std::uint64_t(m.heads * m.head_dim()), kd = m.kv_dim();
    const std::uint64_t in[7] = {h, h, h, ad, h, h, i}, out[7] = {ad, kd, kd, h, i, i, h};
    for (int j = 0; j < 7; ++j)
      if (t.lora_targets & (1u << j))
        for (std::uint64_t n : {r * in[j], r * out[j]})
          if (n >= 100000) sum += per * n * std::uint64_t(m.layers);
    return sum;
  }
  for (const ParamSpec& p : parameter_specs(m))
    if (p.elements >= 100000) sum += per * p.elements;
  return sum;
}

// Meta: the main ledger equals the native profile byte for byte and the managed ledger its
// optimizer_states_managed, which equals the count above, over full fine-tunes, LoRA and QLoRA,
// both paged optimizers, dtypes and checkpointing.
TEST(PagedLedger, MetaTraceEqualsTheNativeClosedForm) {
  const std::vector<Case> cases = {
      {"tiny", 2, 16, 0, 0, Quant::none},
      {"small-256", 1, 32, 0, 0, Quant::none},
      {"tiny-qwen2", 3, 11, 0, 0, Quant::none},
      {"llama-7b", 1, 64, 0, 0, Quant::none},
      {"llama3-8b", 1, 64, 16, kLoraAllLinear, Quant::none},
      {"llama3-8b", 1, 64, 8, kLoraPeftDefault | kLoraDown, Quant::nf4},
      {"qwen2-7b-2l", 1, 32, 16, kLoraAllLinear, Quant::nf4},
  };
  int checked = 0, with_managed = 0, without = 0;
  for (const Case& c : cases) {
    const ModelConfig m = test::any_config(c.preset);
    for (Optimizer o : {Optimizer::paged_adamw, Optimizer::paged_adamw8bit})
      for (DType dt : {DType::bf16, DType::f32, DType::f16})
        for (Checkpointing ck : {Checkpointing::none, Checkpointing::full}) {
          if (c.quant != Quant::none && dt == DType::f32) continue;
          const TrainConfig t = case_train(c, o, dt, ck);
          SCOPED_TRACE(std::string(c.preset) + " r" + std::to_string(c.lora_rank) + " " +
                       optimizer_name(o) + " " + dtype_name(dt) + " " + checkpointing_name(ck));
          ModelRun run(BackendKind::meta, m, t);
          run.model->train_step();
          run.model->train_step();
          const Estimate e = estimate(Profile::native, m, t);
          test::expect_same_figures(measured_figures(*run.ledger), e.figures);
          const Ledger* managed = run.model->managed_ledger();
          ASSERT_NE(managed, nullptr);
          EXPECT_EQ(managed->peak_total().bytes, e.optimizer_states_managed);
          EXPECT_EQ(e.optimizer_states_managed, managed_from_specs(m, t));
          // Only moments of tensors of 100,000 elements or more, alive from setup on.
          for (const TensorRecord& r : managed->tensors()) {
            EXPECT_EQ(r.category, Category::optimizer_states) << r.name;
            EXPECT_TRUE(r.name.size() > 7 && (r.name.substr(r.name.size() - 7) == ".state1" ||
                                              r.name.substr(r.name.size() - 7) == ".state2"))
                << r.name;
            EXPECT_GE(r.bytes, (o == Optimizer::paged_adamw ? 4u : 1u) * 100000u) << r.name;
            EXPECT_EQ(r.free_seq, 0u) << r.name;
          }
          (e.optimizer_states_managed ? with_managed : without)++;
          ++checked;
        }
  }
  EXPECT_EQ(checked, 4 * 12 + 12 + 2 * 8);
  EXPECT_GT(with_managed, 0);
  EXPECT_GT(without, 0);  // tiny: no tensor reaches 100,000 elements
}

// The placement changes no bit: on the cpu, PagedAdamW8bit's losses and weights after three
// steps equal AdamW8bit's exactly (both bitsandbytes' 8-bit update, the moments in another
// ledger), and the cpu run's two ledgers equal its meta trace's.
TEST(PagedLedger, CpuStepEqualsTheUnpagedOptimizerAndTheMetaTrace) {
  // r 160: the gate/up B and down A adapters (160 × 688) reach 100,000 elements.
  for (const Case& c :
       {Case{"small-256", 1, 24, 0, 0, Quant::none},
        Case{"small-256", 2, 12, 160, kLoraGate | kLoraUp | kLoraDown, Quant::none}}) {
    const ModelConfig m = test::any_config(c.preset);
    SCOPED_TRACE(std::string(c.preset) + " r" + std::to_string(c.lora_rank));
    std::vector<std::vector<float>> losses;
    std::vector<std::vector<float>> weights;
    for (Optimizer o : {Optimizer::adamw8bit, Optimizer::paged_adamw8bit}) {
      const TrainConfig t = case_train(c, o, DType::bf16, Checkpointing::none);
      ModelRun cpu(BackendKind::cpu, m, t);
      cpu.model->init_random(1);
      cpu.model->random_tokens(2);
      std::vector<float> l;
      for (int k = 0; k < 3; ++k) l.push_back(cpu.model->train_step());
      losses.push_back(l);
      const char* probe = c.lora_rank ? "model.layers.1.mlp.up_proj.lora_B.weight"
                                      : "model.layers.1.mlp.up_proj.weight";
      weights.push_back(cpu.model->parameter_values(probe));
      if (o == Optimizer::paged_adamw8bit) {
        ModelRun meta(BackendKind::meta, m, t);
        meta.model->init_random(1);
        meta.model->random_tokens(2);
        for (int k = 0; k < 3; ++k) meta.model->train_step();
        ASSERT_NE(cpu.model->managed_ledger(), nullptr);
        EXPECT_GT(cpu.model->managed_ledger()->peak_total().bytes, 0u);
        test::expect_same_ledgers(*cpu.model->managed_ledger(), *meta.model->managed_ledger());
        test::expect_same_figures(measured_figures(*cpu.ledger), measured_figures(*meta.ledger));
      }
    }
    EXPECT_EQ(losses[0], losses[1]);
    EXPECT_EQ(weights[0], weights[1]);
    EXPECT_NE(losses[0][0], losses[0][2]) << "the steps must train";
  }
}

}  // namespace
}  // namespace trainmem
