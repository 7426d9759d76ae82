// bench_step_cuda: the training step's throughput on the cuda backend — median step time over
// timed steps after one warm-up step, tokens/s, and the model FLOP utilisation against a
// measured GEMM rate (bench_gemm_cuda's JSON, --gemm-json). Model FLOPs per token follow the
// PaLM convention: 6·N (N = parameters that take part in matmuls: all but the embedding
// lookup, plus the LM head when it is tied to it) + 12·L·h·s (the attention scores and the
// probability-value products, forward and backward, counted without the causal half).
// Recomputation under checkpointing is not model FLOPs (it lowers MFU, as it should).
// Prints a line and, with --json, writes {"schema": "trainmem-bench/1", "bench": "step_cuda"}.
//
//   bench_step_cuda [--model NAME|config.json] [--batch N] [--seq N] [--dtype D]
//                   [--optimizer adamw|sgd|lomo] [--checkpointing none|full]
//                   [--attention eager|flash] [--steps N] [--gemm-json FILE] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainmem/backends/backend.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/figures.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/model.hpp"

using namespace trainmem;
using Clock = std::chrono::steady_clock;

namespace {

int usage(const std::string& msg) {
  std::fprintf(stderr,
               "bench_step_cuda: %s\nusage: bench_step_cuda [--model NAME|config.json] "
               "[--batch N] [--seq N] [--dtype bf16|fp16|fp32] [--optimizer adamw|sgd|lomo] "
               "[--checkpointing none|full] [--attention eager|flash] [--steps N] "
               "[--gemm-json FILE] [--json FILE]\n",
               msg.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "llama-7b", dtype = "fp16", optimizer = "sgd", ckpt = "none",
              attention = "eager", gemm_json, json_path;
  std::int64_t batch = 8, seq = 512;
  int steps = 3;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (a + 1 >= argc) return usage("missing value after " + arg);
    const std::string val = argv[++a];
    if (arg == "--model") {
      model_name = val;
    } else if (arg == "--batch") {
      batch = std::stoll(val);
    } else if (arg == "--seq") {
      seq = std::stoll(val);
    } else if (arg == "--dtype") {
      dtype = val;
    } else if (arg == "--optimizer") {
      optimizer = val;
    } else if (arg == "--checkpointing") {
      ckpt = val;
    } else if (arg == "--attention") {
      attention = val;
    } else if (arg == "--steps") {
      steps = std::stoi(val);
    } else if (arg == "--gemm-json") {
      gemm_json = val;
    } else if (arg == "--json") {
      json_path = val;
    } else {
      return usage("unknown argument " + arg);
    }
  }
  try {
    const ModelConfig m = resolve_model(model_name);
    TrainConfig t;
    t.batch = batch;
    t.seq = seq;
    const auto dt = parse_dtype(dtype);
    const auto opt = parse_optimizer(optimizer);
    const auto ck = parse_checkpointing(ckpt);
    const auto at = parse_attention(attention);
    if (!dt || *dt == DType::i32) return usage("--dtype must be bf16, fp16 or fp32");
    if (!opt) return usage("--optimizer must be adamw, sgd or lomo");
    if (!ck) return usage("--checkpointing must be none or full");
    if (!at) return usage("--attention must be eager or flash");
    if (steps < 1) return usage("--steps must be >= 1");
    t.dtype = *dt;
    t.optimizer = *opt;
    t.checkpointing = *ck;
    t.attention = *at;
    t.validate();
    m.validate();

    const std::string reason = cuda_unavailable_reason();
    if (!reason.empty()) {
      std::fprintf(stderr, "bench_step_cuda: no usable CUDA device (%s)\n", reason.c_str());
      return 1;
    }
    auto be = make_cuda_backend(t.dtype);
    Ledger ledger(be->allocator());
    double setup_s = 0, warmup_ms = 0;
    std::vector<double> ms;
    std::vector<float> losses;
    MemoryFigures fig;
    {
      const auto t0 = Clock::now();
      LlamaModel model(m, t, *be, ledger, default_optimizer_settings(t.optimizer));
      model.init_random(0);
      model.random_tokens(0);
      be->synchronize();
      setup_s = std::chrono::duration<double>(Clock::now() - t0).count();
      auto t1 = Clock::now();
      losses.push_back(model.train_step());  // warm-up (cuBLAS heuristics, pool growth)
      be->synchronize();
      warmup_ms = std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
      for (int s = 0; s < steps; ++s) {
        t1 = Clock::now();
        losses.push_back(model.train_step());
        be->synchronize();
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t1).count());
      }
      fig = measured_figures(ledger);
    }
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    const double med = sorted[sorted.size() / 2];
    const double tokens = double(batch) * double(seq);
    const double tokens_per_s = tokens / (med * 1e-3);
    const double P = double(m.param_count());
    const double embed = double(m.vocab) * double(m.hidden);
    const double matmul_params = P - embed + (m.tied_embeddings ? embed : 0.0);
    const double flops_per_token =
        6.0 * matmul_params + 12.0 * double(m.layers) * double(m.hidden) * double(seq);
    double gemm_tflops = 0;
    if (!gemm_json.empty()) {
      std::ifstream f(gemm_json);
      if (f) {
        const auto g = nlohmann::json::parse(f, nullptr, false);
        if (!g.is_discarded() && g.contains("best_tflops")) gemm_tflops = g["best_tflops"];
      }
    }
    const double achieved_tflops = tokens_per_s * flops_per_token / 1e12;
    const double mfu = gemm_tflops > 0 ? achieved_tflops / gemm_tflops : 0.0;
    std::printf(
        "bench_step_cuda: %s b%lld s%lld %s %s ckpt=%s %s: %.1f ms/step (median of %d), "
        "%.0f tokens/s, %.1f model TFLOP/s",
        m.name.c_str(), (long long)batch, (long long)seq, dtype_name(t.dtype),
        optimizer_name(t.optimizer), checkpointing_name(t.checkpointing),
        attention_name(t.attention), med, steps, tokens_per_s, achieved_tflops);
    if (gemm_tflops > 0) std::printf(", MFU %.1f%% of %.0f TFLOP/s", 100 * mfu, gemm_tflops);
    std::printf("\n");
    if (!json_path.empty()) {
      const nlohmann::json doc = {
          {"schema", "trainmem-bench/1"},
          {"bench", "step_cuda"},
          {"model", m.name},
          {"params", m.param_count()},
          {"run",
           {{"batch", batch},
            {"seq", seq},
            {"dtype", dtype_name(t.dtype)},
            {"optimizer", optimizer_name(t.optimizer)},
            {"checkpointing", checkpointing_name(t.checkpointing)},
            {"attention", attention_name(t.attention)}}},
          {"setup_seconds", setup_s},
          {"warmup_ms", warmup_ms},
          {"step_ms_all", ms},
          {"step_ms", med},
          {"tokens_per_s", tokens_per_s},
          {"flops_per_token", flops_per_token},
          {"model_tflops", achieved_tflops},
          {"gemm_tflops", gemm_tflops > 0 ? nlohmann::json(gemm_tflops) : nlohmann::json()},
          {"mfu", gemm_tflops > 0 ? nlohmann::json(mfu) : nlohmann::json()},
          {"losses", losses},
          {"ledger_peak", fig.peak}};
      std::ofstream(json_path) << doc.dump(2) << "\n";
    }
    return 0;
  } catch (const OutOfMemory& e) {
    std::fprintf(stderr, "bench_step_cuda: out of memory: %s\n", e.what());
    return 3;
  } catch (const InputError& e) {
    return usage(e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_step_cuda: %s\n", e.what());
    return 1;
  }
}
