// A decoder layer's activations as data (see include/trainmem/model/model_acts.hpp).
#include "trainmem/model/model_acts.hpp"

#include "trainmem/base/checked.hpp"

namespace trainmem {

ActDims ActDims::of(const ModelConfig& model, const TrainConfig& train) {
  ActDims d{train.batch, train.seq,      model.hidden,     model.intermediate,
            model.heads, model.kv_heads, model.head_dim(), train.seq};
  d.r = train.lora_rank;
  d.lora = train.lora() ? train.lora_targets : 0u;
  if (model.moe()) {
    d.E = model.experts;
    d.K = model.experts_per_token;
    d.m = model.expert_intermediate;
    d.ms = model.shared_expert_intermediate;
    d.nk = moe_rows(model, train);
    d.cap = moe_capacity(model, train);
    d.El = d.E;
    d.er = d.nk;
  }
  return d;
}

std::vector<std::int64_t> act_shape(const ActShape& shape, const ActDims& dims) {
  std::vector<std::int64_t> out;
  for (int j = 0; j < shape.rank; ++j) switch (shape.extents[std::size_t(j)]) {
      case Extent::b:
        out.push_back(dims.b);
        break;
      case Extent::s:
        out.push_back(dims.s);
        break;
      case Extent::sr:
        out.push_back(dims.sr);
        break;
      case Extent::h:
        out.push_back(dims.h);
        break;
      case Extent::i:
        out.push_back(dims.i);
        break;
      case Extent::a:
        out.push_back(dims.a);
        break;
      case Extent::k:
        out.push_back(dims.k);
        break;
      case Extent::ad:
        out.push_back(dims.a * dims.d);
        break;
      case Extent::kd:
        out.push_back(dims.k * dims.d);
        break;
      case Extent::r:
        out.push_back(dims.r);
        break;
      case Extent::E:
        out.push_back(dims.E);
        break;
      case Extent::E1:
        out.push_back(dims.E + 1);
        break;
      case Extent::K:
        out.push_back(dims.K);
        break;
      case Extent::m:
        out.push_back(dims.m);
        break;
      case Extent::nk:
        out.push_back(dims.nk);
        break;
      case Extent::ms:
        out.push_back(dims.ms);
        break;
      case Extent::er:
        out.push_back(dims.er);
        break;
    }
  return out;
}

DType act_dtype(ActDType dtype, DType training) {
  switch (dtype) {
    case ActDType::f32:
      return DType::f32;
    case ActDType::u8:
      return DType::u8;
    case ActDType::i32:
      return DType::i32;
    case ActDType::D:
      break;
  }
  return training;
}

std::string act_shape_letters(const ActShape& shape) {
  std::string out = "(";
  for (int j = 0; j < shape.rank; ++j) {
    if (j) out += ",";
    switch (shape.extents[std::size_t(j)]) {
      case Extent::b:
        out += "b";
        break;
      case Extent::s:
      case Extent::sr:  // a listing is of one rank without sequence parallelism
        out += "s";
        break;
      case Extent::h:
        out += "h";
        break;
      case Extent::i:
        out += "i";
        break;
      case Extent::a:
        out += "a";
        break;
      case Extent::k:
        out += "k";
        break;
      case Extent::ad:
        out += "a·d";
        break;
      case Extent::kd:
        out += "k·d";
        break;
      case Extent::r:
        out += "r";
        break;
      case Extent::E:
        out += "E";
        break;
      case Extent::E1:
        out += "E+1";
        break;
      case Extent::K:
        out += "K";
        break;
      case Extent::m:
        out += "m";
        break;
      case Extent::nk:
        out += "b·s·K";
        break;
      case Extent::ms:
        out += "m_s";
        break;
      case Extent::er:
        out += "R";
        break;
    }
  }
  return out + ")";
}

std::string act_freed_when(const LayerActSpec& row, Checkpointing checkpointing) {
  std::string out;
  if (checkpointing == Checkpointing::full && row.checkpointing == UnderCheckpointing::recomputed)
    out = "freed after the layer's out, recomputed in backward, then ";
  if (row.freed_at_step == 0)
    return out + "freed by its consumer: step 9 of the next layer's backward (head step 3 " +
           "for the last layer)";
  return out + "freed at step " + std::to_string(row.freed_at_step) + " of the layer's backward";
}

std::vector<PlannedActivation> layer_activation_plan(const ModelConfig& model,
                                                     const TrainConfig& train, ActPass pass,
                                                     bool moe_layer) {
  std::vector<PlannedActivation> out;
  if (pass == ActPass::recompute && train.checkpointing != Checkpointing::full) return out;
  const ActDims dims = ActDims::of(model, train);
  for (const LayerActSpec& row : kLayerActs) {
    if (!allocated_in(row, model, train, pass, moe_layer)) continue;
    PlannedActivation p{
        &row,         row.name, act_shape(row.shape, dims), act_dtype(row.dtype, train.dtype),
        row.category, 0};
    std::uint64_t n = 1;
    for (auto e : p.shape) n = checked_mul(n, std::uint64_t(e), "activation size");
    p.bytes = checked_mul(n, dtype_size(p.dtype), "activation bytes");
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace trainmem
