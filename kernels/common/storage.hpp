// Storage types for templated kernels: F32, BF16, F16 load an element as fp32 and store an
// fp32 value rounded once (round to nearest even). A function that takes a runtime DType
// dispatches once with dispatch_storage and then runs a loop specialised for the storage,
// instead of branching on the dtype per element. Usable on the host and in CUDA kernels.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "trainmem/base/dtype.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {

struct F32 {
  using raw = float;
  static constexpr DType dtype = DType::f32;
  static TM_HD float load(const void* p, std::size_t i) { return static_cast<const float*>(p)[i]; }
  static TM_HD void store(void* p, std::size_t i, float v) { static_cast<float*>(p)[i] = v; }
  static TM_HD float round(float v) { return v; }
};
struct BF16 {
  using raw = std::uint16_t;
  static constexpr DType dtype = DType::bf16;
  static TM_HD float load(const void* p, std::size_t i) {
    return bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
  }
  static TM_HD void store(void* p, std::size_t i, float v) {
    static_cast<std::uint16_t*>(p)[i] = f32_to_bf16(v);
  }
  static TM_HD float round(float v) { return bf16_to_f32(f32_to_bf16(v)); }
};
struct F16 {
  using raw = std::uint16_t;
  static constexpr DType dtype = DType::f16;
  static TM_HD float load(const void* p, std::size_t i) {
    return f16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
  }
  static TM_HD void store(void* p, std::size_t i, float v) {
    static_cast<std::uint16_t*>(p)[i] = f32_to_f16(v);
  }
  static TM_HD float round(float v) { return f16_to_f32(f32_to_f16(v)); }
};

// Host-side dispatch on a training dtype: calls f(F32{}), f(BF16{}) or f(F16{}) and returns
// what f returns; any other dtype throws InputError naming `what`. f is one generic callable,
// instantiated once per storage type, which it receives as an (empty) value, e.g.
//   dispatch_storage(dt, "rmsnorm_forward", [&](auto tag) {
//     rmsnorm_forward_impl<decltype(tag)>(out, rstd, inp, weight, n, h, eps);
//   });
template <class F>
auto dispatch_storage(DType dt, const char* what, F&& f) {
  switch (dt) {
    case DType::f32:
      return f(F32{});
    case DType::bf16:
      return f(BF16{});
    case DType::f16:
      return f(F16{});
    default:
      break;
  }
  throw InputError(std::string(what) + ": dtype must be fp32, fp16 or bf16, got " + dtype_name(dt));
}

}  // namespace trainmem
