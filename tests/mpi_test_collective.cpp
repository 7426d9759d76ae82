// The collectives (include/trainmem/comm/collective.hpp) under a real MPI launch; run by
// tests/mpi_test.py under `mpirun --oversubscribe -np N` (ctest Mpi.*). One rank per process.
//
//   mpi_test_collective collectives [--backend mpi|staged|nccl]
//       every collective, dtypes f32/bf16/f16, uneven sizes, against sums computed here: the
//       MPI sums must equal, bit for bit, one process adding the ranks' contributions in rank
//       order in fp32 and rounding once (NCCL: within a stated tolerance); exit 0 when every
//       check passed on every rank. staged: the MPI collectives through host copies
//       (make_staged_collective, the cuda backend's --collectives mpi) with counting memcpy
//       copies standing in for the device's: the same bits, and every call copied.
//       all_to_all_v (rows of 1, 3 and 70 elements, uneven and zero counts per pair, int32 too):
//       every source's rows in source order, bit for bit, nothing written past them;
//       all_gather_v and reduce_scatter_sum_v likewise (uneven and zero rows per rank; the sums
//       bit for bit the rank-order sum).
//   mpi_test_collective fail-one     the last rank throws an InputError while the others wait in
//       an all_reduce_sum: the whole job must end with exit 2 and that rank's message (end_job).
//   mpi_test_collective fail-all     every rank throws the same InputError: exit 2, the message
//       printed once (by rank 0), no MPI_Abort.
//   mpi_test_collective timeout      the last rank never joins (sleeps); the others' all_reduce_sum
//       times out after 2 s: an error naming the collective and the rank, the job ends.
// Exit 77 (skipped) when this binary was built without MPI or, for nccl, without a usable device.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "trainmem/base/dtype.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/comm/collective.hpp"

#ifdef TRAINMEM_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

using namespace trainmem;

namespace {

constexpr int kSkip = 77;

// Memory the collective works on: host for MPI, device for NCCL (uploaded and downloaded here).
struct Memory {
  virtual ~Memory() = default;
  virtual void* alloc(std::size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void put(void* dst, const void* host, std::size_t bytes) = 0;
  virtual void get(void* host, const void* src, std::size_t bytes) = 0;
};

struct HostMemory final : Memory {
  void* alloc(std::size_t bytes) override { return ::operator new(bytes ? bytes : 1); }
  void release(void* p) override { ::operator delete(p); }
  void put(void* d, const void* h, std::size_t n) override {
    if (n) std::memcpy(d, h, n);
  }
  void get(void* h, const void* s, std::size_t n) override {
    if (n) std::memcpy(h, s, n);
  }
};

#ifdef TRAINMEM_HAVE_NCCL
void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
struct DeviceMemory final : Memory {
  void* alloc(std::size_t bytes) override {
    void* p = nullptr;
    cuda_ok(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    return p;
  }
  void release(void* p) override { cudaFree(p); }
  void put(void* d, const void* h, std::size_t n) override {
    if (n) cuda_ok(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  void get(void* h, const void* s, std::size_t n) override {
    if (n) cuda_ok(cudaMemcpy(h, s, n, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
};
#endif

// A buffer of `count` elements of dtype t, on the collective's memory, with its host copy.
struct Buf {
  Memory& mem;
  DType t;
  std::size_t count;
  void* dev;
  std::vector<unsigned char> host;
  Buf(Memory& m, DType type, std::size_t n)
      : mem(m), t(type), count(n), dev(m.alloc(n * dtype_size(type))), host(n * dtype_size(type)) {}
  ~Buf() { mem.release(dev); }
  Buf(const Buf&) = delete;
  void upload() { mem.put(dev, host.data(), host.size()); }
  void download() { mem.get(host.data(), dev, host.size()); }
  float at(std::size_t i) const { return load_as_f32(host.data(), i, t); }
  void set(std::size_t i, float v) { store_from_f32(host.data(), i, t, v); }
};

// The value rank `r` contributes at element i (salted per check): a hash spread over
// [-8, 8) with full mantissas, so that the order and the roundings of a sum show in its bits.
float value(int r, std::size_t i, std::uint32_t salt) {
  std::uint64_t x = (std::uint64_t(r) + 1) * 0x9E3779B97F4A7C15ull ^
                    (std::uint64_t(i) + 1) * 0xC2B2AE3D27D4EB4Full ^ salt * 0x165667B19E3779F9ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  const double unit = double(x >> 11) / double(1ull << 53);  // [0, 1)
  // Mix magnitudes: some elements small, some large (so fp32 addition rounds).
  const double scale = (x & 3) == 0 ? 1e-3 : (x & 3) == 1 ? 1.0 : (x & 3) == 2 ? 37.0 : 4096.0;
  return float((unit * 2 - 1) * scale);
}

// The rank-order sum of element i over `n` ranks' contributions as stored in dtype t (each
// contribution first rounded to t, as the rank holds it), computed here, independently of the
// library: acc = c_0; acc += c_1; ... in fp32, then one rounding to t.
float rank_order_sum(int n, std::size_t i, std::uint32_t salt, DType t, bool reverse = false) {
  auto c = [&](int r) { return round_to(t, value(r, i, salt)); };
  float acc = c(reverse ? n - 1 : 0);
  for (int k = 1; k < n; ++k) acc += c(reverse ? n - 1 - k : k);
  return round_to(t, acc);
}

std::uint32_t bits_of(float v, DType t) {
  if (t == DType::f32) return f32_bits(v);
  return t == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
}

struct Checker {
  int rank = 0;
  bool exact = true;  // MPI: bit-identical; NCCL: within the tolerance
  int failures = 0, checks = 0;
  std::ostringstream log;

  void fail(const std::string& what) {
    if (++failures <= 20) log << "rank " << rank << ": FAIL " << what << "\n";
  }
  void expect(bool ok, const std::string& what) {
    ++checks;
    if (!ok) fail(what);
  }
  // got == want bit for bit (exact) or within |want|·2^-8·ranks + ulp-scale slack (NCCL order).
  void sum_equal(const std::string& what, float got, float want, DType t, int ranks,
                 float magnitude) {
    ++checks;
    if (exact) {
      if (bits_of(got, t) != bits_of(want, t))
        fail(what + ": got " + std::to_string(got) + " want " + std::to_string(want) +
             " (bits differ)");
      return;
    }
    const float eps = t == DType::f32 ? 0x1p-23f : t == DType::bf16 ? 0x1p-8f : 0x1p-11f;
    const float tol = eps * (std::fabs(want) + float(ranks) * magnitude) * 2;
    if (!(std::fabs(got - want) <= tol))
      fail(what + ": got " + std::to_string(got) + " want " + std::to_string(want) + " tolerance " +
           std::to_string(tol));
  }
  void bits_equal(const std::string& what, float got, float want, DType t) {
    ++checks;
    if (bits_of(got, t) != bits_of(want, t))
      fail(what + ": got " + std::to_string(got) + " want " + std::to_string(want));
  }
};

const DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};

std::string name(const char* op, DType t, std::size_t n) {
  return std::string(op) + " " + dtype_name(t) + " n=" + std::to_string(n);
}

void check_all_reduce(Collective& c, Memory& mem, Checker& ck) {
  const int n = c.size(), r = c.rank();
  std::uint32_t salt = 100;
  int order_matters = 0;  // elements whose reverse-order sum differs: the data can tell orders
  for (DType t : kDtypes)
    for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(3), std::size_t(7),
                              std::size_t(1000), std::size_t(4099), std::size_t(65537)}) {
      ++salt;
      Buf b(mem, t, count);
      for (std::size_t i = 0; i < count; ++i) b.set(i, value(r, i, salt));
      b.upload();
      c.all_reduce_sum(b.dev, count, t);
      b.download();
      for (std::size_t i = 0; i < count; ++i) {
        const float want = rank_order_sum(n, i, salt, t);
        ck.sum_equal(name("all_reduce_sum", t, count) + " [" + std::to_string(i) + "]", b.at(i),
                     want, t, n, 4096);
        if (t == DType::f32 && bits_of(want, t) != bits_of(rank_order_sum(n, i, salt, t, true), t))
          ++order_matters;
      }
    }
  // With 3 ranks or more, fp32 addition is not associative on this data: a sum in another
  // order would be caught above. (With 2, a + b == b + a: any order is the rank order.)
  if (n >= 3 && ck.exact && order_matters == 0)
    ck.fail("test data: no element's sum depends on the order (the bit check proves nothing)");
}

void check_reduce_scatter(Collective& c, Memory& mem, Checker& ck) {
  const int n = c.size(), r = c.rank();
  std::uint32_t salt = 200;
  for (DType t : kDtypes)
    for (std::size_t rc : {std::size_t(0), std::size_t(1), std::size_t(5), std::size_t(333)}) {
      ++salt;
      const std::size_t total = rc * std::size_t(n);
      Buf in(mem, t, total), out(mem, t, rc);
      for (std::size_t i = 0; i < total; ++i) in.set(i, value(r, i, salt));
      in.upload();
      c.reduce_scatter_sum(in.dev, out.dev, rc, t);
      out.download();
      for (std::size_t i = 0; i < rc; ++i)
        ck.sum_equal(name("reduce_scatter_sum", t, rc) + " [" + std::to_string(i) + "]", out.at(i),
                     rank_order_sum(n, std::size_t(r) * rc + i, salt, t), t, n, 4096);
    }
}

// all_to_all_v: rank r sends rows(r, p) rows of `row` elements to each peer p (0 for some
// pairs, its own share included), element (i, j) of the rows for p carrying a value of
// (r, p, i, j); every rank finds, in source order, rows(q, r) rows from each q with q's values,
// bit for bit, for the training dtypes and int32 (the routing's indices).
void check_all_to_all_v(Collective& c, Memory& mem, Checker& ck) {
  const int n = c.size(), r = c.rank();
  std::uint32_t salt = 350;
  auto rows = [](int from, int to, std::uint32_t s) {
    return std::size_t((std::uint32_t(from) + 2 * std::uint32_t(to) + s) % 4);
  };
  for (const DType t : {DType::f32, DType::bf16, DType::f16, DType::i32})
    for (const std::size_t row : {std::size_t(1), std::size_t(3), std::size_t(70)}) {
      ++salt;
      std::vector<std::size_t> send_rows(static_cast<std::size_t>(n)),
          recv_rows(static_cast<std::size_t>(n));
      std::size_t sent = 0, received = 0;
      for (int p = 0; p < n; ++p) {
        send_rows[std::size_t(p)] = rows(r, p, salt);
        recv_rows[std::size_t(p)] = rows(p, r, salt);
        sent += send_rows[std::size_t(p)];
        received += recv_rows[std::size_t(p)];
      }
      // Element (i, j) of the rows `from` sends `to`: an index of both and of the place.
      auto key = [&](int from, int to, std::size_t i, std::size_t j) {
        return (std::size_t(from) * 64 + std::size_t(to)) * 4096 + i * 97 + j;
      };
      Buf in(mem, t, sent * row), out(mem, t, received * row + 1);
      std::size_t at = 0;
      for (int p = 0; p < n; ++p)
        for (std::size_t i = 0; i < send_rows[std::size_t(p)]; ++i)
          for (std::size_t j = 0; j < row; ++j, ++at) {
            if (t == DType::i32) {
              const std::int32_t v = std::int32_t(key(r, p, i, j));
              std::memcpy(in.host.data() + at * 4, &v, 4);
            } else {
              in.set(at, value(r, key(r, p, i, j), salt));
            }
          }
      // A sentinel past the received rows: the collective must not write there.
      std::fill(out.host.begin(), out.host.end(), 0x5a);
      out.upload();
      in.upload();
      c.all_to_all_v(in.dev, send_rows.data(), out.dev, recv_rows.data(), row, t);
      out.download();
      const std::string what =
          std::string("all_to_all_v ") + dtype_name(t) + " row " + std::to_string(row);
      at = 0;
      bool ok = true;
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < recv_rows[std::size_t(q)]; ++i)
          for (std::size_t j = 0; j < row; ++j, ++at) {
            if (t == DType::i32) {
              std::int32_t v = 0;
              std::memcpy(&v, out.host.data() + at * 4, 4);
              ok = ok && v == std::int32_t(key(q, r, i, j));
            } else {
              ok = ok && bits_of(out.at(at), t) ==
                             bits_of(round_to(t, value(q, key(q, r, i, j), salt)), t);
            }
          }
      ck.expect(ok, what + ": the rows from every source, in source order");
      const std::size_t es = dtype_size(t);
      bool untouched = true;
      for (std::size_t b = received * row * es; b < out.host.size(); ++b)
        untouched = untouched && out.host[b] == 0x5a;
      ck.expect(untouched, what + ": nothing written past the received rows");
    }
  // A row of no elements is refused naming the collective.
  std::vector<std::size_t> zeros(static_cast<std::size_t>(n), 0);
  try {
    c.all_to_all_v(nullptr, zeros.data(), nullptr, zeros.data(), 0, DType::f32);
    ck.fail("all_to_all_v: a row of 0 elements accepted");
  } catch (const InputError& e) {
    ck.expect(std::string(e.what()).find("all_to_all_v: a row of 0 elements") != std::string::npos,
              std::string("all_to_all_v's refusal names it: ") + e.what());
  }
}

// all_gather_v: rank q contributes rows(q) rows of `row` elements (0 for some), element (i, j)
// carrying a value of (q, i, j); every rank finds every rank's rows in rank order, bit for bit,
// nothing written past them (the training dtypes and int32).
// reduce_scatter_sum_v: block p of every rank's input holds rows(p) rows; rank r receives the
// rank-order sum of block r (as reduce_scatter_sum), nothing past it.
void check_uneven_rows(Collective& c, Memory& mem, Checker& ck) {
  const int n = c.size(), r = c.rank();
  std::uint32_t salt = 700;
  auto rows_of = [](int q, std::uint32_t s) { return std::size_t((std::uint32_t(q) * 3 + s) % 4); };
  for (const DType t : {DType::f32, DType::bf16, DType::f16, DType::i32})
    for (const std::size_t row : {std::size_t(1), std::size_t(3), std::size_t(70)}) {
      ++salt;
      std::vector<std::size_t> rows(static_cast<std::size_t>(n));
      std::size_t total = 0, before = 0;
      for (int q = 0; q < n; ++q) {
        rows[std::size_t(q)] = rows_of(q, salt);
        if (q < r) before += rows[std::size_t(q)];
        total += rows[std::size_t(q)];
      }
      const std::size_t mine = rows[std::size_t(r)], es = dtype_size(t);
      auto key = [](int q, std::size_t i, std::size_t j) {
        return std::size_t(q) * 65536 + i * 97 + j;
      };
      const std::string what = std::string(" ") + dtype_name(t) + " row " + std::to_string(row);
      {
        Buf in(mem, t, mine * row), out(mem, t, total * row + 1);
        for (std::size_t i = 0; i < mine; ++i)
          for (std::size_t j = 0; j < row; ++j) {
            if (t == DType::i32) {
              const std::int32_t v = std::int32_t(key(r, i, j));
              std::memcpy(in.host.data() + (i * row + j) * 4, &v, 4);
            } else {
              in.set(i * row + j, value(r, key(r, i, j), salt));
            }
          }
        std::fill(out.host.begin(), out.host.end(), 0x5a);
        out.upload();
        in.upload();
        c.all_gather_v(in.dev, mine, out.dev, rows.data(), row, t);
        out.download();
        bool ok = true;
        std::size_t at = 0;
        for (int q = 0; q < n; ++q)
          for (std::size_t i = 0; i < rows[std::size_t(q)]; ++i)
            for (std::size_t j = 0; j < row; ++j, ++at) {
              if (t == DType::i32) {
                std::int32_t v = 0;
                std::memcpy(&v, out.host.data() + at * 4, 4);
                ok = ok && v == std::int32_t(key(q, i, j));
              } else {
                ok = ok && bits_of(out.at(at), t) ==
                               bits_of(round_to(t, value(q, key(q, i, j), salt)), t);
              }
            }
        ck.expect(ok, "all_gather_v" + what + ": every rank's rows in rank order");
        bool untouched = true;
        for (std::size_t b = total * row * es; b < out.host.size(); ++b)
          untouched = untouched && out.host[b] == 0x5a;
        ck.expect(untouched, "all_gather_v" + what + ": nothing written past the rows");
      }
      if (t == DType::i32) continue;  // sums: training dtypes only
      {
        // Element e of every rank's input: value(rank, e); block r starts at row `before`.
        Buf in(mem, t, total * row), out(mem, t, mine * row + 1);
        for (std::size_t e = 0; e < total * row; ++e) in.set(e, value(r, e, salt));
        std::fill(out.host.begin(), out.host.end(), 0x5a);
        out.upload();
        in.upload();
        c.reduce_scatter_sum_v(in.dev, rows.data(), out.dev, row, t);
        out.download();
        for (std::size_t e = 0; e < mine * row; ++e)
          ck.sum_equal("reduce_scatter_sum_v" + what + " [" + std::to_string(e) + "]", out.at(e),
                       rank_order_sum(n, before * row + e, salt, t), t, n, 4096);
        bool untouched = true;
        for (std::size_t b = mine * row * es; b < out.host.size(); ++b)
          untouched = untouched && out.host[b] == 0x5a;
        ck.expect(untouched, "reduce_scatter_sum_v" + what + ": nothing written past the rows");
      }
    }
  // A rank sending other rows than the ranks expect from it is refused naming the collective.
  std::vector<std::size_t> rows(static_cast<std::size_t>(n), 1);
  float one[2] = {1, 1}, all[64] = {};
  try {
    c.all_gather_v(one, 2, all, rows.data(), 1, DType::f32);
    ck.fail("all_gather_v: 2 rows sent where 1 is expected, accepted");
  } catch (const InputError& e) {
    ck.expect(
        std::string(e.what()).find("all_gather_v: rank " + std::to_string(r) +
                                   " sends 2 rows and the ranks expect 1") != std::string::npos,
        std::string("all_gather_v's refusal names it: ") + e.what());
  }
}

void check_all_gather(Collective& c, Memory& mem, Checker& ck) {
  const int n = c.size(), r = c.rank();
  std::uint32_t salt = 300;
  for (DType t : kDtypes)
    for (std::size_t sc : {std::size_t(0), std::size_t(1), std::size_t(5), std::size_t(777)}) {
      ++salt;
      Buf in(mem, t, sc), out(mem, t, sc * std::size_t(n));
      for (std::size_t i = 0; i < sc; ++i) in.set(i, value(r, i, salt));
      in.upload();
      c.all_gather(in.dev, out.dev, sc, t);
      out.download();
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < sc; ++i)
          ck.bits_equal(name("all_gather", t, sc) + " from rank " + std::to_string(q),
                        out.at(std::size_t(q) * sc + i), round_to(t, value(q, i, salt)), t);
    }
}

// In place: reduce_scatter_sum into the rank's own block of its input, all_gather from the
// rank's own block of its output.
void check_in_place(Collective& c, Memory& mem, Checker& ck) {
  const int n = c.size(), r = c.rank();
  std::uint32_t salt = 600;
  for (DType t : kDtypes) {
    ++salt;
    const std::size_t k = 37, es = dtype_size(t);
    Buf b(mem, t, k * std::size_t(n));
    for (std::size_t i = 0; i < b.count; ++i) b.set(i, value(r, i, salt));
    b.upload();
    auto* own = static_cast<unsigned char*>(b.dev) + std::size_t(r) * k * es;
    c.reduce_scatter_sum(b.dev, own, k, t);
    b.download();
    for (std::size_t i = 0; i < k; ++i)
      ck.sum_equal(name("reduce_scatter_sum in place", t, k), b.at(std::size_t(r) * k + i),
                   rank_order_sum(n, std::size_t(r) * k + i, salt, t), t, n, 4096);
    // Each rank's block now holds its sums; gather them in place.
    c.all_gather(own, b.dev, k, t);
    b.download();
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < k; ++i)
        ck.sum_equal(name("all_gather in place", t, k) + " from rank " + std::to_string(q),
                     b.at(std::size_t(q) * k + i),
                     rank_order_sum(n, std::size_t(q) * k + i, salt, t), t, n, 4096);
  }
}

void check_broadcast(Collective& c, Memory& mem, Checker& ck) {
  const int n = c.size(), r = c.rank();
  std::uint32_t salt = 400;
  for (DType t : kDtypes)
    for (int root = 0; root < n; ++root)
      for (std::size_t count : {std::size_t(1), std::size_t(1001)}) {
        ++salt;
        Buf b(mem, t, count);
        for (std::size_t i = 0; i < count; ++i) b.set(i, value(r, i, salt));
        b.upload();
        c.broadcast(b.dev, count, t, root);
        b.download();
        for (std::size_t i = 0; i < count; ++i)
          ck.bits_equal(name("broadcast", t, count) + " root " + std::to_string(root), b.at(i),
                        round_to(t, value(root, i, salt)), t);
      }
}

// A pipeline: forward, rank k receives from k-1, adds its own value, sends to k+1; backward the
// other way. Checks what arrives against the chain computed here.
void check_send_recv(Collective& c, Memory& mem, Checker& ck) {
  const int n = c.size(), r = c.rank();
  std::uint32_t salt = 500;
  for (DType t : kDtypes)
    for (std::size_t count : {std::size_t(1), std::size_t(3), std::size_t(5000)}) {
      ++salt;
      Buf b(mem, t, count);
      auto chain = [&](int upto, std::size_t i, bool backward) {  // what rank `upto` sends
        float acc = 0;
        for (int k = 0; k <= upto; ++k)
          acc = round_to(t, acc + value(backward ? n - 1 - k : k, i, salt));
        return acc;
      };
      for (int dir = 0; dir < 2; ++dir) {
        const bool backward = dir == 1;
        const int pos = backward ? n - 1 - r : r;  // position along the chain
        const int prev = backward ? r + 1 : r - 1, next = backward ? r - 1 : r + 1;
        if (pos > 0) {
          c.recv(b.dev, count, t, prev);
          b.download();
          for (std::size_t i = 0; i < count; ++i)
            ck.bits_equal(name(backward ? "recv (backward)" : "recv (forward)", t, count) +
                              " from rank " + std::to_string(prev),
                          b.at(i), chain(pos - 1, i, backward), t);
        } else {
          for (std::size_t i = 0; i < count; ++i) b.set(i, 0);
        }
        for (std::size_t i = 0; i < count; ++i) b.set(i, round_to(t, b.at(i) + value(r, i, salt)));
        b.upload();
        if (pos < n - 1) c.send(b.dev, count, t, next);
      }
    }
}

void check_bad_peers(Collective& c, Checker& ck) {
  auto expect_input_error = [&](const char* what, auto&& call) {
    ++ck.checks;
    try {
      call();
      ck.fail(std::string(what) + ": no InputError");
    } catch (const InputError&) {
    }
  };
  float x = 0;
  expect_input_error("broadcast root out of range",
                     [&] { c.broadcast(&x, 1, DType::f32, c.size()); });
  expect_input_error("send to itself", [&] { c.send(&x, 1, DType::f32, c.rank()); });
  expect_input_error("recv from rank -1", [&] { c.recv(&x, 1, DType::f32, -1); });
}

int run_collectives(const std::string& backend) {
  std::unique_ptr<Collective> mpi = make_mpi_collective(60);
  std::unique_ptr<Collective> nccl;
  std::unique_ptr<Memory> mem = std::make_unique<HostMemory>();
  Collective* c = mpi.get();
  Checker ck;
  ck.rank = mpi->rank();
  if (backend == "nccl") {
#ifdef TRAINMEM_HAVE_NCCL
    int devices = 0;
    const cudaError_t e = cudaGetDeviceCount(&devices);
    const bool usable = e == cudaSuccess && devices >= mpi->size();
    // Every rank decides the same (same node here); a skip on all ranks is exit 77 for mpirun.
    if (!usable) {
      if (mpi->rank() == 0)
        std::cout << "SKIP: the NCCL collectives need " << mpi->size()
                  << " CUDA device(s) on this node: "
                  << (e != cudaSuccess
                          ? std::string("no CUDA device (") + cudaGetErrorString(e) + ")"
                          : std::to_string(devices) + " found")
                  << "\n";
      end_job(*mpi, 0, "", std::cerr);
      return kSkip;
    }
    nccl = make_nccl_collective(*mpi);
    c = nccl.get();
    mem = std::make_unique<DeviceMemory>();
    ck.exact = mpi->size() == 1;  // NCCL's order: exact only for one rank
#else
    if (mpi->rank() == 0) std::cout << "SKIP: this build has no NCCL (a CUDA build with NCCL)\n";
    end_job(*mpi, 0, "", std::cerr);
    return kSkip;
#endif
  }
  std::unique_ptr<Collective> staged;
  std::uint64_t copied_in = 0, copied_out = 0;
  if (backend == "staged") {
    staged = make_staged_collective(*mpi, DeviceCopies{[&](void* h, const void* d, std::size_t n) {
                                                         std::memcpy(h, d, n);
                                                         copied_in += n;
                                                       },
                                                       [&](void* d, const void* h, std::size_t n) {
                                                         std::memcpy(d, h, n);
                                                         copied_out += n;
                                                       }});
    c = staged.get();
  }
  int status = 0;
  std::string message;
  try {
    if (c->size() != mpi->size() || c->rank() != mpi->rank())
      ck.fail("rank/size differ between the collective and MPI");
    check_all_reduce(*c, *mem, ck);
    check_reduce_scatter(*c, *mem, ck);
    check_all_gather(*c, *mem, ck);
    check_all_to_all_v(*c, *mem, ck);
    check_uneven_rows(*c, *mem, ck);
    check_in_place(*c, *mem, ck);
    check_broadcast(*c, *mem, ck);
    if (c->size() > 1) check_send_recv(*c, *mem, ck);
    check_bad_peers(*c, ck);
    c->barrier();
    if (staged) {
      ck.expect(copied_in > 0 && copied_out > 0, "staged: the calls went through the copies");
      // A split keeps the staging: a sum over a group of one is the buffer itself.
      std::unique_ptr<Collective> alone = c->split(c->rank(), 0);
      float x = 1.5f + float(c->rank());
      const std::uint64_t before = copied_in;
      alone->all_reduce_sum(&x, 1, DType::f32);
      ck.expect(alone->size() == 1 && x == 1.5f + float(c->rank()) && copied_in == before + 4 &&
                    std::string(alone->backend()) == "mpi-staged",
                "staged: split groups copy through the same copies");
    }
  } catch (const std::exception& e) {
    ck.fail(std::string("exception: ") + e.what());
  }
  std::cerr << ck.log.str();
  if (ck.failures) {
    status = 1;
    message = "rank " + std::to_string(ck.rank) + ": " + std::to_string(ck.failures) + " of " +
              std::to_string(ck.checks) + " checks failed";
  } else {
    std::cout << "rank " << ck.rank << " of " << c->size() << " (" << c->backend()
              << "): " << ck.checks << " checks passed\n";
  }
  std::cout.flush();
  const int code = end_job(*mpi, status, message, std::cerr);
  nccl.reset();
  return code;
}

int run_failure(bool all) {
  std::unique_ptr<Collective> c = make_mpi_collective(120);
  int status = 0;
  std::string message;
  try {
    float x = 1;
    c->all_reduce_sum(&x, 1, DType::f32);  // everyone is up
    if (all || c->rank() == c->size() - 1)
      throw InputError("--tokens: token id 99999 is out of range [0, 32000) (test: rank " +
                       std::string(all ? "every" : std::to_string(c->rank())) + ")");
    // The others wait in a collective the failing rank never joins.
    c->all_reduce_sum(&x, 1, DType::f32);
  } catch (const InputError& e) {
    status = 2;
    message = std::string("trainmem: error: ") + e.what();
  } catch (const std::exception& e) {
    status = 1;
    message = std::string("trainmem: error: ") + e.what();
  }
  return end_job(*c, status, message, std::cerr);
}

int run_timeout() {
  std::unique_ptr<Collective> c = make_mpi_collective(2);
  if (c->rank() == c->size() - 1) {
    // Never joins: sleeps past the others' timeout (the job's end kills it first).
    std::this_thread::sleep_for(std::chrono::seconds(90));
    return 0;
  }
  int status = 0;
  std::string message;
  try {
    float x = 1;
    c->all_reduce_sum(&x, 1, DType::f32);
  } catch (const CollectiveTimeout& e) {
    status = 1;
    message = std::string("trainmem: error: ") + e.what();
  }
  return end_job(*c, status, message, std::cerr);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "collectives";
  std::string backend = "mpi";
  for (int i = 2; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--backend") backend = argv[i + 1];
  if (!mpi_built()) {
    std::cout << "SKIP: this build has no MPI (libopenmpi-dev was not found at configure time; "
                 "tools/setup.sh installs it)\n";
    return kSkip;
  }
  try {
    if (mode == "collectives") return run_collectives(backend);
    if (mode == "fail-one") return run_failure(false);
    if (mode == "fail-all") return run_failure(true);
    if (mode == "timeout") return run_timeout();
  } catch (const std::exception& e) {
    std::cerr << "mpi_test_collective: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "usage: mpi_test_collective collectives [--backend mpi|staged|nccl] | fail-one | "
               "fail-all | timeout\n";
  return 2;
}
