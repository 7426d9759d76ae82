// How the eager attention's strided-batched GEMMs cover the heads (plain C++ so that the CPU
// tests in tests/test_cuda_plans.cpp replay the plan against the CPU reference).
//
// A (T,HD) head of a (B,T,H,HD) tensor is a row-major matrix with leading dimension H*HD; a
// head's (T,T) probabilities in (B,NH,T,T) have leading dimension T. One cuBLAS call covers
// `batch` heads whose offsets differ by constant strides. With GQA (g = NH/NKV query heads per
// kv head, query head h reads kv head h/g) two batchings keep every stride constant:
//   per (b, r): B*g calls, each over the NKV heads h = kh*g + r (kh < NKV) of batch row b:
//     q stride g*HD, kv stride HD, probs stride g*T*T;
//   per h:      NH calls, each over the B batch rows of head h:
//     q stride T*NH*HD, kv stride T*NKV*HD, probs stride NH*T*T.
// The plan with fewer calls is chosen. dk and dv sum over the g query heads of a kv head: the
// first call that touches a kv head writes (beta 0), later ones add (beta 1); within one call
// no two heads write the same kv head.
#pragma once
#include <cstdint>
#include <vector>

namespace trainmem {

struct HeadCall {
  std::int64_t q_off;   // elements into q / out / dout / dq (B,T,NH,HD)
  std::int64_t kv_off;  // elements into k / v / dk / dv (B,T,NKV,HD)
  std::int64_t s_off;   // elements into probs / dprobs (B,NH,T,T)
  bool first_of_group;  // the first call that writes this call's kv heads' dk / dv
};

struct HeadPlan {
  std::int64_t q_stride = 0, kv_stride = 0, s_stride = 0, batch = 0;
  std::vector<HeadCall> calls;
};

inline HeadPlan plan_attention_heads(std::int64_t B, std::int64_t T, std::int64_t NH,
                                     std::int64_t NKV, std::int64_t HD) {
  const std::int64_t g = NH / NKV;
  const std::int64_t TT = T * T;
  HeadPlan plan;
  if (B * g <= NH) {
    plan.q_stride = g * HD;
    plan.kv_stride = HD;
    plan.s_stride = g * TT;
    plan.batch = NKV;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t r = 0; r < g; ++r)
        plan.calls.push_back(
            {b * T * NH * HD + r * HD, b * T * NKV * HD, (b * NH + r) * TT, r == 0});
  } else {
    plan.q_stride = T * NH * HD;
    plan.kv_stride = T * NKV * HD;
    plan.s_stride = NH * TT;
    plan.batch = B;
    for (std::int64_t h = 0; h < NH; ++h)
      plan.calls.push_back({h * HD, (h / g) * HD, h * TT, h % g == 0});
  }
  return plan;
}

}  // namespace trainmem
