// The meta backend: the model's allocations go through a MetaAllocator (unique fake
// addresses, nothing touched) and every op is a no-op, so a LLaMA-65B step is traced in well
// under a second. computes() is false: the model never reads results back (loss is NaN).
#include "trainmem/backends/backend.hpp"

namespace trainmem {
namespace {

class MetaBackend final : public Backend {
 public:
  explicit MetaBackend(DType dtype) : Backend(dtype) {}
  BackendKind kind() const override { return BackendKind::meta; }
  Allocator& allocator() override { return alloc_; }
  bool computes() const override { return false; }

  void upload(void*, const void*, std::uint64_t) override {}
  void download(void*, const void*, std::uint64_t) override {}
  void fill_zero(void*, std::uint64_t) override {}
  void copy(void*, const void*, std::uint64_t) override {}

  void embedding_forward(void*, const std::int32_t*, const void*, std::int64_t, std::int64_t,
                         std::int64_t, std::int64_t) override {}
  void embedding_backward(void*, const void*, const std::int32_t*, std::int64_t, std::int64_t,
                          std::int64_t, std::int64_t) override {}
  void rmsnorm_forward(void*, float*, const void*, const void*, std::int64_t, std::int64_t,
                       float) override {}
  void rmsnorm_backward(void*, void*, const void*, const void*, const void*, const float*,
                        std::int64_t, std::int64_t) override {}
  void matmul(void*, const void*, const void*, std::int64_t, std::int64_t, std::int64_t, Trans,
              Trans, float, float) override {}
  void bias_forward(void*, const void*, std::int64_t, std::int64_t) override {}
  void bias_backward(void*, const void*, std::int64_t, std::int64_t) override {}
  void rope_forward(void*, void*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                    std::int64_t, const RopeSpec&) override {}
  void rope_backward(void*, void*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                     std::int64_t, const RopeSpec&) override {}
  void attention_forward(void*, void*, float*, const void*, const void*, const void*, std::int64_t,
                         std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         Attention) override {}
  void attention_backward(void*, void*, void*, void*, float*, const void*, const void*, const void*,
                          const void*, const void*, const void*, const float*, std::int64_t,
                          std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                          Attention) override {}
  void swiglu_forward(void*, const void*, const void*, std::int64_t) override {}
  void swiglu_backward(void*, void*, const void*, const void*, const void*, std::int64_t) override {
  }
  void cross_entropy_forward(float*, float*, const void*, const std::int32_t*, std::int64_t,
                             std::int64_t) override {}
  void cross_entropy_backward(void*, const void*, const float*, const std::int32_t*, std::int64_t,
                              std::int64_t, float) override {}
  void adamw_update(void*, const void*, float*, float*, float*, std::int64_t, const AdamWParams&,
                    int, float) override {}
  void sgd_update(void*, const void*, float*, std::int64_t, float, float) override {}
  void bnb_adamw8bit_tables(float*, float*, std::uint8_t*, std::uint8_t*) override {}
  void bnb_adamw8bit_update(void*, const void*, std::uint8_t*, std::uint8_t*, float*, float*,
                            const float*, const float*, const std::uint8_t*, const std::uint8_t*,
                            std::int64_t, const BnbAdamWParams&, int) override {}
  void bnb_adamw32_update(void*, const void*, float*, float*, std::int64_t, const BnbAdamWParams&,
                          int) override {}
  void quant4_tables(float*, float*, std::uint8_t*, Quant4Type) override {}
  void quantize_4bit(std::uint8_t*, float*, const void*, std::int64_t, std::int64_t,
                     Quant4Type) override {}
  void dequantize_4bit(void*, const std::uint8_t*, const float*, std::int64_t, std::int64_t,
                       Quant4Type, bool) override {}
  void quantize_blockwise8(std::uint8_t*, float*, const float*, float, std::int64_t, std::int64_t,
                           const std::uint8_t*) override {}
  void dequantize_blockwise8(float*, const std::uint8_t*, const float*, const float*, std::int64_t,
                             std::int64_t, float) override {}
  void quantize_int8(std::int8_t*, float*, const void*, std::int64_t, std::int64_t) override {}
  void dequantize_int8(void*, const std::int8_t*, const float*, std::int64_t,
                       std::int64_t) override {}
  float double_quant_offset(const float*, std::int64_t) override { return 0.0f; }
  void dropout_mask(std::uint8_t*, std::int64_t, float, std::uint64_t, std::uint64_t) override {}
  void moe_route(float*, std::int32_t*, float*, std::int32_t*, std::int32_t*, const void*,
                 std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool) override {}
  void moe_route_backward(void*, const float*, const float*, const std::int32_t*, const float*,
                          std::int64_t, std::int64_t, std::int64_t, bool) override {}
  void moe_permute(void*, const void*, const std::int32_t*, std::int64_t, std::int64_t,
                   std::int64_t) override {}
  void moe_combine(void*, const void*, const void*, const float*, const std::int32_t*, std::int64_t,
                   std::int64_t, std::int64_t) override {}
  void moe_combine_backward(void*, float*, const void*, const void*, const float*,
                            const std::int32_t*, std::int64_t, std::int64_t,
                            std::int64_t) override {}
  void moe_gate_add(void*, const void*, const void*, std::int64_t, std::int64_t) override {}
  void moe_gate_backward(void*, void*, const void*, const void*, const void*, std::int64_t,
                         std::int64_t) override {}
  void dropout_apply(void*, const void*, const std::uint8_t*, std::int64_t, float, bool) override {}
  void check_finite(const void*, std::int64_t) override {}
  bool take_nonfinite() override { return false; }
  void attention_ring_forward(float*, float*, const void*, const void*, const void*, std::int64_t,
                              std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                              std::int64_t, SeqPositions, SeqPositions, bool) override {}
  void attention_ring_backward(float*, float*, float*, float*, const void*, const void*,
                               const void*, const void*, const void*, const float*, std::int64_t,
                               std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                               std::int64_t, SeqPositions, SeqPositions, bool) override {}
  void round_from_f32(void*, const float*, std::int64_t) override {}

 private:
  MetaAllocator alloc_;
};

}  // namespace

std::unique_ptr<Backend> make_meta_backend(DType dtype) {
  return std::make_unique<MetaBackend>(dtype);
}

}  // namespace trainmem
