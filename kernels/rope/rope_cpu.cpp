// RoPE (HuggingFace rotate-half), CPU reference (math in rope_math.hpp). The cos/sin table
// (s, d/2), row t at position rope.positions.at(t), is computed once per call in fp32 from the fp32
// angle (inv_freq rescaled under the RopeSpec's scaling), as HuggingFace does; backward rotates by
// the negated angle (the transpose of the orthogonal rotation). The last table is kept (key: s, d
// and every frequency parameter) and reused by the next call with the same key: a step's 2 x layers
// calls computed the same table each time (cos/sin were 3% of the small-256 cpu step). Same values,
// computed the same way, only once.
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "rope/rope.hpp"
#include "rope/rope_math.hpp"
#include "trainmem/base/error.hpp"

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

struct RopeTable {
  std::int64_t s = -1, d = -1;
  SeqPositions pos;  // row t's position
  RopeFreqParams freq;
  std::vector<float> cos_t, sin_t;  // (s, d/2)
};
auto table_key(const RopeTable& t) {
  const RopeFreqParams& f = t.freq;
  return std::make_tuple(t.s, t.d, t.pos.chunk, t.pos.first, t.pos.second, f.theta, f.llama3,
                         f.factor, f.low_freq_factor, f.old_context_len, f.low_freq_wavelen,
                         f.high_freq_wavelen, f.band, f.two_pi);
}

// The table for (s, d, freq, positions): the cached one when the key matches, else computed and
// cached. The returned table is immutable (a later call with another key replaces the cache's
// pointer, not the table), so it is safe to read while another thread replaces it.
std::shared_ptr<const RopeTable> rope_table(std::int64_t s, std::int64_t d,
                                            const RopeFreqParams& freq, const SeqPositions& pos) {
  static std::mutex mu;
  static std::shared_ptr<const RopeTable> last;
  auto t = std::make_shared<RopeTable>();
  t->s = s;
  t->d = d;
  t->freq = freq;
  t->pos = pos;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (last && table_key(*last) == table_key(*t)) return last;
  }
  const std::int64_t half = d / 2;
  t->cos_t.resize(std::size_t(s * half));
  t->sin_t.resize(std::size_t(s * half));
  for (std::int64_t p = 0; p < s; ++p) {
    for (std::int64_t j = 0; j < half; ++j) {
      const float angle = rope_scaled_angle(pos.at(p), j, d, freq);
      t->cos_t[p * half + j] = tm_cos(angle);
      t->sin_t[p * half + j] = tm_sin(angle);
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  last = t;
  return t;
}

void rope_apply(void* q, void* k, std::int64_t b, std::int64_t s, std::int64_t a, std::int64_t kv,
                std::int64_t d, const RopeSpec& rope, DType dt, Direction dir) {
  if (d % 2 != 0) throw InputError("rope: head dim must be even, got " + std::to_string(d));
  const std::shared_ptr<const RopeTable> table =
      rope_table(s, d, rope_freq_params(rope), rope.positions);
  const std::vector<float>& cos_t = table->cos_t;
  const std::vector<float>& sin_t = table->sin_t;
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
