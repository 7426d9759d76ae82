// CUPTI activity collection (cupti_collector.hpp) and the allocator's external-id tagging
// (cupti_tag.hpp).
#include "cupti_collector.hpp"

#include <cupti.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>

#include "cupti_records.hpp"
#include "cupti_tag.hpp"

namespace trainmem::probes {

namespace {

constexpr std::size_t kBufferBytes = 4u << 20;  // per request; CUPTI wants 8-byte alignment
constexpr std::size_t kBufferAlign = 8;

// The collector CUPTI's callbacks deliver to. Guarded by g_mu so that stop() cannot free a
// collector while a completion callback (on CUPTI's worker thread) is using it.
std::mutex g_mu;
CuptiCollector* g_collector = nullptr;
std::atomic<bool> g_tagging{false};

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  // A fresh buffer for every request; nullptr makes CUPTI drop (and count) records.
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(kBufferAlign, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext ctx, std::uint32_t stream_id, std::uint8_t* buffer,
                               std::size_t /*size*/, std::size_t valid_size) {
  std::size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(ctx, stream_id, &dropped) != CUPTI_SUCCESS) dropped = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_collector != nullptr) g_collector->consume(buffer, valid_size, dropped);
  }
  std::free(buffer);
}

constexpr CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_MEMORY2, CUPTI_ACTIVITY_KIND_MEMORY_POOL,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
    CUPTI_ACTIVITY_KIND_RUNTIME,  // external correlation attaches to runtime API records
};

const char* kind_name(CUpti_ActivityKind k) {
  switch (k) {
    case CUPTI_ACTIVITY_KIND_MEMORY2:
      return "CUPTI_ACTIVITY_KIND_MEMORY2";
    case CUPTI_ACTIVITY_KIND_MEMORY_POOL:
      return "CUPTI_ACTIVITY_KIND_MEMORY_POOL";
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION:
      return "CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION";
    case CUPTI_ACTIVITY_KIND_RUNTIME:
      return "CUPTI_ACTIVITY_KIND_RUNTIME";
    default:
      return "?";
  }
}

}  // namespace

std::string cupti_result_string(int result) {
  const char* name = nullptr;
  if (cuptiGetResultString(static_cast<CUptiResult>(result), &name) != CUPTI_SUCCESS)
    name = nullptr;
  std::string s = name ? name : "CUPTI error";
  s += " (" + std::to_string(result) + ")";
  const char* msg = nullptr;
  if (cuptiGetErrorMessage(static_cast<CUptiResult>(result), &msg) == CUPTI_SUCCESS && msg &&
      *msg && (name == nullptr || std::string(msg) != name))
    s += std::string(": ") + msg;
  if (result == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
    s += " (another profiler, e.g. Nsight Systems, is subscribed to CUPTI)";
  return s;
}

bool cupti_tagging_active() {
  return g_tagging.load(std::memory_order_acquire);
}

bool cupti_push_external_id(std::uint64_t external_id) {
  if (!cupti_tagging_active()) return false;
  return cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0,
                                                external_id) == CUPTI_SUCCESS;
}

void cupti_pop_external_id() {
  std::uint64_t last = 0;
  (void)cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
}

CuptiCollector::~CuptiCollector() {
  stop();
}

bool CuptiCollector::start(std::string* reason) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_collector != nullptr) {
      *reason =
          "CUPTI activity collection is already running in this process (one ProbeSet "
          "at a time)";
      return false;
    }
  }
  CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (r != CUPTI_SUCCESS) {
    *reason = "cuptiActivityRegisterCallbacks: " + cupti_result_string(r);
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_collector = this;
  }
  for (CUpti_ActivityKind k : kKinds) {
    r = cuptiActivityEnable(k);
    if (r != CUPTI_SUCCESS) {
      *reason = std::string("cuptiActivityEnable(") + kind_name(k) + "): " + cupti_result_string(r);
      stop();
      return false;
    }
    enabled_kinds_.push_back(static_cast<int>(k));
  }
  running_ = true;
  g_tagging.store(true, std::memory_order_release);
  return true;
}

bool CuptiCollector::flush(Flush kind) {
  if (!running_) return false;
  const CUptiResult r =
      cuptiActivityFlushAll(kind == Flush::forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0);
  if (r != CUPTI_SUCCESS) {
    spdlog::warn("cupti probe: cuptiActivityFlushAll: {}", cupti_result_string(r));
    return false;
  }
  return true;
}

std::uint64_t CuptiCollector::timestamp() const {
  std::uint64_t t = 0;
  if (cuptiGetTimestamp(&t) != CUPTI_SUCCESS) return 0;
  return t;
}

void CuptiCollector::stop() {
  bool owner = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    owner = g_collector == this;
  }
  if (!owner) return;
  g_tagging.store(false, std::memory_order_release);
  // Disable first, then flush: no record is made after the last flush, so no buffer is left
  // behind in CUPTI (each holds kBufferBytes until some later flush).
  for (int k : enabled_kinds_) (void)cuptiActivityDisable(static_cast<CUpti_ActivityKind>(k));
  enabled_kinds_.clear();
  if (running_) (void)cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  running_ = false;
  std::lock_guard<std::mutex> lock(g_mu);
  g_collector = nullptr;
}

CuptiFigures CuptiCollector::fold(std::uint64_t step_start_ns,
                                  const std::vector<std::pair<Phase, std::uint64_t>>& phase_ends) {
  std::lock_guard<std::mutex> lock(mu_);
  return fold_.fold(step_start_ns, phase_ends);
}

void CuptiCollector::consume(std::uint8_t* buffer, std::size_t valid_size, std::uint64_t dropped) {
  std::lock_guard<std::mutex> lock(mu_);
  fold_.add_dropped(dropped);
  if (buffer == nullptr || valid_size == 0) return;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid_size, &record) == CUPTI_SUCCESS)
    add_cupti_record(fold_, record);
}

}  // namespace trainmem::probes
