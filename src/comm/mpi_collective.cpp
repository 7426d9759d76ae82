// MpiCollective: the collectives on host buffers over MPI (built when MPI is found), every call
// nonblocking and polled against the collective timeout. Sums are an all-to-all of the
// contributions, added by each element's owner in rank order, then an all-gather of the owners'
// results (include/trainmem/comm/collective.hpp says why this is bit-reproducible).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <thread>
#include <vector>

#include "comm_internal.hpp"
#include "trainmem/comm/collective.hpp"

namespace trainmem {
namespace {

// Elements per MPI call: byte counts and displacements are ints in MPI, so buffers are moved in
// segments of at most 2^28 elements (1 GiB of fp32).
constexpr std::size_t kSegment = std::size_t{1} << 28;

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

class MpiCollective final : public Collective {
 public:
  explicit MpiCollective(double timeout_s) : Collective(timeout_s) {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) {
      int provided = 0;
      // FUNNELED: only the main thread calls MPI (the cpu backend's OpenMP teams do not).
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
      owns_mpi_ = true;
    }
    // Errors come back as codes (and become exceptions naming the call), not MPI's default abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    // The data collectives and the end-of-job agreement each on a communicator of their own, so
    // that neither can match the other (or a caller's MPI_COMM_WORLD traffic).
    check(MPI_Comm_dup(MPI_COMM_WORLD, &data_), "MPI_Comm_dup");
    check(MPI_Comm_dup(MPI_COMM_WORLD, &control_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(data_, &rank_);
    MPI_Comm_size(data_, &size_);
    // The launcher's local rank when it says (it is what binds processes to cores and GPUs),
    // else the rank among the processes that share this node's memory.
    const LaunchInfo li = detect_launch();
    if (li.local_rank >= 0) {
      local_rank_ = li.local_rank;
    } else {
      MPI_Comm node;
      check(MPI_Comm_split_type(data_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
      MPI_Comm_rank(node, &local_rank_);
      MPI_Comm_free(&node);
    }
  }

  // The ranks of `parent` with `color`, ordered by `key` (split()).
  MpiCollective(MpiCollective& parent, int color, int key)
      : Collective(parent.timeout_s_), local_rank_(parent.local_rank_) {
    // MPI_Comm_split blocks without a bound: a bounded barrier first turns a rank that never
    // arrives into a timeout naming the split (the split itself then finds everyone there).
    MPI_Request req;
    check(MPI_Ibarrier(parent.data_, &req), "MPI_Ibarrier (split)");
    parent.wait_for(&req, "split into groups", "for the other ranks to reach it");
    check(MPI_Comm_split(parent.data_, color, key, &data_), "MPI_Comm_split");
    check(MPI_Comm_split(parent.control_, color, key, &control_), "MPI_Comm_split");
    MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(data_, &rank_);
    MPI_Comm_size(data_, &size_);
  }

  std::unique_ptr<Collective> split(int color, int key) override {
    reap_sends();
    return std::make_unique<MpiCollective>(*this, color, key);
  }

  ~MpiCollective() override {
    if (aborted_) return;
    // Sends still in flight: waited for (bounded) on a normal end; during an exception's unwinding
    // (this rank failed, and its peers may never receive) or after a timeout, abandoned at once:
    // the requests are freed (MPI completes or drops them) and their staging buffers leaked, as
    // MPI may still read them, so that the failure reaches end_job without waiting.
    bool abandon = std::uncaught_exceptions() > 0;
    if (!abandon) {
      try {
        finish_sends();
      } catch (const std::exception&) {
        abandon = true;
      }
    }
    if (abandon) {
      for (auto& ps : sends_) {
        MPI_Request_free(&ps.req);
        new std::vector<unsigned char>(std::move(ps.data));
      }
      sends_.clear();
      return;  // the communicators are left to MPI_Finalize or MPI_Abort
    }
    MPI_Comm_free(&data_);
    MPI_Comm_free(&control_);
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (owns_mpi_ && !finalised) MPI_Finalize();
  }

  const char* backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }

  void all_reduce_sum(void* buf, std::size_t count, DType t) override {
    comm::check_float_dtype(t, "all_reduce_sum");
    const std::size_t es = dtype_size(t);
    auto* bytes = static_cast<unsigned char*>(buf);
    for (std::size_t off = 0; off < count; off += kSegment) {
      const std::size_t n = std::min(kSegment, count - off);
      all_reduce_segment(bytes + off * es, n, t);
    }
  }

  void reduce_scatter_sum(const void* send, void* recv, std::size_t recv_count, DType t) override {
    comm::check_float_dtype(t, "reduce_scatter_sum");
    const std::size_t es = dtype_size(t);
    const auto* in = static_cast<const unsigned char*>(send);
    auto* out = static_cast<unsigned char*>(recv);
    for (std::size_t off = 0; off < recv_count; off += kSegment) {
      const std::size_t n = std::min(kSegment, recv_count - off);
      // Block r of this segment: elements [r·recv_count + off, + n) of send, for rank r.
      std::vector<int> scounts(size_), sdispls(size_), rcounts(size_), rdispls(size_);
      // Block r's piece of this segment goes to rank r. When the displacements in `send` do
      // not fit an int, the pieces are packed side by side first.
      const bool direct = fits_int(static_cast<std::size_t>(size_) * recv_count * es);
      if (!direct) pack_.resize(static_cast<std::size_t>(size_) * n * es);
      for (int r = 0; r < size_; ++r) {
        const std::size_t ur = static_cast<std::size_t>(r);
        if (!direct)
          std::memcpy(pack_.data() + ur * n * es, in + (ur * recv_count + off) * es, n * es);
        scounts[r] = rcounts[r] = static_cast<int>(n * es);
        sdispls[r] = static_cast<int>(direct ? (ur * recv_count + off) * es : ur * n * es);
        rdispls[r] = static_cast<int>(ur * n * es);
      }
      contrib_.resize(static_cast<std::size_t>(size_) * n * es);
      MPI_Request req;
      check(MPI_Ialltoallv(direct ? in : pack_.data(), scounts.data(), sdispls.data(), MPI_BYTE,
                           contrib_.data(), rcounts.data(), rdispls.data(), MPI_BYTE, data_, &req),
            "MPI_Ialltoallv (reduce_scatter_sum)");
      wait(&req, "reduce_scatter_sum", n, t);
      comm::sum_in_rank_order(contrib_.data(), size_, n, t, out + off * es);
    }
  }

  void all_gather(const void* send, void* recv, std::size_t send_count, DType t) override {
    comm::check_float_dtype(t, "all_gather");
    const std::size_t es = dtype_size(t);
    const auto* in = static_cast<const unsigned char*>(send);
    auto* out = static_cast<unsigned char*>(recv);
    // Rank r's piece lands at r·send_count; when those displacements do not fit an int, each
    // segment is gathered side by side into a packed buffer and then placed.
    const bool direct = fits_int(static_cast<std::size_t>(size_) * send_count * es);
    const bool in_place = in == out + static_cast<std::size_t>(rank_) * send_count * es;
    for (std::size_t off = 0; off < send_count; off += kSegment) {
      const std::size_t n = std::min(kSegment, send_count - off);
      std::vector<int> counts(size_, static_cast<int>(n * es)), displs(size_);
      for (int r = 0; r < size_; ++r)
        displs[r] = static_cast<int>(static_cast<std::size_t>(r) * (direct ? send_count : n) * es);
      if (!direct) pack_.resize(static_cast<std::size_t>(size_) * n * es);
      MPI_Request req;
      check(MPI_Iallgatherv(direct && in_place ? MPI_IN_PLACE : in + off * es,
                            static_cast<int>(n * es), MPI_BYTE,
                            direct ? out + off * es : pack_.data(), counts.data(), displs.data(),
                            MPI_BYTE, data_, &req),
            "MPI_Iallgatherv (all_gather)");
      wait(&req, "all_gather", n, t);
      if (!direct)
        for (int r = 0; r < size_; ++r)
          std::memcpy(out + (static_cast<std::size_t>(r) * send_count + off) * es,
                      pack_.data() + static_cast<std::size_t>(r) * n * es, n * es);
    }
  }

  void broadcast(void* buf, std::size_t count, DType t, int root) override {
    comm::check_float_dtype(t, "broadcast");
    check_peer(root, "broadcast", true);
    const std::size_t es = dtype_size(t);
    auto* bytes = static_cast<unsigned char*>(buf);
    for (std::size_t off = 0; off < count; off += kSegment) {
      const std::size_t n = std::min(kSegment, count - off);
      MPI_Request req;
      check(MPI_Ibcast(bytes + off * es, static_cast<int>(n * es), MPI_BYTE, root, data_, &req),
            "MPI_Ibcast (broadcast)");
      wait(&req, "broadcast from rank " + std::to_string(root), n, t);
    }
  }

  // MPI_Ialltoallv on a contiguous datatype of one row, so that the counts and displacements
  // (in rows) stay ints however many bytes move; a row past 2^31 − 1 bytes, or rows past
  // 2^31 − 1 in all, are refused naming the collective.
  void all_to_all_v(const void* send, const std::size_t* send_rows, void* recv,
                    const std::size_t* recv_rows, std::size_t row, DType t) override {
    comm::check_rows(row, "all_to_all_v");
    RowType rt(row, t, "all_to_all_v");
    std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
    const std::size_t so = row_counts(send_rows, sc, sd, "all_to_all_v");
    row_counts(recv_rows, rc, rd, "all_to_all_v");
    MPI_Request req;
    check(MPI_Ialltoallv(send, sc.data(), sd.data(), rt.type, recv, rc.data(), rd.data(), rt.type,
                         data_, &req),
          "MPI_Ialltoallv (all_to_all_v)");
    wait(&req, "all_to_all_v", so * row, t);
  }

  // MPI_Iallgatherv on a contiguous row type (counts and displacements in rows).
  void all_gather_v(const void* send, std::size_t send_rows, void* recv,
                    const std::size_t* recv_rows, std::size_t row, DType t) override {
    comm::check_rows(row, "all_gather_v");
    comm::check_own_rows(send_rows, recv_rows[rank_], rank_, "all_gather_v");
    std::vector<int> rc(size_), rd(size_);
    const std::size_t total = row_counts(recv_rows, rc, rd, "all_gather_v");
    RowType rt(row, t, "all_gather_v");
    MPI_Request req;
    check(MPI_Iallgatherv(send, static_cast<int>(send_rows), rt.type, recv, rc.data(), rd.data(),
                          rt.type, data_, &req),
          "MPI_Iallgatherv (all_gather_v)");
    wait(&req, "all_gather_v", total * row, t);
  }

  // Each block to its rank (MPI_Ialltoallv of rows), then each rank adds the size() blocks it
  // received in rank order (comm::sum_in_rank_order), as reduce_scatter_sum does.
  void reduce_scatter_sum_v(const void* send, const std::size_t* rows, void* recv, std::size_t row,
                            DType t) override {
    comm::check_float_dtype(t, "reduce_scatter_sum_v");
    comm::check_rows(row, "reduce_scatter_sum_v");
    const std::size_t mine = rows[rank_], es = dtype_size(t);
    std::vector<int> sc(size_), sd(size_);
    row_counts(rows, sc, sd, "reduce_scatter_sum_v");
    std::vector<std::size_t> theirs(static_cast<std::size_t>(size_), mine);
    std::vector<int> rc(size_), rd(size_);
    row_counts(theirs.data(), rc, rd, "reduce_scatter_sum_v");
    if (mine == 0 && std::all_of(sc.begin(), sc.end(), [](int c) { return c == 0; })) return;
    contrib_.resize(static_cast<std::size_t>(size_) * mine * row * es);
    RowType rt(row, t, "reduce_scatter_sum_v");
    MPI_Request req;
    check(MPI_Ialltoallv(send, sc.data(), sd.data(), rt.type, contrib_.data(), rc.data(), rd.data(),
                         rt.type, data_, &req),
          "MPI_Ialltoallv (reduce_scatter_sum_v)");
    wait(&req, "reduce_scatter_sum_v", mine * row, t);
    if (mine > 0) comm::sum_in_rank_order(contrib_.data(), size_, mine * row, t, recv);
  }

  // Staged: the data is copied into a buffer of this collective's and sent without waiting, so
  // two stages that send to each other before receiving (the 1F1B schedule's forward output
  // and backward gradient crossing) cannot deadlock. Completed sends are reaped at every send
  // and waited for (bounded) by barrier() and the destructor.
  void send(const void* buf, std::size_t count, DType t, int peer) override {
    check_peer(peer, "send", false);
    reap_sends();
    const std::size_t es = dtype_size(t);
    const auto* bytes = static_cast<const unsigned char*>(buf);
    for (std::size_t off = 0; off < count; off += kSegment) {
      const std::size_t n = std::min(kSegment, count - off);
      PendingSend ps;
      ps.data.assign(bytes + off * es, bytes + (off + n) * es);
      ps.peer = peer;
      ps.n = n;
      ps.t = t;
      check(
          MPI_Isend(ps.data.data(), static_cast<int>(n * es), MPI_BYTE, peer, kTag, data_, &ps.req),
          "MPI_Isend (send)");
      sends_.push_back(std::move(ps));
    }
  }

  void recv(void* buf, std::size_t count, DType t, int peer) override {
    check_peer(peer, "recv", false);
    const std::size_t es = dtype_size(t);
    auto* bytes = static_cast<unsigned char*>(buf);
    for (std::size_t off = 0; off < count; off += kSegment) {
      const std::size_t n = std::min(kSegment, count - off);
      MPI_Request req;
      check(
          MPI_Irecv(bytes + off * es, static_cast<int>(n * es), MPI_BYTE, peer, kTag, data_, &req),
          "MPI_Irecv (recv)");
      wait(&req, "recv from rank " + std::to_string(peer), n, t, peer);
    }
  }

  void barrier() override {
    finish_sends();
    MPI_Request req;
    check(MPI_Ibarrier(data_, &req), "MPI_Ibarrier (barrier)");
    wait_for(&req, "barrier", "for the other ranks to reach it");
  }

  std::optional<std::vector<int>> exchange_status(int status, double wait_s) override {
    // Heap buffers, left allocated when the exchange does not complete: MPI may still write
    // into them while abort_job runs.
    auto* all = new std::vector<int>(static_cast<std::size_t>(size_), 0);
    auto* mine = new int(status);
    MPI_Request req;
    if (MPI_Iallgather(mine, 1, MPI_INT, all->data(), 1, MPI_INT, control_, &req) != MPI_SUCCESS)
      return std::nullopt;
    if (poll(&req, wait_s) != MPI_SUCCESS) return std::nullopt;  // abort_job follows
    std::vector<int> out = std::move(*all);
    delete all;
    delete mine;
    return out;
  }

  [[noreturn]] void abort_job(int code) override {
    aborted_ = true;
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; in case it does
  }

 private:
  static constexpr int kTag = 15;

  static constexpr std::size_t kIntMax = 2147483647;
  static bool fits_int(std::size_t bytes) { return bytes <= kIntMax; }

  void check(int code, const char* call) const {
    if (code != MPI_SUCCESS)
      throw Error(std::string(call) + " failed on " + comm::rank_of(rank_, size_) + ": " +
                  mpi_error_text(code));
  }

  // A contiguous datatype of one row of `row` elements, freed when it goes out of scope; a row
  // past 2^31 − 1 bytes is refused naming the collective.
  struct RowType {
    MPI_Datatype type = MPI_DATATYPE_NULL;
    RowType(std::size_t row, DType t, const char* what) {
      const std::size_t es = dtype_size(t);
      if (row > kIntMax / es)
        throw InputError(std::string(what) + ": a row of " + std::to_string(row) + " " +
                         dtype_name(t) + " elements is past 2^31 - 1 bytes, MPI's count");
      int code = MPI_Type_contiguous(static_cast<int>(row * es), MPI_BYTE, &type);
      if (code == MPI_SUCCESS) code = MPI_Type_commit(&type);
      if (code != MPI_SUCCESS)
        throw Error(std::string("MPI_Type_contiguous (") + what + "): " + mpi_error_text(code));
    }
    ~RowType() {
      if (type != MPI_DATATYPE_NULL) MPI_Type_free(&type);
    }
    RowType(const RowType&) = delete;
    RowType& operator=(const RowType&) = delete;
  };

  // counts[p] = rows[p] and displs[p] = Σ_{q<p} rows[q] as ints (in rows); the total. More than
  // 2^31 − 1 rows in all is refused naming the collective.
  std::size_t row_counts(const std::size_t* rows, std::vector<int>& counts,
                         std::vector<int>& displs, const char* what) const {
    std::size_t total = 0;
    for (int p = 0; p < size_; ++p) {
      if (total > kIntMax || rows[p] > kIntMax - total)
        throw InputError(std::string(what) + ": more than 2^31 - 1 rows sent or received by " +
                         comm::rank_of(rank_, size_));
      counts[p] = static_cast<int>(rows[p]);
      displs[p] = static_cast<int>(total);
      total += rows[p];
    }
    return total;
  }

  void check_peer(int peer, const char* what, bool self_ok) const {
    if (peer < 0 || peer >= size_)
      throw InputError(std::string(what) + ": rank " + std::to_string(peer) +
                       " does not exist in a job of " + std::to_string(size_) + " ranks");
    if (!self_ok && peer == rank_)
      throw InputError(std::string(what) + ": " + comm::rank_of(rank_, size_) +
                       " cannot send to or receive from itself");
  }

  // Waits for `req` at most `wait_s` seconds, driving MPI's progress: MPI_SUCCESS when it
  // completed, -1 on the timeout, or MPI's error code. Spins briefly, then yields and sleeps
  // (oversubscribed ranks share cores).
  static int poll(MPI_Request* req, double wait_s) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    for (unsigned spin = 0;; ++spin) {
      int done = 0;
      const int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return rc;
      if (done) return MPI_SUCCESS;
      if (std::chrono::duration<double>(clock::now() - start).count() > wait_s) return -1;
      if (spin < 64)
        continue;
      else if (spin < 1024)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  void wait_for(MPI_Request* req, const std::string& what, const std::string& waiting_for) {
    const auto start = std::chrono::steady_clock::now();
    const int rc = poll(req, timeout_s_);
    if (rc == MPI_SUCCESS) return;
    if (rc != -1)
      throw Error(what + " failed on " + comm::rank_of(rank_, size_) + ": " + mpi_error_text(rc));
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // The request cannot be cancelled (MPI has no cancel for collectives) and MPI may still
    // write into its buffers (counts, staging, the caller's tensors): unwinding would free them
    // under it, and the next MPI call (the end-of-job agreement's progress, a peer's
    // single-copy write) would corrupt the heap. So the rank says what timed out and ends the
    // whole job here, with every buffer still alive.
    const std::string who = comm::rank_of(rank_, size_);
    std::fprintf(
        stderr,
        "trainmem: %s: error: %s\ntrainmem: %s: ending the whole job with exit code 1 "
        "(MPI_Abort) at the timeout: the timed-out request may still write into this "
        "rank's buffers, so the rank does not unwind\n",
        who.c_str(),
        comm::timeout_message(what + " timed out", rank_, size_, waited, timeout_s_, waiting_for)
            .c_str(),
        who.c_str());
    std::fflush(stderr);
    abort_job(1);
  }

  void wait(MPI_Request* req, const std::string& what, std::size_t n, DType t, int peer = -1) {
    const std::string desc = what + " (" + std::to_string(n) + " " + dtype_name(t) + ")";
    wait_for(req, desc,
             peer >= 0 ? "for rank " + std::to_string(peer) + ", which never matched it"
                       : "for the other " + std::to_string(size_ - 1) +
                             " rank(s); at least one never joined (stuck or failed)");
  }

  // One segment of all_reduce_sum: rank r owns elements [start_r, start_r + len_r) (the
  // segment cut in size() near-equal pieces, the first n % size() one longer).
  void all_reduce_segment(unsigned char* buf, std::size_t n, DType t) {
    const std::size_t es = dtype_size(t);
    const std::size_t base = n / static_cast<std::size_t>(size_);
    const std::size_t rem = n % static_cast<std::size_t>(size_);
    auto start = [&](int r) {
      const auto ur = static_cast<std::size_t>(r);
      return ur * base + std::min(ur, rem);
    };
    auto len = [&](int r) { return base + (static_cast<std::size_t>(r) < rem ? 1 : 0); };
    const std::size_t mine = len(rank_);
    std::vector<int> scounts(size_), sdispls(size_), rcounts(size_), rdispls(size_);
    for (int r = 0; r < size_; ++r) {
      scounts[r] = static_cast<int>(len(r) * es);
      sdispls[r] = static_cast<int>(start(r) * es);
      rcounts[r] = static_cast<int>(mine * es);
      rdispls[r] = static_cast<int>(static_cast<std::size_t>(r) * mine * es);
    }
    contrib_.resize(static_cast<std::size_t>(size_) * mine * es);
    MPI_Request req;
    check(MPI_Ialltoallv(buf, scounts.data(), sdispls.data(), MPI_BYTE, contrib_.data(),
                         rcounts.data(), rdispls.data(), MPI_BYTE, data_, &req),
          "MPI_Ialltoallv (all_reduce_sum)");
    wait(&req, "all_reduce_sum", n, t);
    comm::sum_in_rank_order(contrib_.data(), size_, mine, t, buf + start(rank_) * es);
    // Every owner's result to every rank, in place.
    for (int r = 0; r < size_; ++r) {
      rcounts[r] = scounts[r];
      rdispls[r] = sdispls[r];
    }
    check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, buf, rcounts.data(), rdispls.data(), MPI_BYTE,
                          data_, &req),
          "MPI_Iallgatherv (all_reduce_sum)");
    wait(&req, "all_reduce_sum", n, t);
  }

  struct PendingSend {
    MPI_Request req = MPI_REQUEST_NULL;
    std::vector<unsigned char> data;
    int peer = 0;
    std::size_t n = 0;
    DType t = DType::f32;
  };
  // Frees the staging buffers of the sends that completed.
  void reap_sends() {
    for (auto it = sends_.begin(); it != sends_.end();) {
      int done = 0;
      check(MPI_Test(&it->req, &done, MPI_STATUS_IGNORE), "MPI_Test (send)");
      it = done ? sends_.erase(it) : std::next(it);
    }
  }
  // Waits (each at most the timeout) for every send in flight.
  void finish_sends() {
    while (!sends_.empty()) {
      PendingSend& ps = sends_.front();
      wait(&ps.req, "send to rank " + std::to_string(ps.peer), ps.n, ps.t, ps.peer);
      sends_.pop_front();
    }
  }

  MPI_Comm data_ = MPI_COMM_NULL, control_ = MPI_COMM_NULL;
  std::deque<PendingSend> sends_;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  bool owns_mpi_ = false, aborted_ = false;
  std::vector<unsigned char> contrib_, pack_;  // reused between calls
};

}  // namespace

bool mpi_started() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  return initialised != 0;
}

std::unique_ptr<Collective> make_mpi_collective(double timeout_s) {
  check_collective_timeout(timeout_s);
  return std::make_unique<MpiCollective>(timeout_s);
}

}  // namespace trainmem
