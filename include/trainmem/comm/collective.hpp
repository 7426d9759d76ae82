// Collectives between the ranks of a multi-rank run (docs/distributed.md, "Measured runs"): one
// small interface with three implementations,
//   - MPI (the cpu backend, host buffers): sums in a fixed order, bit-reproducible by design;
//   - NCCL (the cuda backend, device buffers), bootstrapped over MPI, one GPU per local rank;
//   - local (one rank, or the meta backend): no data moves.
// Buffers hold `count` elements of a training dtype (f32, bf16, f16); every rank passes the
// same counts, and a count of 0 returns at once (no synchronisation). Sums are done in fp32 and
// rounded once to the dtype. Every call waits at most the collective timeout and then throws
// CollectiveTimeout naming the collective, the rank and the wait, so a stuck peer becomes an
// error instead of a hang.
//
// Bit-reproducibility (MPI): all_reduce_sum and reduce_scatter_sum give, for every element,
//   acc = x_0;  acc += x_1;  ...;  acc += x_{N-1}   (fp32, in rank order), then one rounding
// to the dtype: the same bits as one process adding the N contributions in rank order. Each
// element is summed by one owner rank from all N contributions (an all-to-all), never partially
// along a ring or tree whose shape depends on N or the MPI library, and the owner's result is
// then copied (all-gather), so every rank holds identical bits. MPI_Allreduce is not used: its
// order (and, for 16-bit data, any intermediate rounding) is implementation-defined.
// NCCL sums 16-bit data in an fp32 work buffer (one rounding) but in NCCL's ring/tree order:
// every rank gets the same bits, which may differ from the rank-order sum in the last fp32 bit.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "trainmem/base/dtype.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {

constexpr double kDefaultCollectiveTimeout = 300;  // seconds (--collective-timeout)
// --collective-timeout's bounds: below a second a healthy collective of a loaded machine times
// out (and an MPI request cannot be cancelled, so the job must end at once); above a week a stuck
// job is not noticed.
constexpr double kMinCollectiveTimeout = 1;
constexpr double kMaxCollectiveTimeout = 7 * 24 * 3600;
// InputError naming --collective-timeout and its bounds when `seconds` is outside them (or NaN).
void check_collective_timeout(double seconds);

// A collective (or a wait at the end of the job) that did not complete within the timeout:
// the message names the collective, the rank, the size of the job and the wait.
class CollectiveTimeout : public Error {
 public:
  using Error::Error;
};

// How this process was started, from the launchers' environment variables alone (nothing is
// initialised): OpenMPI's mpirun (OMPI_COMM_WORLD_SIZE), PMI launchers such as MPICH's hydra
// (PMI_SIZE), PMIx (PMIX_RANK), Slurm's srun (SLURM_NTASKS).
struct LaunchInfo {
  bool under_mpi = false;  // one of the variables is set
  std::string evidence;    // the variable that says so, "OMPI_COMM_WORLD_SIZE=4"; "" otherwise
  int size = 1;            // processes the launcher started, when it says (1 otherwise)
  int rank = 0;            // this process's rank, when it says
  int local_rank = -1;     // OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID; -1
};
LaunchInfo detect_launch();
// The same from a lookup (tests): `env(name)` returns the value or nullptr.
LaunchInfo detect_launch(const std::function<const char*(const char*)>& env);

bool mpi_built();    // this binary was built with MPI (libopenmpi-dev found at configure time)
bool mpi_started();  // MPI_Init has run in this process (false without MPI)
bool nccl_built();   // ... and with NCCL (CUDA build, nccl.h and libnccl found)

class Collective {
 public:
  virtual ~Collective() = default;
  virtual const char* backend() const = 0;  // "local", "mpi", "nccl"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // rank among the processes of this node
  double timeout() const { return timeout_s_; }

  // In place: buf[i] = sum over ranks of buf[i].
  virtual void all_reduce_sum(void* buf, std::size_t count, DType t) = 0;
  // send holds size()·recv_count elements; recv[i] = sum over ranks of send[rank()·recv_count+i].
  // In place when recv is send + rank()·recv_count.
  virtual void reduce_scatter_sum(const void* send, void* recv, std::size_t recv_count,
                                  DType t) = 0;
  // recv holds size()·send_count elements: rank r's send lands at r·send_count (in place when
  // send is recv + rank()·send_count).
  virtual void all_gather(const void* send, void* recv, std::size_t send_count, DType t) = 0;
  // buf on every rank becomes root's buf.
  virtual void broadcast(void* buf, std::size_t count, DType t, int root) = 0;
  // All-to-all of rows (a mixture of experts' dispatch and combine; docs/distributed.md,
  // "Expert parallelism"): `send` holds, in peer order, send_rows[p] rows of `row` elements for
  // each peer p (this rank's own included); `recv` receives recv_rows[p] rows from each peer p,
  // in peer order. Each rank's send_rows[q] must equal peer q's recv_rows[rank()]. Data moves
  // with no arithmetic, so any dtype (int32 routing too). Both arrays hold size() counts.
  // InputError for a row of 0 elements, or a row or count past what the transport takes.
  virtual void all_to_all_v(const void* send, const std::size_t* send_rows, void* recv,
                            const std::size_t* recv_rows, std::size_t row, DType t) = 0;
  // All-gather of rows, uneven (expert tensor parallelism's token gather; docs/distributed.md,
  // "Expert tensor parallelism"): `send` holds send_rows rows of `row` elements; `recv` receives
  // recv_rows[p] rows from each rank p, in rank order (recv_rows[rank()] must equal send_rows).
  // Data moves with no arithmetic, so any dtype. recv_rows holds size() counts.
  virtual void all_gather_v(const void* send, std::size_t send_rows, void* recv,
                            const std::size_t* recv_rows, std::size_t row, DType t) = 0;
  // Reduce-scatter of rows, uneven: `send` holds, in rank order, rows[p] rows of `row` elements
  // for each rank p; `recv` receives rows[rank()] rows, each element the sum over ranks of their
  // block rank() (MPI: in fp32, in rank order, rounded once, as reduce_scatter_sum). Every rank
  // gives the same rows (size() counts). Training dtypes only.
  virtual void reduce_scatter_sum_v(const void* send, const std::size_t* rows, void* recv,
                                    std::size_t row, DType t) = 0;
  // Point to point (pipeline stages); messages between two ranks arrive in the order sent. MPI's
  // send returns once the data is copied into a staging buffer of the collective's (a
  // transport buffer, outside the ledger, freed when the send completes), so two ranks may send
  // to each other before either receives; NCCL's waits for the receiver.
  virtual void send(const void* buf, std::size_t count, DType t, int peer) = 0;
  virtual void recv(void* buf, std::size_t count, DType t, int peer) = 0;
  virtual void barrier() = 0;

  // The ranks of this collective with the same `color`, ordered by `key` (MPI_Comm_split): the
  // data-, tensor- and pipeline-parallel groups of a layout. Every rank must call it (MPI: a
  // bounded barrier first, so a missing rank is a CollectiveTimeout naming the split). The result
  // keeps this collective's backend, timeout and local rank (NCCL: a communicator of its own,
  // bootstrapped over the MPI split); it must not outlive this one.
  virtual std::unique_ptr<Collective> split(int color, int key) = 0;

  // The end-of-job agreement (a fixed point every rank reaches once, on a channel of its own so
  // it never matches a data collective): each rank gives its exit status (0 ok) and gets every
  // rank's, or nullopt when not all ranks joined within `wait_s` seconds.
  virtual std::optional<std::vector<int>> exchange_status(int status, double wait_s) = 0;
  // Ends every process of the job now with `code` (MPI_Abort): the last resort when the peers
  // cannot be reached (they may be waiting in a collective this rank will never join).
  [[noreturn]] virtual void abort_job(int code) = 0;

 protected:
  explicit Collective(double timeout_s) : timeout_s_(timeout_s) {}
  double timeout_s_;
};

// One rank, no data movement (size 1: a sum is the buffer itself, a gather a copy).
std::unique_ptr<Collective> make_local_collective(double timeout_s = kDefaultCollectiveTimeout);
// Initialises MPI (once per process) and returns the world's collective on host buffers;
// MPI_Finalize runs when it is destroyed (not after abort_job). InputError when this binary was
// built without MPI.
std::unique_ptr<Collective> make_mpi_collective(double timeout_s = kDefaultCollectiveTimeout);
// NCCL over the same ranks as `mpi` (which broadcasts the unique id and stays the job's status
// channel: it must outlive the result), on device buffers of the device numbered local_rank.
// InputError when this binary has no NCCL or the node has no device for this rank; DeviceError
// naming the NCCL call otherwise.
std::unique_ptr<Collective> make_nccl_collective(Collective& mpi);

// Copies between device buffers and host memory, each complete when it returns (a Backend's
// download and upload).
struct DeviceCopies {
  std::function<void(void* host_dst, const void* device_src, std::size_t bytes)> to_host;
  std::function<void(void* device_dst, const void* host_src, std::size_t bytes)> to_device;
};
// The collectives of `host` (MPI) on device buffers, through host memory: every call copies its
// device inputs to host buffers of its own, runs host's collective there and copies the results
// back (`--collectives mpi` on cuda: the MPI sums' bits, no NCCL, ranks may share a GPU). Its
// backend() is "mpi-staged"; split() splits `host`. `host` must outlive the result.
std::unique_ptr<Collective> make_staged_collective(Collective& host, DeviceCopies copies);

// The request a rank was started with, as (name, value) pairs: its command line's flags (sorted
// by name), the model configuration it resolved, the sizes of its input files.
using RequestLines = std::vector<std::pair<std::string, std::string>>;
// Every rank of `world` must run the same request (mpirun's MPMD syntax `A : B` can start ranks
// with different flags, and a collective whose counts differ between ranks corrupts memory).
// Called before the first data collective: an all-gather of a 64-bit digest of the request, and
// only when the digests differ, of every rank's request (at most 16 KiB each, values cut to 100
// characters). On a mismatch every rank throws the same InputError naming the first differing
// entry, its values and the ranks that hold each (end_job then prints it once).
void agree_on_request(Collective& world, const RequestLines& request);
// The message of that InputError for the requests gathered from every rank (in rank order);
// nullopt when they are equal.
std::optional<std::string> request_disagreement(const std::vector<RequestLines>& ranks);

// How a rank ends a multi-rank job (the failure handling, docs/distributed.md):
//  1. every rank gives its status and message to the end-of-job agreement;
//  2. when all ranks join (within the timeout for a rank that succeeded, within `grace_s` for
//     one that failed): the lowest failing rank's status is every rank's exit code; a failing
//     rank prints its message (only rank 0 prints when every rank failed with the same status:
//     the same bad input seen everywhere), and MPI finalises normally;
//  3. otherwise (a peer is stuck, e.g. in a collective the failing rank left): the rank prints
//     its message and why, and abort_job ends the whole job with its status (mpirun reports
//     "MPI_ABORT was invoked on rank R ... with errorcode C" and exits with C).
// `message` is the text the single-rank CLI would print (e.g. "trainmem: error: ..."); a rank
// prefix is added when the job has more than one rank. Returns the exit code.
int end_job(Collective& world, int status, const std::string& message, std::ostream& err,
            double grace_s = 5);

}  // namespace trainmem
