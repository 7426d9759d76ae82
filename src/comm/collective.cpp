// The launch detection, the local collective, the end-of-job policy, and, in a build without
// MPI or NCCL, the factories that refuse with exit 2 saying what to install
// (include/trainmem/comm/collective.hpp).
#include "trainmem/comm/collective.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <map>
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

void check_rows(std::size_t row, const char* collective) {
  if (row == 0) throw InputError(std::string(collective) + ": a row of 0 elements");
}

void check_own_rows(std::size_t send_rows, std::size_t expected, int rank, const char* collective) {
  if (send_rows != expected)
    throw InputError(std::string(collective) + ": rank " + std::to_string(rank) + " sends " +
                     std::to_string(send_rows) + " rows and the ranks expect " +
                     std::to_string(expected) + " from it");
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
  void all_to_all_v(const void* send, const std::size_t* send_rows, void* recv,
                    const std::size_t* recv_rows, std::size_t row, DType t) override {
    comm::check_rows(row, "all_to_all_v");
    if (send_rows[0] != recv_rows[0])
      throw InputError("all_to_all_v: rank 0 sends itself " + std::to_string(send_rows[0]) +
                       " rows and expects " + std::to_string(recv_rows[0]));
    if (send != recv && send_rows[0] > 0)
      std::memmove(recv, send, send_rows[0] * row * dtype_size(t));
  }
  void all_gather_v(const void* send, std::size_t send_rows, void* recv,
                    const std::size_t* recv_rows, std::size_t row, DType t) override {
    comm::check_rows(row, "all_gather_v");
    comm::check_own_rows(send_rows, recv_rows[0], 0, "all_gather_v");
    if (send != recv && send_rows > 0) std::memmove(recv, send, send_rows * row * dtype_size(t));
  }
  void reduce_scatter_sum_v(const void* send, const std::size_t* rows, void* recv, std::size_t row,
                            DType t) override {
    comm::check_float_dtype(t, "reduce_scatter_sum_v");
    comm::check_rows(row, "reduce_scatter_sum_v");
    if (send != recv && rows[0] > 0) std::memmove(recv, send, rows[0] * row * dtype_size(t));
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

void check_collective_timeout(double seconds) {
  if (!(seconds >= kMinCollectiveTimeout && seconds <= kMaxCollectiveTimeout)) {
    std::ostringstream s;
    s << "--collective-timeout must be between " << kMinCollectiveTimeout << " and "
      << kMaxCollectiveTimeout << " seconds (a week), got " << seconds;
    throw InputError(s.str());
  }
}

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

// ------------------------------------------------------------------ the ranks' agreement

namespace {

constexpr std::size_t kRequestRecord = 16384;  // bytes per rank in the second all-gather
constexpr std::size_t kRequestValue = 100;     // characters of a value kept

std::uint64_t fnv1a(const std::string& text, std::uint64_t h = 14695981039346656037ull) {
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex64(std::uint64_t v) {
  std::ostringstream s;
  s << std::hex << std::setw(16) << std::setfill('0') << v;
  return s.str();
}

// One line per entry: name, unit separator, value, record separator. A long value keeps its
// first kRequestValue characters, its length and its digest (still unequal when it differs).
std::string serialise(const RequestLines& request) {
  std::string out;
  for (const auto& [name, value] : request) {
    out += name.substr(0, kRequestValue);
    out += '\x1f';
    if (value.size() <= kRequestValue)
      out += value;
    else
      out += value.substr(0, kRequestValue) + "... (" + std::to_string(value.size()) +
             " characters, digest " + hex64(fnv1a(value)) + ")";
    out += '\x1e';
  }
  return out;
}

RequestLines parse(const std::string& text) {
  RequestLines out;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = text.find('\x1e', at);
    const std::string line =
        text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    const std::size_t sep = line.find('\x1f');
    if (sep == std::string::npos)
      out.emplace_back(line, "");
    else
      out.emplace_back(line.substr(0, sep), line.substr(sep + 1));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return out;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream s;
  s << (ranks.size() == 1 ? "rank " : "ranks ");
  for (std::size_t k = 0; k < ranks.size() && k < 8; ++k) s << (k ? ", " : "") << ranks[k];
  if (ranks.size() > 8) s << " and " << ranks.size() - 8 << " more";
  return s.str();
}

}  // namespace

std::optional<std::string> request_disagreement(const std::vector<RequestLines>& ranks) {
  if (std::all_of(ranks.begin(), ranks.end(), [&](const RequestLines& r) { return r == ranks[0]; }))
    return std::nullopt;
  // Every entry name, in the order first seen (rank 0's order, then any others').
  std::vector<std::string> names;
  std::vector<std::map<std::string, std::string>> by_rank;
  for (const auto& r : ranks) {
    std::map<std::string, std::string> m;
    for (const auto& [name, value] : r) {
      if (!m.count(name) && std::find(names.begin(), names.end(), name) == names.end())
        names.push_back(name);
      m.emplace(name, value);
    }
    by_rank.push_back(std::move(m));
  }
  const std::string absent = "(not given)";
  for (const auto& name : names) {
    // The values in the order of the first rank that holds each, with their ranks.
    std::vector<std::pair<std::string, std::vector<int>>> values;
    for (std::size_t r = 0; r < by_rank.size(); ++r) {
      const auto it = by_rank[r].find(name);
      const std::string v = it == by_rank[r].end() ? absent : it->second;
      auto slot =
          std::find_if(values.begin(), values.end(), [&](const auto& e) { return e.first == v; });
      if (slot == values.end()) {
        values.push_back({v, {}});
        slot = values.end() - 1;
      }
      slot->second.push_back(static_cast<int>(r));
    }
    if (values.size() < 2) continue;
    std::ostringstream s;
    s << "the ranks were started with different requests: " << name << " is ";
    for (std::size_t k = 0; k < values.size() && k < 4; ++k) {
      const std::string& v = values[k].first;
      s << (k ? (k + 1 == values.size() || k == 3 ? " and " : ", ") : "")
        << (v == absent ? v : "'" + v + "'") << " on " << rank_list(values[k].second);
    }
    if (values.size() > 4) s << " (and " << values.size() - 4 << " more values)";
    s << "; every rank must run the same command with the same files (mpirun's `A : B` form "
         "started different ones)";
    return s.str();
  }
  return std::string(
      "the ranks were started with different requests (they differ beyond the first " +
      std::to_string(kRequestRecord) +
      " bytes compared); every rank must run the same command "
      "with the same files");
}

void agree_on_request(Collective& world, const RequestLines& request) {
  const int n = world.size();
  if (n < 2) return;
  const std::string text = serialise(request);
  // 1. The digests (two fp32 slots carry the 64 bits; all_gather moves bytes, no arithmetic).
  const std::uint64_t mine = fnv1a(text);
  std::vector<std::uint64_t> digests(static_cast<std::size_t>(n), 0);
  world.all_gather(&mine, digests.data(), 2, DType::f32);
  if (std::all_of(digests.begin(), digests.end(), [&](std::uint64_t d) { return d == digests[0]; }))
    return;
  // 2. Only when they differ: every rank's request, a fixed-size record each.
  std::vector<unsigned char> record(kRequestRecord, 0);
  const std::uint32_t len =
      static_cast<std::uint32_t>(std::min(text.size(), kRequestRecord - sizeof(std::uint32_t)));
  std::memcpy(record.data(), &len, sizeof len);
  std::memcpy(record.data() + sizeof len, text.data(), len);
  std::vector<unsigned char> all(kRequestRecord * static_cast<std::size_t>(n));
  world.all_gather(record.data(), all.data(), kRequestRecord / 4, DType::f32);
  std::vector<RequestLines> ranks;
  for (int r = 0; r < n; ++r) {
    const unsigned char* rec = all.data() + kRequestRecord * static_cast<std::size_t>(r);
    std::uint32_t l = 0;
    std::memcpy(&l, rec, sizeof l);
    l = std::min<std::uint32_t>(l, kRequestRecord - sizeof l);
    ranks.push_back(parse(std::string(reinterpret_cast<const char*>(rec + sizeof l), l)));
  }
  const auto why = request_disagreement(ranks);
  throw InputError(why ? *why
                       : "the ranks were started with different requests (their digests differ)");
}

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
