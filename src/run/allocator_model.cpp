// --allocator on a run (include/trainmem/run/allocator_model.hpp).
#include "trainmem/run/allocator_model.hpp"

#include <algorithm>

#include "trainmem/base/error.hpp"

namespace trainmem {

void ModelledAllocator::Mirror::begin_step() {
  const CachingAllocatorStats& s = model.stats();
  run_reserved_peak = std::max(run_reserved_peak, s.reserved.peak);
  run_allocated_peak = std::max(run_allocated_peak, s.allocated.peak);
  model.reset_peaks();
}

AllocatorModelResult ModelledAllocator::Mirror::result() const {
  AllocatorModelResult r;
  r.spec = spec;
  r.config = config;
  r.step = model.stats();
  r.segments_at_reserved_peak = model.segments_at_reserved_peak();
  r.run_reserved_peak = std::max(run_reserved_peak, r.step.reserved.peak);
  r.run_allocated_peak = std::max(run_allocated_peak, r.step.allocated.peak);
  return r;
}

AllocatorSpec parse_allocator(const std::string& text) {
  return {text, parse_allocator_spec(text)};
}

ModelledAllocator::ModelledAllocator(Allocator& inner, const AllocatorSpec& allocator,
                                     const std::vector<AllocatorSpec>& shadows)
    : inner_(inner), primary_(allocator.spec, allocator.config) {
  for (const AllocatorSpec& s : shadows) {
    CachingAllocatorConfig c = s.config;
    c.device_bytes.reset();  // figures only: a shadow never refuses
    shadows_.push_back(std::make_unique<Mirror>(s.spec, c));
  }
}

void* ModelledAllocator::allocate(std::uint64_t bytes) {
  const std::uint64_t id = next_id_++;
  inner_refused_ = false;
  if (auto oom = primary_.model.malloc(id, bytes)) {
    oom_ = std::move(oom);
    return nullptr;
  }
  void* p = inner_.allocate(bytes);
  if (p == nullptr) {
    primary_.model.free(id);
    inner_refused_ = true;
    return nullptr;
  }
  for (auto& s : shadows_) s->model.malloc(id, bytes);  // unlimited: never refuses
  ids_[p] = id;
  return p;
}

void ModelledAllocator::deallocate(void* ptr, std::uint64_t bytes) {
  const auto it = ids_.find(ptr);
  if (it == ids_.end()) throw Error("allocator model: release of a pointer it did not hand out");
  primary_.model.free(it->second);
  for (auto& s : shadows_) s->model.free(it->second);
  ids_.erase(it);
  inner_.deallocate(ptr, bytes);
}

std::string ModelledAllocator::failure_detail() const {
  if (inner_refused_ || !oom_) return inner_.failure_detail();
  return "PyTorch's caching allocator (" + primary_.spec + ") would raise: " + oom_->message;
}

void ModelledAllocator::begin_step() {
  primary_.begin_step();
  for (auto& s : shadows_) s->begin_step();
}

AllocatorModelResult ModelledAllocator::result() const {
  AllocatorModelResult r = primary_.result();
  r.oom = oom_;
  return r;
}

std::vector<AllocatorModelResult> ModelledAllocator::shadow_results() const {
  std::vector<AllocatorModelResult> out;
  for (const auto& s : shadows_) out.push_back(s->result());
  return out;
}

AllocatorModelResult replay_hf_step(const HfStep& st, const AllocatorSpec& spec) {
  CachingAllocatorModel model(spec.config);
  AllocatorModelResult r;
  r.spec = spec.spec;
  r.config = spec.config;
  // An empty tensor (a rank's AdamW moments of a parameter it owns no row of under FSDP2) has
  // no storage: the caching allocator is never asked.
  for (std::size_t i = 0; i < st.first_step_tensor && !r.oom; ++i)
    if (st.tensors[i].bytes > 0) r.oom = model.malloc(i, st.tensors[i].bytes);
  const std::uint64_t setup_reserved = model.stats().reserved.peak;
  const std::uint64_t setup_allocated = model.stats().allocated.peak;
  model.reset_peaks();
  for (const HfStepEvent& e : st.events) {
    if (r.oom) break;
    if (st.tensors[e.tensor].bytes == 0) continue;
    if (e.alloc)
      r.oom = model.malloc(e.tensor, st.tensors[e.tensor].bytes);
    else
      model.free(e.tensor);
  }
  r.step = model.stats();
  r.segments_at_reserved_peak = model.segments_at_reserved_peak();
  r.run_reserved_peak = std::max(setup_reserved, r.step.reserved.peak);
  r.run_allocated_peak = std::max(setup_allocated, r.step.allocated.peak);
  return r;
}

}  // namespace trainmem
