// End to end: `estimate --finetune lora|qlora` as a user types it (issue 28, the hf-peft
// profile). The model states are checked against bitsandbytes' layout and peft's adapter
// shapes written out here, not read from the analytic code; the activations against the
// real runs are tests/test_analytic_peft.cpp's.
#include <gtest/gtest.h>

#include "test_cli_e2e_helpers.hpp"

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
  ASSERT_EQ(j["analytic"].size(), 1u) << "only hf-peft models a LoRA step";
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
  // The text report says what it models.
  const Result t = trainmem("estimate --model llama3-8b --finetune qlora --batch 1 --seq 2048");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_TRUE(has(t.out, "hf-peft")) << t.out;
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
           {"profile --model tiny --backend meta --finetune lora", "--finetune lora"},
           {"maxbatch --model tiny --budget 1GiB --finetune qlora", "--finetune qlora"},
           {"estimate --model tiny --finetune lora --profile native",
            "--profile native with --finetune lora"},
           {"estimate --model tiny --profile hf-peft", "needs --finetune lora or qlora"},
           {"estimate --model tiny --finetune full --lora-rank 8", "--lora-rank applies to"},
           {"estimate --model tiny --finetune lora --lora-rank 0", "--lora-rank"},
           {"estimate --model tiny --finetune lora --lora-targets q_proj,wo", "--lora-targets"},
           {"estimate --model tiny --finetune lora --lora-dropout 1.5", "--lora-dropout"},
           {"estimate --model tiny --finetune lora --lora-dropout x", "--lora-dropout"},
           {"estimate --model tiny --finetune lora --lora-dtype fp8", "--lora-dtype"},
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
           {"estimate --model tiny --finetune lora --world-size 2 --zero 2",
            "--finetune lora with"},
           {"estimate --model qwen3-8b --finetune lora", "q/k norms"},
           {"estimate --model tiny --finetune dora", "--finetune"}}) {
    SCOPED_TRACE(c.args);
    const Result r = trainmem(c.args);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_TRUE(has(r.err, c.message)) << r.err;
  }
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
  const Result d = trainmem("diff '" + a + "' '" + b + "' --format json");
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

}  // namespace
}  // namespace trainmem::e2e
