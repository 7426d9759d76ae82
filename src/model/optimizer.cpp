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
      return 0;
  }
  return 0;
}

ParameterOptimizer::ParameterOptimizer(const OptimizerSettings& settings, Backend& backend,
                                       Ledger& ledger)
    : s_(settings), backend_(backend), ledger_(ledger) {}

std::size_t ParameterOptimizer::add_parameter(const std::string& name, int layer,
                                              const std::vector<std::int64_t>& shape) {
  States st;
  st.numel = 1;
  for (auto d : shape) st.numel = std::int64_t(checked_mul(std::uint64_t(st.numel), d, "numel"));
  const bool has_master = s_.kind != Optimizer::lomo && backend_.dtype() != DType::f32;
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
  }
}

}  // namespace trainmem
