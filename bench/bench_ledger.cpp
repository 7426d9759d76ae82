// Cost of one allocate + release through the ledger on the meta allocator (target < 1 us).
// Prints ns per pair for a few shapes of use: with and without per-tensor records, with the
// timeline kept and with it full (events only counted), and with many tensors alive.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "trainmem/ledger.hpp"

using namespace trainmem;

namespace {

double ns_per_pair(LedgerOptions opt, int pairs, int alive_before) {
  MetaAllocator meta;
  Ledger ledger(meta, opt);
  std::vector<Tensor> alive;
  alive.reserve(static_cast<std::size_t>(alive_before));
  for (int i = 0; i < alive_before; ++i)
    alive.push_back(ledger.allocate("alive", Category::params, -1, {1024}, DType::bf16));
  const std::string name = "model.layers.7.mlp.up_proj.out";
  ledger.push_phase(Phase::forward);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < pairs; ++i) {
    Tensor t = ledger.allocate(name, Category::activations, 7, {8, 512, 4096}, DType::bf16);
    t.reset();
  }
  const auto t1 = std::chrono::steady_clock::now();
  ledger.pop_phase();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / pairs;
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
  std::printf("ledger allocate+release on the meta allocator (%d pairs)\n", pairs);
  std::printf("  records + timeline           : %8.1f ns/pair\n", ns_per_pair(full, pairs, 0));
  std::printf("  no records, timeline         : %8.1f ns/pair\n",
              ns_per_pair(no_records, pairs, 0));
  std::printf("  no records, timeline full    : %8.1f ns/pair\n", ns_per_pair(capped, pairs, 0));
  std::printf("  records + timeline, 10k alive: %8.1f ns/pair\n", ns_per_pair(full, pairs, 10000));
  std::printf("target: < 1000 ns/pair\n");
  return 0;
}
