// The ledger: trainmem's own books. Every byte the training step allocates passes through
// Ledger::allocate with a category, a tensor name, a layer and the current phase. It keeps
// live and peak bytes per category and in total, the category breakdown at the total peak,
// a peak per phase (nestable scopes, like rmm's statistics adaptor push/pop), the activation
// bytes at the end of forward, a capped event timeline, and a record per tensor.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "trainmem/base/categories.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/figures.hpp"

namespace trainmem {

// Where bytes come from. Implementations: HostAllocator (aligned real memory, cpu backend),
// MetaAllocator (unique fake addresses, nothing touched), DeviceAllocator (cudaMallocAsync
// from a dedicated pool, src/backends/cuda), BudgetAllocator (wraps one, throws at a byte budget).
class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns nullptr when the memory cannot be had (the ledger turns that into OutOfMemory).
  virtual void* allocate(std::uint64_t bytes) = 0;
  virtual void deallocate(void* ptr, std::uint64_t bytes) = 0;
  virtual const char* name() const = 0;
  virtual bool touches_memory() const { return true; }  // false for meta
  // Why the last allocate() returned nullptr, for the OutOfMemory message ("" if unknown).
  virtual std::string failure_detail() const { return {}; }
  // Called by the ledger just before allocate() with what the bytes are for. The device
  // allocator tags its driver call with it (a CUPTI external correlation id); others ignore it.
  virtual void annotate(Category category, std::uint64_t tensor_id) {}
};

class HostAllocator final : public Allocator {
 public:
  void* allocate(std::uint64_t bytes) override;  // 256-byte aligned
  void deallocate(void* ptr, std::uint64_t bytes) override;
  const char* name() const override { return "host"; }
};

class MetaAllocator final : public Allocator {
 public:
  void* allocate(std::uint64_t bytes) override;  // unique, 256-aligned, never dereferenced
  void deallocate(void* ptr, std::uint64_t bytes) override;
  const char* name() const override { return "meta"; }
  bool touches_memory() const override { return false; }

 private:
  std::uintptr_t next_ = 0x100000;
};

// Refuses an allocation that would take the live bytes through it above `budget_bytes`.
class BudgetAllocator final : public Allocator {
 public:
  BudgetAllocator(Allocator& inner, std::uint64_t budget_bytes);
  void* allocate(std::uint64_t bytes) override;
  void deallocate(void* ptr, std::uint64_t bytes) override;
  const char* name() const override { return inner_.name(); }
  bool touches_memory() const override { return inner_.touches_memory(); }
  std::string failure_detail() const override;
  void annotate(Category category, std::uint64_t tensor_id) override {
    inner_.annotate(category, tensor_id);
  }
  std::uint64_t budget_bytes() const { return budget_; }
  std::uint64_t live_bytes() const { return live_; }

 private:
  Allocator& inner_;
  std::uint64_t budget_;
  std::uint64_t live_ = 0;
  std::uint64_t last_refused_ = 0;  // bytes of the last refused request
  bool inner_refused_ = false;      // the inner allocator, not the budget, said no
};

struct TensorRecord {
  std::uint64_t id = 0;
  std::string name;
  Category category = Category::activations;
  int layer = -1;
  std::vector<std::int64_t> shape;
  DType dtype = DType::f32;
  std::uint64_t bytes = 0;
  Phase phase = Phase::setup;  // phase at allocation
  std::uint64_t alloc_seq = 0;
  std::uint64_t free_seq = 0;  // 0 while alive
  int step = 0;                // step index at allocation (0 = setup)
};

struct LedgerEvent {
  std::uint64_t seq = 0;     // 1, 2, ... over the ledger's life
  std::int64_t time_ns = 0;  // since the ledger was created
  std::int64_t delta = 0;    // +bytes allocate, -bytes release
  Category category = Category::activations;
  std::uint64_t tensor_id = 0;
  int layer = -1;
  Phase phase = Phase::setup;
  std::uint64_t live_total = 0;  // after this event
};

// A phase scope opening (enter) or closing: after which event it happened and when. Kept so
// that phases that allocate nothing (AdamW's optimizer phase) still show on a timeline.
struct PhaseMark {
  Phase phase = Phase::setup;
  bool enter = true;
  std::uint64_t after_seq = 0;  // seq of the last event before the mark (0: none yet)
  std::int64_t time_ns = 0;     // since the ledger was created
};

struct PeakInfo {
  std::uint64_t bytes = 0;     // total live at the peak
  CategoryBytes breakdown{};   // per category at that instant
  Phase phase = Phase::setup;  // phase of the allocation that made the peak
  std::string tensor;          // tensor whose allocation made the peak
  int layer = -1;
  std::uint64_t seq = 0;
};

struct LedgerOptions {
  std::size_t timeline_cap = 1 << 20;  // events kept; later ones are counted as dropped
  bool keep_tensor_records = true;
};

class Ledger;

// RAII handle to one ledger allocation. Move-only; releases on destruction or reset().
// A Tensor must not outlive the Ledger that made it.
class Tensor {
 public:
  Tensor() = default;
  Tensor(Tensor&& o) noexcept;
  Tensor& operator=(Tensor&& o) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  ~Tensor();

  void reset();  // release now (no-op when empty)
  explicit operator bool() const { return data_ != nullptr; }
  void* data() const { return data_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t dim(int i) const { return shape_.at(i); }
  std::uint64_t numel() const;
  std::uint64_t bytes() const { return bytes_; }
  std::uint64_t id() const { return id_; }

 private:
  friend class Ledger;
  Ledger* ledger_ = nullptr;
  void* data_ = nullptr;
  std::uint64_t id_ = 0;
  std::uint64_t bytes_ = 0;
  DType dtype_ = DType::f32;
  std::vector<std::int64_t> shape_;
};

class Ledger {
 public:
  explicit Ledger(Allocator& allocator, LedgerOptions options = {});
  ~Ledger();
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // Allocates product(shape) * dtype_size(dtype) bytes (checked). Zero-size allocations are
  // refused (InputError). On allocator failure throws OutOfMemory with the requested bytes,
  // the category, the tensor name and the live bytes.
  Tensor allocate(const std::string& name, Category category, int layer,
                  std::vector<std::int64_t> shape, DType dtype);
  // Raw form for allocations that are not tensors (e.g. the probes' self-test).
  void* allocate_bytes(std::uint64_t bytes, const std::string& name, Category category, int layer,
                       std::uint64_t* id_out = nullptr);
  // Releases a pointer previously returned. A double release or a foreign pointer throws
  // Error("ledger: release of unknown pointer ...").
  void release(void* ptr);

  // Phases: push/pop nest; the current phase is the top. Each phase has its own peak of
  // total live bytes, taken over the time it was on the stack.
  void push_phase(Phase p);
  void pop_phase();
  Phase phase() const;
  class PhaseScope {
   public:
    PhaseScope(Ledger& l, Phase p) : l_(l) { l_.push_phase(p); }
    ~PhaseScope() { l_.pop_phase(); }
    PhaseScope(const PhaseScope&) = delete;
    PhaseScope& operator=(const PhaseScope&) = delete;

   private:
    Ledger& l_;
  };
  PhaseScope scope(Phase p) { return PhaseScope(*this, p); }
  // Observes phase changes: called with (p, true) right after p is pushed and with (p, false)
  // right before it is popped. The run code closes the device probes' windows on it. One
  // listener; an empty function removes it. It must not throw (pop_phase runs in
  // PhaseScope's destructor).
  using PhaseListener = std::function<void(Phase p, bool entering)>;
  void set_phase_listener(PhaseListener listener) { phase_listener_ = std::move(listener); }

  // Steps: begin_step resets all peaks (per category, total, per phase) to the live bytes.
  void begin_step(int step);
  int step() const { return step_; }
  // Records the activation bytes alive now as "activations at the end of forward".
  void mark_end_of_forward();

  std::uint64_t live(Category c) const { return live_[idx(c)]; }
  std::uint64_t peak(Category c) const { return peak_[idx(c)]; }
  std::uint64_t live_total() const { return live_total_; }
  const PeakInfo& peak_total() const { return peak_total_; }
  std::uint64_t phase_peak(Phase p) const { return phase_peak_[static_cast<int>(p)]; }
  std::uint64_t activations_end_of_forward() const { return act_end_forward_; }
  CategoryBytes live_all() const { return live_; }
  // Number of allocations alive now, and its maximum since the last begin_step (the device
  // pool rounds each allocation, so this bounds the pool's rounding; see reconcile.hpp).
  std::uint64_t live_count() const { return live_ptrs_.size(); }
  std::uint64_t peak_live_count() const { return peak_live_count_; }

  const std::vector<LedgerEvent>& timeline() const { return events_; }
  const std::vector<PhaseMark>& phase_marks() const { return phase_marks_; }
  std::uint64_t dropped_events() const { return dropped_; }
  const std::vector<TensorRecord>& tensors() const { return records_; }
  // Names and bytes of the tensors alive now (for OOM reports).
  std::vector<const TensorRecord*> live_tensors() const;
  // The tensors alive when the last OutOfMemory was thrown (allocation order): what an OOM report
  // lists, even after the unwinding freed them (an OOM inside a constructor).
  const std::vector<TensorRecord>& live_at_last_failure() const { return live_at_failure_; }
  Allocator& allocator() { return alloc_; }

 private:
  std::vector<TensorRecord> live_at_failure_;
  static int idx(Category c) { return static_cast<int>(c); }
  void on_alloc(std::uint64_t id, std::uint64_t bytes, Category c, int layer,
                const std::string& name);
  void on_free(std::uint64_t id, std::uint64_t bytes, Category c, int layer);
  struct Live {
    std::uint64_t id;
    std::uint64_t bytes;
    Category category;
    int layer;
    std::size_t record;  // index into records_, or SIZE_MAX
  };

  Allocator& alloc_;
  LedgerOptions opt_;
  std::chrono::steady_clock::time_point t0_;
  std::unordered_map<void*, Live> live_ptrs_;
  CategoryBytes live_{};
  CategoryBytes peak_{};
  std::uint64_t live_total_ = 0;
  PeakInfo peak_total_;
  std::array<std::uint64_t, kNumPhases> phase_peak_{};
  std::array<int, kNumPhases> phase_depth_{};
  std::vector<Phase> phase_stack_;
  PhaseListener phase_listener_;
  std::uint64_t act_end_forward_ = 0;
  std::uint64_t seq_ = 0;
  std::uint64_t next_id_ = 1;
  std::uint64_t dropped_ = 0;
  std::uint64_t peak_live_count_ = 0;
  int step_ = 0;
  std::vector<LedgerEvent> events_;
  std::vector<PhaseMark> phase_marks_;
  std::vector<TensorRecord> records_;
};

// The ledger's figures for the step run last (docs/design.md meanings): params, optimizer_states
// and inputs live; gradients, activations_peak, workspace the step's peaks; activations alive at
// the end of forward; peak the total high-water mark with its breakdown; sum = params +
// gradients + optimizer_states + activations.
MemoryFigures measured_figures(const Ledger& ledger);

}  // namespace trainmem
