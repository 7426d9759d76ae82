// The activation table (include/trainmem/model/model_acts.hpp) and what the model actually
// allocates and frees, seen through the ledger's tensor records of a meta-backend step, both
// against docs/native-plan.md transcribed here as literal expectations (kPlan below: name, shape
// formula, dtype, which attention variant and which models allocate it, the backward step
// that frees it; kPlanFreeOrder: the order of the backward's frees). Nothing expected is read
// from kLayerActs or its helpers: for each attention variant x checkpointing mode, every
// layer's forward and recompute allocate exactly the plan's rows (names, shapes, dtypes,
// bytes, order), layer_activation_plan() lists the same, checkpointing keeps `out` only, and
// the backward frees each row in the step the plan says, in the plan's order. The backward's
// workspace landmarks (which step allocates which buffer) are taken from docs/native-plan.md
// too. The models include narrow MLPs (h > 3i), where a free moved by one MLP step also
// changes the peak (tests/test_analytic_vs_ledger.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "family_configs.hpp"
#include "model_helpers.hpp"
#include "trainmem/model/model_acts.hpp"

namespace trainmem::test {
namespace {

// docs/native-plan.md, "Forward" (allocation order) and "Backward", "Layer l" (the step that
// frees each row), transcribed by hand. Shapes are written with the plan's letters.
struct Dims {
  std::int64_t b, s, h, i, a, k, d;
  std::int64_t r = 0;                // LoRA rank
  std::int64_t E = 0, K = 0, m = 0;  // mixture of experts: experts, per token, width
  std::int64_t ms = 0;               // the shared expert's width
};
enum class Only { both, eager, flash };
struct PlanRow {
  const char* name;
  std::function<std::vector<std::int64_t>(const Dims&)> shape;
  bool f32;           // "f32" in the plan; otherwise the training dtype D
  Only attention;     // "eager: probs | flash: lse"
  bool qk_norm;       // marked [qk_norm]
  int freed_at;       // backward step of the layer that frees it; 0: `out`, freed by its consumer
  unsigned lora = 0;  // marked [lora <proj>]: allocated when LoRA targets that projection (its bit)
  bool mask = false;  // marked [dropout]: uint8, allocated under LoRA dropout only
  int kind = 0;       // 0 every layer; 1 a dense MLP's (gate, up, act); 2 a MoE layer's ("Mixture
                      // of experts"); 3 its shared expert's (Qwen2-MoE)
  bool i32 = false;   // int32 (the routing's indices)
};
const std::vector<PlanRow>& plan_rows() {
  using S = std::vector<std::int64_t>;
  static const std::vector<PlanRow> rows = {
      {"rstd1",
       [](const Dims& x) {
         return S{x.b, x.s};
       },
       true, Only::both, false, 9},
      {"xn1",
       [](const Dims& x) {
         return S{x.b, x.s, x.h};
       },
       false, Only::both, false, 8},
      {"q_pre",
       [](const Dims& x) {
         return S{x.b, x.s, x.a * x.d};
       },
       false, Only::both, true, 7},
      {"k_pre",
       [](const Dims& x) {
         return S{x.b, x.s, x.k * x.d};
       },
       false, Only::both, true, 7},
      {"q_rstd",
       [](const Dims& x) {
         return S{x.b, x.s, x.a};
       },
       true, Only::both, true, 7},
      {"k_rstd",
       [](const Dims& x) {
         return S{x.b, x.s, x.k};
       },
       true, Only::both, true, 7},
      {"q",
       [](const Dims& x) {
         return S{x.b, x.s, x.a * x.d};
       },
       false, Only::both, false, 8},
      {"k",
       [](const Dims& x) {
         return S{x.b, x.s, x.k * x.d};
       },
       false, Only::both, false, 8},
      {"v",
       [](const Dims& x) {
         return S{x.b, x.s, x.k * x.d};
       },
       false, Only::both, false, 8},
      {"lora_mask.q_proj",
       [](const Dims& x) {
         return S{x.b, x.s, x.h};
       },
       false, Only::both, false, 8, 1u << 0, true},
      {"lora_a.q_proj",
       [](const Dims& x) {
         return S{x.b, x.s, x.r};
       },
       false, Only::both, false, 8, 1u << 0},
      {"lora_mask.k_proj",
       [](const Dims& x) {
         return S{x.b, x.s, x.h};
       },
       false, Only::both, false, 8, 1u << 1, true},
      {"lora_a.k_proj",
       [](const Dims& x) {
         return S{x.b, x.s, x.r};
       },
       false, Only::both, false, 8, 1u << 1},
      {"lora_mask.v_proj",
       [](const Dims& x) {
         return S{x.b, x.s, x.h};
       },
       false, Only::both, false, 8, 1u << 2, true},
      {"lora_a.v_proj",
       [](const Dims& x) {
         return S{x.b, x.s, x.r};
       },
       false, Only::both, false, 8, 1u << 2},
      {"probs",
       [](const Dims& x) {
         return S{x.b, x.a, x.s, x.s};
       },
       false, Only::eager, false, 6},
      {"lse",
       [](const Dims& x) {
         return S{x.b, x.a, x.s};
       },
       true, Only::flash, false, 6},
      {"attn_out",
       [](const Dims& x) {
         return S{x.b, x.s, x.a * x.d};
       },
       false, Only::both, false, 6},
      {"lora_mask.o_proj",
       [](const Dims& x) {
         return S{x.b, x.s, x.a * x.d};
       },
       false, Only::both, false, 5, 1u << 3, true},
      {"lora_a.o_proj",
       [](const Dims& x) {
         return S{x.b, x.s, x.r};
       },
       false, Only::both, false, 5, 1u << 3},
      {"h_mid",
       [](const Dims& x) {
         return S{x.b, x.s, x.h};
       },
       false, Only::both, false, 4},
      {"rstd2",
       [](const Dims& x) {
         return S{x.b, x.s};
       },
       true, Only::both, false, 4},
      {"xn2",
       [](const Dims& x) {
         return S{x.b, x.s, x.h};
       },
       false, Only::both, false, 3},
      // docs/native-plan.md, "Mixture of experts": forward 1-2, freed in backward 1-3.
      {"router_probs",
       [](const Dims& x) {
         return S{x.b, x.s, x.E};
       },
       true, Only::both, false, 3, 0, false, 2},
      {"topk_idx",
       [](const Dims& x) {
         return S{x.b, x.s, x.K};
       },
       false, Only::both, false, 3, 0, false, 2, true},
      {"topk_weight",
       [](const Dims& x) {
         return S{x.b, x.s, x.K};
       },
       true, Only::both, false, 3, 0, false, 2},
      {"expert_pos",
       [](const Dims& x) {
         return S{x.b, x.s, x.K};
       },
       false, Only::both, false, 3, 0, false, 2, true},
      {"expert_offsets", [](const Dims& x) { return S{x.E + 1}; }, false, Only::both, false, 3, 0,
       false, 2, true},
      {"expert_in",
       [](const Dims& x) {
         return S{x.b * x.s * x.K, x.h};
       },
       false, Only::both, false, 3, 0, false, 2},
      {"expert_gate",
       [](const Dims& x) {
         return S{x.b * x.s * x.K, x.m};
       },
       false, Only::both, false, 2, 0, false, 2},
      {"expert_up",
       [](const Dims& x) {
         return S{x.b * x.s * x.K, x.m};
       },
       false, Only::both, false, 2, 0, false, 2},
      {"expert_act",
       [](const Dims& x) {
         return S{x.b * x.s * x.K, x.m};
       },
       false, Only::both, false, 1, 0, false, 2},
      {"expert_out",
       [](const Dims& x) {
         return S{x.b * x.s * x.K, x.h};
       },
       false, Only::both, false, 1, 0, false, 2},
      // Qwen2-MoE's shared expert (kind 3), forward after the experts, freed in backward step 3.
      {"shared_gate",
       [](const Dims& x) {
         return S{x.b, x.s, x.ms};
       },
       false, Only::both, false, 3, 0, false, 3},
      {"shared_up",
       [](const Dims& x) {
         return S{x.b, x.s, x.ms};
       },
       false, Only::both, false, 3, 0, false, 3},
      {"shared_act",
       [](const Dims& x) {
         return S{x.b, x.s, x.ms};
       },
       false, Only::both, false, 3, 0, false, 3},
      {"shared_out",
       [](const Dims& x) {
         return S{x.b, x.s, x.h};
       },
       false, Only::both, false, 3, 0, false, 3},
      {"shared_score",
       [](const Dims& x) {
         return S{x.b, x.s};
       },
       false, Only::both, false, 3, 0, false, 3},
      {"gate",
       [](const Dims& x) {
         return S{x.b, x.s, x.i};
       },
       false, Only::both, false, 2, 0, false, 1},
      {"up",
       [](const Dims& x) {
         return S{x.b, x.s, x.i};
       },
       false, Only::both, false, 2, 0, false, 1},
      {"lora_mask.gate_proj",
       [](const Dims& x) {
         return S{x.b, x.s, x.h};
       },
       false, Only::both, false, 3, 1u << 4, true},
      {"lora_a.gate_proj",
       [](const Dims& x) {
         return S{x.b, x.s, x.r};
       },
       false, Only::both, false, 3, 1u << 4},
      {"lora_mask.up_proj",
       [](const Dims& x) {
         return S{x.b, x.s, x.h};
       },
       false, Only::both, false, 3, 1u << 5, true},
      {"lora_a.up_proj",
       [](const Dims& x) {
         return S{x.b, x.s, x.r};
       },
       false, Only::both, false, 3, 1u << 5},
      {"act",
       [](const Dims& x) {
         return S{x.b, x.s, x.i};
       },
       false, Only::both, false, 1, 0, false, 1},
      {"lora_mask.down_proj",
       [](const Dims& x) {
         return S{x.b, x.s, x.i};
       },
       false, Only::both, false, 1, 1u << 6, true},
      {"lora_a.down_proj",
       [](const Dims& x) {
         return S{x.b, x.s, x.r};
       },
       false, Only::both, false, 1, 1u << 6},
      {"out",
       [](const Dims& x) {
         return S{x.b, x.s, x.h};
       },
       false, Only::both, false, 0},
  };
  return rows;
}
// The frees of the layer's backward in order, as the plan's steps list them (each adapter's mask
// right after its row): 1 act, lora_a.down; 2 gate, up; 3 xn2, lora_a.gate, lora_a.up; 4 h_mid,
// rstd2; 5 lora_a.o; 6 attn_out, probs|lse; 7 q_pre, q_rstd, k_pre, k_rstd; 8 q, k, v,
// lora_a.q, lora_a.k, lora_a.v, xn1; 9 rstd1.
const std::vector<std::string> kPlanFreeOrder = {"act",
                                                 "lora_a.down_proj",
                                                 "lora_mask.down_proj",
                                                 "expert_out",
                                                 "expert_act",
                                                 "gate",
                                                 "up",
                                                 "expert_gate",
                                                 "expert_up",
                                                 "xn2",
                                                 "lora_a.gate_proj",
                                                 "lora_mask.gate_proj",
                                                 "lora_a.up_proj",
                                                 "lora_mask.up_proj",
                                                 "expert_in",
                                                 "router_probs",
                                                 "topk_idx",
                                                 "topk_weight",
                                                 "expert_pos",
                                                 "expert_offsets",
                                                 "shared_gate",
                                                 "shared_up",
                                                 "shared_act",
                                                 "shared_out",
                                                 "shared_score",
                                                 "h_mid",
                                                 "rstd2",
                                                 "lora_a.o_proj",
                                                 "lora_mask.o_proj",
                                                 "attn_out",
                                                 "probs",
                                                 "lse",
                                                 "q_pre",
                                                 "q_rstd",
                                                 "k_pre",
                                                 "k_rstd",
                                                 "q",
                                                 "k",
                                                 "v",
                                                 "lora_a.q_proj",
                                                 "lora_mask.q_proj",
                                                 "lora_a.k_proj",
                                                 "lora_mask.k_proj",
                                                 "lora_a.v_proj",
                                                 "lora_mask.v_proj",
                                                 "xn1",
                                                 "rstd1"};

const PlanRow& plan_row(const std::string& name) {
  for (const auto& r : plan_rows())
    if (name == r.name) return r;
  throw Error("test: no plan row " + name);
}

bool plan_allocates(const PlanRow& r, const ModelConfig& m, Attention at, unsigned lora = 0,
                    bool dropout = false) {
  if (r.qk_norm && !m.qk_norm) return false;
  if ((r.kind == 1 && m.moe()) || (r.kind == 2 && !m.moe())) return false;
  if (r.kind == 3 && (!m.moe() || m.shared_expert_intermediate == 0)) return false;
  if (r.lora != 0 && (lora & r.lora) == 0) return false;
  if (r.mask && !dropout) return false;
  if (r.attention == Only::eager) return at == Attention::eager;
  if (r.attention == Only::flash) return at == Attention::flash;
  return true;
}

struct Expected {
  std::string name;
  std::vector<std::int64_t> shape;
  DType dtype;
  std::uint64_t bytes;
};
// The plan's rows for (model, train) in allocation order: the forward's, or the recompute's
// (step 0: the same rows but `out`, only under checkpointing full).
std::vector<Expected> expected_rows(const ModelConfig& m, const TrainConfig& t, bool recompute) {
  std::vector<Expected> out;
  if (recompute && t.checkpointing != Checkpointing::full) return out;
  const std::int64_t d = m.explicit_head_dim ? m.explicit_head_dim : m.hidden / m.heads;
  const Dims x{t.batch,
               t.seq,
               m.hidden,
               m.intermediate,
               m.heads,
               m.kv_heads,
               d,
               t.lora_rank,
               m.experts,
               m.experts_per_token,
               m.expert_intermediate,
               m.shared_expert_intermediate};
  for (const auto& r : plan_rows()) {
    if (!plan_allocates(r, m, t.attention, t.lora_targets, t.lora_dropout > 0) ||
        (recompute && r.freed_at == 0))
      continue;
    Expected e{r.name, r.shape(x),
               r.f32    ? DType::f32
               : r.mask ? DType::u8
               : r.i32  ? DType::i32
                        : t.dtype,
               0};
    std::uint64_t n = 1;
    for (auto v : e.shape) n *= std::uint64_t(v);
    e.bytes = n * (r.f32 || r.i32 ? 4u : r.mask ? 1u : (t.dtype == DType::f32 ? 4u : 2u));
    out.push_back(std::move(e));
  }
  return out;
}

struct ActsMode {
  Attention attn;
  Checkpointing ckpt;
};

std::string mode_name(const ::testing::TestParamInfo<ActsMode>& info) {
  return std::string(info.param.attn == Attention::eager ? "eager" : "flash") + "_" +
         (info.param.ckpt == Checkpointing::full ? "full" : "none");
}

class LayerActsTable : public ::testing::TestWithParam<ActsMode> {};

// Records of layer l's activations allocated in `phase` during step 1, in allocation order.
std::vector<const TensorRecord*> layer_records(const Ledger& ledger, int l, Phase phase) {
  std::vector<const TensorRecord*> out;
  for (const auto& r : ledger.tensors())
    if (r.category == Category::activations && r.layer == l && r.phase == phase && r.step == 1)
      out.push_back(&r);
  return out;
}

void expect_listing(const std::vector<Expected>& want,
                    const std::vector<const TensorRecord*>& got) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t j = 0; j < want.size(); ++j) {
    SCOPED_TRACE("row " + std::to_string(j) + " " + want[j].name);
    EXPECT_EQ(got[j]->name, want[j].name);
    EXPECT_EQ(got[j]->shape, want[j].shape);
    EXPECT_EQ(got[j]->dtype, want[j].dtype);
    EXPECT_EQ(got[j]->bytes, want[j].bytes);
    EXPECT_NE(got[j]->free_seq, 0u) << "still alive after the step";
  }
}

// The table's own listing (layer_activation_plan: what the model allocates from) against the
// plan, row by row, with the free step of each row.
void expect_plan(const std::vector<PlannedActivation>& got, const std::vector<Expected>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t j = 0; j < want.size(); ++j) {
    SCOPED_TRACE("row " + std::to_string(j) + " " + want[j].name);
    EXPECT_EQ(got[j].name, want[j].name);
    EXPECT_EQ(got[j].shape, want[j].shape);
    EXPECT_EQ(got[j].dtype, want[j].dtype);
    EXPECT_EQ(got[j].category, Category::activations);
    EXPECT_EQ(got[j].bytes, want[j].bytes);
    EXPECT_EQ(got[j].row->freed_at_step, plan_row(want[j].name).freed_at);
  }
}

TEST(LayerActsTable, FreeOrderIsThePlans) {
  std::vector<std::string> got;
  for (LayerAct x : kBackwardFreeOrder) got.push_back(layer_act(x).name);
  EXPECT_EQ(got, kPlanFreeOrder);
  for (const LayerActSpec& row : kLayerActs) {
    SCOPED_TRACE(row.name);
    const PlanRow& want = plan_row(row.name);
    EXPECT_EQ(row.freed_at_step, want.freed_at);
    EXPECT_EQ(row.dtype == ActDType::f32, want.f32);
    EXPECT_EQ(row.dtype == ActDType::u8, want.mask);
    EXPECT_EQ(row.model == ForModel::qk_norm, want.qk_norm);
    EXPECT_EQ(row.model == ForModel::dense, want.kind == 1);
    EXPECT_EQ(row.model == ForModel::moe, want.kind == 2);
    EXPECT_EQ(row.model == ForModel::shared, want.kind == 3);
    EXPECT_EQ(row.dtype == ActDType::i32, want.i32);
    EXPECT_EQ(row.checkpointing == UnderCheckpointing::kept, want.freed_at == 0);
  }
  EXPECT_EQ(std::size(kLayerActs), plan_rows().size());
}

TEST_P(LayerActsTable, ForwardRecomputeAndFreesFollowThePlan) {
  const ActsMode md = GetParam();
  // Workspace buffers of a layer's backward and the step allocating each (docs/native-plan.md).
  const std::map<std::string, int> landmark_step = {
      {"d_act", 1},
      {"d_gate", 2},
      {"d_up", 2},
      {"d_xn2", 3},
      {"d_attn_out", 5},
      {"d_q", 6},
      {"d_k", 6},
      {"d_v", 6},
      {"d_probs", 6},
      {"attn_delta", 6},
      {"d_xn1", 8},
      {"d_q_pre", 7},
      {"d_k_pre", 7},
      // LoRA: each target's d_lora_a (the step of its projection's backward).
      {"d_lora_a.down_proj", 1},
      {"d_lora_a.gate_proj", 3},
      {"d_lora_a.up_proj", 3},
      {"d_lora_a.o_proj", 5},
      {"d_lora_a.q_proj", 8},
      {"d_lora_a.k_proj", 8},
      {"d_lora_a.v_proj", 8},
      // A mixture of experts' steps 1-3.
      {"d_expert_out", 1},
      {"d_topk_weight", 1},
      {"d_expert_act", 1},
      {"d_expert_gate", 2},
      {"d_expert_up", 2},
      {"d_expert_in", 3},
      {"d_router_logits", 3},
      {"d_shared_out", 3},
      {"d_shared_score", 3},
      {"d_shared_act", 3},
      {"d_shared_gate", 3},
      {"d_shared_up", 3}};
  // The full fine-tune, LoRA on all seven projections, LoRA on q, v and down (bits 0, 2, 6),
  // those three with dropout (0x145: bit 8 here says dropout).
  // Mixture of experts (tiny-mixtral, tiny-qwen3-moe): the full fine-tune only.
  for (unsigned mode : {0u, 0x7fu, 0x45u, 0x145u})
    for (const char* name :
         {"tiny-gqa", "tiny-awkward", "tiny-qwen3", "tiny-qwen2", "llama-narrow-mlp",
          "narrow-awkward", "tiny-mixtral", "tiny-qwen3-moe", "tiny-qwen2-moe-all"})
      for (DType dt : {DType::bf16, DType::f32}) {
        if (mode != 0 && any_config(name).moe()) continue;
        const unsigned lora = mode & 0x7fu;
        SCOPED_TRACE(std::string(name) + " " + dtype_name(dt) + " lora " + std::to_string(mode));
        const ModelConfig m = any_config(name);
        TrainConfig t = train_config(2, 7, dt, Optimizer::adamw, md.ckpt, md.attn);
        t.lora_rank = lora ? 3 : 0;
        t.lora_targets = lora;
        t.lora_dropout = (mode & 0x100u) ? 0.1 : 0.0;
        ModelRun run(BackendKind::meta, m, t);
        run.model->init_random(1);
        run.model->random_tokens(2);
        run.model->train_step();
        const Ledger& ledger = *run.ledger;
        const auto fwd_want = expected_rows(m, t, false);
        const auto rc_want = expected_rows(m, t, true);
        expect_plan(layer_activation_plan(m, t, ActPass::forward, m.moe()), fwd_want);
        expect_plan(layer_activation_plan(m, t, ActPass::recompute, m.moe()), rc_want);
        EXPECT_EQ(rc_want.empty(), md.ckpt == Checkpointing::none);

        for (int l = 0; l < m.layers; ++l) {
          SCOPED_TRACE("layer " + std::to_string(l));
          const auto fwd = layer_records(ledger, l, Phase::forward);
          const auto rc = layer_records(ledger, l, Phase::recompute);
          expect_listing(fwd_want, fwd);
          expect_listing(rc_want, rc);
          if (testing::Test::HasFailure()) return;

          // Alive at the end of forward: every row, or only `out` under checkpointing.
          std::uint64_t kept = 0;
          for (const auto& e : fwd_want)
            if (md.ckpt == Checkpointing::none || e.name == "out") kept += e.bytes;
          EXPECT_EQ(run.model->activations_by_layer()[std::size_t(l) + 1], kept);

          // The records the backward frees: the forward's (none) or the recompute's (full).
          auto by_free = [](std::vector<const TensorRecord*> v) {
            std::sort(v.begin(), v.end(),
                      [](auto* x, auto* y) { return x->free_seq < y->free_seq; });
            return v;
          };
          std::vector<std::string> freed_order, want_order;
          std::vector<const TensorRecord*> freed_by_backward;
          if (md.ckpt == Checkpointing::full) {
            // Forward: every row but `out` in reverse allocation order, right after `out`; `out`
            // later, by its consumer.
            std::vector<std::string> got, want;
            for (const auto* r : by_free(fwd)) got.push_back(r->name);
            for (auto it = fwd_want.rbegin(); it != fwd_want.rend(); ++it)
              if (it->name != "out") want.push_back(it->name);
            want.push_back("out");
            EXPECT_EQ(got, want);
            // ... as the events right after `out`'s allocation.
            const TensorRecord* out = fwd.back();
            ASSERT_EQ(out->name, "out");
            const auto freed = by_free(fwd);
            for (std::size_t j = 0; j + 1 < freed.size(); ++j)
              EXPECT_EQ(freed[j]->free_seq, out->alloc_seq + j + 1) << freed[j]->name;
            freed_by_backward = rc;
          } else {
            for (const auto* r : fwd)
              if (r->name != "out") freed_by_backward.push_back(r);
          }
          for (const auto* r : by_free(freed_by_backward)) freed_order.push_back(r->name);
          for (const std::string& n : kPlanFreeOrder)
            if (plan_allocates(plan_row(n), m, t.attention, t.lora_targets, t.lora_dropout > 0))
              want_order.push_back(n);
          EXPECT_EQ(freed_order, want_order);

          // Each row freed in its backward step: after every landmark of the steps up to it,
          // before every landmark of the later steps.
          std::vector<std::pair<int, const TensorRecord*>> landmarks;
          for (const auto& r : ledger.tensors())
            if (r.category == Category::workspace && r.layer == l && r.step == 1 &&
                r.phase == Phase::backward && landmark_step.count(r.name))
              landmarks.push_back({landmark_step.at(r.name), &r});
          // d_attn_out, d_q, d_k, d_v, d_probs|attn_delta, d_xn1 (+ d_q_pre, d_k_pre), and the
          // MLP's: d_act, d_gate, d_up, d_xn2, or a MoE layer's seven and d_xn2.
          ASSERT_EQ(landmarks.size(), 6u + (m.qk_norm ? 2u : 0u) + (m.moe() ? 8u : 4u) +
                                          (m.shared_expert_intermediate > 0 ? 5u : 0u) +
                                          unsigned(__builtin_popcount(lora)));
          for (const auto* r : freed_by_backward) {
            const int step = plan_row(r->name).freed_at;
            for (const auto& [lm_step, lm] : landmarks) {
              if (lm_step <= step)
                EXPECT_GT(r->free_seq, lm->alloc_seq) << r->name << " vs " << lm->name;
              else
                EXPECT_LT(r->free_seq, lm->alloc_seq) << r->name << " vs " << lm->name;
            }
          }
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Modes, LayerActsTable,
                         ::testing::Values(ActsMode{Attention::eager, Checkpointing::none},
                                           ActsMode{Attention::eager, Checkpointing::full},
                                           ActsMode{Attention::flash, Checkpointing::none},
                                           ActsMode{Attention::flash, Checkpointing::full}),
                         mode_name);

TEST(LayerActsTable, QkNormRowsOnlyForQkNormModels) {
  // Independent of the table: Qwen3's per-layer extras are q_pre (b,s,a·d), k_pre (b,s,k·d) in D
  // and q_rstd (b,s,a), k_rstd (b,s,k) in f32; the other families allocate none of them.
  const TrainConfig t =
      train_config(2, 5, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::flash);
  for (const std::string& name : family_names()) {
    const ModelConfig m = any_config(name);
    const auto plan = layer_activation_plan(m, t, ActPass::forward, m.moe());
    std::map<std::string, std::uint64_t> bytes;
    for (const auto& p : plan) bytes[p.name] = p.bytes;
    const std::uint64_t d = m.head_dim(), a = m.heads, k = m.kv_heads;
    EXPECT_EQ(bytes.count("q_pre"), m.qk_norm ? 1u : 0u) << name;
    if (!m.qk_norm) continue;
    EXPECT_EQ(d, 16u);
    EXPECT_EQ(bytes["q_pre"], 2u * 5 * a * d * 2);
    EXPECT_EQ(bytes["k_pre"], 2u * 5 * k * d * 2);
    EXPECT_EQ(bytes["q_rstd"], 2u * 5 * a * 4);
    EXPECT_EQ(bytes["k_rstd"], 2u * 5 * k * 4);
    EXPECT_EQ(bytes["q"], 2u * 5 * 64 * 2);  // a·d = 64 != h = 48
    EXPECT_EQ(bytes["attn_out"], 2u * 5 * 64 * 2);
  }
  EXPECT_EQ(act_shape_letters(layer_act(LayerAct::q_rstd).shape), "(b,s,a)");
  EXPECT_EQ(act_shape_letters(layer_act(LayerAct::k_rstd).shape), "(b,s,k)");
}

TEST(LayerActsTable, Listing) {
  EXPECT_EQ(act_shape_letters(layer_act(LayerAct::q).shape), "(b,s,a·d)");
  EXPECT_EQ(act_shape_letters(layer_act(LayerAct::k).shape), "(b,s,k·d)");
  EXPECT_EQ(act_shape_letters(layer_act(LayerAct::probs).shape), "(b,a,s,s)");
  EXPECT_EQ(act_freed_when(layer_act(LayerAct::lse), Checkpointing::none),
            "freed at step 6 of the layer's backward");
  EXPECT_EQ(act_freed_when(layer_act(LayerAct::rstd1), Checkpointing::full),
            "freed after the layer's out, recomputed in backward, then freed at step 9 of the "
            "layer's backward");
  EXPECT_EQ(act_freed_when(layer_act(LayerAct::out), Checkpointing::full),
            "freed by its consumer: step 9 of the next layer's backward (head step 3 for the "
            "last layer)");
}

}  // namespace
}  // namespace trainmem::test
