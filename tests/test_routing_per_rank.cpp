// Routing per rank (docs/distributed.md, "Routing per rank"): the file a measured multi-rank
// run's --dump-routing writes, read back and checked; the rows each rank's experts receive under
// it, worked by hand; every rank traced given it, the rows reaching the rank that holds the
// experts; and the command's report of the worst rank under the given and the balanced routing.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_in_process.hpp"
#include "family_configs.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/run/routing.hpp"
#include "trainmem/run/run_layout.hpp"

namespace trainmem {
namespace {

using cli::testing_in_process::contains;
using cli::testing_in_process::run_trainmem;

std::string write(const std::string& name, const nlohmann::json& doc) {
  const std::string path = ::testing::TempDir() + "routing_per_rank_" + name + ".json";
  std::ofstream(path) << doc.dump(1);
  return path;
}

std::string message_of(const std::string& path, const ModelConfig& m, const TrainConfig& t,
                       const ParallelConfig& p) {
  try {
    read_layout_routing_file(path, m, t, p);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

// tiny-qwen3-moe (E 8, K 2, two MoE layers) at b 1, s 11: every source routes 22 choices a layer.
struct MoeLayout {
  ModelConfig m = test::any_config("tiny-qwen3-moe");
  TrainConfig t;
  ParallelConfig p;
  explicit MoeLayout(std::int64_t world, std::int64_t ep, std::int64_t pp = 1, std::int64_t M = 1,
                     std::int64_t etp = 1) {
    t.batch = 1;
    t.seq = 11;
    t.dtype = DType::bf16;
    t.attention = Attention::flash;
    p.world = world;
    p.dp = world / pp;
    p.pp = pp;
    p.ep = ep;
    p.etp = etp;
    p.zero = 1;
    p.microbatches = M;
    p.resolve(true, m, t);
  }
};

// Four sources with different choices (each layer sums to 22).
const std::vector<std::vector<std::int64_t>> kLayer0 = {{3, 3, 3, 3, 3, 3, 2, 2},
                                                        {3, 3, 3, 3, 3, 2, 2, 3},
                                                        {3, 3, 3, 3, 2, 2, 3, 3},
                                                        {3, 3, 3, 2, 2, 3, 3, 3}};
const std::vector<std::vector<std::int64_t>> kLayer1 = {{6, 0, 0, 6, 0, 4, 4, 2},
                                                        {1, 1, 1, 1, 1, 1, 8, 8},
                                                        {0, 0, 0, 0, 11, 11, 0, 0},
                                                        {2, 2, 2, 2, 2, 2, 5, 5}};

LayoutRouting four_sources() {
  LayoutRouting r;
  r.source = "measured";
  for (std::int64_t rank = 0; rank < 4; ++rank)
    r.sources.push_back(
        {rank, 0, {{0, kLayer0[std::size_t(rank)], 0}, {1, kLayer1[std::size_t(rank)], 0}}});
  return r;
}

TEST(RoutingPerRank, ExpertRowsByHand) {
  // World 4 = dp 4, ep 2: ep groups {0, 1} and {2, 3}; index 0 holds experts 0-3, index 1 4-7.
  // Rank 0, layer 0: sources 0 and 1 to experts 0-3: 12 + 12 = 24; layer 1: 12 + 4 = 16.
  // Rank 1: layer 0: 10 + 10 = 20; layer 1: 10 + 18 = 28. Rank 2: 12 + 11 = 23; 0 + 8 = 8.
  // Rank 3: 10 + 11 = 21; 22 + 14 = 36.
  const MoeLayout s(4, 2);
  const LayoutRouting r = four_sources();
  const std::int64_t want[4][2] = {{24, 16}, {20, 28}, {23, 8}, {21, 36}};
  for (std::int64_t rank = 0; rank < 4; ++rank) {
    const auto rows = expert_rows_of(r, s.m, s.p, rank, 0);
    ASSERT_EQ(rows.size(), 2u) << rank;
    EXPECT_EQ(rows.at({0, 0}).r, want[rank][0]) << "rank " << rank;
    EXPECT_EQ(rows.at({0, 1}).r, want[rank][1]) << "rank " << rank;
    for (const auto& [key, n] : rows) EXPECT_EQ(n.a, n.r) << "etp 1: the rows received";
  }
  // ep 2 × etp 2 over the same 4 slots (edp 1): etp groups {0, 1} and {2, 3}, ep groups {0, 2}
  // and {1, 3}; slots 0-1 hold experts 0-3 (each half of every expert's width), 2-3 experts 4-7.
  // A: the ep group's sources for the rank's experts; R: every source's (the etp group's A).
  // Rank 0: A = s0 + s2 on 0-3: layer 0 12 + 12 = 24, layer 1 12 + 0 = 12; rank 1: s1 + s3:
  // 12 + 11 = 23, 4 + 8 = 12; R = 47 and 24 for both. Rank 2: s0 + s2 on 4-7: 10 + 10 = 20,
  // 10 + 22 = 32; rank 3: s1 + s3: 10 + 11 = 21, 18 + 14 = 32; R = 41 and 64.
  const MoeLayout se(4, 2, 1, 1, 2);
  const std::int64_t want_a[4][2] = {{24, 12}, {23, 12}, {20, 32}, {21, 32}};
  const std::int64_t want_r[4][2] = {{47, 24}, {47, 24}, {41, 64}, {41, 64}};
  for (std::int64_t rank = 0; rank < 4; ++rank) {
    const auto rows = expert_rows_of(r, se.m, se.p, rank, 0);
    for (int layer = 0; layer < 2; ++layer) {
      EXPECT_EQ(rows.at({0, layer}).a, want_a[rank][layer]) << "etp 2 rank " << rank;
      EXPECT_EQ(rows.at({0, layer}).r, want_r[rank][layer]) << "etp 2 rank " << rank;
    }
  }
  // ep 4 from the same choices: one group {0-3}, two experts each; rank 2 holds experts 4-5:
  // layer 0: 6 + 5 + 4 + 5 = 20; layer 1: 4 + 2 + 22 + 4 = 32.
  const MoeLayout s4(4, 4);
  const auto rows = expert_rows_of(r, s4.m, s4.p, 2, 0);
  EXPECT_EQ(rows.at({0, 0}).r, 20);
  EXPECT_EQ(rows.at({0, 1}).r, 32);
  // Balanced: 22 choices a source, experts 0-5 take 3 and 6-7 take 2 (balanced_routing), so
  // index 0 receives 2·12 = 24 rows and index 1 2·10 = 20 (docs/distributed.md's hand figures).
  const LayoutRouting bal = balanced_layout_routing(s.m, s.t, s.p);
  EXPECT_EQ(bal.sources.size(), 4u);
  EXPECT_EQ(expert_rows_of(bal, s.m, s.p, 0, 0).at({0, 1}).r, 24);
  EXPECT_EQ(expert_rows_of(bal, s.m, s.p, 3, 0).at({0, 0}).r, 20);
}

TEST(RoutingPerRank, ACapacityKeepsEachSourcesFirstChoicesPerExpert) {
  // --capacity-factor 0.5 at b 1, s 11: a rank's capacity is ⌈(11·2/8)·0.5⌉ = ⌈1.375⌉ = 2
  // (Megatron's get_capacity over the rank's own tokens); each source sends at most 2 of its
  // choices for every expert, so ep 2's rank 0 (experts 0-3, sources 0 and 1) receives
  // layer 0: 4·2 + 4·2 = 16 (every count is 3); layer 1: s0 {6,0,0,6} → 2 + 2, s1 {1,1,1,1} → 4:
  // 8. Rank 3 (experts 4-7, sources 2 and 3): layer 0: s2 {2,2,3,3} → 8, s3 {2,3,3,3} → 8: 16;
  // layer 1: s2 {11,11,0,0} → 4, s3 {2,2,5,5} → 8: 12.
  MoeLayout s(4, 2);
  s.t.capacity_factor = 0.5;
  const std::int64_t cap = rank_capacity(s.m, s.t, s.p);
  EXPECT_EQ(cap, 2);
  const LayoutRouting r = four_sources();
  EXPECT_EQ(expert_rows_of(r, s.m, s.p, 0, cap).at({0, 0}).r, 16);
  EXPECT_EQ(expert_rows_of(r, s.m, s.p, 0, cap).at({0, 1}).r, 8);
  EXPECT_EQ(expert_rows_of(r, s.m, s.p, 3, cap).at({0, 0}).r, 16);
  EXPECT_EQ(expert_rows_of(r, s.m, s.p, 3, cap).at({0, 1}).r, 12);
  // Balanced routing sends 3, 3, 3, 3, 3, 3, 2, 2: 2 of each kept, 16 rows on both indices
  // (24 and 20 without the capacity).
  const LayoutRouting bal = balanced_layout_routing(s.m, s.t, s.p);
  EXPECT_EQ(expert_rows_of(bal, s.m, s.p, 0, cap).at({0, 1}).r, 16);
  EXPECT_EQ(expert_rows_of(bal, s.m, s.p, 3, cap).at({0, 0}).r, 16);
  // Context parallelism 2 halves a rank's tokens (b·s/cp = 6 at s 12): ⌈(6·2/8)·0.5⌉ = 1.
  MoeLayout c(4, 2);
  c.t.seq = 12;
  c.t.capacity_factor = 0.5;
  c.p = {};
  c.p.world = 4;
  c.p.dp = 2;
  c.p.cp = 2;
  c.p.ep = 2;
  c.p.zero = 1;
  c.p.resolve(true, c.m, c.t);
  EXPECT_EQ(rank_capacity(c.m, c.t, c.p), 1);
}

TEST(RoutingPerRank, FilesRoundTripAndNameTheField) {
  const MoeLayout s(4, 2);
  const LayoutRouting r = four_sources();
  const nlohmann::json doc = layout_routing_json(s.m, s.t, s.p, r, 2);
  const std::string path = write("v2", doc);
  const LayoutRouting back = read_layout_routing_file(path, s.m, s.t, s.p);
  ASSERT_EQ(back.sources.size(), 4u);
  EXPECT_EQ(back.source, "file " + path);
  for (std::size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(back.sources[k].rank, std::int64_t(k));
    EXPECT_EQ(back.sources[k].layers, r.sources[k].layers) << k;
  }
  // The same file read for ep 4 (the choices do not depend on where the experts live).
  const MoeLayout s4(4, 4);
  EXPECT_EQ(read_layout_routing_file(path, s4.m, s4.t, s4.p).sources.size(), 4u);
  // One rank's file (a single-GPU --dump-routing at b 1, s 11) applied to every rank.
  const nlohmann::json one = {{"experts", 8},
                              {"experts_per_token", 2},
                              {"batch", 1},
                              {"seq", 11},
                              {"layers",
                               {{{"layer", 0}, {"tokens_per_expert", kLayer1[2]}},
                                {{"layer", 1}, {"tokens_per_expert", kLayer1[1]}}}}};
  const std::string one_path = write("v1", one);
  const LayoutRouting every = read_layout_routing_file(one_path, s.m, s.t, s.p);
  ASSERT_EQ(every.sources.size(), 4u);
  // Rank 1 (ep index 1, group {0, 1}): layer 0: 2·(11 + 11) = 44; layer 1: 2·(1 + 1 + 8 + 8).
  EXPECT_EQ(expert_rows_of(every, s.m, s.p, 1, 0).at({0, 0}).r, 44);
  EXPECT_EQ(expert_rows_of(every, s.m, s.p, 1, 0).at({0, 1}).r, 36);

  // Each mistake names its field.
  auto edited = [&](const char* name, auto&& edit) {
    nlohmann::json d = doc;
    edit(d);
    return message_of(write(name, d), s.m, s.t, s.p);
  };
  EXPECT_TRUE(contains(edited("world", [](auto& d) { d["world_size"] = 2; }),
                       "world_size: 2, but this layout has --world-size 4"));
  EXPECT_TRUE(contains(edited("twice", [](auto& d) { d["sources"][1]["rank"] = 0; }),
                       "sources[1].rank: rank 0, micro-batch 0 is given twice"));
  EXPECT_TRUE(contains(edited("short", [](auto& d) { d["sources"].erase(3); }),
                       "sources: not an array of world_size·microbatches = 4 entries"));
  EXPECT_TRUE(contains(
      edited("sum", [](auto& d) { d["sources"][2]["layers"][1]["tokens_per_expert"][0] = 1; }),
      "sources[2].layers[1].tokens_per_expert: sums to 23, but this rank's b·s·K = 22"));
  EXPECT_TRUE(contains(edited("mb", [](auto& d) { d["sources"][0]["micro_batch"] = 1; }),
                       "sources[0].micro_batch: 1 is outside [0, 1)"));
  EXPECT_TRUE(contains(edited("layer", [](auto& d) { d["sources"][0]["layers"][0]["layer"] = 1; }),
                       "sources[0].layers[0].layer: 1, expected 0"));
  // A one-rank file under context parallelism: a rank routes s/cp positions.
  MoeLayout cp(4, 2);
  cp.t.seq = 12;
  cp.p = ParallelConfig{};
  cp.p.world = 4;
  cp.p.dp = 2;
  cp.p.cp = 2;
  cp.p.ep = 2;
  cp.p.microbatches = 1;
  cp.p.resolve(true, cp.m, cp.t);
  EXPECT_TRUE(contains(message_of(one_path, cp.m, cp.t, cp.p),
                       "seq: 11, but a rank of this layout routes s/cp = 6 positions"));
  // The per-rank file given to one rank's trace.
  try {
    read_routing_file(path, s.m, s.t);
    ADD_FAILURE() << "a per-rank file read as one rank's";
  } catch (const InputError& e) {
    EXPECT_TRUE(contains(e.what(), "sources: a per-rank file")) << e.what();
  }
}

// Balanced choices reversed (experts 0-1 take 2, the others 3): the rows balanced routing sends
// to index 0 now reach index 1, so each index's trace is the other's balanced analytic, figure
// for figure, on every stage; and balanced routing given as a file is the balanced trace.
TEST(RoutingPerRank, TheRowsReachTheRankThatHoldsTheExperts) {
  for (std::int64_t pp : {1, 2}) {
    const MoeLayout s(4 * pp, 2, pp, 2);
    LayoutTrace lt = trace_layout(s.m, s.t, s.p, OverheadOptions{}, 2);
    LayoutRouting reversed = balanced_layout_routing(s.m, s.t, s.p);
    for (auto& src : reversed.sources)
      for (auto& rec : src.layers)
        std::reverse(rec.tokens_per_expert.begin(), rec.tokens_per_expert.end());
    trace_given_routing(lt, reversed);
    const LayoutEstimate other = estimate_layout_of_rank(s.m, s.t, s.p, 1);  // index 1, balanced
    ASSERT_EQ(lt.routed.size(), std::size_t(2 * pp)) << "two distinct ranks a stage";
    for (const RoutedRankTrace& r : lt.routed) {
      const std::string what = "pp " + std::to_string(pp) + " stage " + std::to_string(r.stage) +
                               " index " + std::to_string(r.ep_index);
      EXPECT_EQ(r.ranks.size(), 2u) << what;  // the two edp replicas of the index
      const LayoutEstimate& want = r.ep_index == 1 ? lt.analytic : other;
      const MemoryFigures& a = want.ranks.at(std::size_t(r.stage)).est.figures;
      EXPECT_EQ(r.ledger.activations_peak, a.activations_peak) << what;
      EXPECT_EQ(r.ledger.workspace, a.workspace) << what;
      EXPECT_EQ(r.ledger.peak, a.peak) << what;
      EXPECT_EQ(r.ledger.peak_breakdown, a.peak_breakdown) << what;
      EXPECT_TRUE(r.analytic_differences.empty()) << what;
      EXPECT_EQ(r.max_rows, r.ep_index == 1 ? 24 : 20) << what;
      EXPECT_EQ(r.balanced_rows, r.ep_index == 1 ? 20 : 24) << what;
    }
    EXPECT_NE(other.ranks[0].est.figures.peak, lt.analytic.ranks[0].est.figures.peak)
        << "the two indices must differ, or this checks nothing";
    trace_given_routing(lt, balanced_layout_routing(s.m, s.t, s.p));
    for (const RoutedRankTrace& r : lt.routed)
      if (r.ep_index == 0) {
        EXPECT_EQ(r.ledger.peak, lt.ranks.at(std::size_t(r.stage)).ledger.peak);
        EXPECT_EQ(r.ledger.activations_peak,
                  lt.ranks.at(std::size_t(r.stage)).ledger.activations_peak);
      }
    EXPECT_TRUE(lt.all_match());
  }
}

// Under tensor parallelism with sp each tensor-parallel rank routes its own s/tp positions: at
// b 1, s 12, tp 2 a source's 6 tokens make 12 choices, balanced 2 to experts 0-3 and 1 to 4-7,
// so in each ep group (slots {0, 1} and {2, 3} of dp 2 × tp 2) index 0 receives 2·8 = 16 rows
// and index 1 2·4 = 8; each slot's trace given that routing is its own balanced analytic.
TEST(RoutingPerRank, UnderSequenceParallelismEachRankRoutesItsOwnRows) {
  ModelConfig m = test::any_config("tiny-qwen3-moe");
  m.vocab = 96;
  TrainConfig t;
  t.batch = 1;
  t.seq = 12;
  t.dtype = DType::bf16;
  t.attention = Attention::flash;
  ParallelConfig p;
  p.world = 4;
  p.dp = 2;
  p.tp = 2;
  p.sp = true;
  p.ep = 2;
  p.zero = 1;
  p.resolve(true, m, t);
  const LayoutRouting bal = balanced_layout_routing(m, t, p);
  ASSERT_EQ(bal.sources.size(), 4u);
  EXPECT_EQ(bal.sources[3].layers[1].tokens_per_expert,
            (std::vector<std::int64_t>{2, 2, 2, 2, 1, 1, 1, 1}));
  EXPECT_EQ(expert_rows_of(bal, m, p, 0, 0).at({0, 1}).r, 16);
  EXPECT_EQ(expert_rows_of(bal, m, p, 3, 0).at({0, 0}).r, 8);
  LayoutTrace lt = trace_layout(m, t, p, OverheadOptions{}, 2);
  trace_given_routing(lt, bal);
  ASSERT_EQ(lt.routed.size(), 2u);
  const LayoutEstimate one = estimate_layout_of_rank(m, t, p, 1);  // slot 1: ep index 1
  EXPECT_NE(one.ranks[0].est.figures.peak, lt.analytic.ranks[0].est.figures.peak);
  for (const RoutedRankTrace& r : lt.routed) {
    const MemoryFigures& a = (r.ep_index == 0 ? lt.analytic : one).ranks[0].est.figures;
    EXPECT_EQ(r.ledger.peak, a.peak) << r.ep_index;
    EXPECT_EQ(r.ledger.activations_peak, a.activations_peak) << r.ep_index;
    EXPECT_EQ(r.ledger.peak_breakdown, a.peak_breakdown) << r.ep_index;
    EXPECT_EQ(r.max_rows, r.ep_index == 0 ? 16 : 8);
  }
  // A one-rank file must be a rank's: s/tp = 6 positions.
  const nlohmann::json twelve = {{"experts", 8},
                                 {"experts_per_token", 2},
                                 {"batch", 1},
                                 {"seq", 12},
                                 {"layers",
                                  {{{"layer", 0}, {"tokens_per_expert", kLayer1[2]}},
                                   {{"layer", 1}, {"tokens_per_expert", kLayer1[1]}}}}};
  EXPECT_TRUE(contains(message_of(write("tp", twelve), m, t, p),
                       "seq: 12, but a rank of this layout routes s/tp = 6 positions"));
}

TEST(RoutingPerRank, FromTheCommand) {
  const MoeLayout s(4, 2);
  const std::string path = write("cli", layout_routing_json(s.m, s.t, s.p, four_sources(), 2));
  const auto r = run_trainmem({"profile", "--model", "tiny-qwen3-moe", "--world-size", "4", "--ep",
                               "2", "--zero", "1", "--batch", "1", "--seq", "11", "--dtype", "bf16",
                               "--routing", path, "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto doc = nlohmann::json::parse(r.out);
  EXPECT_TRUE(doc["all_ranks_match"].get<bool>());
  const auto& g = doc["given_routing"];
  EXPECT_EQ(g["source"], "file " + path);
  ASSERT_EQ(g["ranks"].size(), 4u);  // every rank receives its own rows
  // Rank 3's experts receive the most rows of a layer (36, by hand above).
  EXPECT_EQ(g["worst"]["ranks"], nlohmann::json::array({3}));
  EXPECT_EQ(g["ranks"][3]["max_expert_rows"], 36);
  const auto text = run_trainmem({"profile", "--model", "tiny-qwen3-moe", "--world-size", "4",
                                  "--ep", "2", "--batch", "1", "--seq", "11", "--routing", path});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_TRUE(contains(text.out, "worst rank under the given routing: 3 (stage 0, ep index 1)"))
      << text.out;
  // Refusals name the flag.
  const auto measured =
      run_trainmem({"profile", "--model", "tiny-qwen3-moe", "--world-size", "4", "--ep", "2",
                    "--batch", "1", "--seq", "11", "--backend", "cpu", "--routing", path});
  EXPECT_EQ(measured.code, 2);
  EXPECT_TRUE(contains(measured.err, "a routing is given to the meta trace")) << measured.err;
  const auto dump = run_trainmem({"profile", "--model", "tiny-qwen3-moe", "--world-size", "4",
                                  "--ep", "2", "--batch", "1", "--seq", "11", "--dump-routing",
                                  ::testing::TempDir() + "routing_per_rank_out.json"});
  EXPECT_EQ(dump.code, 2);
  EXPECT_TRUE(contains(dump.err, "the meta trace routes nothing")) << dump.err;
}

}  // namespace
}  // namespace trainmem
