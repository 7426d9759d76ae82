// Helpers for the measured sharded step's tests (test_sharded_exec.cpp, and
// mpi_test_sharded.cpp under mpirun): one rank's run (cpu backend, ledger, ShardedStep) and the
// single-rank LlamaModel run of the same global batch it must reproduce.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainmem/backends/backend.hpp"
#include "trainmem/base/parallel.hpp"
#include "trainmem/base/safetensors.hpp"
#include "trainmem/comm/collective.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/model.hpp"
#include "trainmem/model/model_io.hpp"
#include "trainmem/model/sharded_step.hpp"

namespace trainmem::test {

using Weights = std::map<std::string, std::vector<float>>;

struct StepsResult {
  std::vector<float> losses;
  Weights weights;  // after the last step
  // A sharded run under tensor parallelism: where each element of `weights` sits in the whole
  // parameter (parameter_elements); empty otherwise.
  std::map<std::string, std::vector<std::uint64_t>> elements;
};

// The rank's weights, taken from the whole weights `full` (a single-rank run's): the rank's
// parameters (a pipeline stage holds some), its elements of each (tensor parallelism); a
// later stage's lm_head of a tied model is the embedding's copy.
inline Weights slice_of(const Weights& full, const StepsResult& rank) {
  Weights out;
  for (const auto& [name, mine] : rank.weights) {
    const std::string src = full.count(name) ? name : "model.embed_tokens.weight";
    const auto& whole = full.at(src);
    auto& v = out[name];
    if (rank.elements.empty()) {
      v = whole;
      continue;
    }
    for (std::uint64_t e : rank.elements.at(name)) v.push_back(whole.at(e));
  }
  return out;
}

// One rank of a measured layout (pp = tp = 1): `steps` steps from weights and tokens of `seed`.
struct ShardedRun {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Ledger> ledger;
  std::unique_ptr<ShardedExecution> exec;
  std::unique_ptr<ShardedStep> step;

  // `tp`: the tensor-parallel group (tp > 1) on the backend's buffers, `tp_host` the same ranks
  // on host buffers (nullptr: `tp`, the cpu backend's). `pp`: the pipeline group (pp > 1) on
  // host buffers, its rank the stage.
  ShardedRun(const ModelConfig& m, const TrainConfig& t, const ParallelConfig& p, Collective& data,
             Collective& host, std::uint64_t seed, BackendKind kind = BackendKind::cpu,
             Collective* tp = nullptr, Collective* pp = nullptr, Collective* tp_host = nullptr,
             const std::vector<const SafeTensorsReader*>& weights = {},
             const std::vector<std::int32_t>* tokens = nullptr, Collective* ep = nullptr,
             Collective* edp = nullptr, Collective* etp = nullptr) {
    backend = kind == BackendKind::cuda ? make_cuda_backend(t.dtype) : make_cpu_backend(t.dtype);
    ledger = std::make_unique<Ledger>(backend->allocator());
    exec = std::make_unique<ShardedExecution>(
        ShardedExecution{*backend, data, host, seed, default_optimizer_settings(t.optimizer)});
    exec->tp = tp;
    exec->tp_host = tp_host ? tp_host : tp;
    exec->pp = pp;
    exec->weights = weights;
    exec->tokens = tokens;
    exec->ep = ep;  // expert parallelism (cpu: the host group is the same)
    exec->ep_host = ep;
    exec->edp = edp;
    exec->etp = etp;  // expert tensor parallelism (cpu: the host group is the same)
    exec->etp_host = etp;
    step = std::make_unique<ShardedStep>(m, t, p, pp ? pp->rank() : 0, *ledger, exec.get());
  }
  ~ShardedRun() {
    step.reset();
    ledger.reset();
  }
  StepsResult run(int steps) {
    StepsResult r;
    for (int n = 0; n < steps; ++n) r.losses.push_back(step->train_step());
    for (const auto& name : step->parameter_names()) {
      if (step->is_quantized(name)) continue;  // frozen 4-bit/int8: compared through the losses
      r.weights[name] = step->parameter_values(name);
      if (exec->tp || exec->ep || exec->etp) r.elements[name] = step->parameter_elements(name);
    }
    return r;
  }
};

// The single-rank LlamaModel with batch `rows`, its weights and tokens set by `prepare`, run for
// `steps`: the losses and every (not quantized) parameter's values.
template <class Prepare>
StepsResult reference_run(const ModelConfig& m, TrainConfig t, std::int64_t rows, int steps,
                          Prepare&& prepare) {
  t.batch = rows;
  auto backend = make_cpu_backend(t.dtype);
  Ledger ledger(backend->allocator());
  StepsResult r;
  {
    LlamaModel model(m, t, *backend, ledger, default_optimizer_settings(t.optimizer));
    prepare(model);
    for (int n = 0; n < steps; ++n) r.losses.push_back(model.train_step());
    for (const auto& p : model.parameters())
      if (p.quant < 0) r.weights[p.name] = model.parameter_values(p.name);
  }
  return r;
}

// The single-rank run on the token ids given (rows·s of them), weights from init_random(seed).
inline StepsResult reference_steps_on(const ModelConfig& m, const TrainConfig& t, std::int64_t rows,
                                      std::uint64_t seed, int steps,
                                      const std::vector<std::int32_t>& ids) {
  return reference_run(m, t, rows, steps, [&](LlamaModel& model) {
    model.init_random(seed);
    model.set_tokens(ids);
  });
}

// The single-rank step of the same global batch: LlamaModel with batch `rows`, from weights and
// tokens of `seed`, or from the files `weights` (safetensors) and `tokens` (raw int32) when given.
inline StepsResult reference_steps(const ModelConfig& m, const TrainConfig& t, std::int64_t rows,
                                   std::uint64_t seed, int steps, const std::string& weights = "",
                                   const std::string& tokens = "") {
  return reference_run(m, t, rows, steps, [&](LlamaModel& model) {
    if (weights.empty())
      model.init_random(seed);
    else
      model.load_weights(weights);
    if (tokens.empty())
      model.random_tokens(seed);
    else
      model.set_tokens(load_tokens_file(tokens, rows, t.seq, m.vocab));
  });
}

// A whole model's weights in a safetensors file (fp32, HF names and shapes): LlamaModel's
// init_random(seed) values, the k-th tensor scaled by 1 + k/8 and, when 1-D (norms, biases),
// shifted by 0.01·(k + 1): a parameter read from the wrong tensor or place shows.
inline void write_weights_file(const std::string& path, const ModelConfig& m, std::uint64_t seed) {
  TrainConfig t;
  t.batch = 1;
  t.seq = 4;
  t.dtype = DType::f32;
  auto backend = make_cpu_backend(DType::f32);
  Ledger ledger(backend->allocator());
  LlamaModel model(m, t, *backend, ledger, default_optimizer_settings(t.optimizer));
  model.init_random(seed);
  SafeTensorsWriter w;
  for (const auto& p : model.parameters()) w.declare(p.name, SafeDType::F32, p.shape);
  w.open(path);
  float k = 0;
  for (const auto& p : model.parameters()) {
    std::vector<float> v = model.parameter_values(p.name);
    for (float& x : v) x = x * (1 + k / 8) + (p.shape.size() == 1 ? 0.01f * (k + 1) : 0.f);
    w.put(p.name, v.data());
    k += 1;
  }
  w.close();
}

// `n` token ids of `seed` in a raw int32 file (--tokens).
inline void write_tokens_file(const std::string& path, std::int64_t n, std::int64_t vocab,
                              std::uint64_t seed) {
  const std::vector<std::int32_t> ids = random_token_ids(seed, n, vocab);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 4));
}

// The stated tolerance of weights whose gradients were summed in another order (docs/
// distributed.md, "Measured runs"): 5% of the most an AdamW step can move a weight (lr, the
// normalised update being at most about 1) over `steps` steps. Adam amplifies the rounding of
// gradients near zero up to a full step, so no bound relative to the gradient holds; a wrong
// gradient moves weights by about lr per step, 20 times the bound (and the tests were seen to
// fail when one reduction is skipped).
inline double adam_tolerance(const OptimizerSettings& s, int steps) {
  return 0.05 * double(s.adamw.lr) * steps;
}

// The largest |a - b| over every weight.
inline double worst_absolute_difference(const Weights& a, const Weights& b, std::string* where) {
  double worst = 0;
  if (a.size() != b.size()) {
    if (where) *where = "(different parameter sets)";
    return 1e30;
  }
  for (const auto& [name, want] : b) {
    const auto& got = a.at(name);
    for (std::size_t e = 0; e < want.size(); ++e) {
      const double d = std::abs(double(got[e]) - double(want[e]));
      if (d > worst) {
        worst = d;
        if (where) *where = name + "[" + std::to_string(e) + "]";
      }
    }
  }
  return worst;
}

// Whether every weight has the same bits (NaNs compare by bits too); names the first that differs.
inline bool bit_identical(const Weights& a, const Weights& b, std::string* where) {
  for (const auto& [name, want] : b) {
    const auto& got = a.at(name);
    if (got.size() != want.size() ||
        std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) != 0) {
      if (where) *where = name;
      return false;
    }
  }
  return true;
}

}  // namespace trainmem::test
