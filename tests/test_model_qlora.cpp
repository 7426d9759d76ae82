// QLoRA in trainmem's own step (issue 28; docs/native-plan.md, "QLoRA"): the base projections
// stored as bitsandbytes stores them and dequantized into workspace around each GEMM. The meta
// trace against the analytic `native` profile byte for byte, the cpu ledger against the meta
// trace, the stored tensors against the quantization kernels (whose bits tests/test_ops_quant.cpp
// checks against the real bitsandbytes), and the step against the LoRA step on the dequantized
// weights, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "family_configs.hpp"
#include "model_helpers.hpp"
#include "quant4/quant4.hpp"
#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/lora.hpp"
#include "trainmem/base/safetensors.hpp"
#include "trainmem/model/model_io.hpp"
#include "trainmem/model/optimizer.hpp"

namespace trainmem {
namespace {

using test::ModelRun;

TrainConfig qlora_train(std::int64_t b, std::int64_t s, std::int64_t r, unsigned targets,
                        Quant q = Quant::nf4, bool dq = true, std::int64_t bs = 64,
                        Optimizer o = Optimizer::adamw, DType dt = DType::bf16) {
  TrainConfig t = test::train_config(b, s, dt, o, Checkpointing::none, Attention::eager);
  t.lora_rank = r;
  t.lora_targets = targets;
  t.quant = q;
  t.double_quant = dq;
  t.quant_blocksize = bs;
  return t;
}

bool is_projection(const std::string& name) {
  return name.rfind("model.layers.", 0) == 0 && name.size() > 12 &&
         name.compare(name.size() - 12, 12, "_proj.weight") == 0;
}

// The second step of the meta trace has the closed form's figures, peak breakdown included;
// returns the estimate (and the run, when asked).
Estimate expect_trace_is_the_closed_form(const ModelConfig& m, const TrainConfig& t,
                                         std::unique_ptr<ModelRun>* keep = nullptr) {
  auto run = std::make_unique<ModelRun>(BackendKind::meta, m, t);
  test::two_random_steps(*run->model);
  const Estimate e = estimate(Profile::native, m, t);
  test::expect_same_figures(measured_figures(*run->ledger), e.figures,
                            "analytic peak at " + e.instants.at(e.peak_instant).name);
  if (keep) *keep = std::move(run);
  return e;
}

// Each 4-bit weight of `q` is bitsandbytes' quantization (the kernels') of the same weight as
// the 16-bit base `l` holds it: packed pairs, absmax (double quantized: its 8-bit codes, nested
// absmax and offset), codes; every other parameter is dense. With set_dequantized, l's base
// weights become the dequantized ones (fp32, rounded to D once, as the kernel rounds).
void expect_stored_as_bitsandbytes(const LlamaModel& qm, LlamaModel& lm, const TrainConfig& t,
                                   bool set_dequantized) {
  const Quant4Type type = t.quant == Quant::fp4 ? Quant4Type::fp4 : Quant4Type::nf4;
  const std::int64_t bs = t.quant_blocksize;
  std::vector<float> code(16), nested_code(256);
  std::vector<std::uint8_t> lut(kQuantLutSize);
  quant4_tables_host(code.data(), nested_code.data(), lut.data(), type);
  int projections = 0;
  for (const Parameter& p : qm.parameters()) {
    if (!is_projection(p.name)) {
      EXPECT_EQ(qm.quant4_weight(p.name), nullptr) << p.name;
      continue;
    }
    SCOPED_TRACE(p.name);
    ++projections;
    const Quant4View* v = qm.quant4_weight(p.name);
    ASSERT_NE(v, nullptr);
    EXPECT_FALSE(p.trainable);
    const std::int64_t n = std::int64_t(p.numel()), nb = (n + bs - 1) / bs;
    const std::vector<float> dense = lm.parameter_values(p.name);
    std::vector<unsigned char> x(dense.size() * dtype_size(t.dtype));
    for (std::size_t e = 0; e < dense.size(); ++e) store_from_f32(x.data(), e, t.dtype, dense[e]);
    std::vector<std::uint8_t> packed(std::size_t((n + 1) / 2));
    std::vector<float> absmax(static_cast<std::size_t>(nb));
    quantize_4bit_cpu(packed.data(), absmax.data(), x.data(), n, bs, type, t.dtype);
    EXPECT_EQ(0, std::memcmp(packed.data(), v->packed, packed.size()));
    std::vector<float> am = absmax;  // what the dequantize reads
    if (t.double_quant) {
      const float offset = double_quant_offset(absmax.data(), nb);
      EXPECT_EQ(v->offset, offset);
      const std::int64_t nn = (nb + 255) / 256;
      std::vector<std::uint8_t> qa(std::size_t(nb), 0);
      std::vector<float> nested(static_cast<std::size_t>(nn));
      quantize_blockwise8_cpu(qa.data(), nested.data(), absmax.data(), offset, nb, 256, lut.data());
      EXPECT_EQ(0, std::memcmp(qa.data(), v->absmax, qa.size()));
      EXPECT_EQ(0, std::memcmp(nested.data(), v->nested_absmax, nested.size() * 4));
      EXPECT_EQ(0, std::memcmp(nested_code.data(), v->nested_code, 256 * 4));
      dequantize_blockwise8_cpu(am.data(), qa.data(), nested.data(), nested_code.data(), nb, 256,
                                true, offset);
    } else {
      EXPECT_EQ(0, std::memcmp(absmax.data(), v->absmax, absmax.size() * 4));
    }
    if (!set_dequantized) continue;
    std::vector<float> w(dense.size());
    dequantize_4bit_cpu(w.data(), packed.data(), am.data(), n, bs, type, v->in % 2 == 0,
                        DType::f32);
    lm.set_parameter_values(p.name, w);
    EXPECT_NE(w, dense) << "quantization lost nothing";
  }
  EXPECT_EQ(projections, 7 * int(qm.model_config().layers));
}

// The figures of the second step of the meta trace equal the closed form, peak breakdown
// included, over families, double quantization on and off, blocksizes, target sets,
// checkpointing policies, attention variants, dtypes and optimizers.
TEST(QloraLedger, MetaTraceEqualsTheNativeClosedForm) {
  struct Case {
    const char* preset;
    std::int64_t b, s;
  };
  struct Mode {
    Optimizer o;
    DType dt;
  };
  // Skewed shapes whose q_proj's and o_proj's dequantized copies are the largest transients, so
  // that each instant of docs/native-plan.md, "QLoRA", decides the peak somewhere (the usual
  // models reach only those of down_proj and gate/up): "skewed", a·d = 256 over h = 64 and
  // i = 8 (backward step 8); "skewed-gqa", the same on one kv head at s 16 (step 5, eager);
  // "skewed-wide", h = 48 over a·d = 32 in 16 heads of 2, i = 2 (the recompute's o_proj).
  auto config = [](const std::string& name) {
    if (name.rfind("skewed", 0) != 0) return test::any_config(name);
    ModelConfig m = test::any_config("tiny");
    m.name = name;
    m.intermediate = 8;
    m.explicit_head_dim = 64;
    if (name == "skewed-gqa") m.kv_heads = 1;
    if (name == "skewed-wide") {
      m.hidden = 48;
      m.heads = 16;
      m.kv_heads = 1;
      m.explicit_head_dim = 2;
      m.intermediate = 2;
    }
    return m;
  };
  int checked = 0;
  for (const Case& c :
       {Case{"tiny", 3, 17}, Case{"tiny-awkward", 3, 7}, Case{"tiny-tied", 1, 5},
        Case{"tiny-qwen2", 3, 11}, Case{"tiny-qwen3", 2, 9}, Case{"tiny-mistral", 2, 9},
        Case{"skewed", 1, 3}, Case{"skewed-gqa", 1, 16}, Case{"skewed-wide", 1, 4}})
    for (bool dq : {true, false})
      for (std::int64_t bs : {64, 128})
        for (unsigned targets : std::vector<unsigned>{kLoraPeftDefault, kLoraAllLinear, kLoraDown})
          for (const char* ck : {"none", "full", "selective", "every:2"})
            for (Attention at : {Attention::eager, Attention::flash})
              for (Mode md : {Mode{Optimizer::adamw, DType::bf16}, Mode{Optimizer::sgd, DType::f32},
                              Mode{Optimizer::adamw8bit, DType::bf16}}) {
                const ModelConfig m = config(c.preset);
                // nf4 and fp4 store the same bytes: alternate them.
                TrainConfig t =
                    qlora_train(c.b, c.s, 2, targets, checked % 2 ? Quant::fp4 : Quant::nf4, dq, bs,
                                md.o, md.dt);
                t.attention = at;
                test::set_checkpointing(t, m, ck);
                SCOPED_TRACE(std::string(c.preset) + (dq ? " dq" : " no-dq") + " bs " +
                             std::to_string(bs) + " targets " + lora_targets_name(targets) + " " +
                             ck + " " + attention_name(at) + " " + optimizer_name(md.o) + " " +
                             dtype_name(md.dt));
                expect_trace_is_the_closed_form(m, t);
                ++checked;
              }
  EXPECT_EQ(checked, 9 * 2 * 2 * 3 * 4 * 2 * 3);
}

// A large base at a short sequence: a dequantized weight is the largest transient of the step,
// and the peak is one of the dequantization instants (ledger and closed form at the same one).
TEST(QloraLedger, TheDequantizedWeightIsThePeakOfAShortSequence) {
  const ModelConfig m = test::preset("llama3-8b");
  for (const char* ck : {"none", "full"}) {
    SCOPED_TRACE(ck);
    TrainConfig t = qlora_train(1, 32, 16, kLoraAllLinear);
    t.attention = Attention::flash;
    test::set_checkpointing(t, m, ck);
    std::unique_ptr<ModelRun> run;
    const Estimate e = expect_trace_is_the_closed_form(m, t, &run);
    EXPECT_NE(e.instants.at(e.peak_instant).name.find("dequantized"), std::string::npos)
        << e.instants.at(e.peak_instant).name;
    const PeakInfo& peak = run->ledger->peak_total();
    EXPECT_EQ(peak.tensor.rfind("dequant.", 0), 0u) << peak.tensor;
    // The largest dequantized weight, (i, h) bf16, beside its fp32 absmax per 64 elements.
    EXPECT_GE(peak.breakdown[static_cast<int>(Category::workspace)],
              kCublasWorkspaceBytes + 2u * 14336 * 4096 + 4u * 14336 * 4096 / 64);
  }
}

// The cpu run allocates exactly what the meta trace does: the same tensors, in the same order,
// freed at the same events (the quantization at init included).
TEST(QloraLedger, CpuLedgerIsTheMetaTrace) {
  for (const char* preset : {"tiny-qwen3", "tiny-qwen2"})
    for (const char* ck : {"none", "full"})
      for (bool dq : {true, false}) {
        SCOPED_TRACE(std::string(preset) + " " + ck + (dq ? " dq" : " no-dq"));
        const ModelConfig m = test::any_config(preset);
        TrainConfig t = qlora_train(2, 9, 4, kLoraAllLinear, Quant::nf4, dq);
        t.checkpointing = *parse_checkpointing(ck);
        ModelRun cpu(BackendKind::cpu, m, t), meta(BackendKind::meta, m, t);
        for (ModelRun* run : {&cpu, &meta}) {
          test::two_random_steps(*run->model);
        }
        test::expect_same_ledgers(*cpu.ledger, *meta.ledger);
        int dequants = 0;
        for (const TensorRecord& r : cpu.ledger->tensors())
          if (r.name.rfind("dequant.", 0) == 0 && r.name.find(".absmax") == std::string::npos)
            ++dequants;
        // Per layer and step: 7 in forward, 7 input gradients in backward, and the recompute's
        // 6 (it stops before down_proj) under checkpointing.
        EXPECT_EQ(dequants, 2 * int(m.layers) * (std::string(ck) == "full" ? 20 : 14));
      }
}

// The 4-bit tensors are bitsandbytes' quantization of the weights the same seed draws for the
// 16-bit base (init_random's streams do not depend on the storage), and the QLoRA step computes
// exactly what the LoRA step computes on the dequantized weights: the same losses over two steps
// and the same adapter gradients, bit for bit.
TEST(QloraStep, StoresBitsandbytesTensorsAndStepsLikeLoraOnTheDequantizedBase) {
  struct Case {
    const char* preset;
    Quant q;
    bool dq;
    std::int64_t bs;
    DType dt;
    Checkpointing ck;
  };
  for (const Case& c :
       {Case{"tiny-qwen2", Quant::nf4, true, 64, DType::bf16, Checkpointing::none},
        Case{"tiny-awkward", Quant::fp4, false, 128, DType::f32, Checkpointing::full},
        Case{"tiny-qwen3", Quant::nf4, true, 256, DType::f16, Checkpointing::full}}) {
    SCOPED_TRACE(c.preset);
    const ModelConfig m = test::any_config(c.preset);
    TrainConfig tq = qlora_train(2, 9, 3, kLoraAllLinear, c.q, c.dq, c.bs, Optimizer::adamw, c.dt);
    tq.checkpointing = c.ck;
    TrainConfig tl = tq;
    tl.quant = Quant::none;
    ModelRun q(BackendKind::cpu, m, tq), l(BackendKind::cpu, m, tl);
    q.model->init_random(3);
    l.model->init_random(3);
    expect_stored_as_bitsandbytes(*q.model, *l.model, tq, /*set_dequantized=*/true);
    q.model->random_tokens(4);
    l.model->random_tokens(4);
    test::GradMap gq, gl;
    EXPECT_EQ(q.model->train_step(test::capture_into(gq)),
              l.model->train_step(test::capture_into(gl)));
    EXPECT_EQ(gq.size(), std::size_t(14 * m.layers));  // the adapters only
    for (const auto& [name, g] : gl) {
      ASSERT_TRUE(gq.count(name)) << name;
      EXPECT_EQ(gq.at(name), g) << name;
    }
    EXPECT_EQ(q.model->train_step(), l.model->train_step());
  }
}

// --weights: the checkpoint's 16-bit weights are quantized as they are read (the same tensors as
// from init_random's values), and the meta trace of a loaded model is the cpu ledger's.
TEST(QloraStep, LoadsAndQuantizesACheckpoint) {
  const std::string path =
      std::string(TRAINMEM_TEST_DATA_DIR) + "/golden_tiny_gqa_weights.safetensors";
  const ModelConfig m =
      load_hf_config(std::string(TRAINMEM_TEST_DATA_DIR) + "/golden_tiny_gqa_config.json");
  const TrainConfig tq = qlora_train(2, 8, 2, kLoraAllLinear);
  TrainConfig tl = tq;
  tl.quant = Quant::none;
  ModelRun q(BackendKind::cpu, m, tq), l(BackendKind::cpu, m, tl), meta(BackendKind::meta, m, tq);
  for (ModelRun* r : {&q, &l, &meta}) r->model->load_weights(path);
  expect_stored_as_bitsandbytes(*q.model, *l.model, tq, /*set_dequantized=*/false);
  for (ModelRun* r : {&q, &meta}) {
    r->model->random_tokens(1);
    r->model->train_step();
  }
  test::expect_same_ledgers(*q.ledger, *meta.ledger);
}

// trainmem's LoRA and QLoRA steps against the real thing (tools/peft_golden.py: transformers
// 5.25 + peft 0.21.2, and bitsandbytes 0.50.2's nf4 base with double quantization, fp32 on the
// CPU): the same tiny model, adapters and tokens give the same loss and adapter gradients, to
// fp32 rounding (the GEMMs sum in another order; bitsandbytes' offset may differ in its last bit,
// docs/decisions.md). With LoRA dropout (p 0.3) peft ran with trainmem's masks in place of its
// nn.Dropout, so this checks where and how the native step drops: the adapter's input, scaled by
// 1/(1 − p), before A, and the gradients through the mask.
TEST(PeftGolden, LoraAndQloraStepsMatchTheRealPeft) {
  const std::string dir = std::string(TRAINMEM_TEST_DATA_DIR) + "/";
  const ModelConfig m = load_hf_config(dir + "golden_tiny_gqa_config.json");
  std::map<std::string, float> losses;
  for (const std::string c : {"lora", "qlora", "lora-dropout"}) {
    SCOPED_TRACE(c);
    const SafeTensorsReader g(dir + "peft_golden_" + c + ".safetensors");
    const std::int64_t b = std::stoll(g.metadata().at("batch")),
                       s = std::stoll(g.metadata().at("seq")),
                       r = std::stoll(g.metadata().at("rank"));
    TrainConfig t = qlora_train(b, s, r, kLoraAllLinear, c == "qlora" ? Quant::nf4 : Quant::none,
                                true, 64, Optimizer::sgd, DType::f32);
    t.lora_alpha = std::stof(g.metadata().at("alpha"));
    // lora-dropout: peft's step run with trainmem's masks of (dropout_seed, step 0).
    if (c == "lora-dropout") t.lora_dropout = std::stod(g.metadata().at("dropout"));
    ModelRun run(BackendKind::cpu, m, t);
    if (c == "lora-dropout")
      run.model->set_dropout_key(std::stoull(g.metadata().at("dropout_seed")), 0);
    run.model->load_weights(dir + "golden_tiny_gqa_weights.safetensors");
    int adapters = 0;
    for (const Parameter& p : run.model->parameters())
      if (p.trainable) {
        run.model->set_parameter_values(p.name, g.read_f32(p.name));
        ++adapters;
      }
    EXPECT_EQ(adapters, 28);
    run.model->set_tokens(load_tokens_file(dir + "golden_tiny_gqa_tokens.bin", b, s, m.vocab),
                          "golden tokens");
    test::GradMap got;
    const float loss = run.model->train_step(test::capture_into(got));
    const float want = g.read_f32("loss").at(0);
    EXPECT_NEAR(loss, want, 1e-5 * want);
    losses[c] = want;
    ASSERT_EQ(got.size(), 28u);
    for (const auto& [name, grad] : got) {
      const std::vector<float> ref = g.read_f32("grad." + name);
      double scale = 0;
      for (float v : ref) scale = std::max(scale, double(std::abs(v)));
      const test::Diff d = test::compare(grad, ref, 1e-5 * scale, 1e-4);
      EXPECT_LT(d.first_bad, 0) << name << ": max |diff| " << d.max_abs << " of " << d.max_ref;
      EXPECT_GT(scale, 0.0) << name << " has no gradient";
    }
  }
  // The masks change what peft computed (p 0.3 of every adapter input dropped).
  EXPECT_GT(std::abs(losses["lora-dropout"] - losses["lora"]), 1e-4f * losses["lora"]);
}

}  // namespace
}  // namespace trainmem

namespace trainmem {
namespace {

// --quant int8 (docs/native-plan.md, "8-bit base"): the figures of the meta trace's second step
// equal the closed form over families, the skewed shapes, targets, checkpointing policies,
// attention variants, dtypes and optimizers; the cpu ledger is the meta trace.
TEST(Int8Ledger, MetaTraceEqualsTheNativeClosedFormAndTheCpuLedger) {
  int checked = 0;
  for (const char* preset : {"tiny", "tiny-awkward", "tiny-tied", "tiny-qwen2", "tiny-qwen3"})
    for (unsigned targets : std::vector<unsigned>{kLoraPeftDefault, kLoraAllLinear, kLoraDown})
      for (const char* ck : {"none", "full", "selective", "every:2"})
        for (Attention at : {Attention::eager, Attention::flash})
          for (Optimizer o : {Optimizer::adamw, Optimizer::sgd, Optimizer::adamw8bit}) {
            const ModelConfig m = test::any_config(preset);
            TrainConfig t = qlora_train(2, 7, 2, targets, Quant::int8, true, 64, o,
                                        o == Optimizer::sgd ? DType::f32 : DType::bf16);
            t.attention = at;
            test::set_checkpointing(t, m, ck);
            SCOPED_TRACE(std::string(preset) + " " + lora_targets_name(targets) + " " + ck + " " +
                         attention_name(at) + " " + optimizer_name(o));
            expect_trace_is_the_closed_form(m, t);
            ++checked;
          }
  EXPECT_EQ(checked, 5 * 3 * 4 * 2 * 3);
  for (const char* ck : {"none", "full"}) {
    const ModelConfig m = test::any_config("tiny-qwen2");
    TrainConfig t = qlora_train(2, 9, 4, kLoraAllLinear, Quant::int8);
    t.checkpointing = *parse_checkpointing(ck);
    ModelRun cpu(BackendKind::cpu, m, t), meta(BackendKind::meta, m, t);
    for (ModelRun* run : {&cpu, &meta}) test::two_random_steps(*run->model);
    test::expect_same_ledgers(*cpu.ledger, *meta.ledger);
    int dequants = 0, absmax = 0;
    for (const TensorRecord& r : cpu.ledger->tensors()) {
      dequants += r.name.rfind("dequant.", 0) == 0;
      absmax += r.name.find(".absmax") != std::string::npos;
    }
    EXPECT_EQ(dequants, 2 * int(m.layers) * (std::string(ck) == "full" ? 20 : 14));
    EXPECT_EQ(absmax, 0) << "an int8 weight rebuilds no absmax";
  }
  // Llama-3-8B: the params are every projection's n int8 bytes + 4 bytes per row, the rest and
  // the adapters in bf16.
  const ModelConfig m = test::preset("llama3-8b");
  const TrainConfig t = qlora_train(1, 512, 16, kLoraAllLinear, Quant::int8);
  const Estimate e = estimate(Profile::native, m, t);
  const std::uint64_t h = 4096, kd = 1024, i = 14336, L = 32, V = 128256;
  const std::uint64_t proj = h * h + 2 * kd * h + h * h + 3 * i * h;
  const std::uint64_t rows = h + 2 * kd + h + 2 * i + h;
  const std::uint64_t rest = 2 * V * h + (2 * L + 1) * h;
  EXPECT_EQ(e.figures.params, L * (proj + 4 * rows) + 2 * rest + 2 * e.trainable_params);
  EXPECT_EQ(e.trainable_params, 41943040u);
}

// The int8 weights are bitsandbytes' row-wise quantization (the kernels') of the weights the same
// seed draws for the 16-bit base, and the step computes exactly what the LoRA step computes on
// the dequantized weights: the same losses over two steps and the same adapter gradients.
TEST(Int8Step, StoresInt8WeightsAndStepsLikeLoraOnTheDequantizedBase) {
  for (const DType dt : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    const ModelConfig m = test::any_config("tiny-qwen2");
    TrainConfig tq =
        qlora_train(2, 9, 3, kLoraAllLinear, Quant::int8, true, 64, Optimizer::adamw, dt);
    tq.checkpointing = dt == DType::f32 ? Checkpointing::full : Checkpointing::none;
    TrainConfig tl = tq;
    tl.quant = Quant::none;
    ModelRun q(BackendKind::cpu, m, tq), l(BackendKind::cpu, m, tl);
    q.model->init_random(3);
    l.model->init_random(3);
    int projections = 0;
    for (const Parameter& p : q.model->parameters()) {
      if (!is_projection(p.name)) continue;
      ++projections;
      const Quant4View* v = q.model->quant4_weight(p.name);
      ASSERT_NE(v, nullptr) << p.name;
      const std::vector<float> dense = l.model->parameter_values(p.name);
      std::vector<unsigned char> x(dense.size() * dtype_size(dt));
      for (std::size_t e = 0; e < dense.size(); ++e) store_from_f32(x.data(), e, dt, dense[e]);
      std::vector<std::int8_t> cb(dense.size());
      std::vector<float> scb(std::size_t(v->out));
      quantize_int8_cpu(cb.data(), scb.data(), x.data(), v->out, v->in, dt);
      EXPECT_EQ(0, std::memcmp(cb.data(), v->packed, cb.size())) << p.name;
      EXPECT_EQ(0, std::memcmp(scb.data(), v->absmax, scb.size() * 4)) << p.name;
      std::vector<float> w(dense.size());
      dequantize_int8_cpu(w.data(), cb.data(), scb.data(), v->out, v->in, DType::f32);
      l.model->set_parameter_values(p.name, w);
      EXPECT_NE(w, dense) << "quantization lost nothing";
    }
    EXPECT_EQ(projections, 7 * int(m.layers));
    q.model->random_tokens(4);
    l.model->random_tokens(4);
    test::GradMap gq, gl;
    EXPECT_EQ(q.model->train_step(test::capture_into(gq)),
              l.model->train_step(test::capture_into(gl)));
    EXPECT_EQ(gq.size(), std::size_t(14 * m.layers));
    for (const auto& [name, g] : gl) {
      ASSERT_TRUE(gq.count(name)) << name;
      EXPECT_EQ(gq.at(name), g) << name;
    }
    EXPECT_EQ(q.model->train_step(), l.model->train_step());
  }
}

}  // namespace
}  // namespace trainmem
