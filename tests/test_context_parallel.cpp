// Context parallelism (--cp, docs/distributed.md "Context parallelism"): the load-balanced
// chunks, RoPE at a rank's positions, ring attention's block kernels against the whole-sequence
// flash kernel (forward and backward, the blocks merged in ring order as the ranks would), the
// layout's rules, and the per-rank trace against the analytic profile byte for byte over
// cp × dp × tp (sp) × pp × ZeRO × policies × offload. The measured runs under mpirun are
// tests/mpi_test.py's (--mode cli).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "attention/attention.hpp"
#include "attention/attention_ring.hpp"
#include "layout_trace_helpers.hpp"
#include "policy_helpers.hpp"
#include "rope/rope.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/parallel.hpp"

namespace trainmem {
namespace {

using test::with_layers;
using test::with_policy;

// ------------------------------------------------------------------ the chunks

TEST(ContextParallel, ChunksPartitionTheSequenceWithEqualCausalWork) {
  for (std::int64_t cp : {1, 2, 3, 4, 8})
    for (std::int64_t s : {2 * cp, 6 * cp, 64 * cp}) {
      std::set<std::int64_t> seen;
      std::vector<std::int64_t> work;  // causal pairs (query, visible key) per rank
      for (std::int64_t r = 0; r < cp; ++r) {
        const SeqPositions pos = SeqPositions::of_rank(s, cp, r);
        std::int64_t pairs = 0;
        for (std::int64_t t = 0; t < s / cp; ++t) {
          const std::int64_t at = pos.at(t);
          EXPECT_TRUE(at >= 0 && at < s) << cp << " " << s << " " << r << " " << t;
          seen.insert(at);
          pairs += at + 1;
          if (t > 0 && t != s / (2 * cp)) {
            EXPECT_EQ(at, pos.at(t - 1) + 1);  // chunks contiguous
          }
        }
        work.push_back(pairs);
      }
      EXPECT_EQ(std::int64_t(seen.size()), s) << "every position held once: cp " << cp;
      for (std::int64_t w : work) EXPECT_EQ(w, work.front()) << "balanced: cp " << cp << " s " << s;
    }
  // Rank 1 of 2 over 8 tokens: chunks of 2, the 2nd and the 3rd (positions 2, 3, 4, 5).
  const SeqPositions p = SeqPositions::of_rank(8, 2, 1);
  EXPECT_EQ(std::vector<std::int64_t>({p.at(0), p.at(1), p.at(2), p.at(3)}),
            std::vector<std::int64_t>({2, 3, 4, 5}));
  EXPECT_TRUE(SeqPositions::of_rank(8, 1, 0).identity());
}

// A (b, s, heads, d) buffer's rows at the positions of `pos` (s_local of them).
std::vector<float> rows_at(const std::vector<float>& x, std::int64_t b, std::int64_t s,
                           std::int64_t s_local, std::int64_t width, const SeqPositions& pos) {
  std::vector<float> out(std::size_t(b * s_local * width));
  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t t = 0; t < s_local; ++t)
      std::copy_n(x.begin() + (bi * s + pos.at(t)) * width, width,
                  out.begin() + (bi * s_local + t) * width);
  return out;
}

std::vector<float> random_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, float tol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t e = 0; e < got.size(); ++e)
    ASSERT_NEAR(got[e], want[e], tol) << what << " element " << e;
}

// RoPE at a rank's positions rotates its rows as the whole sequence's RoPE rotates those rows.
TEST(ContextParallel, RopeAtTheRanksPositionsEqualsTheWholeSequencesRows) {
  const std::int64_t b = 2, s = 24, a = 4, kv = 2, d = 8;
  const std::vector<float> q = random_values(std::size_t(b * s * a * d), 1);
  const std::vector<float> k = random_values(std::size_t(b * s * kv * d), 2);
  for (std::int64_t cp : {2, 3}) {
    std::vector<float> qw = q, kw = k;
    rope_forward_cpu(qw.data(), kw.data(), b, s, a, kv, d, RopeSpec(5e5, {}), DType::f32);
    for (std::int64_t r = 0; r < cp; ++r) {
      const SeqPositions pos = SeqPositions::of_rank(s, cp, r);
      const std::int64_t sl = s / cp;
      std::vector<float> qr = rows_at(q, b, s, sl, a * d, pos),
                         kr = rows_at(k, b, s, sl, kv * d, pos);
      rope_forward_cpu(qr.data(), kr.data(), b, sl, a, kv, d, RopeSpec(5e5, {}, pos), DType::f32);
      const std::string what = "cp " + std::to_string(cp) + " rank " + std::to_string(r);
      expect_near_all(qr, rows_at(qw, b, s, sl, a * d, pos), 1e-6f, what + " q");
      expect_near_all(kr, rows_at(kw, b, s, sl, kv * d, pos), 1e-6f, what + " k");
      // Backward is the inverse rotation: back to the inputs.
      rope_backward_cpu(qr.data(), kr.data(), b, sl, a, kv, d, RopeSpec(5e5, {}, pos), DType::f32);
      expect_near_all(qr, rows_at(q, b, s, sl, a * d, pos), 1e-5f, what + " q inverse");
    }
  }
}

// Ring attention as cp ranks run it, in one process: each rank's queries meet the blocks of
// ranks r, r-1, ... (mod cp) in that order; every block's key/value gradient accumulates, in
// the same order, the shares of the ranks it visits. Against the whole sequence's flash kernel.
TEST(ContextParallel, RingAttentionEqualsFlashAttentionOverTheWholeSequence) {
  struct Case {
    std::int64_t b, s, a, kv, d, window, cp;
  };
  for (const Case& c :
       {Case{2, 16, 4, 2, 8, 0, 2}, Case{1, 24, 6, 2, 8, 0, 3}, Case{2, 32, 4, 4, 16, 0, 4},
        Case{1, 24, 4, 1, 8, 5, 3}, Case{2, 16, 2, 2, 8, 3, 4}}) {
    const std::int64_t b = c.b, s = c.s, a = c.a, kv = c.kv, d = c.d, cp = c.cp, sl = s / cp;
    const std::vector<float> q = random_values(std::size_t(b * s * a * d), 11);
    const std::vector<float> k = random_values(std::size_t(b * s * kv * d), 12);
    const std::vector<float> v = random_values(std::size_t(b * s * kv * d), 13);
    const std::vector<float> dout = random_values(std::size_t(b * s * a * d), 14);
    std::vector<float> out(q.size()), lse(std::size_t(b * a * s)), delta(lse.size());
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    attention_flash_forward_cpu(out.data(), lse.data(), q.data(), k.data(), v.data(), b, s, a, kv,
                                d, c.window, DType::f32);
    attention_flash_backward_cpu(dq.data(), dk.data(), dv.data(), delta.data(), dout.data(),
                                 q.data(), k.data(), v.data(), out.data(), lse.data(), b, s, a, kv,
                                 d, c.window, DType::f32);
    std::vector<SeqPositions> pos;
    std::vector<std::vector<float>> qr, kr, vr, dor, outr, lser;
    for (std::int64_t r = 0; r < cp; ++r) {
      pos.push_back(SeqPositions::of_rank(s, cp, r));
      qr.push_back(rows_at(q, b, s, sl, a * d, pos.back()));
      kr.push_back(rows_at(k, b, s, sl, kv * d, pos.back()));
      vr.push_back(rows_at(v, b, s, sl, kv * d, pos.back()));
      dor.push_back(rows_at(dout, b, s, sl, a * d, pos.back()));
    }
    const std::string what = "b" + std::to_string(b) + " s" + std::to_string(s) + " cp" +
                             std::to_string(cp) + " window " + std::to_string(c.window);
    // Forward.
    for (std::int64_t r = 0; r < cp; ++r) {
      std::vector<float> acc(qr[std::size_t(r)].size()), l(std::size_t(b * a * sl));
      for (std::int64_t j = 0; j < cp; ++j) {
        const std::size_t src = std::size_t((r - j + cp) % cp);
        attention_ring_forward_cpu(acc.data(), l.data(), qr[std::size_t(r)].data(), kr[src].data(),
                                   vr[src].data(), b, sl, sl, a, kv, d, c.window,
                                   pos[std::size_t(r)], pos[src], j == 0, DType::f32);
      }
      expect_near_all(acc, rows_at(out, b, s, sl, a * d, pos[std::size_t(r)]), 2e-6f,
                      what + " out of rank " + std::to_string(r));
      // lse is (b, a, s): the rank's positions of each (batch, head) row.
      std::vector<float> lw;
      for (std::int64_t bh = 0; bh < b * a; ++bh)
        for (std::int64_t t = 0; t < sl; ++t)
          lw.push_back(lse[std::size_t(bh * s + pos[std::size_t(r)].at(t))]);
      expect_near_all(l, lw, 2e-6f, what + " lse of rank " + std::to_string(r));
      outr.push_back(acc);
      lser.push_back(l);
    }
    // Backward: rank r's step j works on block (r - j) mod cp, adding into that block's
    // accumulator; the accumulators travel the ring, so block o's gradient is the sum of the
    // ranks o, o+1, ..., o+cp-1 in that order.
    std::vector<std::vector<float>> dkr(std::size_t(cp), std::vector<float>(kr[0].size())),
        dvr = dkr;
    std::vector<std::vector<float>> dqr(std::size_t(cp), std::vector<float>(qr[0].size()));
    std::vector<std::vector<float>> deltar(std::size_t(cp), std::vector<float>(lser[0].size()));
    for (std::int64_t j = 0; j < cp; ++j)
      for (std::int64_t r = 0; r < cp; ++r) {
        const std::size_t src = std::size_t((r - j + cp) % cp), rr = std::size_t(r);
        attention_ring_backward_cpu(
            dqr[rr].data(), dkr[src].data(), dvr[src].data(), deltar[rr].data(), dor[rr].data(),
            qr[rr].data(), kr[src].data(), vr[src].data(), outr[rr].data(), lser[rr].data(), b, sl,
            sl, a, kv, d, c.window, pos[rr], pos[src], j == 0, DType::f32);
      }
    for (std::int64_t r = 0; r < cp; ++r) {
      const std::string who = what + " rank " + std::to_string(r);
      expect_near_all(dqr[std::size_t(r)], rows_at(dq, b, s, sl, a * d, pos[std::size_t(r)]), 2e-5f,
                      who + " dq");
      expect_near_all(dkr[std::size_t(r)], rows_at(dk, b, s, sl, kv * d, pos[std::size_t(r)]),
                      2e-5f, who + " dk");
      expect_near_all(dvr[std::size_t(r)], rows_at(dv, b, s, sl, kv * d, pos[std::size_t(r)]),
                      2e-5f, who + " dv");
    }
  }
}

// A block no query of which sees any key (a later rank's first chunk from rank 0's first
// chunk) leaves the accumulator and lse as they were.
TEST(ContextParallel, ABlockWithNoVisibleKeyChangesNothing) {
  const std::int64_t b = 1, sl = 8, a = 2, kv = 1, d = 4;
  const SeqPositions first_chunks{4, 0, 0};  // positions 0..3 then 0..3 again: all early
  const SeqPositions late{4, 8, 12};         // keys at 8..15
  const std::vector<float> q = random_values(std::size_t(b * sl * a * d), 3);
  const std::vector<float> k = random_values(std::size_t(b * sl * kv * d), 4);
  std::vector<float> acc = random_values(q.size(), 5), l = random_values(std::size_t(a * sl), 6);
  const std::vector<float> acc0 = acc, l0 = l;
  attention_ring_forward_cpu(acc.data(), l.data(), q.data(), k.data(), k.data(), b, sl, sl, a, kv,
                             d, 0, first_chunks, late, false, DType::f32);
  EXPECT_EQ(acc, acc0);
  EXPECT_EQ(l, l0);
}

// ------------------------------------------------------------------ the layout

ParallelConfig cp_layout(std::int64_t world, std::int64_t cp) {
  ParallelConfig p;
  p.world = world;
  p.cp = cp;
  return p;
}

TEST(ContextParallel, LayoutRulesNameTheFlags) {
  const ModelConfig m = test::any_config("tiny");
  TrainConfig t = test::train_config(2, 64, DType::bf16, Optimizer::adamw, Checkpointing::none,
                                     Attention::flash);
  auto message = [&](ParallelConfig p, const TrainConfig& tc, bool dp_given = false) {
    try {
      p.resolve(dp_given, m, tc);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  ParallelConfig ok = cp_layout(8, 2);
  EXPECT_EQ(message(ok, t), "(accepted)");
  ok.resolve(false, m, t);
  EXPECT_EQ(ok.dp, 4);
  EXPECT_EQ(ok.grad_ranks(), 8);
  EXPECT_EQ(ok.local_seq(t.seq), 32);
  EXPECT_EQ(ok.describe(), "dp 4 × tp 1 × pp 1 × cp 2, ZeRO-0");
  EXPECT_NE(message(cp_layout(8, 0), t).find("--cp must be at least 1"), std::string::npos);
  EXPECT_NE(message(cp_layout(6, 4), t).find("not divisible by --tp × --pp × --cp = 4"),
            std::string::npos);
  ParallelConfig given = cp_layout(8, 2);
  given.dp = 2;
  EXPECT_NE(
      message(given, t, true).find("must equal --dp × --tp × --pp × --cp = 2 × 1 × 1 × 2 = 4"),
      std::string::npos);
  TrainConfig odd = t;
  odd.seq = 60;  // 60 / (2·4) is not whole
  EXPECT_NE(message(cp_layout(4, 4), odd).find("--seq 60 must be divisible by 2·cp = 8"),
            std::string::npos);
  TrainConfig eager = t;
  eager.attention = Attention::eager;
  EXPECT_NE(message(cp_layout(2, 2), eager).find("needs --attention flash"), std::string::npos);
  // ZeRO shards over dp·cp: cp 2 alone is enough ranks.
  ParallelConfig z = cp_layout(2, 2);
  z.zero = 3;
  EXPECT_EQ(message(z, t), "(accepted)");
  // Hostile degrees: products past 64 bits are "more than 2^63", never a wrapped value.
  ParallelConfig huge = cp_layout(4, std::int64_t(1) << 62);
  huge.tp = std::int64_t(1) << 62;
  EXPECT_NE(message(huge, t).find("not divisible by --tp × --pp × --cp = more than 2^63"),
            std::string::npos);
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  ParallelConfig wide = cp_layout(max, max - 1);
  wide.dp = 2;
  EXPECT_NE(message(wide, t, true).find("= more than 2^63"), std::string::npos)
      << message(wide, t, true);
  // cp equal to the world: accepted by the product, refused by the sequence (2·cp not formed).
  EXPECT_NE(message(cp_layout(max, max), t).find("--seq 64 must be divisible by 2·cp ("),
            std::string::npos)
      << message(cp_layout(max, max), t);
}

// The trace of every stage equals the analytic profile byte for byte, over cp (one, two and
// three ring buffers: cp 2, 3, 4) × dp × tp (with and without sp) × pp × ZeRO × policies ×
// activation offload, with GQA, a sliding window (tiny-mistral) and q/k norms (tiny-qwen3).
TEST(ContextParallel, TraceEqualsTheAnalyticProfilePerRank) {
  int checked = 0;
  for (const char* name : {"tiny", "tiny-mistral", "tiny-qwen3"})
    for (std::int64_t cp : {2, 3, 4})
      for (std::int64_t tp : {1, 2})
        for (bool sp : {false, true})
          for (std::int64_t pp : {1, 2})
            for (int zero : {0, 1, 3})
              for (const char* policy : {"none", "full", "layers:2", "every:2"})
                for (bool offload : {false, true}) {
                  if ((sp && tp == 1) || (offload && pp > 1) || (zero > 1 && pp > 1)) continue;
                  const ModelConfig m = with_layers(name, 4);
                  TrainConfig t =
                      with_policy(test::train_config(2, 48, DType::bf16, Optimizer::adamw,
                                                     Checkpointing::none, Attention::flash),
                                  policy, 4);
                  t.offload_activations = offload;
                  ParallelConfig p;
                  p.dp = zero > 0 && cp == 1 ? 2 : 1;
                  p.tp = tp;
                  p.pp = pp;
                  p.cp = cp;
                  p.sp = sp;
                  p.zero = zero;
                  p.microbatches = pp > 1 ? 3 : 1;
                  p.world = p.dp * tp * pp * cp;
                  try {
                    p.resolve(true, m, t);
                  } catch (const InputError& e) {
                    ADD_FAILURE() << "layout refused: " << e.what();
                    return;
                  }
                  test::expect_trace_equals_layout(m, t, p,
                                                   std::string(name) + " " + policy +
                                                       (offload ? " offload " : " ") +
                                                       p.describe());
                  if (HasFailure()) return;
                  ++checked;
                }
  EXPECT_GT(checked, 500);
}

// What context parallelism changes, from the analytic profile: the activations of s/cp rows
// (exactly 1/cp of a layer's set with flash attention, whose rows are all linear in s), the
// parameters and states sharded over dp·cp under ZeRO, and the ring buffers in communication.
TEST(ContextParallel, ActivationsScaleByOneOverCpAndRingBuffersAreBooked) {
  const ModelConfig m = test::any_config("tiny-gqa");
  const TrainConfig t = test::train_config(2, 64, DType::bf16, Optimizer::adamw,
                                           Checkpointing::none, Attention::flash);
  ParallelConfig one;
  one.resolve(false, m, t);
  const RankEstimate base = estimate_layout(m, t, one).ranks.front();
  for (std::int64_t cp : {2, 4}) {
    ParallelConfig p = cp_layout(cp, cp);
    p.zero = 1;
    p.resolve(false, m, t);
    const RankEstimate r = estimate_layout(m, t, p).ranks.front();
    EXPECT_EQ(r.est.activations.total_bytes * std::uint64_t(cp), base.est.activations.total_bytes)
        << "cp " << cp;
    EXPECT_EQ(r.est.figures.params, base.est.figures.params) << "parameters are not split";
    // Optimizer states: the flat vector of P elements split over cp ranks (padded up).
    const std::uint64_t P = base.est.param_count, shard = (P + std::uint64_t(cp) - 1) / cp;
    EXPECT_EQ(r.est.figures.optimizer_states, shard * 12) << "cp " << cp;
    // Ring buffers: min(cp-1, 2) blocks (2, b, s/cp, kv·d) bf16 and two fp32 gradient blocks.
    const std::uint64_t block =
        2 * 2 * std::uint64_t(64 / cp) * std::uint64_t(m.kv_heads) * std::uint64_t(m.head_dim());
    std::uint64_t kv = 0, dkv = 0;
    for (const TensorEntry& e : r.communication) {
      if (e.name == "ring.kv") kv = e.bytes;
      if (e.name == "ring.dkv") dkv = e.bytes;
    }
    EXPECT_EQ(kv, std::uint64_t(std::min<std::int64_t>(cp - 1, 2)) * block * 2) << "cp " << cp;
    EXPECT_EQ(dkv, 2 * block * 4) << "cp " << cp;
  }
}

}  // namespace
}  // namespace trainmem
