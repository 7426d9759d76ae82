// bench_step: the cpu backend's training step for a small LLaMA (preset small-256: hidden
// 256, 4 layers, intermediate 688, vocab 2048; batch 4, seq 128; AdamW, eager attention; fp32
// or bf16) beside the same step in PyTorch on the CPU (tools/bench_step_torch.py --serve, one
// subprocess per peer; bf16 there is torch.autocast with fp32 weights, PyTorch's own mixed
// precision). The repetitions are interleaved: each round times one trainmem step and then one
// step of every peer (the order rotates by round), so machine load falls on all sides alike.
// Prints each side's median, min and max and the ratio of medians, and the median of the
// per-round ratios. Also traces LLaMA-65B at batch 8, seq 512 on the meta backend and prints
// how long that took. Prints figures; asserts nothing about speed. docs/performance.md records
// what it printed. torch is never a dependency: a peer that cannot start is said and skipped.
//
//   bench_step [--steps N] [--threads N] [--dtype fp32|bf16|fp16] [--peer CMD]... [--python PATH]
//              [--no-torch] [--batch N] [--seq N] [--model NAME]
// --peer CMD: a shell command prefix that runs a Python with torch, e.g. "/usr/bin/python3" or
// "PYTHONPATH=/opt/torch-pypi /usr/bin/python3"; repeatable. Default peers: /usr/bin/python3
// (Debian's python3-torch) and, when /opt/torch-pypi/torch exists, the same interpreter with
// PYTHONPATH=/opt/torch-pypi (PyPI's torch). --python PATH is --peer PATH.
#include <fcntl.h>
#include <omp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainmem/backends/backend.hpp"
#include "trainmem/base/bytes.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/model.hpp"

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

// A PyTorch peer: tools/bench_step_torch.py --serve under /bin/sh, talked to through pipes.
struct Peer {
  std::string cmd, label;
  pid_t pid = -1;
  FILE* to = nullptr;    // its stdin
  FILE* from = nullptr;  // its stdout
  std::vector<double> ms;
  bool ok = false;

  bool start(const std::string& shell_cmd) {
    int in[2], out[2];
    // close-on-exec: a later peer must not inherit this one's pipe ends (its stdin would
    // then never reach end of input); dup2 onto 0 and 1 clears the flag for the peer itself.
    if (pipe2(in, O_CLOEXEC) != 0) return false;
    if (pipe2(out, O_CLOEXEC) != 0) return false;
    pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[0]);
      close(in[1]);
      close(out[0]);
      close(out[1]);
      execl("/bin/sh", "sh", "-c", shell_cmd.c_str(), (char*)nullptr);
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to = fdopen(in[1], "w");
    from = fdopen(out[0], "r");
    return to && from;
  }
  bool read_line(std::string& line) {
    line.clear();
    char buf[4096];
    while (std::fgets(buf, sizeof buf, from)) {
      line += buf;
      if (!line.empty() && line.back() == '\n') return true;
    }
    return !line.empty();
  }
  bool step() {
    std::fputs("step\n", to);
    std::fflush(to);
    std::string line;
    if (!read_line(line)) return false;
    char* end = nullptr;
    const double v = std::strtod(line.c_str(), &end);
    if (end == line.c_str()) return false;
    ms.push_back(v);
    return true;
  }
  void stop() {
    if (to) {
      std::fputs("quit\n", to);
      std::fflush(to);
      std::fclose(to);
    }
    if (from) std::fclose(from);
    to = from = nullptr;
    if (pid > 0) waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int steps = 9, threads = 0;
  std::int64_t batch = 4, seq = 128;
  std::string model_name = "small-256";
  std::vector<std::string> peer_cmds;
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
    else if (arg == "--python" || arg == "--peer")
      peer_cmds.push_back(next());
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
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);  // a peer that died is noticed on its next answer
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

  // ---- the PyTorch peers: started first, each runs its warm-up step before the rounds
  std::vector<Peer> peers;
  if (torch) {
    if (peer_cmds.empty()) {
      peer_cmds.push_back("/usr/bin/python3");
      if (std::filesystem::exists("/opt/torch-pypi/torch"))
        peer_cmds.push_back("PYTHONPATH=/opt/torch-pypi /usr/bin/python3");
    }
    const auto script = std::filesystem::path(__FILE__).parent_path().parent_path() / "tools" /
                        "bench_step_torch.py";
    for (const auto& pc : peer_cmds) {
      char cmd[2048];
      std::snprintf(cmd, sizeof cmd,
                    "%s '%s' --serve --vocab %lld --hidden %lld --intermediate %lld --layers %lld "
                    "--heads %lld --kv-heads %lld %s --batch %lld --seq %lld --rms-eps %g "
                    "--rope-theta %g --threads %d --dtype %s 2>/dev/null",
                    pc.c_str(), script.c_str(), (long long)m.vocab, (long long)m.hidden,
                    (long long)m.intermediate, (long long)m.layers, (long long)m.heads,
                    (long long)m.kv_heads, m.tied_embeddings ? "--tied" : "", (long long)batch,
                    (long long)seq, m.rms_eps, m.rope_theta, nthreads, dtype_name(dtype));
      Peer p;
      p.cmd = pc;
      std::string header;
      if (p.start(cmd) && p.read_line(header)) {
        auto j = nlohmann::json::parse(header, nullptr, false);
        if (!j.is_discarded() && j.contains("torch")) {
          char label[256];
          std::snprintf(label, sizeof label, "pytorch %s (%s; %d threads, first loss %.4f)",
                        j["torch"].get<std::string>().c_str(), pc.c_str(), j["threads"].get<int>(),
                        j["loss"].get<double>());
          p.label = label;
          p.ok = true;
        }
      }
      if (!p.ok) {
        std::printf("pytorch peer '%s': unavailable (torch not found or the script failed)\n",
                    pc.c_str());
        p.stop();
        continue;
      }
      peers.push_back(std::move(p));
    }
  }

  // ---- trainmem cpu backend, interleaved with the peers round by round
  {
    auto be = make_cpu_backend(t.dtype);
    Ledger ledger(be->allocator());
    LlamaModel model(m, t, *be, ledger, default_optimizer_settings(t.optimizer));
    model.init_random(0);
    model.random_tokens(0);
    const float first = model.train_step();  // warm-up
    std::vector<double> ours;
    const int sides = 1 + int(peers.size());
    for (int round = 0; round < steps; ++round) {
      for (int k = 0; k < sides; ++k) {
        const int side = (round + k) % sides;
        if (side == 0) {
          const auto t0 = Clock::now();
          model.train_step();
          ours.push_back(ms_since(t0));
        } else if (peers[side - 1].ok && !peers[side - 1].step()) {
          std::printf("pytorch peer '%s': stopped answering\n", peers[side - 1].cmd.c_str());
          peers[side - 1].ok = false;
        }
      }
    }
    for (auto& p : peers) p.stop();
    auto spread = [](const std::vector<double>& v) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "median %.1f ms (min %.1f, max %.1f) over %zu steps",
                    median(v), *std::min_element(v.begin(), v.end()),
                    *std::max_element(v.begin(), v.end()), v.size());
      return std::string(buf);
    };
    std::printf("trainmem cpu step: %s (first loss %.4f)\n", spread(ours).c_str(), first);
    for (const auto& p : peers) {
      if (p.ms.size() != ours.size()) continue;
      std::printf("%s cpu step: %s\n", p.label.c_str(), spread(p.ms).c_str());
      std::vector<double> paired;
      for (std::size_t i = 0; i < ours.size(); ++i) paired.push_back(p.ms[i] / ours[i]);
      std::printf(
          "  speed vs this peer (its median / trainmem's median): %.2fx; median of the "
          "per-round ratios: %.2fx (min %.2f, max %.2f)\n",
          median(p.ms) / median(ours), median(paired),
          *std::min_element(paired.begin(), paired.end()),
          *std::max_element(paired.begin(), paired.end()));
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
