// Activation offload (include/trainmem/model/activation_offload.hpp; docs/native-plan.md).
#include "trainmem/model/activation_offload.hpp"

#include "trainmem/base/checked.hpp"

namespace trainmem {

ActivationOffload::ActivationOffload(Backend* backend, std::int64_t layers)
    : be_(backend && backend->computes() ? backend : nullptr), layers_(layers) {
  // Host memory for the copies: real where the step computes, addresses only on a trace.
  if (be_)
    host_allocator_ = std::make_unique<HostAllocator>();
  else
    host_allocator_ = std::make_unique<MetaAllocator>();
  host_ledger_ = std::make_unique<Ledger>(*host_allocator_);
  sets_.resize(std::size_t(layers));
}

ActivationOffload::~ActivationOffload() {
  sets_.clear();  // the host copies go back to the host ledger before it goes
}

void ActivationOffload::begin_step(int step) {
  host_ledger_->begin_step(step);
  transfer_ = 0;
}

void ActivationOffload::after_forward(std::int64_t l, Tensor& input, const char* input_name,
                                      int input_layer, LayerActs& acts, int layer) {
  if (sends(l - 1))
    for (Copy& c : sets_[std::size_t(l - 1)]) c.slot->reset();
  if (!sends(l)) return;
  auto& set = sets_[std::size_t(l)];
  set.clear();
  auto add = [&](Tensor& t, const char* name, int at) {
    if (!t) return;
    Copy c{&t, name, at, t.shape(), t.dtype(), Tensor()};
    c.host = host_ledger_->allocate(name, Category::activations, at, c.shape, c.dtype);
    if (be_) be_->download(c.host.data(), t.data(), t.bytes());
    transfer_ = checked_add(transfer_, t.bytes(), "offload transfer bytes");
    set.push_back(std::move(c));
  };
  // x_l first, then the layer's rows in table order.
  add(input, input_name, input_layer);
  for (const LayerActSpec& row : kLayerActs)
    if (row.id != LayerAct::out) add(acts[row.id], row.name, layer);
}

void ActivationOffload::before_backward(std::int64_t l, Ledger& device) {
  if (!sends(l - 1)) return;
  for (Copy& c : sets_[std::size_t(l - 1)]) {
    *c.slot = device.allocate(c.name, Category::activations, c.layer, c.shape, c.dtype);
    if (be_) be_->upload(c.slot->data(), c.host.data(), c.host.bytes());
    transfer_ = checked_add(transfer_, c.host.bytes(), "offload transfer bytes");
  }
}

void ActivationOffload::after_backward(std::int64_t l) {
  if (sends(l - 1)) sets_[std::size_t(l - 1)].clear();  // each host Tensor frees its copy
}

}  // namespace trainmem
