// The hf-peft profile against what a real LoRA / QLoRA step kept: transformers 5.25, peft
// 0.21.2, bitsandbytes 0.50.2 and torch 2.15 on the CPU (tests/data/hf_peft/*.json, written by
// tools/peft_saved_tensors.py with saved_tensors_hooks; the test needs none of them). Every
// group of saved tensors is compared as a sorted list of (bytes, dtype) pairs, and the model
// states against the bytes the script counted tensor by tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/lora.hpp"

namespace trainmem {
namespace {

using u64 = std::uint64_t;
using nlohmann::json;

json load_case(const std::string& name) {
  const std::string path = std::string(TRAINMEM_TEST_DATA_DIR) + "/hf_peft/" + name + ".json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

using Sig = std::vector<std::pair<u64, std::string>>;
Sig sig_of_group(const json& g, const std::string& group) {
  Sig s;
  for (const auto& e : g.at("saved"))
    if (e.at("group") == group) s.push_back({e.at("bytes").get<u64>(), e.at("dtype")});
  std::sort(s.begin(), s.end());
  return s;
}
Sig sig_of(std::initializer_list<const std::vector<TensorEntry>*> lists) {
  Sig s;
  for (const auto* l : lists)
    for (const auto& e : *l) s.push_back({e.bytes, e.dtype});
  std::sort(s.begin(), s.end());
  return s;
}
std::string show(const Sig& s) {
  std::string o;
  for (const auto& [b, d] : s) o += std::to_string(b) + ":" + d + " ";
  return o;
}

// The recipe each golden ran (tools/peft_saved_tensors.py, docs/lora-plan.md section 8).
struct Case {
  const char* name;
  Finetune finetune;
  bool prepare;
  double dropout;
  bool checkpointing;
  BnbOptimizer optimizer = BnbOptimizer::none;  // none: torch's AdamW
  bool model_dtype =
      false;  // get_peft_model(..., autocast_adapter_dtype=False): --lora-dtype model
  PeftEra era = PeftEra::v0_19;  // the peft release measured (--peft-version)
  const char* dir = "";          // the era's folder under tests/data/hf_peft
  std::string file() const { return std::string(dir) + name; }
  // The release that ran it: "peft-<release>/", or the default 0.21.2.
  std::string release() const {
    const std::string d = dir;
    return d.empty() ? "0.21.2" : d.substr(5, d.size() - 6);
  }
};
const Case kCases[] = {
    {"lora-bf16", Finetune::lora, false, 0.0, false},
    {"lora-bf16-dropout", Finetune::lora, false, 0.1, false},
    {"qlora-nf4-dq", Finetune::qlora, true, 0.0, false},
    {"qlora-nf4-dq-ckpt", Finetune::qlora, true, 0.0, true},
    {"qlora-nf4-dq-noprep", Finetune::qlora, false, 0.0, false},
    {"qlora-nf4-dq-dropout", Finetune::qlora, true, 0.1, false},
    {"qlora-nf4-dq-r20-adamw8bit", Finetune::qlora, true, 0.0, false, BnbOptimizer::adamw8bit},
    {"qlora-nf4-dq-r20-paged-adamw8bit", Finetune::qlora, true, 0.0, false,
     BnbOptimizer::paged_adamw8bit},
    {"lora-bf16-r20-paged-adamw", Finetune::lora, false, 0.0, false, BnbOptimizer::paged_adamw},
    {"lora-bf16-model", Finetune::lora, false, 0.0, false, BnbOptimizer::none, true},
    {"qlora-nf4-dq-model", Finetune::qlora, true, 0.0, false, BnbOptimizer::none, true},
    // Older peft (`--peft-version`, docs/formulas.md, "peft eras"): 0.10.0 and 0.11.1, adapters
    // in the base weight's dtype (bf16 here; fp32 on the 4-bit base), no autocast option; 0.12.0
    // and 0.18.1, fp32 adapters, and a 4-bit base's stay fp32 under autocast_adapter_dtype=False.
    {"lora-bf16", Finetune::lora, false, 0.0, false, BnbOptimizer::none, false, PeftEra::v0_10,
     "peft-0.10.0/"},
    {"lora-bf16-dropout", Finetune::lora, false, 0.1, false, BnbOptimizer::none, false,
     PeftEra::v0_10, "peft-0.10.0/"},
    {"qlora-nf4-dq", Finetune::qlora, true, 0.0, false, BnbOptimizer::none, false, PeftEra::v0_10,
     "peft-0.10.0/"},
    {"lora-bf16-r20-paged-adamw", Finetune::lora, false, 0.0, false, BnbOptimizer::paged_adamw,
     false, PeftEra::v0_10, "peft-0.10.0/"},
    {"lora-bf16", Finetune::lora, false, 0.0, false, BnbOptimizer::none, false, PeftEra::v0_10,
     "peft-0.11.1/"},
    {"lora-bf16", Finetune::lora, false, 0.0, false, BnbOptimizer::none, false, PeftEra::v0_12,
     "peft-0.12.0/"},
    {"lora-bf16-model", Finetune::lora, false, 0.0, false, BnbOptimizer::none, true, PeftEra::v0_12,
     "peft-0.12.0/"},
    {"lora-bf16", Finetune::lora, false, 0.0, false, BnbOptimizer::none, false, PeftEra::v0_12,
     "peft-0.18.1/"},
    {"lora-bf16-model", Finetune::lora, false, 0.0, false, BnbOptimizer::none, true, PeftEra::v0_12,
     "peft-0.18.1/"},
    {"qlora-nf4-dq", Finetune::qlora, true, 0.0, false, BnbOptimizer::none, false, PeftEra::v0_12,
     "peft-0.18.1/"},
    {"qlora-nf4-dq-model", Finetune::qlora, true, 0.0, false, BnbOptimizer::none, true,
     PeftEra::v0_12, "peft-0.18.1/"},
};

struct Recipe {
  ModelConfig model;
  TrainConfig train;
  HfOptions hf;
};

Recipe setup_of(const json& g, const Case& c) {
  const json& cfg = g.at("config");
  Recipe s;
  s.model.name = std::string("peft-golden-") + c.name;
  s.model.hidden = cfg.at("hidden_size");
  s.model.intermediate = cfg.at("intermediate_size");
  s.model.heads = cfg.at("num_attention_heads");
  s.model.kv_heads = cfg.at("num_key_value_heads");
  s.model.vocab = cfg.at("vocab_size");
  s.model.layers = cfg.at("num_hidden_layers");
  s.model.max_positions = cfg.at("max_position_embeddings");
  s.model.tied_embeddings = cfg.at("tie_word_embeddings");
  s.train.batch = cfg.at("batch");
  s.train.seq = cfg.at("seq");
  s.train.dtype = DType::bf16;
  s.train.optimizer = Optimizer::adamw;
  s.train.checkpointing = c.checkpointing ? Checkpointing::full : Checkpointing::none;
  PeftOptions& p = s.hf.peft;
  p.finetune = c.finetune;
  p.rank = cfg.at("lora_r");
  // peft's default lora_alpha, what the script passes: it scales the adapters' output, not
  // their bytes.
  EXPECT_EQ(cfg.at("lora_alpha").get<int>(), 8);
  p.targets = parse_lora_targets(cfg.at("target_modules"));
  p.dropout = cfg.at("lora_dropout");
  EXPECT_DOUBLE_EQ(p.dropout, c.dropout) << c.name;
  p.quant = c.finetune == Finetune::qlora ? Quant::nf4 : Quant::none;
  p.double_quant = true;
  p.quant_blocksize = 64;
  p.kbit_prepare = c.prepare;
  p.cpu_dropout_mask = true;  // the goldens ran on the CPU
  p.optimizer = c.optimizer;
  p.adapters_fp32 = !c.model_dtype;
  p.peft_era = c.era;
  EXPECT_EQ(g.at("gradient_checkpointing").get<bool>(), c.checkpointing) << c.name;
  return s;
}

TEST(HfPeftGolden, TheRunsWereTheReleasedLibrariesOnTheCpu) {
  for (const Case& c : kCases) {
    const json g = load_case(c.file());
    EXPECT_EQ(g.at("case"), c.name);
    EXPECT_EQ(g.at("device"), "cpu");
    EXPECT_EQ(g.at("versions").at("transformers"), "5.25.0");
    EXPECT_EQ(g.at("versions").at("peft"), c.release());
    EXPECT_EQ(parse_peft_version(c.release()), c.era);
    EXPECT_EQ(g.at("versions").at("bitsandbytes"), "0.50.2");
    EXPECT_TRUE(g.at("frozen_params_with_grad").empty()) << c.name;
  }
}

TEST(HfPeftGolden, ModelStatesAreEveryStoredByte) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.file());
    const json g = load_case(c.file());
    const Recipe s = setup_of(g, c);
    const Estimate e = estimate(Profile::hf_peft, s.model, s.train, s.hf);
    EXPECT_EQ(e.figures.params, g.at("params_bytes").get<u64>());
    EXPECT_EQ(e.trainable_params, g.at("trainable_elements").get<u64>());
    EXPECT_EQ(e.trainable_params, g.at("peft_get_nb_trainable_parameters").at(0).get<u64>());
    EXPECT_EQ(e.figures.gradients, g.at("gradient_bytes").get<u64>());
    // torch's AdamW on the CPU keeps each parameter's step as a 0-dim fp32 tensor; on a GPU it
    // stays on the host (not counted by the profile). bitsandbytes keeps its step as a Python
    // int. The script counted each state storage once (the shared quantile maps too).
    u64 states = 0, steps = 0;
    for (const auto& st : g.at("optimizer").at("states")) {
      states += st.at("bytes").get<u64>();
      if (st.at("state").contains("step"))
        steps += st.at("state").at("step").at("bytes").get<u64>();
    }
    if (c.optimizer == BnbOptimizer::none) {
      EXPECT_EQ(g.at("optimizer").at("class"), "torch.optim.AdamW");
      EXPECT_EQ(steps, 4u * 2u * 7u * static_cast<u64>(s.model.layers));
    } else {
      EXPECT_EQ(steps, 0u);
    }
    // On the CPU bitsandbytes allocates no managed memory: the paged cases hold every state as
    // an ordinary tensor (and warn), so the golden's total is device + managed.
    EXPECT_EQ(e.figures.optimizer_states + e.optimizer_states_managed + steps, states);
    // The logits the caller holds.
    EXPECT_EQ(e.activations.loop_bytes, g.at("caller_held").at("logits").at("bytes").get<u64>());
  }
}

TEST(HfPeftGolden, EveryGroupMatchesTheSavedTensors) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.file());
    const json g = load_case(c.file());
    const Recipe s = setup_of(g, c);
    const Estimate e = estimate(Profile::hf_peft, s.model, s.train, s.hf);
    const auto& a = e.activations;
    // RoPE's two tables (one storage each for the model): the hooks see them in the first
    // layer that saves them.
    std::vector<TensorEntry> tables, other_shared;
    for (const auto& t : a.shared)
      (t.name.rfind("rope.", 0) == 0 ? tables : other_shared).push_back(t);
    ASSERT_EQ(tables.size(), 2u);
    const Sig head = sig_of({&a.head});
    Sig want_head = sig_of_group(g, "forward.model");
    const Sig base = sig_of_group(g, "forward.base_model");
    want_head.insert(want_head.end(), base.begin(), base.end());
    std::sort(want_head.begin(), want_head.end());
    EXPECT_EQ(head, want_head) << "ours " << show(head) << "\nreal " << show(want_head);
    if (!c.checkpointing) {
      ASSERT_FALSE(a.first_layer.empty()) << "layer 0's input needs no gradient";
      const Sig l0 = sig_of({&a.first_layer, &tables});
      const Sig l1 = sig_of({&a.layer});
      EXPECT_EQ(l0, sig_of_group(g, "forward.layer.0"))
          << "ours " << show(l0) << "\nreal " << show(sig_of_group(g, "forward.layer.0"));
      EXPECT_EQ(l1, sig_of_group(g, "forward.layer.1"))
          << "ours " << show(l1) << "\nreal " << show(sig_of_group(g, "forward.layer.1"));
      EXPECT_TRUE(other_shared.empty());
      EXPECT_EQ(a.total_bytes, g.at("saved_bytes_total").get<u64>() + a.loop_bytes);
    } else {
      EXPECT_TRUE(a.first_layer.empty());
      for (const char* grp : {"forward.layer.0", "forward.layer.1"})
        EXPECT_EQ(sig_of({&a.layer}), sig_of_group(g, grp)) << grp;
      const Sig r0 = sig_of({&a.recompute});
      const Sig r1 = sig_of({&a.recompute, &tables});
      EXPECT_EQ(r0, sig_of_group(g, "recompute.layer.0"))
          << "ours " << show(r0) << "\nreal " << show(sig_of_group(g, "recompute.layer.0"));
      EXPECT_EQ(r1, sig_of_group(g, "recompute.layer.1"));
      // position_ids is held by the checkpoints' closures, not saved: the hooks do not see it.
      ASSERT_EQ(other_shared.size(), 1u);
      EXPECT_EQ(other_shared[0].bytes, 8u * static_cast<u64>(s.train.seq));
    }
  }
}

// The 4-bit bytes of one matrix, written from bitsandbytes' layout (docs/lora-plan.md 1.6)
// against the bytes the script measured on every quantized weight.
TEST(HfPeftGolden, FourBitWeightBytesPerMatrix) {
  const json g = load_case("qlora-nf4-dq");
  int n4 = 0;
  for (const auto& p : g.at("params")) {
    if (!p.contains("quant_state")) continue;
    const json& q = p.at("quant_state");
    const u64 n = q.at("n");
    const u64 blocks = (n + 63) / 64;
    const u64 want = (n + 1) / 2 + blocks + 4 * ((blocks + 255) / 256) + 4 + 16 * 4 + 256 * 4;
    EXPECT_EQ(q.at("bytes_measured").get<u64>(), want) << p.at("name");
    ++n4;
  }
  EXPECT_EQ(n4, 14);
}

// bitsandbytes' state layout, tensor by tensor, as the golden shows it: the rule the profile
// sums (8-bit from 4,096 elements, one fp32 absmax per 256, the maps once) and where CUDA would
// page (100,000 elements; none of these adapters is that large, and the CPU never pages).
TEST(HfPeftGolden, BitsandbytesOptimizerStatesPerTensor) {
  for (const Case& c : kCases) {
    if (c.optimizer == BnbOptimizer::none) continue;
    SCOPED_TRACE(c.file());
    const json g = load_case(c.file());
    const bool bits8 = c.optimizer != BnbOptimizer::paged_adamw;
    const bool paged = c.optimizer != BnbOptimizer::adamw8bit;
    if (paged) {
      EXPECT_NE(g.at("optimizer").at("warnings").dump().find("not supported on CPU"),
                std::string::npos);
    }
    int eight = 0, maps = 0;
    for (const auto& st : g.at("optimizer").at("states")) {
      const u64 n = st.at("numel");
      const json& k = st.at("state");
      const bool want8 = bits8 && n >= 4096;
      EXPECT_EQ(k.at("state1").at("dtype"), want8 ? "u8" : "fp32") << st.at("name");
      EXPECT_EQ(k.at("state2").at("bytes").get<u64>(), (want8 ? 1u : 4u) * n);
      EXPECT_EQ(k.contains("absmax1"), want8);
      if (want8) {
        ++eight;
        EXPECT_EQ(k.at("absmax2").at("bytes").get<u64>(), 4u * ((n + 255) / 256));
        EXPECT_EQ(k.at("qmap1").at("bytes").get<u64>(), 1024u);
        maps += !k.at("qmap1").at("shared").get<bool>() + !k.at("qmap2").at("shared").get<bool>();
      }
      for (const auto& [name, rec] : k.items()) EXPECT_FALSE(rec.at("is_paged").get<bool>());
    }
    EXPECT_EQ(eight, bits8 ? 6 : 0);  // gate/up lora_B and down lora_A (304 × 20) of 2 layers
    EXPECT_EQ(maps, bits8 ? 2 : 0);
  }
}

// --bnb-version 0.43: the 8-bit optimizers' absmax over 2,048 elements, as bitsandbytes 0.43.3
// allocates it (tools/bnb_optimizer_era.py: init_state on the rank-20 adapters of the
// qlora-nf4-dq-r20-adamw8bit case; 0.43.3 has no CPU update step).
TEST(HfPeftGolden, Bitsandbytes043KeepsOneAbsmaxPer2048Elements) {
  const json old = load_case("bnb-0.43.3-adamw8bit-init");
  EXPECT_EQ(old.at("versions").at("bitsandbytes"), "0.43.3");
  for (const auto& st : old.at("states")) {
    const u64 n = st.at("numel");
    if (n < 4096) continue;
    EXPECT_EQ(st.at("state").at("absmax1").at("bytes").get<u64>(), 4u * ((n + 2047) / 2048));
  }
  const Case& c = kCases[6];
  ASSERT_EQ(std::string(c.name), "qlora-nf4-dq-r20-adamw8bit");
  const json g = load_case(c.file());
  Recipe s = setup_of(g, c);
  EXPECT_EQ(old.at("config").at("lora_r"), g.at("config").at("lora_r"));
  s.hf.peft.bnb_era = parse_bnb_version("0.43.3");
  const Estimate e = estimate(Profile::hf_peft, s.model, s.train, s.hf);
  EXPECT_EQ(e.figures.optimizer_states, old.at("bytes").get<u64>());
  // The same adapters under 0.50.2 (the measured step) differ by the absmax alone.
  s.hf.peft.bnb_era = parse_bnb_version("0.50.2");
  const Estimate now = estimate(Profile::hf_peft, s.model, s.train, s.hf);
  EXPECT_EQ(now.figures.optimizer_states, g.at("optimizer").at("bytes").get<u64>());
  EXPECT_EQ(now.figures.optimizer_states - e.figures.optimizer_states, 6u * 8u * (24u - 3u));
}

TEST(HfPeftInputs, PeftVersions) {
  EXPECT_EQ(parse_peft_version("0.10.0"), PeftEra::v0_10);
  EXPECT_EQ(parse_peft_version("0.11"), PeftEra::v0_10);
  EXPECT_EQ(parse_peft_version("0.11.1"), PeftEra::v0_10);
  EXPECT_EQ(parse_peft_version("0.12.0"), PeftEra::v0_12);
  EXPECT_EQ(parse_peft_version("0.18.1"), PeftEra::v0_12);
  EXPECT_EQ(parse_peft_version("0.19.0"), PeftEra::v0_19);
  EXPECT_EQ(parse_peft_version("0.21.2"), PeftEra::v0_19);
  for (const char* bad : {"0.9.0", "0.22.0", "1.0", "", "0.1x", "0.18.", "018"}) {
    try {
      (void)parse_peft_version(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const InputError& err) {
      EXPECT_NE(std::string(err.what()).find("--peft-version"), std::string::npos) << err.what();
    }
  }
}

// What the eras change, on Llama-3-8B, r 16, all seven (T = 41,943,040 adapter elements): under
// peft 0.10 a bf16 base's adapters are bf16 (2·T bytes fewer params and gradients than 0.21's
// fp32 ones; torch's AdamW states follow them: 4·T fewer); a 4-bit base's are fp32 in every era
// but 0.19+ under --lora-dtype model.
TEST(HfPeftInputs, PeftErasChangeTheAdaptersDtype) {
  const ModelConfig m = *find_preset("llama3-8b");
  TrainConfig t;
  t.batch = 1;
  t.seq = 512;
  t.dtype = DType::bf16;
  HfOptions hf;
  hf.peft.finetune = Finetune::lora;
  hf.peft.rank = 16;
  hf.peft.targets = 0x7f;
  const u64 T = 41943040;
  auto with = [&](Finetune f, PeftEra era, bool fp32) {
    HfOptions o = hf;
    o.peft.finetune = f;
    o.peft.quant = f == Finetune::qlora ? Quant::nf4 : Quant::none;
    o.peft.peft_era = era;
    o.peft.adapters_fp32 = fp32;
    return estimate(Profile::hf_peft, m, t, o);
  };
  const Estimate now = with(Finetune::lora, PeftEra::v0_19, true);
  const Estimate old = with(Finetune::lora, PeftEra::v0_10, true);
  EXPECT_EQ(now.figures.params - old.figures.params, 2 * T);
  EXPECT_EQ(now.figures.gradients - old.figures.gradients, 2 * T);
  EXPECT_EQ(now.figures.optimizer_states - old.figures.optimizer_states, 4 * T);
  EXPECT_EQ(old.figures.params, with(Finetune::lora, PeftEra::v0_12, false).figures.params);
  const u64 q = with(Finetune::qlora, PeftEra::v0_19, true).figures.params;
  for (PeftEra era : {PeftEra::v0_10, PeftEra::v0_12})
    EXPECT_EQ(with(Finetune::qlora, era, false).figures.params, q) << peft_era_name(era);
  EXPECT_EQ(q - with(Finetune::qlora, PeftEra::v0_19, false).figures.params, 2 * T);
}

TEST(HfPeftInputs, BnbVersions) {
  EXPECT_EQ(parse_bnb_version("0.43"), BnbEra::v0_43);
  EXPECT_EQ(parse_bnb_version("0.43.3"), BnbEra::v0_43);
  EXPECT_EQ(parse_bnb_version("0.44.0"), BnbEra::v0_44);
  EXPECT_EQ(parse_bnb_version("0.48.1.dev0"), BnbEra::v0_44);
  EXPECT_EQ(parse_bnb_version("0.50.2"), BnbEra::v0_44);
  EXPECT_EQ(parse_bnb_version("0.44.0rc1"), BnbEra::v0_44);
  EXPECT_EQ(parse_bnb_version("0.45.2.post1"), BnbEra::v0_44);
  for (const char* bad : {"0.42.0", "0.51.0", "1.0", "0.4x", "", ".43", "0.", "043", "0.43-3",
                          "0.43.foo!", "0.50.", "0.43.-3", "0.43.3.", "0.44.0 "}) {
    try {
      (void)parse_bnb_version(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const InputError& err) {
      EXPECT_NE(std::string(err.what()).find("--bnb-version"), std::string::npos) << err.what();
    }
  }
}

// Llama-3-8B, QLoRA r 16 on all seven projections, NF4 + double quant, prepare, b 1, s 2048,
// bf16, checkpointing.
std::tuple<ModelConfig, TrainConfig, HfOptions> llama3_8b_qlora_all_linear() {
  const auto m = find_preset("llama3-8b");
  if (!m) throw std::runtime_error("no llama3-8b preset");
  TrainConfig t;
  t.batch = 1;
  t.seq = 2048;
  t.dtype = DType::bf16;
  t.checkpointing = Checkpointing::full;
  HfOptions o;
  o.peft.finetune = Finetune::qlora;
  o.peft.quant = Quant::nf4;
  o.peft.rank = 16;
  o.peft.targets = kLoraAllLinear;
  return {*m, t, o};
}

TEST(HfPeftByHand, Llama3_8bQloraPagedAdamw8bit) {
  // Llama-3-8B, QLoRA r 16 on all seven projections, PagedAdamW8bit. Per layer the adapters are
  // 16 × 4,096 or 4,096 × 16 = 65,536 elements (q, k/v A, o, gate/up A, down B), 1,024 × 16 =
  // 16,384 (k/v B) and 229,376 = 16 × 14,336 (gate/up B, down A): all 8-bit, every count a
  // multiple of 256; the last three paged.
  auto [m, t, o] = llama3_8b_qlora_all_linear();
  o.peft.optimizer = BnbOptimizer::paged_adamw8bit;
  const Estimate e = estimate(Profile::hf_peft, m, t, o);
  const u64 n = 41943040;  // trainable
  const u64 managed = 32u * 3u * 2u * 229376u;
  EXPECT_EQ(e.optimizer_states_managed, managed);
  EXPECT_EQ(e.figures.optimizer_states, 2u * n + 8u * (n / 256u) + 2048u - managed);
  EXPECT_EQ(e.figures.peak, e.figures.params + e.figures.gradients + e.figures.optimizer_states +
                                e.figures.activations_peak + e.figures.inputs);
  // Not paged: the same bytes on the device.
  o.peft.optimizer = BnbOptimizer::adamw8bit;
  const Estimate d = estimate(Profile::hf_peft, m, t, o);
  EXPECT_EQ(d.optimizer_states_managed, 0u);
  EXPECT_EQ(d.figures.optimizer_states, 2u * n + 8u * (n / 256u) + 2048u);
  // The 32-bit paged AdamW: fp32 m and v, the same three tensors paged.
  o.peft.optimizer = BnbOptimizer::paged_adamw;
  const Estimate p = estimate(Profile::hf_peft, m, t, o);
  EXPECT_EQ(p.optimizer_states_managed, 4u * managed);
  EXPECT_EQ(p.figures.optimizer_states + p.optimizer_states_managed, 8u * n);
}

TEST(HfPeftByHand, Llama3_8bQloraAllLinear) {
  // Llama-3-8B, QLoRA r 16 on all seven projections, NF4 + double quant, prepare, b 1,
  // s 2048, checkpointing: the numbers of docs/formulas.md's worked example, by hand.
  const auto [m, t, o] = llama3_8b_qlora_all_linear();
  const Estimate e = estimate(Profile::hf_peft, m, t, o);
  EXPECT_EQ(e.trainable_params, 41943040u);
  EXPECT_EQ(e.figures.gradients, 4u * 41943040u);
  EXPECT_EQ(e.figures.optimizer_states, 8u * 41943040u);
  // Each checkpointed layer keeps its fp32 input: 4·s·h.
  EXPECT_EQ(e.activations.per_layer_bytes, 4u * 2048u * 4096u);
}

TEST(HfPeftInputs, BadRecipesNameTheFlag) {
  auto m = find_preset("tiny");
  ASSERT_TRUE(m);
  TrainConfig t;
  t.batch = 1;
  t.seq = 16;
  auto expect_error = [&](HfOptions o, const std::string& want) {
    try {
      (void)estimate(Profile::hf_peft, *m, t, o);
      ADD_FAILURE() << "accepted; wanted " << want;
    } catch (const InputError& err) {
      EXPECT_NE(std::string(err.what()).find(want), std::string::npos) << err.what();
    }
  };
  HfOptions o;
  expect_error(o, "--finetune lora or qlora");
  o.peft.finetune = Finetune::lora;
  o.peft.rank = 0;
  expect_error(o, "--lora-rank 0");
  o.peft.rank = 8;
  o.peft.dropout = 1;
  expect_error(o, "--lora-dropout");
  o.peft.dropout = 0;
  o.peft.quant = Quant::nf4;
  expect_error(o, "--quant nf4");
  o.peft.finetune = Finetune::qlora;
  o.peft.quant = Quant::none;
  expect_error(o, "--quant none");
  o.peft.quant = Quant::nf4;
  o.peft.quant_blocksize = 96;
  expect_error(o, "--quant-blocksize 96");
  o.peft.quant_blocksize = 64;
  t.optimizer = Optimizer::lomo;
  expect_error(o, "--optimizer lomo");
  t.optimizer = Optimizer::sgd;
  o.peft.optimizer = BnbOptimizer::adamw8bit;
  expect_error(o, "--optimizer adamw8bit");  // it replaces AdamW: not beside SGD
  t.optimizer = Optimizer::adamw;
  HfOptions full;
  full.peft.optimizer = BnbOptimizer::paged_adamw8bit;
  try {
    (void)estimate(Profile::hf_sdpa, *m, t, full);
    ADD_FAILURE() << "hf-sdpa accepted a bitsandbytes optimizer";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find("--optimizer paged-adamw8bit"), std::string::npos)
        << err.what();
  }
}

}  // namespace
}  // namespace trainmem
