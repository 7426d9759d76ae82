// A frozen base weight stored as bitsandbytes' 4-bit tensors (docs/native-plan.md, "QLoRA"): the
// storage every host of the decoder layer books for it (the single-rank LlamaModel, a rank of the
// sharded step) and its quantization, written once.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trainmem/backends/backend.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/decoder_layer.hpp"

namespace trainmem {

// bitsandbytes' Params4bit and its QuantState: the packed pairs (under the weight's name), the
// absmax (u8 under double quantization, else fp32), the 16-entry code, and under double
// quantization the nested absmax, the nested code and the offset; `view` is what the layer reads.
struct Quant4Param {
  Tensor packed, absmax, quant_map, nested_absmax, nested_quant_map, nested_offset;
  Quant4View view;
};

// Books the tensors of weight `name` (out, in) = `shape` in Category::params, in that order.
Quant4Param allocate_quant4(Ledger& ledger, const std::string& name, int layer,
                            const std::vector<std::int64_t>& shape, const TrainConfig& train);

// bitsandbytes' Params4bit._quantize into `packed` (the pairs' tensor) and q, with trainmem's
// transients (workspace, phase setup): the dense weight (D; `fill` writes it when `be` computes)
// and, under double quantization, its fp32 absmax and the 8-bit quantizer's lookup table; the
// offset is the absmax's mean. `be` nullptr: the allocations only (a trace without a backend).
void quantize4(Ledger& ledger, Backend* be, std::uint8_t* packed, Quant4Param& q, int layer,
               const std::vector<std::int64_t>& shape, const TrainConfig& train,
               const std::function<void(void*)>& fill);

}  // namespace trainmem
