// The small argument types of the backend's ops (include/trainmem/backends/backend.hpp) that the
// kernels take too: the GEMM transpose flag and AdamW's hyperparameters. Split from backend.hpp so
// the kernels need not include the backend (and through it the ledger and the configuration).
#pragma once
#include <cstdint>

#include "trainmem/base/hd.hpp"

namespace trainmem {

enum class Trans { no, yes };

// bitsandbytes' 4-bit data types (kernels/quant4/quant4_math.hpp has their code tables).
enum class Quant4Type : std::uint8_t { nf4, fp4 };

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled (AdamW)
};

// bitsandbytes' AdamW8bit hyperparameters (kernels/adamw8bit/adamw8bit_math.hpp). They are
// Python floats there: kept in double until the op converts them.
struct BnbAdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // bnb's AdamW8bit default
  // bitsandbytes' gnorm_scale: the gradient is used as float(g) * gnorm_scale (one fp32
  // multiply, as its update does). trainmem's fp16 step passes 1/S to unscale its loss-scaled
  // gradients; 1 leaves the arithmetic exactly that of an unscaled update.
  float gnorm_scale = 1.0f;
};
// bitsandbytes keeps fp32 moments for a tensor under this many elements (min_8bit_size).
constexpr std::int64_t kBnbMin8BitSize = 4096;
// A paged bitsandbytes optimizer takes state1/state2 of a tensor of this many elements or more
// from CUDA managed memory (Optimizer8bit.get_state_buffer: `p.numel() < 1e5` stays on the device).
constexpr std::int64_t kBnbPagedMinSize = 100000;
// The 8-bit moments' absmax block, and the entries of a dynamic quantile map.
constexpr std::int64_t kBnbStateBlock = 256;
constexpr std::int64_t kBnbMapEntries = 256;
// trainmem's 8-bit quantizer finds a value's code through a lookup table of this many entries
// per map (kernels/quant4/quant4_math.hpp: kQuantLutSize; bitsandbytes searches the map).
constexpr std::int64_t kBnbLutEntries = 65536;

// RoPE frequency scaling (config.json `rope_scaling`): none, or Llama 3.1's `llama3` rule
// (HuggingFace's _compute_llama3_parameters), which rescales the inverse frequencies
// inv_freq[j] = theta^(-2j/d) by their wavelength 2π/inv_freq[j]: wavelengths shorter than
// original_max_positions / high_freq_factor keep their frequency, those longer than
// original_max_positions / low_freq_factor are divided by `factor`, and the band between is
// interpolated smoothly. docs/formulas.md ("RoPE scaling").
enum class RopeScalingKind : std::uint8_t { none, llama3 };
struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::none;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_positions = 8192;
};
// The sequence positions of a rank's rows under context parallelism (Megatron's load-balanced
// chunks, docs/distributed.md "Context parallelism"): the sequence of s tokens cut into 2·cp
// chunks of c = s/(2·cp) tokens; rank r holds chunk r, then chunk 2·cp-1-r, so local row t sits
// at position r·c + t (t < c) or (2·cp-1-r)·c + t - c. The default (chunk 0) is the identity:
// row t at position t, one rank holding the whole sequence.
struct SeqPositions {
  std::int64_t chunk = 0;   // c; 0: the identity
  std::int64_t first = 0;   // the first chunk's first position
  std::int64_t second = 0;  // the second chunk's first position
  TM_HD std::int64_t at(std::int64_t t) const {
    return chunk == 0 || t < chunk ? first + t : second + (t - chunk);
  }
  bool identity() const { return chunk == 0 && first == 0; }
  // Rank r of cp over a sequence of s tokens (cp 1: the identity).
  static SeqPositions of_rank(std::int64_t s, std::int64_t cp, std::int64_t r) {
    SeqPositions p;
    if (cp <= 1) return p;
    p.chunk = s / (2 * cp);
    p.first = r * p.chunk;
    p.second = (2 * cp - 1 - r) * p.chunk;
    return p;
  }
};

// What the RoPE ops need: the base theta, the scaling, and the positions of the rows (the
// identity 0..s-1 but under context parallelism).
struct RopeSpec {
  double theta = 10000.0;
  RopeScaling scaling;
  SeqPositions positions;
  RopeSpec() = default;
  RopeSpec(double theta_, RopeScaling scaling_, SeqPositions positions_ = {})
      : theta(theta_), scaling(scaling_), positions(positions_) {}
};

}  // namespace trainmem
