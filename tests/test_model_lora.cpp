// LoRA in trainmem's own step (issue 28; docs/native-plan.md, "LoRA"): the ledger of the meta
// trace against the analytic `native` profile byte for byte, the cpu ledger against the meta
// trace, what trains and what stays frozen, and that the adapters' rows recompute to the same
// gradients under checkpointing. The gradients themselves are checked against finite
// differences in test_model_families.cpp (FamilyGradients.LoraAdaptersMatchFiniteDifferences).
#include <gtest/gtest.h>

#include <optional>
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

TrainConfig lora_train(std::int64_t b, std::int64_t s, std::int64_t r, unsigned targets,
                       Optimizer o = Optimizer::adamw, DType dt = DType::bf16,
                       Checkpointing c = Checkpointing::none, Attention a = Attention::eager) {
  TrainConfig t = test::train_config(b, s, dt, o, c, a);
  t.lora_rank = r;
  t.lora_targets = targets;
  return t;
}

bool is_adapter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

// The figures of the second step of the meta trace equal the closed form, peak breakdown
// included, over families, target sets, ranks, checkpointing policies, attention variants and
// optimizers.
TEST(LoraLedger, MetaTraceEqualsTheNativeClosedForm) {
  struct Case {
    const char* preset;
    std::int64_t b, s;
  };
  struct Mode {
    Optimizer o;
    DType dt;
  };
  const std::vector<unsigned> target_sets = {kLoraPeftDefault, kLoraAllLinear,   kLoraO,
                                             kLoraDown,        kLoraK | kLoraUp, kLoraGate};
  int checked = 0;
  for (const Case& c : {Case{"tiny", 3, 17}, Case{"tiny-awkward", 3, 7}, Case{"tiny-tied", 1, 5},
                        Case{"tiny-qwen2", 3, 11}, Case{"tiny-qwen3", 2, 9},
                        Case{"tiny-mistral", 2, 9}, Case{"llama3-8b", 1, 64}}) {
    const ModelConfig m = test::any_config(c.preset);
    for (unsigned targets : target_sets)
      for (std::int64_t r : {1, 8})
        for (const char* ck : {"none", "full", "selective", "every:2"})
          for (Attention at : {Attention::eager, Attention::flash})
            for (Mode md :
                 {Mode{Optimizer::adamw, DType::bf16}, Mode{Optimizer::sgd, DType::f32},
                  Mode{Optimizer::adamw, DType::f16}, Mode{Optimizer::adamw8bit, DType::bf16},
                  Mode{Optimizer::adamw8bit, DType::f16}}) {
              // The large model once per target set and optimizer (its trace is the slow part);
              // its adapters keep 8-bit AdamW states (r·in >= 4,096), the tiny ones fp32 states
              // (covered at one rank and attention).
              const bool large = std::string(c.preset) == "llama3-8b";
              if (large && (r != 8 || at != Attention::flash || md.dt != DType::bf16)) continue;
              if (!large && md.o == Optimizer::adamw8bit && (r != 8 || at != Attention::flash))
                continue;
              TrainConfig t = lora_train(c.b, c.s, r, targets, md.o, md.dt);
              t.attention = at;
              test::set_checkpointing(t, m, ck);
              SCOPED_TRACE(std::string(c.preset) + " targets " + lora_targets_name(targets) +
                           " r " + std::to_string(r) + " " + ck + " " + attention_name(at) + " " +
                           optimizer_name(md.o) + " " + dtype_name(md.dt));
              ModelRun run(BackendKind::meta, m, t);
              test::two_random_steps(*run.model);
              const MemoryFigures got = measured_figures(*run.ledger);
              const Estimate e = estimate(Profile::native, m, t);
              test::expect_same_figures(got, e.figures,
                                        "analytic peak at " + e.instants.at(e.peak_instant).name);
              ++checked;
            }
  }
  EXPECT_GT(checked, 1500);
}

// The cpu run allocates exactly what the meta trace does: the same tensors, in the same order,
// freed at the same events.
TEST(LoraLedger, CpuLedgerIsTheMetaTrace) {
  for (const char* preset : {"tiny-qwen3", "tiny-qwen2"})
    for (const char* ck : {"none", "full"}) {
      SCOPED_TRACE(std::string(preset) + " " + ck);
      const ModelConfig m = test::any_config(preset);
      TrainConfig t = lora_train(2, 9, 4, kLoraAllLinear);
      t.checkpointing = *parse_checkpointing(ck);
      ModelRun cpu(BackendKind::cpu, m, t), meta(BackendKind::meta, m, t);
      for (ModelRun* run : {&cpu, &meta}) {
        test::two_random_steps(*run->model);
      }
      test::expect_same_ledgers(*cpu.ledger, *meta.ledger);
    }
}

// Only the adapters train: gradients and optimizer states exist for them alone, the base weights
// keep their bits through two AdamW steps, and B leaves zero at the first step.
TEST(LoraStep, OnlyTheAdaptersTrainAndTheBaseStaysFrozen) {
  const ModelConfig m = test::any_config("tiny-qwen2");  // with q/k/v biases
  const TrainConfig t = lora_train(2, 9, 4, kLoraPeftDefault | kLoraDown);
  ModelRun run(BackendKind::cpu, m, t);
  run.model->init_random(3);
  run.model->random_tokens(4);
  std::vector<std::vector<float>> before;
  for (const auto& p : run.model->parameters())
    before.push_back(run.model->parameter_values(p.name));
  run.model->train_step();
  run.model->train_step();
  std::size_t adapters = 0;
  const auto& params = run.model->parameters();
  for (std::size_t j = 0; j < params.size(); ++j) {
    const Parameter& p = params[j];
    EXPECT_EQ(p.trainable, is_adapter(p.name)) << p.name;
    const std::vector<float> now = run.model->parameter_values(p.name);
    if (!is_adapter(p.name)) {
      EXPECT_EQ(now, before[j]) << p.name << " changed";
      continue;
    }
    ++adapters;
    if (p.name.find(".lora_B.") != std::string::npos) {
      EXPECT_EQ(before[j], std::vector<float>(before[j].size(), 0.0f)) << p.name;
      EXPECT_NE(now, before[j]) << p.name << " did not train";
    }
  }
  EXPECT_EQ(adapters, std::size_t(2 * 3 * m.layers));  // q, v, down: A and B each
  for (const TensorRecord& r : run.ledger->tensors()) {
    if (r.category == Category::gradients || r.category == Category::optimizer_states) {
      EXPECT_TRUE(is_adapter(r.name)) << r.name;
    }
  }
}

// With every B at zero the adapters add nothing: the loss is the base model's, bit for bit.
TEST(LoraStep, ZeroAdaptersLeaveTheBaseModelsLoss) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const ModelConfig m = test::any_config("tiny-qwen3");
    const TrainConfig full =
        test::train_config(2, 9, dt, Optimizer::sgd, Checkpointing::none, Attention::flash);
    TrainConfig t = full;
    t.lora_rank = 5;
    t.lora_targets = kLoraAllLinear;
    ModelRun base(BackendKind::cpu, m, full), lora(BackendKind::cpu, m, t);
    base.model->init_random(7);
    lora.model->init_random(8);  // other A draws; B is zero
    for (const auto& p : base.model->parameters())
      lora.model->set_parameter_values(p.name, base.model->parameter_values(p.name));
    base.model->random_tokens(9);
    lora.model->random_tokens(9);
    EXPECT_EQ(lora.model->train_step(), base.model->train_step());
  }
}

// Checkpointing recomputes the adapters' rows: the gradients equal those of the step that kept
// them, bit for bit (the same operations in the same order).
TEST(LoraStep, CheckpointingRecomputesTheSameGradients) {
  const ModelConfig m = test::any_config("tiny-awkward");
  auto grads = [&](Checkpointing c) {
    TrainConfig t = lora_train(2, 7, 3, kLoraAllLinear, Optimizer::sgd, DType::f32, c);
    ModelRun run(BackendKind::cpu, m, t);
    run.model->init_random(5);
    for (const auto& p : run.model->parameters())  // B away from zero, so that dA is not
      if (p.name.find(".lora_B.") != std::string::npos) {
        std::vector<float> v(p.numel());
        for (std::size_t e = 0; e < v.size(); ++e) v[e] = 0.01f * float(int(e % 7) - 3);
        run.model->set_parameter_values(p.name, v);
      }
    run.model->random_tokens(6);
    test::GradMap g;
    run.model->train_step(test::capture_into(g));
    return g;
  };
  const test::GradMap none = grads(Checkpointing::none);
  ASSERT_FALSE(none.empty());
  for (Checkpointing c : {Checkpointing::full, Checkpointing::selective}) {
    const test::GradMap other = grads(c);
    ASSERT_EQ(other.size(), none.size());
    for (const auto& [name, g] : none) {
      EXPECT_EQ(other.at(name), g) << name << " under " << checkpointing_name(c);
      bool nonzero = false;
      for (float x : g) nonzero |= x != 0.0f;
      EXPECT_TRUE(nonzero) << name << ": zero gradient";
    }
  }
}

// The trainable count is peft's get_nb_trainable_parameters() for the same LoraConfig: r·(in +
// out) per target per layer, written out here from each model's published sizes.
TEST(LoraStep, TrainableParametersArePeftsCount) {
  struct Case {
    const char* preset;
    std::uint64_t h, i, kd, L, want;
  };
  // Llama-3-8B and Mistral-7B: h 4096, i 14336, 8 kv heads of 128; Qwen2.5-7B: h 3584,
  // i 18944, 4 kv heads of 128, 28 layers.
  for (const Case& c : {Case{"llama3-8b", 4096, 14336, 1024, 32, 41943040},
                        Case{"mistral-7b", 4096, 14336, 1024, 32, 41943040},
                        Case{"qwen2.5-7b", 3584, 18944, 512, 28, 40370176}}) {
    SCOPED_TRACE(c.preset);
    const std::uint64_t r = 16;
    const std::uint64_t per_layer =
        r * (2 * (c.h + c.h) + 2 * (c.h + c.kd) + 3 * (c.h + c.i));  // q, o; k, v; gate, up, down
    EXPECT_EQ(per_layer * c.L, c.want);
    const ModelConfig m = *find_preset(c.preset);
    const TrainConfig t = lora_train(1, 128, 16, kLoraAllLinear);
    const Estimate e = estimate(Profile::native, m, t);
    EXPECT_EQ(e.trainable_params, c.want);
    EXPECT_EQ(e.figures.gradients, 2 * c.want);          // bf16
    EXPECT_EQ(e.figures.optimizer_states, 12 * c.want);  // fp32 master, m, v
    EXPECT_EQ(e.figures.params, 2 * (m.param_count() + c.want));
  }
}

}  // namespace
}  // namespace trainmem
