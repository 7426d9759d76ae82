// GPU tests of the whole training step on the cuda backend (include/trainmem/model/model.hpp):
//  - loss and every parameter gradient against the cpu backend on tiny configs (GQA, tied
//    embeddings, awkward sizes), eager and flash, fp32 and 16-bit, and the weights after two
//    AdamW steps;
//  - checkpointing on and off give the same loss and gradients on the GPU (the kernels and
//    cuBLAS calls are deterministic, and recomputation reruns them on the same inputs);
//  - the cuda backend's ledger equals the meta backend's for the same configuration: the same
//    tensors (name, category, layer, shape, dtype, bytes, phase, order) and the same figures.
// Gradients are compared by relative L2 error per parameter (a network-level check: 16-bit
// rounding cascades through the layers differently on the two backends) and the worst element
// is printed; the tolerances per dtype are stated at the top.
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "gpu_test_util.hpp"
#include "trainmem/base/figures.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/model.hpp"

namespace trainmem::gputest {
namespace {

// Relative L2 error allowed between the cuda and cpu backends' gradients and losses.
double model_tolerance(DType dt) {
  switch (dt) {
    case DType::bf16:
      return 3e-2;
    case DType::f16:
      return 5e-3;
    default:
      return 2e-4;
  }
}

using GradMap = std::map<std::string, std::vector<float>>;

// Backend, ledger and model, destroyed model first, then ledger, then (for cpu/meta) backend.
// The cuda backend is the shared one of gpu_test_util.hpp.
struct ModelRun {
  std::unique_ptr<Backend> owned;
  Backend* backend = nullptr;
  std::unique_ptr<Ledger> ledger;
  std::unique_ptr<LlamaModel> model;
  ModelRun(BackendKind kind, const ModelConfig& m, const TrainConfig& t) {
    if (kind == BackendKind::cuda) {
      backend = &cuda_backend(t.dtype);
    } else {
      owned = kind == BackendKind::cpu ? make_cpu_backend(t.dtype) : make_meta_backend(t.dtype);
      backend = owned.get();
    }
    ledger = std::make_unique<Ledger>(backend->allocator());
    model = std::make_unique<LlamaModel>(m, t, *backend, *ledger,
                                         default_optimizer_settings(t.optimizer));
  }
  ~ModelRun() {
    model.reset();
    if (backend) {
      backend->synchronize();
      // The shared cuda backend outlives the model: give cuBLAS its own workspace back before
      // the ledger's `cublas_workspace` is released (a later test may get that memory).
      backend->set_gemm_workspace(nullptr, 0);
    }
    ledger.reset();
  }
};

ModelConfig preset(const std::string& name) {
  auto m = find_preset(name);
  if (!m) throw Error("test: no preset " + name);
  return *m;
}

TrainConfig train(std::int64_t b, std::int64_t s, DType dt, Optimizer o, Checkpointing c,
                  Attention a) {
  TrainConfig t;
  t.batch = b;
  t.seq = s;
  t.dtype = dt;
  t.optimizer = o;
  t.checkpointing = c;
  t.attention = a;
  return t;
}

::testing::AssertionResult rel_l2_close(const std::string& what, const std::vector<float>& got,
                                        const std::vector<float>& want, double tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " vs " << want.size();
  double num = 0, den = 0, max_abs = 0;
  std::size_t at = 0;
  bool finite = true;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) finite = false;
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
    if (std::fabs(d) > max_abs) max_abs = std::fabs(d), at = i;
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  std::printf(
      "[ model    ] %s: rel L2 error %.3g (tol %.3g), max abs %.3g at [%zu] (got %.6g, "
      "want %.6g)\n",
      what.c_str(), rel, tol, max_abs, at, got.empty() ? 0.0 : got[at],
      want.empty() ? 0.0 : want[at]);
  if (finite && rel <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": relative L2 error " << rel << " > " << tol << (finite ? "" : " (non-finite)")
         << "; worst element [" << at << "] got " << got[at] << " want " << want[at];
}

// ---------------------------------------------------------------- against the cpu backend

struct ModelCase {
  const char* preset;
  DType dtype;
  Attention attention;
  Optimizer optimizer;
  std::int64_t lora_rank = 0;    // > 0: LoRA on all seven projections, the base frozen
  Quant quant = Quant::none;     // with LoRA: the base 4-bit (QLoRA, double quantization)
  double dropout = 0.0;          // with LoRA: its dropout (the masks drawn on each backend)
  double capacity_factor = 0.0;  // a mixture of experts: --capacity-factor (choices dropped)
};
void PrintTo(const ModelCase& c, std::ostream* os) {
  *os << c.preset << " " << dtype_param_name(c.dtype) << " "
      << (c.attention == Attention::eager ? "eager" : "flash");
}

class ModelGpu : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override { require_cuda_device(); }
};

TEST_P(ModelGpu, LossGradientsAndUpdatedWeightsMatchTheCpuBackend) {
  const ModelCase c = GetParam();
  const ModelConfig m = preset(c.preset);
  TrainConfig t = train(2, 13, c.dtype, c.optimizer, Checkpointing::none, c.attention);
  t.lora_rank = c.lora_rank;
  t.lora_targets = c.lora_rank > 0 ? 0x7fu : 0u;
  t.quant = c.quant;
  t.lora_dropout = c.dropout;
  t.capacity_factor = c.capacity_factor;
  ModelRun cpu(BackendKind::cpu, m, t), gpu(BackendKind::cuda, m, t);
  for (ModelRun* r : {&cpu, &gpu}) {
    r->model->init_random(7);
    r->model->random_tokens(3);
  }
  const double tol = model_tolerance(c.dtype);
  for (int step = 1; step <= 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    GradMap g_cpu, g_gpu;
    const float l_cpu = cpu.model->train_step(
        [&](const Parameter& p, const std::vector<float>& g) { g_cpu[p.name] = g; });
    const float l_gpu = gpu.model->train_step(
        [&](const Parameter& p, const std::vector<float>& g) { g_gpu[p.name] = g; });
    ASSERT_TRUE(std::isfinite(l_gpu)) << "loss " << l_gpu;
    EXPECT_NEAR(l_gpu, l_cpu, tol * std::fabs(l_cpu)) << "loss";
    ASSERT_EQ(g_gpu.size(), g_cpu.size());
    for (const auto& [name, want] : g_cpu) {
      ASSERT_TRUE(g_gpu.count(name)) << "no gpu gradient for " << name;
      EXPECT_TRUE(
          rel_l2_close("step " + std::to_string(step) + " grad " + name, g_gpu[name], want, tol));
    }
  }
  for (const auto& p : cpu.model->parameters()) {
    if (p.quant >= 0) {  // QLoRA: the device quantized the same weights into the same bits
      const Quant4View* vc = cpu.model->quant4_weight(p.name);
      const Quant4View* vg = gpu.model->quant4_weight(p.name);
      std::vector<std::uint8_t> packed(std::size_t((p.numel() + 1) / 2));
      gpu.backend->download(packed.data(), vg->packed, packed.size());
      EXPECT_EQ(0, std::memcmp(packed.data(), vc->packed, packed.size())) << p.name;
      EXPECT_EQ(vg->offset, vc->offset) << p.name;
      continue;
    }
    EXPECT_TRUE(rel_l2_close("weights after 2 steps " + p.name, gpu.model->parameter_values(p.name),
                             cpu.model->parameter_values(p.name), tol));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Model, ModelGpu,
    ::testing::Values(
        ModelCase{"tiny", DType::f32, Attention::eager, Optimizer::adamw},
        ModelCase{"tiny-gqa", DType::f32, Attention::flash, Optimizer::adamw},
        ModelCase{"tiny-tied", DType::f32, Attention::eager, Optimizer::sgd},
        ModelCase{"tiny-awkward", DType::f32, Attention::flash, Optimizer::lomo},
        ModelCase{"tiny-gqa", DType::bf16, Attention::eager, Optimizer::adamw},
        ModelCase{"tiny-gqa", DType::bf16, Attention::flash, Optimizer::adamw},
        ModelCase{"tiny-awkward", DType::f16, Attention::eager, Optimizer::sgd},
        ModelCase{"tiny-tied", DType::f16, Attention::flash, Optimizer::lomo},
        // bitsandbytes' 8-bit update (tiny-gqa's embedding and MLP weights are
        // 8-bit, its norms fp32-state) through the cuda backend.
        ModelCase{"tiny-gqa", DType::f32, Attention::flash, Optimizer::adamw8bit},
        ModelCase{"tiny-gqa", DType::bf16, Attention::eager, Optimizer::adamw8bit},
        // LoRA (r 4, all seven; B starts at zero, so step 2 checks the adapters'
        // full gradients): the frozen norms' backward, the skipped head and
        // embedding gradients, the fp16 loss scale through the adapters.
        ModelCase{"tiny-gqa", DType::bf16, Attention::flash, Optimizer::adamw, 4},
        ModelCase{"tiny-awkward", DType::f32, Attention::eager, Optimizer::adamw8bit, 4},
        ModelCase{"tiny-gqa", DType::f16, Attention::eager, Optimizer::sgd, 4},
        // QLoRA: the 4-bit base quantized on the device at init and dequantized
        // around every GEMM (the quantization kernels' bits are the CPU's).
        ModelCase{"tiny-gqa", DType::bf16, Attention::flash, Optimizer::adamw, 4, Quant::nf4},
        ModelCase{"tiny-awkward", DType::f32, Attention::eager, Optimizer::sgd, 4, Quant::fp4},
        // LoRA dropout: the device draws the CPU's masks (the same generator) and drops the
        // adapters' inputs in forward and again in backward.
        ModelCase{"tiny-gqa", DType::bf16, Attention::flash, Optimizer::adamw, 4, Quant::nf4, 0.1},
        ModelCase{"tiny-awkward", DType::f32, Attention::eager, Optimizer::sgd, 4, Quant::none,
                  0.3},
        // Mixture of experts: the routing kernels, the expert-ordered rows and one GEMM per
        // expert on cuBLAS. fp32, so that the router's logits agree to ~1e-7 and no expert
        // choice differs between the backends.
        ModelCase{"tiny-mixtral", DType::f32, Attention::eager, Optimizer::adamw},
        ModelCase{"tiny-qwen3-moe", DType::f32, Attention::flash, Optimizer::sgd},
        // --capacity-factor 0.6: the device drops the CPU's choices (pos −1) and its GEMMs run
        // over the kept rows only.
        ModelCase{"tiny-mixtral", DType::f32, Attention::flash, Optimizer::adamw, 0, Quant::none,
                  0.0, 0.6}),
    [](const ::testing::TestParamInfo<ModelCase>& i) {
      std::string n = std::string(i.param.preset) + "_" + dtype_param_name(i.param.dtype) + "_" +
                      (i.param.attention == Attention::eager ? "eager" : "flash") + "_" +
                      optimizer_name(i.param.optimizer) + (i.param.lora_rank > 0 ? "_lora" : "") +
                      (i.param.quant != Quant::none ? "_qlora" : "") +
                      (i.param.dropout > 0 ? "_dropout" : "") +
                      (i.param.capacity_factor > 0 ? "_capacity" : "");
      for (auto& ch : n)
        if (ch == '-') ch = '_';
      return n;
    });

// ---------------------------------------------------------------- checkpointing on/off

class CheckpointingGpu : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override { require_cuda_device(); }
};

TEST_P(CheckpointingGpu, SameLossAndGradientsBitForBit) {
  const ModelCase c = GetParam();
  const ModelConfig m = preset(c.preset);
  GradMap grads[2];
  float loss[2];
  for (int ck = 0; ck < 2; ++ck) {
    ModelRun r(BackendKind::cuda, m,
               train(2, 29, c.dtype, c.optimizer, ck ? Checkpointing::full : Checkpointing::none,
                     c.attention));
    r.model->init_random(11);
    r.model->random_tokens(5);
    loss[ck] = r.model->train_step(
        [&](const Parameter& p, const std::vector<float>& g) { grads[ck][p.name] = g; });
  }
  EXPECT_EQ(std::memcmp(&loss[0], &loss[1], 4), 0) << loss[0] << " vs " << loss[1];
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (const auto& [name, g] : grads[0]) {
    const auto& h = grads[1].at(name);
    ASSERT_EQ(g.size(), h.size());
    EXPECT_EQ(std::memcmp(g.data(), h.data(), g.size() * 4), 0)
        << name << ": " << all_close(name, h, g, exact()).message();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Model, CheckpointingGpu,
    ::testing::Values(ModelCase{"tiny-gqa", DType::bf16, Attention::eager, Optimizer::adamw},
                      ModelCase{"tiny-gqa", DType::f16, Attention::flash, Optimizer::sgd},
                      ModelCase{"tiny-tied", DType::f32, Attention::flash, Optimizer::lomo},
                      ModelCase{"tiny-mixtral", DType::bf16, Attention::flash, Optimizer::adamw}),
    [](const ::testing::TestParamInfo<ModelCase>& i) {
      std::string n = std::string(i.param.preset) + "_" + dtype_param_name(i.param.dtype) + "_" +
                      (i.param.attention == Attention::eager ? "eager" : "flash");
      for (auto& ch : n)
        if (ch == '-') ch = '_';
      return n;
    });

// Per-layer policies and selective recompute on the GPU (issue 30): the same loss and gradient
// bits as without checkpointing, and the cuda ledger equal to the meta ledger's figures.
TEST(PoliciesGpu, PerLayerAndSelectiveSameBitsAndLedgerAsPlanned) {
  require_cuda_device();
  const ModelConfig m = preset("tiny-awkward");  // 3 layers
  const TrainConfig none =
      train(2, 29, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::eager);
  TrainConfig layer1 = none;
  layer1.checkpointing = Checkpointing::full;
  layer1.checkpoint_layers = {{1}, "layers:1", 0};
  TrainConfig selective = none;
  selective.checkpointing = Checkpointing::selective;
  GradMap grads[3];
  float loss[3];
  const TrainConfig* configs[3] = {&none, &layer1, &selective};
  for (int k = 0; k < 3; ++k) {
    ModelRun r(BackendKind::cuda, m, *configs[k]);
    r.model->init_random(11);
    r.model->random_tokens(5);
    loss[k] = r.model->train_step(
        [&](const Parameter& p, const std::vector<float>& g) { grads[k][p.name] = g; });
    ModelRun meta(BackendKind::meta, m, *configs[k]);
    meta.model->init_random(11);
    meta.model->random_tokens(5);
    meta.model->train_step();
    const MemoryFigures fg = measured_figures(*r.ledger), fm = measured_figures(*meta.ledger);
    EXPECT_EQ(fg.activations, fm.activations) << k;
    EXPECT_EQ(fg.peak, fm.peak) << k;
    EXPECT_EQ(fg.peak_breakdown, fm.peak_breakdown) << k;
  }
  for (int k = 1; k < 3; ++k) {
    EXPECT_EQ(std::memcmp(&loss[0], &loss[k], 4), 0) << k << ": " << loss[0] << " vs " << loss[k];
    for (const auto& [name, g] : grads[0]) {
      const auto& h = grads[k].at(name);
      ASSERT_EQ(g.size(), h.size());
      EXPECT_EQ(std::memcmp(g.data(), h.data(), g.size() * 4), 0) << k << " " << name;
    }
  }
}

// --offload-activations on the device: the copies through host memory give the same bits as the
// step that keeps everything on the device, and both ledgers are the meta trace's.
TEST(OffloadGpu, SameBitsAndBothLedgersAsPlanned) {
  require_cuda_device();
  const ModelConfig m = preset("tiny-awkward");  // 3 layers
  TrainConfig plain =
      train(2, 29, DType::bf16, Optimizer::adamw, Checkpointing::none, Attention::eager);
  TrainConfig off = plain;
  off.offload_activations = true;
  GradMap grads[2];
  float loss[2];
  const TrainConfig* configs[2] = {&plain, &off};
  for (int k = 0; k < 2; ++k) {
    ModelRun r(BackendKind::cuda, m, *configs[k]);
    r.model->init_random(11);
    r.model->random_tokens(5);
    loss[k] = r.model->train_step(
        [&](const Parameter& p, const std::vector<float>& g) { grads[k][p.name] = g; });
    ModelRun meta(BackendKind::meta, m, *configs[k]);
    meta.model->train_step();
    const MemoryFigures fg = measured_figures(*r.ledger), fm = measured_figures(*meta.ledger);
    EXPECT_EQ(fg.activations, fm.activations) << k;
    EXPECT_EQ(fg.peak, fm.peak) << k;
    EXPECT_EQ(fg.peak_breakdown, fm.peak_breakdown) << k;
    if (k == 1) {
      ASSERT_NE(r.model->host_ledger(), nullptr);
      EXPECT_EQ(r.model->host_ledger()->peak_total().bytes,
                meta.model->host_ledger()->peak_total().bytes);
      EXPECT_EQ(r.model->offload_transfer_bytes(), meta.model->offload_transfer_bytes());
    }
  }
  EXPECT_EQ(std::memcmp(&loss[0], &loss[1], 4), 0) << loss[0] << " vs " << loss[1];
  for (const auto& [name, g] : grads[0]) {
    const auto& h = grads[1].at(name);
    ASSERT_EQ(g.size(), h.size());
    EXPECT_EQ(std::memcmp(g.data(), h.data(), g.size() * 4), 0) << name;
  }
}

// The managed allocator gives what cudaMallocManaged gives: memory the driver calls managed,
// which a kernel (cudaMemset) and the host both reach.
TEST(PagedGpu, ManagedAllocatorGivesManagedMemory) {
  require_cuda_device();
  Allocator& a = cuda_backend(DType::bf16).managed_allocator();
  EXPECT_STREQ(a.name(), "managed");
  const std::uint64_t bytes = 1 << 20;
  void* p = a.allocate(bytes);
  ASSERT_NE(p, nullptr) << a.failure_detail();
  cudaPointerAttributes at{};
  ASSERT_EQ(cudaPointerGetAttributes(&at, p), cudaSuccess);
  EXPECT_EQ(at.type, cudaMemoryTypeManaged);
  ASSERT_EQ(cudaMemset(p, 0x5a, bytes), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(static_cast<unsigned char*>(p)[bytes - 1], 0x5a);
  a.deallocate(p, bytes);
}

// --optimizer paged-adamw8bit on the device: the large moments in CUDA managed memory, the same
// bits as AdamW8bit's step with them in the pool, and the managed
// ledger as the meta trace plans it. small-256's embedding and MLP weights page; its attention
// weights (65,536 elements) do not.
TEST(PagedGpu, ManagedMomentsGiveTheUnpagedBitsAndThePlannedLedger) {
  require_cuda_device();
  const ModelConfig m = preset("small-256");
  float loss[2];
  std::vector<float> weight[2];
  const Optimizer opts[2] = {Optimizer::adamw8bit, Optimizer::paged_adamw8bit};
  for (int k = 0; k < 2; ++k) {
    const TrainConfig t = train(1, 24, DType::bf16, opts[k], Checkpointing::none, Attention::eager);
    ModelRun r(BackendKind::cuda, m, t);
    r.model->init_random(11);
    r.model->random_tokens(5);
    for (int step = 0; step < 3; ++step) loss[k] = r.model->train_step();
    weight[k] = r.model->parameter_values("model.embed_tokens.weight");
    if (k == 0) {
      EXPECT_EQ(r.model->managed_ledger(), nullptr);
      continue;
    }
    const Ledger* managed = r.model->managed_ledger();
    ASSERT_NE(managed, nullptr);
    ModelRun meta(BackendKind::meta, m, t);
    meta.model->train_step();
    EXPECT_EQ(managed->peak_total().bytes, meta.model->managed_ledger()->peak_total().bytes);
    EXPECT_GT(managed->live_total(), 0u);
    const MemoryFigures fg = measured_figures(*r.ledger), fm = measured_figures(*meta.ledger);
    EXPECT_EQ(fg.optimizer_states, fm.optimizer_states);
    EXPECT_EQ(fg.peak, fm.peak);
  }
  EXPECT_EQ(std::memcmp(&loss[0], &loss[1], 4), 0) << loss[0] << " vs " << loss[1];
  EXPECT_EQ(weight[0], weight[1]);
}

// ---------------------------------------------------------------- cuda ledger == meta ledger

struct LedgerCase {
  const char* preset;
  DType dtype;
  Optimizer optimizer;
  Checkpointing checkpointing;
  Attention attention;
};
void PrintTo(const LedgerCase& c, std::ostream* os) {
  *os << c.preset;
}

class LedgerGpu : public ::testing::TestWithParam<LedgerCase> {
 protected:
  void SetUp() override { require_cuda_device(); }
};

TEST_P(LedgerGpu, CudaLedgerEqualsMetaLedger) {
  const LedgerCase c = GetParam();
  const ModelConfig m = preset(c.preset);
  const TrainConfig t = train(3, 17, c.dtype, c.optimizer, c.checkpointing, c.attention);
  ModelRun meta(BackendKind::meta, m, t), gpu(BackendKind::cuda, m, t);
  for (ModelRun* r : {&meta, &gpu}) {
    r->model->init_random(1);
    r->model->random_tokens(2);
    r->model->train_step();
    r->model->train_step();
  }
  const auto& a = meta.ledger->tensors();
  const auto& b = gpu.ledger->tensors();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("tensor record " + std::to_string(i) + " " + a[i].name);
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].category, b[i].category);
    EXPECT_EQ(a[i].layer, b[i].layer);
    EXPECT_EQ(a[i].shape, b[i].shape);
    EXPECT_EQ(a[i].dtype, b[i].dtype);
    EXPECT_EQ(a[i].bytes, b[i].bytes);
    EXPECT_EQ(a[i].phase, b[i].phase);
    EXPECT_EQ(a[i].alloc_seq, b[i].alloc_seq);
    EXPECT_EQ(a[i].free_seq, b[i].free_seq);
    EXPECT_EQ(a[i].step, b[i].step);
    if (::testing::Test::HasFailure()) break;  // the first divergence is the useful one
  }
  const MemoryFigures fa = measured_figures(*meta.ledger), fb = measured_figures(*gpu.ledger);
  EXPECT_EQ(fa.params, fb.params);
  EXPECT_EQ(fa.gradients, fb.gradients);
  EXPECT_EQ(fa.optimizer_states, fb.optimizer_states);
  EXPECT_EQ(fa.activations, fb.activations);
  EXPECT_EQ(fa.activations_peak, fb.activations_peak);
  EXPECT_EQ(fa.workspace, fb.workspace);
  EXPECT_EQ(fa.inputs, fb.inputs);
  EXPECT_EQ(fa.sum, fb.sum);
  EXPECT_EQ(fa.peak, fb.peak);
  EXPECT_EQ(fa.peak_breakdown, fb.peak_breakdown);
}

INSTANTIATE_TEST_SUITE_P(Model, LedgerGpu,
                         ::testing::Values(LedgerCase{"tiny-gqa", DType::bf16, Optimizer::adamw,
                                                      Checkpointing::none, Attention::eager},
                                           LedgerCase{"tiny-tied", DType::f16, Optimizer::lomo,
                                                      Checkpointing::full, Attention::flash},
                                           LedgerCase{"tiny-awkward", DType::f32, Optimizer::sgd,
                                                      Checkpointing::full, Attention::eager},
                                           LedgerCase{"tiny-qwen3-moe", DType::bf16,
                                                      Optimizer::adamw, Checkpointing::full,
                                                      Attention::flash}),
                         [](const ::testing::TestParamInfo<LedgerCase>& i) {
                           std::string n =
                               std::string(i.param.preset) + "_" + dtype_param_name(i.param.dtype);
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace trainmem::gputest
