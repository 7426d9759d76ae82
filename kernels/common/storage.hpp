// Storage types for templated kernels: F32, BF16, F16 load an element as fp32 and store an
// fp32 value rounded once (round to nearest even). A function that takes a runtime DType
// dispatches once with TM_DISPATCH_STORAGE and then runs a loop specialised for the storage,
// instead of branching on the dtype per element. Usable on the host and in CUDA kernels.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "trainmem/dtype.hpp"
#include "trainmem/error.hpp"

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

}  // namespace trainmem

// Host-side dispatch: runs BODY with `S` aliased to F32, BF16 or F16 for a training dtype;
// any other dtype throws InputError naming `what`.
#define TM_DISPATCH_STORAGE(DT, what, ...)                                        \
  do {                                                                            \
    switch (DT) {                                                                 \
      case ::trainmem::DType::f32: {                                              \
        using S = ::trainmem::F32;                                                \
        __VA_ARGS__;                                                              \
      } break;                                                                    \
      case ::trainmem::DType::bf16: {                                             \
        using S = ::trainmem::BF16;                                               \
        __VA_ARGS__;                                                              \
      } break;                                                                    \
      case ::trainmem::DType::f16: {                                              \
        using S = ::trainmem::F16;                                                \
        __VA_ARGS__;                                                              \
      } break;                                                                    \
      default:                                                                    \
        throw ::trainmem::InputError(std::string(what) +                          \
                                     ": dtype must be fp32, fp16 or bf16, got " + \
                                     ::trainmem::dtype_name(DT));                 \
    }                                                                             \
  } while (0)
