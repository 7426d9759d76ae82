// NcclCollective: the collectives on device buffers over NCCL (CUDA builds with MPI and NCCL).
// The unique id is broadcast over MPI (as nccl-tests does); each rank drives the device numbered
// by its local rank. The communicator is nonblocking (ncclConfig_t.blocking = 0) so that every
// wait, its initialisation included, polls ncclCommGetAsyncError and the stream against the
// collective timeout; on the timeout the communicator is aborted (ncclCommAbort) and
// CollectiveTimeout names the collective. Every NCCL error becomes a DeviceError naming the call
// and ncclGetErrorString. The collectives run on a stream of their own that synchronises with
// the legacy default stream, and return when their results are in place.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "comm_internal.hpp"
#include "nccl_convert.hpp"
#include "trainmem/base/cuda_check.hpp"
#include "trainmem/comm/collective.hpp"

namespace trainmem {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    default:
      throw InputError(std::string("NCCL collectives: dtype ") + dtype_name(t) +
                       " is not a training dtype (fp32, bf16, fp16)");
  }
}

class NcclCollective final : public Collective {
 public:
  explicit NcclCollective(Collective& mpi) : Collective(mpi.timeout()), mpi_(&mpi) {
    rank_ = mpi_->rank();
    size_ = mpi_->size();
    int devices = 0;
    const cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices == 0)
      throw InputError("--backend cuda: " + comm::rank_of(rank_, size_) +
                       " has no usable CUDA device (" +
                       (e != cudaSuccess ? detail::cuda_error_string(e) : "0 devices") + ")");
    device_ = mpi_->local_rank();
    if (device_ >= devices)
      throw InputError("--backend cuda: " + comm::rank_of(rank_, size_) + " is local rank " +
                       std::to_string(device_) + " on its node, which has " +
                       std::to_string(devices) +
                       " CUDA device(s): start at most one rank per device on each node "
                       "(mpirun --map-by ppr:" +
                       std::to_string(devices) +
                       ":node, srun --ntasks-per-node=" + std::to_string(devices) + ")");
    TM_CUDA_CHECK(cudaSetDevice(device_));
    ncclUniqueId id{};
    if (rank_ == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    static_assert(sizeof(id) % 4 == 0, "the id travels as 4-byte words");
    mpi_->broadcast(&id, sizeof(id) / 4, DType::f32, 0);  // bytes, not read as floats
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRankConfig");
    wait_comm("ncclCommInitRankConfig");
    TM_CUDA_CHECK(cudaStreamCreate(&stream_));
  }

  ~NcclCollective() override {
    if (!aborted_ && comm_) {
      // Nonblocking communicator: finalize, wait (bounded) for it, then destroy; errors are
      // ignored here (a destructor), they were reported by the calls that met them.
      ncclCommFinalize(comm_);
      const auto start = std::chrono::steady_clock::now();
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress &&
             seconds_since(start) < timeout_s_)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ncclCommDestroy(comm_);
    }
    if (work_) cudaFree(work_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  const char* backend() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return mpi_->local_rank(); }

  // A communicator of its own over the MPI split (its unique id broadcast there); it owns that
  // MPI group.
  std::unique_ptr<Collective> split(int color, int key) override {
    std::unique_ptr<Collective> sub_mpi = mpi_->split(color, key);
    auto sub = std::make_unique<NcclCollective>(*sub_mpi);
    sub->owned_mpi_ = std::move(sub_mpi);
    return sub;
  }

  void all_reduce_sum(void* buf, std::size_t count, DType t) override {
    comm::check_float_dtype(t, "all_reduce_sum");
    if (count == 0) return;
    if (t == DType::f32) {
      enqueue(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm_, stream_),
              "ncclAllReduce");
    } else {
      float* w = work(count);
      comm::to_f32_async(buf, w, count, t, stream_);
      enqueue(ncclAllReduce(w, w, count, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
      comm::from_f32_async(w, buf, count, t, stream_);
    }
    finish("all_reduce_sum", count, t);
  }

  void reduce_scatter_sum(const void* send, void* recv, std::size_t n, DType t) override {
    comm::check_float_dtype(t, "reduce_scatter_sum");
    if (n == 0) return;
    if (t == DType::f32) {
      enqueue(ncclReduceScatter(send, recv, n, ncclFloat32, ncclSum, comm_, stream_),
              "ncclReduceScatter");
    } else {
      const std::size_t total = static_cast<std::size_t>(size_) * n;
      float* w = work(total + n);
      comm::to_f32_async(send, w, total, t, stream_);
      enqueue(ncclReduceScatter(w, w + total, n, ncclFloat32, ncclSum, comm_, stream_),
              "ncclReduceScatter");
      comm::from_f32_async(w + total, recv, n, t, stream_);
    }
    finish("reduce_scatter_sum", n, t);
  }

  void all_gather(const void* send, void* recv, std::size_t n, DType t) override {
    if (n == 0) return;
    enqueue(ncclAllGather(send, recv, n, nccl_type(t), comm_, stream_), "ncclAllGather");
    finish("all_gather", n, t);
  }

  void broadcast(void* buf, std::size_t count, DType t, int root) override {
    check_peer(root, "broadcast", true);
    if (count == 0) return;
    enqueue(ncclBroadcast(buf, buf, count, nccl_type(t), root, comm_, stream_), "ncclBroadcast");
    finish("broadcast from rank " + std::to_string(root), count, t);
  }

  // Per-peer ncclSend/ncclRecv in one group (NCCL has no all-to-all-v of its own); int32 as
  // ncclInt32, the training dtypes as themselves.
  void all_to_all_v(const void* send, const std::size_t* send_rows, void* recv,
                    const std::size_t* recv_rows, std::size_t row, DType t) override {
    comm::check_rows(row, "all_to_all_v");
    const ncclDataType_t nt = t == DType::i32 ? ncclInt32 : nccl_type(t);
    const std::size_t es = dtype_size(t);
    const auto* s = static_cast<const unsigned char*>(send);
    auto* r = static_cast<unsigned char*>(recv);
    std::size_t so = 0, ro = 0, total = 0;
    enqueue(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < size_; ++p) {
      const std::size_t sn = send_rows[p] * row, rn = recv_rows[p] * row;
      if (sn) enqueue(ncclSend(s + so * es, sn, nt, p, comm_, stream_), "ncclSend");
      if (rn) enqueue(ncclRecv(r + ro * es, rn, nt, p, comm_, stream_), "ncclRecv");
      so += sn;
      ro += rn;
      total += sn;
    }
    enqueue(ncclGroupEnd(), "ncclGroupEnd");
    finish("all_to_all_v", total, t);
  }

  // One ncclBroadcast per rank in one group, each rank's rows from its place in recv (its own
  // copied there first); int32 as ncclInt32.
  void all_gather_v(const void* send, std::size_t send_rows, void* recv,
                    const std::size_t* recv_rows, std::size_t row, DType t) override {
    comm::check_rows(row, "all_gather_v");
    comm::check_own_rows(send_rows, recv_rows[rank_], rank_, "all_gather_v");
    const ncclDataType_t nt = t == DType::i32 ? ncclInt32 : nccl_type(t);
    const std::size_t es = dtype_size(t);
    auto* r = static_cast<unsigned char*>(recv);
    std::size_t off = 0, total = 0;
    for (int p = 0; p < rank_; ++p) off += recv_rows[p];
    if (send_rows && send != r + off * row * es)
      TM_CUDA_CHECK(cudaMemcpyAsync(r + off * row * es, send, send_rows * row * es,
                                    cudaMemcpyDeviceToDevice, stream_));
    off = 0;
    enqueue(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < size_; ++p) {
      const std::size_t n = recv_rows[p] * row;
      if (n)
        enqueue(ncclBroadcast(r + off * es, r + off * es, n, nt, p, comm_, stream_),
                "ncclBroadcast");
      off += n;
      total += n;
    }
    enqueue(ncclGroupEnd(), "ncclGroupEnd");
    finish("all_gather_v", total, t);
  }

  // One ncclReduce per rank in one group (block p summed into rank p's recv), in fp32 (16-bit
  // blocks widened and the result rounded once, as reduce_scatter_sum); NCCL's order of
  // addition is its own.
  void reduce_scatter_sum_v(const void* send, const std::size_t* rows, void* recv, std::size_t row,
                            DType t) override {
    comm::check_float_dtype(t, "reduce_scatter_sum_v");
    comm::check_rows(row, "reduce_scatter_sum_v");
    std::size_t total = 0;
    for (int p = 0; p < size_; ++p) total += rows[p] * row;
    if (total == 0) return;
    const std::size_t mine = rows[rank_] * row;
    const float* in = static_cast<const float*>(send);
    float* res = static_cast<float*>(recv);
    if (t != DType::f32) {
      float* w = work(total + mine);
      comm::to_f32_async(send, w, total, t, stream_);
      in = w;
      res = w + total;
    }
    std::size_t off = 0;
    enqueue(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < size_; ++p) {
      const std::size_t n = rows[p] * row;
      if (n)
        enqueue(ncclReduce(in + off, res, n, ncclFloat32, ncclSum, p, comm_, stream_),
                "ncclReduce");
      off += n;
    }
    enqueue(ncclGroupEnd(), "ncclGroupEnd");
    if (t != DType::f32 && mine) comm::from_f32_async(res, recv, mine, t, stream_);
    finish("reduce_scatter_sum_v", mine, t);
  }

  void send(const void* buf, std::size_t count, DType t, int peer) override {
    check_peer(peer, "send", false);
    if (count == 0) return;
    enqueue(ncclSend(buf, count, nccl_type(t), peer, comm_, stream_), "ncclSend");
    finish("send to rank " + std::to_string(peer), count, t);
  }

  void recv(void* buf, std::size_t count, DType t, int peer) override {
    check_peer(peer, "recv", false);
    if (count == 0) return;
    enqueue(ncclRecv(buf, count, nccl_type(t), peer, comm_, stream_), "ncclRecv");
    finish("recv from rank " + std::to_string(peer), count, t);
  }

  void barrier() override {
    wait_stream("barrier");
    mpi_->barrier();
  }

  std::optional<std::vector<int>> exchange_status(int status, double wait_s) override {
    return mpi_->exchange_status(status, wait_s);
  }

  [[noreturn]] void abort_job(int code) override {
    if (!aborted_ && comm_) ncclCommAbort(comm_);
    aborted_ = true;
    mpi_->abort_job(code);
    std::_Exit(code);  // abort_job does not return
  }

 private:
  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  std::string where() const {
    return comm::rank_of(rank_, size_) + " (device " + std::to_string(device_) + ")";
  }

  // ncclSuccess and, on the nonblocking communicator, ncclInProgress are fine; anything else
  // is a DeviceError naming the call.
  void check(ncclResult_t r, const char* call) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    std::string text = std::string(call) + " failed on " + where() + ": " + ncclGetErrorString(r);
    if (comm_) {
      const char* last = ncclGetLastError(comm_);
      if (last && *last) text += " (" + std::string(last) + ")";
    }
    throw DeviceError(text);
  }

  [[noreturn]] void timed_out(const std::string& what, double waited) {
    if (comm_ && !aborted_) ncclCommAbort(comm_);
    aborted_ = true;
    throw CollectiveTimeout(comm::timeout_message(
        what + " timed out", rank_, size_, waited, timeout_s_,
        "for the other " + std::to_string(size_ - 1) +
            " rank(s); at least one never joined (stuck or failed); the NCCL communicator "
            "was aborted"));
  }

  // The communicator's pending operation (initialisation, an enqueue) done, or an error.
  void wait_comm(const std::string& what) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) check(state, what.c_str());
      if (seconds_since(start) > timeout_s_) timed_out(what, seconds_since(start));
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // The stream drained, polling NCCL's asynchronous errors meanwhile.
  void wait_stream(const std::string& what) {
    const auto start = std::chrono::steady_clock::now();
    for (unsigned spin = 0;; ++spin) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) TM_CUDA_CHECK(e);
      ncclResult_t state = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state != ncclSuccess && state != ncclInProgress) check(state, what.c_str());
      if (seconds_since(start) > timeout_s_) timed_out(what, seconds_since(start));
      if (spin > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // An operation on the nonblocking communicator: checked, then waited for until NCCL has
  // enqueued it on the stream (ncclInProgress until then), so that what follows on the stream
  // (the conversion back to 16 bits) runs after it.
  void enqueue(ncclResult_t r, const char* call) {
    check(r, call);
    wait_comm(call);
  }

  void finish(const std::string& what, std::size_t n, DType t) {
    wait_stream(what + " (" + std::to_string(n) + " " + dtype_name(t) + ")");
  }

  void check_peer(int peer, const char* what, bool self_ok) const {
    if (peer < 0 || peer >= size_)
      throw InputError(std::string(what) + ": rank " + std::to_string(peer) +
                       " does not exist in a job of " + std::to_string(size_) + " ranks");
    if (!self_ok && peer == rank_)
      throw InputError(std::string(what) + ": " + comm::rank_of(rank_, size_) +
                       " cannot send to or receive from itself");
  }

  // The fp32 work buffer of the 16-bit sums (grown, kept): NCCL's own memory and this buffer
  // are outside the ledger until the measured step books them (docs/distributed.md).
  float* work(std::size_t n) {
    if (n > work_elems_) {
      if (work_) TM_CUDA_CHECK(cudaFree(work_));
      work_ = nullptr;
      TM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&work_), n * sizeof(float)));
      work_elems_ = n;
    }
    return work_;
  }

  Collective* mpi_;                        // the bootstrap and status channel (outlives this)
  std::unique_ptr<Collective> owned_mpi_;  // split(): the MPI group mpi_ points to
  int rank_ = 0, size_ = 1, device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* work_ = nullptr;
  std::size_t work_elems_ = 0;
  bool aborted_ = false;
};

}  // namespace

std::unique_ptr<Collective> make_nccl_collective(Collective& mpi) {
  if (std::string(mpi.backend()) != "mpi")
    throw InputError("make_nccl_collective: the bootstrap must be the MPI collective");
  return std::make_unique<NcclCollective>(mpi);
}

}  // namespace trainmem
