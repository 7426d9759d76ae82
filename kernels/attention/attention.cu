// Causal attention on the GPU: the checks both variants share and the variant dispatch.
// The kernels are in attention_eager.cu and attention_flash.cu.
#include <string>

#include "attention/attention.hpp"
#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {

namespace cuda {
void check_attention_dims(const char* op, std::int64_t b, std::int64_t s, std::int64_t a,
                          std::int64_t kv, std::int64_t d, std::int64_t window) {
  const std::pair<std::int64_t, const char*> dims[] = {
      {b, "b"}, {s, "s"}, {a, "a"}, {kv, "kv"}, {d, "d"}};
  for (const auto& [value, name] : dims) {
    if (value <= 0 || value > 2147483647)
      throw InputError(std::string(op) + ": " + name + " must be in 1..2147483647, got " +
                       std::to_string(value));
  }
  if (a % kv != 0)
    throw InputError(std::string(op) + ": kv (" + std::to_string(kv) + ") must divide a (" +
                     std::to_string(a) + ")");
  if (window < 0)
    throw InputError(std::string(op) + ": window must be >= 0 (0: full causal), got " +
                     std::to_string(window));
  checked_product({std::uint64_t(b), std::uint64_t(s), std::uint64_t(a), std::uint64_t(d)}, op);
}
}  // namespace cuda

void attention_forward_cuda(void* out, void* probs, float* lse, const void* q, const void* k,
                            const void* v, std::int64_t b, std::int64_t s, std::int64_t a,
                            std::int64_t kv, std::int64_t d, std::int64_t window, Attention variant,
                            DType dt, cublasHandle_t handle, cudaStream_t stream) {
  if (variant == Attention::eager) {
    attention_eager_forward_cuda(out, probs, q, k, v, b, s, a, kv, d, window, dt, handle, stream);
  } else {
    attention_flash_forward_cuda(out, lse, q, k, v, b, s, a, kv, d, window, dt, stream);
  }
}

void attention_backward_cuda(void* dq, void* dk, void* dv, void* dprobs, float* delta,
                             const void* dout, const void* q, const void* k, const void* v,
                             const void* out, const void* probs, const float* lse, std::int64_t b,
                             std::int64_t s, std::int64_t a, std::int64_t kv, std::int64_t d,
                             std::int64_t window, Attention variant, DType dt,
                             cublasHandle_t handle, cudaStream_t stream) {
  if (variant == Attention::eager) {
    attention_eager_backward_cuda(dq, dk, dv, dprobs, dout, q, k, v, probs, b, s, a, kv, d, window,
                                  dt, handle, stream);
  } else {
    attention_flash_backward_cuda(dq, dk, dv, delta, dout, q, k, v, out, lse, b, s, a, kv, d,
                                  window, dt, stream);
  }
}

}  // namespace trainmem
