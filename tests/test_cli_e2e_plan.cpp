// End to end: `trainmem plan` from the built binary, with the real per-rank estimate
// (estimate_layout): the tiny model's enumeration in JSON (counts as tests/test_plan.cpp counts
// them by hand, every shown layout within the budget, fastest first, refused families with their
// reasons), the same report as CSV, Markdown and text, nothing fitting exits 3 with the reasons
// written, LLaMA-2-70B on 8 × 80 GiB, and bad flags exit 2 naming the flag.
#include <gtest/gtest.h>

#include <set>

#include "test_cli_e2e_helpers.hpp"

namespace trainmem::e2e {
namespace {

// The none and full policies without context parallelism, as tests/test_plan.cpp counts them.
const std::string kTiny =
    "plan --model tiny --gpus 4 --gpu-memory 16GiB --seq 16 --global-batch 8 "
    "--checkpointing none,full --activation-offload off --cp 1";

TEST(CliE2EPlan, TinyJsonCountsRanksAndRejects) {
  const Result r = trainmem(kTiny + " --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  EXPECT_EQ(j["schema"], "trainmem/1");
  EXPECT_EQ(j["command"], "plan");
  const std::uint64_t gpu = std::uint64_t{16} << 30;
  EXPECT_EQ(j["inputs"]["gpu_memory"].get<std::uint64_t>(), gpu);
  const std::uint64_t budget = j["inputs"]["budget"].get<std::uint64_t>();
  EXPECT_EQ(budget, gpu - gpu / 20);  // 16 GiB × 0.05 is a whole number of bytes
  EXPECT_EQ(j["counts"]["enumerated"].get<int>(), 432);
  EXPECT_EQ(j["counts"]["invalid"].get<int>(), 76);
  EXPECT_EQ(j["counts"]["fitting"].get<int>() + j["counts"]["too_big"].get<int>(), 356);
  ASSERT_EQ(j["candidates"].size(), 10u);
  double last = 0;
  for (const auto& c : j["candidates"]) {
    const auto& m = c["memory"];
    ASSERT_TRUE(m.is_object());
    EXPECT_LE(m["worst_total"].get<std::uint64_t>(), budget);
    std::uint64_t worst_peak = 0;
    for (const auto& rank : m["ranks"])
      worst_peak = std::max(worst_peak, rank["peak"].get<std::uint64_t>());
    EXPECT_EQ(m["worst_total"].get<std::uint64_t>(),
              worst_peak + m["overheads"]["cuda_context"].get<std::uint64_t>() +
                  m["overheads"]["nccl"].get<std::uint64_t>());
    const double t = c["cost"]["total_seconds"].get<double>();
    EXPECT_GE(t, last);
    last = t;
    const auto& l = c["layout"];
    EXPECT_EQ(l["dp"].get<int>() * l["tp"].get<int>() * l["pp"].get<int>(), 4);
    EXPECT_EQ(l["micro_batch"].get<int>() * l["microbatches"].get<int>() * l["dp"].get<int>(), 8);
  }
  bool pp4 = false;
  for (const auto& f : j["rejected"])
    if (f["family"] == "dp 1 tp 1 pp 4 ZeRO-0") {
      pp4 = true;
      EXPECT_EQ(f["reason"].get<std::string>().rfind("does not divide the model: --pp 4", 0), 0u)
          << f["reason"];
    }
  EXPECT_TRUE(pp4) << j["rejected"].dump(1);
}

// --fsdp2: only FSDP2's layouts, sharded per parameter, no offload: FULL_SHARD and
// SHARD_GRAD_OP (ZeRO-3 with reshard_after_forward=False, what --fsdp2 --zero 2 runs); each
// shown candidate's memory is the per-rank estimate of that layout, and --sharding
// per-parameter keeps ZeRO-0 and 1 flat while its stages 2 and 3 are FSDP2's.
TEST(CliE2EPlan, Fsdp2EnumeratesPerParameterZeroThree) {
  const std::string awkward =
      "plan --model tiny-awkward --gpus 4 --gpu-memory 16GiB --seq 16 --global-batch 8 "
      "--checkpointing none,full --activation-offload off --cp 1";
  const Result r = trainmem(awkward + " --fsdp2 --top 400 --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  ASSERT_FALSE(j["candidates"].empty());
  std::set<bool> reshard;
  for (const auto& c : j["candidates"]) {
    EXPECT_EQ(c["layout"]["zero"], 3) << c.dump();
    EXPECT_EQ(c["layout"]["sharding"], "per-parameter") << c.dump();
    EXPECT_EQ(c["layout"]["offload"], "none") << c.dump();
    reshard.insert(c["layout"]["reshard_after_forward"].get<bool>());
  }
  EXPECT_EQ(reshard, (std::set<bool>{false, true}));  // SHARD_GRAD_OP and FULL_SHARD
  for (const auto& f : j["rejected"]) {
    const std::string fam = f["family"];
    EXPECT_TRUE(fam.find("ZeRO-3") != std::string::npos || fam.find("ZeRO-2") != std::string::npos)
        << f.dump();
  }
  const Result both = trainmem(awkward + " --sharding per-parameter --top 400 --format json");
  ASSERT_EQ(both.code, 0) << both.err;
  std::set<std::string> seen;
  const json jb = both.j();
  for (const auto& c : jb["candidates"]) {
    const int zero = c["layout"]["zero"];
    EXPECT_NE(zero, 2) << c.dump();  // stage 2 is SHARD_GRAD_OP: ZeRO-3 gathered fwd to bwd
    EXPECT_EQ(c["layout"]["sharding"], zero == 3 ? "per-parameter" : "flat") << c.dump();
    seen.insert(std::to_string(zero) +
                (c["layout"]["reshard_after_forward"].get<bool>() ? "" : " SHARD_GRAD_OP"));
  }
  EXPECT_EQ(seen, (std::set<std::string>{"0", "1", "3", "3 SHARD_GRAD_OP"}));
  const Result bad = trainmem(awkward + " --fsdp2 --sharding flat");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--fsdp2 with --sharding flat"), std::string::npos) << bad.err;
  const Result bad2 = trainmem(awkward + " --sharding fsdp");
  EXPECT_EQ(bad2.code, 2);
  EXPECT_NE(bad2.err.find("--sharding: 'fsdp' is not allowed"), std::string::npos) << bad2.err;
}

TEST(CliE2EPlan, TinyCsvMarkdownAndTextSayTheSame) {
  const Result csv = trainmem(kTiny + " --format csv --top 3");
  ASSERT_EQ(csv.code, 0) << csv.err;
  const auto rows = parse_csv(csv.out);
  ASSERT_EQ(rows.size(), 4u) << csv.out;
  EXPECT_EQ(rows[0][0], "rank");
  EXPECT_EQ(rows[1][0], "1");
  const Result md = trainmem(kTiny + " --format markdown --top 3");
  ASSERT_EQ(md.code, 0) << md.err;
  const auto tables = parse_markdown_tables(md.out);
  ASSERT_EQ(tables.size(), 2u) << md.out;  // the best layouts, the refused families
  EXPECT_EQ(tables[0].size(), 1u + 3u);    // header + 3 rows
  const Result text = trainmem(kTiny + " --top 3");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("The best 3 layouts, fastest first"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("dp 1 tp 1 pp 4 ZeRO-0"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("432 layouts enumerated"), std::string::npos) << text.out;
  const std::string path = temp_path("plan.json");
  const Result file = trainmem(kTiny + " --format json --output '" + path + "'");
  ASSERT_EQ(file.code, 0) << file.err;
  EXPECT_TRUE(file.out.empty());
  EXPECT_EQ(json::parse(slurp(path))["counts"]["enumerated"].get<int>(), 432);
  std::remove(path.c_str());
}

TEST(CliE2EPlan, NothingFitsExitsThreeWithEachFamilysReason) {
  const Result r = trainmem(
      "plan --model tiny --gpus 4 --gpu-memory 1MiB --seq 16 --global-batch 8 --cp 1 "
      "--format json");
  EXPECT_EQ(r.code, 3) << r.err;
  const json j = r.j();
  EXPECT_TRUE(j["candidates"].empty());
  EXPECT_EQ(j["counts"]["fitting"].get<int>(), 0);
  ASSERT_EQ(j["rejected"].size(), 15u);  // every (dp, tp, pp, ZeRO) family
  for (const auto& f : j["rejected"]) {
    const std::string reason = f["reason"];
    if (f["smallest"].is_null()) {
      EXPECT_TRUE(reason.rfind("does not divide the model", 0) == 0 ||
                  reason.rfind("not supported", 0) == 0)
          << reason;
    } else {
      EXPECT_EQ(reason.rfind("smallest worst-rank peak + overheads ", 0), 0u) << reason;
      EXPECT_GT(f["smallest_worst_total"].get<std::uint64_t>(), j["inputs"]["budget"]);
    }
  }
  const Result t =
      trainmem("plan --model tiny --gpus 4 --gpu-memory 1MiB --seq 16 --global-batch 8");
  EXPECT_EQ(t.code, 3);
  EXPECT_NE(t.out.find("nothing fits"), std::string::npos) << t.out;
}

TEST(CliE2EPlan, Llama2_70bOnEightGpus) {
  const Result r = trainmem(
      "plan --model llama2-70b --gpus 8 --gpu-memory 80GiB --seq 4096 --global-batch 64 "
      "--format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  ASSERT_FALSE(j["candidates"].empty());
  for (const auto& c : j["candidates"])
    EXPECT_LE(c["memory"]["worst_total"].get<std::uint64_t>(),
              j["inputs"]["budget"].get<std::uint64_t>());
  // Plain data parallelism holds 70B parameters' states on every GPU: it cannot fit.
  bool dp8 = false;
  for (const auto& f : j["rejected"])
    if (f["family"] == "dp 8 tp 1 pp 1 ZeRO-0") {
      dp8 = true;
      EXPECT_GT(f["smallest_worst_total"].get<std::uint64_t>(), std::uint64_t{76} << 30);
    }
  EXPECT_TRUE(dp8) << j["rejected"].dump(1);
}

TEST(CliE2EPlan, HelpListsPlanAndItsFlags) {
  const Result top = trainmem("--help");
  EXPECT_EQ(top.code, 0);
  EXPECT_NE(top.out.find("plan"), std::string::npos) << top.out;
  const Result r = trainmem("plan --help");
  EXPECT_EQ(r.code, 0);
  for (const char* flag : {"--gpus", "--gpu-memory", "--global-batch", "--margin", "--top",
                           "--tflops", "--link-gbps", "--pcie-gbps", "--format", "--output"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag << "\n" << r.out;
}

// --profile hf-sdpa|hf-eager (docs/plan.md, "The HF step"): the HF step per rank under FSDP2,
// which models data parallelism alone and one micro-batch: over 4 GPUs at G 8 the layouts are
// dp 4 × b 2 × M 1, FULL_SHARD and SHARD_GRAD_OP, checkpointing none and full: 4 of them. Each
// candidate's memory is what `estimate --profile hf-sdpa --world-size 4 --fsdp2` prints for it
// (its worst total and every distinct rank's peak: tiny-awkward's odd rows make the last rank
// differ), and the refusals name the flag.
TEST(CliE2EPlan, TheHfStepUnderFsdp2IsPlannedAsEstimateGivesIt) {
  const std::string base =
      "plan --model tiny-awkward --gpus 4 --gpu-memory 1GiB --seq 16 --global-batch 8";
  const Result r = trainmem(base + " --profile hf-sdpa --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  EXPECT_EQ(j["counts"]["enumerated"].get<int>(), 4);
  EXPECT_EQ(j["counts"]["fitting"].get<int>(), 4);
  EXPECT_EQ(j["inputs"]["step"], "hf-sdpa");
  EXPECT_NE(
      j["inputs"]["step_description"].get<std::string>().find("the HF step per rank under FSDP2"),
      std::string::npos);
  ASSERT_EQ(j["candidates"].size(), 4u);
  std::set<std::string> seen;
  for (const auto& c : j["candidates"]) {
    const auto& l = c["layout"];
    EXPECT_EQ(l["dp"], 4);
    EXPECT_EQ(l["tp"].get<int>() * l["pp"].get<int>() * l["cp"].get<int>(), 1);
    EXPECT_EQ(l["micro_batch"], 2);
    EXPECT_EQ(l["microbatches"], 1);
    EXPECT_EQ(l["zero"], 3);
    EXPECT_EQ(l["sharding"], "per-parameter");
    const bool keep = !l["reshard_after_forward"].get<bool>();
    const std::string ck = l["checkpointing"];
    seen.insert(ck + (keep ? " SHARD_GRAD_OP" : " FULL_SHARD"));
    const Result e = trainmem(
        "estimate --model tiny-awkward --profile hf-sdpa --world-size 4 --fsdp2 --seq 16 "
        "--batch 2 --format json --checkpointing " +
        ck + (keep ? " --zero 2" : ""));
    ASSERT_EQ(e.code, 0) << e.err;
    const json ej = e.j();
    EXPECT_EQ(c["memory"]["worst_total"], ej["worst_total"]) << ck << keep;
    ASSERT_EQ(c["memory"]["ranks"].size(), ej["rank_groups"].size()) << ck << keep;
    for (std::size_t k = 0; k < ej["rank_groups"].size(); ++k)
      EXPECT_EQ(c["memory"]["ranks"][k]["peak"], ej["rank_groups"][k]["peak"]) << ck << keep << k;
  }
  EXPECT_EQ(seen, (std::set<std::string>{"none FULL_SHARD", "none SHARD_GRAD_OP", "full FULL_SHARD",
                                         "full SHARD_GRAD_OP"}));
  // hf-eager without overheads on 330 KiB (budget 321,024 B): full checkpointing fits, none does
  // not (the peaks are the estimate's, compared above for hf-sdpa).
  const Result eager = trainmem(
      "plan --model tiny-awkward --gpus 4 --gpu-memory 330KiB --seq 16 --global-batch 8 "
      "--profile hf-eager --cuda-context 0 --nccl-memory 0 --format json");
  ASSERT_EQ(eager.code, 0) << eager.err;
  const json ej = eager.j();
  EXPECT_EQ(ej["inputs"]["step"], "hf-eager");
  EXPECT_EQ(ej["counts"]["enumerated"].get<int>(), 4);
  EXPECT_EQ(ej["counts"]["fitting"].get<int>(), 2);
  EXPECT_EQ(ej["counts"]["too_big"].get<int>(), 2);
  for (const auto& c : ej["candidates"]) {
    EXPECT_EQ(c["layout"]["checkpointing"], "full");
    EXPECT_EQ(c["layout"]["attention"], "eager");
    EXPECT_LE(c["memory"]["worst_total"].get<std::uint64_t>(), 321024u);
  }
  const std::pair<std::string, std::string> bad[] = {
      {" --profile hf-peft", "--profile hf-peft: plan searches with native"},
      {" --precision pure", "--precision pure: plan applies it to the HF step"},
      {" --profile hf-sdpa --precision amp", "--precision amp with --profile hf-sdpa"},
      {" --profile hf-sdpa --checkpointing selective",
       "--checkpointing selective with --profile hf-sdpa: the HF step models none and full"},
      {" --profile hf-sdpa --sharding flat", "--sharding flat with --profile hf-sdpa"},
      {" --profile hf-sdpa --cp 2", "--cp 2 with --profile hf-sdpa"},
      {" --profile hf-sdpa --finetune lora", "--profile hf-sdpa with --finetune lora"},
      {" --profile hf-eager --optimizer sgd", "--optimizer sgd with --profile hf-eager"},
      {" --profile hf-eager --optimizer all", "--optimizer all with --profile hf-eager"},
  };
  for (const auto& [args, message] : bad) {
    const Result b = trainmem(base + args);
    EXPECT_EQ(b.code, 2) << args << "\n" << b.err;
    EXPECT_NE(b.err.find(message), std::string::npos) << args << "\n" << b.err;
  }
  const Result one = trainmem(
      "plan --model tiny --gpus 1 --gpu-memory 1GiB --seq 16 --global-batch 2 --profile hf-sdpa");
  EXPECT_EQ(one.code, 2);
  EXPECT_NE(one.err.find("--gpus 1 (`maxbatch --profile hf-sdpa` answers for one GPU)"),
            std::string::npos)
      << one.err;
  const Result moe = trainmem(
      "plan --model tiny-mixtral --gpus 2 --gpu-memory 1GiB --seq 16 --global-batch 2 --profile "
      "hf-sdpa");
  EXPECT_EQ(moe.code, 2);
  EXPECT_NE(moe.err.find("--model"), std::string::npos) << moe.err;
}

TEST(CliE2EPlan, BadFlagsExitTwoNamingTheFlag) {
  const std::string ok = " --gpu-memory 16GiB --seq 16";
  const std::pair<std::string, std::string> cases[] = {
      {"plan --model tiny --gpu-memory 16GiB --global-batch 8", "--gpus is required"},
      {"plan --model tiny --gpus 4 --global-batch 8", "--gpu-memory is required"},
      {"plan --model tiny --gpus 4" + ok, "--global-batch is required"},
      {"plan --model tiny --gpus 0 --global-batch 8" + ok, "--gpus must be from 1 to 65536, got 0"},
      // Bounds keep the search's time bounded (the layouts are the divisors of --gpus).
      {"plan --model tiny --gpus 9223372036854775807 --global-batch 8" + ok,
       "--gpus must be from 1 to 65536, got 9223372036854775807"},
      {"plan --model tiny --gpus 4 --global-batch 4294967296" + ok,
       "--global-batch must be from 1 to 16777216 sequences, got 4294967296"},
      {"plan --model tiny --gpus x --global-batch 8" + ok, "--gpus"},
      {"plan --model tiny --gpus 4 --global-batch 0" + ok,
       "--global-batch must be from 1 to 16777216 sequences, got 0"},
      {"plan --model tiny --gpus 3 --global-batch 4" + ok,
       "--global-batch 4: not divisible by any data-parallel degree"},
      {"plan --model tiny --gpus 4 --global-batch 8 --gpu-memory lots", "--gpu-memory"},
      {"plan --model tiny --gpus 4 --global-batch 8 --margin 1" + ok, "--margin"},
      {"plan --model tiny --gpus 4 --global-batch 8 --tflops 0" + ok, "--tflops"},
      {"plan --model tiny --gpus 4 --global-batch 8 --link-gbps -1" + ok, "--link-gbps"},
      {"plan --model tiny --gpus 4 --global-batch 8 --pcie-gbps 0" + ok, "--pcie-gbps"},
      {"plan --model tiny --gpus 4 --global-batch 8 --top 0" + ok, "--top"},
      {"plan --model tiny --gpus 4 --global-batch 8 --optimizer adam" + ok, "--optimizer"},
      {"plan --model tiny --gpus 4 --global-batch 8 --format xml" + ok, "--format"},
      {"plan --model tiny --gpus 4 --global-batch 8 --seq 1 --gpu-memory 1GiB", "--seq"},
      {"plan --model tiny --gpus 4 --global-batch 8 --cuda-context lots" + ok, "--cuda-context"},
      {"plan --model nope --gpus 4 --global-batch 8" + ok, "--model"},
      {"plan --model tiny --gpus 4 --global-batch 8 --nccl-channels 0" + ok, "--nccl-channels"},
      {"plan --model tiny --gpus 4 --global-batch 8 --checkpointing every:1" + ok,
       "--checkpointing every:1: K must be an integer >= 2"},
      {"plan --model tiny --gpus 4 --global-batch 8 --checkpointing none,sometimes" + ok,
       "--checkpointing: unknown policy 'sometimes'"},
      {"plan --model tiny --gpus 4 --global-batch 8 --checkpointing full,full" + ok,
       "'full' is listed twice"},
      {"plan --model tiny --gpus 4 --global-batch 8 --activation-offload maybe" + ok,
       "--activation-offload: unknown 'maybe'"},
      {"plan --model tiny --gpus 4 --global-batch 8 --host-memory lots" + ok, "--host-memory"},
  };
  for (const auto& [args, message] : cases) {
    const Result r = trainmem(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << args << " wrote a report: " << r.out;
  }
}

// The default policies (activation offload off): none, selective (eager only: with flash it is the
// plain step), every:2, full and budget; each (dp, tp, pp, ZeRO, offload, sp) setting has 5 eager
// and 4 flash policies where the counts above have 2 and 2, so every count is 9/4 of theirs, and
// the fitting budget layouts that are the none or full layout are counted once, under that policy.
TEST(CliE2EPlan, TheDefaultPoliciesAreNineFourthsOfNoneAndFull) {
  const Result r = trainmem(
      "plan --model tiny --gpus 4 --gpu-memory 16GiB --seq 16 --global-batch 8 --top 1000 "
      "--activation-offload off --cp 1 --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  const auto count = [&](const char* k) { return j["counts"][k].get<int>(); };
  EXPECT_EQ(count("enumerated"), 972);
  EXPECT_EQ(count("invalid"), 171);
  EXPECT_EQ(count("fitting") + count("too_big") + count("same_as_none_or_full"), 801);
  std::set<std::string> names;
  for (const auto& c : j["candidates"]) {
    std::string name = c["layout"]["checkpointing"].get<std::string>();
    if (name.rfind("budget:", 0) == 0) name = "budget";
    names.insert(name);
    if (name == "selective") {
      EXPECT_EQ(c["layout"]["attention"], "eager");
    }
  }
  EXPECT_EQ(names, (std::set<std::string>{"none", "selective", "every:2", "full"}))
      << "16 GiB fits every tiny layout with no layer checkpointed: budget is none's layout";
}

// docs/distributed.md's worked example: LLaMA-3-8B at s 131072 on 8 GPUs of 80 GiB. Without
// context parallelism or activation offload no layout fits without recompute and the fastest
// checkpoints some layers only; with activation offload, what a rank offloads is bounded by
// --host-memory; with context parallelism (the default search) the fastest recomputes nothing,
// and is faster than the best without it.
TEST(CliE2EPlan, Llama3_8bAtLongContextNeedsSomeLayersCheckpointed) {
  const std::string base =
      "plan --model llama3-8b --gpus 8 --gpu-memory 80GiB --seq 131072 --global-batch 8 "
      "--top 50 --format json";
  const Result r = trainmem(base + " --activation-offload off --cp 1");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  ASSERT_FALSE(j["candidates"].empty());
  for (const auto& c : j["candidates"]) {
    EXPECT_NE(c["layout"]["checkpointing"], "none");
    EXPECT_NE(c["layout"]["checkpointing"], "selective");  // flash: selective is none
    EXPECT_LE(c["memory"]["worst_total"].get<std::uint64_t>(),
              j["inputs"]["budget"].get<std::uint64_t>());
  }
  const std::string best = j["candidates"][0]["layout"]["checkpointing"].get<std::string>();
  EXPECT_EQ(best.rfind("budget:76GiB (layers ", 0), 0u) << best;

  const std::uint64_t host = std::uint64_t{128} << 30;
  const Result h = trainmem(base + " --host-memory 128GiB --cp 1");
  ASSERT_EQ(h.code, 0) << h.err;
  const json jh = h.j();
  EXPECT_EQ(jh["inputs"]["host_memory"].get<std::uint64_t>(), host);
  int offloading = 0;
  for (const auto& c : jh["candidates"]) {
    for (const auto& rank : c["memory"]["ranks"])
      EXPECT_LE(rank["host_bytes"].get<std::uint64_t>(), host);
    offloading += c["layout"]["offload"] == "activations";
  }
  EXPECT_GT(offloading, 0);

  const Result cp = trainmem(base + " --activation-offload off");
  ASSERT_EQ(cp.code, 0) << cp.err;
  const json jc = cp.j();
  const json& top = jc["candidates"][0];
  EXPECT_GT(top["layout"]["cp"].get<int>(), 1) << top.dump();
  EXPECT_EQ(top["layout"]["checkpointing"], "none") << top.dump();
  EXPECT_LT(top["cost"]["total_seconds"].get<double>(),
            j["candidates"][0]["cost"]["total_seconds"].get<double>());
}

// Layouts with --offload-activations, their PCIe time the transfer, without pipeline
// parallelism only; none with --activation-offload off.
TEST(CliE2EPlan, ActivationOffloadIsEnumeratedWithoutPipelining) {
  const Result four = trainmem(
      "plan --model tiny --gpus 4 --gpu-memory 16GiB --seq 16 --global-batch 8 --top 1000 "
      "--format json");
  ASSERT_EQ(four.code, 0) << four.err;
  const json j4 = four.j();
  int with_offload = 0;
  for (const auto& c : j4["candidates"])
    if (c["layout"]["offload"] == "activations") {
      ++with_offload;
      EXPECT_EQ(c["layout"]["pp"], 1);
    }
  EXPECT_GT(with_offload, 0);
  EXPECT_GT(j4["counts"]["enumerated"].get<int>(), 972);
  const std::string base =
      "plan --model llama3.2-1b --gpus 1 --gpu-memory 40GiB --seq 16384 --global-batch 4 "
      "--top 100 --format json";
  const Result r = trainmem(base);
  ASSERT_EQ(r.code, 0) << r.err;
  int offloaded = 0;
  const json j = r.j();
  for (const auto& c : j["candidates"])
    if (c["layout"]["offload"] == "activations") {
      ++offloaded;
      EXPECT_GT(c["cost"]["pcie_seconds"].get<double>(), 0.0);
      EXPECT_GT(c["memory"]["ranks"][0]["host_bytes"].get<std::uint64_t>(), 0u);
    }
  EXPECT_GT(offloaded, 0);
  const Result off = trainmem(base + " --activation-offload off");
  ASSERT_EQ(off.code, 0) << off.err;
  const json jo = off.j();
  ASSERT_FALSE(jo["candidates"].empty());
  for (const auto& c : jo["candidates"]) EXPECT_NE(c["layout"]["offload"], "activations");
}

// --cp: the default (auto) searches every divisor of --gpus; 1,2 adds to kTiny's layouts the
// cp 2 ones tests/test_plan.cpp counts by hand (240 enumerated, 40 refused), each with flash
// attention and its ring traffic in the cost; a degree that does not divide --gpus exits 2.
TEST(CliE2EPlan, ContextParallelDegreesAreSearched) {
  const std::string base =
      "plan --model tiny --gpus 4 --gpu-memory 16GiB --seq 16 --global-batch 8 "
      "--checkpointing none,full --activation-offload off --top 1000 --format json";
  const Result two = trainmem(base + " --cp 1,2");
  ASSERT_EQ(two.code, 0) << two.err;
  const json j = two.j();
  EXPECT_EQ(j["counts"]["enumerated"].get<int>(), 432 + 240);
  EXPECT_EQ(j["counts"]["invalid"].get<int>(), 76 + 40);
  int cp2 = 0;
  for (const auto& c : j["candidates"]) {
    const auto& l = c["layout"];
    EXPECT_EQ(l["dp"].get<int>() * l["tp"].get<int>() * l["pp"].get<int>() * l["cp"].get<int>(), 4);
    if (l["cp"].get<int>() != 2) continue;
    ++cp2;
    EXPECT_EQ(l["attention"], "flash");
    EXPECT_GT(c["cost"]["cp_bytes"].get<double>(), 0.0);
  }
  EXPECT_EQ(cp2, 200);
  const Result autos = trainmem(base);  // cp 1, 2 and 4
  ASSERT_EQ(autos.code, 0) << autos.err;
  std::set<int> seen;
  const json ja = autos.j();
  for (const auto& c : ja["candidates"]) seen.insert(c["layout"]["cp"].get<int>());
  EXPECT_EQ(seen, (std::set<int>{1, 2, 4}));
  const Result bad = trainmem(base + " --cp 3");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--cp: '3' is not a context-parallel degree of --gpus 4"),
            std::string::npos)
      << bad.err;
}

}  // namespace
}  // namespace trainmem::e2e
