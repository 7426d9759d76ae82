// `trainmem maxbatch`'s run (include/trainmem/run/maxbatch.hpp): the search and its probes.
#include "trainmem/run/maxbatch.hpp"

#include <algorithm>

#include "trainmem/analytic/hf_step.hpp"
#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/run/run.hpp"
#include "trainmem/run/run_layout.hpp"

namespace trainmem {

SearchResult find_largest_fitting(std::int64_t lowest, std::int64_t highest, std::int64_t step,
                                  const std::function<Probe(std::int64_t)>& probe) {
  if (step < 1 || lowest < 1 || highest < lowest)
    throw Error("find_largest_fitting: need 1 <= lowest <= highest and step >= 1");
  SearchResult r;
  auto try_k = [&](std::int64_t k) {
    ++r.probes;
    return probe(lowest + k * step);
  };
  const std::int64_t k_max = (highest - lowest) / step;
  Probe p0 = try_k(0);
  if (!p0.fits) {
    r.best = 0;
    r.at_next = p0;
    return r;
  }
  // Grow k geometrically until a value fails (or the range ends), then bisect between the
  // last good and the first bad k.
  std::int64_t k_good = 0, k_bad = -1;
  Probe good = p0, bad{};
  for (std::int64_t k = 1;; k = k > k_max / 2 ? k_max : 2 * k) {
    if (k > k_max) k = k_max;
    if (k <= k_good) break;  // the whole range fits
    const Probe p = try_k(k);
    if (!p.fits) {
      k_bad = k, bad = p;
      break;
    }
    k_good = k, good = p;
  }
  if (k_bad >= 0) {
    while (k_bad - k_good > 1) {
      const std::int64_t mid = k_good + (k_bad - k_good) / 2;
      const Probe p = try_k(mid);
      if (p.fits) {
        k_good = mid, good = p;
      } else {
        k_bad = mid, bad = p;
      }
    }
  }
  r.best = lowest + k_good * step;
  r.at_best = good;
  // One more: the first failure, or (when the top of the range fits) a probe past it.
  r.at_next = k_bad >= 0 ? bad : try_k(k_good + 1);
  return r;
}

std::int64_t maxbatch_step_max(bool vary_batch) {
  return vary_batch ? (std::int64_t{1} << 30) : (std::int64_t{1} << 24);
}

MaxbatchResult find_max(const MaxbatchRequest& rq) {
  MaxbatchResult out;
  const bool vary_batch = rq.vary_batch;
  const std::int64_t step = rq.step;
  if (step < 1 || step > maxbatch_step_max(vary_batch))
    throw Error("find_max: the step is outside 1..maxbatch_step_max (the caller checks --step)");
  const bool distributed = rq.layout && rq.layout->distributed();
  if (rq.hf_step && rq.hf_peft)
    throw Error("find_max: the HF step is a full fine-tune (the caller refuses hf-peft with it)");
  if (rq.hf_peft && (distributed || rq.allocator))
    throw Error(
        "find_max: hf-peft is one GPU's analytic step (the caller refuses layouts and "
        "--allocator)");
  if (distributed) {
    const ParallelConfig& par = *rq.layout;
    // (step is at most 2^30 here: a cp above it divides no step.)
    if (!vary_batch && par.cp > 1 && (par.cp > step || step % (2 * par.cp) != 0))
      throw InputError(
          "--step " + std::to_string(step) + " with --cp " + std::to_string(par.cp) +
          " and --vary seq: must be a multiple of 2·cp = " + std::to_string(2 * par.cp) +
          " (each rank holds two chunks of s/(2·cp) tokens)");
    if (!vary_batch && par.sp && (par.tp > step || par.cp > step || step % (par.tp * par.cp) != 0))
      throw InputError("--step " + std::to_string(step) +
                       " with --sp and --vary seq: must be a "
                       "multiple of --tp " +
                       std::to_string(par.tp) +
                       (par.cp > 1 ? " × --cp " + std::to_string(par.cp) : std::string()) +
                       " (each rank keeps s/(cp·tp) rows)");
    out.layout_overheads = estimate_overheads(par, rq.overheads, rq.model.moe());
    out.added_bytes = out.layout_overheads.total();
  } else {
    out.added_bytes = rq.overhead;
  }
  // One GPU's two steps of `t` on meta.
  auto meta_request = [&](const TrainConfig& t) {
    RunRequest one;
    one.model = rq.model;
    one.train = t;
    one.backend = "meta";
    one.steps = 2;
    one.probes = false;
    return one;
  };
  // The HF step of `t` (its sequence; InputError naming the flag where it is not modelled).
  auto hf_sequence = [&](const TrainConfig& t) {
    HfStepOptions so;
    so.sdpa = *rq.hf_step == Profile::hf_sdpa;
    return hf_step(rq.model, t, rq.hf, so);
  };
  // The peak of one candidate: one GPU's step (trainmem's on meta, hf-peft's or the HF step's),
  // or the worst rank of the layout, on meta.
  auto peak_of = [&](const TrainConfig& t) -> std::uint64_t {
    if (rq.hf_peft) return estimate(Profile::hf_peft, rq.model, t, *rq.hf_peft).figures.peak;
    if (rq.hf_step && distributed) {
      // every distinct rank's step under FSDP2, the worst kept (with --allocator each rank's
      // reserve without a device limit, as for the native step's ranks)
      HfStepOptions so;
      so.sdpa = *rq.hf_step == Profile::hf_sdpa;
      so.fsdp_world = static_cast<int>(rq.layout->world);
      so.reshard_after_forward = rq.layout->reshard_after_forward;
      std::uint64_t worst = 0;
      for (const auto& g : hf_step_fsdp2_ranks(rq.model, t, rq.hf, so))
        worst =
            std::max(worst, rq.allocator ? replay_hf_step(g.step, *rq.allocator).run_reserved_peak
                                         : g.step.peak);
      return worst;
    }
    if (rq.hf_step) return hf_sequence(t).peak;
    if (distributed) {
      // --allocator: each rank's reserve without a device limit (no release-and-retry).
      const LayoutTrace lt = trace_layout(rq.model, t, *rq.layout, rq.overheads, 2, rq.allocator);
      std::uint64_t worst = 0;
      for (const auto& r : lt.ranks)
        worst = std::max(worst,
                         r.allocator_model ? r.allocator_model->run_reserved_peak : r.ledger.peak);
      return worst;
    }
    return execute_run(meta_request(t)).ledger.peak;
  };
  // --allocator: PyTorch's caching allocator (a model) on a device of budget − overhead.
  auto reserved_probe = [&](const TrainConfig& t) -> Probe {
    if (rq.hf_step) {
      const HfStep st = hf_sequence(t);
      AllocatorSpec spec = *rq.allocator;
      if (out.added_bytes < rq.budget) {
        spec.config.device_bytes = rq.budget - out.added_bytes;
        const AllocatorModelResult r = replay_hf_step(st, spec);
        if (!r.oom) return {true, r.run_reserved_peak};
      }
      spec.config.device_bytes.reset();
      return {false, replay_hf_step(st, spec).run_reserved_peak};
    }
    RunRequest one = meta_request(t);
    one.log_failure = false;
    one.allocator = rq.allocator;
    if (out.added_bytes < rq.budget) {
      one.device_budget = rq.budget - out.added_bytes;
      const RunResult r = execute_run(one);
      if (!r.failure) return {true, r.allocator_model->run_reserved_peak};
      one.device_budget.reset();
    }
    // It does not fit (or the overhead alone fills the budget): what it would reserve, unbounded.
    return {false, execute_run(one).allocator_model->run_reserved_peak};
  };
  auto probe = [&](std::int64_t v) -> Probe {
    TrainConfig t = rq.train;
    (vary_batch ? t.batch : t.seq) = v;
    try {
      if (rq.allocator && !distributed) {
        const Probe p = reserved_probe(t);
        ++out.traced;
        return p;
      }
      const std::uint64_t peak = peak_of(t);
      ++out.traced;
      return {checked_add(peak, out.added_bytes) <= rq.budget, peak};
    } catch (const OverflowError&) {
      return {false, 0};  // sizes past 64 bits do not fit anything
    }
  };
  out.lowest = vary_batch ? step : std::max<std::int64_t>(2, step);
  out.search = find_largest_fitting(out.lowest, maxbatch_step_max(vary_batch), step, probe);
  out.next = out.search.best > 0 ? out.search.best + step : out.lowest;
  return out;
}

std::uint64_t measure_cuda_overhead(DType dtype) {
  RunRequest rq;
  rq.model = *find_preset("tiny");
  rq.train.batch = 1;
  rq.train.seq = 16;
  rq.train.dtype = dtype;
  rq.backend = "cuda";
  rq.steps = 1;
  const RunResult r = execute_run(rq);
  if (!r.memgetinfo.available)
    throw Error("--overhead: cannot measure: cudaMemGetInfo unavailable (" + r.memgetinfo.reason +
                "); state it, e.g. --overhead 1GiB");
  std::int64_t best = 0;
  for (const auto& s : r.memgetinfo.snapshots)
    if (s.has_ledger) best = std::max(best, std::int64_t(s.used) - std::int64_t(s.ledger_live));
  return std::uint64_t(best);
}

}  // namespace trainmem
