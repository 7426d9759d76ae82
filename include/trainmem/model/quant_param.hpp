// A frozen base weight stored quantized as bitsandbytes stores it: 4-bit (QLoRA,
// docs/native-plan.md, "QLoRA") or LLM.int8's row-wise 8-bit (--quant int8, "8-bit base"). The
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

// 4-bit: bitsandbytes' Params4bit and its QuantState, the packed pairs (under the weight's name),
// the absmax (u8 under double quantization, else fp32), the 16-entry code, and under double
// quantization the nested absmax, the nested code and the offset. int8: Int8Params, CB int8 (out,
// in) under the weight's name (in `packed`) and SCB fp32 (out) (in `absmax`). `view` is what the
// layer reads.
struct QuantParam {
  Tensor packed, absmax, quant_map, nested_absmax, nested_quant_map, nested_offset;
  Quant4View view;
};

// Books the tensors of weight `name` (out, in) = `shape` in Category::params, in that order.
QuantParam allocate_quantized(Ledger& ledger, const std::string& name, int layer,
                              const std::vector<std::int64_t>& shape, const TrainConfig& train);

// Quantizes the weight into `packed` (the pairs' or CB's tensor) and q, with trainmem's
// transients (workspace, phase setup): the dense weight (D; `fill` writes it when `be` computes)
// and, for 4-bit under double quantization, its fp32 absmax and the 8-bit quantizer's lookup
// table, the offset being the absmax's mean (bitsandbytes' Params4bit._quantize); for int8
// Int8Params._quantize (kernels/quant4/quant4_math.hpp, quantize_int8_row). `be` nullptr: the
// allocations only (a trace without a backend).
void quantize_base(Ledger& ledger, Backend* be, std::uint8_t* packed, QuantParam& q, int layer,
                   const std::vector<std::int64_t>& shape, const TrainConfig& train,
                   const std::function<void(void*)>& fill);

}  // namespace trainmem
