// RoPE (HuggingFace rotate-half), CPU reference (math in rope_math.hpp). The cos/sin table
// (s, d/2) is computed once per call in fp32 from the fp32 angle (inv_freq rescaled under the
// RopeSpec's scaling), as HuggingFace does;
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
void rope_heads(void* x, std::int64_t b, std::int64_t s, std::int64_t heads, std::int64_t d,
                const std::vector<float>& cos_t, const std::vector<float>& sin_t, Direction dir) {
  const std::int64_t half = d / 2;
  const float sign = dir == Direction::forward ? 1.0f : -1.0f;
#pragma omp parallel for if (b * s * heads * d >= kParallelMinElements)
  for (std::int64_t row = 0; row < b * s; ++row) {
    const std::int64_t t = row % s;
    const float* c = cos_t.data() + t * half;
    const float* sn = sin_t.data() + t * half;
    for (std::int64_t head = 0; head < heads; ++head) {
      const std::size_t base = std::size_t((row * heads + head) * d);
      for (std::int64_t j = 0; j < half; ++j) {
        float x1 = S::load(x, base + j), x2 = S::load(x, base + j + half);
        rope_rotate_pair(&x1, &x2, c[j], sign * sn[j]);
        S::store(x, base + j, x1);
        S::store(x, base + j + half, x2);
      }
    }
  }
}

void rope_apply(void* q, void* k, std::int64_t b, std::int64_t s, std::int64_t a, std::int64_t kv,
                std::int64_t d, const RopeSpec& rope, DType dt, Direction dir) {
  if (d % 2 != 0) throw InputError("rope: head dim must be even, got " + std::to_string(d));
  const std::int64_t half = d / 2;
  const RopeFreqParams freq = rope_freq_params(rope);
  std::vector<float> cos_t(std::size_t(s * half)), sin_t(std::size_t(s * half));  // (s, d/2)
  for (std::int64_t t = 0; t < s; ++t) {
    for (std::int64_t j = 0; j < half; ++j) {
      const float angle = rope_scaled_angle(t, j, d, freq);
      cos_t[t * half + j] = tm_cos(angle);
      sin_t[t * half + j] = tm_sin(angle);
    }
  }
  dispatch_storage(dt, "rope", [&](auto tag) {
    using S = decltype(tag);
    if (q) rope_heads<S>(q, b, s, a, d, cos_t, sin_t, dir);
    if (k) rope_heads<S>(k, b, s, kv, d, cos_t, sin_t, dir);
  });
}

}  // namespace

void rope_forward_cpu(void* q, void* k, std::int64_t b, std::int64_t s, std::int64_t a,
                      std::int64_t kv, std::int64_t d, const RopeSpec& rope, DType dt) {
  cpu_threads_setup();
  rope_apply(q, k, b, s, a, kv, d, rope, dt, Direction::forward);
}

void rope_backward_cpu(void* dq, void* dk, std::int64_t b, std::int64_t s, std::int64_t a,
                       std::int64_t kv, std::int64_t d, const RopeSpec& rope, DType dt) {
  cpu_threads_setup();
  rope_apply(dq, dk, b, s, a, kv, d, rope, dt, Direction::backward);
}

}  // namespace trainmem
