// The cuda backend (cuda_backend.hpp): each op forwards to its launcher in kernels/
// with the backend's dtype and stream, in the argument order of the CPU reference.
#include "cuda_backend.hpp"

#include <spdlog/spdlog.h>

#include <string>
#include <vector>

#include "adamw/adamw.hpp"
#include "adamw8bit/adamw8bit.hpp"
#include "attention/attention.hpp"
#include "attention/attention_ring.hpp"
#include "bias/bias.hpp"
#include "common/cublas_check.hpp"
#include "cross_entropy/cross_entropy.hpp"
#include "dropout/dropout.hpp"
#include "embedding/embedding.hpp"
#include "init/init.hpp"
#include "matmul/matmul.hpp"
#include "moe/moe.hpp"
#include "nonfinite/nonfinite.hpp"
#include "quant4/quant4.hpp"
#include "rmsnorm/rmsnorm.hpp"
#include "rope/rope.hpp"
#include "swiglu/swiglu.hpp"
#include "trainmem/backends/device_rules.hpp"
#include "trainmem/base/cuda_check.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {

CudaBackend::CudaBackend(DType dtype) : Backend(dtype) {
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16)
    throw InputError(std::string("dtype: the cuda backend trains in fp32, fp16 or bf16, not ") +
                     dtype_name(dtype));
  const std::string reason = cuda_unavailable_reason();
  if (!reason.empty()) throw DeviceError("cuda backend: no usable CUDA device: " + reason);
  try {
    TM_CUDA_CHECK(cudaGetDevice(&device_));
    TM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TM_CUBLAS_CHECK(cublasCreate(&cublas_));
    // cublasSetStream resets the workspace to cuBLAS's default: set_gemm_workspace comes after.
    TM_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    // CUBLAS_DEFAULT_MATH keeps fp32 GEMMs in fp32 (no TF32). The flag makes the fp32
    // accumulation of 16-bit GEMMs hold end to end: without it cuBLAS may reduce split-K
    // partial sums in the output type (fp16/bf16), several roundings instead of one.
    TM_CUBLAS_CHECK(cublasSetMathMode(
        cublas_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                           CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    // The non-finite flag of check_finite / take_nonfinite: pinned host memory mapped into
    // the device's address space, so that it takes no device memory.
    TM_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&nonfinite_host_), sizeof(unsigned),
                                cudaHostAllocMapped));
    *nonfinite_host_ = 0;
    TM_CUDA_CHECK(
        cudaHostGetDevicePointer(reinterpret_cast<void**>(&nonfinite_device_), nonfinite_host_, 0));
    allocator_ = std::make_unique<DeviceAllocator>(device_, stream_);
  } catch (...) {
    if (nonfinite_host_ != nullptr) cudaFreeHost(nonfinite_host_);
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    throw;
  }
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  spdlog::debug("cuda backend: device {}, {} storage, CUDA runtime {}", device_, dtype_name(dtype),
                runtime);
}

CudaBackend::~CudaBackend() {
  TM_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(stream_));
  allocator_.reset();  // the pool goes before the stream it orders on
  if (nonfinite_host_ != nullptr) TM_CUDA_CHECK_NOTHROW(cudaFreeHost(nonfinite_host_));
  if (cublas_ != nullptr) {
    const cublasStatus_t s = cublasDestroy(cublas_);
    if (s != CUBLAS_STATUS_SUCCESS) spdlog::error("cublasDestroy failed ({})", int(s));
  }
  TM_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
}

Allocator& CudaBackend::allocator() {
  return *allocator_;
}

void CudaBackend::synchronize() {
  TM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::upload(void* dst, const void* host_src, std::uint64_t bytes) {
  if (bytes == 0) return;
  TM_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
  TM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::download(void* host_dst, const void* src, std::uint64_t bytes) {
  if (bytes == 0) return;
  TM_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  TM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::fill_zero(void* dst, std::uint64_t bytes) {
  if (bytes == 0) return;
  TM_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
}

void CudaBackend::copy(void* dst, const void* src, std::uint64_t bytes) {
  if (bytes == 0 || dst == src) return;
  TM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::init_param(void* dst, float* master, std::uint64_t n, const ParamInit& init) {
  init_param_cuda(dst, master, std::int64_t(n), init, dtype(), stream_);
}

void CudaBackend::set_gemm_workspace(void* ptr, std::uint64_t bytes) {
  if (ptr == nullptr && bytes == 0) {
    // Documented behaviour of cublasSetStream: it resets the handle to cuBLAS's own default
    // workspace. (cublasSetWorkspace(handle, nullptr, 0) would not: it leaves cuBLAS with no
    // workspace at all.) Used before the ledger's buffer is released while the backend lives.
    TM_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    gemm_workspace_ = nullptr;
    gemm_workspace_bytes_ = 0;
    return;
  }
  const std::string problem =
      device_rules::gemm_workspace_problem(reinterpret_cast<std::uintptr_t>(ptr), bytes);
  if (!problem.empty()) throw InputError("set_gemm_workspace: " + problem);
  TM_CUBLAS_CHECK(cublasSetWorkspace(cublas_, ptr, static_cast<std::size_t>(bytes)));
  gemm_workspace_ = ptr;
  gemm_workspace_bytes_ = bytes;
}

void CudaBackend::embedding_forward(void* out, const std::int32_t* tokens, const void* wte,
                                    std::int64_t b, std::int64_t s, std::int64_t h,
                                    std::int64_t V) {
  embedding_forward_cuda(out, tokens, wte, b, s, h, V, dtype(), stream_);
}
void CudaBackend::embedding_backward(void* dwte, const void* dout, const std::int32_t* tokens,
                                     std::int64_t b, std::int64_t s, std::int64_t h,
                                     std::int64_t V) {
  // The GEMM workspace doubles as the sort's scratch (kernels/embedding/embedding.cu says why that
  // is safe); without one the launcher takes its kernel that needs none.
  embedding_backward_cuda(dwte, dout, tokens, b, s, h, V, dtype(), stream_, gemm_workspace_,
                          gemm_workspace_bytes_);
}
void CudaBackend::rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight,
                                  std::int64_t n, std::int64_t h, float eps) {
  rmsnorm_forward_cuda(out, rstd, inp, weight, n, h, eps, dtype(), stream_);
}
void CudaBackend::rmsnorm_backward(void* dinp, void* dweight, const void* dout, const void* inp,
                                   const void* weight, const float* rstd, std::int64_t n,
                                   std::int64_t h) {
  rmsnorm_backward_cuda(dinp, dweight, dout, inp, weight, rstd, n, h, dtype(), stream_);
}
void CudaBackend::matmul(void* c, const void* a, const void* b, std::int64_t M, std::int64_t N,
                         std::int64_t K, Trans ta, Trans tb, float alpha, float beta) {
  matmul_cuda(c, a, b, M, N, K, ta, tb, alpha, beta, dtype(), cublas_);
}
void CudaBackend::bias_forward(void* out, const void* bias, std::int64_t n, std::int64_t c) {
  bias_forward_cuda(out, bias, n, c, dtype(), stream_);
}
void CudaBackend::bias_backward(void* dbias, const void* dout, std::int64_t n, std::int64_t c) {
  bias_backward_cuda(dbias, dout, n, c, dtype(), stream_);
}
void CudaBackend::rope_forward(void* q, void* k, std::int64_t b, std::int64_t s, std::int64_t a,
                               std::int64_t kv, std::int64_t d, const RopeSpec& rope) {
  rope_forward_cuda(q, k, b, s, a, kv, d, rope, dtype(), stream_);
}
void CudaBackend::rope_backward(void* dq, void* dk, std::int64_t b, std::int64_t s, std::int64_t a,
                                std::int64_t kv, std::int64_t d, const RopeSpec& rope) {
  rope_backward_cuda(dq, dk, b, s, a, kv, d, rope, dtype(), stream_);
}
void CudaBackend::attention_forward(void* out, void* probs, float* lse, const void* q,
                                    const void* k, const void* v, std::int64_t b, std::int64_t s,
                                    std::int64_t a, std::int64_t kv, std::int64_t d,
                                    std::int64_t window, Attention variant) {
  attention_forward_cuda(out, probs, lse, q, k, v, b, s, a, kv, d, window, variant, dtype(),
                         cublas_, stream_);
}
void CudaBackend::attention_backward(void* dq, void* dk, void* dv, void* dprobs, float* delta,
                                     const void* dout, const void* q, const void* k, const void* v,
                                     const void* out, const void* probs, const float* lse,
                                     std::int64_t b, std::int64_t s, std::int64_t a,
                                     std::int64_t kv, std::int64_t d, std::int64_t window,
                                     Attention variant) {
  attention_backward_cuda(dq, dk, dv, dprobs, delta, dout, q, k, v, out, probs, lse, b, s, a, kv, d,
                          window, variant, dtype(), cublas_, stream_);
}
void CudaBackend::attention_ring_forward(float* acc, float* lse, const void* q, const void* k,
                                         const void* v, std::int64_t b, std::int64_t sq,
                                         std::int64_t sk, std::int64_t a, std::int64_t kv,
                                         std::int64_t d, std::int64_t window, SeqPositions qpos,
                                         SeqPositions kpos, bool first) {
  attention_ring_forward_cuda(acc, lse, q, k, v, b, sq, sk, a, kv, d, window, qpos, kpos, first,
                              dtype(), stream_);
}
void CudaBackend::attention_ring_backward(float* dq, float* dk, float* dv, float* delta,
                                          const void* dout, const void* q, const void* k,
                                          const void* v, const void* out, const float* lse,
                                          std::int64_t b, std::int64_t sq, std::int64_t sk,
                                          std::int64_t a, std::int64_t kv, std::int64_t d,
                                          std::int64_t window, SeqPositions qpos, SeqPositions kpos,
                                          bool first) {
  attention_ring_backward_cuda(dq, dk, dv, delta, dout, q, k, v, out, lse, b, sq, sk, a, kv, d,
                               window, qpos, kpos, first, dtype(), stream_);
}
void CudaBackend::round_from_f32(void* out, const float* in, std::int64_t n) {
  round_from_f32_cuda(out, in, n, dtype(), stream_);
}
void CudaBackend::swiglu_forward(void* out, const void* gate, const void* up, std::int64_t n) {
  swiglu_forward_cuda(out, gate, up, n, dtype(), stream_);
}
void CudaBackend::swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate,
                                  const void* up, std::int64_t n) {
  swiglu_backward_cuda(dgate, dup, dout, gate, up, n, dtype(), stream_);
}
void CudaBackend::cross_entropy_forward(float* losses, float* lse, const void* logits,
                                        const std::int32_t* targets, std::int64_t n,
                                        std::int64_t V) {
  cross_entropy_forward_cuda(losses, lse, logits, targets, n, V, dtype(), stream_);
}
void CudaBackend::cross_entropy_backward(void* dlogits, const void* logits, const float* lse,
                                         const std::int32_t* targets, std::int64_t n,
                                         std::int64_t V, float scale) {
  cross_entropy_backward_cuda(dlogits, logits, lse, targets, n, V, scale, dtype(), stream_);
}
void CudaBackend::adamw_update(void* param, const void* grad, float* master, float* m, float* v,
                               std::int64_t n, const AdamWParams& hp, int step, float grad_scale) {
  adamw_update_cuda(param, grad, master, m, v, n, hp, step, grad_scale, dtype(), stream_);
}
void CudaBackend::sgd_update(void* param, const void* grad, float* master, std::int64_t n, float lr,
                             float grad_scale) {
  sgd_update_cuda(param, grad, master, n, lr, grad_scale, dtype(), stream_);
}
void CudaBackend::bnb_adamw8bit_tables(float* qmap_signed, float* qmap_unsigned,
                                       std::uint8_t* lut_signed, std::uint8_t* lut_unsigned) {
  std::vector<float> qs(kBnbMapEntries), qu(kBnbMapEntries);
  std::vector<std::uint8_t> ls(kBnbLutEntries), lu(kBnbLutEntries);
  bnb_adamw8bit_tables_host(qs.data(), qu.data(), ls.data(), lu.data());
  upload(qmap_signed, qs.data(), qs.size() * sizeof(float));
  upload(qmap_unsigned, qu.data(), qu.size() * sizeof(float));
  upload(lut_signed, ls.data(), ls.size());
  upload(lut_unsigned, lu.data(), lu.size());
}
void CudaBackend::bnb_adamw8bit_update(void* param, const void* grad, std::uint8_t* s1,
                                       std::uint8_t* s2, float* absmax1, float* absmax2,
                                       const float* qmap_signed, const float* qmap_unsigned,
                                       const std::uint8_t* lut_signed,
                                       const std::uint8_t* lut_unsigned, std::int64_t n,
                                       const BnbAdamWParams& hp, int step) {
  bnb_adamw8bit_update_cuda(param, grad, s1, s2, absmax1, absmax2, qmap_signed, qmap_unsigned,
                            lut_signed, lut_unsigned, n, hp, step, dtype(), stream_);
}
void CudaBackend::bnb_adamw32_update(void* param, const void* grad, float* m, float* v,
                                     std::int64_t n, const BnbAdamWParams& hp, int step) {
  bnb_adamw32_update_cuda(param, grad, m, v, n, hp, step, dtype(), stream_);
}
void CudaBackend::quant4_tables(float* code, float* nested_code, std::uint8_t* nested_lut,
                                Quant4Type t) {
  std::vector<float> c(16), nc(256);
  std::vector<std::uint8_t> lut(kBnbLutEntries);
  quant4_tables_host(c.data(), nc.data(), lut.data(), t);
  upload(code, c.data(), c.size() * sizeof(float));
  if (nested_code) upload(nested_code, nc.data(), nc.size() * sizeof(float));
  if (nested_lut) upload(nested_lut, lut.data(), lut.size());
}
void CudaBackend::quantize_4bit(std::uint8_t* packed, float* absmax, const void* x, std::int64_t n,
                                std::int64_t blocksize, Quant4Type t) {
  quantize_4bit_cuda(packed, absmax, x, n, blocksize, t, dtype(), stream_);
}
void CudaBackend::quantize_int8(std::int8_t* cb, float* scb, const void* w, std::int64_t rows,
                                std::int64_t cols) {
  quantize_int8_cuda(cb, scb, w, rows, cols, dtype(), stream_);
}
void CudaBackend::dequantize_int8(void* out, const std::int8_t* cb, const float* scb,
                                  std::int64_t rows, std::int64_t cols) {
  dequantize_int8_cuda(out, cb, scb, rows, cols, dtype(), stream_);
}
void CudaBackend::dequantize_4bit(void* out, const std::uint8_t* packed, const float* absmax,
                                  std::int64_t n, std::int64_t blocksize, Quant4Type t,
                                  bool signed_zero) {
  dequantize_4bit_cuda(out, packed, absmax, n, blocksize, t, signed_zero, dtype(), stream_);
}
void CudaBackend::quantize_blockwise8(std::uint8_t* q, float* absmax, const float* x, float sub,
                                      std::int64_t n, std::int64_t blocksize,
                                      const std::uint8_t* lut) {
  quantize_blockwise8_cuda(q, absmax, x, sub, n, blocksize, lut, stream_);
}
void CudaBackend::dequantize_blockwise8(float* out, const std::uint8_t* q, const float* absmax,
                                        const float* code, std::int64_t n, std::int64_t blocksize,
                                        float add) {
  dequantize_blockwise8_cuda(out, q, absmax, code, n, blocksize, true, add, stream_);
}
float CudaBackend::double_quant_offset(const float* absmax, std::int64_t nb) {
  std::vector<float> host(static_cast<std::size_t>(nb));
  download(host.data(), absmax, host.size() * sizeof(float));  // waits for the stream
  return trainmem::double_quant_offset(host.data(), nb);
}
void CudaBackend::dropout_mask(std::uint8_t* mask, std::int64_t n, float p, std::uint64_t seed,
                               std::uint64_t stream) {
  dropout_mask_cuda(mask, n, p, seed, stream, stream_);
}
void CudaBackend::dropout_apply(void* out, const void* x, const std::uint8_t* mask, std::int64_t n,
                                float scale, bool accumulate) {
  dropout_apply_cuda(out, x, mask, n, scale, accumulate, dtype(), stream_);
}
void CudaBackend::moe_route(float* probs, std::int32_t* idx, float* weight, std::int32_t* pos,
                            std::int32_t* offsets, const void* logits, std::int64_t n,
                            std::int64_t E, std::int64_t K, std::int64_t capacity, bool normalize) {
  moe_route_cuda(probs, idx, weight, pos, offsets, logits, n, E, K, capacity, normalize, dtype(),
                 stream_);
}
void CudaBackend::moe_route_backward(void* dlogits, const float* dweight, const float* probs,
                                     const std::int32_t* idx, const float* aux, std::int64_t n,
                                     std::int64_t E, std::int64_t K, bool normalize) {
  moe_route_backward_cuda(dlogits, dweight, probs, idx, aux, n, E, K, normalize, dtype(), stream_);
}
void CudaBackend::moe_permute(void* rows, const void* x, const std::int32_t* pos, std::int64_t n,
                              std::int64_t K, std::int64_t h) {
  moe_permute_cuda(rows, x, pos, n, K, h, dtype(), stream_);
}
void CudaBackend::moe_combine(void* out, const void* res, const void* rows, const float* weight,
                              const std::int32_t* pos, std::int64_t n, std::int64_t K,
                              std::int64_t h) {
  moe_combine_cuda(out, res, rows, weight, pos, n, K, h, dtype(), stream_);
}
void CudaBackend::moe_combine_backward(void* drows, float* dweight, const void* dout,
                                       const void* rows, const float* weight,
                                       const std::int32_t* pos, std::int64_t n, std::int64_t K,
                                       std::int64_t h) {
  moe_combine_backward_cuda(drows, dweight, dout, rows, weight, pos, n, K, h, dtype(), stream_);
}
void CudaBackend::moe_gate_add(void* out, const void* y, const void* score, std::int64_t n,
                               std::int64_t h) {
  moe_gate_add_cuda(out, y, score, n, h, dtype(), stream_);
}
void CudaBackend::moe_gate_backward(void* dy, void* dscore, const void* dout, const void* y,
                                    const void* score, std::int64_t n, std::int64_t h) {
  moe_gate_backward_cuda(dy, dscore, dout, y, score, n, h, dtype(), stream_);
}
void CudaBackend::check_finite(const void* x, std::int64_t n) {
  flag_nonfinite_cuda(nonfinite_device_, x, n, dtype(), stream_);
}
bool CudaBackend::take_nonfinite() {
  TM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  // Written by kernels through the mapping: read it as memory the compiler does not own.
  volatile unsigned* flag = nonfinite_host_;
  const bool found = *flag != 0;
  *flag = 0;  // no kernel is in flight on the stream now
  return found;
}

std::unique_ptr<Backend> make_cuda_backend(DType dtype) {
  return std::make_unique<CudaBackend>(dtype);
}

}  // namespace trainmem
