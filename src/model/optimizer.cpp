// AdamW / SGD / LOMO: state allocation through the ledger and the per-parameter update, which
// the backends implement (adamw_update, sgd_update). See include/trainmem/model/optimizer.hpp.
#include "trainmem/model/optimizer.hpp"

#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {

OptimizerSettings default_optimizer_settings(Optimizer kind) {
  OptimizerSettings s;
  s.kind = kind;
  return s;
}

std::uint64_t optimizer_state_bytes_per_param(Optimizer kind, DType d) {
  const std::uint64_t master = d == DType::f32 ? 0 : 4;
  switch (kind) {
    case Optimizer::adamw:
      return master + 8;
    case Optimizer::sgd:
      return master;
    case Optimizer::lomo:
    case Optimizer::adamw8bit:  // bitsandbytes': per tensor of the model (state_figures)
    case Optimizer::paged_adamw:
    case Optimizer::paged_adamw8bit:
      return 0;
  }
  return 0;
}

ParameterOptimizer::ParameterOptimizer(const OptimizerSettings& settings, Backend& backend,
                                       Ledger& ledger, Ledger* managed)
    : s_(settings), backend_(backend), ledger_(ledger), managed_(managed) {
  if (paged_optimizer(s_.kind) && !managed_)
    throw Error(std::string("optimizer ") + optimizer_name(s_.kind) +
                ": a paged optimizer needs the managed-memory ledger");
}

std::size_t ParameterOptimizer::add_parameter(const std::string& name, int layer,
                                              const std::vector<std::int64_t>& shape) {
  States st;
  st.numel = 1;
  for (auto d : shape) st.numel = std::int64_t(checked_mul(std::uint64_t(st.numel), d, "numel"));
  const bool has_master =
      (s_.kind == Optimizer::adamw || s_.kind == Optimizer::sgd) && backend_.dtype() != DType::f32;
  if (has_master)
    st.master =
        ledger_.allocate(name + ".master", Category::optimizer_states, layer, shape, DType::f32);
  if (s_.kind == Optimizer::adamw) {
    st.m =
        ledger_.allocate(name + ".exp_avg", Category::optimizer_states, layer, shape, DType::f32);
    st.v = ledger_.allocate(name + ".exp_avg_sq", Category::optimizer_states, layer, shape,
                            DType::f32);
    backend_.fill_zero(st.m.data(), st.m.bytes());
    backend_.fill_zero(st.v.data(), st.v.bytes());
  }
  if (bnb_optimizer(s_.kind)) {
    // bitsandbytes' Optimizer2State.init_state: names as in its state dict; get_state_buffer
    // takes a paged optimizer's state1/state2 of a large tensor from managed memory.
    const bool eight = eight_bit_optimizer(s_.kind) && st.numel >= kBnbMin8BitSize;
    Ledger& states = paged_optimizer(s_.kind) && st.numel >= kBnbPagedMinSize ? *managed_ : ledger_;
    if (eight && !qmap1_) {
      qmap1_ = ledger_.allocate("optimizer.qmap1", Category::optimizer_states, -1, {kBnbMapEntries},
                                DType::f32);
      qmap2_ = ledger_.allocate("optimizer.qmap2", Category::optimizer_states, -1, {kBnbMapEntries},
                                DType::f32);
      lut1_ = ledger_.allocate("optimizer.qmap1_lut", Category::optimizer_states, -1,
                               {kBnbLutEntries}, DType::u8);
      lut2_ = ledger_.allocate("optimizer.qmap2_lut", Category::optimizer_states, -1,
                               {kBnbLutEntries}, DType::u8);
      backend_.bnb_adamw8bit_tables(qmap1_.as<float>(), qmap2_.as<float>(),
                                    lut1_.as<std::uint8_t>(), lut2_.as<std::uint8_t>());
    }
    const DType sd = eight ? DType::u8 : DType::f32;
    st.m = states.allocate(name + ".state1", Category::optimizer_states, layer, shape, sd);
    st.v = states.allocate(name + ".state2", Category::optimizer_states, layer, shape, sd);
    backend_.fill_zero(st.m.data(), st.m.bytes());
    backend_.fill_zero(st.v.data(), st.v.bytes());
    if (eight) {
      const std::int64_t nb = (st.numel + kBnbStateBlock - 1) / kBnbStateBlock;
      st.absmax1 =
          ledger_.allocate(name + ".absmax1", Category::optimizer_states, layer, {nb}, DType::f32);
      st.absmax2 =
          ledger_.allocate(name + ".absmax2", Category::optimizer_states, layer, {nb}, DType::f32);
      backend_.fill_zero(st.absmax1.data(), st.absmax1.bytes());
      backend_.fill_zero(st.absmax2.data(), st.absmax2.bytes());
    }
  }
  states_.push_back(std::move(st));
  return states_.size() - 1;
}

float* ParameterOptimizer::master(std::size_t index) const {
  if (index == kNoOptimizerState) return nullptr;
  return states_.at(index).master.as<float>();
}

void ParameterOptimizer::update(std::size_t index, void* param, const void* grad, int step,
                                float grad_scale) {
  auto& st = states_.at(index);
  switch (s_.kind) {
    case Optimizer::adamw:
      if (step < 1) throw Error("AdamW update: step must be >= 1 (bias correction)");
      backend_.adamw_update(param, grad, st.master.as<float>(), st.m.as<float>(), st.v.as<float>(),
                            st.numel, s_.adamw, step, grad_scale);
      return;
    case Optimizer::sgd:
      backend_.sgd_update(param, grad, st.master.as<float>(), st.numel, s_.sgd_lr, grad_scale);
      return;
    case Optimizer::lomo:
      backend_.sgd_update(param, grad, nullptr, st.numel, s_.lomo_lr, grad_scale);
      return;
    case Optimizer::adamw8bit:
    case Optimizer::paged_adamw:
    case Optimizer::paged_adamw8bit: {
      // fp16: the loss-scaled gradient unscaled as bitsandbytes' gnorm_scale does it.
      BnbAdamWParams hp = s_.adamw8bit;
      hp.gnorm_scale = grad_scale;
      if (!st.absmax1)  // 32-bit states: PagedAdamW, or a tensor under 4,096 elements
        backend_.bnb_adamw32_update(param, grad, st.m.as<float>(), st.v.as<float>(), st.numel, hp,
                                    step);
      else
        backend_.bnb_adamw8bit_update(
            param, grad, st.m.as<std::uint8_t>(), st.v.as<std::uint8_t>(), st.absmax1.as<float>(),
            st.absmax2.as<float>(), qmap1_.as<float>(), qmap2_.as<float>(),
            lut1_.as<std::uint8_t>(), lut2_.as<std::uint8_t>(), st.numel, hp, step);
      return;
    }
  }
}

}  // namespace trainmem
