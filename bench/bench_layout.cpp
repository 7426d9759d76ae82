// How long the per-rank figures of a parallel layout take: the closed form (estimate_layout) and
// the meta trace of every distinct rank (trace_layout, two steps each), beside today's
// single-GPU meta trace of the same model (execute_run on meta, two steps). Target: tracing one
// rank costs no more than the single-GPU trace (a rank runs fewer layers or smaller shards).
// Prints a table; a benchmark, not a test.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_timing.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/run/run.hpp"
#include "trainmem/run/run_layout.hpp"

using namespace trainmem;
using trainmem::bench::median_ms;

namespace {

struct Layout {
  const char* name;
  std::int64_t dp, tp, pp, M;
  int zero;
  bool sp;
};

}  // namespace

int main() {
  const ModelConfig m = *find_preset("llama2-70b");
  TrainConfig t;
  t.batch = 1;
  t.seq = 4096;
  t.attention = Attention::flash;
  t.checkpointing = Checkpointing::full;
  std::uint64_t sink = 0;
  const double single = median_ms(
      [&] {
        RunRequest rq;
        rq.model = m;
        rq.train = t;
        rq.backend = "meta";
        rq.probes = false;
        sink += execute_run(rq).ledger.peak;
      },
      5);
  std::printf("llama2-70b, b 1, s 4096, flash, full checkpointing\n");
  std::printf("single-GPU meta trace (2 steps): %.2f ms\n\n", single);
  std::printf("%-28s %6s %14s %16s %18s\n", "layout", "ranks", "closed form ms", "trace ms (all)",
              "trace ms per rank");
  const Layout layouts[] = {{"dp 8 ZeRO-3", 8, 1, 1, 1, 3, false},
                            {"dp 8 ZeRO-1", 8, 1, 1, 1, 1, false},
                            {"tp 8 sp", 1, 8, 1, 1, 0, true},
                            {"tp 8 sp pp 4 M 16 ZeRO-1", 2, 8, 4, 16, 1, true},
                            {"tp 4 pp 8 M 32", 2, 4, 8, 32, 1, false}};
  for (const Layout& l : layouts) {
    ParallelConfig p;
    p.world = l.dp * l.tp * l.pp;
    p.dp = l.dp;
    p.tp = l.tp;
    p.pp = l.pp;
    p.zero = l.zero;
    p.sp = l.sp;
    p.microbatches = l.M;
    p.resolve(true, m, t);
    const double closed = median_ms([&] { sink += estimate_layout(m, t, p).worst_total(); }, 20);
    const double traced = median_ms([&] { sink += trace_layout(m, t, p, {}, 2).ranks.size(); }, 5);
    std::printf("%-28s %6lld %14.3f %16.2f %18.2f\n", l.name, static_cast<long long>(l.pp), closed,
                traced, traced / double(l.pp));
  }
  return sink == 0 ? 1 : 0;
}
