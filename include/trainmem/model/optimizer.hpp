// Optimizers of the training step, and the states they keep between steps.
//
//   AdamW  mixed precision: fp32 master copy (only when the training dtype D is 16-bit), fp32
//          m and v; bias correction; decoupled weight decay. 12 B/param under bf16/fp16.
//   SGD    no momentum; fp32 master copy when D is 16-bit (4 B/param), nothing under fp32.
//   AdamW8bit  bitsandbytes' AdamW8bit: no master copy (the D weights are updated in place, as
//          bnb updates a 16-bit model); a tensor of 4,096 elements or more keeps uint8 `state1`,
//          `state2` (n bytes each) and fp32 `absmax1`, `absmax2` (one per 256-element block), a
//          smaller one fp32 `state1`, `state2`; the signed and unsigned quantile maps (256 f32)
//          and their lookup tables (65,536 u8) are shared, allocated with the first 8-bit
//          tensor. fp16's loss-scaled gradients are unscaled inside the update as bitsandbytes'
//          gnorm_scale does it (float(g) * 1/S).
//   PagedAdamW, PagedAdamW8bit  bitsandbytes' paged optimizers: PagedAdamW is its 32-bit Adam
//          (fp32 state1, state2 for every tensor, no master copy), PagedAdamW8bit is AdamW8bit;
//          the state1, state2 of a tensor of kBnbPagedMinSize (100,000) elements or more are
//          allocated from the `managed` ledger (CUDA managed memory on cuda), the rest as above.
//   LOMO   SGD fused into backward (Lv et al. 2023): each parameter is updated as soon as its
//          gradient is complete and the gradient is freed at once; no states, the D weights
//          are updated in place.
//
// States are allocated through the ledger (category optimizer_states, f32) with the
// parameter's name + ".master" / ".exp_avg" / ".exp_avg_sq", in the order of
// docs/native-plan.md. Default hyper-parameters are documented in docs/decisions.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trainmem/backends/backend.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/ledger/ledger.hpp"

namespace trainmem {

struct OptimizerSettings {
  Optimizer kind = Optimizer::adamw;
  AdamWParams adamw{1e-5f, 0.9f, 0.999f, 1e-8f, 0.01f};  // lr, beta1, beta2, eps, weight decay
  float sgd_lr = 1e-3f;
  float lomo_lr = 1e-3f;
  // bitsandbytes' optimizers (AdamW8bit and the paged ones): the same lr, betas, eps and weight
  // decay as AdamW's defaults (docs/decisions.md).
  BnbAdamWParams adamw8bit{1e-5, 0.9, 0.999, 1e-8, 0.01};
};
// The documented defaults for `kind`.
OptimizerSettings default_optimizer_settings(Optimizer kind);

// Bytes of optimizer state per parameter element for `kind` under training dtype `d`
// (AdamW 12 or 8, SGD 4 or 0, LOMO 0). AdamW8bit's depend on each tensor's size (0 here; the
// analytic layer's state_figures counts them per tensor).
std::uint64_t optimizer_state_bytes_per_param(Optimizer kind, DType d);

// The optimizer index of a frozen parameter (LoRA's base): no states, never updated.
constexpr std::size_t kNoOptimizerState = ~std::size_t{0};

class ParameterOptimizer {
 public:
  // `managed`: the ledger of a paged optimizer's large states (required for paged kinds, else
  // unused); its tensors must not outlive it.
  ParameterOptimizer(const OptimizerSettings& settings, Backend& backend, Ledger& ledger,
                     Ledger* managed = nullptr);

  Optimizer kind() const { return s_.kind; }
  const OptimizerSettings& settings() const { return s_; }
  // LOMO: the update runs inside backward, per parameter, and the gradient is freed at once.
  bool fused_into_backward() const { return s_.kind == Optimizer::lomo; }
  // AdamW and SGD hold every gradient from backward to the optimizer phase.
  bool holds_gradients() const { return !fused_into_backward(); }

  // Setup: allocates one parameter's states now (phase as set by the caller), m and v zeroed.
  // Returns the parameter's index for update().
  std::size_t add_parameter(const std::string& name, int layer,
                            const std::vector<std::int64_t>& shape);
  // The fp32 master copy of parameter `index`, or nullptr when there is none (D = fp32, LOMO,
  // or kNoOptimizerState). The model writes the initial weights into it beside the D weights.
  float* master(std::size_t index) const;

  // Applies one update to parameter `index` (n elements of D at `param`) with its gradient.
  // `step` counts optimizer steps from 1 (AdamW's bias correction). The update uses
  // float(grad) * grad_scale (fp32): pass 1/S when the gradients carry a loss scale S, 1 when
  // they carry none (then the arithmetic is exactly that of an unscaled update).
  void update(std::size_t index, void* param, const void* grad, int step, float grad_scale);

 private:
  struct States {
    std::int64_t numel = 0;
    Tensor master;   // (n) f32, empty when D = fp32, LOMO or AdamW8bit
    Tensor m;        // (n) f32, AdamW (8-bit kinds: u8 for n >= 4096; paged: managed)
    Tensor v;        // (n) f32, AdamW (8-bit kinds: u8 for n >= 4096; paged: managed)
    Tensor absmax1;  // 8-bit kinds, n >= 4096: (ceil(n / 256)) f32
    Tensor absmax2;
  };
  OptimizerSettings s_;
  Backend& backend_;
  Ledger& ledger_;
  Ledger* managed_;
  std::vector<States> states_;
  // AdamW8bit's shared maps and lookup tables (allocated with the first 8-bit tensor).
  Tensor qmap1_, qmap2_, lut1_, lut2_;
};

}  // namespace trainmem
