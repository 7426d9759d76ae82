// The launch detection, the local collective, the end-of-job policy, and, in a build without
// MPI or NCCL, the factories that refuse with exit 2 saying what to install
// (include/trainmem/collective.hpp).
#include "trainmem/collective.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "comm_internal.hpp"

namespace trainmem {

namespace comm {

void sum_in_rank_order(const void* contrib, int n, std::size_t len, DType t, void* out) {
  for (std::size_t i = 0; i < len; ++i) {
    float acc = load_as_f32(contrib, i, t);
    for (int q = 1; q < n; ++q)
      acc += load_as_f32(contrib, static_cast<std::size_t>(q) * len + i, t);
    store_from_f32(out, i, t, acc);
  }
}

void check_float_dtype(DType t, const char* collective) {
  if (t != DType::f32 && t != DType::bf16 && t != DType::f16)
    throw InputError(std::string(collective) + ": dtype " + dtype_name(t) +
                     " is not a training dtype (fp32, bf16, fp16)");
}

std::string rank_of(int rank, int size) {
  return "rank " + std::to_string(rank) + " of " + std::to_string(size);
}

std::string timeout_message(const std::string& what, int rank, int size, double waited,
                            double timeout, const std::string& waiting_for) {
  std::ostringstream s;
  s << what << ": " << rank_of(rank, size) << " waited " << std::fixed << std::setprecision(1)
    << waited << " s (--collective-timeout " << std::defaultfloat << timeout << ") " << waiting_for;
  return s.str();
}

}  // namespace comm

namespace {

bool parse_int(const char* text, int& out) {
  if (!text || !*text) return false;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (*end != '\0' || v < 0 || v > 1 << 30) return false;
  out = static_cast<int>(v);
  return true;
}

}  // namespace

LaunchInfo detect_launch(const std::function<const char*(const char*)>& env) {
  LaunchInfo li;
  // Size variables first (they say how many), then the rank-only ones (PMIx).
  static const char* const kSize[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
  static const char* const kRank[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
  for (int k = 0; k < 3; ++k) {
    int n = 0;
    if (parse_int(env(kSize[k]), n)) {
      li.under_mpi = true;
      li.evidence = std::string(kSize[k]) + "=" + env(kSize[k]);
      li.size = std::max(n, 1);
      parse_int(env(kRank[k]), li.rank);
      break;
    }
  }
  if (!li.under_mpi && env("PMIX_RANK")) {
    li.under_mpi = true;
    li.evidence = std::string("PMIX_RANK=") + env("PMIX_RANK");
    parse_int(env("PMIX_RANK"), li.rank);
  }
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    int v = 0;
    if (parse_int(env(name), v)) {
      li.local_rank = v;
      break;
    }
  }
  return li;
}

LaunchInfo detect_launch() {
  return detect_launch([](const char* name) { return std::getenv(name); });
}

bool mpi_built() {
#ifdef TRAINMEM_HAVE_MPI
  return true;
#else
  return false;
#endif
}

#ifndef TRAINMEM_HAVE_MPI
bool mpi_started() {
  return false;
}
#endif

bool nccl_built() {
#ifdef TRAINMEM_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

namespace {

// Size 1: sums and gathers are copies, nothing waits.
class LocalCollective final : public Collective {
 public:
  explicit LocalCollective(double timeout_s) : Collective(timeout_s) {}
  const char* backend() const override { return "local"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  void all_reduce_sum(void*, std::size_t, DType t) override {
    comm::check_float_dtype(t, "all_reduce_sum");
  }
  void reduce_scatter_sum(const void* send, void* recv, std::size_t n, DType t) override {
    comm::check_float_dtype(t, "reduce_scatter_sum");
    if (send != recv) std::memmove(recv, send, n * dtype_size(t));
  }
  void all_gather(const void* send, void* recv, std::size_t n, DType t) override {
    comm::check_float_dtype(t, "all_gather");
    if (send != recv) std::memmove(recv, send, n * dtype_size(t));
  }
  void broadcast(void*, std::size_t, DType t, int root) override {
    comm::check_float_dtype(t, "broadcast");
    peer_check(root, "broadcast");
  }
  void send(const void*, std::size_t, DType, int peer) override { peer_check(peer, "send"); }
  void recv(void*, std::size_t, DType, int peer) override { peer_check(peer, "recv"); }
  void barrier() override {}
  std::unique_ptr<Collective> split(int, int) override {
    return std::make_unique<LocalCollective>(timeout_s_);
  }
  std::optional<std::vector<int>> exchange_status(int status, double) override {
    return std::vector<int>{status};
  }
  [[noreturn]] void abort_job(int code) override { std::_Exit(code); }

 private:
  static void peer_check(int peer, const char* what) {
    if (peer != 0)
      throw InputError(std::string(what) + ": rank " + std::to_string(peer) +
                       " does not exist in a job of 1 rank");
    if (std::string(what) != "broadcast")
      throw InputError(std::string(what) + ": a rank cannot send to or receive from itself");
  }
};

}  // namespace

std::unique_ptr<Collective> make_local_collective(double timeout_s) {
  return std::make_unique<LocalCollective>(timeout_s);
}

#ifndef TRAINMEM_HAVE_MPI
std::unique_ptr<Collective> make_mpi_collective(double) {
  throw InputError(
      "this trainmem was built without MPI (libopenmpi-dev was not found when it was "
      "configured): install it (tools/setup.sh installs openmpi-bin and libopenmpi-dev) and "
      "rebuild to run several ranks");
}
#endif

#ifndef TRAINMEM_HAVE_NCCL
std::unique_ptr<Collective> make_nccl_collective(Collective&) {
  throw InputError(
      "--backend cuda on several ranks needs NCCL, and this trainmem was built without it (a "
      "CUDA build that finds MPI and nccl.h, libnccl in the CUDA folders has it); --backend cpu "
      "runs the ranks over MPI");
}
#endif

int end_job(Collective& world, int status, const std::string& message, std::ostream& err,
            double grace_s) {
  const int n = world.size();
  const std::string who = n > 1 ? comm::rank_of(world.rank(), n) + ": " : std::string();
  // "trainmem: error: ..." becomes "trainmem: rank 1 of 4: error: ...".
  auto prefixed = [&](const std::string& text) {
    const std::string head = "trainmem: ";
    if (who.empty()) return text;
    if (text.compare(0, head.size(), head) == 0) return head + who + text.substr(head.size());
    return head + who + text;
  };
  auto print = [&](const std::string& text) {
    if (text.empty()) return;
    err << prefixed(text) << (text.back() == '\n' ? "" : "\n");
    err.flush();
  };
  const double wait = status == 0 ? world.timeout() : std::min(grace_s, world.timeout());
  const auto all = world.exchange_status(status, wait);
  if (!all) {
    std::ostringstream why;
    if (status != 0) {
      print(message);
      why << "ending the whole job with exit code " << status
          << " (MPI_Abort): the other ranks did not reach the end-of-job check within " << wait
          << " s (they may be waiting in a collective this rank left)";
    } else {
      why << "ending the whole job with exit code 1 (MPI_Abort): this rank finished but the "
             "others did not reach the end-of-job check within "
          << wait << " s (--collective-timeout)";
    }
    print(why.str());
    world.abort_job(status != 0 ? status : 1);
  }
  const auto first = std::find_if(all->begin(), all->end(), [](int s) { return s != 0; });
  if (first == all->end()) return 0;
  const bool everyone_same =
      std::all_of(all->begin(), all->end(), [&](int s) { return s == *first; });
  if (status != 0) {
    if (!everyone_same)
      print(message);
    else if (world.rank() == 0)
      err << message << (message.empty() || message.back() == '\n' ? "" : "\n") << std::flush;
  }
  return *first;
}

}  // namespace trainmem
