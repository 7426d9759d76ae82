// The small argument types of the backend's ops (include/trainmem/backend.hpp) that the kernels
// take too: the GEMM transpose flag and AdamW's hyperparameters. Split from backend.hpp so the
// kernels need not include the backend (and through it the ledger and the configuration).
#pragma once

namespace trainmem {

enum class Trans { no, yes };

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled (AdamW)
};

}  // namespace trainmem
