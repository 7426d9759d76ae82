// The memgetinfo probe: cudaMemGetInfo snapshots at named points and a background sampler
// that keeps the max of (total - free) per step and per phase window.
#include <spdlog/spdlog.h>

#include "device_probes.hpp"
#include "trainmem/backends/device_rules.hpp"
#include "trainmem/base/cuda_check.hpp"

namespace trainmem::probes {

std::string cuda_device_problem(int device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    const std::string hint = device_rules::no_device_hint(static_cast<int>(e));
    return "cudaGetDeviceCount: " + detail::cuda_error_string(e) + (hint.empty() ? "" : "; ") +
           hint;
  }
  if (count == 0) return "no CUDA device present";
  if (device < 0 || device >= count)
    return "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
           " present)";
  return "";
}

namespace {
void atomic_max(std::atomic<std::uint64_t>& a, std::uint64_t v) {
  std::uint64_t cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}
}  // namespace

MemInfoProbe::~MemInfoProbe() {
  stop();
}

bool MemInfoProbe::read(std::uint64_t* free_b, std::uint64_t* used_b) const {
  std::size_t f = 0, t = 0;
  const cudaError_t e = cudaMemGetInfo(&f, &t);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  *free_b = f;
  *used_b = t - f;
  return true;
}

bool MemInfoProbe::start(int device, std::chrono::microseconds interval, bool sampler,
                         const Ledger* ledger, std::string* reason) {
  device_ = device;
  interval_ = interval;
  cudaError_t e = cudaSetDevice(device);
  std::size_t f = 0, t = 0;
  if (e == cudaSuccess) e = cudaMemGetInfo(&f, &t);  // creates the primary context
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    *reason = "cudaMemGetInfo: " + detail::cuda_error_string(e);
    return false;
  }
  r_.available = true;
  r_.total = t;
  r_.sample_interval = interval;
  MemSnapshot snap{"probe_start", 0, f, t - f};
  if (ledger != nullptr) {
    snap.has_ledger = true;
    snap.ledger_live = ledger->live_total();
  }
  r_.snapshots.push_back(snap);
  running_ = true;
  if (sampler) {
    r_.sampler_running = true;
    sampler_ = std::thread([this] { sampler_loop(); });
  }
  return true;
}

void MemInfoProbe::note_used(std::uint64_t used) {
  atomic_max(step_max_, used);
  atomic_max(window_max_, used);
  samples_.fetch_add(1, std::memory_order_relaxed);
}

void MemInfoProbe::sampler_loop() {
  if (cudaSetDevice(device_) != cudaSuccess) {
    (void)cudaGetLastError();
    spdlog::warn("memgetinfo sampler: cudaSetDevice({}) failed; sampler stopped", device_);
    return;
  }
  std::unique_lock<std::mutex> lock(stop_mu_);
  while (!stop_requested_) {
    std::uint64_t f = 0, used = 0;
    if (read(&f, &used)) note_used(used);
    stop_cv_.wait_for(lock, interval_, [this] { return stop_requested_; });
  }
}

void MemInfoProbe::snapshot(const std::string& name, int step, const Ledger* ledger) {
  if (!running_) return;
  std::uint64_t f = 0, used = 0;
  if (!read(&f, &used)) {
    spdlog::warn("memgetinfo probe: cudaMemGetInfo failed at '{}'", name);
    return;
  }
  note_used(used);
  std::lock_guard<std::mutex> lock(mu_);
  MemSnapshot snap{name, step, f, used};
  if (ledger != nullptr) {
    snap.has_ledger = true;
    snap.ledger_live = ledger->live_total();
  }
  r_.snapshots.push_back(snap);
}

void MemInfoProbe::begin_step() {
  if (!running_) return;
  std::uint64_t f = 0, used = 0;
  const bool ok = read(&f, &used);
  step_max_.store(ok ? used : 0);
  window_max_.store(ok ? used : 0);
  std::lock_guard<std::mutex> lock(mu_);
  r_.phase_samples.clear();
}

void MemInfoProbe::phase_end(Phase phase) {
  if (!running_) return;
  std::uint64_t f = 0, used = 0;
  const bool ok = read(&f, &used);
  if (ok) note_used(used);
  const std::uint64_t w = window_max_.exchange(ok ? used : 0);
  std::lock_guard<std::mutex> lock(mu_);
  r_.phase_samples.push_back(MemPhaseSample{phase, w});
}

void MemInfoProbe::stop() {
  if (sampler_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(stop_mu_);
      stop_requested_ = true;
    }
    stop_cv_.notify_all();
    sampler_.join();
  }
  running_ = false;
}

MemGetInfoResult MemInfoProbe::result() const {
  std::lock_guard<std::mutex> lock(mu_);
  MemGetInfoResult r = r_;
  r.samples = samples_.load();
  r.sampler_max_used = step_max_.load();
  return r;
}

}  // namespace trainmem::probes
