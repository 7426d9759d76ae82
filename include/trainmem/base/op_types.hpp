// The small argument types of the backend's ops (include/trainmem/backends/backend.hpp) that the
// kernels take too: the GEMM transpose flag and AdamW's hyperparameters. Split from backend.hpp so
// the kernels need not include the backend (and through it the ledger and the configuration).
#pragma once
#include <cstdint>

namespace trainmem {

enum class Trans { no, yes };

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled (AdamW)
};

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
// What the RoPE ops need: the base theta and the scaling.
struct RopeSpec {
  double theta = 10000.0;
  RopeScaling scaling;
};

}  // namespace trainmem
