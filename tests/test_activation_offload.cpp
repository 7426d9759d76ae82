// --offload-activations (issue 30, point 2): what every layer but the last saves for its
// backward goes to host memory after the next layer's forward and comes back one layer ahead in
// backward. The native step's two ledgers (device and host) against the analytic profile byte
// for byte; the host and transfer figures against sums written here from the step without
// offload; the device's activations independent of depth; the copies exact (cpu bits); the
// command line as a user types it.
#include <gtest/gtest.h>

#include <cstring>

#include "cli/cli.hpp"
#include "family_configs.hpp"
#include "layout_trace_helpers.hpp"
#include "model_helpers.hpp"
#include "policy_helpers.hpp"
#include "test_cli_e2e_helpers.hpp"
#include "trainmem/analytic/analytic.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/model/sharded_step.hpp"

namespace trainmem {
namespace {

using test::train_config;
using test::with_layers;
using test::with_policy;

TrainConfig offloaded(TrainConfig t) {
  t.offload_activations = true;
  return t;
}

// Two steps on `kind`; the device figures, the host ledger's peak and the bytes copied against
// the native profile.
void expect_ledgers_equal_analytic(const ModelConfig& m, const TrainConfig& t,
                                   const std::string& what, BackendKind kind = BackendKind::meta) {
  test::ModelRun run(kind, m, t);
  const Estimate e = test::expect_ledger_equals_native(run, m, t, what, kind);
  const Ledger* host = run.model->host_ledger();
  ASSERT_NE(host, nullptr) << what;
  EXPECT_EQ(host->peak_total().bytes, e.offload_host_bytes) << what;
  EXPECT_EQ(host->live_total(), 0u) << what << ": host copies left after the step";
  EXPECT_EQ(run.model->offload_transfer_bytes(), e.offload_transfer_bytes) << what;
}

TEST(ActivationOffload, LedgersEqualNativeProfileForEveryPolicy) {
  int cases = 0;
  for (const char* name : {"tiny", "tiny-gqa", "tiny-qwen3", "tiny-tied"})
    for (std::int64_t L : {2, 3, 5}) {
      const ModelConfig m = with_layers(name, L);
      for (const std::string& policy :
           std::vector<std::string>{"none", "full", "layers:0", "layers:" + std::to_string(L - 1),
                                    "every:2", "layers:1", "selective"})
        for (Attention at : {Attention::eager, Attention::flash})
          for (Optimizer o : {Optimizer::adamw, Optimizer::lomo}) {
            const TrainConfig t = offloaded(with_policy(
                train_config(2, 9, DType::bf16, o, Checkpointing::none, at), policy, L));
            expect_ledgers_equal_analytic(
                m, t, m.name + " " + policy + " " + attention_name(at) + " " + optimizer_name(o));
            ++cases;
            if (testing::Test::HasFailure()) return;
          }
    }
  EXPECT_EQ(cases, 4 * 3 * 7 * 2 * 2);
}

TEST(ActivationOffload, CpuLedgersEqualNativeProfileToo) {
  const ModelConfig m = with_layers("tiny-gqa", 4);
  for (const std::string policy : {"none", "every:2"})
    expect_ledgers_equal_analytic(
        m,
        offloaded(with_policy(
            train_config(2, 12, DType::bf16, Optimizer::sgd, Checkpointing::none, Attention::eager),
            policy, 4)),
        "cpu " + policy, BackendKind::cpu);
}

// The host's share from the step without offload: layers 0 .. L-2 each send their input and what
// they keep less their output (the next layer's input), so the sum is what those L-1 layers keep:
// their whole set (the per-layer bytes) each, or their (b, s, h) output when checkpointed. The
// device keeps the rest at the end of forward; each byte crosses the bus twice.
TEST(ActivationOffload, HostBytesAreWhatTheFirstLayersKeep) {
  const std::int64_t L = 5;
  const ModelConfig m = with_layers("tiny", L);
  const TrainConfig none =
      train_config(2, 9, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::eager);
  const std::uint64_t S = estimate(Profile::native, m, none).activations.per_layer_bytes;
  const std::uint64_t X = 2 * 9 * std::uint64_t(m.hidden) * 2;
  struct Case {
    std::string policy;
    std::uint64_t host;
  };
  for (const Case& c : std::vector<Case>{{"none", 4 * S},
                                         {"full", 4 * X},
                                         {"layers:0,2", 2 * X + 2 * S},
                                         {"layers:4", 4 * S}}) {  // the last layer stays
    const TrainConfig plain = with_policy(none, c.policy, L);
    const Estimate without = estimate(Profile::native, m, plain);
    const Estimate with = estimate(Profile::native, m, offloaded(plain));
    EXPECT_EQ(with.offload_host_bytes, c.host) << c.policy;
    EXPECT_EQ(with.offload_transfer_bytes, 2 * c.host) << c.policy;
    EXPECT_EQ(with.activations.offloaded_bytes, c.host) << c.policy;
    EXPECT_EQ(with.figures.activations, without.figures.activations - c.host) << c.policy;
    EXPECT_EQ(without.offload_host_bytes, 0u) << c.policy;
  }
  // One layer: nothing to offload, the same step.
  const ModelConfig one = with_layers("tiny", 1);
  const Estimate a = estimate(Profile::native, one, none);
  const Estimate b = estimate(Profile::native, one, offloaded(none));
  EXPECT_EQ(b.offload_transfer_bytes, 0u);
  EXPECT_EQ(b.figures.peak, a.figures.peak);
}

// What offloading buys: the device holds two layers' sets at most, so its activations peak does
// not grow with the depth; without offload it grows by a layer's set per layer.
TEST(ActivationOffload, DeviceActivationsDoNotGrowWithDepth) {
  const TrainConfig none =
      train_config(2, 16, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::eager);
  for (const std::string policy : {"none", "full"}) {
    const TrainConfig t = with_policy(none, policy, 3);
    const auto peak = [&](std::int64_t L, bool off) {
      const ModelConfig m = with_layers("tiny-gqa", L);
      test::ModelRun run(BackendKind::meta, m, off ? offloaded(t) : t);
      run.model->train_step();
      return run.ledger->peak(Category::activations);
    };
    EXPECT_EQ(peak(3, true), peak(7, true)) << policy;
    EXPECT_LT(peak(3, false), peak(7, false)) << policy;
    EXPECT_LT(peak(7, true), peak(7, false)) << policy;
  }
}

// The per-layer activations a run reports count both places: offloading moves bytes, it does not
// change what a layer saves.
TEST(ActivationOffload, PerLayerActivationsCountTheHostCopies) {
  const ModelConfig m = with_layers("tiny", 4);
  const TrainConfig t =
      train_config(2, 9, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::flash);
  test::ModelRun plain(BackendKind::meta, m, t), off(BackendKind::meta, m, offloaded(t));
  plain.model->train_step();
  off.model->train_step();
  EXPECT_EQ(plain.model->activations_by_layer(), off.model->activations_by_layer());
  EXPECT_LT(off.ledger->activations_end_of_forward(), plain.ledger->activations_end_of_forward());
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The copies are exact: the same losses and gradients, bit for bit, as the step that keeps
// everything on the device (in fp32 and bf16, with and without checkpointing).
TEST(ActivationOffload, OffloadGivesTheSameBitsAsKeepingOnTheDevice) {
  const ModelConfig m = with_layers("tiny-gqa", 3);
  for (DType dt : {DType::f32, DType::bf16})
    for (const std::string policy : {"none", "layers:1", "selective"}) {
      const TrainConfig t = with_policy(
          train_config(2, 11, dt, Optimizer::adamw, Checkpointing::none, Attention::eager), policy,
          3);
      auto run = [&](const TrainConfig& tc) {
        test::ModelRun r(BackendKind::cpu, m, tc);
        r.model->init_random(7);
        r.model->random_tokens(3);
        test::GradMap g1, g2;
        std::pair<float, float> loss{r.model->train_step(test::capture_into(g1)),
                                     r.model->train_step(test::capture_into(g2))};
        return std::make_tuple(loss, g1, g2);
      };
      const auto [l0, a1, a2] = run(t);
      const auto [l1, b1, b2] = run(offloaded(t));
      const std::string what = std::string(dtype_name(dt)) + " " + policy;
      EXPECT_EQ(std::memcmp(&l0.first, &l1.first, 4), 0) << what;
      EXPECT_EQ(std::memcmp(&l0.second, &l1.second, 4), 0) << what;
      ASSERT_EQ(a1.size(), b1.size());
      for (const auto& [name, g] : a1) {
        EXPECT_TRUE(bitwise_equal(g, b1.at(name))) << what << " step 1 " << name;
        EXPECT_TRUE(bitwise_equal(a2.at(name), b2.at(name))) << what << " step 2 " << name;
      }
    }
}

// The host ledger's books: the copies are activations named as on the device, each layer's
// offload set allocated in forward and freed in backward.
TEST(ActivationOffload, HostLedgerHoldsTheOffloadSetsOfTheFirstLayers) {
  const std::int64_t L = 3;
  const ModelConfig m = with_layers("tiny", L);
  const TrainConfig t = offloaded(with_policy(
      train_config(2, 9, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::eager),
      "full", L));
  test::ModelRun run(BackendKind::meta, m, t);
  run.model->train_step();
  // Checkpointed: each offload set is the layer's input only, x_0 = embed_out and x_1 = out of
  // layer 0; layer 2 (the last) keeps its input on the device.
  std::vector<std::pair<std::string, int>> names;
  for (const TensorRecord& r : run.model->host_ledger()->tensors()) {
    EXPECT_EQ(r.category, Category::activations) << r.name;
    EXPECT_GT(r.free_seq, 0u) << r.name << " never freed";
    names.emplace_back(r.name, r.layer);
  }
  EXPECT_EQ(names, (std::vector<std::pair<std::string, int>>{{"embed_out", -1}, {"out", 0}}));
}

// Every rank of a sharded step (one stage: dp, tp, sp, ZeRO 0-3, micro-batches) offloads the
// same way: its meta trace equals its analytic profile byte for byte, device and host; with
// --pp above 1 it is refused.
TEST(ActivationOffload, ShardedTraceEqualsTheAnalyticProfilePerRank) {
  int checked = 0;
  for (const char* name : {"tiny-gqa", "tiny-qwen3"})
    for (std::int64_t tp : {1, 2})
      for (int zero : {0, 1, 2, 3})
        for (bool sp : {false, true})
          for (std::int64_t M : {1, 3})
            for (const char* policy : {"none", "layers:0", "layers:3", "every:2", "selective"})
              for (std::int64_t prefetch : {1, 2}) {
                if (zero != 3 && prefetch != 1) continue;
                const ModelConfig m = with_layers(name, 4);
                const Attention at =
                    std::string(policy) == "selective" ? Attention::eager : Attention::flash;
                const TrainConfig t = offloaded(with_policy(
                    train_config(2, 16, DType::bf16, Optimizer::adamw, Checkpointing::none, at),
                    policy, 4));
                ParallelConfig p;
                p.world = 2 * tp;
                p.dp = 2;
                p.tp = tp;
                p.zero = zero;
                p.sp = sp;
                p.microbatches = M;
                p.prefetch = prefetch;
                try {
                  p.resolve(true, m, t);
                } catch (const InputError&) {
                  continue;
                }
                const LayoutEstimate le = test::expect_trace_equals_layout(
                    m, t, p,
                    std::string(name) + " " + policy + " " + p.describe() + " prefetch " +
                        std::to_string(prefetch));
                EXPECT_GT(le.ranks.front().host_bytes, 0u);
                if (HasFailure()) return;
                ++checked;
              }
  EXPECT_GT(checked, 100);
  // Pipeline parallelism: refused, naming the flags.
  const ModelConfig m = with_layers("tiny", 4);
  const TrainConfig t = offloaded(
      train_config(2, 16, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::flash));
  ParallelConfig p;
  p.world = 2;
  p.pp = 2;
  try {
    p.resolve(false, m, t);
    ADD_FAILURE() << "pp 2 with offload resolved";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--offload-activations with --pp 2"), std::string::npos)
        << e.what();
  }
}

}  // namespace

namespace e2e {
namespace {

std::uint64_t u64(const json& j) {
  return j.get<std::uint64_t>();
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(CliE2EOffload, ProfileMeasuresBothLedgersAgainstTheNativeProfile) {
  const Result r = trainmem(
      "profile --model tiny-awkward --batch 2 --seq 24 --backend cpu --checkpointing every:2 "
      "--offload-activations --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  EXPECT_EQ(j["run"]["offload_activations"], true);
  const json& ledger = j["measured"]["ledger"];
  const json& native = j["analytic"]["native"];
  for (const char* k : {"activations", "activations_peak", "workspace", "peak"})
    EXPECT_EQ(u64(ledger[k]), u64(native[k])) << k;
  EXPECT_GT(u64(native["offload_host_bytes"]), 0u);
  EXPECT_EQ(u64(ledger["offload_host_peak"]), u64(native["offload_host_bytes"]));
  EXPECT_EQ(u64(ledger["offload_transfer_bytes"]), u64(native["offload_transfer_bytes"]));
  // The text report says where the bytes went, measured and predicted.
  const Result text = trainmem(
      "profile --model tiny-awkward --batch 2 --seq 24 --backend meta --offload-activations");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_TRUE(has(text.out, "activation offload (native): layers 0-")) << text.out;
  EXPECT_TRUE(has(text.out, "offload_host")) << text.out;
}

TEST(CliE2EOffload, EstimateShowsTheDeviceSavingAndTheOtherProfilesSayTheyIgnoreIt) {
  const std::string base = "estimate --model llama-7b --batch 8 --seq 512 --format json";
  const Result plain = trainmem(base);
  const Result off = trainmem(base + " --offload-activations");
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(off.code, 0) << off.err;
  const json jp = plain.j(), jo = off.j();
  const json& pn = jp["analytic"]["native"];
  const json& on = jo["analytic"]["native"];
  // 31 of LLaMA-7B's 32 layers send what they keep.
  EXPECT_EQ(u64(on["offload_host_bytes"]), 31 * u64(pn["per_layer_activations"]));
  EXPECT_EQ(u64(on["activations"]), u64(pn["activations"]) - u64(on["offload_host_bytes"]));
  EXPECT_LT(u64(on["peak"]), u64(pn["peak"]));
  // The other profiles keep their figures and say so.
  const json& hf = jo["analytic"]["hf-eager"];
  EXPECT_EQ(u64(hf["activations"]), u64(jp["analytic"]["hf-eager"]["activations"]));
  bool noted = false;
  for (const auto& n : hf["notes"]) noted = noted || has(n.get<std::string>(), "native) only");
  EXPECT_TRUE(noted) << hf["notes"].dump();
}

TEST(CliE2EOffload, PipelineLayoutsAreRefusedNamingBothFlags) {
  const Result r = trainmem("estimate --model tiny --world-size 2 --pp 2 --offload-activations");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.err, "--offload-activations with --pp 2")) << r.err;
  // Without pipeline parallelism every rank offloads: its host bytes in the per-rank table.
  const Result ok =
      trainmem("estimate --model tiny --world-size 2 --zero 3 --offload-activations --format json");
  ASSERT_EQ(ok.code, 0) << ok.err;
  const json j = ok.j();
  EXPECT_GT(u64(j["ranks"][0]["host_bytes"]), 0u) << j["ranks"].dump();
}

}  // namespace
}  // namespace e2e
}  // namespace trainmem
