// The HF profiles (hf-eager, hf-sdpa) against what PyTorch autograd actually saved for the
// real LlamaForCausalLM of each transformers era, under PyTorch 1.13 and 2.15
// (tests/data/hf_golden/*.json, written by tools/hf_saved_tensors.py with saved_tensors_hooks;
// the test needs no PyTorch), and against hand-computed coefficients.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "family_configs.hpp"
#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

using u64 = std::uint64_t;
using nlohmann::json;

// The eras' golden files: tests/data/hf_golden/<era>[-sdpa].json (tools/hf_saved_tensors.py).
struct GoldenFile {
  const char* file;
  HfEra era;
  Profile profile;
};
const GoldenFile kGolden[] = {{"4.28.json", HfEra::v4_28, Profile::hf_eager},
                              {"4.30.json", HfEra::v4_30, Profile::hf_eager},
                              {"4.31.json", HfEra::v4_31, Profile::hf_eager},
                              {"4.35.json", HfEra::v4_35, Profile::hf_eager},
                              {"5.25.json", HfEra::v5_25, Profile::hf_eager},
                              {"5.25-sdpa.json", HfEra::v5_25, Profile::hf_sdpa}};

json load_golden(const std::string& file) {
  const std::string path = std::string(TRAINMEM_TEST_DATA_DIR) + "/hf_golden/" + file;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

// (bytes, dtype) pairs, sorted: what a group holds, independent of names.
using Sig = std::vector<std::pair<u64, std::string>>;
Sig sig_of(const json& list) {
  Sig s;
  for (const auto& e : list) s.push_back({e.at("bytes").get<u64>(), e.at("dtype")});
  std::sort(s.begin(), s.end());
  return s;
}
Sig sig_of(const std::vector<TensorEntry>& list) {
  Sig s;
  for (const auto& e : list) s.push_back({e.bytes, e.dtype});
  std::sort(s.begin(), s.end());
  return s;
}
std::string show(const Sig& s) {
  std::string o;
  for (const auto& [b, d] : s) o += std::to_string(b) + ":" + d + " ";
  return o;
}

ModelConfig golden_model(const json& c) {
  ModelConfig m;
  m.name = c.at("name");
  m.hidden = c.at("hidden");
  m.intermediate = c.at("intermediate");
  m.heads = c.at("heads");
  m.kv_heads = c.at("kv_heads");
  m.vocab = c.at("vocab");
  m.layers = c.at("layers");
  m.max_positions = 2048;
  return m;
}

TrainConfig golden_train(const json& c) {
  TrainConfig t;
  t.batch = c.at("batch");
  t.seq = c.at("seq");
  const std::string dt = c.at("run_dtype");
  t.dtype = dt == "fp32" ? DType::f32 : dt == "fp16" ? DType::f16 : DType::bf16;
  t.checkpointing = c.at("checkpointing") == "full" ? Checkpointing::full : Checkpointing::none;
  return t;
}

TEST(HfGolden, EveryEraWasRunWithTheRealCodeUnderBothPyTorchSeries) {
  for (const auto& gf : kGolden) {
    SCOPED_TRACE(gf.file);
    const json g = load_golden(gf.file);
    EXPECT_EQ(g.at("era").get<std::string>(), hf_era_name(gf.era));
    bool old_torch = false, new_torch = false, fp32 = false, ckpt = false, b1 = false, a1 = false,
         real = false;
    for (const auto& run : g.at("runs")) {
      old_torch |= run.at("torch_series") == "<2.2";
      new_torch |= run.at("torch_series") == ">=2.2";
      for (const auto& c : run.at("configs")) {
        fp32 |= c.at("run_dtype") == "fp32";
        ckpt |= c.at("checkpointing") == "full";
        b1 |= c.at("batch").get<int>() == 1;
        a1 |= c.at("heads").get<int>() == 1;
        for (const auto& impl : c.at("implementations"))
          real |= impl.get<std::string>().rfind("transformers ", 0) == 0;
      }
    }
    EXPECT_TRUE(new_torch);
    // transformers 5.25 needs PyTorch >= 2.6: no < 2.2 run exists for it.
    EXPECT_EQ(old_torch, gf.era != HfEra::v5_25);
    // 5.25's checkpointing (use_reentrant=False) hides its tensors from the hooks.
    EXPECT_EQ(ckpt, gf.era != HfEra::v5_25);
    EXPECT_TRUE(fp32 && b1 && a1 && real);
  }
}

// One era, one PyTorch series, one configuration: the golden groups against the estimate.
void check_config(const GoldenFile& gf, TorchEra torch, const json& c) {
  const ModelConfig m = golden_model(c);
  const TrainConfig t = golden_train(c);
  HfOptions o;
  o.era = gf.era;
  o.torch = torch;
  const Estimate e = estimate(gf.profile, m, t, o);
  const auto& a = e.activations;
  const auto& gb = c.at("group_bytes");
  for (const auto& pl : c.at("per_layer_bytes")) EXPECT_EQ(pl.get<u64>(), a.per_layer_bytes);
  EXPECT_EQ(gb.at("layer").get<u64>(), a.per_layer_bytes);
  EXPECT_EQ(gb.at("head").get<u64>(), a.head_bytes);
  EXPECT_EQ(gb.at("shared").get<u64>(), a.shared_bytes);
  EXPECT_EQ(gb.at("embedding").get<u64>(), a.embedding_bytes);
  EXPECT_EQ(gb.at("recompute").get<u64>(), a.recompute_bytes);
  const auto& groups = c.at("groups");
  for (const char* g : {"layer", "head", "shared", "recompute"}) {
    const std::vector<TensorEntry>& ours = std::string(g) == "layer"    ? a.layer
                                           : std::string(g) == "head"   ? a.head
                                           : std::string(g) == "shared" ? a.shared
                                                                        : a.recompute;
    EXPECT_EQ(sig_of(groups.at(g)), sig_of(ours))
        << g << "\ngolden " << show(sig_of(groups.at(g))) << "\nours   " << show(sig_of(ours));
  }
  // Inputs: autograd saves input_ids (the embedding's indices), and the caller's labels when
  // the loss's shifted labels are a view of them (b = 1).
  std::vector<TensorEntry> ids;
  for (const auto& x : a.inputs)
    if (x.name == "input_ids" || (x.name == "labels" && x.kept_by.rfind("nll_loss", 0) == 0))
      ids.push_back(x);
  EXPECT_EQ(sig_of(groups.at("inputs")), sig_of(ids));
  // Host-side wrapped Python numbers are the only thing we leave out: 0-dim fp64.
  for (const auto& x : groups.at("host_scalars")) {
    EXPECT_EQ(x.at("dtype"), "fp64");
    EXPECT_TRUE(x.at("shape").empty());
  }
  // The loop: what the caller holds (the returned logits), counted in activations.
  const auto& loops = c.at("loops");
  EXPECT_EQ(sig_of(loops.at("hf-model-loss").at("held")), sig_of(a.loop));
  const u64 total = gb.at("embedding").get<u64>() + m.layers * gb.at("layer").get<u64>() +
                    gb.at("shared").get<u64>() + gb.at("head").get<u64>() +
                    loops.at("hf-model-loss").at("held_bytes").get<u64>();
  EXPECT_EQ(e.figures.activations, total);
  // Every loop: the head (with the loss's saved tensors, the model's or the caller's) and what
  // the caller holds.
  for (Loop l : {Loop::hf_model_loss, Loop::shift_ce, Loop::none}) {
    SCOPED_TRACE(loop_name(l));
    HfOptions ol = o;
    ol.loop = l;
    const Estimate el = estimate(gf.profile, m, t, ol);
    const auto& gl = loops.at(loop_name(l));
    EXPECT_EQ(sig_of(gl.at("head")), sig_of(el.activations.head))
        << "golden " << show(sig_of(gl.at("head"))) << "\nours   "
        << show(sig_of(el.activations.head));
    EXPECT_EQ(sig_of(gl.at("held")), sig_of(el.activations.loop));
    EXPECT_EQ(el.activations.per_layer_bytes, a.per_layer_bytes);
  }
  // use_cache=True: the past key/values beyond the saved tensors.
  if (c.contains("use_cache_held")) {
    const u64 want = c.at("use_cache_held").get<u64>();
    EXPECT_EQ(e.use_cache_bytes, want);
    HfOptions oc = o;
    oc.use_cache = true;
    EXPECT_EQ(estimate(gf.profile, m, t, oc).figures.activations, e.figures.activations + want);
  }
}

TEST(HfGolden, EveryEraEveryGroupMatchesTheSavedTensors) {
  int checked = 0;
  for (const auto& gf : kGolden) {
    const json g = load_golden(gf.file);
    for (const auto& run : g.at("runs")) {
      const TorchEra torch =
          run.at("torch_series") == "<2.2" ? TorchEra::before_2_2 : TorchEra::from_2_2;
      for (const auto& c : run.at("configs")) {
        SCOPED_TRACE(std::string(gf.file) + " torch " + run.at("torch").get<std::string>() + " " +
                     c.at("name").get<std::string>());
        check_config(gf, torch, c);
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 4 * 2 * 7 + 2 * 6);
}

// ---------------------------------------------------------------- the families (issue 16)
// tests/data/hf_golden/<family>-5.25[-sdpa].json: the real MistralForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM and LlamaForCausalLM (head_dim, rope_scaling llama3) of
// transformers 5.25.0 under PyTorch 2.15 (tools/hf_saved_tensors.py --family).
struct FamilyFile {
  const char* file;
  const char* family;
  Profile profile;
};
const FamilyFile kFamilies[] = {{"mistral-5.25.json", "mistral", Profile::hf_eager},
                                {"mistral-5.25-sdpa.json", "mistral", Profile::hf_sdpa},
                                {"qwen2-5.25.json", "qwen2", Profile::hf_eager},
                                {"qwen2-5.25-sdpa.json", "qwen2", Profile::hf_sdpa},
                                {"qwen3-5.25.json", "qwen3", Profile::hf_eager},
                                {"qwen3-5.25-sdpa.json", "qwen3", Profile::hf_sdpa},
                                {"llama-5.25.json", "llama", Profile::hf_eager},
                                {"llama-5.25-sdpa.json", "llama", Profile::hf_sdpa}};

// The ModelConfig of a family configuration, built field by field (as config.json would give).
ModelConfig family_model(const json& c) {
  ModelConfig m = golden_model(c);
  m.family = c.at("family");
  m.tied_embeddings = c.value("tied", false);
  if (c.contains("head_dim")) m.explicit_head_dim = c.at("head_dim");
  m.qkv_bias = m.family == "qwen2";  // Qwen2's q/k/v projections always have biases
  m.qk_norm = m.family == "qwen3";   // Qwen3 always normalises q and k per head
  if (c.contains("sliding_window") && !c.at("sliding_window").is_null()) {
    m.sliding_window = c.at("sliding_window");
    m.window_from_layer = c.value("window_from_layer", 0);
  }
  if (c.contains("rope_scaling")) {
    const auto& r = c.at("rope_scaling");
    m.rope_scaling.kind = RopeScalingKind::llama3;
    m.rope_scaling.factor = r.at("factor");
    m.rope_scaling.low_freq_factor = r.at("low_freq_factor");
    m.rope_scaling.high_freq_factor = r.at("high_freq_factor");
    m.rope_scaling.original_max_positions = r.at("original_max_position_embeddings");
  }
  return m;
}

void check_family_config(const FamilyFile& ff, const json& c) {
  const ModelConfig m = family_model(c);
  const TrainConfig t = golden_train(c);
  HfOptions o;
  o.era = HfEra::v5_25;
  o.hf_version = "5.25.0";
  o.torch = TorchEra::from_2_2;
  const Estimate e = estimate(ff.profile, m, t, o);
  const auto& a = e.activations;
  const auto& gb = c.at("group_bytes");
  const auto& groups = c.at("groups");
  // Every layer: the windowed layers' list where the golden data has a layer_sliding group.
  const bool split = groups.contains("layer_sliding");
  EXPECT_EQ(split, !a.layer_windowed.empty());
  const auto& per_layer = c.at("per_layer_bytes");
  u64 layers_sum = 0, windowed = 0;
  for (std::size_t l = 0; l < per_layer.size(); ++l) {
    const bool win = split && m.window_of(static_cast<std::int64_t>(l)) > 0;
    windowed += win ? 1 : 0;
    EXPECT_EQ(per_layer[l].get<u64>(), win ? a.layer_windowed_bytes : a.per_layer_bytes)
        << "layer " << l;
    layers_sum += per_layer[l].get<u64>();
  }
  if (split) {
    EXPECT_EQ(static_cast<u64>(a.windowed_layers), windowed);
    EXPECT_EQ(sig_of(groups.at("layer_sliding")), sig_of(a.layer_windowed))
        << "golden " << show(sig_of(groups.at("layer_sliding"))) << "\nours   "
        << show(sig_of(a.layer_windowed));
  }
  EXPECT_EQ(sig_of(groups.at("layer")), sig_of(a.layer))
      << "golden " << show(sig_of(groups.at("layer"))) << "\nours   " << show(sig_of(a.layer));
  for (const char* g : {"head", "shared", "recompute", "embedding"}) {
    const std::vector<TensorEntry>& ours = std::string(g) == "head"        ? a.head
                                           : std::string(g) == "shared"    ? a.shared
                                           : std::string(g) == "recompute" ? a.recompute
                                                                           : a.embedding;
    EXPECT_EQ(sig_of(groups.at(g)), sig_of(ours))
        << g << "\ngolden " << show(sig_of(groups.at(g))) << "\nours   " << show(sig_of(ours));
  }
  std::vector<TensorEntry> ids;
  for (const auto& x : a.inputs)
    if (x.name == "input_ids" || (x.name == "labels" && x.kept_by.rfind("nll_loss", 0) == 0))
      ids.push_back(x);
  EXPECT_EQ(sig_of(groups.at("inputs")), sig_of(ids));
  const auto& loops = c.at("loops");
  const u64 total = gb.at("embedding").get<u64>() + layers_sum + gb.at("shared").get<u64>() +
                    gb.at("head").get<u64>() +
                    loops.at("hf-model-loss").at("held_bytes").get<u64>();
  EXPECT_EQ(e.figures.activations, total);
  for (Loop l : {Loop::hf_model_loss, Loop::shift_ce, Loop::none}) {
    SCOPED_TRACE(loop_name(l));
    HfOptions ol = o;
    ol.loop = l;
    const Estimate el = estimate(ff.profile, m, t, ol);
    const auto& gl = loops.at(loop_name(l));
    EXPECT_EQ(sig_of(gl.at("head")), sig_of(el.activations.head));
    EXPECT_EQ(sig_of(gl.at("held")), sig_of(el.activations.loop));
  }
  ASSERT_TRUE(c.contains("use_cache_held"));
  const u64 want = c.at("use_cache_held").get<u64>();
  EXPECT_EQ(e.use_cache_bytes, want);
  HfOptions oc = o;
  oc.use_cache = true;
  EXPECT_EQ(estimate(ff.profile, m, t, oc).figures.activations, e.figures.activations + want);
}

TEST(HfFamilies, EveryFamilyAttentionAndConfigMatchesTheSavedTensors) {
  int checked = 0;
  bool window_above = false, window_at = false, window_below = false, from_layer = false,
       tied = false, head_dim = false, fp32 = false, b1 = false, gqa = false;
  for (const auto& ff : kFamilies) {
    const json g = load_golden(ff.file);
    EXPECT_EQ(g.at("family").get<std::string>(), ff.family);
    EXPECT_EQ(g.at("era").get<std::string>(), "5.25");
    EXPECT_EQ(g.at("attention").get<std::string>(),
              ff.profile == Profile::hf_sdpa ? "sdpa" : "eager");
    for (const auto& run : g.at("runs")) {
      EXPECT_EQ(run.at("torch_series").get<std::string>(), ">=2.2");
      for (const auto& c : run.at("configs")) {
        SCOPED_TRACE(std::string(ff.file) + " " + c.at("name").get<std::string>());
        EXPECT_EQ(c.at("family").get<std::string>(), ff.family);
        EXPECT_EQ(c.at("implementations").at(0).get<std::string>().rfind("transformers 5.25", 0),
                  0u);
        check_family_config(ff, c);
        const ModelConfig m = family_model(c);
        const auto s = c.at("seq").get<std::int64_t>();
        if (m.sliding_window > 0) {
          window_above |= s > m.sliding_window;
          window_at |= s == m.sliding_window;
          window_below |= s < m.sliding_window;
          from_layer |= m.window_from_layer > 0;
        }
        tied |= m.tied_embeddings;
        head_dim |= m.head_dim() * m.heads != m.hidden;
        fp32 |= c.at("run_dtype") == "fp32";
        b1 |= c.at("batch").get<int>() == 1;
        gqa |= m.kv_heads < m.heads;
        ++checked;
      }
    }
  }
  EXPECT_TRUE(window_above && window_at && window_below && from_layer && tied && head_dim && fp32 &&
              b1 && gqa);
  EXPECT_EQ(checked, 2 * (8 + 5 + 5 + 2));
}

// Hand-computed per-layer coefficients of the families (docs/formulas.md, "Model families"),
// 16-bit, 5.25 era, s 512 b 8: Qwen3-8B's shape (h 4096, a 32, k 8, d 128, i 12288) with and
// without q/k norms, and the SDPA window mask.
TEST(HfFamilies, Qwen3NormsAndWindowCoefficientsByHand) {
  ModelConfig m;
  m.name = "qwen3-8b-like";
  m.family = "qwen3";
  m.vocab = 151936;
  m.hidden = 4096;
  m.intermediate = 12288;
  m.layers = 36;
  m.heads = 32;
  m.kv_heads = 8;
  m.explicit_head_dim = 128;
  m.qk_norm = true;
  m.max_positions = 40960;
  TrainConfig t;
  t.batch = 8;
  t.seq = 512;
  t.dtype = DType::bf16;
  const auto c = estimate(Profile::hf_eager, m, t).activations.per_layer;
  // LLaMA 5.25 eager: 24 sbh (norms 4+2+2 each, q, k, v copies and the attention output 2
  // each) + q_norm (4 + 2)·a·d/h + k_norm (4 + 2)·k·d/h = 24 + 6 + 1.5.
  EXPECT_DOUBLE_EQ(c.sbh, 24.0 + 6.0 + 1.5);
  EXPECT_DOUBLE_EQ(c.sbi, 8.0);
  EXPECT_DOUBLE_EQ(c.as2b, 6.0);
  EXPECT_DOUBLE_EQ(c.sb, 8.0 + 4.0 * 32 + 4.0 * 8);  // two norms' rsqrt + per-head rsqrt
  // SDPA with a window W <= s in every layer: q, k, v at a heads (repeat_kv), output 2 each,
  // logsumexp 4a, and the (b,1,s,s) mask in bf16 (other, per layer).
  m.sliding_window = 256;
  const auto e = estimate(Profile::hf_sdpa, m, t);
  EXPECT_DOUBLE_EQ(e.activations.per_layer.sbh, 16.0 + 8.0 + 6.0 + 1.5);
  EXPECT_DOUBLE_EQ(e.activations.per_layer.sb, 8.0 + 4.0 * 32 + 4.0 * 32 + 4.0 * 8);
  EXPECT_EQ(e.activations.per_layer.other_bytes, 2u * 8 * 512 * 512);
  // s below the window: HF's pure causal path, k and v at the kv heads, no mask.
  m.sliding_window = 1024;
  const auto below = estimate(Profile::hf_sdpa, m, t).activations.per_layer;
  EXPECT_DOUBLE_EQ(below.sbh, 16.0 + 2.0 * 2 * 8 / 32 + 4.0 + 6.0 + 1.5);
  EXPECT_EQ(below.other_bytes, 0u);
}

TEST(HfFamilies, UnprovenFamilyAndEraCombinationsAreRefusedNamingTheFlag) {
  ModelConfig m = test::family_config("tiny-qwen3");
  TrainConfig t;
  t.batch = 1;
  t.seq = 16;
  t.dtype = DType::bf16;
  // No --hf-version: the one measured era, 5.25.
  EXPECT_EQ(*estimate(Profile::hf_eager, m, t).hf.era, HfEra::v5_25);
  for (const char* v : {"4.28", "4.30", "4.31", "4.35"}) {
    SCOPED_TRACE(v);
    HfOptions o;
    o.era = parse_hf_version(v);
    o.hf_version = v;
    try {
      (void)estimate(Profile::hf_eager, m, t, o);
      ADD_FAILURE() << "accepted";
    } catch (const InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("--hf-version ") + v), std::string::npos) << msg;
      EXPECT_NE(msg.find("Qwen3ForCausalLM"), std::string::npos) << msg;
    }
  }
  // Mistral in 4.31-4.34 (4.34 introduced it, but it was not measured): refused too.
  ModelConfig mi = m;
  mi.family = "mistral";
  mi.qk_norm = false;
  mi.explicit_head_dim = 0;
  mi.sliding_window = 4;
  HfOptions o431;
  o431.era = parse_hf_version("4.34.1");
  o431.hf_version = "4.34.1";
  EXPECT_THROW((void)estimate(Profile::hf_eager, mi, t, o431), InputError);
  EXPECT_NO_THROW((void)estimate(Profile::hf_eager, mi, t));
  // Combinations no class has: a Qwen3 with q/k/v biases, a Qwen2 without, a LLaMA window.
  ModelConfig qb = m;
  qb.qkv_bias = true;
  EXPECT_THROW((void)estimate(Profile::hf_sdpa, qb, t), InputError);
  ModelConfig q2 = mi;
  q2.family = "qwen2";
  q2.sliding_window = 0;
  EXPECT_THROW((void)estimate(Profile::hf_eager, q2, t), InputError);
  q2.qkv_bias = true;
  EXPECT_NO_THROW((void)estimate(Profile::hf_eager, q2, t));
  ModelConfig lw = mi;
  lw.family = "llama";
  EXPECT_THROW((void)estimate(Profile::hf_eager, lw, t), InputError);
  // LLaMA 3.x (rope_scaling, head_dim): 5.25 only; without either, every era as before.
  ModelConfig l3 = lw;
  l3.sliding_window = 0;
  l3.rope_scaling.kind = RopeScalingKind::llama3;
  EXPECT_EQ(*estimate(Profile::hf_eager, l3, t).hf.era, HfEra::v5_25);
  HfOptions o430;
  o430.era = HfEra::v4_30;
  o430.hf_version = "4.30";
  EXPECT_THROW((void)estimate(Profile::hf_eager, l3, t, o430), InputError);
  l3.rope_scaling.kind = RopeScalingKind::none;
  EXPECT_EQ(*estimate(Profile::hf_eager, l3, t).hf.era, HfEra::v4_30);
  EXPECT_NO_THROW((void)estimate(Profile::hf_eager, l3, t, o430));
}

// Per-layer coefficients for 16-bit training (docs/formulas.md, hf-eager):
//   sbh: x 2, x_f32 4, x² 4, x·rsqrt 4, norm out 2 (input_layernorm) + q 2, k 2, v 2, attention
//        output 2 + h_mid 2, 4, 4, 4, norm out 2 (post_attention_layernorm) = 40
//   sbi: gate, silu, up, product, 2 bytes each = 8
//   as²b: masked scores 2 + fp32 softmax 4 + 16-bit probs 2 = 8
//   sb: two fp32 rsqrt = 8;   other: cos, sin (s·d each, 16-bit) and the 4-byte finfo.min.
TEST(HfEagerByHand, Llama7bFp16Coefficients) {
  ModelConfig m;
  m.name = "llama-7b";
  m.vocab = 32000;
  m.hidden = 4096;
  m.intermediate = 11008;
  m.layers = 32;
  m.heads = 32;
  m.kv_heads = 32;
  m.max_positions = 2048;
  TrainConfig t;
  t.batch = 8;
  t.seq = 512;
  t.dtype = DType::f16;
  const Estimate e = estimate(Profile::hf_eager, m, t);
  const auto& c = e.activations.per_layer;
  EXPECT_DOUBLE_EQ(c.sbh, 40.0);
  EXPECT_DOUBLE_EQ(c.sbi, 8.0);
  EXPECT_DOUBLE_EQ(c.as2b, 8.0);
  EXPECT_DOUBLE_EQ(c.sb, 8.0);
  const u64 b = 8, s = 512, h = 4096, i = 11008, a = 32, V = 32000, d = 128;
  EXPECT_EQ(c.other_bytes, 2 * 2 * s * d + 4);
  const u64 per_layer =
      40 * s * b * h + 8 * s * b * i + 8 * a * s * s * b + 8 * s * b + 2 * 2 * s * d + 4;
  EXPECT_EQ(e.activations.per_layer_bytes, per_layer);
  // Head: x_L 2, x_f32 4, x² 4, x·rsqrt 4, norm out 2 (sbh) + rsqrt 4 (sb) + log-softmax over
  // b(s-1) rows (16-bit) + int64 shifted labels + 2-byte total_weight.
  const u64 head = 16 * s * b * h + 4 * s * b + 2 * b * (s - 1) * V + 8 * b * (s - 1) + 2;
  EXPECT_EQ(e.activations.head_bytes, head);
  // The loop (hf-model-loss): the caller holds the returned 16-bit logits (b,s,V).
  const u64 logits = 2 * b * s * V;
  EXPECT_EQ(e.activations.loop_bytes, logits);
  EXPECT_EQ(e.figures.activations, 32 * per_layer + head + logits);
  // 47.25 GiB saved + 0.24 GiB of logits: the paper's 45.61 GiB is in docs/faq.md.
  // The byte count is exact; 47.25 is docs/faq.md's figure to 2 decimals (±0.005 rounding),
  // and 0.01 is one unit of that last digit.
  EXPECT_NEAR(static_cast<double>(e.figures.activations - logits) / (1u << 30), 47.25, 0.01);
  EXPECT_EQ(e.figures.inputs, 16 * b * s);  // int64 input_ids and labels
}

TEST(HfEagerByHand, Fp32UpcastsAreNoOps) {
  ModelConfig m;
  m.name = "t";
  m.vocab = 100;
  m.hidden = 64;
  m.intermediate = 160;
  m.layers = 2;
  m.heads = 4;
  m.kv_heads = 4;
  m.max_positions = 2048;
  TrainConfig t;
  t.batch = 2;
  t.seq = 8;
  t.dtype = DType::f32;
  const auto c = estimate(Profile::hf_eager, m, t).activations.per_layer;
  // In fp32, x.to(float32) is x and softmax(dtype=float32).to(float32) is one tensor:
  // 12 (b,s,h) tensors × 4, 4 (b,s,i) × 4, masked scores + probs × 4.
  EXPECT_DOUBLE_EQ(c.sbh, 48.0);
  EXPECT_DOUBLE_EQ(c.sbi, 16.0);
  EXPECT_DOUBLE_EQ(c.as2b, 8.0);
}

TEST(HfEagerByHand, CheckpointingKeepsInputsMaskAndHead) {
  ModelConfig m;
  m.name = "t";
  m.vocab = 100;
  m.hidden = 64;
  m.intermediate = 160;
  m.layers = 5;
  m.heads = 4;
  m.kv_heads = 4;
  m.max_positions = 2048;
  TrainConfig t;
  t.batch = 2;
  t.seq = 8;
  t.dtype = DType::bf16;
  t.checkpointing = Checkpointing::full;
  const Estimate e = estimate(Profile::hf_eager, m, t);
  const u64 b = 2, s = 8, h = 64, V = 100;
  const u64 head = 16 * s * b * h + 4 * s * b + 2 * b * (s - 1) * V + 8 * b * (s - 1) + 2;
  // Layer inputs, mask, position ids, the head, and the logits the loop holds.
  const u64 kept = 5 * 2 * b * s * h + 2 * b * s * s + 8 * s + head + 2 * b * s * V;
  EXPECT_EQ(e.figures.activations, kept);
  // During layer L-1's backward: the head is released and the replayed layer saves again.
  t.checkpointing = Checkpointing::none;
  const u64 layer = estimate(Profile::hf_eager, m, t).activations.per_layer_bytes;
  EXPECT_EQ(e.figures.activations_peak, std::max(kept, kept - head + (layer - 2 * b * s * h)));
}

// Per-layer coefficients of every era, 16-bit, counted by hand from each era's
// modeling_llama.py (docs/formulas.md, "hf-eager: the eras"):
//   4.28: per norm x 2, x_f32 4, x^2 4 (<2.2), y cast to 16 bits 2, out 2; q, k, v copies,
//         attention output 2 each; masked scores 2 + fp32 softmax 4 + probs 2 (as^2b)
//   4.30: per norm x 2, x_f32 4, x^2 4, y fp32 4, out 2; the same attention
//   4.31: per norm x_f32 4, x^2 4, y 2, out 2 (the 16-bit x itself not kept); no masked scores
//   5.25 eager: as 4.31 (PyTorch >= 2.2 only); RoPE tables shared by the layers (no "other")
//   5.25 sdpa: norms as 4.31; q 2, k 2, v 2, output 2 (also o_proj's input); fp32 logsumexp
//         4a per s·b; no a·s^2·b term.
struct EraCase {
  HfEra era;
  TorchEra torch;
  Profile profile;
  double sbh, as2b, sb;
  std::uint64_t other;  // per layer, s = 512, d = 128
};

TEST(HfEagerByHand, EveryEraLlama7bFp16) {
  const std::uint64_t sd = 512 * 128;
  const EraCase cases[] = {
      {HfEra::v4_28, TorchEra::before_2_2, Profile::hf_eager, 36, 8, 8, 4 * sd + 4},
      {HfEra::v4_28, TorchEra::from_2_2, Profile::hf_eager, 28, 8, 8, 4 * sd + 4},
      {HfEra::v4_30, TorchEra::before_2_2, Profile::hf_eager, 40, 8, 8, 4 * sd + 4},
      {HfEra::v4_30, TorchEra::from_2_2, Profile::hf_eager, 32, 8, 8, 4 * sd + 4},
      {HfEra::v4_31, TorchEra::before_2_2, Profile::hf_eager, 32, 6, 8, 4 * sd},
      {HfEra::v4_31, TorchEra::from_2_2, Profile::hf_eager, 24, 6, 8, 4 * sd},
      {HfEra::v4_35, TorchEra::from_2_2, Profile::hf_eager, 24, 6, 8, 4 * sd},
      {HfEra::v5_25, TorchEra::from_2_2, Profile::hf_eager, 24, 6, 8, 0},
      {HfEra::v5_25, TorchEra::from_2_2, Profile::hf_sdpa, 24, 0, 8 + 4 * 32, 0},
  };
  ModelConfig m = *find_preset("llama-7b");
  TrainConfig t;
  t.batch = 8;
  t.seq = 512;
  t.dtype = DType::f16;
  for (const auto& k : cases) {
    SCOPED_TRACE(std::string(hf_era_name(k.era)) + " " + torch_era_name(k.torch) + " " +
                 profile_name(k.profile));
    HfOptions o;
    o.era = k.era;
    o.torch = k.torch;
    const auto c = estimate(k.profile, m, t, o).activations.per_layer;
    EXPECT_DOUBLE_EQ(c.sbh, k.sbh);
    EXPECT_DOUBLE_EQ(c.sbi, 8.0);
    EXPECT_DOUBLE_EQ(c.as2b, k.as2b);
    EXPECT_DOUBLE_EQ(c.sb, k.sb);
    EXPECT_EQ(c.other_bytes, k.other);
  }
}

// The LOMO paper's setup (docs/faq.md): transformers 4.28/4.29, PyTorch < 2.2, fp16, the
// caller's shift + CrossEntropyLoss on fp16 logits, no KV cache, b 8, s 512. Saved tensors plus
// the held logits, by hand: 32 layers of (36 sbh + 8 sbi + 8 as^2b + 8 sb + 4sd + 4), the head
// (final norm 2+4+4+2 sbh + 4 sb, lm_head input 2 sbh, log-softmax 2·b(s-1)V, int64 labels
// b(s-1), total_weight 2) and the logits 2·bsV.
TEST(HfEagerByHand, LomoPaperSetup) {
  const ModelConfig m = *find_preset("llama-7b");
  TrainConfig t;
  t.batch = 8;
  t.seq = 512;
  t.dtype = DType::f16;
  HfOptions o;
  o.era = parse_hf_version("4.29");
  o.torch = parse_torch_version("2.0");
  o.loop = Loop::shift_ce;
  const u64 b = 8, s = 512, h = 4096, i = 11008, a = 32, V = 32000, d = 128, L = 32;
  const u64 layer = 36 * s * b * h + 8 * s * b * i + 8 * a * s * s * b + 8 * s * b + 4 * s * d + 4;
  const u64 head = 14 * s * b * h + 4 * s * b + 2 * b * (s - 1) * V + 8 * b * (s - 1) + 2;
  const u64 logits = 2 * b * s * V;
  const Estimate none = estimate(Profile::hf_eager, m, t, o);
  EXPECT_EQ(none.figures.activations, L * layer + head + logits);
  t.checkpointing = Checkpointing::full;
  const Estimate full = estimate(Profile::hf_eager, m, t, o);
  // Reentrant checkpoints: 32 layer inputs, one (b,1,s,s) fp16 mask, (1,s) int64 position ids.
  EXPECT_EQ(full.figures.activations, L * 2 * s * b * h + 2 * b * s * s + 8 * s + head + logits);
}

TEST(HfVersions, ReleasesMapToTheirEraAndUnknownOnesNameTheEras) {
  EXPECT_EQ(parse_hf_version("4.28.0"), HfEra::v4_28);
  EXPECT_EQ(parse_hf_version("4.29.2"), HfEra::v4_28);
  EXPECT_EQ(parse_hf_version("4.30"), HfEra::v4_30);
  EXPECT_EQ(parse_hf_version("4.31.0"), HfEra::v4_31);
  EXPECT_EQ(parse_hf_version("4.34.1"), HfEra::v4_31);
  EXPECT_EQ(parse_hf_version("4.35.2"), HfEra::v4_35);
  EXPECT_EQ(parse_hf_version("5.25.0"), HfEra::v5_25);
  for (const char* bad : {"4.27.4", "4.36.0", "4.57.1", "5.0.0", "5.26", "4", "x.y", "", "4.30x"}) {
    SCOPED_TRACE(bad);
    try {
      (void)parse_hf_version(bad);
      ADD_FAILURE() << "accepted";
    } catch (const InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("--hf-version"), std::string::npos) << msg;
      EXPECT_NE(msg.find("4.31 (4.31.0-4.34.x)"), std::string::npos) << msg;
    }
  }
  EXPECT_EQ(parse_torch_version("1.13.1"), TorchEra::before_2_2);
  EXPECT_EQ(parse_torch_version("2.1"), TorchEra::before_2_2);
  EXPECT_EQ(parse_torch_version("2.2.0"), TorchEra::from_2_2);
  EXPECT_EQ(parse_torch_version("2.15.0+cpu"), TorchEra::from_2_2);
  for (const char* bad : {"1.12", "2.16", "3.0", "2"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW((void)parse_torch_version(bad), InputError);
  }
  // hf-sdpa is the 5.25 era; 5.25 needs PyTorch >= 2.6.
  HfOptions o;
  o.era = HfEra::v4_30;
  o.hf_version = "4.30";
  EXPECT_THROW(check_hf_options(Profile::hf_sdpa, o), InputError);
  EXPECT_NO_THROW(check_hf_options(Profile::hf_eager, o));
  HfOptions v5;
  v5.era = HfEra::v5_25;
  v5.hf_version = "5.25";
  v5.torch = parse_torch_version("2.4", &v5);
  v5.torch_version = "2.4";
  EXPECT_THROW(check_hf_options(Profile::hf_eager, v5), InputError);
}

}  // namespace
}  // namespace trainmem
