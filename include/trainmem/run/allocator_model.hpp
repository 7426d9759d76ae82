// --allocator pytorch[:...] on a run: every allocation the ledger makes is made again in a model
// of PyTorch's CUDA caching allocator (include/trainmem/analytic/caching_allocator.hpp), so that
// a run reports what `torch.cuda.memory_reserved()` would show for the same sequence of tensors,
// and, with --device-budget, runs out of memory where PyTorch would: when the *reserved* bytes
// cannot grow, not when the live bytes pass the budget. docs/allocator.md.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "trainmem/analytic/caching_allocator.hpp"
#include "trainmem/analytic/hf_step.hpp"
#include "trainmem/ledger/ledger.hpp"

namespace trainmem {

// What a run read from the model.
struct AllocatorModelResult {
  std::string spec;  // as given (--allocator)
  CachingAllocatorConfig config;
  // The last step, its peaks reset at the step's start (torch.cuda.reset_peak_memory_stats()
  // before the step, as the ledger's figures are the last step's); the whole run's peaks below.
  CachingAllocatorStats step;
  std::vector<std::uint64_t> segments_at_reserved_peak;  // of the last step
  std::uint64_t run_reserved_peak = 0;   // setup and every step (max_memory_reserved, no reset)
  std::uint64_t run_allocated_peak = 0;  // the same for memory_allocated
  std::optional<CachingAllocatorOom> oom;
};

// An Allocator that passes every request to `inner` and mirrors it in the model. With
// config.device_bytes set, a request the model cannot place (PyTorch would raise) is refused
// (nullptr; failure_detail() gives PyTorch's message).
//
// A configuration with the text it was given as (--allocator). As shadows: further
// configurations fed the same sequence, for their figures only (no device limit, never
// refusing): compare shows expandable segments off and on from one run.
struct AllocatorSpec {
  std::string spec;
  CachingAllocatorConfig config;
};
// --allocator TEXT: the text with its configuration (parse_allocator_spec's InputError).
AllocatorSpec parse_allocator(const std::string& text);

// The HF step's event sequence (hf_step.hpp) fed to the model: the state alive when the step
// begins (parameters, optimizer states, step 1's output, inputs) allocated first, the peaks reset
// (torch.cuda.reset_peak_memory_stats() before the step), then the step's events, up to an
// out-of-memory under spec.config.device_bytes.
AllocatorModelResult replay_hf_step(const HfStep& step, const AllocatorSpec& spec);

class ModelledAllocator final : public Allocator {
 public:
  // `allocator.config.device_bytes` is the device the model may fill (unset: unlimited).
  ModelledAllocator(Allocator& inner, const AllocatorSpec& allocator,
                    const std::vector<AllocatorSpec>& shadows = {});
  void* allocate(std::uint64_t bytes) override;
  void deallocate(void* ptr, std::uint64_t bytes) override;
  const char* name() const override { return inner_.name(); }
  bool touches_memory() const override { return inner_.touches_memory(); }
  std::string failure_detail() const override;
  void annotate(Category category, std::uint64_t tensor_id) override {
    inner_.annotate(category, tensor_id);
  }

  // At a step's start: the whole run's peaks are kept, the models' are reset.
  void begin_step();
  AllocatorModelResult result() const;
  std::vector<AllocatorModelResult> shadow_results() const;

 private:
  // One model fed the sequence, with the whole run's peaks kept across begin_step.
  struct Mirror {
    Mirror(std::string spec, CachingAllocatorConfig config)
        : spec(std::move(spec)), config(config), model(std::move(config)) {}
    std::string spec;
    CachingAllocatorConfig config;
    CachingAllocatorModel model;
    std::uint64_t run_reserved_peak = 0, run_allocated_peak = 0;
    void begin_step();
    AllocatorModelResult result() const;
  };
  Allocator& inner_;
  Mirror primary_;
  std::vector<std::unique_ptr<Mirror>> shadows_;
  std::unordered_map<void*, std::uint64_t> ids_;  // live pointer -> the models' id
  std::uint64_t next_id_ = 1;
  std::optional<CachingAllocatorOom> oom_;
  bool inner_refused_ = false;
};

}  // namespace trainmem
