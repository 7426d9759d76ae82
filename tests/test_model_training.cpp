// A real training check: a few hundred AdamW steps of a tiny LLaMA on one fixed synthetic
// sequence must drive the loss down at least tenfold (the model memorises the sequence).
#include <gtest/gtest.h>

#include "model_helpers.hpp"

using namespace trainmem;
using namespace trainmem::test;

namespace {

struct Losses {
  float first, last;
};

// `steps` steps of tiny-gqa (b 2, s 24, flash) on one fixed pseudo-random sequence (not a
// trivially periodic one), from the same random start.
Losses memorise(DType dt, Optimizer o, const OptimizerSettings& opt, int steps) {
  const ModelConfig m = preset("tiny-gqa");
  const std::int64_t b = 2, s = 24;
  ModelRun run(BackendKind::cpu, m,
               train_config(b, s, dt, o, Checkpointing::none, Attention::flash), &opt);
  run.model->init_random(11);
  std::vector<std::int32_t> ids(std::size_t(b * s));
  std::uint32_t x = 12345;
  for (auto& id : ids) {
    x = x * 1103515245u + 12345u;
    id = std::int32_t((x >> 16) % std::uint32_t(m.vocab));
  }
  run.model->set_tokens(ids);
  Losses l{run.model->train_step(), 0.0f};
  l.last = l.first;
  for (int step = 2; step <= steps; ++step) l.last = run.model->train_step();
  return l;
}

}  // namespace

TEST(ModelTraining, AdamWCutsTheLossTenfoldOnAFixedSequence) {
  OptimizerSettings opt = default_optimizer_settings(Optimizer::adamw);
  opt.adamw.lr = 3e-3f;
  opt.adamw.weight_decay = 0.0f;
  for (DType dt : {DType::f32, DType::bf16}) {
    const Losses l = memorise(dt, Optimizer::adamw, opt, 300);
    EXPECT_GT(l.first, 4.0f) << dtype_name(dt);  // about ln(96) = 4.56 from a random start
    EXPECT_LT(l.last, l.first / 10)
        << dtype_name(dt) << ": first " << l.first << " last " << l.last;
  }
}

// The same memorisation with bitsandbytes' AdamW8bit (tiny-gqa's embedding, 96 × 64 = 6,144
// elements, and its larger projections keep 8-bit moments; the norms fp32 ones): the weights
// are updated in place without a master copy, in fp32, bf16 and fp16 (its loss-scaled
// gradients unscaled by the update's gnorm_scale).
TEST(ModelTraining, AdamW8bitCutsTheLossFivefoldOnAFixedSequence) {
  OptimizerSettings opt = default_optimizer_settings(Optimizer::adamw8bit);
  opt.adamw8bit.lr = 3e-3;
  opt.adamw8bit.weight_decay = 0.0;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const Losses l = memorise(dt, Optimizer::adamw8bit, opt, 150);
    EXPECT_GT(l.first, 4.0f) << dtype_name(dt);
    EXPECT_LT(l.last, l.first / 5) << dtype_name(dt) << ": first " << l.first << " last " << l.last;
  }
}
