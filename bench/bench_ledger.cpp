// Cost of one allocate + release through the ledger on the meta allocator (target < 1 us).
// Prints ns per pair for a few shapes of use: with and without per-tensor records, with the
// timeline kept and with it full (events only counted), and with many tensors alive.
#include <time.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "trainmem/ledger/ledger.hpp"

using namespace trainmem;

namespace {

struct Cost {
  double wall_ns;
  double cpu_ns;  // this thread's CPU time: robust when the machine is loaded
};

double thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

Cost ns_per_pair(LedgerOptions opt, int pairs, int alive_before) {
  MetaAllocator meta;
  Ledger ledger(meta, opt);
  std::vector<Tensor> alive;
  alive.reserve(static_cast<std::size_t>(alive_before));
  for (int i = 0; i < alive_before; ++i)
    alive.push_back(ledger.allocate("alive", Category::params, -1, {1024}, DType::bf16));
  const std::string name = "model.layers.7.mlp.up_proj.out";
  ledger.push_phase(Phase::forward);
  const double c0 = thread_cpu_ns();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < pairs; ++i) {
    Tensor t = ledger.allocate(name, Category::activations, 7, {8, 512, 4096}, DType::bf16);
    t.reset();
  }
  const auto t1 = std::chrono::steady_clock::now();
  const double c1 = thread_cpu_ns();
  ledger.pop_phase();
  return {std::chrono::duration<double, std::nano>(t1 - t0).count() / pairs, (c1 - c0) / pairs};
}

}  // namespace

int main() {
  const int pairs = 200000;
  LedgerOptions full;  // records + timeline (default cap 1M events)
  LedgerOptions no_records;
  no_records.keep_tensor_records = false;
  LedgerOptions capped;  // timeline already full: events are only counted
  capped.timeline_cap = 0;
  capped.keep_tensor_records = false;
  std::printf("ledger allocate+release on the meta allocator (%d pairs): wall / thread-CPU ns\n",
              pairs);
  const struct {
    const char* label;
    LedgerOptions opt;
    int alive;
  } cases[] = {{"records + timeline           ", full, 0},
               {"no records, timeline         ", no_records, 0},
               {"no records, timeline full    ", capped, 0},
               {"records + timeline, 10k alive", full, 10000}};
  for (const auto& c : cases) {
    const Cost cost = ns_per_pair(c.opt, pairs, c.alive);
    std::printf("  %s: %8.1f / %8.1f ns/pair\n", c.label, cost.wall_ns, cost.cpu_ns);
  }
  std::printf("target: < 1000 ns/pair\n");
  return 0;
}
