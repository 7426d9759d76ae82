// The op interface every execution backend implements: cpu (reference arithmetic, OpenBLAS),
// meta (no arithmetic; allocations only) and cuda (our kernels + cuBLAS). One model code path
// (src/model/model.cpp) runs on all three.
//
// Conventions (llm.c style): outputs first, then inputs, then dimensions. Buffers marked D
// are in the backend's training dtype (dtype()); f32 buffers are float*; token ids int32.
// Weight gradients accumulate with +=; activation gradients are written with =, except where
// a comment says "+=". All math is done in fp32 and rounded once when stored to D.
// Dimension letters (the project's, docs/architecture.md "Dimension letters"): b batch,
// s sequence, h hidden, a heads, kv kv heads, d head dim, V vocab; n = b*s rows (rmsnorm,
// cross-entropy) or an element count (swiglu, optimizers).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "trainmem/base/config.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/op_types.hpp"
#include "trainmem/base/param_init.hpp"
#include "trainmem/ledger/ledger.hpp"

namespace trainmem {

enum class BackendKind { cpu, meta, cuda };
const char* backend_name(BackendKind k);

class Backend {
 public:
  explicit Backend(DType dtype) : dtype_(dtype) {}
  virtual ~Backend() = default;
  DType dtype() const { return dtype_; }
  virtual BackendKind kind() const = 0;
  virtual Allocator& allocator() = 0;
  // Where a paged optimizer's large states live (ParameterOptimizer; their own ledger): CUDA
  // managed memory on cuda, the backend's own allocator elsewhere (cpu memory is host memory;
  // meta's addresses are unique across ledgers). Outside any device budget.
  virtual Allocator& managed_allocator() { return allocator(); }
  // False for meta: the model then skips reading results (loss is reported as NaN).
  virtual bool computes() const { return true; }
  virtual void synchronize() {}

  // ---- data movement (host pointers are ordinary memory) ----
  virtual void upload(void* dst, const void* host_src, std::uint64_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, std::uint64_t bytes) = 0;
  virtual void fill_zero(void* dst, std::uint64_t bytes) = 0;
  virtual void copy(void* dst, const void* src, std::uint64_t bytes) = 0;
  // Tells GEMMs which buffer to use as scratch (cuBLAS workspace); cuda's embedding_backward
  // borrows it too (no bytes beyond it). cpu/meta ignore it.
  virtual void set_gemm_workspace(void* ptr, std::uint64_t bytes) {}
  // dst (n) D = round(param_init_value(init, e)) and, when master is non-null, master (n) f32
  // = param_init_value(init, e) (before rounding), for e in [0, n). The default generates the
  // values on the host in chunks and uploads them; cuda computes them on the device.
  virtual void init_param(void* dst, float* master, std::uint64_t n, const ParamInit& init);

  // ---- ops ----
  // out (b, s, h) D = wte[tokens] ; wte (V, h) D
  virtual void embedding_forward(void* out, const std::int32_t* tokens, const void* wte,
                                 std::int64_t b, std::int64_t s, std::int64_t h,
                                 std::int64_t V) = 0;
  // dwte (V, h) D += scatter of dout (b, s, h) D by tokens
  virtual void embedding_backward(void* dwte, const void* dout, const std::int32_t* tokens,
                                  std::int64_t b, std::int64_t s, std::int64_t h,
                                  std::int64_t V) = 0;
  // out (n, h) D = inp * rstd * weight, rstd (n) f32 = 1/sqrt(mean(inp^2) + eps)
  virtual void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight,
                               std::int64_t n, std::int64_t h, float eps) = 0;
  // dinp (n, h) D += ..., dweight (h) D += ... (nullptr: a frozen weight, no gradient)
  virtual void rmsnorm_backward(void* dinp, void* dweight, const void* dout, const void* inp,
                                const void* weight, const float* rstd, std::int64_t n,
                                std::int64_t h) = 0;
  // c (M,N) = alpha * op(a) * op(b) + beta * c, row-major, all D, fp32 accumulation.
  // op(a) is (M,K): a is (M,K) for Trans::no, (K,M) for Trans::yes; op(b) is (K,N).
  virtual void matmul(void* c, const void* a, const void* b, std::int64_t M, std::int64_t N,
                      std::int64_t K, Trans ta, Trans tb, float alpha, float beta) = 0;
  // out (n, c) D += bias (c) D, broadcast over the n rows (the q/k/v projection biases).
  virtual void bias_forward(void* out, const void* bias, std::int64_t n, std::int64_t c) = 0;
  // dbias (c) D += the column sums of dout (n, c) D (summed in fp32, rounded once).
  virtual void bias_backward(void* dbias, const void* dout, std::int64_t n, std::int64_t c) = 0;
  // In place on q (b, s, a, d) and k (b, s, kv, d): HuggingFace rotate-half RoPE at positions
  // 0..s-1 with inv_freq[j] = theta^(-2j/d), rescaled under rope.scaling (op_types.hpp).
  // Backward applies the inverse rotation.
  virtual void rope_forward(void* q, void* k, std::int64_t b, std::int64_t s, std::int64_t a,
                            std::int64_t kv, std::int64_t d, const RopeSpec& rope) = 0;
  virtual void rope_backward(void* dq, void* dk, std::int64_t b, std::int64_t s, std::int64_t a,
                             std::int64_t kv, std::int64_t d, const RopeSpec& rope) = 0;
  // Causal attention, scale 1/sqrt(d), GQA: query head qh reads kv head qh / (a/kv).
  // q, out (b, s, a, d) D; k, v (b, s, kv, d) D. window W > 0: query t attends to keys
  // max(0, t−W+1)..t only (sliding window); 0: to 0..t.
  // eager: probs (b, a, s, s) D receives the softmax probabilities (lse unused, may be null).
  // flash: lse (b, a, s) f32 receives the row log-sum-exp (probs unused, may be null).
  virtual void attention_forward(void* out, void* probs, float* lse, const void* q, const void* k,
                                 const void* v, std::int64_t b, std::int64_t s, std::int64_t a,
                                 std::int64_t kv, std::int64_t d, std::int64_t window,
                                 Attention variant) = 0;
  // dq (b, s, a, d), dk, dv (b, s, kv, d) written with =. Scratch: eager dprobs (b, a, s, s) D;
  // flash delta (b, a, s) f32 (= rowsum(dout * out)).
  virtual void attention_backward(void* dq, void* dk, void* dv, void* dprobs, float* delta,
                                  const void* dout, const void* q, const void* k, const void* v,
                                  const void* out, const void* probs, const float* lse,
                                  std::int64_t b, std::int64_t s, std::int64_t a, std::int64_t kv,
                                  std::int64_t d, std::int64_t window, Attention variant) = 0;
  // Ring attention (context parallelism; kernels/attention/attention_ring.hpp): the rank's
  // queries q (b, sq, a, d) at positions qpos against one key/value block k, v (b, sk, kv, d) at
  // positions kpos. Forward merges the block into acc (b, sq, a, d) f32 and lse (b, a, sq) f32
  // (`first`: both start empty); backward adds the block's share into dq (b, sq, a, d),
  // dk, dv (b, sk, kv, d) f32 from the final out and lse, delta (b, a, sq) f32 = rowsum(dout *
  // out) written when `first`. cpu and cuda compute them (the same per-row code), meta does
  // nothing.
  virtual void attention_ring_forward(float* acc, float* lse, const void* q, const void* k,
                                      const void* v, std::int64_t b, std::int64_t sq,
                                      std::int64_t sk, std::int64_t a, std::int64_t kv,
                                      std::int64_t d, std::int64_t window, SeqPositions qpos,
                                      SeqPositions kpos, bool first) = 0;
  virtual void attention_ring_backward(float* dq, float* dk, float* dv, float* delta,
                                       const void* dout, const void* q, const void* k,
                                       const void* v, const void* out, const float* lse,
                                       std::int64_t b, std::int64_t sq, std::int64_t sk,
                                       std::int64_t a, std::int64_t kv, std::int64_t d,
                                       std::int64_t window, SeqPositions qpos, SeqPositions kpos,
                                       bool first) = 0;
  // out (n) D = round(in (n) f32): ring attention's fp32 sums into the D tensors (same support).
  virtual void round_from_f32(void* out, const float* in, std::int64_t n) = 0;
  // out (n) D = silu(gate) * up
  virtual void swiglu_forward(void* out, const void* gate, const void* up, std::int64_t n) = 0;
  virtual void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate,
                               const void* up, std::int64_t n) = 0;
  // losses (n) f32 = lse - logit[target] (0 where target < 0); lse (n) f32; logits (n, V) D.
  virtual void cross_entropy_forward(float* losses, float* lse, const void* logits,
                                     const std::int32_t* targets, std::int64_t n,
                                     std::int64_t V) = 0;
  // dlogits (n, V) D = scale * (softmax(logits) - onehot(target)); rows with target < 0 are 0.
  // dlogits may alias logits.
  virtual void cross_entropy_backward(void* dlogits, const void* logits, const float* lse,
                                      const std::int32_t* targets, std::int64_t n, std::int64_t V,
                                      float scale) = 0;
  // AdamW with bias correction (step >= 1) and decoupled weight decay. master (n) f32 is the
  // fp32 copy when D is 16-bit (param is then written as round(master)); nullptr when D is
  // fp32 (param itself is updated). m, v (n) f32. The optimizers use each gradient element as
  // float(grad) * grad_scale, in fp32: 1/S undoes a static loss scale S (fp16 runs); 1 leaves
  // the arithmetic exactly as without a scale.
  virtual void adamw_update(void* param, const void* grad, float* master, float* m, float* v,
                            std::int64_t n, const AdamWParams& hp, int step, float grad_scale) = 0;
  // param -= lr * grad * grad_scale (through master when non-null). LOMO uses this with
  // master = nullptr.
  virtual void sgd_update(void* param, const void* grad, float* master, std::int64_t n, float lr,
                          float grad_scale) = 0;
  // bitsandbytes' AdamW8bit (kernels/adamw8bit/adamw8bit.hpp), param (n) D updated in place.
  // bnb_adamw8bit_tables fills the shared constants: qmap_signed / qmap_unsigned (256 f32, the
  // dynamic maps of the first and second moment) and lut_signed / lut_unsigned
  // (kBnbLutEntries u8, the quantizer's lookup tables). The 8-bit update (n >= 4096): s1, s2
  // (n) u8, absmax1, absmax2 (ceil(n / 256)) f32. The fp32-state update (smaller tensors): m, v
  // (n) f32. step >= 1. The gradients must carry no loss scale.
  virtual void bnb_adamw8bit_tables(float* qmap_signed, float* qmap_unsigned,
                                    std::uint8_t* lut_signed, std::uint8_t* lut_unsigned) = 0;
  virtual void bnb_adamw8bit_update(void* param, const void* grad, std::uint8_t* s1,
                                    std::uint8_t* s2, float* absmax1, float* absmax2,
                                    const float* qmap_signed, const float* qmap_unsigned,
                                    const std::uint8_t* lut_signed,
                                    const std::uint8_t* lut_unsigned, std::int64_t n,
                                    const BnbAdamWParams& hp, int step) = 0;
  virtual void bnb_adamw32_update(void* param, const void* grad, float* m, float* v, std::int64_t n,
                                  const BnbAdamWParams& hp, int step) = 0;
  // bitsandbytes' 4-bit weights (kernels/quant4/quant4.hpp; docs/native-plan.md, "QLoRA").
  // quant4_tables fills the constants: code (16 f32, the 4-bit type's values), nested_code (256
  // f32, the signed dynamic map double quantization uses) and nested_lut (kBnbLutEntries u8, its
  // quantizer's lookup table; either nested one may be nullptr). quantize_4bit: packed ((n + 1) /
  // 2) u8 and absmax (ceil(n / blocksize)) f32 from x (n) D; dequantize_4bit: out (n) D =
  // code[nibble] · absmax of its block. quantize_blockwise8: q (n) u8 and absmax (ceil(n /
  // blocksize)) f32 from x - sub (n f32) through nested_lut; dequantize_blockwise8: out (n) f32 =
  // nested code[q] · absmax (+ add). double_quant_offset: the mean of absmax (nb f32), as double
  // quantization subtracts it (a host float; it waits for the device).
  virtual void quant4_tables(float* code, float* nested_code, std::uint8_t* nested_lut,
                             Quant4Type t) = 0;
  virtual void quantize_4bit(std::uint8_t* packed, float* absmax, const void* x, std::int64_t n,
                             std::int64_t blocksize, Quant4Type t) = 0;
  virtual void dequantize_4bit(void* out, const std::uint8_t* packed, const float* absmax,
                               std::int64_t n, std::int64_t blocksize, Quant4Type t,
                               bool signed_zero) = 0;
  virtual void quantize_blockwise8(std::uint8_t* q, float* absmax, const float* x, float sub,
                                   std::int64_t n, std::int64_t blocksize,
                                   const std::uint8_t* lut) = 0;
  // bitsandbytes' 8-bit base (--quant int8; kernels/quant4/quant4.hpp; docs/native-plan.md,
  // "8-bit base"): quantize_int8: cb (rows·cols) int8 and scb (rows) f32 from w (rows, cols) D;
  // dequantize_int8: out (rows, cols) D = cb · (scb / 127) per row.
  virtual void quantize_int8(std::int8_t* cb, float* scb, const void* w, std::int64_t rows,
                             std::int64_t cols) = 0;
  virtual void dequantize_int8(void* out, const std::int8_t* cb, const float* scb,
                               std::int64_t rows, std::int64_t cols) = 0;
  virtual void dequantize_blockwise8(float* out, const std::uint8_t* q, const float* absmax,
                                     const float* code, std::int64_t n, std::int64_t blocksize,
                                     float add) = 0;
  virtual float double_quant_offset(const float* absmax, std::int64_t nb) = 0;
  // LoRA dropout (kernels/dropout/dropout.hpp): dropout_mask fills mask (n) u8 with 1 (kept) or
  // 0 (dropped), element e from (seed, stream, e) with probability p of 0; dropout_apply writes
  // out (n) D = (accumulate ? out : 0) + x (n) D · mask · scale.
  virtual void dropout_mask(std::uint8_t* mask, std::int64_t n, float p, std::uint64_t seed,
                            std::uint64_t stream) = 0;
  virtual void dropout_apply(void* out, const void* x, const std::uint8_t* mask, std::int64_t n,
                             float scale, bool accumulate) = 0;
  // Mixture of experts (kernels/moe/moe.hpp; docs/native-plan.md, "Mixture of experts"): the
  // router's fp32 softmax and top-k with the tokens' order by expert (offsets (E + 1), pos (n, K)
  // i32), its backward into dlogits (n, E) D, the rows gathered into expert order, combined back
  // (weighted, onto a residual) and the combine's backward. cpu and cuda compute them, meta does
  // nothing. capacity > 0: rows per expert, the later choices dropped (pos −1;
  // kernels/moe/moe.hpp).
  virtual void moe_route(float* probs, std::int32_t* idx, float* weight, std::int32_t* pos,
                         std::int32_t* offsets, const void* logits, std::int64_t n, std::int64_t E,
                         std::int64_t K, std::int64_t capacity, bool normalize) = 0;
  virtual void moe_route_backward(void* dlogits, const float* dweight, const float* probs,
                                  const std::int32_t* idx, const float* aux, std::int64_t n,
                                  std::int64_t E, std::int64_t K, bool normalize) = 0;
  virtual void moe_permute(void* rows, const void* x, const std::int32_t* pos, std::int64_t n,
                           std::int64_t K, std::int64_t h) = 0;
  virtual void moe_combine(void* out, const void* res, const void* rows, const float* weight,
                           const std::int32_t* pos, std::int64_t n, std::int64_t K,
                           std::int64_t h) = 0;
  virtual void moe_combine_backward(void* drows, float* dweight, const void* dout, const void* rows,
                                    const float* weight, const std::int32_t* pos, std::int64_t n,
                                    std::int64_t K, std::int64_t h) = 0;
  // Qwen2-MoE's shared expert gate: out (n, h) D += σ(score)·y; its backward dy = σ(score)·dout,
  // dscore (n) D = σ'(score)·rowsum(dout·y).
  virtual void moe_gate_add(void* out, const void* y, const void* score, std::int64_t n,
                            std::int64_t h) = 0;
  virtual void moe_gate_backward(void* dy, void* dscore, const void* dout, const void* y,
                                 const void* score, std::int64_t n, std::int64_t h) = 0;
  // The overflow check of loss-scaled gradients, in two halves so that a step waits once:
  // check_finite queues a test of x (n) D for +-inf and NaN; take_nonfinite returns whether
  // any buffer checked since the previous take held one, and clears that (it waits for the
  // queued work). Meta: checks nothing, takes false.
  virtual void check_finite(const void* x, std::int64_t n) = 0;
  virtual bool take_nonfinite() = 0;

 private:
  DType dtype_;
};

// Factories. make_cuda_backend throws DeviceError when no device is usable.
std::unique_ptr<Backend> make_cpu_backend(DType dtype);
std::unique_ptr<Backend> make_meta_backend(DType dtype);
std::unique_ptr<Backend> make_cuda_backend(DType dtype);
// "" when a CUDA device is usable, else the reason (e.g. "cudaGetDeviceCount: CUDA driver
// version is insufficient (cudaErrorInsufficientDriver, 35)", or "built without CUDA").
std::string cuda_unavailable_reason();
// Multi-rank runs whose collectives go through host memory (--collectives mpi): makes device
// `local_rank` mod the node's device count current (ranks share GPUs when there are more ranks
// than devices) and returns it; InputError with the reason when no device is usable.
int cuda_use_device(int local_rank);
// The current device (cudaGetDevice); 0 without CUDA.
int cuda_current_device();
// Device 0's total memory as cudaMemGetInfo reports it; 0 with `reason` set when no device is
// usable or the call fails (maxbatch's `--budget device`).
std::uint64_t cuda_device_total_bytes(std::string* reason);

}  // namespace trainmem
