// A frozen quantized base weight's storage and quantization
// (include/trainmem/model/quant_param.hpp).
#include "trainmem/model/quant_param.hpp"

namespace trainmem {

QuantParam allocate_quantized(Ledger& ledger, const std::string& name, int layer,
                              const std::vector<std::int64_t>& shape, const TrainConfig& train) {
  const std::int64_t n = shape.at(0) * shape.at(1), bs = train.quant_blocksize,
                     nb = (n + bs - 1) / bs;
  auto q4 = [&](const char* what, std::vector<std::int64_t> s, DType dt) {
    return ledger.allocate(name + what, Category::params, layer, std::move(s), dt);
  };
  QuantParam q;
  q.view.out = shape[0];
  q.view.in = shape[1];
  if (train.quant8()) {                   // LLM.int8: CB (out, in) int8, SCB (out) fp32
    q.packed = q4("", shape, DType::u8);  // int8 bytes (the ledger has no signed 8-bit dtype)
    q.absmax = q4(".SCB", {shape[0]}, DType::f32);
    q.view.packed = q.packed.as<std::uint8_t>();
    q.view.absmax = q.absmax.data();
    return q;
  }
  q.packed = q4("", {(n + 1) / 2, 1}, DType::u8);
  q.absmax = q4(".absmax", {nb}, train.double_quant ? DType::u8 : DType::f32);
  q.quant_map = q4(".quant_map", {16}, DType::f32);
  if (train.double_quant) {
    q.nested_absmax =
        q4(".nested_absmax", {(nb + kQuantNestedBlock - 1) / kQuantNestedBlock}, DType::f32);
    q.nested_quant_map = q4(".nested_quant_map", {256}, DType::f32);
    q.nested_offset = q4(".nested_offset", {1}, DType::f32);
  }
  q.view.packed = q.packed.as<std::uint8_t>();
  q.view.absmax = q.absmax.data();
  q.view.nested_absmax = q.nested_absmax ? q.nested_absmax.as<float>() : nullptr;
  q.view.nested_code = q.nested_quant_map ? q.nested_quant_map.as<float>() : nullptr;
  return q;
}

void quantize_base(Ledger& ledger, Backend* be, std::uint8_t* packed, QuantParam& q, int layer,
                   const std::vector<std::int64_t>& shape, const TrainConfig& train,
                   const std::function<void(void*)>& fill) {
  auto ph = ledger.scope(Phase::setup);
  auto ws = [&](const char* name, std::vector<std::int64_t> s, DType dt) {
    return ledger.allocate(name, Category::workspace, layer, std::move(s), dt);
  };
  if (train.quant8()) {  // Int8Params._quantize: the dense weight, then CB and SCB per row
    Tensor dense = ws("quantize.weight", shape, train.dtype);
    if (be && be->computes()) fill(dense.data());
    if (be)
      be->quantize_int8(reinterpret_cast<std::int8_t*>(packed), q.absmax.as<float>(), dense.data(),
                        shape.at(0), shape.at(1));
    return;
  }
  const std::int64_t n = shape.at(0) * shape.at(1), bs = train.quant_blocksize,
                     nb = (n + bs - 1) / bs;
  const Quant4Type type = quant4_type(train.quant);
  const bool dq = train.double_quant;
  Tensor lut;
  if (dq) lut = ws("quantize.nested_lut", {kBnbLutEntries}, DType::u8);
  if (be)
    be->quant4_tables(q.quant_map.as<float>(), dq ? q.nested_quant_map.as<float>() : nullptr,
                      dq ? lut.as<std::uint8_t>() : nullptr, type);
  Tensor dense = ws("quantize.weight", shape, train.dtype);
  if (be && be->computes()) fill(dense.data());
  Tensor absmax32;
  if (dq) absmax32 = ws("quantize.absmax", {nb}, DType::f32);
  float* am = dq ? absmax32.as<float>() : q.absmax.as<float>();
  if (be) be->quantize_4bit(packed, am, dense.data(), n, bs, type);
  dense.reset();
  if (!dq) return;
  const float offset = be ? be->double_quant_offset(am, nb) : 0.0f;
  if (be && be->computes()) be->upload(q.nested_offset.data(), &offset, sizeof offset);
  q.view.offset = offset;
  if (be)
    be->quantize_blockwise8(q.absmax.as<std::uint8_t>(), q.nested_absmax.as<float>(), am, offset,
                            nb, kQuantNestedBlock, lut.as<std::uint8_t>());
}

}  // namespace trainmem
