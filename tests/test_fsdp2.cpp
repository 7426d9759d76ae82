// Per-parameter sharding (--sharding per-parameter, --fsdp2; docs/distributed.md, "FSDP2:
// per-parameter sharding") against real PyTorch FSDP2: tests/data/fsdp2/*.json hold what
// fully_shard (torch 2.15, gloo on the CPU) allocated on every rank of 18 configurations
// (tools/fsdp2_states.py; docs/fsdp2-measured.md), odd shapes and ranks that own no row
// included. Checked per rank, byte for byte: the per-rank analytic's parameters and gradients
// against the distinct storages FSDP2 allocated (padded chunks), the optimizer states' owned
// elements against exp_avg and exp_avg_sq (unpadded), AdamW's step scalars against the host
// bytes; and the meta trace of every rank against its analytic.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "layout_trace_helpers.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/parallel.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/sharded_step.hpp"

namespace trainmem {
namespace {

using nlohmann::json;

struct Golden {
  std::string name;
  json doc;
};

std::vector<Golden> goldens() {
  std::vector<Golden> out;
  const std::filesystem::path dir = std::filesystem::path(TRAINMEM_TEST_DATA_DIR) / "fsdp2";
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".json") continue;
    std::ifstream in(e.path());
    out.push_back({e.path().stem().string(), json::parse(in)});
  }
  std::sort(out.begin(), out.end(),
            [](const Golden& a, const Golden& b) { return a.name < b.name; });
  return out;
}

// The golden's LlamaForCausalLM as a trainmem model (no biases, untied, its head_dim when set).
ModelConfig model_of(const json& cfg) {
  const json& l = cfg["llama"];
  ModelConfig m = *find_preset("tiny");
  m.name = "fsdp2-" + cfg["shape"].get<std::string>();
  m.hidden = l["hidden_size"];
  m.intermediate = l["intermediate_size"];
  m.heads = l["num_attention_heads"];
  m.kv_heads = l["num_key_value_heads"];
  m.layers = l["num_hidden_layers"];
  m.vocab = l["vocab_size"];
  m.tied_embeddings = l["tie_word_embeddings"];
  if (l.contains("head_dim")) m.explicit_head_dim = l["head_dim"];
  m.validate();
  return m;
}

TrainConfig train_of(const json& cfg) {
  TrainConfig t;
  t.batch = cfg["batch"];
  t.seq = cfg["sequence"];
  t.dtype = cfg["dtype"] == "bf16" ? DType::bf16 : DType::f32;
  t.optimizer = Optimizer::adamw;
  return t;
}

ParallelConfig fsdp2(std::int64_t n, const ModelConfig& m, const TrainConfig& t) {
  ParallelConfig p;
  p.world = n;
  p.zero = 3;
  p.sharding = Sharding::per_parameter;
  p.resolve(false, m, t);
  return p;
}

TEST(Fsdp2, GoldensCoverTheMeasuredShapes) {
  const std::vector<Golden> g = goldens();
  ASSERT_EQ(g.size(), 18u);  // 3 shapes × 2 dtypes × N 2, 3, 4 (docs/fsdp2-measured.md)
  int zero_row_ranks = 0;
  for (const Golden& x : g)
    for (const json& r : x.doc["ranks"])
      for (const json& q : r["params"])
        if (q["local_shape"][0] == 0) ++zero_row_ranks;
  EXPECT_GT(zero_row_ranks, 0) << "no rank owning zero rows of a parameter: the edge is untested";
}

// Every rank of every golden: parameters and gradients as FSDP2 allocates them (the padded
// chunk of every parameter), the states' elements as it creates them (the owned rows).
TEST(Fsdp2, ParamsGradsStatesByteExactPerRank) {
  for (const Golden& x : goldens()) {
    const json& cfg = x.doc["config"];
    const ModelConfig m = model_of(cfg);
    const TrainConfig t = train_of(cfg);
    const std::int64_t n = x.doc["nprocs"];
    const ParallelConfig p = fsdp2(n, m, t);
    const std::uint64_t e = dtype_size(t.dtype);
    ASSERT_EQ(x.doc["ranks"].size(), std::size_t(n)) << x.name;
    for (const json& r : x.doc["ranks"]) {
      const std::int64_t k = r["rank"];
      const std::string at = x.name + " rank " + std::to_string(k);
      const json& tot = r["totals"];
      const RankEstimate re = estimate_layout_of_rank(m, t, p, k).ranks.at(0);
      EXPECT_EQ(re.est.figures.params, tot["params"]["storage_bytes"].get<std::uint64_t>()) << at;
      EXPECT_EQ(re.est.figures.gradients, tot["grads"]["storage_bytes"].get<std::uint64_t>()) << at;
      EXPECT_EQ(re.owned_elements * e, tot["exp_avg"]["storage_bytes"].get<std::uint64_t>()) << at;
      EXPECT_EQ(re.owned_elements * e, tot["exp_avg_sq"]["storage_bytes"].get<std::uint64_t>())
          << at;
      // The logical (unpadded) local tensors: what the rank owns.
      EXPECT_EQ(re.owned_elements * e, tot["params"]["logical_bytes"].get<std::uint64_t>()) << at;
      // fp32: trainmem's AdamW keeps m and v alone, as torch's does for an fp32 model; bf16:
      // trainmem adds its fp32 master and keeps m, v in fp32 (12 B per owned element), where
      // FSDP2 without a MixedPrecisionPolicy keeps m and v in bf16.
      const std::uint64_t torch_states = tot["exp_avg"]["storage_bytes"].get<std::uint64_t>() +
                                         tot["exp_avg_sq"]["storage_bytes"].get<std::uint64_t>();
      if (t.dtype == DType::f32)
        EXPECT_EQ(re.est.figures.optimizer_states, torch_states) << at;
      else
        EXPECT_EQ(re.est.figures.optimizer_states, torch_states / 4 * 12) << at;
      // AdamW's `step`, one fp32 scalar per parameter, in host memory.
      EXPECT_EQ(re.host_bytes, tot["step"]["storage_bytes"].get<std::uint64_t>()) << at;
      EXPECT_EQ(re.shard_elements * e, tot["params"]["storage_bytes"].get<std::uint64_t>()) << at;
      EXPECT_EQ(re.grad_rank, k) << at;
    }
  }
}

// The closed form of docs/fsdp2-measured.md, parameter by parameter: the golden's local and
// padded shapes are rows(r, k) and chunk(r) of every parameter's global rows.
TEST(Fsdp2, ChunkRowsAreTorchChunks) {
  for (const Golden& x : goldens()) {
    const std::uint64_t n = x.doc["nprocs"];
    for (const json& r : x.doc["ranks"]) {
      const std::uint64_t k = r["rank"];
      for (const json& q : r["params"]) {
        const std::uint64_t rows = q["global_shape"][0];
        EXPECT_EQ(shard_owned_rows(rows, n, k), q["local_shape"][0].get<std::uint64_t>())
            << x.name << " rank " << k << " " << q["name"];
        EXPECT_EQ(shard_chunk_rows(rows, n), q["padded_shape"][0].get<std::uint64_t>())
            << x.name << " rank " << k << " " << q["name"];
      }
    }
  }
}

// The meta trace of every rank of the goldens' layouts (and of tp, cp and checkpointing beside
// them) equals the per-rank analytic of the same rank.
TEST(Fsdp2, MetaTraceEqualsAnalyticPerRank) {
  for (const Golden& x : goldens()) {
    const json& cfg = x.doc["config"];
    const ModelConfig m = model_of(cfg);
    const TrainConfig t = train_of(cfg);
    const std::int64_t n = x.doc["nprocs"];
    const ParallelConfig p = fsdp2(n, m, t);
    for (std::int64_t k = 0; k < n; ++k) {
      const RankEstimate want = estimate_layout_of_rank(m, t, p, k).ranks.at(0);
      MetaAllocator alloc;
      Ledger ledger(alloc);
      ShardedStep step(m, t, p, 0, ledger, nullptr, k);
      step.train_step();
      step.train_step();
      const MemoryFigures got = measured_figures(ledger);
      const std::string at = x.name + " rank " + std::to_string(k);
      EXPECT_EQ(got.params, want.est.figures.params) << at;
      EXPECT_EQ(got.gradients, want.est.figures.gradients) << at;
      EXPECT_EQ(got.optimizer_states, want.est.figures.optimizer_states) << at;
      EXPECT_EQ(got.peak, want.est.figures.peak) << at;
      EXPECT_EQ(got.peak_breakdown, want.est.figures.peak_breakdown) << at;
      EXPECT_EQ(step.host_bytes(), want.host_bytes) << at;
    }
  }
  // Other layouts under per-parameter sharding, stage by stage (rank 0: the most rows).
  const ModelConfig awk = [] {
    ModelConfig m = *find_preset("tiny-awkward");
    m.explicit_head_dim = 6;  // k_proj, v_proj of 6 rows: rank 3 of 4 owns none
    return m;
  }();
  for (const char* name : {"tiny", "tiny-qwen2", "tiny-qwen3", "tiny-awkward"}) {
    const ModelConfig m = std::string(name) == "tiny-awkward" ? awk : *find_preset(name);
    for (const auto ck : {Checkpointing::none, Checkpointing::full}) {
      TrainConfig t;
      t.batch = 2;
      t.seq = 16;
      t.checkpointing = ck;
      t.attention = Attention::flash;
      for (const int tp : {1, 2}) {
        if (tp == 2 && (m.heads % 2 || m.kv_heads % 2 || m.vocab % 2 || m.intermediate % 2))
          continue;
        for (const int cp : {1, 2}) {
          ParallelConfig p;
          p.world = 4 * tp * cp;
          p.tp = tp;
          p.cp = cp;
          p.zero = 3;
          p.sharding = Sharding::per_parameter;
          p.resolve(false, m, t);
          test::expect_trace_equals_layout(m, t, p,
                                           std::string(name) + " tp " + std::to_string(tp) +
                                               " cp " + std::to_string(cp) +
                                               (ck == Checkpointing::full ? " ckpt" : ""));
        }
      }
    }
  }
}

// Flat and per-parameter sharding of the same layout differ only in the model states and the
// host's step scalars; the activations and the buffers are the same step's.
TEST(Fsdp2, OnlyTheStatesDifferFromFlatZero3) {
  ModelConfig m = *find_preset("tiny-awkward");
  m.explicit_head_dim = 6;
  TrainConfig t;
  t.batch = 2;
  t.seq = 16;
  ParallelConfig flat;
  flat.world = 4;
  flat.zero = 3;
  flat.resolve(false, m, t);
  ParallelConfig pp = flat;
  pp.sharding = Sharding::per_parameter;
  const RankEstimate a = estimate_layout(m, t, flat).ranks.at(0);
  const RankEstimate b = estimate_layout(m, t, pp).ranks.at(0);
  EXPECT_EQ(a.est.figures.activations_peak, b.est.figures.activations_peak);
  EXPECT_EQ(a.est.figures.workspace, b.est.figures.workspace);
  EXPECT_EQ(a.local_params, b.local_params);
  // By hand (V 71, h 40, i 104, 3 layers, q 30 rows, k/v 6 rows; N 4). Chunks of ceil(rows/4):
  // embed and lm_head 18·40 = 720 each, the final norm 10; per layer norms 2·10, q 8·40 = 320,
  // k and v 2·40 = 80 each, o 10·30 = 300, gate and up 26·40 = 1,040 each, down 10·104 = 1,040:
  // 3,920. Shard 720·2 + 10 + 3·3,920 = 13,210; the flat vector's ceil(52,040/4) = 13,010.
  // Rank 3 owns 71 − 54 = 17 rows of embed and lm_head (680 each), 30 − 24 = 6 of q (240),
  // none of k and v, whole chunks of the rest: 680·2 + 10 + 3·(20 + 240 + 300 + 2,080 + 1,040)
  // = 12,410; ranks 0-2 own whole chunks (13,210 each; 3·13,210 + 12,410 = 52,040 = P).
  EXPECT_EQ(a.local_params, 52040u);
  EXPECT_EQ(a.shard_elements, 13010u);
  EXPECT_EQ(b.shard_elements, 13210u);
  EXPECT_EQ(b.padding_elements, 4u * 13210 - 52040);
  const RankEstimate last = estimate_layout_of_rank(m, t, pp, 3).ranks.at(0);
  EXPECT_EQ(b.owned_elements, 13210u);
  EXPECT_EQ(last.owned_elements, 12410u);
  EXPECT_EQ(last.est.figures.params, 13210u * 2);  // bf16, padded on every rank
  EXPECT_EQ(last.est.figures.gradients, 13210u * 2);
  EXPECT_EQ(last.est.figures.optimizer_states, 12410u * 12);  // fp32 master, m, v
  EXPECT_EQ(b.host_bytes, 4u * (3 + m.layers * 9));           // embed, norm, head; 9 per layer
}

// docs/distributed.md's worked example, from LLaMA-3-8B's dimensions alone: on 6 GPUs every
// 4,096-row parameter pads 2 rows (chunks of 683), k/v (1,024 rows) 2 (171), gate/up (14,336
// rows) 4 (2,390), the vocabulary (128,256) none; on 8 GPUs nothing pads, as in the flat vector.
TEST(Fsdp2, Llama3_8bWorkedExample) {
  const ModelConfig m = *find_preset("llama3-8b");
  TrainConfig t;
  t.batch = 1;
  t.seq = 4096;
  t.checkpointing = Checkpointing::full;
  t.attention = Attention::flash;
  auto layout = [&](std::int64_t n, Sharding s) {
    ParallelConfig p;
    p.world = n;
    p.zero = 3;
    p.sharding = s;
    p.resolve(false, m, t);
    return p;
  };
  const std::uint64_t P = 8030261248ull;
  const std::uint64_t per_layer_pad = 2 * 2 + 2 * 4096 + 2 * 2 * 4096 + 2 * 4096 + 2 * 4 * 4096 +
                                      2 * 14336;     // norms, q, k+v, o, gate+up, down
  const std::uint64_t pad = 32 * per_layer_pad + 2;  // + the final norm's
  EXPECT_EQ(pad, 3014786u);
  const LayoutEstimate fs = estimate_layout(m, t, layout(6, Sharding::per_parameter));
  const LayoutEstimate fl = estimate_layout(m, t, layout(6, Sharding::flat));
  const RankEstimate& r = fs.ranks.at(0);
  EXPECT_EQ(r.padding_elements, pad);
  EXPECT_EQ(r.shard_elements, (P + pad) / 6);
  EXPECT_EQ(r.est.figures.params, 2 * (P + pad) / 6);
  EXPECT_EQ(r.est.figures.params, 2677758678u);
  EXPECT_EQ(fl.ranks.at(0).est.figures.params, 2 * ((P + 5) / 6));
  EXPECT_EQ(fl.ranks.at(0).est.figures.params, 2676753750u);
  EXPECT_EQ(r.est.figures.optimizer_states, 16066552068u);
  EXPECT_EQ(estimate_layout_of_rank(m, t, layout(6, Sharding::per_parameter), 5)
                .ranks.at(0)
                .owned_elements,
            P - 5 * ((P + pad) / 6));
  EXPECT_EQ(r.host_bytes, 4u * 291);
  EXPECT_EQ(fs.worst_total(), 26889418416u);
  EXPECT_EQ(fl.worst_total(), 26881378992u);
  // 8 GPUs: the same bytes as flat ZeRO-3 (no padding either way).
  const RankEstimate a = estimate_layout(m, t, layout(8, Sharding::per_parameter)).ranks.at(0);
  const RankEstimate b = estimate_layout(m, t, layout(8, Sharding::flat)).ranks.at(0);
  EXPECT_EQ(a.padding_elements, 0u);
  EXPECT_EQ(a.est.figures.peak, b.est.figures.peak);
  EXPECT_EQ(a.est.figures.optimizer_states, b.est.figures.optimizer_states);
  EXPECT_EQ(a.est.figures.params, 2007565312u);
}

TEST(Fsdp2, RefusedLayoutsNameTheFlags) {
  const ModelConfig m = *find_preset("tiny");
  TrainConfig t;
  auto err = [&](ParallelConfig p, TrainConfig tt) {
    try {
      p.resolve(false, m, tt);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ParallelConfig p;
  p.world = 2;
  p.sharding = Sharding::per_parameter;
  p.zero = 2;
  EXPECT_NE(err(p, t).find("--sharding per-parameter with --zero 2"), std::string::npos)
      << err(p, t);
  p.zero = 3;
  p.offload = Offload::optimizer;
  EXPECT_NE(err(p, t).find("--offload optimizer"), std::string::npos) << err(p, t);
  p.offload = Offload::none;
  TrainConfig lora = t;
  lora.lora_rank = 4;
  lora.lora_targets = 1;
  EXPECT_NE(err(p, lora).find("--finetune"), std::string::npos) << err(p, lora);
  EXPECT_EQ(err(p, t), "no error");
  EXPECT_EQ(parse_sharding("per-parameter"), Sharding::per_parameter);
  EXPECT_EQ(parse_sharding("flat"), Sharding::flat);
  EXPECT_FALSE(parse_sharding("fsdp"));
}

}  // namespace
}  // namespace trainmem
