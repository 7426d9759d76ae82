// The `native` profile against (1) an independent, step-by-step simulation of
// docs/native-plan.md over ALL layers and two steps (the closed form only looks at the first
// backward layer and a handful of instants), and (2) hand-computed values.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "model_helpers.hpp"
#include "trainmem/analytic/analytic.hpp"

namespace trainmem {
namespace {

using u64 = std::uint64_t;

ModelConfig make_model(const char* name, std::int64_t V, std::int64_t h, std::int64_t i,
                       std::int64_t L, std::int64_t a, std::int64_t k, bool tied = false) {
  ModelConfig m;
  m.name = name;
  m.vocab = V;
  m.hidden = h;
  m.intermediate = i;
  m.layers = L;
  m.heads = a;
  m.kv_heads = k;
  m.max_positions = 4096;
  m.tied_embeddings = tied;
  return m;
}

ModelConfig family(ModelConfig m, bool qkv_bias, bool qk_norm, std::int64_t head_dim) {
  m.qkv_bias = qkv_bias;
  m.qk_norm = qk_norm;
  m.explicit_head_dim = head_dim;
  return m;
}

// A minimal ledger: live bytes per category, a peak per category, the total peak with its
// breakdown (strictly greater replaces: a tie keeps the first), activations at end of forward.
class Books {
 public:
  void alloc(const std::string& name, Category c, u64 bytes) {
    ASSERT_EQ(live_tensors_.count(name), 0u) << "double alloc " << name;
    live_tensors_[name] = {c, bytes};
    live_[idx(c)] += bytes;
    peak_[idx(c)] = std::max(peak_[idx(c)], live_[idx(c)]);
    u64 total = 0;
    for (auto x : live_) total += x;
    if (total > total_peak_) {
      total_peak_ = total;
      at_peak_ = live_;
    }
  }
  void free(const std::string& name) {
    auto it = live_tensors_.find(name);
    ASSERT_NE(it, live_tensors_.end()) << "free of " << name;
    live_[idx(it->second.first)] -= it->second.second;
    live_tensors_.erase(it);
  }
  void begin_step() {
    peak_ = live_;
    total_peak_ = 0;
    for (auto x : live_) total_peak_ += x;
    at_peak_ = live_;
  }
  void mark_end_of_forward() { act_end_ = live_[idx(Category::activations)]; }
  u64 live(Category c) const { return live_[idx(c)]; }
  u64 peak(Category c) const { return peak_[idx(c)]; }
  u64 total_peak() const { return total_peak_; }
  CategoryBytes at_peak() const { return at_peak_; }
  u64 act_end() const { return act_end_; }
  std::size_t live_count() const { return live_tensors_.size(); }

 private:
  static int idx(Category c) { return static_cast<int>(c); }
  std::map<std::string, std::pair<Category, u64>> live_tensors_;
  CategoryBytes live_{}, peak_{}, at_peak_{};
  u64 total_peak_ = 0, act_end_ = 0;
};

// Walks the plan of docs/native-plan.md allocation by allocation.
MemoryFigures simulate(const ModelConfig& m, const TrainConfig& t) {
  // d: config.json's head_dim when set (Qwen3), else h/a.
  const u64 b = t.batch, s = t.seq, h = m.hidden, i = m.intermediate, a = m.heads, kv = m.kv_heads,
            d = m.explicit_head_dim > 0 ? u64(m.explicit_head_dim) : m.hidden / m.heads, ad = a * d,
            kd = kv * d, V = m.vocab, L = m.layers;
  const bool bias = m.qkv_bias, qkn = m.qk_norm;
  const u64 w = t.dtype == DType::f32 ? 4 : 2;
  const bool lomo = t.optimizer == Optimizer::lomo, full = t.checkpointing == Checkpointing::full,
             eager = t.attention == Attention::eager, tied = m.tied_embeddings;
  const auto A = Category::activations, W = Category::workspace, G = Category::gradients;
  Books k;
  // Parameters in setup order: name and element count.
  std::vector<std::pair<std::string, u64>> params;
  params.push_back({"embed", V * h});
  for (u64 l = 0; l < L; ++l) {
    const std::string p = "L" + std::to_string(l) + ".";
    params.push_back({p + "ln1", h});
    params.push_back({p + "q", ad * h});
    if (bias) params.push_back({p + "q.bias", ad});
    params.push_back({p + "k", kd * h});
    if (bias) params.push_back({p + "k.bias", kd});
    params.push_back({p + "v", kd * h});
    if (bias) params.push_back({p + "v.bias", kd});
    params.push_back({p + "o", h * ad});
    if (qkn) {
      params.push_back({p + "q_norm", d});
      params.push_back({p + "k_norm", d});
    }
    params.push_back({p + "ln2", h});
    params.push_back({p + "gate", i * h});
    params.push_back({p + "up", i * h});
    params.push_back({p + "down", h * i});
  }
  params.push_back({"norm", h});
  if (!tied) params.push_back({"lm_head", V * h});
  std::map<std::string, u64> numel(params.begin(), params.end());
  for (auto& [n, e] : params) k.alloc(n, Category::params, e * w);
  if (!lomo)
    for (auto& [n, e] : params) k.alloc(n + ".grad", G, e * w);
  for (auto& [n, e] : params) {
    int states = t.optimizer == Optimizer::adamw ? 2 : 0;
    if (t.optimizer != Optimizer::lomo && w != 4) states += 1;  // master
    for (int x = 0; x < states; ++x)
      k.alloc(n + ".state" + std::to_string(x), Category::optimizer_states, e * 4);
  }
  k.alloc("tokens", Category::inputs, b * s * 4);
  k.alloc("targets", Category::inputs, b * s * 4);
  k.alloc("cublas", W, 33554432);

  auto lomo_g = [&](const std::string& p) {
    if (!lomo) return;
    k.alloc(p + ".grad", G, numel.at(p) * w);
    k.free(p + ".grad");
  };
  std::vector<std::string> layer_names = {"rstd1", "xn1"};
  if (qkn)
    for (auto n : {"q_pre", "k_pre", "q_rstd", "k_rstd"}) layer_names.push_back(n);
  for (auto n : {"q", "k", "v", "store", "attn", "h_mid", "rstd2", "xn2", "gate", "up", "act"})
    layer_names.push_back(n);
  auto layer_bytes = [&](const std::string& n) -> u64 {
    if (n == "rstd1" || n == "rstd2") return b * s * 4;
    if (n == "q_rstd") return b * s * a * 4;
    if (n == "k_rstd") return b * s * kv * 4;
    if (n == "q" || n == "q_pre" || n == "attn") return b * s * ad * w;
    if (n == "k" || n == "v" || n == "k_pre") return b * s * kd * w;
    if (n == "store") return eager ? b * a * s * s * w : b * a * s * 4;
    if (n == "gate" || n == "up" || n == "act") return b * s * i * w;
    return b * s * h * w;  // xn1 h_mid xn2 out
  };
  auto lname = [](const std::string& n, u64 l) { return n + "@" + std::to_string(l); };
  auto x_name = [&](u64 l) { return l == 0 ? std::string("embed_out") : lname("out", l - 1); };

  MemoryFigures f;
  for (int step = 0; step < 2; ++step) {
    k.begin_step();
    // forward
    k.alloc("embed_out", A, b * s * h * w);
    for (u64 l = 0; l < L; ++l) {
      for (const auto& n : layer_names) k.alloc(lname(n, l), A, layer_bytes(n));
      k.alloc(lname("out", l), A, b * s * h * w);
      if (full)
        for (auto it = layer_names.rbegin(); it != layer_names.rend(); ++it) k.free(lname(*it, l));
    }
    k.alloc("final_norm_out", A, b * s * h * w);
    k.alloc("final_rstd", A, b * s * 4);
    k.alloc("logits", A, b * s * V * w);
    k.alloc("ce_lse", A, b * s * 4);
    k.alloc("ce_losses", W, b * s * 4);
    k.free("ce_losses");
    k.mark_end_of_forward();
    // backward: head
    k.free("ce_lse");
    k.alloc("d_final_norm_out", W, b * s * h * w);
    if (lomo) {
      if (tied) {
        k.alloc("tied.grad", G, V * h * w);
      } else {
        lomo_g("lm_head");
      }
    }
    k.free("logits");
    k.alloc("d_residual", W, b * s * h * w);
    lomo_g("norm");
    k.free("d_final_norm_out");
    k.free("final_norm_out");
    k.free("final_rstd");
    k.free(lname("out", L - 1));
    for (u64 ll = L; ll-- > 0;) {
      const std::string p = "L" + std::to_string(ll) + ".";
      if (full)
        for (const auto& n : layer_names) k.alloc(lname(n, ll), A, layer_bytes(n));
      k.alloc("d_act", W, b * s * i * w);
      lomo_g(p + "down");
      k.free(lname("act", ll));
      k.alloc("d_gate", W, b * s * i * w);
      k.alloc("d_up", W, b * s * i * w);
      k.free("d_act");
      k.free(lname("gate", ll));
      k.free(lname("up", ll));
      k.alloc("d_xn2", W, b * s * h * w);
      lomo_g(p + "gate");
      lomo_g(p + "up");
      k.free("d_gate");
      k.free("d_up");
      k.free(lname("xn2", ll));
      lomo_g(p + "ln2");
      k.free("d_xn2");
      k.free(lname("h_mid", ll));
      k.free(lname("rstd2", ll));
      k.alloc("d_attn_out", W, b * s * ad * w);
      lomo_g(p + "o");
      k.alloc("d_q", W, b * s * ad * w);
      k.alloc("d_k", W, b * s * kd * w);
      k.alloc("d_v", W, b * s * kd * w);
      k.alloc("d_scratch", W, eager ? b * a * s * s * w : b * a * s * 4);
      k.free("d_scratch");
      k.free("d_attn_out");
      k.free(lname("attn", ll));
      k.free(lname("store", ll));
      if (qkn) {  // step 7: the q/k norm backward
        k.alloc("d_q_pre", W, b * s * ad * w);
        lomo_g(p + "q_norm");
        k.alloc("d_k_pre", W, b * s * kd * w);
        lomo_g(p + "k_norm");
        k.free("d_q");
        k.free("d_k");
        for (auto n : {"q_pre", "q_rstd", "k_pre", "k_rstd"}) k.free(lname(n, ll));
      }
      k.alloc("d_xn1", W, b * s * h * w);
      lomo_g(p + "q");
      if (bias) lomo_g(p + "q.bias");
      lomo_g(p + "k");
      if (bias) lomo_g(p + "k.bias");
      lomo_g(p + "v");
      if (bias) lomo_g(p + "v.bias");
      for (auto n : {qkn ? "d_q_pre" : "d_q", qkn ? "d_k_pre" : "d_k", "d_v"}) k.free(n);
      for (auto n : {"q", "k", "v", "xn1"}) k.free(lname(n, ll));
      lomo_g(p + "ln1");
      k.free("d_xn1");
      k.free(lname("rstd1", ll));
      k.free(x_name(ll));
    }
    if (lomo) {
      if (tied) {
        k.free("tied.grad");
      } else {
        lomo_g("embed");
      }
    }
    k.free("d_residual");
    EXPECT_EQ(k.live(A), 0u) << "activations left after backward";
  }
  f.params = k.live(Category::params);
  f.gradients = k.peak(G);
  f.optimizer_states = k.live(Category::optimizer_states);
  f.activations = k.act_end();
  f.activations_peak = k.peak(A);
  f.workspace = k.peak(W);
  f.inputs = k.live(Category::inputs);
  f.sum = f.params + f.gradients + f.optimizer_states + f.activations;
  f.peak = k.total_peak();
  f.peak_breakdown = k.at_peak();
  return f;
}

struct Combo {
  Optimizer opt;
  Checkpointing ckpt;
  Attention attn;
  DType dtype;
};

class NativeVsSimulation : public ::testing::TestWithParam<Combo> {};

TEST_P(NativeVsSimulation, EveryFigureEqualsTheStepByStepPlan) {
  const Combo c = GetParam();
  const std::vector<ModelConfig> models = {
      make_model("tiny", 256, 64, 176, 2, 4, 4),
      make_model("tiny-gqa", 256, 64, 176, 3, 4, 2),
      make_model("tiny-tied", 256, 64, 176, 2, 4, 4, true),
      make_model("awkward", 97, 40, 71, 3, 5, 5),
      make_model("narrow-mlp", 50, 64, 24, 2, 8, 1),    // i < h, MQA
      make_model("wide-vocab", 5000, 32, 96, 2, 2, 2),  // logits dominate
      make_model("wide-vocab-tied", 5000, 32, 96, 4, 2, 1, true),
      // The families (issue 16): Qwen2's biases; Qwen3's q/k norms with head_dim 32 (a·d = 128
      // > h = 64), with a narrow MLP so that the q/k norm backward's buffers are the peak.
      family(make_model("qwen2-like", 300, 64, 176, 2, 4, 2, true), true, false, 0),
      family(make_model("qwen3-like", 256, 64, 176, 2, 4, 2), false, true, 32),
      family(make_model("qwen3-narrow-mlp", 64, 48, 16, 2, 4, 4), true, true, 32),
  };
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{1, 2}, {3, 7}, {2, 300}};
  for (const auto& m : models) {
    for (auto [b, s] : shapes) {
      TrainConfig t;
      t.batch = b;
      t.seq = s;
      t.dtype = c.dtype;
      t.optimizer = c.opt;
      t.checkpointing = c.ckpt;
      t.attention = c.attn;
      SCOPED_TRACE(m.name + " b=" + std::to_string(b) + " s=" + std::to_string(s));
      const MemoryFigures want = simulate(m, t);
      const Estimate e = estimate(Profile::native, m, t);
      test::expect_same_figures(e.figures, want,
                                "peak instant " + e.instants.at(e.peak_instant).name);
    }
  }
}

std::vector<Combo> all_combos() {
  std::vector<Combo> v;
  for (auto o : {Optimizer::adamw, Optimizer::sgd, Optimizer::lomo})
    for (auto c : {Checkpointing::none, Checkpointing::full})
      for (auto a : {Attention::eager, Attention::flash})
        for (auto d : {DType::bf16, DType::f32}) v.push_back({o, c, a, d});
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllModes, NativeVsSimulation, ::testing::ValuesIn(all_combos()),
                         [](const ::testing::TestParamInfo<Combo>& info) {
                           const Combo& c = info.param;
                           return std::string(optimizer_name(c.opt)) + "_" +
                                  checkpointing_name(c.ckpt) + "_" + attention_name(c.attn) + "_" +
                                  (c.dtype == DType::f32 ? "fp32" : "bf16");
                         });

// ---------------------------------------------------------------- hand-computed values

// 8-bit AdamW's states by hand (docs/formulas.md, "8-bit AdamW in the native step"): per tensor
// of n >= 4,096 elements 2n bytes of uint8 moments + 8 bytes of fp32 absmax per 256-element
// block, below that 8n; + 2 × 1,024 B of quantile maps and 2 × 65,536 B of lookup tables.
TEST(NativeByHand, AdamW8bitStatesOfLlama7bAndLlama3LoRA) {
  TrainConfig t;
  t.batch = 1;
  t.seq = 64;
  t.dtype = DType::bf16;
  t.optimizer = Optimizer::adamw8bit;
  // LLaMA-7B, full fine-tune. h·h = 16,777,216 elements: 33,554,432 + 65,536 blocks × 8.
  const u64 qkvo = 33554432 + 524288;   // 34,078,720
  const u64 mlp = 90177536 + 1409024;   // 11,008 × 4,096 = 45,088,768 elements, 176,128 blocks
  const u64 norm = 8192 + 128;          // 4,096 elements: exactly min_8bit_size, 8-bit
  const u64 emb = 262144000 + 4096000;  // 32,000 × 4,096 = 131,072,000 elements, 512,000 blocks
  const u64 tables = 2 * 1024 + 2 * 65536;
  const u64 full = 32 * (4 * qkvo + 3 * mlp + 2 * norm) + 2 * emb + norm + tables;
  EXPECT_EQ(full, 13687539840u);
  const Estimate e =
      estimate(Profile::native, make_model("llama-7b", 32000, 4096, 11008, 32, 32, 32), t);
  EXPECT_EQ(e.figures.optimizer_states, full);
  EXPECT_EQ(e.figures.gradients, 2 * e.param_count);  // bf16 gradients, no master copy
  // Llama-3-8B, LoRA r 16 on all seven: A (16, in), B (out, 16) with in/out 4,096, 1,024 (k, v
  // out) and 14,336 (gate/up out, down in); every adapter is 8-bit.
  ModelConfig l3 = make_model("llama3-8b", 128256, 4096, 14336, 32, 32, 8);
  t.lora_rank = 16;
  t.lora_targets = 0x7f;
  const u64 a65536 = 131072 + 256 * 8, a16384 = 32768 + 64 * 8, a229376 = 458752 + 896 * 8;
  const u64 lora = 32 * (9 * a65536 + 2 * a16384 + 3 * a229376) + tables;
  EXPECT_EQ(lora, 85329920u);
  const Estimate el = estimate(Profile::native, l3, t);
  EXPECT_EQ(el.figures.optimizer_states, lora);
  EXPECT_EQ(el.figures.gradients, 2u * 41943040);  // the adapters' bf16 gradients
  // hf-peft keeps the same states for peft's fp32 adapters, with the two maps and no tables.
  HfOptions hf;
  hf.peft.finetune = Finetune::lora;
  hf.peft.rank = 16;
  hf.peft.targets = 0x7f;
  TrainConfig th = t;
  th.lora_rank = 0;
  th.lora_targets = 0;
  EXPECT_EQ(estimate(Profile::hf_peft, l3, th, hf).figures.optimizer_states, lora - 2 * 65536);
}

// QLoRA of Llama-3-8B, r 16 on all seven, nf4 with double quantization, blocksize 64
// (docs/formulas.md, "QLoRA in the native step"): each projection of n elements stores n/2
// packed bytes, n/64 uint8 absmax, an fp32 nested absmax per 256 of those, the fp32 offset, the
// 16-entry code and the 256-entry nested code (4 + 64 + 1,024 B).
TEST(NativeByHand, QloraStorageOfLlama3_8b) {
  const u64 hh = 8388608 + 262144 + 1024 * 4 + 1092;   // q, o: 4,096 x 4,096
  const u64 hk = 2097152 + 65536 + 256 * 4 + 1092;     // k, v: 1,024 x 4,096
  const u64 hi = 29360128 + 917504 + 3584 * 4 + 1092;  // gate, up, down: 14,336 x 4,096
  EXPECT_EQ(hh, 8655940u);
  const u64 layer = 2 * hh + 2 * hk + 3 * hi + 2 * 4096 * 2;  // + two bf16 norms
  const u64 rest = 2 * u64(128256) * 4096 * 2 + 4096 * 2;     // embedding, lm_head, final norm
  const u64 adapters = 41943040u * 2;                         // bf16 adapters
  const u64 params = 32 * layer + rest + adapters;
  EXPECT_EQ(params, 5786426240u);
  TrainConfig t;
  t.batch = 1;
  t.seq = 2048;
  t.dtype = DType::bf16;
  t.lora_rank = 16;
  t.lora_targets = 0x7f;
  t.quant = Quant::nf4;
  const ModelConfig l3 = make_model("llama3-8b", 128256, 4096, 14336, 32, 32, 8);
  const Estimate e = estimate(Profile::native, l3, t);
  EXPECT_EQ(e.figures.params, params);
  EXPECT_EQ(e.trainable_params, 41943040u);
  EXPECT_EQ(e.figures.gradients, 2u * 41943040);
  // hf-peft stores the same bytes for the same recipe: bf16 adapters (--lora-dtype model) and no
  // fp32 upcast of the other weights (--kbit-prepare off), and beside them the model's RoPE
  // buffers inv_freq and original_inv_freq (d/2 = 64 fp32 each), which trainmem computes inline.
  HfOptions hf;
  hf.peft.finetune = Finetune::qlora;
  hf.peft.rank = 16;
  hf.peft.targets = 0x7f;
  hf.peft.quant = Quant::nf4;
  hf.peft.adapters_fp32 = false;
  hf.peft.kbit_prepare = false;
  TrainConfig th = t;
  th.lora_rank = 0;
  th.lora_targets = 0;
  th.quant = Quant::none;
  EXPECT_EQ(estimate(Profile::hf_peft, l3, th, hf).figures.params, params + 2 * 64 * 4);
  // Without double quantization: an fp32 absmax per block and the code, nothing nested.
  t.double_quant = false;
  const u64 hh1 = 8388608 + 262144 * 4 + 64, hk1 = 2097152 + 65536 * 4 + 64,
            hi1 = 29360128 + 917504 * 4 + 64;
  EXPECT_EQ(estimate(Profile::native, l3, t).figures.params,
            32 * (2 * hh1 + 2 * hk1 + 3 * hi1 + 2 * 4096 * 2) + rest + adapters);
}

// LLaMA-7B, b 8, s 512, fp16, eager, no checkpointing (docs/formulas.md, worked example).
TEST(NativeByHand, Llama7bFp16EagerNone) {
  const ModelConfig m = make_model("llama-7b", 32000, 4096, 11008, 32, 32, 32);
  TrainConfig t;
  t.batch = 8;
  t.seq = 512;
  t.dtype = DType::f16;
  const u64 b = 8, s = 512, h = 4096, i = 11008, a = 32, V = 32000, L = 32;
  const u64 P = V * h + L * (2 * h + 4 * h * h + 3 * h * i) + h + V * h;
  EXPECT_EQ(P, 6738415616u);  // the published LLaMA-7B count
  // per layer: 8 (b,s,h) + 3 (b,s,i) 16-bit tensors, probs, two fp32 rstd
  const u64 per_layer = 2 * (8 * b * s * h + 3 * b * s * i + a * s * s * b) + 2 * 4 * b * s;
  EXPECT_EQ(per_layer, 673218560u);
  const u64 head = 2 * b * s * h + 4 * b * s + 2 * b * s * V + 4 * b * s;
  const u64 acts = 2 * b * s * h + L * per_layer + head;
  const Estimate e = estimate(Profile::native, m, t);
  EXPECT_EQ(e.param_count, P);
  EXPECT_EQ(e.figures.params, 2 * P);
  EXPECT_EQ(e.figures.gradients, 2 * P);
  EXPECT_EQ(e.figures.optimizer_states, 12 * P);
  EXPECT_EQ(e.activations.per_layer_bytes, per_layer);
  EXPECT_EQ(e.figures.activations, acts);
  EXPECT_EQ(e.figures.activations_peak, acts);
  // Coefficients: 16 sbh (8 tensors × 2 bytes), 6 sbi, 2 as²b, 8 sb.
  EXPECT_DOUBLE_EQ(e.activations.per_layer.sbh, 16.0);
  EXPECT_DOUBLE_EQ(e.activations.per_layer.sbi, 6.0);
  EXPECT_DOUBLE_EQ(e.activations.per_layer.as2b, 2.0);
  EXPECT_DOUBLE_EQ(e.activations.per_layer.sb, 8.0);
  // Workspace: cuBLAS + the SwiGLU backward step (d_residual, d_act, d_gate, d_up: one (b,s,h)
  // and three (b,s,i), 16-bit) = 304.1 MB, just above the attention backward step (d_residual,
  // d_attn_out, d_q, d_k, d_v, d_probs: 5 (b,s,h) + a·s²·b = 302.0 MB).
  const u64 ws_swiglu = 2 * (b * s * h + 3 * b * s * i);
  const u64 ws_attention = 2 * (5 * b * s * h + a * s * s * b);
  EXPECT_GT(ws_swiglu, ws_attention);
  EXPECT_EQ(e.figures.workspace, 33554432 + ws_swiglu);
  // Peak: head backward step 2 (logits still alive, d_final_norm_out allocated, ce_lse freed).
  const u64 inputs = 2 * 4 * b * s;
  const u64 peak = 2 * P + 2 * P + 12 * P + inputs + 33554432 + (acts - 4 * b * s) + 2 * b * s * h;
  EXPECT_EQ(e.figures.peak, peak);
  EXPECT_NE(e.instants.at(e.peak_instant).name.find("head step 2"), std::string::npos);
  EXPECT_EQ(e.figures.sum, 2 * P + 2 * P + 12 * P + acts);
}

// Flash attention + full checkpointing + LOMO on an awkward model, bf16.
TEST(NativeByHand, AwkwardFlashFullLomo) {
  const ModelConfig m = make_model("awkward", 97, 40, 71, 3, 5, 5);
  TrainConfig t;
  t.batch = 3;
  t.seq = 7;
  t.dtype = DType::bf16;
  t.optimizer = Optimizer::lomo;
  t.checkpointing = Checkpointing::full;
  t.attention = Attention::flash;
  const u64 b = 3, s = 7, h = 40, i = 71, a = 5, V = 97, L = 3;
  const Estimate e = estimate(Profile::native, m, t);
  // Kept: embed_out + one `out` per layer + head (final_norm_out, final_rstd, logits, ce_lse).
  const u64 head = 2 * b * s * h + 4 * b * s + 2 * b * s * V + 4 * b * s;
  EXPECT_EQ(e.figures.activations, 2 * b * s * h + L * 2 * b * s * h + head);
  // One layer without `out`: 7 (b,s,h) + 3 (b,s,i) 16-bit, lse (b,a,s) fp32, two rstd.
  const u64 R = 2 * (7 * b * s * h + 3 * b * s * i) + 4 * a * b * s + 2 * 4 * b * s;
  EXPECT_EQ(e.activations.recompute_bytes, R);
  // activations_peak: forward of the last layer (L+1 (b,s,h) tensors + R) vs end of forward.
  EXPECT_EQ(e.figures.activations_peak,
            std::max((L + 1) * 2 * b * s * h + R, (L + 1) * 2 * b * s * h + head));
  // LOMO gradient: the largest single gradient, here lm_head / embed_tokens (V·h = 3880
  // elements) vs gate/up/down (i·h = 2840): V·h.
  EXPECT_EQ(e.figures.gradients, 2 * V * h);
  EXPECT_EQ(e.figures.optimizer_states, 0u);
  EXPECT_DOUBLE_EQ(e.activations.per_layer.sb, 0.0);  // checkpointing keeps only `out`
  EXPECT_DOUBLE_EQ(e.activations.per_layer.sbh, 2.0);
}

TEST(NativeByHand, FlashLseFoldsIntoSb) {
  const ModelConfig m = make_model("tiny", 256, 64, 176, 2, 4, 4);
  TrainConfig t;
  t.batch = 2;
  t.seq = 16;
  t.attention = Attention::flash;
  const Estimate e = estimate(Profile::native, m, t);
  EXPECT_DOUBLE_EQ(e.activations.per_layer.sb, 4.0 * 4 + 8.0);  // 4a (lse) + 2 rstd
  EXPECT_DOUBLE_EQ(e.activations.per_layer.as2b, 0.0);
}

TEST(NativeByHand, TiedLomoKeepsTheEmbeddingGradient) {
  const ModelConfig m = make_model("tied", 1000, 64, 176, 2, 4, 4, true);
  TrainConfig t;
  t.optimizer = Optimizer::lomo;
  t.batch = 1;
  t.seq = 4;
  const Estimate e = estimate(Profile::native, m, t);
  // embed (V·h) alive from the head to the embedding, plus the largest other: gate (i·h).
  EXPECT_EQ(e.figures.gradients, 2u * (1000 * 64 + 176 * 64));
}

TEST(NativeByHand, Fp32HasNoMasterCopy) {
  const ModelConfig m = make_model("tiny", 256, 64, 176, 2, 4, 4);
  TrainConfig t;
  t.dtype = DType::f32;
  const u64 P = 256 * 64 * 2 + 2 * (2 * 64 + 4 * 64 * 64 + 3 * 64 * 176) + 64;
  t.optimizer = Optimizer::adamw;
  EXPECT_EQ(estimate(Profile::native, m, t).figures.optimizer_states, 8 * P);
  t.optimizer = Optimizer::sgd;
  EXPECT_EQ(estimate(Profile::native, m, t).figures.optimizer_states, 0u);
  t.dtype = DType::bf16;
  EXPECT_EQ(estimate(Profile::native, m, t).figures.optimizer_states, 4 * P);
  t.optimizer = Optimizer::adamw;
  EXPECT_EQ(estimate(Profile::native, m, t).figures.optimizer_states, 12 * P);
}

TEST(NativeByHand, PerTensorListSumsToTheCoefficients) {
  const ModelConfig m = make_model("gqa", 256, 96, 200, 2, 6, 2);
  TrainConfig t;
  t.batch = 3;
  t.seq = 11;
  const Estimate e = estimate(Profile::native, m, t);
  const double sbh = 3.0 * 11 * 96, sbi = 3.0 * 11 * 200, as2b = 6.0 * 11 * 11 * 3, sb = 33;
  const auto& c = e.activations.per_layer;
  EXPECT_DOUBLE_EQ(c.sbh * sbh + c.sbi * sbi + c.as2b * as2b + c.sb * sb + c.other_bytes,
                   static_cast<double>(e.activations.per_layer_bytes));
  // k and v are sized by the 2 kv heads: 6 (b,s,h) tensors + 2 × (2/6) of one.
  EXPECT_DOUBLE_EQ(c.sbh, 2 * (6 + 2.0 * 2 / 6));
}

}  // namespace
}  // namespace trainmem
