// ProbeSet with CUDA: memgetinfo, pool and cupti side by side (include/trainmem/probes/probes.hpp).
#include <spdlog/spdlog.h>

#include <memory>

#include "cupti_collector.hpp"
#include "device_probes.hpp"
#include "trainmem/probes/probes.hpp"

namespace trainmem {

namespace {
using Flush = probes::CuptiCollector::Flush;
}  // namespace

struct ProbeSet::Impl {
  std::string pool_reason, cupti_reason, mem_reason;
  bool pool_ok = false, cupti_ok = false, mem_ok = false;
  probes::PoolProbe pool;
  probes::MemInfoProbe mem;
  probes::CuptiCollector cupti;
  int step = 0;
  bool step_open = false;  // begin_step without its end_step yet (e.g. the step ran out of memory)
  std::uint64_t step_start_ts = 0;
  std::vector<std::pair<Phase, std::uint64_t>> phase_ends;
  const Ledger* ledger = nullptr;

  void set_all_unavailable(const std::string& reason) {
    pool_reason = cupti_reason = mem_reason = reason;
  }
  ~Impl() {
    cupti.stop();
    mem.stop();
  }
};

ProbeSet::ProbeSet() : impl_(std::make_unique<Impl>()) {}

ProbeSet::ProbeSet(const ProbeOptions& options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.ledger = options.ledger;
  try {
    const std::string problem = probes::cuda_device_problem(options.device);
    if (!problem.empty()) {
      s.set_all_unavailable("no CUDA device: " + problem);
      return;
    }
    // CUPTI first: it prefers to be attached before the context exists.
    if (!options.enable_cupti) {
      s.cupti_reason = "disabled by the caller";
    } else {
      s.cupti_ok = s.cupti.start(&s.cupti_reason);
    }
    s.mem_ok = s.mem.start(options.device, options.sample_interval, options.enable_sampler,
                           options.ledger, &s.mem_reason);
    s.pool_ok = s.pool.start(options.allocator, &s.pool_reason);
  } catch (const std::exception& e) {
    // A probe must not fail the run: whatever did not start is unavailable.
    const std::string why = std::string("probe start failed: ") + e.what();
    if (!s.cupti_ok && s.cupti_reason.empty()) s.cupti_reason = why;
    if (!s.mem_ok && s.mem_reason.empty()) s.mem_reason = why;
    if (!s.pool_ok && s.pool_reason.empty()) s.pool_reason = why;
  }
  for (auto [ok, name, why] : {std::tuple{s.mem_ok, "memgetinfo", &s.mem_reason},
                               std::tuple{s.pool_ok, "pool", &s.pool_reason},
                               std::tuple{s.cupti_ok, "cupti", &s.cupti_reason}})
    if (!ok) spdlog::info("probe {} unavailable: {}", name, *why);
}

std::unique_ptr<ProbeSet> ProbeSet::unavailable(const std::string& reason) {
  std::unique_ptr<ProbeSet> p(new ProbeSet());
  p->impl_->set_all_unavailable(reason);
  return p;
}

ProbeSet::~ProbeSet() = default;

void ProbeSet::mark(const std::string& name) {
  Impl& s = *impl_;
  if (s.cupti_ok) s.cupti.flush(Flush::completed);
  if (s.mem_ok) s.mem.snapshot(name, s.step, s.ledger);
}

void ProbeSet::begin_step(int step) {
  Impl& s = *impl_;
  s.step = step;
  s.step_open = true;
  s.phase_ends.clear();
  if (s.cupti_ok) {
    s.cupti.flush(Flush::completed);
    s.step_start_ts = s.cupti.timestamp();
  }
  if (s.pool_ok) s.pool.begin_step();
  if (s.mem_ok) s.mem.begin_step();
}

void ProbeSet::phase_end(Phase phase) {
  Impl& s = *impl_;
  if (s.cupti_ok) {
    s.phase_ends.emplace_back(phase, s.cupti.timestamp());
    s.cupti.flush(Flush::completed);
  }
  if (s.pool_ok) s.pool.phase_end(phase);
  if (s.mem_ok) {
    s.mem.phase_end(phase);
    s.mem.snapshot(std::string("after_") + phase_name(phase), s.step, s.ledger);
  }
}

void ProbeSet::end_step() {
  Impl& s = *impl_;
  // The caller synchronised the device before end_step (probes.hpp): every record is complete.
  s.step_open = false;
  if (s.cupti_ok) s.cupti.flush(Flush::forced);
  if (s.pool_ok) s.pool.end_step();
  if (s.mem_ok) s.mem.snapshot("end_step", s.step, s.ledger);
}

PoolResult ProbeSet::pool() const {
  if (!impl_->pool_ok) {
    PoolResult r;
    r.reason = impl_->pool_reason;
    return r;
  }
  return impl_->pool.result();
}

CuptiResult ProbeSet::cupti() const {
  CuptiResult r;
  if (!impl_->cupti_ok) {
    r.reason = impl_->cupti_reason;
    return r;
  }
  r.available = true;
  // A step that never reached end_step (out of memory) had only the completed-records flushes
  // of its phase ends: hand back what CUPTI still holds before folding.
  if (impl_->step_open) impl_->cupti.flush(Flush::forced);
  r.figures = impl_->cupti.fold(impl_->step_start_ts, impl_->phase_ends);
  return r;
}

MemGetInfoResult ProbeSet::memgetinfo() const {
  if (!impl_->mem_ok) {
    MemGetInfoResult r;
    r.reason = impl_->mem_reason;
    return r;
  }
  return impl_->mem.result();
}

}  // namespace trainmem
