// bench_step: the cpu backend's training step for a small LLaMA (preset small-256: hidden
// 256, 4 layers, intermediate 688, vocab 2048; batch 4, seq 128; AdamW, eager attention; fp32
// or bf16) beside the same step in PyTorch on the CPU (tools/bench_step_torch.py, when
// /usr/bin/python3 has torch; bf16 there is torch.autocast with fp32 weights, PyTorch's own
// mixed precision), with both median times and their ratio. Also traces LLaMA-65B at batch 8,
// seq 512 on the meta backend and prints how long that took. Prints figures; asserts nothing
// about speed. docs/performance.md records what it printed.
//
//   bench_step [--steps N] [--threads N] [--dtype fp32|bf16|fp16] [--python PATH] [--no-torch]
//              [--batch N] [--seq N] [--model NAME]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainmem/backend.hpp"
#include "trainmem/bytes.hpp"
#include "trainmem/config.hpp"
#include "trainmem/ledger.hpp"
#include "trainmem/model.hpp"

using namespace trainmem;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  pclose(p);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 5, threads = 0;
  std::int64_t batch = 4, seq = 128;
  std::string python = "/usr/bin/python3", model_name = "small-256";
  bool torch = true;
  DType dtype = DType::f32;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    auto next = [&]() -> std::string {
      if (a + 1 >= argc) {
        std::fprintf(stderr, "bench_step: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++a];
    };
    if (arg == "--steps")
      steps = std::stoi(next());
    else if (arg == "--threads")
      threads = std::stoi(next());
    else if (arg == "--python")
      python = next();
    else if (arg == "--dtype") {
      const auto d = parse_dtype(next());
      if (!d || *d == DType::i32) {
        std::fprintf(stderr, "bench_step: --dtype must be fp32, bf16 or fp16\n");
        return 2;
      }
      dtype = *d;
    } else if (arg == "--no-torch")
      torch = false;
    else if (arg == "--batch")
      batch = std::stoll(next());
    else if (arg == "--seq")
      seq = std::stoll(next());
    else if (arg == "--model")
      model_name = next();
    else {
      std::fprintf(stderr, "bench_step: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (threads > 0) omp_set_num_threads(threads);
  const int nthreads = omp_get_max_threads();

  auto found = find_preset(model_name);
  if (!found) {
    std::fprintf(stderr, "bench_step: no preset %s\n", model_name.c_str());
    return 2;
  }
  const ModelConfig m = *found;
  TrainConfig t;
  t.batch = batch;
  t.seq = seq;
  t.dtype = dtype;
  t.optimizer = Optimizer::adamw;
  t.checkpointing = Checkpointing::none;
  t.attention = Attention::eager;

  std::printf(
      "model %s: V %lld h %lld i %lld L %lld a %lld k %lld; b %lld s %lld %s adamw "
      "eager; %d threads\n",
      m.name.c_str(), (long long)m.vocab, (long long)m.hidden, (long long)m.intermediate,
      (long long)m.layers, (long long)m.heads, (long long)m.kv_heads, (long long)batch,
      (long long)seq, dtype_name(dtype), nthreads);

  // ---- trainmem cpu backend
  double ours_ms = 0;
  {
    auto be = make_cpu_backend(t.dtype);
    Ledger ledger(be->allocator());
    LlamaModel model(m, t, *be, ledger, default_optimizer_settings(t.optimizer));
    model.init_random(0);
    model.random_tokens(0);
    const float first = model.train_step();  // warm-up
    std::vector<double> times;
    for (int i = 0; i < steps; ++i) {
      const auto t0 = Clock::now();
      model.train_step();
      times.push_back(ms_since(t0));
    }
    ours_ms = median(times);
    std::printf("trainmem cpu step: median %.1f ms over %d steps (first loss %.4f)\n", ours_ms,
                steps, first);
  }

  // ---- PyTorch on the CPU
  if (torch) {
    const auto script = std::filesystem::path(__FILE__).parent_path().parent_path() / "tools" /
                        "bench_step_torch.py";
    char cmd[2048];
    std::snprintf(cmd, sizeof cmd,
                  "'%s' '%s' --vocab %lld --hidden %lld --intermediate %lld --layers %lld "
                  "--heads %lld --kv-heads %lld %s --batch %lld --seq %lld --rms-eps %g "
                  "--rope-theta %g --steps %d --threads %d --dtype %s 2>/dev/null",
                  python.c_str(), script.c_str(), (long long)m.vocab, (long long)m.hidden,
                  (long long)m.intermediate, (long long)m.layers, (long long)m.heads,
                  (long long)m.kv_heads, m.tied_embeddings ? "--tied" : "", (long long)batch,
                  (long long)seq, m.rms_eps, m.rope_theta, steps, nthreads, dtype_name(dtype));
    const std::string out = run_capture(cmd);
    auto j = nlohmann::json::parse(out, nullptr, false);
    if (j.is_discarded() || !j.contains("median_ms")) {
      std::printf("pytorch cpu step: unavailable (%s with torch not found or failed)\n",
                  python.c_str());
    } else {
      const double torch_ms = j["median_ms"].get<double>();
      std::printf(
          "pytorch %s cpu step: median %.1f ms over %d steps (%d threads, first loss %.4f)\n",
          j["torch"].get<std::string>().c_str(), torch_ms, steps, j["threads"].get<int>(),
          j["loss"].get<double>());
      std::printf(
          "ratio trainmem / pytorch: %.2f (below 1 means trainmem is faster); speed vs "
          "pytorch: %.2fx\n",
          ours_ms / torch_ms, torch_ms / ours_ms);
    }
  }

  // ---- the meta backend traces LLaMA-65B
  {
    const ModelConfig big = *find_preset("llama-65b");
    TrainConfig bt;
    bt.batch = 8;
    bt.seq = 512;
    const auto t0 = Clock::now();
    auto be = make_meta_backend(bt.dtype);
    Ledger ledger(be->allocator());
    LlamaModel model(big, bt, *be, ledger, default_optimizer_settings(bt.optimizer));
    model.train_step();
    model.train_step();
    const double ms = ms_since(t0);
    std::printf(
        "meta trace llama-65b b8 s512 bf16 adamw (setup + 2 steps, %zu ledger events): "
        "%.1f ms; peak %s\n",
        ledger.timeline().size(), ms,
        format_bytes_with_unit(ledger.peak_total().bytes, kGiB).c_str());
  }
  return 0;
}
