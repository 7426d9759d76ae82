// The cuda backend: our kernels (kernels/*.cu) and cuBLAS on one stream of the current device.
// make_cuda_backend (include/trainmem/backends/backend.hpp) returns one of these; GPU tests, the
// probes and the benchmarks reach the stream, the cuBLAS handle and the allocator through it.
//
// Memory: every byte comes from the DeviceAllocator's pool (cudaMallocFromPoolAsync on the
// backend's stream) through the ledger; kernels allocate nothing. The cuBLAS workspace is the
// ledger's `cublas_workspace` tensor, handed over by set_gemm_workspace (cublasSetWorkspace).
// Until then cuBLAS uses the default workspace it made at cublasCreate (device overhead, not a
// ledger tensor). The embedding backward borrows the same buffer as scratch for its sort
// (kernels/embedding/embedding.cu); without it, it runs its kernel that needs no scratch.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <memory>

#include "trainmem/backends/backend.hpp"
#include "trainmem/backends/device_allocator.hpp"

namespace trainmem {

class CudaBackend final : public Backend {
 public:
  // Throws DeviceError when no device is usable (with cuda_unavailable_reason()), InputError
  // for a dtype that is not a training dtype.
  explicit CudaBackend(DType dtype);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  BackendKind kind() const override { return BackendKind::cuda; }
  Allocator& allocator() override;
  Allocator& managed_allocator() override { return managed_; }
  void synchronize() override;

  // The pool-backed allocator (what the probes read the pool's high-water marks from).
  DeviceAllocator& device_allocator();
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  int device() const { return device_; }

  // Transfers are ordered on the backend's stream; upload and download return when the copy
  // is complete (the host buffer may be reused or read at once).
  void upload(void* dst, const void* host_src, std::uint64_t bytes) override;
  void download(void* host_dst, const void* src, std::uint64_t bytes) override;
  void fill_zero(void* dst, std::uint64_t bytes) override;
  // Computed on the device (kernels/init/init.cu): no host generation, no upload.
  void init_param(void* dst, float* master, std::uint64_t n, const ParamInit& init) override;
  void copy(void* dst, const void* src, std::uint64_t bytes) override;
  // cublasSetWorkspace with the ledger's buffer; (nullptr, 0) hands cuBLAS back its default
  // workspace (call it before releasing the buffer when the backend outlives it). A buffer
  // cuBLAS would refuse (not 256-byte aligned, under 16 KiB) is InputError, before any call.
  void set_gemm_workspace(void* ptr, std::uint64_t bytes) override;

  void embedding_forward(void* out, const std::int32_t* tokens, const void* wte, std::int64_t b,
                         std::int64_t s, std::int64_t h, std::int64_t V) override;
  void embedding_backward(void* dwte, const void* dout, const std::int32_t* tokens, std::int64_t b,
                          std::int64_t s, std::int64_t h, std::int64_t V) override;
  void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, std::int64_t n,
                       std::int64_t h, float eps) override;
  void rmsnorm_backward(void* dinp, void* dweight, const void* dout, const void* inp,
                        const void* weight, const float* rstd, std::int64_t n,
                        std::int64_t h) override;
  void matmul(void* c, const void* a, const void* b, std::int64_t M, std::int64_t N, std::int64_t K,
              Trans ta, Trans tb, float alpha, float beta) override;
  void bias_forward(void* out, const void* bias, std::int64_t n, std::int64_t c) override;
  void bias_backward(void* dbias, const void* dout, std::int64_t n, std::int64_t c) override;
  void rope_forward(void* q, void* k, std::int64_t b, std::int64_t s, std::int64_t a,
                    std::int64_t kv, std::int64_t d, const RopeSpec& rope) override;
  void rope_backward(void* dq, void* dk, std::int64_t b, std::int64_t s, std::int64_t a,
                     std::int64_t kv, std::int64_t d, const RopeSpec& rope) override;
  void attention_forward(void* out, void* probs, float* lse, const void* q, const void* k,
                         const void* v, std::int64_t b, std::int64_t s, std::int64_t a,
                         std::int64_t kv, std::int64_t d, std::int64_t window,
                         Attention variant) override;
  void attention_backward(void* dq, void* dk, void* dv, void* dprobs, float* delta,
                          const void* dout, const void* q, const void* k, const void* v,
                          const void* out, const void* probs, const float* lse, std::int64_t b,
                          std::int64_t s, std::int64_t a, std::int64_t kv, std::int64_t d,
                          std::int64_t window, Attention variant) override;
  void attention_ring_forward(float* acc, float* lse, const void* q, const void* k, const void* v,
                              std::int64_t b, std::int64_t sq, std::int64_t sk, std::int64_t a,
                              std::int64_t kv, std::int64_t d, std::int64_t window,
                              SeqPositions qpos, SeqPositions kpos, bool first) override;
  void attention_ring_backward(float* dq, float* dk, float* dv, float* delta, const void* dout,
                               const void* q, const void* k, const void* v, const void* out,
                               const float* lse, std::int64_t b, std::int64_t sq, std::int64_t sk,
                               std::int64_t a, std::int64_t kv, std::int64_t d, std::int64_t window,
                               SeqPositions qpos, SeqPositions kpos, bool first) override;
  void round_from_f32(void* out, const float* in, std::int64_t n) override;
  void swiglu_forward(void* out, const void* gate, const void* up, std::int64_t n) override;
  void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                       std::int64_t n) override;
  void cross_entropy_forward(float* losses, float* lse, const void* logits,
                             const std::int32_t* targets, std::int64_t n, std::int64_t V) override;
  void cross_entropy_backward(void* dlogits, const void* logits, const float* lse,
                              const std::int32_t* targets, std::int64_t n, std::int64_t V,
                              float scale) override;
  void adamw_update(void* param, const void* grad, float* master, float* m, float* v,
                    std::int64_t n, const AdamWParams& hp, int step, float grad_scale) override;
  void sgd_update(void* param, const void* grad, float* master, std::int64_t n, float lr,
                  float grad_scale) override;
  void bnb_adamw8bit_tables(float* qmap_signed, float* qmap_unsigned, std::uint8_t* lut_signed,
                            std::uint8_t* lut_unsigned) override;
  void bnb_adamw8bit_update(void* param, const void* grad, std::uint8_t* s1, std::uint8_t* s2,
                            float* absmax1, float* absmax2, const float* qmap_signed,
                            const float* qmap_unsigned, const std::uint8_t* lut_signed,
                            const std::uint8_t* lut_unsigned, std::int64_t n,
                            const BnbAdamWParams& hp, int step) override;
  void bnb_adamw32_update(void* param, const void* grad, float* m, float* v, std::int64_t n,
                          const BnbAdamWParams& hp, int step) override;
  // The flag both write is a word of mapped pinned host memory (no device memory, so the
  // allocation plan and the device figures are unchanged): take_nonfinite synchronises the
  // stream, reads and clears it.
  void quant4_tables(float* code, float* nested_code, std::uint8_t* nested_lut,
                     Quant4Type t) override;
  void quantize_4bit(std::uint8_t* packed, float* absmax, const void* x, std::int64_t n,
                     std::int64_t blocksize, Quant4Type t) override;
  void dequantize_4bit(void* out, const std::uint8_t* packed, const float* absmax, std::int64_t n,
                       std::int64_t blocksize, Quant4Type t, bool signed_zero) override;
  void quantize_int8(std::int8_t* cb, float* scb, const void* w, std::int64_t rows,
                     std::int64_t cols) override;
  void dequantize_int8(void* out, const std::int8_t* cb, const float* scb, std::int64_t rows,
                       std::int64_t cols) override;
  void quantize_blockwise8(std::uint8_t* q, float* absmax, const float* x, float sub,
                           std::int64_t n, std::int64_t blocksize,
                           const std::uint8_t* lut) override;
  void dequantize_blockwise8(float* out, const std::uint8_t* q, const float* absmax,
                             const float* code, std::int64_t n, std::int64_t blocksize,
                             float add) override;
  float double_quant_offset(const float* absmax, std::int64_t nb) override;
  void dropout_mask(std::uint8_t* mask, std::int64_t n, float p, std::uint64_t seed,
                    std::uint64_t stream) override;
  void dropout_apply(void* out, const void* x, const std::uint8_t* mask, std::int64_t n,
                     float scale, bool accumulate) override;
  void moe_route(float* probs, std::int32_t* idx, float* weight, std::int32_t* pos,
                 std::int32_t* offsets, const void* logits, std::int64_t n, std::int64_t E,
                 std::int64_t K, std::int64_t capacity, bool normalize) override;
  void moe_route_backward(void* dlogits, const float* dweight, const float* probs,
                          const std::int32_t* idx, const float* aux, std::int64_t n, std::int64_t E,
                          std::int64_t K, bool normalize) override;
  void moe_permute(void* rows, const void* x, const std::int32_t* pos, std::int64_t n,
                   std::int64_t K, std::int64_t h) override;
  void moe_combine(void* out, const void* res, const void* rows, const float* weight,
                   const std::int32_t* pos, std::int64_t n, std::int64_t K,
                   std::int64_t h) override;
  void moe_combine_backward(void* drows, float* dweight, const void* dout, const void* rows,
                            const float* weight, const std::int32_t* pos, std::int64_t n,
                            std::int64_t K, std::int64_t h) override;
  void moe_gate_add(void* out, const void* y, const void* score, std::int64_t n,
                    std::int64_t h) override;
  void moe_gate_backward(void* dy, void* dscore, const void* dout, const void* y, const void* score,
                         std::int64_t n, std::int64_t h) override;
  void check_finite(const void* x, std::int64_t n) override;
  bool take_nonfinite() override;

 private:
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<DeviceAllocator> allocator_;  // destroyed first (see the destructor)
  ManagedAllocator managed_;                    // paged optimizer states
  void* gemm_workspace_ = nullptr;  // set_gemm_workspace's buffer, lent to embedding_backward
  std::uint64_t gemm_workspace_bytes_ = 0;
  unsigned* nonfinite_host_ = nullptr;    // cudaHostAllocMapped word
  unsigned* nonfinite_device_ = nullptr;  // its device address
};

}  // namespace trainmem
