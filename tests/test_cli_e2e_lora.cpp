// End to end: `estimate --finetune lora|qlora` as a user types it (issue 28, the hf-peft
// profile). The model states are checked against bitsandbytes' layout and peft's adapter
// shapes written out here, not read from the analytic code; the activations against the
// real runs are tests/test_analytic_peft.cpp's.
#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "test_cli_e2e_helpers.hpp"
#include "trainmem/base/safetensors.hpp"

namespace trainmem::e2e {
namespace {

using u64 = std::uint64_t;

u64 n(const json& j) {
  return j.get<u64>();
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// bitsandbytes' bytes of one NF4 weight of `e` elements, blocksize 64, double quantization:
// packed pairs, one u8 absmax per block, one fp32 absmax per 256 blocks, the fp32 offset, the
// 16-entry code and the 256-entry nested code (fp32).
u64 nf4_dq(u64 e) {
  const u64 blocks = (e + 63) / 64;
  return (e + 1) / 2 + blocks + 4 * ((blocks + 255) / 256) + 4 + 16 * 4 + 256 * 4;
}

TEST(CliE2ELora, QloraOfLlama3_8bStoresEveryByteOfTheQuantizedModel) {
  const Result r = trainmem(
      "estimate --model llama3-8b --finetune qlora --lora-targets all-linear --batch 1 "
      "--seq 2048 --checkpointing --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  ASSERT_EQ(j["analytic"].size(), 2u) << "hf-peft and trainmem's own QLoRA step";
  const json& p = j["analytic"]["hf-peft"];
  // Llama-3-8B: h 4096, i 14336, 32 heads of 128, 8 kv heads, V 128256, 32 layers, untied.
  const u64 h = 4096, i = 14336, kd = 1024, V = 128256, L = 32, r16 = 16;
  const u64 per_layer_4bit = 2 * nf4_dq(h * h) + 2 * nf4_dq(kd * h) + 3 * nf4_dq(i * h);
  const u64 fp32_rest = 4 * (2 * V * h + 2 * h * L + h);  // embed, lm_head, norms
  // r·(in + out) per adapter: q (h,h), k (h,kd), v (h,kd), o (h,h), gate/up (h,i), down (i,h).
  const u64 trainable = L * r16 * (2 * (h + h) + 2 * (h + kd) + 3 * (h + i));
  EXPECT_EQ(trainable, 41943040u);
  EXPECT_EQ(n(p["trainable_params"]), trainable);
  EXPECT_EQ(n(p["params"]), L * per_layer_4bit + fp32_rest + 4 * trainable + 4 * 128);
  EXPECT_EQ(n(p["gradients"]), 4 * trainable);
  EXPECT_EQ(n(p["optimizer_states"]), 8 * trainable);
  // Checkpointed: each layer keeps its fp32 input (prepare_model_for_kbit_training upcast the
  // residual stream).
  EXPECT_EQ(n(p["per_layer_activations"]), 4 * 2048 * h);
  EXPECT_EQ(p["peft"]["quant"], "nf4");
  EXPECT_EQ(p["peft"]["double_quant"], true);
  EXPECT_EQ(p["peft"]["kbit_prepare"], true);
  EXPECT_EQ(p["peft"]["lora_targets"], "all-linear");
  // trainmem's own step stores the same 4-bit weights, and the rest in bf16 (no fp32 upcast;
  // bf16 adapters), without RoPE's buffers.
  const json& nat = j["analytic"]["native"];
  EXPECT_EQ(n(nat["params"]), L * per_layer_4bit + fp32_rest / 2 + 2 * trainable);
  EXPECT_EQ(n(nat["trainable_params"]), trainable);
  EXPECT_EQ(j["run"]["finetune"], "qlora");
  EXPECT_EQ(j["run"]["quant"], "nf4");
  // The text report says what it models.
  const Result t = trainmem("estimate --model llama3-8b --finetune qlora --batch 1 --seq 2048");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_TRUE(has(t.out, "hf-peft")) << t.out;
}

// QLoRA's own recipe: PagedAdamW8bit (the QLoRA paper's optimizer; HF Trainer's
// optim="paged_adamw_8bit"). Every adapter of Llama-3-8B r 16 all-linear has 4,096 elements or
// more: uint8 m and v plus an fp32 absmax per 256; those of 100,000 or more (gate/up lora_B and
// down lora_A, 14,336 × 16) in CUDA managed memory, reported apart and left out of the peak.
TEST(CliE2ELora, PagedAdamw8bitKeepsItsLargeStatesInManagedMemory) {
  const std::string recipe =
      "estimate --model llama3-8b --finetune qlora --lora-targets all-linear --batch 1 "
      "--seq 2048 --checkpointing --optimizer paged-adamw8bit";
  const Result r = trainmem(recipe + " --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  const json p = j["analytic"]["hf-peft"];
  const u64 h = 4096, i = 14336, kd = 1024, L = 32, r16 = 16;
  // Per layer: q, o (h×h): A and B of 16·h; k, v: A 16·h, B 16·kd; gate, up: A 16·h, B 16·i;
  // down: A 16·i, B 16·h.
  const std::vector<u64> adapters = {r16 * h,  r16 * h, r16 * h, r16 * kd, r16 * h,
                                     r16 * kd, r16 * h, r16 * h, r16 * h,  r16 * i,
                                     r16 * h,  r16 * i, r16 * i, r16 * h};
  u64 device = 2 * 256 * 4, managed = 0;  // the two quantile maps, once
  for (u64 e : adapters) {
    device += L * 8 * ((e + 255) / 256);            // absmax1, absmax2 (fp32)
    (e >= 100000 ? managed : device) += L * 2 * e;  // state1, state2 (uint8)
  }
  EXPECT_EQ(n(p["optimizer_states"]), device);
  EXPECT_EQ(n(p["optimizer_states_managed"]), managed);
  EXPECT_EQ(managed, 44040192u);
  EXPECT_EQ(p["peft"]["optimizer"], "paged-adamw8bit");
  EXPECT_TRUE(p["peft"]["bnb_version"].is_null());
  EXPECT_EQ(p["peft"]["bnb_era"], "0.44-0.50");
  EXPECT_EQ(j["run"]["optimizer"], "paged-adamw8bit");
  EXPECT_EQ(n(p["peak"]), n(p["params"]) + n(p["gradients"]) + device + n(p["activations_peak"]) +
                              n(p["inputs"]));
  // trainmem's own step keeps the same states, plus its two 65,536-entry lookup tables of the
  // maps (kernels/adamw8bit), on the device; the managed ones equal, outside its exact peak.
  const json nat = j["analytic"]["native"];
  EXPECT_EQ(n(nat["optimizer_states"]), device + 2 * 65536);
  EXPECT_EQ(n(nat["optimizer_states_managed"]), managed);
  // maxbatch says where the managed state is: in no peak it searches with.
  const Result mb = trainmem(
      "maxbatch --model llama3-8b --finetune qlora --lora-targets all-linear --seq 2048 "
      "--checkpointing full --budget 24GB --optimizer paged-adamw8bit");
  ASSERT_EQ(mb.code, 0) << mb.err;
  EXPECT_TRUE(has(mb.out,
                  "native rows: the meta backend's exact trace of trainmem's own LoRA "
                  "step"))
      << mb.out;
  EXPECT_TRUE(has(mb.out, "the paged optimizer's state in CUDA managed memory is outside them"))
      << mb.out;
  const Result t = trainmem(recipe);
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_TRUE(has(t.out, "paged-adamw8bit")) << t.out;
  EXPECT_TRUE(has(t.out, "CUDA managed memory")) << t.out;
  EXPECT_TRUE(has(t.out, "10.61")) << "README's peak for this recipe\n" << t.out;
  // bitsandbytes 0.43: one absmax per 2,048 elements instead of 256.
  const Result o = trainmem(recipe + " --bnb-version 0.43.3 --format json");
  ASSERT_EQ(o.code, 0) << o.err;
  const json oj = o.j();
  const json op = oj["analytic"]["hf-peft"];
  u64 old_device = 2 * 256 * 4;
  for (u64 e : adapters) {
    old_device += L * 8 * ((e + 2047) / 2048);
    if (e < 100000) old_device += L * 2 * e;
  }
  EXPECT_EQ(n(op["optimizer_states"]), old_device);
  EXPECT_EQ(n(op["optimizer_states_managed"]), managed);
  EXPECT_EQ(op["peft"]["bnb_version"], "0.43.3");
  EXPECT_EQ(op["peft"]["bnb_era"], "0.43");
}

// The question users ask (issue 28, point 4): the largest batch of a QLoRA fine-tune of
// Llama-3-8B that fits a 24 GB GPU. The answer must be the batch whose `estimate` peak fits
// while the next one's does not, each checked here with `estimate` itself.
// The one-line question as a user types it, without --checkpointing: a LoRA / QLoRA
// search answers for none and full (peft's prepare_model_for_kbit_training turns checkpointing
// on), the same policies and answers as `--checkpointing none,full` gives; a full fine-tune
// keeps the single default policy.
TEST(CliE2ELora, MaxbatchWithoutCheckpointingSearchesNoneAndFullForLora) {
  const std::string q = "maxbatch --model llama3-8b --finetune qlora --seq 2048 --budget 24GB";
  const Result bare = trainmem(q + " --format json");
  const Result both = trainmem(q + " --checkpointing none,full --format json");
  ASSERT_EQ(bare.code, 0) << bare.err;
  ASSERT_EQ(both.code, 0) << both.err;
  const json a = bare.j(), b = both.j();
  ASSERT_EQ(a["policies"].size(), 4u);
  EXPECT_EQ(a["policies"], b["policies"]);
  std::vector<std::string> policies;
  for (const json& p : a["policies"]) policies.push_back(p["checkpointing"]);
  EXPECT_EQ(policies, (std::vector<std::string>{"none", "full", "none", "full"}));
  const Result text = trainmem(q);
  EXPECT_TRUE(has(text.out, "hf-peft, full")) << text.out;
  EXPECT_TRUE(has(text.out, "native, full")) << text.out;
  const Result one = trainmem(
      "maxbatch --model llama3-8b --finetune lora --seq 512 --budget 80GB --checkpointing full "
      "--format json");
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_EQ(one.j()["policies"].size(), 2u) << "a given policy stays the only one";
  const Result full = trainmem("maxbatch --model tiny --seq 64 --budget 1GiB --format json");
  ASSERT_EQ(full.code, 0) << full.err;
  // The full fine-tune's default is unchanged: one policy (none), answered without a list.
  EXPECT_FALSE(full.j().contains("policies")) << full.out;
  EXPECT_EQ(full.j()["run"]["checkpointing"], "none");
}

TEST(CliE2ELora, MaxbatchAnswersForQloraWithTheHfPeftProfile) {
  const std::string recipe =
      " --model llama3-8b --finetune qlora --lora-targets all-linear --seq 2048 ";
  const Result r = trainmem("maxbatch" + recipe +
                            "--checkpointing none,full --budget 24GB --overhead 0 --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  EXPECT_EQ(j["profile"], "hf-peft");
  EXPECT_EQ(j["peft"]["finetune"], "qlora");
  EXPECT_EQ(j["run"]["attention"], "sdpa");
  EXPECT_TRUE(j["run"]["backend"].is_null());
  ASSERT_EQ(j["policies"].size(), 4u);  // hf-peft's two, then the native step's two
  const u64 budget = 24000000000u;
  EXPECT_EQ(n(j["budget"]), budget);
  std::vector<u64> best;  // 0: nothing fits
  for (const json& p : j["policies"]) {
    if (p["profile"] == "native") continue;  // MaxbatchAnswersForLoraWithBothSteps checks those
    SCOPED_TRACE(p.dump());
    const std::string ckpt = p["checkpointing"];
    auto peak_at = [&](u64 batch) {
      const Result e = trainmem("estimate" + recipe + "--checkpointing " + ckpt + " --batch " +
                                std::to_string(batch) + " --format json");
      EXPECT_EQ(e.code, 0) << e.err;
      const json ej = e.j();
      return n(ej["analytic"]["hf-peft"]["peak"]);
    };
    const u64 b = p["best"].is_null() ? 0 : n(p["best"]);
    best.push_back(b);
    if (b > 0) {
      const u64 fits = peak_at(b);
      EXPECT_EQ(n(p["peak"]), fits);
      EXPECT_LE(fits, budget);
    } else {
      EXPECT_TRUE(p["peak"].is_null());
    }
    const u64 next = peak_at(b + 1);
    EXPECT_EQ(n(p["next"]), b + 1);
    EXPECT_GT(next, budget);
    EXPECT_EQ(n(p["next_peak"]), next);
    EXPECT_TRUE(p["recompute_flops"].is_null()) << "the native step's FLOPs do not apply";
  }
  // Without checkpointing peft's fp32 copies of each adapter's input and the fp32 residual of
  // prepare_model_for_kbit_training do not fit even batch 1 (22.49 GiB of activations, README);
  // with it, a few.
  EXPECT_EQ(best[0], 0u);
  EXPECT_GE(best[1], 1u);
  // The text names the profile and says why it is not the native step.
  const Result t = trainmem("maxbatch" + recipe + "--checkpointing --budget 24GB --overhead 0");
  ASSERT_EQ(t.code, 0) << t.err;
  // Its row: "hf-peft, full", then the largest batch.
  const std::size_t row = t.out.find("hf-peft, full");
  ASSERT_NE(row, std::string::npos) << t.out;
  std::istringstream cells(t.out.substr(row + std::string("hf-peft, full").size()));
  u64 shown = 0;
  cells >> shown;
  EXPECT_EQ(shown, best[1]) << t.out;
  EXPECT_TRUE(has(t.out, "hf-peft")) << t.out;
  EXPECT_TRUE(has(t.out, "on the 4-bit nf4 base")) << t.out;
}

// LoRA on a 16-bit base: each policy answers for hf-peft and for trainmem's own step, the native
// answer being the batch whose traced peak (`profile --backend meta`) fits while the next
// one's does not.
TEST(CliE2ELora, MaxbatchAnswersForLoraWithBothSteps) {
  for (const std::string finetune : {"lora", "qlora"}) {
    SCOPED_TRACE(finetune);
    const std::string recipe = " --model llama3-8b --finetune " + finetune +
                               " --lora-targets all-linear "
                               "--seq 2048 --attention flash ";
    const Result r = trainmem("maxbatch" + recipe +
                              "--checkpointing none,full --budget 24GB --overhead 0 --format json");
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = r.j();
    const u64 budget = 24000000000u;
    int native = 0;
    for (const json& p : j["policies"]) {
      if (p["profile"] != "native") continue;
      SCOPED_TRACE(p.dump());
      ++native;
      auto peak_at = [&](u64 batch) {
        const Result e =
            trainmem("profile" + recipe + "--backend meta --profile native --steps 2 " +
                     "--checkpointing " + p["checkpointing"].get<std::string>() + " --batch " +
                     std::to_string(batch) + " --format json");
        EXPECT_EQ(e.code, 0) << e.err;
        return n(e.j()["measured"]["ledger"]["peak"]);
      };
      const u64 b = p["best"].is_null() ? 0 : n(p["best"]);
      if (b > 0) {
        EXPECT_EQ(n(p["peak"]), peak_at(b));
        EXPECT_LE(peak_at(b), budget);
      }
      EXPECT_GT(peak_at(b + 1), budget);
    }
    EXPECT_EQ(native, 2);
    const Result t = trainmem("maxbatch" + recipe + "--checkpointing --budget 24GB --overhead 0");
    ASSERT_EQ(t.code, 0) << t.err;
    EXPECT_TRUE(has(t.out, "native, full")) << t.out;
    EXPECT_TRUE(has(t.out, "hf-peft, full")) << t.out;
  }
}

TEST(CliE2ELora, LoraDefaultsArePeftsQAndV) {
  const Result r = trainmem("estimate --model llama-7b --finetune lora --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  const json& p = j["analytic"]["hf-peft"];
  EXPECT_EQ(p["peft"]["lora_targets"], "q_proj,v_proj");
  EXPECT_EQ(p["peft"]["lora_rank"], 16);
  EXPECT_EQ(p["peft"]["quant"], "none");
  // q and v of LLaMA-7B are (4096, 4096): r·(4096 + 4096) each, 32 layers.
  EXPECT_EQ(n(p["trainable_params"]), 32u * 2u * 16u * 8192u);
  // The bf16 base is frozen: params = base + fp32 adapters + RoPE's two fp32 buffers.
  const u64 base = 6738415616u;  // LLaMA-7B's parameters
  EXPECT_EQ(n(p["params"]), 2 * base + 4 * n(p["trainable_params"]) + 4 * 128);
  // Without checkpointing layer 0 keeps less than the others (its input needs no gradient).
  EXPECT_LT(n(p["first_layer_activations"]), n(p["per_layer_activations"]));
}

TEST(CliE2ELora, BadRecipesExitTwoNamingTheFlag) {
  struct Case {
    std::string args, message;
  };
  for (const Case& c : std::vector<Case>{
           {"profile --model tiny --backend meta --finetune qlora --world-size 2 --tp 2",
            "--finetune qlora with --tp 2: each rank would quantize its own slice"},
           {"profile --model tiny --backend meta --optimizer paged-adamw8bit --world-size 2 --dp 2",
            "--optimizer paged-adamw8bit: the sharded step"},
           {"plan --model tiny --gpus 2 --gpu-memory 1GiB --global-batch 2 --optimizer paged-adamw",
            "--optimizer paged-adamw: plan searches parallel layouts"},
           {"estimate --model tiny --optimizer adamw8bit --world-size 2 --zero 1",
            "--optimizer adamw8bit: the sharded step"},
           {"profile --model tiny --backend meta --optimizer adamw8bit --world-size 2 --dp 2",
            "--optimizer adamw8bit: the sharded step"},
           {"sweep --model tiny --backend meta --finetune lora --optimizer adamw8bit "
            "--bnb-version 0.43.3",
            "--bnb-version 0.43.3: it keys the hf-peft profile"},
           {"plan --model tiny --gpus 2 --gpu-memory 1GiB --global-batch 2 --optimizer adamw8bit",
            "--optimizer adamw8bit: plan searches parallel layouts"},
           {"profile --model tiny --backend meta --finetune lora --optimizer lomo",
            "--optimizer lomo with --finetune lora"},
           {"profile --model tiny --backend meta --finetune qlora --world-size 2 --zero 3",
            "--finetune qlora with --zero 3: a quantized base is stored whole"},
           {"profile --model tiny --backend meta --finetune lora --world-size 2 --zero 3 "
            "--offload optimizer+params",
            "--finetune lora with --offload optimizer+params"},
           {"profile --model tiny --backend meta --finetune lora --world-size 2 --tp 2 --sp",
            "--finetune lora with --sp"},
           {"profile --model tiny --backend meta --finetune lora --lora-dropout 0.1 "
            "--world-size 2 --tp 2",
            "--lora-dropout with --tp 2"},
           {"profile --model tiny --backend meta --finetune lora --profile hf-eager",
            "--profile hf-eager with --finetune lora"},

           {"plan --model tiny --gpus 1 --gpu-memory 1GiB --global-batch 2 --finetune lora "
            "--activation-offload on",
            "--activation-offload on with --finetune lora"},
           {"maxbatch --model tiny --budget 1GiB --finetune qlora --world-size 2 --tp 2",
            "--finetune qlora with --tp 2"},
           {"maxbatch --model tiny --budget 1GiB --finetune lora --optimizer adamw8bit "
            "--world-size 2 --zero 2",
            "--optimizer adamw8bit"},
           {"maxbatch --model tiny --budget 1GiB --finetune lora --allocator pytorch",
            "--allocator with --finetune lora"},
           {"maxbatch --model mistral-7b --budget 24GB --finetune qlora --vary seq",
            "--vary seq with --finetune qlora"},
           {"maxbatch --model tiny --budget 1GiB --finetune lora --checkpointing selective",
            "--checkpointing selective"},
           {"estimate --model tiny --profile hf-peft", "needs --finetune lora or qlora"},
           {"estimate --model tiny --finetune full --lora-rank 8", "--lora-rank applies to"},
           {"estimate --model tiny --finetune lora --lora-rank 0", "--lora-rank"},
           {"estimate --model tiny --finetune lora --lora-targets q_proj,wo", "--lora-targets"},
           {"estimate --model tiny --finetune lora --lora-dropout 1.5", "--lora-dropout"},
           {"estimate --model tiny --finetune lora --lora-dropout x", "--lora-dropout"},
           {"estimate --model tiny --finetune lora --lora-dtype fp8", "--lora-dtype"},
           {"estimate --model tiny --finetune lora --peft-version 0.10.0 --lora-dtype fp32",
            "--lora-dtype fp32 with --peft-version 0.10.0: peft before 0.12"},
           {"estimate --model tiny --peft-version 0.21.2",
            "--peft-version applies to --finetune lora or qlora"},
           {"estimate --model tiny --finetune lora --peft-version 0.9.0", "--peft-version 0.9.0"},
           {"estimate --model tiny --finetune lora --profile native --peft-version 0.10.0",
            "--peft-version 0.10.0: it keys the hf-peft profile, which this run does not compute"},
           {"estimate --model tiny --finetune lora --optimizer adamw8bit --profile native "
            "--bnb-version 0.43.3",
            "--bnb-version 0.43.3: it keys the hf-peft profile, which this run does not compute"},
           {"sweep --model tiny --backend meta --finetune lora --peft-version 0.10.0",
            "--peft-version 0.10.0: it keys the hf-peft profile's adapters"},
           {"estimate --model tiny --finetune lora --quant nf4",
            "--quant nf4 with --finetune lora"},
           {"estimate --model tiny --finetune qlora --quant none", "--quant none"},
           {"estimate --model tiny --finetune qlora --quant int8", "--quant int8"},
           {"estimate --model tiny --finetune qlora --quant-blocksize 100",
            "--quant-blocksize 100"},
           {"estimate --model tiny --finetune qlora --double-quant maybe", "--double-quant"},
           {"estimate --model tiny --finetune lora --optimizer lomo", "--optimizer lomo"},
           {"estimate --model tiny --finetune lora --checkpointing selective",
            "--checkpointing selective"},
           {"estimate --model tiny --finetune lora --quant int8 --world-size 2 --zero 3",
            "--finetune lora --quant int8 with --zero 3"},
           {"estimate --model tiny --finetune lora --world-size 2 --zero 2 --profile hf-peft",
            "--profile hf-peft: with --world-size above 1 the per-rank profile is native"},
           {"estimate --model qwen3-8b --finetune lora --profile hf-peft", "q/k norms"},
           {"estimate --model tiny --finetune dora", "--finetune"},
           {"estimate --model tiny --finetune lora --optimizer adam8bit",
            "allowed: adamw, sgd, lomo, adamw8bit, paged-adamw, paged-adamw8bit, all"},
           {"estimate --model tiny --finetune lora --optimizer paged-adamw --bnb-version 0.43.3",
            "give it with --optimizer adamw8bit or paged-adamw8bit"},
           {"estimate --model tiny --bnb-version 0.43.3", "--bnb-version applies to"},
           {"estimate --model tiny --finetune qlora --optimizer adamw8bit --bnb-version 0.39.0",
            "--bnb-version 0.39.0"},
           {"estimate --model tiny --finetune qlora --bnb-version 0.43.3",
            "give it with --optimizer adamw8bit or paged-adamw8bit"},
           {"estimate --model tiny --finetune lora --offload-activations",
            "--offload-activations with --finetune lora"},
           {"maxbatch --model tiny --budget 1GiB --finetune lora --offload-activations",
            "--offload-activations with --finetune lora"}}) {
    SCOPED_TRACE(c.args);
    const Result r = trainmem(c.args);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_TRUE(has(r.err, c.message)) << r.err;
  }
}

// trainmem's own step with LoRA, as a user runs it: the measured ledger reconciles with the
// native profile exactly, hf-peft is shown beside it, and the model states are the adapters'
// (written out here from peft's shapes).
TEST(CliE2ELora, ProfileRunsTheLoraStepOnTheCpu) {
  const Result r = trainmem(
      "profile --model tiny --finetune lora --lora-rank 4 --lora-targets q_proj,v_proj,down_proj "
      "--backend cpu --batch 2 --seq 16 --checkpointing full --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  ASSERT_TRUE(j["analytic"].contains("native")) << j["analytic"];
  ASSERT_TRUE(j["analytic"].contains("hf-peft")) << j["analytic"];
  const json& m = j["measured"]["ledger"];
  // tiny: h 64, i 176, 4 heads of 16, 2 layers, V 128, untied.
  const u64 h = 64, i = 176, L = 2, V = 128, r4 = 4;
  const u64 adapters = L * r4 * (2 * (h + h) + (i + h));  // q, v: (h, h); down: (i, h)
  const u64 base = 2 * V * h + L * (2 * h + 4 * h * h + 3 * h * i) + h;
  EXPECT_EQ(n(m["params"]), 2 * (base + adapters));
  EXPECT_EQ(n(m["gradients"]), 2 * adapters);
  EXPECT_EQ(n(m["optimizer_states"]), 12 * adapters);
  ASSERT_FALSE(j["reconciliation"].empty());
  for (const json& row : j["reconciliation"]) EXPECT_EQ(row["ok"], true) << row;
  EXPECT_EQ(j["run"]["finetune"], "lora");
  EXPECT_EQ(j["run"]["lora_rank"], 4);
  EXPECT_EQ(j["run"]["lora_targets"], "q_proj,v_proj,down_proj");
  // The full fine-tune's run block has no LoRA keys.
  const Result f = trainmem("profile --model tiny --backend meta --batch 1 --seq 4 --format json");
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_FALSE(f.j()["run"].contains("finetune"));
}

// estimate lists trainmem's own LoRA step beside hf-peft (adamw, sgd, bitsandbytes' optimizers,
// a 16-bit or 4-bit base, dropout).
TEST(CliE2ELora, EstimateListsTheNativeLoraStepWhereItRuns) {
  const Result r = trainmem(
      "estimate --model llama3-8b --finetune lora --lora-targets all-linear --batch 1 --seq 2048 "
      "--format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  ASSERT_TRUE(j["analytic"].contains("native")) << j["analytic"];
  ASSERT_TRUE(j["analytic"].contains("hf-peft")) << j["analytic"];
  const json& nat = j["analytic"]["native"];
  const u64 T = 41943040;  // peft's count, Llama-3-8B r 16 all seven
  EXPECT_EQ(n(nat["trainable_params"]), T);
  EXPECT_EQ(n(nat["gradients"]), 2 * T);
  EXPECT_EQ(n(nat["optimizer_states"]), 12 * T);
  EXPECT_EQ(j["run"]["lora_targets"], "all-linear");
  for (const std::string other :
       {"--finetune qlora --lora-dropout 0.05", "--finetune lora --lora-dropout 0.05",
        "--finetune lora --optimizer paged-adamw8bit"}) {
    SCOPED_TRACE(other);
    const Result q =
        trainmem("estimate --model llama3-8b " + other + " --batch 1 --seq 2048 --format json");
    ASSERT_EQ(q.code, 0) << q.err;
    const bool paged = has(other, "paged");
    EXPECT_EQ(q.j()["analytic"].size(), 2u) << q.j()["analytic"];
    EXPECT_TRUE(q.j()["run"].contains("finetune"));
    if (!paged) EXPECT_EQ(q.j()["run"]["lora_dropout"], 0.05);
  }
}

// compare and sweep run the LoRA step in each of their runs; every run reconciles exactly with
// the native profile, and the adapters' books do not change with the batch, the sequence or the
// checkpointing.
TEST(CliE2ELora, CompareAndSweepRunTheLoraStep) {
  for (const std::string cmd :
       {"compare --model tiny-qwen3 --finetune lora --lora-targets all-linear --lora-rank 2 "
        "--backend cpu --batch 2 --seq 12 --checkpointing both --format json",
        "sweep --model tiny-qwen3 --finetune lora --lora-targets all-linear --lora-rank 2 "
        "--backend meta --batch 1,2 --seq 8,16 --format json"}) {
    SCOPED_TRACE(cmd);
    const Result r = trainmem(cmd);
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = r.j();
    ASSERT_GE(j["runs"].size(), 2u);
    std::set<u64> grads;
    for (const json& run : j["runs"]) {
      EXPECT_EQ(run["run"]["finetune"], "lora");
      ASSERT_FALSE(run["reconciliation"].empty());
      for (const json& row : run["reconciliation"]) EXPECT_EQ(row["ok"], true) << row;
      grads.insert(n(run["measured"]["ledger"]["gradients"]));
    }
    EXPECT_EQ(grads.size(), 1u);
  }
}

// "What does QLoRA change against the full fine-tune?": diff computes both sides now, a
// profile side taking hf-peft's recipe as key=value options; each side's categories are what
// `estimate` gives for the same recipe.
TEST(CliE2ELora, DiffOfTheFullFineTuneAndQloraSidesComputedNow) {
  const std::string common = " --model tiny-gqa --batch 2 --seq 24 --checkpointing ";
  const Result d =
      trainmem("diff hf-sdpa hf-peft:finetune=qlora,targets=all-linear,optimizer=paged-adamw8bit" +
               common + "--format json");
  ASSERT_EQ(d.code, 0) << d.err;
  const json dj = d.j();
  const Result full = trainmem("estimate --profile hf-sdpa" + common + "--format json");
  const Result q = trainmem(
      "estimate --finetune qlora --lora-targets all-linear --optimizer "
      "paged-adamw8bit" +
      common + "--format json");
  ASSERT_EQ(full.code, 0) << full.err;
  ASSERT_EQ(q.code, 0) << q.err;
  const json fj = full.j(), qj = q.j();
  const json fa = fj["analytic"]["hf-sdpa"], qa = qj["analytic"]["hf-peft"];
  int seen = 0;
  for (const json& c : dj["categories"]) {
    const std::string cat = c["category"];
    if (cat == "params" || cat == "gradients" || cat == "optimizer_states" ||
        cat == "activations") {
      EXPECT_EQ(n(c["a"]), n(fa[cat])) << cat;
      EXPECT_EQ(n(c["b"]), n(qa[cat])) << cat;
      ++seen;
    }
  }
  EXPECT_EQ(seen, 4);
  // The same recipe from the common flags: hf-peft takes --finetune, the hf-sdpa side ignores it.
  const Result d2 = trainmem(
      "diff hf-sdpa hf-peft --finetune qlora --lora-targets all-linear "
      "--optimizer adamw" +
      common + "--format json");
  ASSERT_EQ(d2.code, 0) << d2.err;
  const json d2j = d2.j();
  for (const json& c : d2j["categories"])
    if (c["category"] == "params") EXPECT_EQ(n(c["b"]), n(qa["params"]));
  // lora against qlora, one key apart.
  const Result d3 = trainmem("diff hf-peft:finetune=lora hf-peft:finetune=qlora" + common);
  ASSERT_EQ(d3.code, 0) << d3.err;
}

// Two saved LoRA reports through diff: the tensors, each counted as often as the report's
// layers keep it (layer 0's own list once, the others L - 1 times), add up to each side's
// activations.
TEST(CliE2ELora, DiffOfSavedReportsCountsLayerZeroOnce) {
  const std::string flags = "--model tiny-gqa --batch 2 --seq 24 --lora-targets all-linear";
  const std::string a = temp_path("lora_a.json"), b = temp_path("lora_b.json");
  const Result ra =
      trainmem("estimate --finetune lora " + flags + " --format json --output '" + a + "'");
  const Result rb =
      trainmem("estimate --finetune qlora " + flags + " --format json --output '" + b + "'");
  ASSERT_EQ(ra.code, 0) << ra.err;
  ASSERT_EQ(rb.code, 0) << rb.err;
  const json ja = json::parse(slurp(a)), jb = json::parse(slurp(b));
  const Result d =
      trainmem("diff '" + a + ":profile=hf-peft' '" + b + ":profile=hf-peft' --format json");
  std::remove(a.c_str());
  std::remove(b.c_str());
  ASSERT_EQ(d.code, 0) << d.err;
  u64 sum_a = 0, sum_b = 0;
  const json dj = d.j();
  for (const auto& row : dj["tensors"]) {
    if (row["group"] == "inputs") continue;
    sum_a += n(row["a_bytes"]);
    sum_b += n(row["b_bytes"]);
  }
  const json& pa = ja["analytic"]["hf-peft"];
  const json& pb = jb["analytic"]["hf-peft"];
  EXPECT_GT(n(pa["first_layer_activations"]), 0u);
  EXPECT_EQ(sum_a, n(pa["activations"]));
  EXPECT_EQ(sum_b, n(pb["activations"]));
}

// bitsandbytes' AdamW8bit in trainmem's own step, as a user runs it: the full fine-tune on the
// cpu (the states written out here per tensor), and LoRA, where estimate shows the native step
// beside hf-peft with the same per-tensor rule (hf-peft: peft's fp32 adapters, no lookup tables).
TEST(CliE2ELora, AdamW8bitRunsInTheNativeStep) {
  const Result r = trainmem(
      "profile --model tiny --optimizer adamw8bit --backend cpu --batch 2 --seq 16 --steps 2 "
      "--format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  // tiny: h 64, i 176, 4 heads of 16 (q, k, v, o: 4,096 elements each, exactly min_8bit_size),
  // 2 layers, V 128, untied. 8-bit tensor of n: 2n + 8·ceil(n/256); fp32 states below 4,096: 8n.
  auto eight = [](u64 e) { return 2 * e + 8 * ((e + 255) / 256); };
  const u64 layer = 4 * eight(64 * 64) + 3 * eight(176 * 64) + 2 * 8 * 64;
  const u64 states = 2 * layer + 2 * eight(128 * 64) + 8 * 64 + 2 * 1024 + 2 * 65536;
  EXPECT_EQ(states, 372800u);
  const json& m = j["measured"]["ledger"];
  EXPECT_EQ(n(m["optimizer_states"]), states);
  const u64 P = 2 * 128 * 64 + 2 * (2 * 64 + 4 * 64 * 64 + 3 * 64 * 176) + 64;
  EXPECT_EQ(n(m["params"]), 2 * P);
  EXPECT_EQ(n(m["gradients"]), 2 * P);
  for (const json& row : j["reconciliation"]) EXPECT_EQ(row["ok"], true) << row;
  EXPECT_EQ(j["run"]["optimizer"], "adamw8bit");
  const auto& losses = j["run"]["losses"];
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_TRUE(losses[1].is_number_float()) << losses;

  const Result e = trainmem(
      "estimate --model llama3-8b --finetune lora --lora-targets all-linear --optimizer adamw8bit "
      "--batch 1 --seq 2048 --format json");
  ASSERT_EQ(e.code, 0) << e.err;
  const json ej = e.j();
  const json& a = ej["analytic"];
  ASSERT_TRUE(a.contains("native") && a.contains("hf-peft")) << a;
  // 32 layers × (nine adapters of 65,536 elements, two of 16,384, three of 229,376).
  const u64 lora = 32 * (9 * eight(65536) + 2 * eight(16384) + 3 * eight(229376));
  EXPECT_EQ(n(a["native"]["optimizer_states"]), lora + 2 * 1024 + 2 * 65536);
  EXPECT_EQ(n(a["hf-peft"]["optimizer_states"]), lora + 2 * 1024);
  EXPECT_EQ(a["hf-peft"]["peft"]["optimizer"], "adamw8bit");
  // On an fp16 model too: the native step unscales its loss-scaled gradients inside the update
  // (bitsandbytes' gnorm_scale); its states are bf16's, byte for byte.
  for (const char* ft : {"lora", "qlora"}) {
    SCOPED_TRACE(ft);
    const std::string recipe = std::string("estimate --model llama3-8b --finetune ") + ft +
                               " --lora-targets all-linear --optimizer adamw8bit --batch 1 --seq "
                               "2048 --format json";
    const Result h = trainmem(recipe + " --dtype fp16");
    const Result hb = trainmem(recipe);
    ASSERT_EQ(h.code, 0) << h.err;
    ASSERT_EQ(hb.code, 0) << hb.err;
    const json hj = h.j();
    ASSERT_EQ(hj["analytic"].size(), 2u) << hj["analytic"];
    EXPECT_EQ(hj["analytic"]["hf-peft"]["peft"]["optimizer"], "adamw8bit");
    EXPECT_EQ(n(hj["analytic"]["native"]["optimizer_states"]), lora + 2 * 1024 + 2 * 65536);
    EXPECT_EQ(n(hj["analytic"]["native"]["optimizer_states"]),
              n(hb.j()["analytic"]["native"]["optimizer_states"]));
  }
  const Result f16 = trainmem(
      "profile --model tiny --finetune lora --optimizer adamw8bit --dtype fp16 --backend cpu "
      "--batch 1 --seq 8 --steps 2 --format json");
  ASSERT_EQ(f16.code, 0) << f16.err;
  for (const json& row : f16.j()["reconciliation"]) EXPECT_EQ(row["ok"], true) << row;
  // diff takes it as a side's optimizer, for the native step and for hf-peft.
  const Result d = trainmem("diff native:optimizer=adamw8bit native --model tiny --format json");
  ASSERT_EQ(d.code, 0) << d.err;
  const Result dh = trainmem(
      "diff hf-peft hf-peft:optimizer=adamw8bit --finetune lora --model tiny --format json");
  ASSERT_EQ(dh.code, 0) << dh.err;
  // The LoRA step runs with it on the cpu too, and reconciles.
  const Result l = trainmem(
      "profile --model tiny --finetune lora --optimizer adamw8bit --backend cpu --batch 1 "
      "--seq 8 --format json");
  ASSERT_EQ(l.code, 0) << l.err;
  for (const json& row : l.j()["reconciliation"]) EXPECT_EQ(row["ok"], true) << row;
}

// diff sets trainmem's own LoRA and QLoRA steps side by side (native:finetune=..., or --finetune
// for a native side): the 4-bit base saves exactly the projections' bytes of docs/formulas.md,
// and hf-peft's default QLoRA stores 2,185,765,376 B more (its fp32 upcasts and adapters, RoPE's
// buffers).
TEST(CliE2ELora, DiffTakesTheNativeLoraAndQloraSteps) {
  const std::string common = " --model llama3-8b --batch 1 --seq 2048 --format json";
  const u64 qlora = 5786426240u;                    // NativeByHand.QloraStorageOfLlama3_8b
  const u64 lora = 2u * (8030261248u + 41943040u);  // bf16 base + adapters
  const Result d = trainmem(
      "diff native:finetune=lora,targets=all-linear native:finetune=qlora,targets=all-linear" +
      common);
  ASSERT_EQ(d.code, 0) << d.err;
  const json dj = d.j();
  EXPECT_EQ(dj["categories"][0]["category"], "params");
  EXPECT_EQ(n(dj["categories"][0]["a"]), lora);
  EXPECT_EQ(n(dj["categories"][0]["b"]), qlora);
  const Result h =
      trainmem("diff hf-peft native --finetune qlora --lora-targets all-linear" + common);
  ASSERT_EQ(h.code, 0) << h.err;
  EXPECT_EQ(n(h.j()["categories"][0]["b"]), qlora);
  EXPECT_EQ(n(h.j()["categories"][0]["a"]) - qlora, 2185765376u);
  // With LoRA dropout the native side keeps a one-byte mask per adapter input (q_proj, v_proj:
  // (b, s, h) each, in both layers of tiny): L·b·s·2h bytes more activations than without, and
  // its side line says so.
  const std::string dropout_diff =
      "diff native hf-peft --model tiny --batch 2 --seq 64 --finetune lora --format json";
  const Result r = trainmem(dropout_diff + " --lora-dropout 0.1");
  const Result r0 = trainmem(dropout_diff);
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_EQ(r0.code, 0) << r0.err;
  auto native_acts = [](const json& j) {
    for (const json& c : j["categories"])
      if (c["category"] == "activations") return n(c["a"]);
    ADD_FAILURE() << "no activations row";
    return u64{0};
  };
  EXPECT_EQ(native_acts(r.j()) - native_acts(r0.j()), 2u * 2u * 64u * 2u * 64u);
  const Result t = trainmem(
      "diff native hf-peft --model tiny --batch 2 --seq 64 --finetune lora --lora-dropout 0.1");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_TRUE(has(t.out, "lora r 16 on q_proj,v_proj, dropout 0.1")) << t.out;
}

// --peft-version: the hf-peft profile follows the release's adapters (docs/formulas.md, "peft
// eras"): peft 0.10 keeps a bf16 base's adapters in bf16, so Llama-3-8B r 16 on all seven stores
// 2·T bytes fewer than 0.21's fp32 adapters; the native step is not peft's and does not change.
TEST(CliE2ELora, PeftVersionKeysTheAdaptersDtype) {
  const std::string base =
      "estimate --model llama3-8b --finetune lora --lora-targets all-linear --batch 1 --seq 512 "
      "--format json";
  const Result now = trainmem(base);
  const Result old = trainmem(base + " --peft-version 0.10.0");
  ASSERT_EQ(now.code, 0) << now.err;
  ASSERT_EQ(old.code, 0) << old.err;
  const json nj = now.j(), oj = old.j();
  const json& a = nj["analytic"]["hf-peft"];
  const json& b = oj["analytic"]["hf-peft"];
  EXPECT_EQ(b["peft"]["peft_era"], "0.10-0.11");
  EXPECT_EQ(b["peft"]["peft_version"], "0.10.0");
  EXPECT_EQ(b["peft"]["lora_dtype"], "bf16");
  EXPECT_EQ(a["peft"]["peft_era"], "0.19-0.21");
  EXPECT_TRUE(a["peft"]["peft_version"].is_null());
  const u64 T = 41943040;
  EXPECT_EQ(n(a["params"]) - n(b["params"]), 2 * T);
  EXPECT_EQ(n(nj["analytic"]["native"]["params"]), n(oj["analytic"]["native"]["params"]));
}

// LoRA dropout runs in the native step (docs/native-plan.md, "LoRA dropout"): the run reconciles
// with the native profile, and against the same step without dropout it keeps one byte per
// element of each adapter's input more at the end of forward (q_proj, v_proj: (b, s, h); down:
// (b, s, i)), in every layer.
TEST(CliE2ELora, LoraDropoutRunsInTheNativeStep) {
  const std::string recipe =
      "profile --model tiny --finetune lora --lora-rank 4 --lora-targets q_proj,v_proj,down_proj "
      "--backend cpu --batch 2 --seq 16 --steps 2 --format json";
  const Result d = trainmem(recipe + " --lora-dropout 0.1");
  ASSERT_EQ(d.code, 0) << d.err;
  const Result p = trainmem(recipe);
  ASSERT_EQ(p.code, 0) << p.err;
  const json dj = d.j(), pj = p.j();
  EXPECT_EQ(dj["run"]["lora_dropout"], 0.1);
  EXPECT_EQ(pj["run"]["lora_dropout"], 0.0);
  ASSERT_FALSE(dj["reconciliation"].empty());
  for (const json& row : dj["reconciliation"]) EXPECT_EQ(row["ok"], true) << row;
  const u64 h = 64, i = 176, L = 2, b = 2, s = 16;  // tiny
  EXPECT_EQ(n(dj["measured"]["ledger"]["activations"]) - n(pj["measured"]["ledger"]["activations"]),
            L * b * s * (h + h + i));
  EXPECT_EQ(n(dj["measured"]["ledger"]["params"]), n(pj["measured"]["ledger"]["params"]));
  const Result t = trainmem(
      "profile --model tiny --finetune qlora --lora-dropout 0.05 --backend meta --batch 1 --seq 8");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_TRUE(has(t.out, "qlora r=16 q_proj,v_proj dropout=0.05 (base frozen")) << t.out;
}

}  // namespace
}  // namespace trainmem::e2e

namespace trainmem::e2e {
namespace {

// QLoRA in trainmem's own step as a user runs it: profile on the cpu backend reconciles with the
// native profile exactly, says the recipe in the run block, writes only the adapters' gradients
// with --dump, and compare and sweep run it in each of their runs.
TEST(CliE2ELora, QloraRunsInTheNativeStep) {
  const std::string dump = temp_path("qlora_grads.safetensors");
  const std::string recipe =
      " --model tiny-qwen3 --finetune qlora --lora-targets all-linear --lora-rank 2 ";
  const Result r = trainmem("profile" + recipe +
                            "--backend cpu --batch 2 --seq 12 --checkpointing full --steps 2 "
                            "--quant fp4 --double-quant off --quant-blocksize 128 --dump " +
                            dump + " --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  EXPECT_EQ(j["run"]["finetune"], "qlora");
  EXPECT_EQ(j["run"]["quant"], "fp4");
  EXPECT_EQ(j["run"]["double_quant"], false);
  EXPECT_EQ(j["run"]["quant_blocksize"], 128);
  ASSERT_FALSE(j["reconciliation"].empty());
  for (const json& row : j["reconciliation"]) EXPECT_EQ(row["ok"], true) << row;
  const SafeTensorsReader grads(dump);
  std::size_t adapters = 0;
  for (const auto& t : grads.tensors()) {
    if (t.name == "loss") continue;
    EXPECT_NE(t.name.find(".lora_"), std::string::npos) << t.name;
    ++adapters;
  }
  EXPECT_EQ(adapters, 2u * 7 * 2);  // tiny-qwen3: 2 layers, A and B of seven targets
  const Result t = trainmem("profile" + recipe + "--backend meta --batch 1 --seq 8");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_TRUE(has(t.out, "qlora r=2 all-linear (base frozen, 4-bit nf4 + double quant")) << t.out;
  EXPECT_TRUE(has(t.out, "at the allocation of dequant.")) << t.out;
  for (const std::string cmd :
       {"compare" + recipe + "--backend cpu --batch 2 --seq 12 --checkpointing both --format json",
        "sweep" + recipe + "--backend meta --batch 1,2 --seq 8,16 --format json"}) {
    SCOPED_TRACE(cmd);
    const Result c = trainmem(cmd);
    ASSERT_EQ(c.code, 0) << c.err;
    const json cj = c.j();
    ASSERT_GE(cj["runs"].size(), 2u);
    for (const json& run : cj["runs"]) {
      EXPECT_EQ(run["run"]["finetune"], "qlora");
      for (const json& row : run["reconciliation"]) EXPECT_EQ(row["ok"], true) << row;
    }
  }
}

}  // namespace
}  // namespace trainmem::e2e

namespace trainmem::e2e {
namespace {

// LoRA per rank (docs/distributed.md, "LoRA per rank"), as a user types it: estimate, profile on
// meta, maxbatch and plan with --world-size / --gpus. Llama-3-8B's adapters on all seven
// projections, r 16: 41,943,040 elements (peft's own count); the frozen base whole on every
// rank, the adapters' gradients and AdamW states (fp32 master, m, v) sharded by ZeRO-2 over 4.
// --quant int8 (docs/native-plan.md, "8-bit base"): trainmem's own step on LLM.int8's base;
// Llama-3-8B's params by hand: each projection's n int8 bytes and 4 bytes per row, the rest and
// the adapters in bf16 (docs/formulas.md, "8-bit base in the native step").
TEST(CliE2ELora, Int8BaseRunsInTheNativeStep) {
  const Result r = trainmem(
      "estimate --model llama3-8b --finetune lora --quant int8 --lora-targets all-linear "
      "--batch 1 --seq 2048 --checkpointing --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "hf-peft left out")) << r.err;
  const json j = r.j();
  ASSERT_EQ(j["analytic"].size(), 1u);
  const json& nat = j["analytic"]["native"];
  EXPECT_EQ(n(nat["params"]), 9170591744u);
  EXPECT_EQ(n(nat["trainable_params"]), 41943040u);
  EXPECT_EQ(j["run"]["finetune"], "lora");
  EXPECT_EQ(j["run"]["quant"], "int8");
  // The cpu run's ledger is the native profile's, and per rank too.
  const Result p = trainmem(
      "profile --model tiny --backend cpu --finetune lora --quant int8 --lora-targets all-linear "
      "--batch 2 --seq 16 --steps 2 --format json");
  ASSERT_EQ(p.code, 0) << p.err;
  const json pj = p.j();
  EXPECT_EQ(n(pj["measured"]["ledger"]["peak"]), n(pj["analytic"]["native"]["peak"]));
  const Result w = trainmem(
      "profile --model tiny --backend meta --finetune lora --quant int8 --world-size 2 --zero 2 "
      "--seq 16 --batch 2 --format json");
  ASSERT_EQ(w.code, 0) << w.err;
  EXPECT_TRUE(w.j()["all_ranks_match"].get<bool>());
  struct Bad {
    std::string args, message;
  };
  for (const Bad& c : std::vector<Bad>{
           {"estimate --model tiny --finetune lora --quant int8 --profile hf-peft",
            "--quant int8: the hf-peft profile does not model"},
           {"estimate --model tiny --finetune lora --quant int8 --quant-blocksize 128",
            "--quant int8 stores one fp32 absmax per row"},
           {"profile --model tiny --backend meta --finetune lora --quant int8 --world-size 2 "
            "--tp 2",
            "--finetune lora --quant int8 with --tp 2"}}) {
    const Result e = trainmem(c.args);
    EXPECT_EQ(e.code, 2) << c.args;
    EXPECT_TRUE(has(e.err, c.message)) << c.args << "\n" << e.err;
  }
}

TEST(CliE2ELora, LoraPerRankShardsTheAdaptersOnly) {
  const Result r = trainmem(
      "estimate --model llama3-8b --finetune lora --lora-targets all-linear --world-size 4 "
      "--zero 2 --seq 2048 --batch 1 --checkpointing full --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  const json& rank = j["ranks"][0];
  const u64 adapters = 41943040, base = 8030261248, shard = adapters / 4;
  EXPECT_EQ(n(rank["analytic"]["trainable_params"]), adapters);
  EXPECT_EQ(n(rank["local_params"]), base + adapters);
  EXPECT_EQ(n(rank["shard_elements"]), shard);
  EXPECT_EQ(n(rank["figures"]["params"]), 2 * (base + adapters));
  EXPECT_EQ(n(rank["figures"]["gradients"]), 2 * shard);
  EXPECT_EQ(n(rank["figures"]["optimizer_states"]), 12 * shard);
  EXPECT_EQ(j["run"]["finetune"], "lora");
  ASSERT_FALSE(j["references"]["estimators"].empty());
  for (const json& e : j["references"]["estimators"]) {
    EXPECT_FALSE(e["covers"].get<bool>()) << e["profile"];
    EXPECT_TRUE(has(e["why_not"].get<std::string>(), "models a full fine-tune"));
  }

  // The meta trace of every stage equals the analytic per rank (tp 2 × pp 2, three layers'
  // adapters split by tp).
  const Result p = trainmem(
      "profile --model tiny --backend meta --finetune lora --lora-targets all-linear --world-size "
      "4 --tp 2 --pp 2 --microbatches 2 --seq 64 --batch 2 --format json");
  ASSERT_EQ(p.code, 0) << p.err;
  const json pj = p.j();
  EXPECT_TRUE(pj["all_ranks_match"].get<bool>());
  ASSERT_EQ(pj["ranks"].size(), 2u);
  for (const json& rk : pj["ranks"]) {
    EXPECT_TRUE(rk["matches_analytic"].get<bool>()) << rk["differences"].dump();
    EXPECT_EQ(n(rk["analytic"]["trainable_params"]) * 2, n(rk["ledger"]["gradients"]));
  }

  // maxbatch per rank: the native step's search alone, the title naming the adapters.
  const Result m = trainmem(
      "maxbatch --model llama3-8b --budget 24GB --finetune lora --lora-targets all-linear "
      "--world-size 4 --zero 2 --seq 2048 --checkpointing full");
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_TRUE(has(m.out, "lora r=16 all-linear (base frozen)")) << m.out;
  EXPECT_TRUE(has(m.out, "largest micro-batch that fits every rank")) << m.out;

  // ZeRO-3: the frozen base sharded too, in its own flat vector: (⌈F/4⌉ + ⌈T/4⌉)·2 bytes.
  const Result z3 = trainmem(
      "estimate --model llama3-8b --finetune lora --lora-targets all-linear --world-size 4 "
      "--zero 3 --seq 2048 --batch 1 --checkpointing full --format json");
  ASSERT_EQ(z3.code, 0) << z3.err;
  const json zj = z3.j();
  EXPECT_EQ(n(zj["ranks"][0]["figures"]["params"]), 2 * (base / 4 + shard));
  EXPECT_EQ(n(zj["ranks"][0]["figures"]["gradients"]), 2 * shard);

  // plan --finetune lora: no fitting layout splits the sequence (sp), and the sp families say
  // why they are refused.
  const Result pl = trainmem(
      "plan --model llama3-8b --gpus 8 --gpu-memory 24GB --global-batch 64 --seq 2048 "
      "--finetune lora --lora-targets all-linear --format json");
  ASSERT_EQ(pl.code, 0) << pl.err;
  const json pjj = pl.j();
  EXPECT_EQ(pjj["inputs"]["finetune"]["finetune"], "lora");
  EXPECT_EQ(n(pjj["inputs"]["finetune"]["lora_rank"]), 16u);
  ASSERT_FALSE(pjj["candidates"].empty());
  for (const json& c : pjj["candidates"]) EXPECT_FALSE(c["layout"]["sp"].get<bool>());

  // QLoRA per rank (tp 1): every rank stores the whole 4-bit base, the bytes of the one-GPU
  // native profile's params (proven byte for byte against bitsandbytes' layout above); ZeRO-2
  // shards the adapters' gradients.
  const Result one = trainmem(
      "estimate --model llama3-8b --finetune qlora --lora-targets all-linear --seq 2048 --batch 1 "
      "--checkpointing full --profile native --format json");
  const Result four = trainmem(
      "estimate --model llama3-8b --finetune qlora --lora-targets all-linear --world-size 4 "
      "--zero 2 --seq 2048 --batch 1 --checkpointing full --format json");
  ASSERT_EQ(one.code, 0) << one.err;
  ASSERT_EQ(four.code, 0) << four.err;
  const json fj = four.j();
  const json& q4 = fj["ranks"][0]["figures"];
  EXPECT_EQ(n(q4["params"]), n(one.j()["analytic"]["native"]["params"]));
  EXPECT_EQ(n(q4["gradients"]), 2 * shard);
  EXPECT_EQ(n(q4["optimizer_states"]), 12 * shard);
  EXPECT_EQ(fj["run"]["finetune"], "qlora");
}

}  // namespace
}  // namespace trainmem::e2e
