// --allocator on a run (include/trainmem/run/allocator_model.hpp).
#include "trainmem/run/allocator_model.hpp"

#include <algorithm>

#include "trainmem/base/error.hpp"

namespace trainmem {

ModelledAllocator::ModelledAllocator(Allocator& inner, std::string spec,
                                     CachingAllocatorConfig config)
    : inner_(inner), spec_(std::move(spec)), config_(config), model_(std::move(config)) {}

void* ModelledAllocator::allocate(std::uint64_t bytes) {
  const std::uint64_t id = next_id_++;
  inner_refused_ = false;
  if (auto oom = model_.malloc(id, bytes)) {
    oom_ = std::move(oom);
    return nullptr;
  }
  void* p = inner_.allocate(bytes);
  if (p == nullptr) {
    model_.free(id);
    inner_refused_ = true;
    return nullptr;
  }
  ids_[p] = id;
  return p;
}

void ModelledAllocator::deallocate(void* ptr, std::uint64_t bytes) {
  const auto it = ids_.find(ptr);
  if (it == ids_.end())
    throw Error("allocator model: release of a pointer it did not hand out");
  model_.free(it->second);
  ids_.erase(it);
  inner_.deallocate(ptr, bytes);
}

std::string ModelledAllocator::failure_detail() const {
  if (inner_refused_ || !oom_) return inner_.failure_detail();
  return "PyTorch's caching allocator (" + spec_ + ") would raise: " + oom_->message;
}

void ModelledAllocator::begin_step() {
  const CachingAllocatorStats& s = model_.stats();
  run_reserved_peak_ = std::max(run_reserved_peak_, s.reserved.peak);
  run_allocated_peak_ = std::max(run_allocated_peak_, s.allocated.peak);
  model_.reset_peaks();
}

AllocatorModelResult ModelledAllocator::result() const {
  AllocatorModelResult r;
  r.spec = spec_;
  r.config = config_;
  r.step = model_.stats();
  r.segments_at_reserved_peak = model_.segments_at_reserved_peak();
  r.run_reserved_peak = std::max(run_reserved_peak_, r.step.reserved.peak);
  r.run_allocated_peak = std::max(run_allocated_peak_, r.step.allocated.peak);
  r.oom = oom_;
  return r;
}

}  // namespace trainmem
