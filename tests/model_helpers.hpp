// Helpers for the model tests: one training run (backend + ledger + model) and gradient capture.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainmem/backends/backend.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/model.hpp"

namespace trainmem::test {

inline ModelConfig preset(const std::string& name) {
  auto m = find_preset(name);
  if (!m) throw Error("test: no preset " + name);
  return *m;
}

inline TrainConfig train_config(std::int64_t b, std::int64_t s, DType dt, Optimizer o,
                                Checkpointing c, Attention a) {
  TrainConfig t;
  t.batch = b;
  t.seq = s;
  t.dtype = dt;
  t.optimizer = o;
  t.checkpointing = c;
  t.attention = a;
  return t;
}

// Backend, ledger and model, destroyed in the right order (model, ledger, backend).
struct ModelRun {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Ledger> ledger;
  std::unique_ptr<LlamaModel> model;

  ModelRun(BackendKind kind, const ModelConfig& m, const TrainConfig& t,
           const OptimizerSettings* settings = nullptr) {
    backend = kind == BackendKind::cpu ? make_cpu_backend(t.dtype) : make_meta_backend(t.dtype);
    ledger = std::make_unique<Ledger>(backend->allocator());
    OptimizerSettings s = settings ? *settings : default_optimizer_settings(t.optimizer);
    model = std::make_unique<LlamaModel>(m, t, *backend, *ledger, s);
  }
  ~ModelRun() {
    model.reset();
    ledger.reset();
  }
};

using GradMap = std::map<std::string, std::vector<float>>;

inline GradientCapture capture_into(GradMap& out) {
  return [&out](const Parameter& p, const std::vector<float>& g) { out[p.name] = g; };
}

// max |a-b| and the index of the first element outside atol + rtol·|b|.
struct Diff {
  double max_abs = 0;
  double max_ref = 0;
  long first_bad = -1;
};
inline Diff compare(const std::vector<float>& got, const std::vector<float>& ref, double atol,
                    double rtol) {
  Diff d;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double e = std::abs(double(got[i]) - double(ref[i]));
    d.max_abs = std::max(d.max_abs, e);
    d.max_ref = std::max(d.max_ref, std::abs(double(ref[i])));
    if (d.first_bad < 0 && !(e <= atol + rtol * std::abs(double(ref[i])))) d.first_bad = long(i);
  }
  return d;
}

// Every figure of two MemoryFigures equal, the peak's category breakdown included (a measured
// ledger against an analytic profile: byte for byte). `where` names the side's peak instant.
inline void expect_same_figures(const MemoryFigures& got, const MemoryFigures& want,
                                const std::string& where = "") {
  EXPECT_EQ(got.params, want.params);
  EXPECT_EQ(got.gradients, want.gradients);
  EXPECT_EQ(got.optimizer_states, want.optimizer_states);
  EXPECT_EQ(got.activations, want.activations);
  EXPECT_EQ(got.activations_peak, want.activations_peak);
  EXPECT_EQ(got.workspace, want.workspace);
  EXPECT_EQ(got.inputs, want.inputs);
  EXPECT_EQ(got.sum, want.sum);
  EXPECT_EQ(got.peak, want.peak) << where;
  for (Category cat : all_categories())
    EXPECT_EQ(got.peak_breakdown[static_cast<int>(cat)], want.peak_breakdown[static_cast<int>(cat)])
        << category_name(cat);
}

// A checkpointing policy of the ledger grids: "none", "full", "selective", or "every:2" (full
// on layers 0, 2, 4, ... as `--checkpointing every:2` resolves it).
inline void set_checkpointing(TrainConfig& t, const ModelConfig& m, const std::string& ck) {
  if (ck == "every:2") {
    t.checkpointing = Checkpointing::full;
    t.checkpoint_layers.spec = "every:2";
    for (std::int64_t l = 0; l < m.layers; l += 2) t.checkpoint_layers.list.push_back(l);
  } else {
    t.checkpointing = *parse_checkpointing(ck);
  }
}

// Random weights (seed 1) and tokens (seed 2), then two steps: the second is the steady state
// whose figures the ledger tests compare.
inline void two_random_steps(LlamaModel& model) {
  model.init_random(1);
  model.random_tokens(2);
  model.train_step();
  model.train_step();
}

// Two ledgers hold the same tensors in the same order, with the same bytes, categories, layers
// and allocation and free events (a cpu run against its meta trace).
inline void expect_same_ledgers(const Ledger& got, const Ledger& want) {
  const auto& a = got.tensors();
  const auto& b = want.tensors();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t j = 0; j < a.size(); ++j) {
    EXPECT_EQ(a[j].name, b[j].name) << j;
    EXPECT_EQ(a[j].bytes, b[j].bytes) << a[j].name;
    EXPECT_EQ(a[j].category, b[j].category) << a[j].name;
    EXPECT_EQ(a[j].layer, b[j].layer) << a[j].name;
    EXPECT_EQ(a[j].alloc_seq, b[j].alloc_seq) << a[j].name;
    EXPECT_EQ(a[j].free_seq, b[j].free_seq) << a[j].name;
  }
}

}  // namespace trainmem::test
