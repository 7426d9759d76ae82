// --offload-activations for a step that runs decoder layers (docs/native-plan.md, "Activation
// offload"): the one-GPU model and every rank of the sharded step (one pipeline stage) share it.
//
// Layer l's offload set O_l (l < L-1, L the layers the step runs) is its input x_l and the rows
// it still holds after its forward, `out` excepted. after_forward(l) frees O_{l-1}'s device
// tensors (their copy drained while layer l ran) and copies O_l into the host ledger;
// before_backward(l) allocates O_{l-1} on the device again and copies it back (the prefetch one
// layer ahead); after_backward(l) frees O_{l-1}'s host copies. The device tensors keep their
// names, layers and category; the host ledger holds the copies under the same names.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "trainmem/backends/backend.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/decoder_layer.hpp"

namespace trainmem {

class ActivationOffload {
 public:
  // `backend`: the one that computes, or nullptr for a trace (meta: no copies, host addresses
  // only). `layers`: the layers this step runs (a stage's).
  ActivationOffload(Backend* backend, std::int64_t layers);
  ~ActivationOffload();
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  // The host ledger's peaks restart with each step, and the bytes moved.
  void begin_step(int step);
  // After layer l's forward (its checkpointing frees done). `input` is x_l, allocated as
  // (`input_name`, `input_layer`); `acts` its rows; `layer` the ledger's layer of the rows.
  void after_forward(std::int64_t l, Tensor& input, const char* input_name, int input_layer,
                     LayerActs& acts, int layer);
  // Before layer l's backward: O_{l-1} back into `device`.
  void before_backward(std::int64_t l, Ledger& device);
  // After layer l's backward: O_{l-1}'s host copies freed.
  void after_backward(std::int64_t l);

  const Ledger& host() const { return *host_ledger_; }
  std::uint64_t host_peak() const { return host_ledger_->peak_total().bytes; }
  // Bytes copied this step, device to host and back.
  std::uint64_t transfer_bytes() const { return transfer_; }

 private:
  struct Copy {
    Tensor* slot;
    const char* name;
    int layer;
    std::vector<std::int64_t> shape;
    DType dtype;
    Tensor host;
  };
  bool sends(std::int64_t l) const { return l >= 0 && l + 1 < layers_; }

  Backend* be_;
  std::int64_t layers_;
  std::unique_ptr<Allocator> host_allocator_;
  std::unique_ptr<Ledger> host_ledger_;
  std::vector<std::vector<Copy>> sets_;
  std::uint64_t transfer_ = 0;
};

}  // namespace trainmem
