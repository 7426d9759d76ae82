// The cpu backend: real arithmetic in fp32 on host memory (HostAllocator), storage in the
// run's dtype (bf16/fp16 buffers hold 16-bit values, converted on the fly, so the ledger's
// bytes are those of a GPU run). Each op forwards to its CPU reference in kernels/*_cpu.cpp
// with the same argument order the CUDA launchers use. GEMMs go through OpenBLAS; elementwise
// and row loops use OpenMP.
//
// Host memory: CachingHostAllocator keeps freed blocks for reuse by an allocation of the same
// size (a training step allocates and frees the same sizes every step; fresh pages from the OS
// cost page faults and zeroing, 5-6% of a step on the small-256 benchmark). It never holds
// more than the high-water mark of live bytes (cached + live <= max live seen so far), so the
// resident set is not raised above what the uncached allocator reached. The ledger sits above
// it and records the same allocations either way.
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "adamw/adamw.hpp"
#include "adamw8bit/adamw8bit.hpp"
#include "attention/attention.hpp"
#include "attention/attention_ring.hpp"
#include "bias/bias.hpp"
#include "cross_entropy/cross_entropy.hpp"
#include "dropout/dropout.hpp"
#include "embedding/embedding.hpp"
#include "matmul/matmul.hpp"
#include "moe/moe.hpp"
#include "nonfinite/nonfinite.hpp"
#include "quant4/quant4.hpp"
#include "rmsnorm/rmsnorm.hpp"
#include "rope/rope.hpp"
#include "swiglu/swiglu.hpp"
#include "trainmem/backends/backend.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

class CachingHostAllocator final : public Allocator {
 public:
  ~CachingHostAllocator() override {
    for (auto& [bytes, ptr] : cache_) inner_.deallocate(ptr, bytes);
  }
  void* allocate(std::uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(bytes);
    if (it != cache_.end()) {
      void* p = it->second;
      cache_.erase(it);
      cached_ -= bytes;
      live_ += bytes;
      return p;
    }
    // Make room: live + new + cached stays within the high-water mark (or live + new, when
    // that is the new high-water mark, with nothing cached).
    while (!cache_.empty() && live_ + bytes + cached_ > std::max(peak_, live_ + bytes)) {
      auto victim = std::prev(cache_.end());  // the largest block
      inner_.deallocate(victim->second, victim->first);
      cached_ -= victim->first;
      cache_.erase(victim);
    }
    void* p = inner_.allocate(bytes);
    if (p == nullptr && !cache_.empty()) {  // out of memory: give everything back and retry
      for (auto& [b, ptr] : cache_) inner_.deallocate(ptr, b);
      cache_.clear();
      cached_ = 0;
      p = inner_.allocate(bytes);
    }
    if (p != nullptr) {
      live_ += bytes;
      peak_ = std::max(peak_, live_);
    }
    return p;
  }
  void deallocate(void* ptr, std::uint64_t bytes) override {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    live_ -= bytes;
    if (live_ + cached_ + bytes <= peak_) {
      cache_.emplace(bytes, ptr);
      cached_ += bytes;
    } else {
      inner_.deallocate(ptr, bytes);
    }
  }
  const char* name() const override { return inner_.name(); }

 private:
  HostAllocator inner_;
  std::mutex mu_;
  std::multimap<std::uint64_t, void*> cache_;  // freed blocks by size
  std::uint64_t live_ = 0, cached_ = 0, peak_ = 0;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(DType dtype) : Backend(dtype) {}
  BackendKind kind() const override { return BackendKind::cpu; }
  Allocator& allocator() override { return alloc_; }

  void upload(void* dst, const void* host_src, std::uint64_t bytes) override {
    if (bytes) std::memcpy(dst, host_src, bytes);
  }
  void download(void* host_dst, const void* src, std::uint64_t bytes) override {
    if (bytes) std::memcpy(host_dst, src, bytes);
  }
  void fill_zero(void* dst, std::uint64_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
  }
  void copy(void* dst, const void* src, std::uint64_t bytes) override {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }

  void embedding_forward(void* out, const std::int32_t* tokens, const void* wte, std::int64_t b,
                         std::int64_t s, std::int64_t h, std::int64_t V) override {
    embedding_forward_cpu(out, tokens, wte, b, s, h, V, dtype());
  }
  void embedding_backward(void* dwte, const void* dout, const std::int32_t* tokens, std::int64_t b,
                          std::int64_t s, std::int64_t h, std::int64_t V) override {
    embedding_backward_cpu(dwte, dout, tokens, b, s, h, V, dtype());
  }
  void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, std::int64_t n,
                       std::int64_t h, float eps) override {
    rmsnorm_forward_cpu(out, rstd, inp, weight, n, h, eps, dtype());
  }
  void rmsnorm_backward(void* dinp, void* dweight, const void* dout, const void* inp,
                        const void* weight, const float* rstd, std::int64_t n,
                        std::int64_t h) override {
    rmsnorm_backward_cpu(dinp, dweight, dout, inp, weight, rstd, n, h, dtype());
  }
  void matmul(void* c, const void* a, const void* b, std::int64_t M, std::int64_t N, std::int64_t K,
              Trans ta, Trans tb, float alpha, float beta) override {
    matmul_cpu(c, a, b, M, N, K, ta, tb, alpha, beta, dtype());
  }
  void bias_forward(void* out, const void* bias, std::int64_t n, std::int64_t c) override {
    bias_forward_cpu(out, bias, n, c, dtype());
  }
  void bias_backward(void* dbias, const void* dout, std::int64_t n, std::int64_t c) override {
    bias_backward_cpu(dbias, dout, n, c, dtype());
  }
  void rope_forward(void* q, void* k, std::int64_t b, std::int64_t s, std::int64_t a,
                    std::int64_t kv, std::int64_t d, const RopeSpec& rope) override {
    rope_forward_cpu(q, k, b, s, a, kv, d, rope, dtype());
  }
  void rope_backward(void* dq, void* dk, std::int64_t b, std::int64_t s, std::int64_t a,
                     std::int64_t kv, std::int64_t d, const RopeSpec& rope) override {
    rope_backward_cpu(dq, dk, b, s, a, kv, d, rope, dtype());
  }
  void attention_forward(void* out, void* probs, float* lse, const void* q, const void* k,
                         const void* v, std::int64_t b, std::int64_t s, std::int64_t a,
                         std::int64_t kv, std::int64_t d, std::int64_t window,
                         Attention variant) override {
    attention_forward_cpu(out, probs, lse, q, k, v, b, s, a, kv, d, window, variant, dtype());
  }
  void attention_backward(void* dq, void* dk, void* dv, void* dprobs, float* delta,
                          const void* dout, const void* q, const void* k, const void* v,
                          const void* out, const void* probs, const float* lse, std::int64_t b,
                          std::int64_t s, std::int64_t a, std::int64_t kv, std::int64_t d,
                          std::int64_t window, Attention variant) override {
    attention_backward_cpu(dq, dk, dv, dprobs, delta, dout, q, k, v, out, probs, lse, b, s, a, kv,
                           d, window, variant, dtype());
  }
  void swiglu_forward(void* out, const void* gate, const void* up, std::int64_t n) override {
    swiglu_forward_cpu(out, gate, up, n, dtype());
  }
  void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                       std::int64_t n) override {
    swiglu_backward_cpu(dgate, dup, dout, gate, up, n, dtype());
  }
  void cross_entropy_forward(float* losses, float* lse, const void* logits,
                             const std::int32_t* targets, std::int64_t n, std::int64_t V) override {
    cross_entropy_forward_cpu(losses, lse, logits, targets, n, V, dtype());
  }
  void cross_entropy_backward(void* dlogits, const void* logits, const float* lse,
                              const std::int32_t* targets, std::int64_t n, std::int64_t V,
                              float scale) override {
    cross_entropy_backward_cpu(dlogits, logits, lse, targets, n, V, scale, dtype());
  }
  void adamw_update(void* param, const void* grad, float* master, float* m, float* v,
                    std::int64_t n, const AdamWParams& hp, int step, float grad_scale) override {
    adamw_update_cpu(param, grad, master, m, v, n, hp, step, grad_scale, dtype());
  }
  void sgd_update(void* param, const void* grad, float* master, std::int64_t n, float lr,
                  float grad_scale) override {
    sgd_update_cpu(param, grad, master, n, lr, grad_scale, dtype());
  }
  void bnb_adamw8bit_tables(float* qmap_signed, float* qmap_unsigned, std::uint8_t* lut_signed,
                            std::uint8_t* lut_unsigned) override {
    bnb_adamw8bit_tables_host(qmap_signed, qmap_unsigned, lut_signed, lut_unsigned);
  }
  void bnb_adamw8bit_update(void* param, const void* grad, std::uint8_t* s1, std::uint8_t* s2,
                            float* absmax1, float* absmax2, const float* qmap_signed,
                            const float* qmap_unsigned, const std::uint8_t* lut_signed,
                            const std::uint8_t* lut_unsigned, std::int64_t n,
                            const BnbAdamWParams& hp, int step) override {
    bnb_adamw8bit_update_cpu(param, grad, s1, s2, absmax1, absmax2, qmap_signed, qmap_unsigned,
                             lut_signed, lut_unsigned, n, hp, step, dtype());
  }
  void bnb_adamw32_update(void* param, const void* grad, float* m, float* v, std::int64_t n,
                          const BnbAdamWParams& hp, int step) override {
    bnb_adamw32_update_cpu(param, grad, m, v, n, hp, step, dtype());
  }
  void quant4_tables(float* code, float* nested_code, std::uint8_t* nested_lut,
                     Quant4Type t) override {
    quant4_tables_host(code, nested_code, nested_lut, t);
  }
  void quantize_4bit(std::uint8_t* packed, float* absmax, const void* x, std::int64_t n,
                     std::int64_t blocksize, Quant4Type t) override {
    quantize_4bit_cpu(packed, absmax, x, n, blocksize, t, dtype());
  }
  void quantize_int8(std::int8_t* cb, float* scb, const void* w, std::int64_t rows,
                     std::int64_t cols) override {
    quantize_int8_cpu(cb, scb, w, rows, cols, dtype());
  }
  void dequantize_int8(void* out, const std::int8_t* cb, const float* scb, std::int64_t rows,
                       std::int64_t cols) override {
    dequantize_int8_cpu(out, cb, scb, rows, cols, dtype());
  }
  void dequantize_4bit(void* out, const std::uint8_t* packed, const float* absmax, std::int64_t n,
                       std::int64_t blocksize, Quant4Type t, bool signed_zero) override {
    dequantize_4bit_cpu(out, packed, absmax, n, blocksize, t, signed_zero, dtype());
  }
  void quantize_blockwise8(std::uint8_t* q, float* absmax, const float* x, float sub,
                           std::int64_t n, std::int64_t blocksize,
                           const std::uint8_t* lut) override {
    quantize_blockwise8_cpu(q, absmax, x, sub, n, blocksize, lut);
  }
  void dequantize_blockwise8(float* out, const std::uint8_t* q, const float* absmax,
                             const float* code, std::int64_t n, std::int64_t blocksize,
                             float add) override {
    dequantize_blockwise8_cpu(out, q, absmax, code, n, blocksize, true, add);
  }
  float double_quant_offset(const float* absmax, std::int64_t nb) override {
    return trainmem::double_quant_offset(absmax, nb);
  }
  void dropout_mask(std::uint8_t* mask, std::int64_t n, float p, std::uint64_t seed,
                    std::uint64_t stream) override {
    dropout_mask_cpu(mask, n, p, seed, stream);
  }
  void dropout_apply(void* out, const void* x, const std::uint8_t* mask, std::int64_t n,
                     float scale, bool accumulate) override {
    dropout_apply_cpu(out, x, mask, n, scale, accumulate, dtype());
  }
  void moe_route(float* probs, std::int32_t* idx, float* weight, std::int32_t* pos,
                 std::int32_t* offsets, const void* logits, std::int64_t n, std::int64_t E,
                 std::int64_t K, std::int64_t capacity, bool normalize) override {
    moe_route_cpu(probs, idx, weight, pos, offsets, logits, n, E, K, capacity, normalize, dtype());
  }
  void moe_route_backward(void* dlogits, const float* dweight, const float* probs,
                          const std::int32_t* idx, const float* aux, std::int64_t n, std::int64_t E,
                          std::int64_t K, bool normalize) override {
    moe_route_backward_cpu(dlogits, dweight, probs, idx, aux, n, E, K, normalize, dtype());
  }
  void moe_permute(void* rows, const void* x, const std::int32_t* pos, std::int64_t n,
                   std::int64_t K, std::int64_t h) override {
    moe_permute_cpu(rows, x, pos, n, K, h, dtype());
  }
  void moe_combine(void* out, const void* res, const void* rows, const float* weight,
                   const std::int32_t* pos, std::int64_t n, std::int64_t K,
                   std::int64_t h) override {
    moe_combine_cpu(out, res, rows, weight, pos, n, K, h, dtype());
  }
  void moe_combine_backward(void* drows, float* dweight, const void* dout, const void* rows,
                            const float* weight, const std::int32_t* pos, std::int64_t n,
                            std::int64_t K, std::int64_t h) override {
    moe_combine_backward_cpu(drows, dweight, dout, rows, weight, pos, n, K, h, dtype());
  }
  void moe_gate_add(void* out, const void* y, const void* score, std::int64_t n,
                    std::int64_t h) override {
    moe_gate_add_cpu(out, y, score, n, h, dtype());
  }
  void moe_gate_backward(void* dy, void* dscore, const void* dout, const void* y, const void* score,
                         std::int64_t n, std::int64_t h) override {
    moe_gate_backward_cpu(dy, dscore, dout, y, score, n, h, dtype());
  }
  void check_finite(const void* x, std::int64_t n) override {
    nonfinite_ = nonfinite_ || has_nonfinite_cpu(x, n, dtype());
  }
  bool take_nonfinite() override {
    const bool found = nonfinite_;
    nonfinite_ = false;
    return found;
  }
  void attention_ring_forward(float* acc, float* lse, const void* q, const void* k, const void* v,
                              std::int64_t b, std::int64_t sq, std::int64_t sk, std::int64_t a,
                              std::int64_t kv, std::int64_t d, std::int64_t window,
                              SeqPositions qpos, SeqPositions kpos, bool first) override {
    attention_ring_forward_cpu(acc, lse, q, k, v, b, sq, sk, a, kv, d, window, qpos, kpos, first,
                               dtype());
  }
  void attention_ring_backward(float* dq, float* dk, float* dv, float* delta, const void* dout,
                               const void* q, const void* k, const void* v, const void* out,
                               const float* lse, std::int64_t b, std::int64_t sq, std::int64_t sk,
                               std::int64_t a, std::int64_t kv, std::int64_t d, std::int64_t window,
                               SeqPositions qpos, SeqPositions kpos, bool first) override {
    attention_ring_backward_cpu(dq, dk, dv, delta, dout, q, k, v, out, lse, b, sq, sk, a, kv, d,
                                window, qpos, kpos, first, dtype());
  }
  void round_from_f32(void* out, const float* in, std::int64_t n) override {
    round_from_f32_cpu(out, in, n, dtype());
  }

 private:
  CachingHostAllocator alloc_;
  bool nonfinite_ = false;  // check_finite found an inf or NaN since the last take
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(DType dtype) {
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16)
    throw InputError(std::string("dtype: the cpu backend trains in fp32, fp16 or bf16, not ") +
                     dtype_name(dtype));
  return std::make_unique<CpuBackend>(dtype);
}

}  // namespace trainmem
