// CUPTI activity collection for the cupti probe: registers the buffer callbacks, enables
// MEMORY2, MEMORY_POOL, EXTERNAL_CORRELATION and RUNTIME, and feeds every completed buffer
// to a CuptiFold under a mutex. One collector may run per process (CUPTI's activity API is
// process-wide); a second one reports why it cannot start.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cupti_fold.hpp"

namespace trainmem::probes {

// "CUPTI_ERROR_NOT_INITIALIZED (15): ..." for a CUPTI result code.
std::string cupti_result_string(int result);

class CuptiCollector {
 public:
  CuptiCollector() = default;
  ~CuptiCollector();
  CuptiCollector(const CuptiCollector&) = delete;
  CuptiCollector& operator=(const CuptiCollector&) = delete;

  // Starts collecting. On failure returns false with the call and CUPTI's error in *reason,
  // and leaves CUPTI as it found it.
  bool start(std::string* reason);
  bool running() const { return running_; }
  // Hands CUPTI's buffers to the completion handler. Flush::completed hands back the buffers
  // whose records are all complete (cheap; used at marks and phase ends). Flush::forced hands
  // back every buffer, incomplete records included (cuptiActivityFlushAll's documentation:
  // the caller synchronises first if it wants complete records): only after the caller has
  // synchronised the stream (end of a step) and at stop. Returns false (and logs) on a CUPTI
  // error.
  enum class Flush { completed, forced };
  bool flush(Flush kind);
  // CUPTI's clock (the records' timestamps), or 0 on error.
  std::uint64_t timestamp() const;
  void stop();

  // Folds what has been collected (thread-safe against the completion handler).
  CuptiFigures fold(std::uint64_t step_start_ns,
                    const std::vector<std::pair<Phase, std::uint64_t>>& phase_ends);

  // Called from CUPTI's completion callback.
  void consume(std::uint8_t* buffer, std::size_t valid_size, std::uint64_t dropped);

 private:
  std::mutex mu_;
  CuptiFold fold_;
  bool running_ = false;
  std::vector<int> enabled_kinds_;
};

}  // namespace trainmem::probes
