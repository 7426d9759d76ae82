// How the eager attention's strided-batched GEMMs cover the heads (plain C++ so that the CPU
// tests in tests/test_cuda_plans.cpp replay the plan against the CPU reference).
//
// One (s, d) head of a (b, s, heads, d) tensor is a row-major matrix with leading dimension
// heads*d; a head's (s, s) probabilities in (b, a, s, s) have leading dimension s. One cuBLAS
// call covers `batch` heads whose offsets differ by constant strides. With GQA (g = a/kv query
// heads per kv head, query head `head` reads kv head head/g) two batchings keep every stride
// constant:
//   per (bi, r): b*g calls, each over the kv heads head = kh*g + r (kh < kv) of batch row bi:
//     q stride g*d, kv stride d, probs stride g*s*s;
//   per head:    a calls, each over the b batch rows of that head:
//     q stride s*a*d, kv stride s*kv*d, probs stride a*s*s.
// The plan with fewer calls is chosen. dk and dv sum over the g query heads of a kv head: the
// first call that touches a kv head writes (beta 0), later ones add (beta 1); within one call
// no two heads write the same kv head.
#pragma once
#include <cstdint>
#include <vector>

namespace trainmem {

struct HeadCall {
  std::int64_t q_off;   // elements into q / out / dout / dq (b, s, a, d)
  std::int64_t kv_off;  // elements into k / v / dk / dv (b, s, kv, d)
  std::int64_t s_off;   // elements into probs / dprobs (b, a, s, s)
  bool first_of_group;  // the first call that writes this call's kv heads' dk / dv
};

struct HeadPlan {
  std::int64_t q_stride = 0, kv_stride = 0, s_stride = 0, batch = 0;
  std::vector<HeadCall> calls;
};

inline HeadPlan plan_attention_heads(std::int64_t b, std::int64_t s, std::int64_t a,
                                     std::int64_t kv, std::int64_t d) {
  const std::int64_t g = a / kv;
  const std::int64_t ss = s * s;
  HeadPlan plan;
  if (b * g <= a) {
    plan.q_stride = g * d;
    plan.kv_stride = d;
    plan.s_stride = g * ss;
    plan.batch = kv;
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t r = 0; r < g; ++r)
        plan.calls.push_back({bi * s * a * d + r * d, bi * s * kv * d, (bi * a + r) * ss, r == 0});
  } else {
    plan.q_stride = s * a * d;
    plan.kv_stride = s * kv * d;
    plan.s_stride = a * ss;
    plan.batch = b;
    for (std::int64_t head = 0; head < a; ++head)
      plan.calls.push_back({head * d, (head / g) * d, head * ss, head % g == 0});
  }
  return plan;
}

}  // namespace trainmem
