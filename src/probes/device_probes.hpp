// The memgetinfo and pool probes (CUDA builds). Each start() returns false with a reason
// instead of throwing; afterwards their methods never throw.
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "trainmem/probes/probes.hpp"

namespace trainmem::probes {

// "cudaGetDeviceCount: cudaErrorInsufficientDriver (35): ..." or "" when `device` is usable.
std::string cuda_device_problem(int device);

class MemInfoProbe {
 public:
  ~MemInfoProbe();
  bool start(int device, std::chrono::microseconds interval, bool sampler, const Ledger* ledger,
             std::string* reason);
  void snapshot(const std::string& name, int step, const Ledger* ledger);
  void begin_step();
  void phase_end(Phase phase);
  void stop();
  MemGetInfoResult result() const;

 private:
  bool read(std::uint64_t* free_b, std::uint64_t* used_b) const;
  void sampler_loop();
  void note_used(std::uint64_t used);

  int device_ = 0;
  std::chrono::microseconds interval_{1000};  // read by the sampler thread
  bool running_ = false;
  MemGetInfoResult r_;  // snapshots and closed windows; guarded by mu_
  mutable std::mutex mu_;
  std::atomic<std::uint64_t> step_max_{0};
  std::atomic<std::uint64_t> window_max_{0};
  std::atomic<std::uint64_t> samples_{0};
  std::thread sampler_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_requested_ = false;
};

class PoolProbe {
 public:
  bool start(const Allocator* allocator, std::string* reason);
  void begin_step();
  void phase_end(Phase phase);
  void end_step();
  PoolResult result() const { return r_; }

 private:
  bool read(cudaMemPoolAttr attr, std::uint64_t* out);
  void reset_highs();
  cudaMemPool_t pool_ = nullptr;
  PoolResult r_;
};

}  // namespace trainmem::probes
