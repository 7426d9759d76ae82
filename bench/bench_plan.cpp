// How long `trainmem plan`'s full enumeration takes (include/trainmem/analytic/plan.hpp):
// LLaMA-2-70B on 8 GPUs of 80 GiB, seq 4096, a global batch of 512 sequences (every dp·tp·pp, ZeRO
// stage, sp, checkpointing, attention, micro-batch size and offload), with the default optimizer
// and with all three; beside it, one estimate_layout call of the 70B model. Target (issue 14): the
// full enumeration for a 70B model in under 2 s. Prints a table; exits 1 when the target is missed
// (a benchmark, not a test).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "bench_timing.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/analytic/plan.hpp"
#include "trainmem/base/config.hpp"

using namespace trainmem;
using trainmem::bench::median_ms;

int main() {
  constexpr double kTargetMs = 2000.0;
  const ModelConfig m = *find_preset("llama2-70b");
  PlanOptions o;
  o.gpus = 8;
  o.gpu_memory = std::uint64_t{80} << 30;
  o.seq = 4096;
  o.global_batch = 512;

  // One estimate of the 70B model: dp 2 × tp 4 × pp 1, ZeRO-1, sp, b 1.
  TrainConfig t;
  t.batch = 1;
  t.seq = o.seq;
  t.checkpointing = Checkpointing::full;
  t.attention = Attention::flash;
  ParallelConfig p;
  p.world = 8;
  p.dp = 2;
  p.tp = 4;
  p.zero = 1;
  p.sp = true;
  p.microbatches = 256;
  p.resolve(true, m, t);
  std::uint64_t sink = 0;
  const double one = median_ms([&] { sink += estimate_layout(m, t, p).worst_total(); }, 21);

  std::printf("%-28s %10s %10s %10s %12s %10s\n", "enumeration (llama2-70b)", "layouts", "fitting",
              "estimates", "ms/estimate", "total ms");
  bool ok = true;
  for (bool all : {false, true}) {
    PlanOptions q = o;
    if (all) q.optimizers = {Optimizer::adamw, Optimizer::sgd, Optimizer::lomo};
    PlanResult r;
    const double ms = median_ms([&] { r = plan(m, q); }, 5);
    sink += r.fitting;
    std::printf(
        "%-28s %10llu %10llu %10llu %12.4f %10.1f\n",
        all ? "N 8, G 512, --optimizer all" : "N 8, G 512, adamw",
        static_cast<unsigned long long>(r.enumerated), static_cast<unsigned long long>(r.fitting),
        static_cast<unsigned long long>(r.estimates),
        r.estimates ? 1000.0 * r.estimate_seconds / static_cast<double>(r.estimates) : 0.0, ms);
    ok = ok && ms < kTargetMs;
  }
  std::printf("one estimate_layout (dp 2 tp 4, b 1, s 4096): %.4f ms\n", one);
  std::printf("target: the full enumeration for a 70B model < %.0f ms -> %s   (checksum %llu)\n",
              kTargetMs, ok ? "met" : "MISSED", static_cast<unsigned long long>(sink % 1000));
  return ok ? 0 : 1;
}
