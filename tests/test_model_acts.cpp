// The activation table (include/trainmem/model_acts.hpp) against what the model actually
// allocates and frees, seen through the ledger's tensor records of a meta-backend step: for
// each attention variant x checkpointing mode, every layer's forward and recompute allocate
// exactly the table's listing (names, shapes, dtypes, bytes, order), checkpointing keeps the
// `kept` rows only, and the backward frees each row in the step the table says, in
// kBackwardFreeOrder. The backward's workspace landmarks (which step allocates which buffer)
// are taken from docs/native-plan.md here, not from the model.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "family_configs.hpp"
#include "model_helpers.hpp"
#include "trainmem/model_acts.hpp"

namespace trainmem::test {
namespace {

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

void expect_listing(const std::vector<PlannedActivation>& plan,
                    const std::vector<const TensorRecord*>& got) {
  ASSERT_EQ(got.size(), plan.size());
  for (std::size_t j = 0; j < plan.size(); ++j) {
    SCOPED_TRACE("row " + std::to_string(j) + " " + plan[j].name);
    EXPECT_EQ(got[j]->name, plan[j].name);
    EXPECT_EQ(got[j]->shape, plan[j].shape);
    EXPECT_EQ(got[j]->dtype, plan[j].dtype);
    EXPECT_EQ(got[j]->category, plan[j].category);
    EXPECT_EQ(got[j]->bytes, plan[j].bytes);
    EXPECT_NE(got[j]->free_seq, 0u) << "still alive after the step";
  }
}

TEST_P(LayerActsTable, ForwardRecomputeAndFreesFollowTheTable) {
  const ActsMode md = GetParam();
  // Workspace buffers of a layer's backward and the step allocating each (docs/native-plan.md).
  const std::map<std::string, int> landmark_step = {
      {"d_act", 1}, {"d_gate", 2},  {"d_up", 2},   {"d_xn2", 3},   {"d_attn_out", 5},
      {"d_q", 6},   {"d_k", 6},     {"d_v", 6},    {"d_probs", 6}, {"attn_delta", 6},
      {"d_xn1", 8}, {"d_q_pre", 7}, {"d_k_pre", 7}};
  for (const char* name : {"tiny-gqa", "tiny-awkward", "tiny-qwen3", "tiny-qwen2"})
    for (DType dt : {DType::bf16, DType::f32}) {
      SCOPED_TRACE(std::string(name) + " " + dtype_name(dt));
      const ModelConfig m = any_config(name);
      const TrainConfig t = train_config(2, 7, dt, Optimizer::adamw, md.ckpt, md.attn);
      ModelRun run(BackendKind::meta, m, t);
      run.model->init_random(1);
      run.model->random_tokens(2);
      run.model->train_step();
      const Ledger& ledger = *run.ledger;
      const auto fwd_plan = layer_activation_plan(m, t, ActPass::forward);
      const auto rc_plan = layer_activation_plan(m, t, ActPass::recompute);
      EXPECT_EQ(rc_plan.empty(), md.ckpt == Checkpointing::none);

      for (int l = 0; l < m.layers; ++l) {
        SCOPED_TRACE("layer " + std::to_string(l));
        const auto fwd = layer_records(ledger, l, Phase::forward);
        const auto rc = layer_records(ledger, l, Phase::recompute);
        expect_listing(fwd_plan, fwd);
        expect_listing(rc_plan, rc);
        if (testing::Test::HasFailure()) return;

        // Alive at the end of forward: every row, or the `kept` ones under checkpointing.
        std::uint64_t kept = 0;
        for (const auto& p : fwd_plan)
          if (md.ckpt == Checkpointing::none || p.row->checkpointing == UnderCheckpointing::kept)
            kept += p.bytes;
        EXPECT_EQ(run.model->activations_by_layer()[std::size_t(l) + 1], kept);

        // The records the backward frees: the forward's (none) or the recompute's (full).
        auto by_free = [](std::vector<const TensorRecord*> v) {
          std::sort(v.begin(), v.end(), [](auto* x, auto* y) { return x->free_seq < y->free_seq; });
          return v;
        };
        std::vector<std::string> freed_order, want_order;
        std::vector<const TensorRecord*> freed_by_backward;
        if (md.ckpt == Checkpointing::full) {
          // Forward: the recomputed rows in reverse allocation order, right after `out`; `out`
          // later, by its consumer.
          std::vector<std::string> got, want;
          for (const auto* r : by_free(fwd)) got.push_back(r->name);
          for (auto it = fwd_plan.rbegin(); it != fwd_plan.rend(); ++it)
            if (it->row->checkpointing == UnderCheckpointing::recomputed) want.push_back(it->name);
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
        for (LayerAct x : kBackwardFreeOrder)
          if (allocated_in(layer_act(x), m, t.attention, ActPass::forward))
            want_order.push_back(layer_act(x).name);
        EXPECT_EQ(freed_order, want_order);

        // Each row freed in its backward step: after every landmark of the steps up to it,
        // before every landmark of the later steps.
        std::vector<std::pair<int, const TensorRecord*>> landmarks;
        for (const auto& r : ledger.tensors())
          if (r.category == Category::workspace && r.layer == l && r.step == 1 &&
              r.phase == Phase::backward && landmark_step.count(r.name))
            landmarks.push_back({landmark_step.at(r.name), &r});
        ASSERT_EQ(landmarks.size(), m.qk_norm ? 12u : 10u);
        for (const auto* r : freed_by_backward) {
          const LayerActSpec* row = nullptr;
          for (const auto& spec : kLayerActs)
            if (r->name == spec.name) row = &spec;
          ASSERT_NE(row, nullptr);
          for (const auto& [step, lm] : landmarks) {
            if (step <= row->freed_at_step)
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
    const auto plan = layer_activation_plan(m, t, ActPass::forward);
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
