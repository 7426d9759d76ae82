// RoPE (HuggingFace rotate-half), CPU reference (math in rope_math.hpp). The cos/sin table
// (T, HD/2) is computed once per call in fp32 from the fp32 angle, as HuggingFace does;
// backward rotates by the negated angle (the transpose of the orthogonal rotation).
#include <string>
#include <vector>

#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "rope/rope.hpp"
#include "rope/rope_math.hpp"
#include "trainmem/error.hpp"

namespace trainmem {
namespace {

enum class Direction { forward, backward };

template <class S>
void rope_heads(void* x, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t HD,
                const std::vector<float>& cos_t, const std::vector<float>& sin_t, Direction dir) {
  const std::int64_t half = HD / 2;
  const float sign = dir == Direction::forward ? 1.0f : -1.0f;
#pragma omp parallel for if (B * T * H * HD >= kParallelMinElements)
  for (std::int64_t bt = 0; bt < B * T; ++bt) {
    const std::int64_t t = bt % T;
    const float* c = cos_t.data() + t * half;
    const float* s = sin_t.data() + t * half;
    for (std::int64_t h = 0; h < H; ++h) {
      const std::size_t base = std::size_t((bt * H + h) * HD);
      for (std::int64_t j = 0; j < half; ++j) {
        float x1 = S::load(x, base + j), x2 = S::load(x, base + j + half);
        rope_rotate_pair(&x1, &x2, c[j], sign * s[j]);
        S::store(x, base + j, x1);
        S::store(x, base + j + half, x2);
      }
    }
  }
}

void rope_apply(void* q, void* k, std::int64_t B, std::int64_t T, std::int64_t NH, std::int64_t NKV,
                std::int64_t HD, double theta, DType dt, Direction dir) {
  if (HD % 2 != 0) throw InputError("rope: head dim must be even, got " + std::to_string(HD));
  const std::int64_t half = HD / 2;
  std::vector<float> cos_t(std::size_t(T * half)), sin_t(std::size_t(T * half));  // (T, HD/2)
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t j = 0; j < half; ++j) {
      const float a = rope_angle<float>(t, j, HD, float(theta));
      cos_t[t * half + j] = tm_cos(a);
      sin_t[t * half + j] = tm_sin(a);
    }
  }
  dispatch_storage(dt, "rope", [&](auto s) {
    using S = decltype(s);
    if (q) rope_heads<S>(q, B, T, NH, HD, cos_t, sin_t, dir);
    if (k) rope_heads<S>(k, B, T, NKV, HD, cos_t, sin_t, dir);
  });
}

}  // namespace

void rope_forward_cpu(void* q, void* k, std::int64_t B, std::int64_t T, std::int64_t NH,
                      std::int64_t NKV, std::int64_t HD, double theta, DType dt) {
  cpu_threads_setup();
  rope_apply(q, k, B, T, NH, NKV, HD, theta, dt, Direction::forward);
}

void rope_backward_cpu(void* dq, void* dk, std::int64_t B, std::int64_t T, std::int64_t NH,
                       std::int64_t NKV, std::int64_t HD, double theta, DType dt) {
  cpu_threads_setup();
  rope_apply(dq, dk, B, T, NH, NKV, HD, theta, dt, Direction::backward);
}

}  // namespace trainmem
