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

// A states golden and the trainmem layout of its run: the model, the run, N and FSDP2's layout.
struct Golden {
  std::string name;
  json doc;
  ModelConfig m;
  TrainConfig t;
  std::int64_t n = 0;
  ParallelConfig p;
};

std::vector<Golden> goldens() {
  std::vector<Golden> out;
  const std::filesystem::path dir = std::filesystem::path(TRAINMEM_TEST_DATA_DIR) / "fsdp2";
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    // The states' goldens (llama-<shape>-<dtype>-np<N>.json); gathers-np<N>.json are the gathers'.
    if (e.path().extension() != ".json" || e.path().stem().string().rfind("llama-", 0) != 0)
      continue;
    std::ifstream in(e.path());
    Golden g;
    g.name = e.path().stem().string();
    g.doc = json::parse(in);
    g.m = model_of(g.doc["config"]);
    g.t = train_of(g.doc["config"]);
    g.n = g.doc["nprocs"];
    g.p = fsdp2(g.n, g.m, g.t);
    out.push_back(std::move(g));
  }
  std::sort(out.begin(), out.end(),
            [](const Golden& a, const Golden& b) { return a.name < b.name; });
  return out;
}

// A named communication entry's bytes on the rank (0 when it has none).
std::uint64_t comm_bytes(const RankEstimate& e, const std::string& name) {
  for (const TensorEntry& c : e.communication)
    if (c.name == name) return c.bytes;
  return 0;
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
    const ModelConfig& m = x.m;
    const TrainConfig& t = x.t;
    const std::int64_t n = x.n;
    const ParallelConfig& p = x.p;
    const std::uint64_t e = dtype_size(t.dtype);
    ASSERT_EQ(x.doc["ranks"].size(), std::size_t(n)) << x.name;
    for (const json& r : x.doc["ranks"]) {
      const std::int64_t k = r["rank"];
      const std::string at = x.name + " rank " + std::to_string(k);
      const json& tot = r["totals"];
      const RankEstimate re = estimate_layout_of_rank(m, t, p, k).ranks.at(0);
      EXPECT_EQ(re.est.figures.params, tot["params"]["storage_bytes"].get<std::uint64_t>()) << at;
      EXPECT_EQ(re.shard_elements * e, tot["grads"]["storage_bytes"].get<std::uint64_t>()) << at;
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
    const ModelConfig& m = x.m;
    const TrainConfig& t = x.t;
    const std::int64_t n = x.n;
    const ParallelConfig& p = x.p;
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
      // FSDP2's buffers at their most (the communication category alone): the ledger's against
      // the analytic's instants.
      std::uint64_t comm = 0;
      for (const Instant& in : want.est.instants)
        comm = std::max(comm, in.bytes[int(Category::communication)]);
      EXPECT_EQ(ledger.peak(Category::communication), comm) << at;
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
        for (const int cp : {1, 2})
          for (const int prefetch : {0, 1, 2, 3, 4}) {
            // prefetch 3 stands for 1 with two micro-batches (gradients accumulated), 4 for 1
            // with reshard_after_forward=False.
            if (prefetch != 1 && (tp != 1 || cp != 1)) continue;
            ParallelConfig p;
            p.world = 4 * tp * cp;
            p.tp = tp;
            p.sp = tp == 2 && prefetch == 1 && cp == 1;  // sequence parallelism with tp
            p.cp = cp;
            p.zero = 3;
            p.prefetch = prefetch >= 3 ? 1 : prefetch;
            p.microbatches = prefetch == 3 ? 2 : 1;
            p.reshard_after_forward = prefetch != 4;
            p.sharding = Sharding::per_parameter;
            p.resolve(false, m, t);
            test::expect_trace_equals_layout(m, t, p,
                                             std::string(name) + " tp " + std::to_string(tp) +
                                                 " cp " + std::to_string(cp) + " prefetch " +
                                                 std::to_string(prefetch) +
                                                 (ck == Checkpointing::full ? " ckpt" : ""));
          }
      }
    }
  }
}

// A vocabulary far larger than a layer (V 50,000, h 64, one layer, b 1, s 4): the root (the
// embedding and lm_head, 2 × 50,000 × 64 bf16) dominates, so the moments FSDP2 holds it twice
// decide: the forward's all-gather copied out into the root's buffers, and the root's
// post-backward (its unsharded gradients beside its reduce-scatter input). The trace's peak and
// its communication peak equal the analytic's, and the communication peak is the forward's
// copy-out, twice the root's padded bytes.
TEST(Fsdp2, RootDominatedModel) {
  ModelConfig m = *find_preset("tiny");
  m.vocab = 50000;
  m.layers = 1;
  TrainConfig t;
  t.batch = 1;
  t.seq = 4;
  for (const std::int64_t M : {1, 2}) {
    ParallelConfig p;
    p.world = 2;
    p.zero = 3;
    p.microbatches = M;
    p.sharding = Sharding::per_parameter;
    p.resolve(false, m, t);
    const RankEstimate want = estimate_layout(m, t, p).ranks.at(0);
    MetaAllocator alloc;
    Ledger ledger(alloc);
    ShardedStep step(m, t, p, 0, ledger);
    step.train_step();
    step.train_step();
    const MemoryFigures got = measured_figures(ledger);
    const std::string at = "M " + std::to_string(M);
    EXPECT_EQ(got.peak, want.est.figures.peak) << at;
    EXPECT_EQ(got.peak_breakdown, want.est.figures.peak_breakdown) << at;
    EXPECT_EQ(got.gradients, want.est.figures.gradients) << at;
    const std::uint64_t root = 2u * (2 * 50000 * 64 + 64);  // N 2 divides every row count
    EXPECT_EQ(ledger.peak(Category::communication), 2 * root) << at;
    EXPECT_EQ(got.gradients, want.est.figures.gradients) << at;
  }
}

// Flat and per-parameter sharding of the same layout differ in the model states, the host's step
// scalars and the gathered units (FSDP2's padded unsharded buffers and its root unit); the
// activations are the same step's.
TEST(Fsdp2, StatesAndGathersAgainstFlatZero3) {
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
  EXPECT_EQ(last.shard_elements * 2, 13210u * 2);  // the sharded gradients after the backward
  // The gradient peak: layer 0's backward done, before its reduce-scatter: the two layers above
  // reduced (2·3,920), lm_head's and the final norm's unsharded gradients (71·40 + 40) and layer
  // 0's (15,440); the root's post-backward holds less (3·3,920 + 2·2,840 + 40).
  EXPECT_EQ(last.est.figures.gradients, 2u * (2 * 3920 + 2880 + 15440));
  EXPECT_EQ(last.est.figures.optimizer_states, 12410u * 12);  // fp32 master, m, v
  EXPECT_EQ(b.host_bytes, 4u * (3 + m.layers * 9));           // embed, norm, head; 9 per layer
  // Gathered, bf16, each parameter padded to 4·ceil(rows/4) rows: a layer 2·40 (norms) + 32·40
  // (q) + 2·8·40 (k, v) + 40·30 (o) + 2·104·40 (gate, up) + 40·104 (down) = 15,680 elements; the
  // root 2·72·40 (embedding, lm_head) + 40 (norm) = 5,800.
  EXPECT_EQ(comm_bytes(b, "gathered units"), 2u * 15680);
  EXPECT_EQ(comm_bytes(b, "gathered root"), 2u * 5800);
  EXPECT_EQ(comm_bytes(a, "gathered units"),
            2u * (80 + 1200 + 480 + 1200 + 8320 + 4160));  // unpadded
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
  // The root unit (embedding, final norm, lm_head), gathered all step: 2 × 128,256 × 4,096
  // (the vocabulary divides by 6) and the norm's 6 × 683 rows, bf16.
  auto root = [](const RankEstimate& e) { return comm_bytes(e, "gathered root"); };
  EXPECT_EQ(root(r), 2u * (2u * 128256 * 4096 + 6 * 683));
  // 8 GPUs: the same model states as flat ZeRO-3 (no padding either way); the root is still
  // gathered through the step (2 × (2 × 128,256 × 4,096 + 4,096) B), which flat ZeRO-3 gathers
  // as two units in their turn.
  const RankEstimate a = estimate_layout(m, t, layout(8, Sharding::per_parameter)).ranks.at(0);
  const RankEstimate b = estimate_layout(m, t, layout(8, Sharding::flat)).ranks.at(0);
  EXPECT_EQ(a.padding_elements, 0u);
  EXPECT_EQ(a.est.figures.params, b.est.figures.params);
  EXPECT_EQ(a.shard_elements, b.shard_elements);
  // FSDP2's gradient peak is the root's post-backward: the 32 layers' sharded gradients
  // (218,112,000 / 8 each) beside the root's unsharded ones (2 × 128,256 × 4,096 + 4,096).
  EXPECT_EQ(a.est.figures.gradients, 2ull * (32ull * 218112000 / 8 + 2ull * 128256 * 4096 + 4096));
  EXPECT_EQ(b.est.figures.gradients, 2u * (P / 8));
  EXPECT_EQ(a.est.figures.optimizer_states, b.est.figures.optimizer_states);
  EXPECT_EQ(a.est.figures.params, 2007565312u);
  EXPECT_EQ(root(a), 2u * (2u * 128256 * 4096 + 4096));
  EXPECT_EQ(root(b), 0u);
  EXPECT_GE(a.est.figures.peak_breakdown[int(Category::communication)], root(a));
}

// FSDP2's unsharded parameters against real fully_shard (tests/data/fsdp2/gathers-np<N>.json,
// tools/fsdp2_gathers.py: torch 2.15, gloo, bf16, the odd and oddheads shapes, N 2-4, every
// rank): the bytes of each unit while gathered equal trainmem's "gathered units" (a layer) and
// "gathered root" entries of that rank, the root is gathered at every event of the step until
// the backward ends, the forward holds one layer at a time and the backward two (the implicit
// prefetch trainmem's --prefetch 1 models).
// gathers-noreshard-np<N>.json: fully_shard(layer, reshard_after_forward=False) (--fsdp2 --zero
// SHARD_GRAD_OP): every layer gathered from its forward to its post-backward, three at once.
TEST(Fsdp2, GatheredUnitsMatchRealFullyShard) {
  int checked = 0;
  for (const bool reshard : {true, false})
    for (int n = 2; n <= 4; ++n) {
      const std::string file = std::string(reshard ? "gathers-np" : "gathers-noreshard-np") +
                               std::to_string(n) + ".json";
      std::ifstream in(std::string(TRAINMEM_TEST_DATA_DIR) + "/fsdp2/" + file);
      ASSERT_TRUE(in) << file;
      const json doc = json::parse(in);
      ASSERT_EQ(doc.value("reshard_after_forward", true), reshard) << file;
      ASSERT_EQ(doc["ranks"].size(), std::size_t(n));
      for (std::size_t k = 0; k < doc["ranks"].size(); ++k)
        for (const auto& [shape, got] : doc["ranks"][k].items()) {
          json cfg = {{"shape", shape},
                      {"dtype", "bf16"},
                      {"batch", 2},
                      {"sequence", 16},
                      {"llama",
                       {{"hidden_size", 128},
                        {"intermediate_size", 353},
                        {"num_attention_heads", 4},
                        {"num_key_value_heads", shape == "odd" ? 2 : 1},
                        {"num_hidden_layers", 3},
                        {"vocab_size", 1001},
                        {"tie_word_embeddings", false}}}};
          if (shape == "oddheads") cfg["llama"]["head_dim"] = 6;
          const ModelConfig m = model_of(cfg);
          const TrainConfig t = train_of(cfg);
          ParallelConfig p = fsdp2(n, m, t);
          p.reshard_after_forward = reshard;
          const RankEstimate r = estimate_layout_of_rank(m, t, p, std::int64_t(k)).ranks.at(0);
          const std::uint64_t units = comm_bytes(r, "gathered units");
          const std::uint64_t root = comm_bytes(r, "gathered root");
          const std::string at = file + " " + shape + " rank " + std::to_string(k);
          const json& ub = got["unit_bytes"];
          EXPECT_EQ(units, ub["layer0"].get<std::uint64_t>()) << at;
          EXPECT_EQ(units, ub["layer2"].get<std::uint64_t>()) << at;
          EXPECT_EQ(root, ub["root"].get<std::uint64_t>()) << at;
          bool backward = false;
          std::uint64_t fwd_layers = 0, bwd_layers = 0;
          for (const json& e : got["events"]) {
            const std::string ev = e[0];
            const json& live = e[1];  // root, layer0, layer1, layer2
            const std::uint64_t layers = live[1].get<std::uint64_t>() +
                                         live[2].get<std::uint64_t>() +
                                         live[3].get<std::uint64_t>();
            if (ev.rfind("after pre_backward", 0) == 0) backward = true;
            (backward ? bwd_layers : fwd_layers) =
                std::max(backward ? bwd_layers : fwd_layers, layers);
            const bool ended = ev == "after backward" || ev == "after post_backward root";
            EXPECT_EQ(live[0].get<std::uint64_t>(), ended ? 0 : root) << at << " " << ev;
          }
          EXPECT_EQ(fwd_layers, (reshard ? 1 : 3) * units) << at;
          EXPECT_EQ(bwd_layers, (reshard ? 2 : 3) * units) << at;
          ++checked;
        }
    }
  EXPECT_EQ(checked, 2 * 2 * (2 + 3 + 4));
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
  TrainConfig off = t;
  off.offload_activations = true;
  EXPECT_NE(err(p, off).find("--offload-activations"), std::string::npos) << err(p, off);
  EXPECT_EQ(err(p, t), "no error");
  ParallelConfig flat = p;
  flat.sharding = Sharding::flat;
  flat.reshard_after_forward = false;
  EXPECT_NE(err(flat, t).find("reshard_after_forward=False is FSDP2's"), std::string::npos)
      << err(flat, t);
  EXPECT_EQ(parse_sharding("per-parameter"), Sharding::per_parameter);
  EXPECT_EQ(parse_sharding("flat"), Sharding::flat);
  EXPECT_FALSE(parse_sharding("fsdp"));
}

}  // namespace
}  // namespace trainmem
