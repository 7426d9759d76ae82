// How long one `trainmem estimate` computation takes, for every preset: all five profiles,
// for the default run (b 8, s 512, bf16, AdamW, no checkpointing), for the whole 3 × 2
// table (--optimizer all --checkpointing both), and the HF profiles in every era (transformers
// era × PyTorch series × loop × use_cache × checkpointing). Target: < 50 ms per estimate of any
// preset.
// Prints a table; exits 1 when a preset misses the target (a benchmark, not a test).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_timing.hpp"
#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/report/report.hpp"

using namespace trainmem;
using trainmem::bench::median_ms;

int main() {
  constexpr double kTargetMs = 50.0;
  std::printf("%-14s %8s %14s %18s %10s %16s\n", "preset", "layers", "ms (default)",
              "ms (3x2 table)", "JSON ms", "ms (every era)");
  bool ok = true;
  std::uint64_t sink = 0;
  for (const auto& name : preset_names()) {
    const ModelConfig m = *find_preset(name);
    TrainConfig t;  // docs/design.md defaults: b 8, s 512, bf16, AdamW, none, eager
    auto one = [&] {
      for (Profile p : all_profiles()) sink += estimate(p, m, t).figures.peak;
    };
    auto table = [&] {
      for (auto o : {Optimizer::adamw, Optimizer::sgd, Optimizer::lomo})
        for (auto c : {Checkpointing::none, Checkpointing::full}) {
          TrainConfig u = t;
          u.optimizer = o;
          u.checkpointing = c;
          for (Profile p : all_profiles()) sink += estimate(p, m, u).figures.peak;
        }
    };
    auto json = [&] {
      std::vector<Estimate> es;
      for (Profile p : all_profiles()) es.push_back(estimate(p, m, t));
      sink += report::analytic_json(es).dump().size();
    };
    auto eras = [&] {
      for (HfEra era : all_hf_eras())
        for (TorchEra torch : {TorchEra::before_2_2, TorchEra::from_2_2})
          for (Loop loop : {Loop::hf_model_loss, Loop::shift_ce, Loop::none})
            for (bool cache : {false, true})
              for (auto c : {Checkpointing::none, Checkpointing::full}) {
                if (era == HfEra::v5_25 && torch == TorchEra::before_2_2) continue;
                HfOptions o;
                o.era = era;
                o.torch = torch;
                o.loop = loop;
                o.use_cache = cache;
                TrainConfig u = t;
                u.checkpointing = c;
                sink += estimate(Profile::hf_eager, m, u, o).figures.peak;
                if (era == HfEra::v5_25) sink += estimate(Profile::hf_sdpa, m, u, o).figures.peak;
              }
    };
    const double a = median_ms(one, 21), b = median_ms(table, 11), c = median_ms(json, 11),
                 e = median_ms(eras, 11);
    std::printf("%-14s %8lld %14.3f %18.3f %10.3f %16.3f\n", name.c_str(),
                static_cast<long long>(m.layers), a, b, c, e);
    ok = ok && b < kTargetMs && e < kTargetMs;
  }
  std::printf(
      "target: an estimate of any preset (even the whole 3x2 table, 5 profiles, or every HF "
      "era) < %.0f ms"
      " -> %s   (checksum %llu)\n",
      kTargetMs, ok ? "met" : "MISSED", static_cast<unsigned long long>(sink % 1000));
  return ok ? 0 : 1;
}
