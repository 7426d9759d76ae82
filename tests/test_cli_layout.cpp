// `estimate` and `profile` with a parallel layout (--world-size ...): the per-rank report in
// each format, the figures in the JSON against the library's per-rank profile and against
// hand-computed ZeRO-3 states, the trace's verdict, and bad layouts with exit 2 naming the flag.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_in_process.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/cli/cli.hpp"

namespace trainmem::cli {
namespace {

using testing_in_process::contains;
using testing_in_process::run_trainmem;

TEST(CliLayout, EstimateJsonGivesEachStageAndTheWorst) {
  const auto r =
      run_trainmem({"estimate", "--model",  "llama2-70b", "--world-size",   "16", "--tp",
                    "2",        "--pp",     "4",          "--microbatches", "8",  "--zero",
                    "1",        "--seq",    "2048",       "--batch",        "1",  "--attention",
                    "flash",    "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["layout"]["dp"], 2);
  EXPECT_EQ(j["global_batch"], 16);  // b 1 · M 8 · dp 2
  ASSERT_EQ(j["ranks"].size(), 4u);
  EXPECT_EQ(j["ranks"][0]["role"], "first");
  EXPECT_EQ(j["ranks"][0]["in_flight_microbatches"], 4);
  EXPECT_EQ(j["ranks"][3]["in_flight_microbatches"], 1);
  // The same figures as the library's.
  ParallelConfig p;
  p.world = 16;
  p.tp = 2;
  p.pp = 4;
  p.microbatches = 8;
  p.zero = 1;
  TrainConfig t;
  t.batch = 1;
  t.seq = 2048;
  t.attention = Attention::flash;
  const ModelConfig m = *find_preset("llama2-70b");
  p.resolve(false, m, t);
  const LayoutEstimate le = estimate_layout(m, t, p);
  for (int k = 0; k < 4; ++k)
    EXPECT_EQ(j["ranks"][k]["figures"]["peak"].get<std::uint64_t>(),
              le.ranks[std::size_t(k)].est.figures.peak);
  EXPECT_EQ(j["worst_rank"], le.worst);
  EXPECT_EQ(j["worst_total"].get<std::uint64_t>(), le.worst_total());
  EXPECT_EQ(j["references"]["estimators"][0]["profile"], "deepspeed");
  EXPECT_FALSE(j["references"]["estimators"][0]["covers"].get<bool>());  // tp, pp > 1
}

TEST(CliLayout, ZeroThreeStatesAreTheShardOfEachGpu) {
  const auto r = run_trainmem({"estimate", "--model", "llama2-70b", "--world-size", "8", "--zero",
                               "FULL_SHARD", "--checkpointing", "full", "--batch", "1", "--seq",
                               "4096", "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const std::uint64_t P = 68976648192ull;  // LLaMA-2-70B's published count
  const std::uint64_t shard = P / 8;       // divides exactly: no padding
  const auto& f = j["ranks"][0]["figures"];
  EXPECT_EQ(f["params"].get<std::uint64_t>(), 2 * shard);
  EXPECT_EQ(f["gradients"].get<std::uint64_t>(), 2 * shard);
  EXPECT_EQ(f["optimizer_states"].get<std::uint64_t>(), 12 * shard);
  EXPECT_EQ(j["ranks"][0]["padding_elements"], 0);
  EXPECT_EQ(j["layout"]["zero"], 3);
}

TEST(CliLayout, TextMarkdownCsvSayPredictedAndTheWorstRank) {
  const std::vector<std::string> base = {
      "estimate", "--model", "llama-7b", "--world-size", "8",    "--tp",    "2",
      "--sp",     "--zero",  "2",        "--seq",        "1024", "--batch", "2"};
  auto args = base;
  auto r = run_trainmem(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "PREDICTED, per rank"));
  EXPECT_TRUE(contains(r.out, "Worst rank: stage 0"));
  EXPECT_TRUE(contains(r.out, "communication: reduce_bucket"));
  EXPECT_TRUE(contains(r.out, "Published estimators beside the trace"));
  args = base;
  args.insert(args.end(), {"--format", "markdown"});
  r = run_trainmem(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "### trainmem estimate (PREDICTED, per rank)"));
  EXPECT_TRUE(contains(r.out, "| stage |"));
  args = base;
  args.insert(args.end(), {"--format", "csv"});
  r = run_trainmem(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("stage,role,ranks,in flight,params,", 0), 0u) << r.out;
}

// compare --world-size on meta: each stage with checkpointing none and full, each mode's trace
// against the profile's own per-rank figures of that mode.
TEST(CliLayout, CompareTracesEveryStageInBothModes) {
  const std::vector<std::string> base = {
      "--backend", "meta", "--model", "tiny-gqa", "--world-size",   "8",
      "--tp",      "2",    "--pp",    "2",        "--microbatches", "3",
      "--batch",   "2",    "--seq",   "32",       "--format",       "json"};
  std::vector<std::string> cmp = {"compare"};
  cmp.insert(cmp.end(), base.begin(), base.end());
  const auto r = run_trainmem(cmp);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["all_match"].get<bool>());
  ASSERT_EQ(j["rows"].size(), 2u);
  for (const char* mode : {"none", "full"}) {
    std::vector<std::string> prof = {"profile"};
    prof.insert(prof.end(), base.begin(), base.end());
    prof.push_back("--checkpointing");
    prof.push_back(mode);
    const auto p = run_trainmem(prof);
    ASSERT_EQ(p.code, 0) << p.err;
    const auto pj = nlohmann::json::parse(p.out);
    for (std::size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(j["rows"][k][mode]["peak"], pj["ranks"][k]["ledger"]["peak"]) << mode << k;
      EXPECT_EQ(j["rows"][k][mode]["activations_peak"],
                pj["ranks"][k]["ledger"]["activations_peak"]);
    }
  }
  for (const auto& row : j["rows"]) {
    EXPECT_EQ(row["saved"].get<std::int64_t>(),
              row["none"]["peak"].get<std::int64_t>() - row["full"]["peak"].get<std::int64_t>());
    EXPECT_LT(row["full"]["activations_peak"].get<std::uint64_t>(),
              row["none"]["activations_peak"].get<std::uint64_t>());
  }
  const auto all = run_trainmem({"compare", "--backend", "meta", "--model", "tiny", "--world-size",
                                 "2", "--optimizer", "all"});
  EXPECT_EQ(all.code, 2);
  EXPECT_NE(all.err.find("--optimizer all: with --world-size above 1 give one optimizer"),
            std::string::npos)
      << all.err;
}

// --fsdp2 (per-parameter sharding, docs/distributed.md): LLaMA-2-70B on 8 GPUs, each parameter
// split on dim 0. Every row count of LLaMA-2-70B (8192, 1024 for k/v, 28672, 32000) divides by 8,
// so the chunks are exact: the same states as flat ZeRO-3 (no padding either way), plus AdamW's
// step scalars on the host, 4 B for each of the 80·9 + 3 parameter tensors.
TEST(CliLayout, Fsdp2ShardsEachParameterOnDimZero) {
  auto run = [](std::vector<std::string> extra) {
    std::vector<std::string> a = {"estimate", "--model",  "llama2-70b", "--world-size",
                                  "8",        "--batch",  "1",          "--seq",
                                  "4096",     "--format", "json"};
    a.insert(a.end(), extra.begin(), extra.end());
    return run_trainmem(a);
  };
  const auto r = run({"--fsdp2"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["layout"]["zero"], 3);
  EXPECT_EQ(j["layout"]["sharding"], "per-parameter");
  const std::uint64_t shard = 68976648192ull / 8;
  const auto& r0 = j["ranks"][0];
  EXPECT_EQ(r0["figures"]["params"].get<std::uint64_t>(), 2 * shard);
  EXPECT_EQ(r0["shard_elements"].get<std::uint64_t>(), shard);  // the sharded gradients
  // FSDP2's gradient peak, layer 0's backward done: the 79 layers above reduced (a layer's
  // 855,654,400 parameters / 8 each), lm_head's and the final norm's unsharded gradients and
  // layer 0's own: more than the root's post-backward (80 layers' shards + 2 × 32000 × 8192 +
  // 8192).
  const std::uint64_t layer = (68976648192ull - 2ull * 32000 * 8192 - 8192) / 80;
  EXPECT_EQ(layer, 855654400u);
  EXPECT_EQ(r0["figures"]["gradients"].get<std::uint64_t>(),
            2 * (79 * (layer / 8) + 32000ull * 8192 + 8192 + layer));
  EXPECT_EQ(r0["figures"]["optimizer_states"].get<std::uint64_t>(), 12 * shard);
  EXPECT_EQ(r0["owned_elements"].get<std::uint64_t>(), shard);
  EXPECT_EQ(r0["padding_elements"], 0);
  EXPECT_EQ(r0["host_bytes"].get<std::uint64_t>(), 4u * (80 * 9 + 3));
  const auto same = run({"--sharding", "per-parameter", "--zero", "FULL_SHARD"});
  ASSERT_EQ(same.code, 0) << same.err;
  EXPECT_EQ(nlohmann::json::parse(same.out)["ranks"], j["ranks"]);
  // An uneven model: tiny-awkward (V 71, 5 heads of 8, one kv head) on 4 ranks; the text says
  // which rank it shows and what it owns.
  const auto text = run_trainmem({"estimate", "--model", "tiny-awkward", "--world-size", "4",
                                  "--fsdp2", "--batch", "2", "--seq", "16"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_TRUE(contains(text.out, "ZeRO-3 per-parameter (FSDP2)")) << text.out;
  EXPECT_TRUE(contains(text.out, "data-parallel rank 0, which owns the most")) << text.out;
  EXPECT_TRUE(contains(text.out, "host: adamw.step")) << text.out;
  // profile on meta traces it and agrees with the analytic.
  const auto prof =
      run_trainmem({"profile", "--backend", "meta", "--model", "tiny-awkward", "--world-size", "4",
                    "--fsdp2", "--batch", "2", "--seq", "16", "--format", "json"});
  ASSERT_EQ(prof.code, 0) << prof.err;
  EXPECT_TRUE(nlohmann::json::parse(prof.out)["all_ranks_match"].get<bool>()) << prof.out;
  // --fsdp2 --zero SHARD_GRAD_OP: reshard_after_forward=False, every layer kept gathered from its
  // forward to its backward: the same states, more gathered at once.
  const auto sgo = run({"--fsdp2", "--zero", "SHARD_GRAD_OP"});
  ASSERT_EQ(sgo.code, 0) << sgo.err;
  const auto js = nlohmann::json::parse(sgo.out);
  EXPECT_EQ(js["layout"]["zero"], 3);
  EXPECT_FALSE(js["layout"]["reshard_after_forward"].get<bool>());
  EXPECT_TRUE(j["layout"]["reshard_after_forward"].get<bool>());
  EXPECT_EQ(js["ranks"][0]["figures"]["optimizer_states"], r0["figures"]["optimizer_states"]);
  EXPECT_GT(js["ranks"][0]["figures"]["peak"].get<std::uint64_t>(),
            r0["figures"]["peak"].get<std::uint64_t>());
}

TEST(CliLayout, ProfileTracesEveryRankOnMetaAndAgrees) {
  const auto r = run_trainmem({"profile",
                               "--backend",
                               "meta",
                               "--model",
                               "tiny-gqa",
                               "--world-size",
                               "8",
                               "--tp",
                               "2",
                               "--pp",
                               "2",
                               "--sp",
                               "--microbatches",
                               "3",
                               "--zero",
                               "1",
                               "--batch",
                               "2",
                               "--seq",
                               "32",
                               "--checkpointing",
                               "full",
                               "--format",
                               "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["all_ranks_match"].get<bool>());
  ASSERT_EQ(j["ranks"].size(), 2u);
  for (const auto& rank : j["ranks"]) {
    EXPECT_EQ(rank["ledger"]["peak"], rank["figures"]["peak"]);
    EXPECT_TRUE(rank["matches_analytic"].get<bool>());
  }
  EXPECT_EQ(j["run"]["backend"], "meta");
  const auto text = run_trainmem({"profile", "--backend", "meta", "--model", "tiny", "--world-size",
                                  "2", "--zero", "3", "--batch", "2", "--seq", "16"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_TRUE(contains(text.out, "TRACED on meta, per rank"));
  EXPECT_TRUE(contains(text.out, "every rank's ledger equals the analytic profile byte for byte"));
}

TEST(CliLayout, MaxbatchFindsTheLargestMicroBatchWhoseWorstRankFits) {
  const auto r = run_trainmem({"maxbatch", "--model", "llama-7b", "--world-size", "4", "--pp", "2",
                               "--microbatches", "4", "--zero", "1", "--seq", "1024", "--budget",
                               "40GiB", "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const std::int64_t best = j["best"];
  ASSERT_GT(best, 0);
  // Independently: the per-rank closed form (equal to the trace) plus its overheads fits at
  // `best` and not at best + 1.
  const ModelConfig m = *find_preset("llama-7b");
  auto need = [&](std::int64_t b) {
    TrainConfig t;
    t.batch = b;
    t.seq = 1024;
    ParallelConfig p;
    p.world = 4;
    p.pp = 2;
    p.microbatches = 4;
    p.zero = 1;
    p.resolve(false, m, t);
    return estimate_layout(m, t, p).worst_total();
  };
  const std::uint64_t budget = 40ull << 30;
  EXPECT_LE(need(best), budget);
  EXPECT_GT(need(best + 1), budget);
  EXPECT_EQ(j["budget"].get<std::uint64_t>(), budget);
  const auto bad = run_trainmem({"maxbatch", "--model", "llama-7b", "--world-size", "2", "--budget",
                                 "40GiB", "--overhead", "1GiB"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(contains(bad.err, "--overhead with --world-size above 1")) << bad.err;
}

// A mixture of experts per rank: the experts' own flat vector in the JSON, the books equal to
// the library's, the meta trace agreeing, --ep and --etp, and their bad values refused with the
// flag named.
TEST(CliLayout, MixtureOfExpertsPerRankAndTheExpertFlags) {
  const auto r = run_trainmem({"estimate", "--model", "tiny-qwen2-moe", "--world-size", "6", "--pp",
                               "3", "--zero", "1", "--microbatches", "3", "--batch", "2", "--seq",
                               "16", "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["ranks"].size(), 3u);
  // tiny-qwen2-moe: MoE layers 1 and 5 (decoder_sparse_step 2, layer 3 dense): stage 1 (layers
  // 2-3) holds no expert, stages 0 and 2 hold 6·3·40·64 expert elements each.
  const std::uint64_t experts = 6 * 3 * 40 * 64;
  EXPECT_EQ(j["ranks"][0]["expert_params"].get<std::uint64_t>(), experts);
  EXPECT_EQ(j["ranks"][1]["expert_params"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(j["ranks"][2]["expert_params"].get<std::uint64_t>(), experts);
  EXPECT_EQ(j["ranks"][0]["expert_shard_elements"].get<std::uint64_t>(), experts / 2);
  const auto p = run_trainmem({"profile", "--model", "tiny-qwen2-moe", "--world-size", "6", "--pp",
                               "3", "--zero", "1", "--microbatches", "3", "--batch", "2", "--seq",
                               "16", "--format", "json"});
  ASSERT_EQ(p.code, 0) << p.err;
  const auto pj = nlohmann::json::parse(p.out);
  EXPECT_TRUE(pj["all_ranks_match"].get<bool>()) << p.out.substr(0, 2000);
  ASSERT_EQ(pj["ranks"].size(), 3u);
  for (const auto& rank : pj["ranks"]) EXPECT_TRUE(rank["matches_analytic"].get<bool>());
  // --ep 2 (docs/distributed.md, "Expert parallelism"): 4 of tiny-qwen3-moe's 8 experts per
  // rank, edp 1, the meta trace of index 0 (which receives the most rows) agreeing.
  for (const std::string cmd : {"estimate", "profile"}) {
    const auto e = run_trainmem({cmd, "--model", "tiny-qwen3-moe", "--world-size", "2", "--ep", "2",
                                 "--zero", "1", "--batch", "1", "--seq", "11", "--format", "json"});
    ASSERT_EQ(e.code, 0) << e.err;
    const auto ej = nlohmann::json::parse(e.out);
    EXPECT_EQ(ej["layout"]["ep"], 2);
    EXPECT_EQ(ej["layout"]["edp"], 1);
    EXPECT_EQ(ej["ranks"][0]["expert_params"].get<std::uint64_t>(), 2u * 4 * 3 * 36 * 64);
    if (cmd == "profile") {
      EXPECT_TRUE(ej["all_ranks_match"].get<bool>());
    }
  }
  // --ep 2 --etp 2 over 4 ranks (docs/distributed.md, "Expert tensor parallelism"): 4 of the 8
  // experts per rank, 36/2 = 18 columns of each: 2 layers · 4 · 3 · 18 · 64 elements; edp 1.
  {
    const auto et = run_trainmem({"profile", "--model", "tiny-qwen3-moe", "--world-size", "4",
                                  "--ep", "2", "--etp", "2", "--zero", "1", "--batch", "1", "--seq",
                                  "12", "--format", "json"});
    ASSERT_EQ(et.code, 0) << et.err;
    const auto ej = nlohmann::json::parse(et.out);
    EXPECT_TRUE(ej["all_ranks_match"].get<bool>());
    EXPECT_EQ(ej["layout"]["etp"], 2);
    EXPECT_EQ(ej["layout"]["edp"], 1);
    EXPECT_EQ(ej["ranks"][0]["expert_params"].get<std::uint64_t>(), 2u * 4 * 3 * 18 * 64);
  }
  // --zero 3 with --ep 2 over 4 ranks (docs/distributed.md, "ZeRO-3 and offload of the experts";
  // worked in test_analytic_rank.cpp ZeroThreeShardsTheExpertsOverTheirGroup): the dense shard
  // 51,488/4 = 12,872 elements, the experts' 55,296/2 = 27,648, both in bf16 params: 81,040 B; the
  // trace of every rank equal to the analytic.
  {
    const auto z3 =
        run_trainmem({"profile", "--model", "tiny-qwen3-moe", "--world-size", "4", "--ep", "2",
                      "--zero", "3", "--batch", "1", "--seq", "12", "--format", "json"});
    ASSERT_EQ(z3.code, 0) << z3.err;
    const auto zj = nlohmann::json::parse(z3.out);
    EXPECT_TRUE(zj["all_ranks_match"].get<bool>());
    EXPECT_EQ(zj["ranks"][0]["shard_elements"].get<std::uint64_t>(), 12872u);
    EXPECT_EQ(zj["ranks"][0]["expert_shard_elements"].get<std::uint64_t>(), 27648u);
    EXPECT_EQ(zj["ranks"][0]["figures"]["params"].get<std::uint64_t>(), 81040u);
  }
  // Qwen1.5-MoE's shared expert under --tp 2 --sp: split like the dense MLP (gate/up rows, down
  // columns), its gate (1, h) replicated. Per rank and layer: q/k/v/o 4·h·h/2, the q/k/v biases
  // 3·h/2, two norms 2h, the router E·h, the 60 experts whole (ep 1) 60·3·1408·h, the shared
  // expert 3·(5632/2)·h and its gate h; 24 layers, the embedding and the untied lm_head V/2·h
  // each, the final norm h (h 2048, V 151936).
  {
    const std::uint64_t h = 2048, layer = 4 * h * h / 2 + 3 * h / 2 + 2 * h + 60 * h +
                                          60ull * 3 * 1408 * h + 3 * (5632 / 2) * h + h;
    const auto sh =
        run_trainmem({"profile", "--model", "qwen1.5-moe-a2.7b", "--world-size", "4", "--tp", "2",
                      "--sp", "--zero", "1", "--seq", "64", "--batch", "1", "--format", "json"});
    ASSERT_EQ(sh.code, 0) << sh.err;
    const auto sj = nlohmann::json::parse(sh.out);
    EXPECT_TRUE(sj["all_ranks_match"].get<bool>());
    EXPECT_EQ(sj["ranks"][0]["local_params"].get<std::uint64_t>(),
              24 * layer + 2 * (151936 / 2) * h + h);
  }
  // --tp 2 --sp beside --ep 4 (docs/distributed.md, "Tensor parallelism of a mixture of
  // experts"): the attention split, whole experts placed over the stage's 4 dp·tp slots, their
  // states over edp = 8/4 = 2; the trace of slot 0 (ep index 0) equal to the analytic.
  const auto tpe = run_trainmem({"profile", "--model", "qwen3-30b-a3b", "--world-size", "8", "--tp",
                                 "2", "--sp", "--ep", "4", "--zero", "1", "--seq", "512", "--batch",
                                 "1", "--format", "json"});
  ASSERT_EQ(tpe.code, 0) << tpe.err;
  const auto tj = nlohmann::json::parse(tpe.out);
  EXPECT_TRUE(tj["all_ranks_match"].get<bool>());
  EXPECT_EQ(tj["layout"]["edp"], 2);
  // 48 layers of 128/4 = 32 experts of 3·768·2048 elements on every rank.
  EXPECT_EQ(tj["ranks"][0]["expert_params"].get<std::uint64_t>(), 48ull * 32 * 3 * 768 * 2048);
  // output_router_logits (the real tiny Mixtral config with router_aux_loss_coef 0.5) at ep 2:
  // every rank's trace equal to the analytic, the note naming whose tokens the loss counts.
  {
    const auto aux = run_trainmem(
        {"profile", "--model",
         std::string(TRAINMEM_TEST_DATA_DIR) + "/golden_tiny_mixtral_aux_config.json",
         "--world-size", "4", "--ep", "2", "--batch", "1", "--seq", "12", "--format", "json"});
    ASSERT_EQ(aux.code, 0) << aux.err;
    const auto aj = nlohmann::json::parse(aux.out);
    EXPECT_TRUE(aj["all_ranks_match"].get<bool>());
    EXPECT_TRUE(contains(aux.out, "over each rank's own tokens and micro-batch, as HF under DDP"))
        << aux.out;
  }
  // --routing balanced is the trace's own routing (routing files per rank:
  // test_routing_per_rank.cpp): no section of given routing.
  const auto routed = run_trainmem({"profile", "--model", "tiny-qwen3-moe", "--world-size", "2",
                                    "--routing", "balanced", "--batch", "1", "--seq", "8"});
  EXPECT_EQ(routed.code, 0) << routed.err;
  EXPECT_FALSE(contains(routed.out, "Every rank given the routing")) << routed.out;
  const auto text = run_trainmem({"estimate", "--model", "tiny-qwen3-moe", "--world-size", "2",
                                  "--ep", "2", "--batch", "1", "--seq", "11"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_TRUE(contains(text.out, "ep 2 × etp 1 (edp 1)")) << text.out;
  EXPECT_TRUE(contains(text.out, "expert-parallel index 0, whose experts receive the most"))
      << text.out;
  const struct {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{"--model", "llama-7b", "--world-size", "2", "--ep", "2"},
       "--ep 2: llama-7b is not a mixture of experts"},
      {{"--model", "tiny-mixtral", "--world-size", "4", "--ep", "2"},
       "--ep 2: the model's num_local_experts (5) is not divisible by it"},
      {{"--model", "tiny-mixtral", "--world-size", "4", "--etp", "3"},
       "--etp 3: the model's intermediate_size (88) is not divisible by it"},
      {{"--model", "qwen3-30b-a3b", "--world-size", "2", "--tp", "2", "--seq", "512"},
       "--tp 2 with a mixture of experts (qwen3-30b-a3b) needs --sp: each tensor-parallel rank "
       "routes its own s/tp rows"},
      {{"--model", "tiny-qwen3-moe", "--world-size", "2", "--fsdp2"},
       "--sharding per-parameter (--fsdp2) with a mixture of experts (tiny-qwen3-moe): FSDP2 of "
       "the experts"},
      {{"--model", "tiny-qwen3-moe", "--world-size", "2", "--ep", "x"}, "--ep"},
      // output_router_logits per rank: each rank's own tokens at dp, ep and etp; a pipeline
      // stage holds part of the layers' counts.
      {{"--model", std::string(TRAINMEM_TEST_DATA_DIR) + "/golden_tiny_mixtral_aux_config.json",
        "--world-size", "2", "--pp", "2"},
       "output_router_logits with --pp 2 --tp 1 --cp 1 with a mixture of experts"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"estimate"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const auto e = run_trainmem(args);
    EXPECT_EQ(e.code, 2) << c.message;
    EXPECT_TRUE(contains(e.err, c.message)) << "expected: " << c.message << "\ngot: " << e.err;
  }
}

TEST(CliLayout, BadLayoutsExitTwoNamingTheFlag) {
  const struct {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{"--world-size", "8", "--dp", "3"}, "--world-size 8 must equal --dp × --tp × --pp"},
      {{"--world-size", "6", "--tp", "4"}, "--world-size 6 is not divisible by --tp × --pp"},
      {{"--world-size", "3", "--tp", "3"}, "--tp 3: the model's num_attention_heads (32)"},
      {{"--world-size", "3", "--pp", "3"}, "--pp 3: the model's num_hidden_layers (32)"},
      {{"--world-size", "2", "--sp"}, "--sp needs --tp 2 or more"},
      {{"--world-size", "4", "--pp", "2", "--zero", "3"}, "--zero 3 with --pp 2"},
      {{"--world-size", "2", "--zero", "7"}, "--zero: '7' is not a stage"},
      {{"--world-size", "2", "--offload", "disk"}, "--offload: 'disk' is not allowed"},
      {{"--world-size", "2", "--zero", "2", "--offload", "optimizer+params"},
       "--offload optimizer+params needs --zero 3"},
      {{"--world-size", "2", "--zero", "2", "--reduce-bucket", "1.5"},
       "--reduce-bucket: '1.5' is not a whole number"},
      {{"--world-size", "2", "--optimizer", "lomo"}, "--optimizer lomo"},
      {{"--world-size", "2", "--optimizer", "all"}, "--optimizer all: with --world-size above 1"},
      {{"--world-size", "2", "--explain"}, "--explain: not yet available with --world-size"},
      {{"--world-size", "2", "--cuda-context", "lots"}, "--cuda-context"},
      {{"--world-size", "0"}, "--world-size must be at least 1"},
      {{"--world-size", "2", "--sharding", "fsdp"}, "--sharding: 'fsdp' is not allowed"},
      {{"--world-size", "2", "--sharding", "per-parameter"},
       "--sharding per-parameter with --zero 0"},
      {{"--world-size", "2", "--fsdp2", "--zero", "1"}, "--fsdp2 with --zero 1"},
      {{"--world-size", "2", "--fsdp2", "--sharding", "flat"}, "--fsdp2 with --sharding flat"},
      {{"--world-size", "2", "--fsdp2", "--offload", "optimizer"},
       "--sharding per-parameter with --offload optimizer"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"estimate", "--model", "llama-7b"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const auto r = run_trainmem(args);
    EXPECT_EQ(r.code, 2) << c.message;
    EXPECT_TRUE(contains(r.err, c.message)) << "expected: " << c.message << "\ngot: " << r.err;
  }
  const auto r = run_trainmem({"profile", "--backend", "cpu", "--model", "tiny", "--world-size",
                               "2", "--batch", "1", "--seq", "8"});
  // The measured multi-rank run needs an MPI launch: exit 2 saying so and what it measures
  // (tests/test_cli_launch.cpp checks the launcher lines).
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "--backend cpu --world-size 2: ")) << r.err;
  EXPECT_TRUE(contains(r.err, "mpirun -np 2 trainmem profile")) << r.err;
  EXPECT_TRUE(
      contains(r.err, "Measured multi-rank runs cover data, tensor and pipeline parallelism"))
      << r.err;
  // A measured run's flags on the meta trace: exit 2 naming them and the measured run instead.
  for (const std::string cmd : {"profile", "compare"}) {
    const auto m = run_trainmem({cmd, "--model", "tiny", "--world-size", "2", "--batch", "1",
                                 "--seq", "8", "--device-budget", "1G", "--dump", "d.safetensors"});
    EXPECT_EQ(m.code, 2) << cmd;
    EXPECT_TRUE(contains(m.err,
                         "--dump, --device-budget with --world-size 2 on meta: the trace of "
                         "every rank moves no data"))
        << m.err;
    EXPECT_TRUE(contains(m.err, "`mpirun -np 2 trainmem " + cmd)) << m.err;
    EXPECT_TRUE(contains(m.err, "--dump only on a single rank")) << m.err;
    // --collectives outside a measured multi-rank run: exit 2 saying where it applies.
    for (const std::vector<std::string>& where :
         {std::vector<std::string>{"--world-size", "2"}, std::vector<std::string>{}}) {
      std::vector<std::string> args = {cmd,     "--model", "tiny",          "--batch", "1",
                                       "--seq", "8",       "--collectives", "mpi"};
      args.insert(args.end(), where.begin(), where.end());
      const auto k = run_trainmem(args);
      EXPECT_EQ(k.code, 2) << cmd;
      EXPECT_TRUE(contains(k.err,
                           "--collectives mpi: it chooses the collectives of a measured "
                           "multi-rank run"))
          << k.err;
    }
  }
}

}  // namespace
}  // namespace trainmem::cli
