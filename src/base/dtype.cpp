// Names of the storage dtypes and the parser behind --dtype and config.json's torch_dtype.
#include "trainmem/base/dtype.hpp"

namespace trainmem {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "fp32";
    case DType::f16:
      return "fp16";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "int32";
    case DType::u8:
      return "uint8";
  }
  return "?";
}

std::optional<DType> parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32" || s == "f32") return DType::f32;
  if (s == "fp16" || s == "float16" || s == "f16" || s == "half") return DType::f16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  return std::nullopt;
}

}  // namespace trainmem
