// The ledger (include/trainmem/ledger/ledger.hpp): categorised books over one allocator, and the
// host, meta and budget allocators.
#include "trainmem/ledger/ledger.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "trainmem/base/checked.hpp"

namespace trainmem {

namespace {
constexpr std::uint64_t kAlign = 256;

// Rounds up to kAlign; false when the result does not fit in 64 bits.
bool round_up_aligned(std::uint64_t bytes, std::uint64_t* out) {
  if (bytes > std::numeric_limits<std::uint64_t>::max() - (kAlign - 1)) return false;
  *out = (bytes + kAlign - 1) / kAlign * kAlign;
  return true;
}

std::string pointer_string(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}
}  // namespace

// ---------------------------------------------------------------- allocators

void* HostAllocator::allocate(std::uint64_t bytes) {
  std::uint64_t rounded = 0;
  if (bytes == 0 || !round_up_aligned(bytes, &rounded)) return nullptr;
  if (rounded > std::numeric_limits<std::size_t>::max()) return nullptr;
  return std::aligned_alloc(kAlign, static_cast<std::size_t>(rounded));
}

void HostAllocator::deallocate(void* ptr, std::uint64_t) {
  std::free(ptr);
}

void* MetaAllocator::allocate(std::uint64_t bytes) {
  // Each allocation gets its own non-overlapping, 256-aligned range of a fake address space,
  // so pointer identity and ranges stay meaningful without touching memory.
  std::uint64_t rounded = 0;
  if (!round_up_aligned(std::max<std::uint64_t>(bytes, 1), &rounded) ||
      rounded > std::numeric_limits<std::uintptr_t>::max() - next_)
    throw Error("meta allocator: fake address space exhausted");
  void* p = reinterpret_cast<void*>(next_);
  next_ += rounded;
  return p;
}

void MetaAllocator::deallocate(void*, std::uint64_t) {}

BudgetAllocator::BudgetAllocator(Allocator& inner, std::uint64_t budget_bytes)
    : inner_(inner), budget_(budget_bytes) {}

void* BudgetAllocator::allocate(std::uint64_t bytes) {
  if (bytes > budget_ - live_) {  // live_ <= budget_ always holds
    last_refused_ = bytes;
    inner_refused_ = false;
    return nullptr;
  }
  void* p = inner_.allocate(bytes);
  if (p == nullptr) {
    last_refused_ = bytes;
    inner_refused_ = true;
    return nullptr;
  }
  live_ += bytes;
  return p;
}

void BudgetAllocator::deallocate(void* ptr, std::uint64_t bytes) {
  inner_.deallocate(ptr, bytes);
  live_ -= std::min(live_, bytes);
}

std::string BudgetAllocator::failure_detail() const {
  if (inner_refused_) return inner_.failure_detail();
  return "budget of " + std::to_string(budget_) + " bytes exceeded (" + std::to_string(live_) +
         " bytes live through the budget, " + std::to_string(last_refused_) + " requested)";
}

// ---------------------------------------------------------------- tensor handles

Tensor::Tensor(Tensor&& o) noexcept
    : ledger_(o.ledger_),
      data_(o.data_),
      id_(o.id_),
      bytes_(o.bytes_),
      dtype_(o.dtype_),
      shape_(std::move(o.shape_)) {
  o.ledger_ = nullptr;
  o.data_ = nullptr;
  o.id_ = 0;
  o.bytes_ = 0;
}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    try {
      reset();
    } catch (const std::exception& e) {
      spdlog::error("tensor release failed: {}", e.what());
    }
    ledger_ = o.ledger_;
    data_ = o.data_;
    id_ = o.id_;
    bytes_ = o.bytes_;
    dtype_ = o.dtype_;
    shape_ = std::move(o.shape_);
    o.ledger_ = nullptr;
    o.data_ = nullptr;
    o.id_ = 0;
    o.bytes_ = 0;
  }
  return *this;
}

Tensor::~Tensor() {
  try {
    reset();
  } catch (const std::exception& e) {
    spdlog::error("tensor release failed: {}", e.what());
  }
}

void Tensor::reset() {
  if (data_ == nullptr || ledger_ == nullptr) return;
  void* p = data_;
  Ledger* l = ledger_;
  data_ = nullptr;
  ledger_ = nullptr;
  l->release(p);
}

std::uint64_t Tensor::numel() const {
  std::uint64_t n = 1;
  for (auto d : shape_) n = checked_mul(n, static_cast<std::uint64_t>(d), "tensor numel");
  return n;
}

// ---------------------------------------------------------------- the ledger

Ledger::Ledger(Allocator& allocator, LedgerOptions options)
    : alloc_(allocator), opt_(options), t0_(std::chrono::steady_clock::now()) {
  live_ptrs_.reserve(1024);
}

Ledger::~Ledger() {
  if (live_ptrs_.empty()) return;
  spdlog::debug("ledger: releasing {} allocations still alive at destruction", live_ptrs_.size());
  for (auto& [ptr, l] : live_ptrs_) {
    try {
      alloc_.deallocate(ptr, l.bytes);
    } catch (const std::exception& e) {
      spdlog::error("ledger: release at destruction failed: {}", e.what());
    }
  }
}

Tensor Ledger::allocate(const std::string& name, Category category, int layer,
                        std::vector<std::int64_t> shape, DType dtype) {
  std::uint64_t n = 1;
  for (auto d : shape) {
    if (d < 0)
      throw InputError("ledger: tensor '" + name + "' has a negative dimension (" +
                       std::to_string(d) + "); dimensions must be >= 0");
    n = checked_mul(n, static_cast<std::uint64_t>(d), "tensor size");
  }
  const std::uint64_t bytes = checked_mul(n, dtype_size(dtype), "tensor bytes");
  if (bytes == 0)
    throw InputError("ledger: tensor '" + name + "' has zero size; allocations must be > 0 bytes");
  Tensor t;
  t.data_ = allocate_bytes(bytes, name, category, layer, &t.id_);
  t.ledger_ = this;
  t.bytes_ = bytes;
  t.dtype_ = dtype;
  if (opt_.keep_tensor_records) {
    TensorRecord& r = records_.back();  // allocate_bytes just appended it
    r.shape = shape;
    r.dtype = dtype;
  }
  t.shape_ = std::move(shape);
  return t;
}

void* Ledger::allocate_bytes(std::uint64_t bytes, const std::string& name, Category category,
                             int layer, std::uint64_t* id_out) {
  if (bytes == 0)
    throw InputError("ledger: allocation '" + name + "' of 0 bytes; allocations must be > 0 bytes");
  alloc_.annotate(category, next_id_);
  void* p = alloc_.allocate(bytes);
  if (p == nullptr) {
    std::string detail = alloc_.failure_detail();
    std::string live = "live by category:";
    for (Category c : all_categories())
      live += std::string(" ") + category_name(c) + "=" + std::to_string(live_[idx(c)]);
    detail = detail.empty() ? live : detail + "; " + live;
    live_at_failure_.clear();
    for (const TensorRecord* t : live_tensors()) live_at_failure_.push_back(*t);
    throw OutOfMemory(bytes, category_name(category), name, live_total_,
                      std::string(alloc_.name()) + " allocator: " + detail);
  }
  const std::uint64_t id = next_id_;
  try {
    std::size_t rec = SIZE_MAX;
    if (opt_.keep_tensor_records) {
      TensorRecord r;
      r.id = id;
      r.name = name;
      r.category = category;
      r.layer = layer;
      // A raw allocation has no shape; allocate() fills in shape and dtype.
      r.bytes = bytes;
      r.phase = phase();
      r.alloc_seq = seq_ + 1;
      r.step = step_;
      rec = records_.size();
      records_.push_back(std::move(r));
    }
    auto [it, inserted] = live_ptrs_.emplace(p, Live{id, bytes, category, layer, rec});
    if (!inserted) {
      if (rec != SIZE_MAX) records_.pop_back();
      throw Error("ledger: allocator '" + std::string(alloc_.name()) + "' returned pointer " +
                  pointer_string(p) + " which is still live");
    }
  } catch (...) {
    alloc_.deallocate(p, bytes);
    throw;
  }
  ++next_id_;
  if (live_ptrs_.size() > peak_live_count_) peak_live_count_ = live_ptrs_.size();
  on_alloc(id, bytes, category, layer, name);
  if (id_out) *id_out = id;
  return p;
}

void Ledger::release(void* ptr) {
  auto it = live_ptrs_.find(ptr);
  if (it == live_ptrs_.end())
    throw Error("ledger: release of unknown pointer " + pointer_string(ptr) +
                " (released twice, or not allocated by this ledger)");
  const Live l = it->second;
  alloc_.deallocate(ptr, l.bytes);
  live_ptrs_.erase(it);
  on_free(l.id, l.bytes, l.category, l.layer);
  if (l.record != SIZE_MAX) records_[l.record].free_seq = seq_;
}

void Ledger::on_alloc(std::uint64_t id, std::uint64_t bytes, Category c, int layer,
                      const std::string& name) {
  ++seq_;
  const int ci = idx(c);
  live_[ci] += bytes;
  live_total_ += bytes;
  if (live_[ci] > peak_[ci]) peak_[ci] = live_[ci];
  const Phase cur = phase();
  if (live_total_ > peak_total_.bytes) {
    peak_total_.bytes = live_total_;
    peak_total_.breakdown = live_;
    peak_total_.phase = cur;
    peak_total_.tensor = name;
    peak_total_.layer = layer;
    peak_total_.seq = seq_;
  }
  const bool stack_empty = phase_stack_.empty();
  for (int p = 0; p < kNumPhases; ++p) {
    const bool active = phase_depth_[p] > 0 || (p == 0 && stack_empty);
    if (active && live_total_ > phase_peak_[p]) phase_peak_[p] = live_total_;
  }
  if (events_.size() < opt_.timeline_cap) {
    LedgerEvent e;
    e.seq = seq_;
    e.time_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_)
            .count();
    e.delta = static_cast<std::int64_t>(bytes);
    e.category = c;
    e.tensor_id = id;
    e.layer = layer;
    e.phase = cur;
    e.live_total = live_total_;
    events_.push_back(e);
  } else {
    ++dropped_;
  }
}

void Ledger::on_free(std::uint64_t id, std::uint64_t bytes, Category c, int layer) {
  ++seq_;
  live_[idx(c)] -= bytes;
  live_total_ -= bytes;
  if (events_.size() < opt_.timeline_cap) {
    LedgerEvent e;
    e.seq = seq_;
    e.time_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_)
            .count();
    e.delta = -static_cast<std::int64_t>(bytes);
    e.category = c;
    e.tensor_id = id;
    e.layer = layer;
    e.phase = phase();
    e.live_total = live_total_;
    events_.push_back(e);
  } else {
    ++dropped_;
  }
}

// A phase is "active" while it is anywhere on the stack; setup is also active while the
// stack is empty. A phase's peak is the maximum of live bytes over the time it was active.
namespace {
std::int64_t ns_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
      .count();
}
}  // namespace

void Ledger::push_phase(Phase p) {
  if (phase_marks_.size() < opt_.timeline_cap)
    phase_marks_.push_back({p, true, seq_, ns_since(t0_)});
  phase_stack_.push_back(p);
  ++phase_depth_[static_cast<int>(p)];
  auto& pk = phase_peak_[static_cast<int>(p)];
  if (live_total_ > pk) pk = live_total_;
  if (phase_listener_) phase_listener_(p, true);
}

void Ledger::pop_phase() {
  if (phase_stack_.empty()) throw Error("ledger: pop_phase without a matching push_phase");
  const Phase p = phase_stack_.back();
  if (phase_listener_) phase_listener_(p, false);
  phase_stack_.pop_back();
  if (phase_marks_.size() < opt_.timeline_cap)
    phase_marks_.push_back({p, false, seq_, ns_since(t0_)});
  --phase_depth_[static_cast<int>(p)];
  if (phase_stack_.empty()) {
    auto& pk = phase_peak_[static_cast<int>(Phase::setup)];
    if (live_total_ > pk) pk = live_total_;
  }
}

Phase Ledger::phase() const {
  return phase_stack_.empty() ? Phase::setup : phase_stack_.back();
}

void Ledger::begin_step(int step) {
  step_ = step;
  peak_ = live_;
  peak_total_ = PeakInfo{};
  peak_total_.bytes = live_total_;
  peak_total_.breakdown = live_;
  peak_total_.phase = phase();
  peak_total_.seq = seq_;
  const bool stack_empty = phase_stack_.empty();
  for (int p = 0; p < kNumPhases; ++p) {
    const bool active = phase_depth_[p] > 0 || (p == 0 && stack_empty);
    phase_peak_[p] = active ? live_total_ : 0;
  }
  act_end_forward_ = 0;
  peak_live_count_ = live_ptrs_.size();
}

void Ledger::mark_end_of_forward() {
  act_end_forward_ = live_[idx(Category::activations)];
}

std::vector<const TensorRecord*> Ledger::live_tensors() const {
  std::vector<const TensorRecord*> out;
  out.reserve(live_ptrs_.size());
  for (const auto& kv : live_ptrs_)
    if (kv.second.record != SIZE_MAX) out.push_back(&records_[kv.second.record]);
  std::sort(out.begin(), out.end(), [](const TensorRecord* a, const TensorRecord* b) {
    return a->alloc_seq < b->alloc_seq;
  });
  return out;
}

}  // namespace trainmem
