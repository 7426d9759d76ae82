// The measured sharded step on one rank (the local collective): the same arithmetic as the
// single-rank LlamaModel (bit for bit with one micro-batch; within a stated tolerance with
// several, whose gradients are summed in another order), and its ledger equal to the meta trace
// and to the per-rank analytic profile. The multi-rank cases run under mpirun
// (tests/mpi_test_sharded.cpp, ctest Mpi.sharded.np2/np4).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <tuple>

#include "family_configs.hpp"
#include "model_helpers.hpp"
#include "sharded_helpers.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/comm/collective.hpp"
#include "trainmem/run/run_layout.hpp"

namespace trainmem::test {
namespace {

ParallelConfig one_rank(const ModelConfig& m, const TrainConfig& t, std::int64_t M) {
  ParallelConfig p;
  p.world = 1;
  p.microbatches = M;
  p.resolve(false, m, t);
  return p;
}

using Case = std::tuple<std::string, DType, Checkpointing, Attention, Optimizer>;

class ShardedExecOneRank : public ::testing::TestWithParam<Case> {};

TEST_P(ShardedExecOneRank, EqualsLlamaModelBitForBit) {
  const auto& [name, dt, ck, at, opt] = GetParam();
  const ModelConfig m = any_config(name);
  const TrainConfig t = train_config(2, 12, dt, opt, ck, at);
  auto local = make_local_collective();
  ShardedRun run(m, t, one_rank(m, t, 1), *local, *local, 7);
  const StepsResult got = run.run(2);
  const StepsResult want = reference_steps(m, t, 2, 7, 2);
  ASSERT_EQ(got.losses.size(), 2u);
  for (std::size_t n = 0; n < 2; ++n) EXPECT_EQ(got.losses[n], want.losses[n]) << "step " << n + 1;
  std::string where;
  EXPECT_TRUE(bit_identical(got.weights, want.weights, &where)) << where;
  EXPECT_EQ(got.weights.size(), want.weights.size());
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ShardedExecOneRank,
    ::testing::Values(
        Case{"tiny", DType::f32, Checkpointing::none, Attention::flash, Optimizer::adamw},
        Case{"tiny", DType::bf16, Checkpointing::full, Attention::eager, Optimizer::adamw},
        Case{"tiny", DType::f16, Checkpointing::none, Attention::flash, Optimizer::adamw},
        Case{"tiny-tied", DType::bf16, Checkpointing::none, Attention::flash, Optimizer::sgd},
        Case{"tiny-gqa", DType::f32, Checkpointing::full, Attention::flash, Optimizer::sgd},
        Case{"tiny-qwen2", DType::bf16, Checkpointing::none, Attention::eager, Optimizer::adamw},
        Case{"tiny-qwen3", DType::f32, Checkpointing::full, Attention::flash, Optimizer::adamw},
        Case{"tiny-mistral", DType::bf16, Checkpointing::none, Attention::flash, Optimizer::adamw},
        Case{"tiny-llama3", DType::f32, Checkpointing::none, Attention::eager, Optimizer::adamw}));

// Several micro-batches accumulate each gradient over them (rounded to D after each), where
// the single-rank model of batch M·b sums all rows in one GEMM: equal within fp32 rounding.
TEST(ShardedExecOneRank, MicroBatchesMatchTheWholeBatch) {
  const ModelConfig m = any_config("tiny-qwen2");
  const TrainConfig t =
      train_config(1, 12, DType::f32, Optimizer::adamw, Checkpointing::none, Attention::flash);
  auto local = make_local_collective();
  ShardedRun run(m, t, one_rank(m, t, 3), *local, *local, 11);
  const StepsResult got = run.run(3);
  const StepsResult want = reference_steps(m, t, 3, 11, 3);
  // Step 1 starts from the same weights, but the whole batch's GEMMs have 3x the rows: OpenBLAS
  // picks its blocking (and so the order of each dot product's additions) by the matrix sizes
  // and by the CPU (SkylakeX kernels differ from Haswell's and Zen's), and the loss is a mean of
  // the rows grouped differently. Equal bits are not guaranteed; a few fp32 roundings are: each
  // logit's relative error is ~k·u (u = 2^-24), and the loss averages them, so 1e-6·|L| (about
  // 17 u, 8 ulps at |L| ~ 4.6) bounds step 1; later steps add the weight differences bounded
  // below, which move the loss by less than the same bound at this learning rate.
  for (std::size_t n = 0; n < 3; ++n) {
    std::printf("step %zu: loss %.9g (micro-batches) vs %.9g (whole batch), %.3g ulps\n", n + 1,
                double(got.losses[n]), double(want.losses[n]),
                std::abs(double(got.losses[n]) - double(want.losses[n])) /
                    double(std::nextafter(want.losses[n], INFINITY) - want.losses[n]));
    EXPECT_NEAR(got.losses[n], want.losses[n], 1e-6 * std::abs(want.losses[n])) << n;
  }
  std::string where;
  const double diff = worst_absolute_difference(got.weights, want.weights, &where);
  const double bound = adam_tolerance(default_optimizer_settings(Optimizer::adamw), 3);
  std::printf("micro-batches vs whole batch: worst weight difference %.3g (%s), bound %.3g\n", diff,
              where.c_str(), bound);
  EXPECT_LE(diff, bound) << where;
  EXPECT_GT(diff, 0.0) << "several micro-batches sum the gradients in another order";
}

// output_router_logits per rank (docs/distributed.md, "The load-balancing loss per rank"): each
// (rank, micro-batch) adds HF's load-balancing loss over its own b·s tokens, and the step's loss is
// the mean over them. One rank with one micro-batch is the single-rank LlamaModel: every weight
// bit for bit (the gradient coef·E·C_e/(LT)² is the same expression); the loss within 1e-6 (the
// aux term is added to the token sum before the division here, after it there). With three
// micro-batches of the same rows (--tokens) it is the single rank's step on those rows: each
// micro-batch's counts and probability sums its own (counting all three together would triple
// C_e against the same LT), the gradients the mean of three equal ones, within Adam's tolerance.
// tiny-qwen3-moe with router_aux_loss_coef 0.5 (HF's default 0.001 would hide the term).
TEST(ShardedExecOneRank, LoadBalancingLossPerMicroBatchIsTheSingleRanks) {
  ModelConfig m = any_config("tiny-qwen3-moe");
  m.output_router_logits = true;
  m.router_aux_loss_coef = 0.5;
  const TrainConfig t =
      train_config(1, 12, DType::f32, Optimizer::adamw, Checkpointing::none, Attention::flash);
  auto local = make_local_collective();
  const std::vector<std::int32_t> rows = random_token_ids(5, t.batch * t.seq, m.vocab);
  const StepsResult want = reference_steps_on(m, t, t.batch, 5, 2, rows);
  ModelConfig plain = m;
  plain.output_router_logits = false;
  const StepsResult without = reference_steps_on(plain, t, t.batch, 5, 2, rows);
  // Step 1 starts from the same weights: the difference is the aux term, coef·K = 1 under uniform
  // routing and near it at initialisation.
  ASSERT_GT(want.losses[0] - without.losses[0], 0.4f) << "the reference carries no aux loss";
  {
    ShardedRun run(m, t, one_rank(m, t, 1), *local, *local, 5, BackendKind::cpu, nullptr, nullptr,
                   nullptr, {}, &rows);
    const StepsResult got = run.run(2);
    for (std::size_t n = 0; n < 2; ++n)
      EXPECT_NEAR(got.losses[n], want.losses[n], 1e-6 * std::abs(want.losses[n])) << n;
    std::string where;
    EXPECT_TRUE(bit_identical(got.weights, want.weights, &where)) << where;
  }
  std::vector<std::int32_t> three;
  for (int k = 0; k < 3; ++k) three.insert(three.end(), rows.begin(), rows.end());
  ShardedRun run(m, t, one_rank(m, t, 3), *local, *local, 5, BackendKind::cpu, nullptr, nullptr,
                 nullptr, {}, &three);
  const StepsResult got = run.run(2);
  for (std::size_t n = 0; n < 2; ++n)
    EXPECT_NEAR(got.losses[n], want.losses[n], 1e-5 * std::abs(want.losses[n])) << n;
  std::string where;
  const double diff = worst_absolute_difference(got.weights, want.weights, &where);
  EXPECT_LE(diff, adam_tolerance(default_optimizer_settings(Optimizer::adamw), 2)) << where;
  // Two micro-batches of different rows: step 1's loss (the same weights) is the mean of the two
  // single-rank losses, each with its own load-balancing term; counts pooled over both would give
  // another aux (the sum of products is not the product of sums).
  const std::vector<std::int32_t> other = random_token_ids(6, t.batch * t.seq, m.vocab);
  std::vector<std::int32_t> two = rows;
  two.insert(two.end(), other.begin(), other.end());
  ShardedRun mixed(m, t, one_rank(m, t, 2), *local, *local, 5, BackendKind::cpu, nullptr, nullptr,
                   nullptr, {}, &two);
  const float mean =
      0.5f * (want.losses[0] + reference_steps_on(m, t, t.batch, 5, 1, other).losses[0]);
  EXPECT_NEAR(mixed.run(1).losses[0], mean, 1e-6 * std::abs(mean));
}

// What the measured rank allocated is the meta trace's and the analytic profile's.
TEST(ShardedExecOneRank, LedgerEqualsTraceAndAnalytic) {
  for (const std::string name : {"tiny", "tiny-qwen3", "tiny-tied"})
    for (const std::int64_t M : {1, 2}) {
      const ModelConfig m = any_config(name);
      const TrainConfig t =
          train_config(2, 16, DType::bf16, Optimizer::adamw, Checkpointing::full, Attention::eager);
      const ParallelConfig p = one_rank(m, t, M);
      auto local = make_local_collective();
      ShardedRun run(m, t, p, *local, *local, 3);
      run.run(2);
      const MemoryFigures got = measured_figures(*run.ledger);
      const LayoutTrace lt = trace_layout(m, t, p, OverheadOptions{}, 2);
      ASSERT_EQ(lt.ranks.size(), 1u);
      const MemoryFigures& meta = lt.ranks[0].ledger;
      const MemoryFigures& ana = lt.analytic.ranks[0].est.figures;
      SCOPED_TRACE(name + " M " + std::to_string(M));
      EXPECT_TRUE(lt.ranks[0].matches);
      for (const auto* want : {&meta, &ana}) {
        EXPECT_EQ(got.params, want->params);
        EXPECT_EQ(got.gradients, want->gradients);
        EXPECT_EQ(got.optimizer_states, want->optimizer_states);
        EXPECT_EQ(got.activations_peak, want->activations_peak);
        EXPECT_EQ(got.workspace, want->workspace);
        EXPECT_EQ(got.inputs, want->inputs);
        EXPECT_EQ(got.peak, want->peak);
      }
      EXPECT_GT(got.peak, got.params + got.gradients + got.optimizer_states);
    }
}

TEST(ShardedExecOneRank, RefusesWhatItDoesNotRun) {
  const ModelConfig m = any_config("tiny");
  const TrainConfig t =
      train_config(2, 8, DType::f32, Optimizer::adamw, Checkpointing::none, Attention::flash);
  auto local = make_local_collective();
  auto be = make_cpu_backend(DType::f32);
  Ledger ledger(be->allocator());
  ShardedExecution ex{*be, *local, *local, 1, default_optimizer_settings(Optimizer::adamw)};
  ParallelConfig pp;
  pp.world = 2;
  pp.pp = 2;
  pp.resolve(false, m, t);
  try {
    ShardedStep step(m, t, pp, 0, ledger, &ex);
    FAIL() << "pp 2 ran without its group";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--pp 2 needs the pipeline group's collective"),
              std::string::npos)
        << e.what();
  }
  ParallelConfig tp;
  tp.world = 2;
  tp.tp = 2;
  tp.resolve(false, m, t);
  try {
    ShardedStep step(m, t, tp, 0, ledger, &ex);
    FAIL() << "tp 2 ran without its group";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tp 2 needs the tensor-parallel group's collectives"),
              std::string::npos)
        << e.what();
  }
  ParallelConfig dp2;
  dp2.world = 2;
  dp2.resolve(false, m, t);
  try {
    ShardedStep step(m, t, dp2, 0, ledger, &ex);
    FAIL() << "dp 2 ran on a collective of one rank";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("collectives have 1 ranks, the layout dp·cp 2"),
              std::string::npos)
        << e.what();
  }
}

std::string temp_file(const std::string& leaf) {
  return (std::filesystem::temp_directory_path() /
          ("trainmem_sharded_" + std::to_string(::getpid()) + "_" + leaf))
      .string();
}

// --weights and --tokens: the rank starts from the files' weights and batch, bit for bit the
// single-rank model that loaded them, and not the random run of the same seed (the ZeRO shards,
// tensor-parallel slices and later stages made from the files: tests/mpi_test_sharded.cpp).
TEST(ShardedExecOneRank, StartsFromWeightsAndTokensFiles) {
  const ModelConfig m = any_config("tiny-qwen2");  // biases, tied embeddings
  const TrainConfig t =
      train_config(2, 12, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::flash);
  const std::string wpath = temp_file("w.safetensors"), tpath = temp_file("t.bin");
  write_weights_file(wpath, m, 41);
  write_tokens_file(tpath, 2 * 12, m.vocab, 43);
  const StepsResult want = reference_steps(m, t, 2, 7, 2, wpath, tpath);
  const StepsResult random = reference_steps(m, t, 2, 7, 2);
  EXPECT_NE(want.losses[0], random.losses[0]);
  SafeTensorsReader file(wpath);
  const std::vector<std::int32_t> ids = load_tokens_file(tpath, 2, 12, m.vocab);
  {
    const ParallelConfig p = one_rank(m, t, 1);
    auto local = make_local_collective();
    ShardedRun run(m, t, p, *local, *local, 7, BackendKind::cpu, nullptr, nullptr, nullptr, {&file},
                   &ids);
    const StepsResult got = run.run(2);
    for (std::size_t n = 0; n < 2; ++n) EXPECT_EQ(got.losses[n], want.losses[n]) << n;
    std::string where;
    EXPECT_TRUE(bit_identical(got.weights, want.weights, &where)) << where;
  }
  std::filesystem::remove(wpath);
  std::filesystem::remove(tpath);
}

// A file that does not fit the model or the batch: InputError naming the flag, file and tensor.
TEST(ShardedExecOneRank, RefusesWeightsAndTokensThatDoNotFit) {
  const ModelConfig m = any_config("tiny");
  const TrainConfig t =
      train_config(2, 8, DType::f32, Optimizer::adamw, Checkpointing::none, Attention::flash);
  const std::string good = temp_file("good.safetensors"), bad = temp_file("bad.safetensors");
  write_weights_file(good, m, 5);
  ModelConfig other = m;
  other.intermediate *= 2;
  write_weights_file(bad, other, 5);
  auto attempt = [&](const std::vector<const SafeTensorsReader*>& w,
                     const std::vector<std::int32_t>* ids) -> std::string {
    auto local = make_local_collective();
    try {
      ShardedRun run(m, t, one_rank(m, t, 1), *local, *local, 1, BackendKind::cpu, nullptr, nullptr,
                     nullptr, w, ids);
    } catch (const InputError& e) {
      return e.what();
    }
    return "(no error)";
  };
  SafeTensorsReader wrong_shape(bad);
  std::string msg = attempt({&wrong_shape}, nullptr);
  EXPECT_NE(msg.find("--weights " + bad +
                     ": tensor 'model.layers.0.mlp.gate_proj.weight' has "
                     "shape [" +
                     std::to_string(other.intermediate) + ", " + std::to_string(m.hidden) +
                     "], the model config needs [" + std::to_string(m.intermediate) + ", " +
                     std::to_string(m.hidden) + "]"),
            std::string::npos)
      << msg;
  ModelConfig more = m;
  more.layers += 1;
  SafeTensorsReader fewer(good);
  {
    auto local = make_local_collective();
    const TrainConfig t2 = t;
    try {
      ShardedRun run(more, t2, one_rank(more, t2, 1), *local, *local, 1, BackendKind::cpu, nullptr,
                     nullptr, nullptr, {&fewer}, nullptr);
      msg = "(no error)";
    } catch (const InputError& e) {
      msg = e.what();
    }
  }
  EXPECT_NE(msg.find("--weights " + good + ": missing tensor 'model.layers." +
                     std::to_string(m.layers) + ".input_layernorm.weight'"),
            std::string::npos)
      << msg;
  const std::vector<std::int32_t> short_batch(2 * 8 - 1, 0);
  msg = attempt({}, &short_batch);
  EXPECT_NE(msg.find("--tokens: 15 ids given, the global batch needs dp·M·b·s = 16"),
            std::string::npos)
      << msg;
  std::vector<std::int32_t> outside(2 * 8, 0);
  outside[3] = std::int32_t(m.vocab);
  msg = attempt({}, &outside);
  EXPECT_NE(msg.find("--tokens: id " + std::to_string(m.vocab) + " outside [0, " +
                     std::to_string(m.vocab) + ")"),
            std::string::npos)
      << msg;
  std::filesystem::remove(good);
  std::filesystem::remove(bad);
}

}  // namespace
}  // namespace trainmem::test

namespace trainmem::test {
namespace {

// LoRA per rank (docs/distributed.md, "LoRA per rank"): on one rank the sharded step is
// LlamaModel's LoRA and QLoRA steps bit for bit (the frozen base, quantized on the rank as
// LlamaModel quantizes it, the adapters' updates, checkpointing; ZeRO's shards of the adapters
// under mpirun: tests/mpi_test_sharded.cpp), from random weights and from a base checkpoint that
// has no adapters (they start fresh as LlamaModel's do); its ledger is the meta trace's and the
// per-rank analytic profile's.
TEST(ShardedExecOneRank, LoraEqualsLlamaModelBitForBit) {
  struct LoraCase {
    const char* model;
    DType dt;
    Checkpointing ck;
    unsigned targets;
    Quant quant;  // QLoRA: nf4 with double quantization, fp4 without
  };
  for (const LoraCase& c :
       {LoraCase{"tiny-qwen2", DType::bf16, Checkpointing::none, 0x7fu, Quant::none},
        LoraCase{"tiny-gqa", DType::f32, Checkpointing::full, 1u | 4u, Quant::none},
        LoraCase{"tiny-tied", DType::f32, Checkpointing::full, 8u | 64u, Quant::none},
        LoraCase{"tiny-qwen2", DType::bf16, Checkpointing::full, 0x7fu, Quant::nf4},
        LoraCase{"tiny-qwen2", DType::bf16, Checkpointing::none, 0x7fu, Quant::fp4}}) {
    SCOPED_TRACE(std::string(c.model) + " " + quant_name(c.quant));
    const ModelConfig m = any_config(c.model);
    TrainConfig t = train_config(2, 12, c.dt, Optimizer::adamw, c.ck, Attention::flash);
    t.lora_rank = 4;
    t.lora_targets = c.targets;
    t.quant = c.quant;
    t.double_quant = c.quant == Quant::nf4;
    const ParallelConfig p = one_rank(m, t, 1);
    auto local = make_local_collective();
    ShardedRun run(m, t, p, *local, *local, 7);
    const StepsResult got = run.run(3);
    const StepsResult want = reference_steps(m, t, 2, 7, 3);
    for (std::size_t n = 0; n < 3; ++n) EXPECT_EQ(got.losses[n], want.losses[n]) << n;
    if (c.quant == Quant::none) {
      EXPECT_NE(got.losses[1], got.losses[2]) << "the adapters train";
    }
    std::string where;
    EXPECT_TRUE(bit_identical(got.weights, want.weights, &where)) << where;
    EXPECT_EQ(got.weights.size(), want.weights.size());
    const MemoryFigures mine = measured_figures(*run.ledger);
    const LayoutTrace lt = trace_layout(m, t, p, OverheadOptions{}, 3);
    ASSERT_EQ(lt.ranks.size(), 1u);
    EXPECT_TRUE(lt.ranks[0].matches);
    const MemoryFigures& ana = lt.analytic.ranks[0].est.figures;
    EXPECT_EQ(mine.params, ana.params);
    EXPECT_EQ(mine.gradients, ana.gradients);
    EXPECT_EQ(mine.optimizer_states, ana.optimizer_states);
    EXPECT_EQ(mine.workspace, ana.workspace);
    EXPECT_EQ(mine.peak, ana.peak);
    // Only the adapters have gradients and states: r·(in + out) per target and layer.
    const std::uint64_t trainable = lt.analytic.ranks[0].est.trainable_params;
    EXPECT_EQ(mine.gradients, trainable * dtype_size(c.dt));
    EXPECT_LT(trainable, lt.analytic.ranks[0].local_params);
  }
  // From a base checkpoint: the adapters the file lacks start fresh (B zero, A seed 0).
  const ModelConfig m = any_config("tiny-qwen2");
  TrainConfig base =
      train_config(2, 12, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::flash);
  const std::string wpath = temp_file("lora_base.safetensors");
  write_weights_file(wpath, m, 41);
  TrainConfig t = base;
  t.lora_rank = 8;
  t.lora_targets = 0x7fu;
  const StepsResult want = reference_steps(m, t, 2, 7, 2, wpath);
  {
    SafeTensorsReader file(wpath);
    auto local = make_local_collective();
    ShardedRun run(m, t, one_rank(m, t, 1), *local, *local, 7, BackendKind::cpu, nullptr, nullptr,
                   nullptr, {&file});
    const StepsResult got = run.run(2);
    for (std::size_t n = 0; n < 2; ++n) EXPECT_EQ(got.losses[n], want.losses[n]) << n;
    std::string where;
    EXPECT_TRUE(bit_identical(got.weights, want.weights, &where)) << where;
  }
  std::filesystem::remove(wpath);
}

}  // namespace
}  // namespace trainmem::test
