// The `hf-eager` profile against what PyTorch autograd actually saved for HuggingFace
// transformers 4.30's LlamaForCausalLM (tests/data/hf_eager_golden.json, written by
// tools/hf_saved_tensors.py with saved_tensors_hooks; the test needs no PyTorch), and against
// hand-computed coefficients.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "trainmem/analytic.hpp"

namespace trainmem {
namespace {

using u64 = std::uint64_t;
using nlohmann::json;

json load_golden() {
  const std::string path = std::string(TRAINMEM_TEST_DATA_DIR) + "/hf_eager_golden.json";
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

TEST(HfEagerGolden, FileCoversTheAwkwardConfigurations) {
  const json g = load_golden();
  ASSERT_GE(g.at("configs").size(), 9u);
  bool fp32 = false, ckpt = false, gqa = false, b1 = false, a1 = false, real = false;
  for (const auto& c : g.at("configs")) {
    fp32 |= c.at("run_dtype") == "fp32";
    ckpt |= c.at("checkpointing") == "full";
    gqa |= c.at("kv_heads").get<int>() < c.at("heads").get<int>();
    b1 |= c.at("batch").get<int>() == 1;
    a1 |= c.at("heads").get<int>() == 1;
    for (const auto& impl : c.at("implementations"))
      real |= impl.get<std::string>().rfind("transformers 4.30", 0) == 0;
  }
  EXPECT_TRUE(fp32 && ckpt && gqa && b1 && a1);
  EXPECT_TRUE(real) << "golden data was not checked against transformers 4.30 itself";
}

TEST(HfEagerGolden, EveryGroupMatchesTheSavedTensors) {
  const json g = load_golden();
  for (const auto& c : g.at("configs")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    ModelConfig m;
    m.name = c.at("name");
    m.hidden = c.at("hidden");
    m.intermediate = c.at("intermediate");
    m.heads = c.at("heads");
    m.kv_heads = c.at("kv_heads");
    m.vocab = c.at("vocab");
    m.layers = c.at("layers");
    m.max_positions = 2048;
    TrainConfig t;
    t.batch = c.at("batch");
    t.seq = c.at("seq");
    t.dtype = c.at("run_dtype") == "fp32" ? DType::f32 : DType::bf16;
    t.checkpointing = c.at("checkpointing") == "full" ? Checkpointing::full : Checkpointing::none;
    const Estimate e = estimate(Profile::hf_eager, m, t);
    const auto& a = e.activations;
    const auto& gb = c.at("group_bytes");
    for (const auto& pl : c.at("per_layer_bytes")) EXPECT_EQ(pl.get<u64>(), a.per_layer_bytes);
    EXPECT_EQ(gb.at("layer").get<u64>(), a.per_layer_bytes);
    EXPECT_EQ(gb.at("head").get<u64>(), a.head_bytes);
    EXPECT_EQ(gb.at("shared").get<u64>(), a.shared_bytes);
    EXPECT_EQ(gb.at("embedding").get<u64>(), a.embedding_bytes);
    EXPECT_EQ(gb.at("recompute").get<u64>(), a.recompute_bytes);
    const auto& groups = c.at("groups");
    EXPECT_EQ(sig_of(groups.at("layer")), sig_of(a.layer))
        << "golden " << show(sig_of(groups.at("layer"))) << "\nours   " << show(sig_of(a.layer));
    EXPECT_EQ(sig_of(groups.at("head")), sig_of(a.head))
        << "golden " << show(sig_of(groups.at("head"))) << "\nours   " << show(sig_of(a.head));
    EXPECT_EQ(sig_of(groups.at("shared")), sig_of(a.shared));
    EXPECT_EQ(sig_of(groups.at("recompute")), sig_of(a.recompute));
    // Inputs: autograd saves input_ids (the embedding's indices), and the labels themselves
    // when b = 1 (the shifted slice is then a view).
    std::vector<TensorEntry> ids;
    for (const auto& x : a.inputs)
      if (x.name == "input_ids" || (x.name == "labels" && t.batch == 1)) ids.push_back(x);
    EXPECT_EQ(sig_of(groups.at("inputs")), sig_of(ids));
    // Host-side wrapped Python numbers are the only thing we leave out: 0-dim fp64.
    for (const auto& x : groups.at("host_scalars")) {
      EXPECT_EQ(x.at("dtype"), "fp64");
      EXPECT_TRUE(x.at("shape").empty());
    }
    const u64 total = gb.at("embedding").get<u64>() + m.layers * gb.at("layer").get<u64>() +
                      gb.at("shared").get<u64>() + gb.at("head").get<u64>();
    EXPECT_EQ(e.figures.activations, total);
    if (c.contains("caller_held_use_cache_bytes")) {
      EXPECT_EQ(e.caller_held_bytes, c.at("caller_held_use_cache_bytes").get<u64>());
    }
  }
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
  EXPECT_EQ(e.figures.activations, 32 * per_layer + head);
  // 47.25 GiB: the paper's 45.61 GiB is discussed in docs/formulas.md.
  EXPECT_NEAR(static_cast<double>(e.figures.activations) / (1u << 30), 47.25, 0.01);
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
  const u64 kept = 5 * 2 * b * s * h + 2 * b * s * s + 8 * s + head;  // inputs, mask, pos ids
  EXPECT_EQ(e.figures.activations, kept);
  // During layer L-1's backward: the head is released and the replayed layer saves again.
  t.checkpointing = Checkpointing::none;
  const u64 layer = estimate(Profile::hf_eager, m, t).activations.per_layer_bytes;
  EXPECT_EQ(e.figures.activations_peak, std::max(kept, kept - head + (layer - 2 * b * s * h)));
}

}  // namespace
}  // namespace trainmem
