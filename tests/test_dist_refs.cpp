// The published estimators' per-rank references (include/trainmem/analytic/dist_refs.hpp). Every
// expected value is written out here by hand from the formulas in the estimators' sources
// (docs/distributed-references.md), never copied from the library's output:
//   DeepSpeed stage_1_and_2.py / stage3.py: integer formulas (int() truncation = floor here).
//   Megatron theoretical_memory_usage.py: float formulas, evaluated here in long double and
//   compared to the nearest byte (±1 for the rounding of a value computed in another order).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "trainmem/analytic/dist_refs.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

using u64 = std::uint64_t;
using ld = long double;

ModelConfig preset(const char* name) {
  auto m = find_preset(name);
  EXPECT_TRUE(m.has_value()) << name;
  return *m;
}

TrainConfig run(std::int64_t b, std::int64_t s) {
  TrainConfig t;
  t.batch = b;
  t.seq = s;
  t.dtype = DType::bf16;
  t.optimizer = Optimizer::adamw;
  return t;
}

ParallelConfig layout(std::int64_t dp, std::int64_t tp, std::int64_t pp, int zero,
                      Offload off = Offload::none) {
  ParallelConfig p;
  p.dp = dp;
  p.tp = tp;
  p.pp = pp;
  p.world = dp * tp * pp;
  p.zero = zero;
  p.offload = off;
  return p;
}

// LLaMA-2-70B written out: V 32000, h 8192, i 28672, L 80, a 64, k 8 (d 128), untied.
constexpr u64 V70 = 32000, H70 = 8192, I70 = 28672, L70 = 80, KD70 = 8 * 128;
constexpr u64 P70 =
    2 * V70 * H70 + L70 * (2 * H70 * H70 + 2 * H70 * KD70 + 3 * H70 * I70 + 2 * H70) + H70;
// LLaMA-7B: V 32000, h 4096, i 11008, L 32, a = k = 32, untied.
constexpr u64 V7 = 32000, H7 = 4096, I7 = 11008, L7 = 32;
constexpr u64 P7 = 2 * V7 * H7 + L7 * (4 * H7 * H7 + 3 * H7 * I7 + 2 * H7) + H7;

u64 gpu_terms(const ReferenceRank& r) {
  u64 s = 0;
  for (const auto& t : r.terms)
    if (!t.host) s += t.bytes;
  return s;
}
u64 host_terms(const ReferenceRank& r) {
  u64 s = 0;
  for (const auto& t : r.terms)
    if (t.host) s += t.bytes;
  return s;
}
bool has_note(const ReferenceRank& r, const std::string& needle) {
  for (const auto& n : r.notes)
    if (n.find(needle) != std::string::npos) return true;
  return false;
}

TEST(DistRefs, ParamCountsMatchTheHandWrittenConfigs) {
  EXPECT_EQ(P70, 68976648192ull);  // LLaMA-2-70B's published count
  EXPECT_EQ(preset("llama2-70b").param_count(), P70);
  EXPECT_EQ(preset("llama-7b").param_count(), P7);
}

TEST(DistRefs, LargestLayerIsTheLargestModulesOwnParameters) {
  // model_to_params: max over modules of sum(p.numel() for p in m.parameters(recurse=False)).
  EXPECT_EQ(deepspeed_largest_layer_params(preset("llama2-70b")), V70 * H70);  // > h·i
  EXPECT_EQ(deepspeed_largest_layer_params(preset("llama-7b")), V7 * H7);
  EXPECT_EQ(deepspeed_largest_layer_params(preset("llama3-8b")), 128256ull * 4096);
  EXPECT_EQ(deepspeed_largest_layer_params(preset("tiny")), 64ull * 176);  // h·i > V·h = 8192
  // A mixture of experts as transformers 5 builds it: a layer's experts are one module owning
  // gate_up_proj (E, 2m, h) and down_proj (E, h, m): E·3·m·h, above the embedding's V·h here
  // (Mixtral-8x7B 8·3·14,336·4,096 against 32,000·4,096; Qwen3-30B-A3B 128·3·768·2,048 against
  // 151,936·2,048); an all-MoE model has no dense h·i module.
  EXPECT_EQ(deepspeed_largest_layer_params(preset("mixtral-8x7b")), 8ull * 3 * 14336 * 4096);
  EXPECT_EQ(deepspeed_largest_layer_params(preset("qwen3-30b-a3b")), 128ull * 3 * 768 * 2048);
  // tiny-qwen3-moe (V 103, h 64, 8 experts of 36): the experts' 55,296 over attention's 96·64.
  EXPECT_EQ(deepspeed_largest_layer_params(preset("tiny-qwen3-moe")), 8ull * 3 * 36 * 64);
}

TEST(DistRefs, DeepSpeedZero3NoOffloadLlama2_70bOn8) {
  const auto r = deepspeed_reference(preset("llama2-70b"), run(1, 4096), layout(8, 1, 1, 3));
  ASSERT_TRUE(r.covers) << r.why_not;
  const u64 Lmax = V70 * H70;
  EXPECT_EQ(r.gpu_total, 4 * Lmax + (18 * P70) / 8);  // LL + int(18P/N)
  EXPECT_EQ(r.host_total, Lmax * 4 * 8 * 3 / 2);      // zero_init: Lmax·4·n·1.5
  EXPECT_EQ(gpu_terms(r), r.gpu_total);
  EXPECT_EQ(host_terms(r), r.host_total);
  EXPECT_EQ(r.params + r.gradients + r.optimizer_states + r.activations, 0u);
  EXPECT_NE(r.source.find("stage3.py"), std::string::npos);
  EXPECT_TRUE(has_note(r, "zero_init=0"));
  EXPECT_TRUE(has_note(r, "bucket"));
}

TEST(DistRefs, DeepSpeedZero3Offloads) {
  const auto m = preset("llama2-70b");
  const u64 Lmax = V70 * H70;
  const auto opt = deepspeed_reference(m, run(1, 4096), layout(8, 1, 1, 3, Offload::optimizer));
  ASSERT_TRUE(opt.covers);
  EXPECT_EQ(opt.gpu_total, 4 * Lmax + (2 * P70) / 8);  // LL + int(2P/N)
  EXPECT_EQ(opt.host_total, P70 * 16 * 3 / 2);         // P·16·(1/nodes)·1.5, one node
  const auto both =
      deepspeed_reference(m, run(1, 4096), layout(8, 1, 1, 3, Offload::optimizer_params));
  ASSERT_TRUE(both.covers);
  EXPECT_EQ(both.gpu_total, 4 * Lmax);           // LL
  EXPECT_EQ(both.host_total, P70 * 18 * 3 / 2);  // P·18·1.5
  EXPECT_EQ(gpu_terms(both), both.gpu_total);
  EXPECT_EQ(host_terms(both), both.host_total);
  // Two nodes of 8: N = 16, gpus_factor = 1/2.
  const auto two =
      deepspeed_reference(m, run(1, 4096), layout(16, 1, 1, 3, Offload::optimizer_params));
  ASSERT_TRUE(two.covers);
  EXPECT_EQ(two.gpu_total, 4 * Lmax);
  EXPECT_EQ(two.host_total, P70 * 27 / 2);  // P·18·(1/2)·1.5, truncated
  const auto two_none = deepspeed_reference(m, run(1, 4096), layout(16, 1, 1, 3));
  EXPECT_EQ(two_none.gpu_total, 4 * Lmax + (18 * P70) / 16);
}

TEST(DistRefs, DeepSpeedZero2) {
  const auto m = preset("llama-7b");
  const auto r = deepspeed_reference(m, run(4, 512), layout(8, 1, 1, 2));
  ASSERT_TRUE(r.covers) << r.why_not;
  EXPECT_EQ(r.gpu_total, 2 * P7 + (18 * P7) / 8);  // 2P + int(18P/N)
  EXPECT_EQ(r.host_total, P7 * 4 * 8 * 3 / 2);     // P·4·n·1.5
  EXPECT_EQ(gpu_terms(r), r.gpu_total);
  EXPECT_NE(r.source.find("stage_1_and_2.py"), std::string::npos);
  // int() truncates: 18P/7 is not whole.
  const auto seven = deepspeed_reference(m, run(4, 512), layout(7, 1, 1, 2));
  ASSERT_TRUE(seven.covers);
  EXPECT_NE((18 * P7) % 7, 0u);
  EXPECT_EQ(seven.gpu_total, 2 * P7 + (18 * P7) / 7);
  EXPECT_EQ(seven.host_total, P7 * 4 * 7 * 3 / 2);  // num_gpus_per_node = 7, one node
  // Optimizer offload: GPU 2P, CPU P·max(4N, 16)·1.5.
  const auto off = deepspeed_reference(m, run(4, 512), layout(8, 1, 1, 2, Offload::optimizer));
  ASSERT_TRUE(off.covers);
  EXPECT_EQ(off.gpu_total, 2 * P7);
  EXPECT_EQ(off.host_total, P7 * 32 * 3 / 2);
  const auto off2 = deepspeed_reference(m, run(4, 512), layout(2, 1, 1, 2, Offload::optimizer));
  EXPECT_EQ(off2.host_total, P7 * 16 * 3 / 2);  // max(8, 16) = 16
}

// Several nodes: N = dp = n GPUs per node × nodes. DeepSpeed's formulas (stage_1_and_2.py,
// stage3.py; docs/distributed-references.md), worked by hand:
//   ZeRO-2:          GPU 2P + int(18P/N)      CPU int(P·4·n·1.5)            (n per node, not N)
//   ZeRO-2 offload:  GPU 2P                   CPU int(P·max(4N, 16)·1.5)    (N, all GPUs)
//   ZeRO-3:          GPU 4Lmax + int(18P/N)   CPU int(Lmax·4·n·1.5)         (zero_init=1)
//   ZeRO-3 opt:      GPU 4Lmax + int(2P/N)    CPU int(P·16·(1/nodes)·1.5)
//   ZeRO-3 opt+par:  GPU 4Lmax                CPU int(P·18·(1/nodes)·1.5)
// with zero_init=0's CPU row int(P·max(4n, k/nodes)·1.5), k = 16 or 18 (no offload: P·4·n·1.5).
// Node counts 2 and 4 keep 1/nodes exact in binary, so the float products are exact and int()
// truncates only what is written below.
TEST(DistRefs, DeepSpeedSeveralNodes) {
  // LLaMA-7B: P7 = 6,738,415,616 (a multiple of 16), Lmax = V·h = 131,072,000.
  const auto m7 = preset("llama-7b");
  const auto t = run(1, 512);
  {
    // 2 nodes of 8, N = 16.
    const auto z2 = deepspeed_reference(m7, t, layout(16, 1, 1, 2));
    ASSERT_TRUE(z2.covers) << z2.why_not;
    // 2P = 13,476,831,232; 18P/16 = 7,580,717,568 exactly.
    EXPECT_EQ(z2.gpu_total, 13476831232ull + 7580717568ull);
    // Per node: P·4·8·1.5 = 48P = 323,443,949,568 (P·4·16·1.5, per all GPUs, would be twice).
    EXPECT_EQ(z2.host_total, 323443949568ull);
    EXPECT_EQ(gpu_terms(z2), z2.gpu_total);
    EXPECT_EQ(host_terms(z2), z2.host_total);
    EXPECT_TRUE(has_note(z2, "8 GPUs per node × 2 nodes"));
    const auto z2o = deepspeed_reference(m7, t, layout(16, 1, 1, 2, Offload::optimizer));
    ASSERT_TRUE(z2o.covers) << z2o.why_not;
    EXPECT_EQ(z2o.gpu_total, 13476831232ull);    // 2P
    EXPECT_EQ(z2o.host_total, 646887899136ull);  // P·max(64, 16)·1.5 = 96P
  }
  {
    // 4 nodes of 4, N = 16 (gpus_per_node 4).
    const auto z2 = deepspeed_reference(m7, t, layout(16, 1, 1, 2), 4);
    ASSERT_TRUE(z2.covers) << z2.why_not;
    EXPECT_EQ(z2.gpu_total, 13476831232ull + 7580717568ull);  // as above: N is still 16
    EXPECT_EQ(z2.host_total, 161721974784ull);                // P·4·4·1.5 = 24P
    const auto z2o = deepspeed_reference(m7, t, layout(16, 1, 1, 2, Offload::optimizer), 4);
    EXPECT_EQ(z2o.host_total, 646887899136ull);  // P·max(4·16, 16)·1.5 = 96P: all GPUs
    // ZeRO-3, 4Lmax = 524,288,000.
    const auto z3 = deepspeed_reference(m7, t, layout(16, 1, 1, 3), 4);
    ASSERT_TRUE(z3.covers) << z3.why_not;
    EXPECT_EQ(z3.gpu_total, 524288000ull + 7580717568ull);  // 4Lmax + 18P/16
    EXPECT_EQ(z3.host_total, 3145728000ull);                // Lmax·4·4·1.5 = 24·Lmax
    EXPECT_TRUE(has_note(z3, "zero_init=0 (the table's other row): 161721974784 bytes"));  // 24P
    const auto z3o = deepspeed_reference(m7, t, layout(16, 1, 1, 3, Offload::optimizer), 4);
    ASSERT_TRUE(z3o.covers) << z3o.why_not;
    EXPECT_EQ(z3o.gpu_total, 524288000ull + 842301952ull);  // 4Lmax + 2P/16
    EXPECT_EQ(z3o.host_total, 40430493696ull);              // P·16·(1/4)·1.5 = 6P
    // zero_init=0: P·max(16, 16/4)·1.5 = 24P.
    EXPECT_TRUE(has_note(z3o, "zero_init=0 (the table's other row): 161721974784 bytes"));
    const auto z3b = deepspeed_reference(m7, t, layout(16, 1, 1, 3, Offload::optimizer_params), 4);
    ASSERT_TRUE(z3b.covers) << z3b.why_not;
    EXPECT_EQ(z3b.gpu_total, 524288000ull);     // 4Lmax
    EXPECT_EQ(z3b.host_total, 45484305408ull);  // P·18·(1/4)·1.5 = 6.75P, P a multiple of 4
    EXPECT_TRUE(has_note(z3b, "zero_init=0 (the table's other row): 161721974784 bytes"));
  }
  {
    // 2 nodes of 8, ZeRO-3 with optimizer offload: 2P/16 = 842,301,952; P·16·(1/2)·1.5 = 12P.
    const auto z3o = deepspeed_reference(m7, t, layout(16, 1, 1, 3, Offload::optimizer));
    ASSERT_TRUE(z3o.covers) << z3o.why_not;
    EXPECT_EQ(z3o.gpu_total, 524288000ull + 842301952ull);
    EXPECT_EQ(z3o.host_total, 80860987392ull);
    EXPECT_EQ(host_terms(z3o), z3o.host_total);
  }

  // tiny-awkward, where int() truncates: P = 54,920 (V 71, h 40, i 104, L 3, a 5, k 1, untied);
  // Lmax = h·i = 4,160 (> V·h = 2,840). 2 nodes of 7, N = 14.
  const auto ma = preset("tiny-awkward");
  ASSERT_EQ(ma.param_count(), 54920u);
  const auto z2 = deepspeed_reference(ma, t, layout(14, 1, 1, 2), 7);
  ASSERT_TRUE(z2.covers) << z2.why_not;
  EXPECT_EQ(z2.gpu_total, 109840u + 70611u);  // 2P + int(988,560 / 14 = 70,611.43)
  EXPECT_EQ(z2.host_total, 2306640u);         // P·4·7·1.5 = 42P
  const auto z2o = deepspeed_reference(ma, t, layout(14, 1, 1, 2, Offload::optimizer), 7);
  EXPECT_EQ(z2o.gpu_total, 109840u);    // 2P
  EXPECT_EQ(z2o.host_total, 4613280u);  // P·max(56, 16)·1.5 = 84P
  const auto z3 = deepspeed_reference(ma, t, layout(14, 1, 1, 3), 7);
  ASSERT_TRUE(z3.covers) << z3.why_not;
  EXPECT_EQ(z3.gpu_total, 16640u + 70611u);  // 4·4,160 + int(18P/14)
  EXPECT_EQ(z3.host_total, 174720u);         // Lmax·4·7·1.5 = 42·4,160
  const auto z3o = deepspeed_reference(ma, t, layout(14, 1, 1, 3, Offload::optimizer), 7);
  EXPECT_EQ(z3o.gpu_total, 16640u + 7845u);  // 4Lmax + int(109,840 / 14 = 7,845.71)
  EXPECT_EQ(z3o.host_total, 659040u);        // P·16·(1/2)·1.5 = 12P
  const auto z3b = deepspeed_reference(ma, t, layout(14, 1, 1, 3, Offload::optimizer_params), 7);
  EXPECT_EQ(z3b.gpu_total, 16640u);    // 4Lmax
  EXPECT_EQ(z3b.host_total, 741420u);  // P·18·(1/2)·1.5 = 13.5P = 741,420 exactly
  // zero_init=0: P·max(4·7, 18/2)·1.5 = 42P.
  EXPECT_TRUE(has_note(z3b, "zero_init=0 (the table's other row): 2306640 bytes"));
}

TEST(DistRefs, DeepSpeedNotesWhatItAppliesAsWritten) {
  auto t = run(1, 512);
  t.dtype = DType::f32;
  t.optimizer = Optimizer::sgd;
  const auto r = deepspeed_reference(preset("llama-7b"), t, layout(8, 1, 1, 3));
  ASSERT_TRUE(r.covers);
  EXPECT_TRUE(has_note(r, "fp32"));
  EXPECT_TRUE(has_note(r, "sgd"));
  EXPECT_EQ(r.gpu_total, 4 * V7 * H7 + (18 * P7) / 8);  // same formula, no dtype branch
}

TEST(DistRefs, DeepSpeedDoesNotCover) {
  const auto m = preset("llama-7b");
  const auto t = run(1, 512);
  for (int zero : {0, 1}) {
    const auto r = deepspeed_reference(m, t, layout(8, 1, 1, zero));
    EXPECT_FALSE(r.covers);
    EXPECT_NE(r.why_not.find("ZeRO-" + std::to_string(zero)), std::string::npos) << r.why_not;
    EXPECT_EQ(r.gpu_total, 0u);
  }
  const auto tp = deepspeed_reference(m, t, layout(4, 2, 1, 3));
  EXPECT_FALSE(tp.covers);
  EXPECT_NE(tp.why_not.find("tp 2"), std::string::npos) << tp.why_not;
  const auto pp = deepspeed_reference(m, t, layout(4, 1, 2, 1));
  EXPECT_FALSE(pp.covers);
  const auto pp2 = deepspeed_reference(m, t, layout(4, 1, 2, 2));
  EXPECT_FALSE(pp2.covers);
  EXPECT_NE(pp2.why_not.find("pp 2"), std::string::npos) << pp2.why_not;
  const auto z2p = deepspeed_reference(m, t, layout(8, 1, 1, 2, Offload::optimizer_params));
  EXPECT_FALSE(z2p.covers);
  EXPECT_NE(z2p.why_not.find("ZeRO-2"), std::string::npos) << z2p.why_not;
  const auto odd = deepspeed_reference(m, t, layout(12, 1, 1, 3));  // 12 GPUs, 8 per node
  EXPECT_FALSE(odd.covers);
  EXPECT_NE(odd.why_not.find("node"), std::string::npos) << odd.why_not;
  EXPECT_TRUE(deepspeed_reference(m, t, layout(12, 1, 1, 3), 4).covers);  // 3 nodes of 4
  EXPECT_THROW(deepspeed_reference(m, t, layout(8, 1, 1, 3), 0), InputError);
}

// Megatron, written out from theoretical_memory_usage.py for a LLaMA (RMSNorm, SwiGLU, GQA).
struct Mega {
  ld V, h, i, L, a, k, s, b, tp, pp, dp, M;
  bool untied = true, dist_opt = false;
  ld Vp() const {
    const ld mult = 128 * tp;
    return std::ceil(V / mult) * mult;
  }
  ld weights() const {
    const ld attn = 2 * h * h * (1 + k / a);  // kv_channels·a = h
    const ld mlp = 2 * h * i * 1.5L;          // --swiglu
    const ld norms = 2 * h;
    ld sharded = ((attn + mlp) * L / pp + Vp() * h) / tp;
    if (untied && pp == 1) sharded += Vp() * h / tp;
    const ld replicated = (norms * L + h) / pp;  // layer norms + final norm, not / tp
    return (sharded + replicated) * (dist_opt ? 6 + 12 / dp : 18);
  }
  ld sched() const { return pp > 1 ? std::min<ld>(1, M / pp) : 1; }
  ld acts_sp() const {  // compute_activation_memory
    ld x = s * b * h * (18 + 4 * i / h) * L + 8 * s * b * pp + s * b * h * pp;
    x *= sched();
    if (pp == 1) x += s * b * h * 4 * (1 + Vp() / h);
    return x / tp;
  }
  ld acts_no_sp() const {  // compute_activation_memory_without_sp
    ld x = s * b * h * (10 + 24 / tp) * L + 8 * s * b * pp + s * b * h * pp;
    x *= sched();
    if (pp == 1) x += (s * b * Vp() / tp + s * b * h) * 2;
    return x * 1.05L;
  }
};

Mega mega70(ld tp, ld pp, ld dp, ld s, ld b, ld M) {
  return Mega{32000, 8192, 28672, 80, 64, 8, s, b, tp, pp, dp, M};
}

void expect_bytes(u64 got, ld want, const char* what) {
  EXPECT_LE(std::fabs(static_cast<ld>(got) - want), 1.0L)
      << what << ": got " << got << ", want " << static_cast<double>(want);
}

TEST(DistRefs, MegatronPaddedVocab) {
  EXPECT_EQ(megatron_padded_vocab(preset("llama2-70b"), 1), 32000u);  // 250 × 128
  EXPECT_EQ(megatron_padded_vocab(preset("llama2-70b"), 8), 32768u);  // 32 × 1024
  EXPECT_EQ(megatron_padded_vocab(preset("llama3-8b"), 4), 128512u);  // 251 × 512
}

TEST(DistRefs, MegatronTp8SpSelective70b) {
  auto par = layout(1, 8, 1, 0);
  par.sp = true;
  const auto r = megatron_reference(preset("llama2-70b"), run(1, 4096), par, true);
  ASSERT_TRUE(r.covers) << r.why_not;
  const auto m = mega70(8, 1, 1, 4096, 1, 1);
  EXPECT_EQ(m.Vp(), 32768);
  expect_bytes(r.gpu_total - r.activations, m.weights(), "weights and optimizer");
  expect_bytes(r.activations, m.acts_sp(), "activations");
  EXPECT_EQ(gpu_terms(r), r.gpu_total);
  EXPECT_EQ(r.host_total, 0u);
  EXPECT_NE(r.source.find("compute_activation_memory "), std::string::npos) << r.source;
  EXPECT_NE(r.source.find("theoretical_memory_usage.py"), std::string::npos);
}

TEST(DistRefs, MegatronDistributedOptimizer) {
  auto par = layout(2, 8, 1, 1);
  par.sp = true;
  const auto r = megatron_reference(preset("llama2-70b"), run(1, 4096), par, true);
  ASSERT_TRUE(r.covers);
  auto m = mega70(8, 1, 2, 4096, 1, 1);
  m.dist_opt = true;  // 6 + 12/2 = 12 bytes per parameter
  expect_bytes(r.gpu_total - r.activations, m.weights(), "weights (distributed optimizer)");
  EXPECT_TRUE(has_note(r, "use-distributed-optimizer"));
  // ZeRO-3 maps to the same flag; the estimator does not shard parameters further.
  auto z3 = par;
  z3.zero = 3;
  const auto r3 = megatron_reference(preset("llama2-70b"), run(1, 4096), z3, true);
  EXPECT_EQ(r3.gpu_total, r.gpu_total);
  EXPECT_TRUE(has_note(r3, "ZeRO-2/3"));
}

TEST(DistRefs, MegatronWithoutSp) {
  // tp 8 without sequence parallelism: the without-SP branch, × 1.05, no final / tp.
  const auto r = megatron_reference(preset("llama2-70b"), run(2, 2048), layout(1, 8, 1, 0));
  ASSERT_TRUE(r.covers);
  const auto m = mega70(8, 1, 1, 2048, 2, 1);
  expect_bytes(r.gpu_total - r.activations, m.weights(), "weights");
  expect_bytes(r.activations, m.acts_no_sp(), "activations without SP");
  EXPECT_NE(r.source.find("without_sp"), std::string::npos);
  // SP without selective recompute takes the same branch (report_theoretical_memory).
  auto sp = layout(1, 8, 1, 0);
  sp.sp = true;
  const auto r_sp = megatron_reference(preset("llama2-70b"), run(2, 2048), sp, false);
  EXPECT_EQ(r_sp.activations, r.activations);
  // Checkpointing full = recompute_granularity 'full': same branch, noted, no recompute term.
  auto full = run(2, 2048);
  full.checkpointing = Checkpointing::full;
  const auto r_full = megatron_reference(preset("llama2-70b"), full, layout(1, 8, 1, 0));
  EXPECT_EQ(r_full.activations, r.activations);
  EXPECT_TRUE(has_note(r_full, "full-recompute"));
  EXPECT_THROW(megatron_reference(preset("llama2-70b"), full, sp, true), InputError);
}

TEST(DistRefs, MegatronPipelineFirstStage) {
  // tp 2 × pp 4 with SP + selective, M = 2 < pp: min(1, M/pp) = 1/2, no output term.
  auto par = layout(1, 2, 4, 0);
  par.sp = true;
  par.microbatches = 2;
  const auto r = megatron_reference(preset("llama2-70b"), run(1, 4096), par, true);
  ASSERT_TRUE(r.covers);
  const auto m = mega70(2, 4, 1, 4096, 1, 2);
  expect_bytes(r.gpu_total - r.activations, m.weights(), "first-stage weights");
  expect_bytes(r.activations, m.acts_sp(), "first-stage activations");
  EXPECT_EQ(r.terms.size(), 4u);  // weights, layers, ids, dropout: no output layer term
  EXPECT_EQ(gpu_terms(r), r.gpu_total);
  // Without SP, M = 8 >= pp: factor 1.
  auto nosp = layout(2, 2, 4, 1);
  nosp.microbatches = 8;
  const auto r2 = megatron_reference(preset("llama2-70b"), run(1, 4096), nosp);
  auto m2 = mega70(2, 4, 2, 4096, 1, 8);
  m2.dist_opt = true;
  expect_bytes(r2.gpu_total - r2.activations, m2.weights(), "weights pp 4, dist opt");
  expect_bytes(r2.activations, m2.acts_no_sp(), "activations pp 4 without SP");
  EXPECT_TRUE(has_note(r2, "micro-batches in flight"));
}

TEST(DistRefs, MegatronSingleGpuAndTiedEmbeddings) {
  const auto r = megatron_reference(preset("llama-7b"), run(4, 512), layout(1, 1, 1, 0));
  ASSERT_TRUE(r.covers);
  Mega m{32000, 4096, 11008, 32, 32, 32, 512, 4, 1, 1, 1, 1};
  expect_bytes(r.gpu_total - r.activations, m.weights(), "7B weights");
  expect_bytes(r.activations, m.acts_no_sp(), "7B activations");
  const auto tied_model = preset("tiny-tied");
  ASSERT_TRUE(tied_model.tied_embeddings);
  const auto t = megatron_reference(tied_model, run(2, 64), layout(1, 1, 1, 0));
  Mega mt{ld(tied_model.vocab),
          ld(tied_model.hidden),
          ld(tied_model.intermediate),
          ld(tied_model.layers),
          ld(tied_model.heads),
          ld(tied_model.kv_heads),
          64,
          2,
          1,
          1,
          1,
          1};
  mt.untied = false;
  expect_bytes(t.gpu_total - t.activations, mt.weights(), "tied weights");
}

TEST(DistRefs, MegatronDoesNotCoverOffload) {
  auto par = layout(8, 1, 1, 3, Offload::optimizer);
  const auto r = megatron_reference(preset("llama-7b"), run(1, 512), par);
  EXPECT_FALSE(r.covers);
  EXPECT_NE(r.why_not.find("offload"), std::string::npos);
  EXPECT_EQ(r.gpu_total, 0u);
}

}  // namespace
}  // namespace trainmem

namespace trainmem {
namespace {

// Megatron's weights term for a mixture of experts, as NVIDIA/Megatron-LM PR #4687's
// compute_weight_and_optimizer_memory splits it, worked by hand for Mixtral-8x7B on 8 GPUs at
// ep 8 with the distributed optimizer (docs/ep-plan.md §6): tp-sharded attention
// 32·2·4096²·(1 + 8/32) = 1,342,177,280 + the untied embedding and head 2·4096·32,000
// (Vp = 32,000 is a multiple of 128) = 1,604,321,280; replicated 32·(2·4096 + 4096·8) + 4096 =
// 1,314,816; experts 32·2·4096·14,336·8·1.5 / 8 = 5,637,144,576 on each rank, with
// edp = 8/(1·8·1) = 1: 1,605,636,096·(6 + 12/8) + 5,637,144,576·(6 + 12/1) = 113,510,873,088.
TEST(DistRefs, MegatronMixtureOfExpertsSplitsTheExperts) {
  const ModelConfig m = preset("mixtral-8x7b");
  TrainConfig t = run(1, 4096);
  t.checkpointing = Checkpointing::full;
  ParallelConfig par = layout(8, 1, 1, 1);
  par.ep = 8;
  const auto r = megatron_reference(m, t, par);
  ASSERT_TRUE(r.covers) << r.why_not;
  const ld dense = 1342177280.0L + 262144000.0L + 1314816.0L;
  EXPECT_EQ(dense, 1605636096.0L);
  expect_bytes(r.gpu_total - r.activations, dense * 7.5L + 5637144576.0L * 18.0L,
               "weights and optimizer");
  expect_bytes(r.gpu_total - r.activations, 113510873088.0L, "the hand figure");
  EXPECT_TRUE(has_note(r, "PR #4687")) << r.notes.front();
  EXPECT_TRUE(has_note(r, "edp = world/(etp·ep·pp) = 1"));
  // ep 1 over the same 8 ranks: the experts whole on every rank, sharded over dp 8 alike.
  par.ep = 1;
  const auto one = megatron_reference(m, t, par);
  expect_bytes(one.gpu_total - one.activations, (dense + 8 * 5637144576.0L) * 7.5L,
               "ep 1: every parameter at 6 + 12/8");
}

// mbridge's estimator (ISEEKYAN/mbridge memory_estimator, docs/distributed-references.md
// "mbridge"), written out from estimate_013.report_memory_usage_one_pp_rank and the layer
// classes' num_parameter / num_activation.
TEST(DistRefs, MbridgeMixtralOnEightGpusByHand) {
  const ModelConfig m = preset("mixtral-8x7b");  // h 4096, L 32, a 32, g 8, d 128, m 14336, E 8
  TrainConfig t = run(1, 4096);
  ParallelConfig par = layout(8, 1, 1, 1);
  par.ep = 8;
  const auto r = mbridge_reference(m, t, par);
  ASSERT_TRUE(r.covers) << r.why_not;
  // Per layer: qkv (32 + 2·8)·128·4096, proj 4096·4096, the pre-MLP norm 4096, the router 0,
  // one expert 3·14336·4096; embedding and output 32000·4096 each, the final norm 4096.
  const u64 layer = 48ull * 128 * 4096 + 4096ull * 4096 + 4096 + 3ull * 14336 * 4096;
  const u64 P = 2ull * 32000 * 4096 + 32 * layer + 4096, experts = 32ull * 3 * 14336 * 4096;
  EXPECT_EQ(P, 7241601024ull);
  EXPECT_TRUE(has_note(r, "P = 7241601024 parameters")) << r.notes[1];
  // Dense at 6 + 12/(dp·cp) = 7.5, the experts at 6 + 12/(8/1/8/1) = 18.
  const ld states = static_cast<ld>(P - experts) * 7.5L + static_cast<ld>(experts) * 18.0L;
  expect_bytes(r.gpu_total - r.activations, states, "weights, gradients, optimizer");
  expect_bytes(r.gpu_total - r.activations, 113502025728.0L, "the hand figure");
  // One micro-batch (n = pp − 0 = 1), elements: per layer 4·s·a·d (proj and its companions) +
  // flash 2·s·g·d + router 2·s·h + dispatcher K·s·h + experts K·s·(2m + m) + pre-MLP norm s·h +
  // two bias-dropout-adds 2·s·h; embedding s·h, final norm s·h, logits and fp32 softmax 3·s·V.
  const u64 s = 4096, h = 4096;
  const u64 per_layer = 4 * s * 32 * 128 + 2 * s * 8 * 128 + 2 * s * h + 2 * s * h +
                        2 * s * (2 * 14336 + 14336) + s * h + 2 * s * h;
  EXPECT_EQ(per_layer, 545259520ull);
  const u64 A = s * h + 32 * per_layer + s * h + 3 * s * 32000;
  EXPECT_EQ(r.activations, 2 * A);  // 35,750,150,144 B (33.29 GiB in its report)
  EXPECT_EQ(r.gpu_total, static_cast<u64>(std::llround(states)) + 2 * A);
  EXPECT_EQ(gpu_terms(r), r.gpu_total);
  // Full recompute (uniform, 1 layer): the layer inputs s·h·L plus the embedding, plus the larger
  // of one layer and the output layer.
  t.checkpointing = Checkpointing::full;
  const auto full = mbridge_reference(m, t, par);
  const u64 common = s * h + s * h * 32;
  EXPECT_EQ(full.activations, 2 * (common + std::max(per_layer, 3 * s * 32000)));
  EXPECT_EQ(full.activations, 2197815296ull);
  // Selective: core attention (2·s·g·d) dropped from every layer.
  t.checkpointing = Checkpointing::selective;
  EXPECT_EQ(mbridge_reference(m, t, par).activations, 2 * (A - 32 * (2 * s * 8 * 128)));
  // ep 1: every parameter at the dense rate (ep·etp = 1), the experts whole on every rank.
  par.ep = 1;
  t.checkpointing = Checkpointing::none;
  const auto one = mbridge_reference(m, t, par);
  const u64 P1 = P + 32 * 7 * (3ull * 14336 * 4096);
  expect_bytes(one.gpu_total - one.activations, static_cast<ld>(P1) * 7.5L, "ep 1");
}

TEST(DistRefs, MbridgeQwen3MoeCountsQkNormsAndTheLossPeak) {
  const ModelConfig m = preset("qwen3-30b-a3b");  // h 2048, L 48, a 32, g 4, d 128, m 768, E 128
  TrainConfig t = run(1, 4096);
  t.checkpointing = Checkpointing::full;
  ParallelConfig par = layout(8, 1, 1, 1);
  par.ep = 8;
  const auto r = mbridge_reference(m, t, par);
  ASSERT_TRUE(r.covers) << r.why_not;
  // Per layer: qkv 40·128·2048, proj 2048·4096, q/k norms 2·128, pre-MLP norm 2048, 16 experts of
  // 3·768·2048; embedding and output 151936·2048 each, final norm 2048.
  const u64 experts = 48ull * 16 * 3 * 768 * 2048;
  const u64 P = 2ull * 151936 * 2048 + 48 * (40ull * 128 * 2048 + 2048ull * 4096 + 256 + 2048) +
                experts + 2048;
  EXPECT_EQ(P, 5152290816ull);
  expect_bytes(r.gpu_total - r.activations,
               static_cast<ld>(P - experts) * 7.5L + static_cast<ld>(experts) * 18.0L,
               "weights, gradients, optimizer");
  // Full recompute: the output (3·s·V = 1,866,989,568) is larger than one layer, so the peak is
  // the loss's: s·h·(1 + 48) + 3·s·V elements.
  const u64 s = 4096, h = 2048;
  EXPECT_EQ(r.activations, 2 * (s * h * 49 + 3 * s * 151936));
  EXPECT_EQ(r.activations, 4556062720ull);
}

TEST(DistRefs, MbridgeDenseLlamaOverPipelineRanks) {
  // LLaMA-2-7B at tp 2, pp 2, dp 2, b 1, s 2048, M 4 (which the estimator does not read).
  ParallelConfig par = layout(2, 2, 2, 1);
  par.microbatches = 4;
  const auto r = mbridge_reference(preset("llama2-7b"), run(1, 2048), par);
  ASSERT_TRUE(r.covers) << r.why_not;
  // Rank 0: embedding 16000·4096 and 16 layers of qkv 3·64·128·4096/… = 96·128/2·4096, proj
  // 4096·2048, MLP 3·5504·4096 (no norms: the fused input norm and a dense layer's pre-MLP norm
  // are not counted).
  const u64 layer = 48ull * 128 * 4096 + 4096ull * 2048 + 3ull * 5504 * 4096;
  const u64 P0 = 16000ull * 4096 + 16 * layer;
  EXPECT_EQ(P0, 1684537344ull);
  expect_bytes(r.gpu_total - r.activations, static_cast<ld>(P0) * 12.0L, "6 + 12/(dp·cp)");
  // Activations: n = pp − 0 = 2 micro-batches; per layer 4·s·(a/tp)·d + 2·s·(g/tp)·d +
  // 3·s·i/tp (full s) + 2·(s/tp)·h (sequence parallel on, as its web UI sets it for tp > 1).
  const u64 s = 2048, h = 4096;
  const u64 per_layer = 4 * s * 16 * 128 + 2 * s * 16 * 128 + 3 * s * 5504 + 2 * (s / 2) * h;
  EXPECT_EQ(r.activations, 2 * 2 * (s * h + 16 * per_layer));  // 4,345,298,944 B
  // Rank 1 (in the notes): the final norm and output layer's parameters, one micro-batch with
  // the final norm's s·h and the logits' 3·s·V/tp.
  const u64 P1 = 16 * layer + 4096 + 16000ull * 4096;
  const u64 A1 = 16 * per_layer + s * h + 3 * s * 16000;
  const u64 total1 = P1 * 12 + 2 * A1;
  EXPECT_TRUE(has_note(r, "rank 1 " + std::to_string(total1) + " B")) << r.notes.front();
  EXPECT_TRUE(has_note(r, "n = pp − pp_rank = 2 micro-batches in flight whatever --microbatches"));
  // Full recompute on rank 0: the embedding and the 16 layers' inputs of n = 2 micro-batches,
  // plus one layer recomputed (rank 0 has no output layer).
  TrainConfig full = run(1, 2048);
  full.checkpointing = Checkpointing::full;
  EXPECT_EQ(mbridge_reference(preset("llama2-7b"), full, par).activations,
            2 * (s * h + s * h * 16 * 2 + per_layer));
}

TEST(DistRefs, MbridgeSharedExpertUnderContextParallelism) {
  // Qwen1.5-MoE-A2.7B (h 2048, L 24 all MoE, a = k = 16, d 128, V 151936, E 60, K 4, m 1408,
  // shared expert 5632, qkv biases) on 8 GPUs = dp 4 × cp 2, ep 2, ZeRO-1, b 1, s 4096.
  const ModelConfig m = preset("qwen1.5-moe-a2.7b");
  TrainConfig t = run(1, 4096);
  t.attention = Attention::flash;
  ParallelConfig par = layout(4, 1, 1, 1);
  par.cp = 2;
  par.world = 8;
  par.ep = 2;
  const auto r = mbridge_reference(m, t, par);
  ASSERT_TRUE(r.covers) << r.why_not;
  // Per layer: qkv 48·128·2048 + its bias 48·128, proj 2048·2048, pre-MLP norm 2048, 30 experts
  // of 3·1408·2048, the shared expert 3·5632·2048 (its gate: not counted).
  const u64 experts = 24ull * 30 * 3 * 1408 * 2048;
  const u64 layer = 6144ull * 2048 + 6144 + 2048ull * 2048 + 2048 + 3ull * 5632 * 2048;
  const u64 P = 2ull * 151936 * 2048 + 24 * layer + experts + 2048;
  // Dense over dp·cp: 6 + 12/4/2 = 7.5; experts over world/(pp·ep·etp) = 4: 6 + 12/4 = 9.
  expect_bytes(r.gpu_total - r.activations,
               static_cast<ld>(P - experts) * 7.5L + static_cast<ld>(experts) * 9.0L,
               "weights, gradients, optimizer");
  // Activations, whole sequence, then / cp (= 2; × 2 bytes): per layer 4·s·a·d + flash
  // 2·s·k·d doubled under cp + router 2·s·h + dispatcher K·s·h + experts K·s·3m + shared
  // 3·s·m_s + pre-MLP norm s·h + 2·s·h; embedding s·h, final norm s·h, output 3·s·V.
  const u64 s = 4096, h = 2048;
  const u64 per_layer = 4 * s * 2048 + 2 * (2 * s * 16 * 128) + 2 * s * h + 4 * s * h +
                        4 * s * 3 * 1408 + 3 * s * 5632 + s * h + 2 * s * h;
  const u64 chunk = s * h + 24 * per_layer + s * h + 3 * s * 151936;
  EXPECT_EQ(r.activations, 2 * chunk / 2);
  EXPECT_TRUE(has_note(r, "the shared expert's gate not counted"));
}

TEST(DistRefs, MbridgeSaysWhatItDoesNotCover) {
  ModelConfig m = preset("llama-7b");
  m.vocab = 32001;
  const auto odd = mbridge_reference(m, run(1, 512), layout(2, 2, 1, 1));
  EXPECT_FALSE(odd.covers);
  EXPECT_NE(odd.why_not.find("vocab 32001 is not divisible by tp 2"), std::string::npos)
      << odd.why_not;
  EXPECT_TRUE(mbridge_reference(m, run(1, 512), layout(2, 1, 1, 1)).covers);
  const auto off =
      mbridge_reference(preset("llama-7b"), run(1, 512), layout(8, 1, 1, 2, Offload::optimizer));
  EXPECT_FALSE(off.covers);
  TrainConfig lora = run(1, 512);
  lora.lora_rank = 8;
  EXPECT_FALSE(mbridge_reference(preset("llama-7b"), lora, layout(8, 1, 1, 2)).covers);
}

}  // namespace
}  // namespace trainmem
