// Causal attention on the GPU: the checks both variants share and the variant dispatch.
// The kernels are in attention_eager.cu and attention_flash.cu.
#include <string>

#include "attention/attention.hpp"
#include "trainmem/checked.hpp"
#include "trainmem/error.hpp"

namespace trainmem {

namespace cuda {
void check_attention_dims(const char* op, std::int64_t B, std::int64_t T, std::int64_t NH,
                          std::int64_t NKV, std::int64_t HD) {
  const std::pair<std::int64_t, const char*> dims[] = {
      {B, "B"}, {T, "T"}, {NH, "NH"}, {NKV, "NKV"}, {HD, "HD"}};
  for (const auto& [value, name] : dims) {
    if (value <= 0 || value > 2147483647)
      throw InputError(std::string(op) + ": " + name + " must be in 1..2147483647, got " +
                       std::to_string(value));
  }
  if (NH % NKV != 0)
    throw InputError(std::string(op) + ": NKV (" + std::to_string(NKV) + ") must divide NH (" +
                     std::to_string(NH) + ")");
  checked_product({std::uint64_t(B), std::uint64_t(T), std::uint64_t(NH), std::uint64_t(HD)}, op);
}
}  // namespace cuda

void attention_forward_cuda(void* out, void* probs, float* lse, const void* q, const void* k,
                            const void* v, std::int64_t B, std::int64_t T, std::int64_t NH,
                            std::int64_t NKV, std::int64_t HD, Attention variant, DType dt,
                            cublasHandle_t handle, cudaStream_t stream) {
  if (variant == Attention::eager) {
    attention_eager_forward_cuda(out, probs, q, k, v, B, T, NH, NKV, HD, dt, handle, stream);
  } else {
    attention_flash_forward_cuda(out, lse, q, k, v, B, T, NH, NKV, HD, dt, stream);
  }
}

void attention_backward_cuda(void* dq, void* dk, void* dv, void* dprobs, float* delta,
                             const void* dout, const void* q, const void* k, const void* v,
                             const void* out, const void* probs, const float* lse, std::int64_t B,
                             std::int64_t T, std::int64_t NH, std::int64_t NKV, std::int64_t HD,
                             Attention variant, DType dt, cublasHandle_t handle,
                             cudaStream_t stream) {
  if (variant == Attention::eager) {
    attention_eager_backward_cuda(dq, dk, dv, dprobs, dout, q, k, v, probs, B, T, NH, NKV, HD, dt,
                                  handle, stream);
  } else {
    attention_flash_backward_cuda(dq, dk, dv, delta, dout, q, k, v, out, lse, B, T, NH, NKV, HD, dt,
                                  stream);
  }
}

}  // namespace trainmem
