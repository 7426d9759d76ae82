// StagedCollective (include/trainmem/comm/collective.hpp, make_staged_collective): the collectives
// on device buffers through host memory. Each call copies its device inputs into host buffers of
// its own, runs the host collective (MPI) there, and copies the results back: the MPI collective's
// arithmetic (sums in rank order, bit-reproducible), its timeouts and its failure handling, on
// any device buffers the copies reach. No device memory is taken beyond the caller's buffers.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm_internal.hpp"
#include "trainmem/comm/collective.hpp"

namespace trainmem {
namespace {

class StagedCollective final : public Collective {
 public:
  StagedCollective(Collective& host, DeviceCopies copies)
      : Collective(host.timeout()), host_(&host), copies_(std::move(copies)) {
    if (!copies_.to_host || !copies_.to_device)
      throw Error("make_staged_collective: both copies are needed");
  }

  const char* backend() const override { return "mpi-staged"; }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  int local_rank() const override { return host_->local_rank(); }

  std::unique_ptr<Collective> split(int color, int key) override {
    std::unique_ptr<Collective> sub_host = host_->split(color, key);
    auto sub = std::make_unique<StagedCollective>(*sub_host, copies_);
    sub->owned_host_ = std::move(sub_host);
    return sub;
  }

  void all_reduce_sum(void* buf, std::size_t count, DType t) override {
    comm::check_float_dtype(t, "all_reduce_sum");
    if (count == 0) return;
    unsigned char* h = in(a_, buf, count, t);
    host_->all_reduce_sum(h, count, t);
    out(buf, h, count, t);
  }

  void reduce_scatter_sum(const void* send, void* recv, std::size_t n, DType t) override {
    comm::check_float_dtype(t, "reduce_scatter_sum");
    if (n == 0) return;
    unsigned char* s = in(a_, send, n * std::size_t(size()), t);
    unsigned char* r = room(b_, n, t);
    host_->reduce_scatter_sum(s, r, n, t);
    out(recv, r, n, t);
  }

  void all_gather(const void* send, void* recv, std::size_t n, DType t) override {
    if (n == 0) return;
    unsigned char* s = in(a_, send, n, t);
    unsigned char* r = room(b_, n * std::size_t(size()), t);
    host_->all_gather(s, r, n, t);
    out(recv, r, n * std::size_t(size()), t);
  }

  void broadcast(void* buf, std::size_t count, DType t, int root) override {
    if (count == 0) return;
    unsigned char* h = rank() == root ? in(a_, buf, count, t) : room(a_, count, t);
    host_->broadcast(h, count, t, root);
    if (rank() != root) out(buf, h, count, t);
  }

  void all_to_all_v(const void* send, const std::size_t* send_rows, void* recv,
                    const std::size_t* recv_rows, std::size_t row, DType t) override {
    comm::check_rows(row, "all_to_all_v");
    std::size_t sent = 0, received = 0;
    for (int p = 0; p < size(); ++p) {
      sent += send_rows[p];
      received += recv_rows[p];
    }
    unsigned char* s = sent ? in(a_, send, sent * row, t) : room(a_, 0, t);
    unsigned char* r = room(b_, received * row, t);
    host_->all_to_all_v(s, send_rows, r, recv_rows, row, t);
    if (received) out(recv, r, received * row, t);
  }

  void all_gather_v(const void* send, std::size_t send_rows, void* recv,
                    const std::size_t* recv_rows, std::size_t row, DType t) override {
    comm::check_rows(row, "all_gather_v");
    std::size_t received = 0;
    for (int p = 0; p < size(); ++p) received += recv_rows[p];
    unsigned char* s = send_rows ? in(a_, send, send_rows * row, t) : room(a_, 0, t);
    unsigned char* r = room(b_, received * row, t);
    host_->all_gather_v(s, send_rows, r, recv_rows, row, t);
    if (received) out(recv, r, received * row, t);
  }

  void reduce_scatter_sum_v(const void* send, const std::size_t* rows, void* recv, std::size_t row,
                            DType t) override {
    comm::check_float_dtype(t, "reduce_scatter_sum_v");
    comm::check_rows(row, "reduce_scatter_sum_v");
    std::size_t sent = 0;
    for (int p = 0; p < size(); ++p) sent += rows[p];
    const std::size_t mine = rows[rank()];
    unsigned char* s = sent ? in(a_, send, sent * row, t) : room(a_, 0, t);
    unsigned char* r = room(b_, mine * row, t);
    host_->reduce_scatter_sum_v(s, rows, r, row, t);
    if (mine) out(recv, r, mine * row, t);
  }

  void send(const void* buf, std::size_t count, DType t, int peer) override {
    if (count == 0) return;
    host_->send(in(a_, buf, count, t), count, t, peer);  // MPI's send copies it (staged)
  }

  void recv(void* buf, std::size_t count, DType t, int peer) override {
    if (count == 0) return;
    unsigned char* h = room(a_, count, t);
    host_->recv(h, count, t, peer);
    out(buf, h, count, t);
  }

  void barrier() override { host_->barrier(); }
  std::optional<std::vector<int>> exchange_status(int status, double wait_s) override {
    return host_->exchange_status(status, wait_s);
  }
  [[noreturn]] void abort_job(int code) override {
    host_->abort_job(code);
    std::_Exit(code);  // abort_job does not return
  }

 private:
  static std::size_t bytes(std::size_t count, DType t) { return count * dtype_size(t); }
  unsigned char* room(std::vector<unsigned char>& v, std::size_t count, DType t) {
    v.resize(bytes(count, t));
    return v.data();
  }
  // The device elements [src, src + count) in host buffer `v`.
  unsigned char* in(std::vector<unsigned char>& v, const void* src, std::size_t count, DType t) {
    unsigned char* h = room(v, count, t);
    copies_.to_host(h, src, bytes(count, t));
    return h;
  }
  void out(void* dst, const unsigned char* h, std::size_t count, DType t) {
    copies_.to_device(dst, h, bytes(count, t));
  }

  Collective* host_;
  std::unique_ptr<Collective> owned_host_;  // split(): the host group host_ points to
  DeviceCopies copies_;
  std::vector<unsigned char> a_, b_;  // host copies of the inputs and outputs
};

}  // namespace

std::unique_ptr<Collective> make_staged_collective(Collective& host, DeviceCopies copies) {
  return std::make_unique<StagedCollective>(host, std::move(copies));
}

}  // namespace trainmem
