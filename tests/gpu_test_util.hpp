// Helpers for the GPU tests: host and device buffers in a storage dtype, the cuda backend
// shared by a test binary, random fills, and the comparison every GPU test uses (per-dtype
// tolerance table; on failure the first mismatch, the count and the max errors; on success
// the max errors are printed too, so a session with a GPU can tune the table from one run).
// After every test the device is checked; the first test after which it was in error is named
// ("[ DEVICE   ]" lines) and later tests get fresh backends (see DeviceWatch below).
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_helpers.hpp"
#include "trainmem/backends/backend.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
// Readable test parameters ("fp16" rather than "1-byte object <01>").
inline void PrintTo(DType dt, std::ostream* os) {
  *os << dtype_name(dt);
}
}  // namespace trainmem

namespace trainmem::gputest {

// |got - want| <= atol * rms(want) + rtol * |want| per element (rms(want) taken as 1 when it
// is 0). atol is relative to the typical magnitude of the reference, so it means the same for
// an attention output of size 0.05 and a logit gradient of size 1e-6.
struct Tolerance {
  double atol = 0;
  double rtol = 0;
};

// The table. One fp32 computation rounded once into D on each side differs by at most an ulp
// of D: bf16 has 8 significant bits (ulp 2^-7 relative at worst), fp16 11 (2^-10), so two ulps
// are allowed. fp32 differs only through summation order. Ops that add up many terms or
// round intermediates (GEMMs, attention) multiply this by a factor stated at the call.
inline Tolerance tolerance(DType dt, double factor = 1.0) {
  switch (dt) {
    case DType::bf16:
      return {1.6e-2 * factor, 1.6e-2 * factor};
    case DType::f16:
      return {2e-3 * factor, 2e-3 * factor};
    default:
      return {1e-5 * factor, 1e-5 * factor};
  }
}
inline Tolerance exact() {
  return {0.0, 0.0};
}

inline std::string format_index(std::size_t i, const std::vector<std::int64_t>& shape) {
  if (shape.empty()) return "[" + std::to_string(i) + "]";
  std::vector<std::int64_t> idx(shape.size());
  std::size_t rest = i;
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = std::int64_t(rest % std::size_t(shape[d]));
    rest /= std::size_t(shape[d]);
  }
  std::string s = "[";
  for (std::size_t d = 0; d < idx.size(); ++d) s += (d ? "," : "") + std::to_string(idx[d]);
  return s + "]";
}

// Compares element by element (any NaN is a mismatch; an infinity matches only itself).
inline ::testing::AssertionResult all_close(const std::string& what, const std::vector<float>& got,
                                            const std::vector<float>& want, Tolerance tol,
                                            const std::vector<std::int64_t>& shape = {}) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " != expected " << want.size();
  double sum_sq = 0;
  for (float w : want)
    if (std::isfinite(w)) sum_sq += double(w) * w;
  const double rms = want.empty() ? 0.0 : std::sqrt(sum_sq / double(want.size()));
  const double atol = tol.atol * (rms > 0 ? rms : 1.0);
  std::size_t bad = 0, first = 0, at_abs = 0, at_rel = 0;
  double max_abs = 0, max_rel = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    bool ok;
    double err;
    if (std::isnan(g) || std::isnan(w)) {
      ok = false;  // NaN is always a mismatch: a reference broken like the op must not pass
      err = INFINITY;
    } else if (std::isinf(g) || std::isinf(w)) {
      ok = g == w;
      err = ok ? 0.0 : INFINITY;
    } else {
      err = std::fabs(g - w);
      ok = err <= atol + tol.rtol * std::fabs(w);
    }
    if (err > max_abs) max_abs = err, at_abs = i;
    const double rel = w != 0 ? err / std::fabs(w) : (err > 0 ? INFINITY : 0.0);
    if (rel > max_rel && std::isfinite(w)) max_rel = rel, at_rel = i;
    if (!ok) {
      if (bad == 0) first = i;
      ++bad;
    }
  }
  std::ostringstream detail;
  detail.precision(9);
  detail << what << ": n=" << got.size() << " rms(want)=" << rms << " max abs err " << max_abs;
  if (!got.empty())
    detail << " at " << format_index(at_abs, shape) << " (got " << got[at_abs] << ", want "
           << want[at_abs] << ")";
  detail << ", max rel err " << max_rel;
  if (!got.empty()) detail << " at " << format_index(at_rel, shape);
  detail << "; tolerance atol " << tol.atol << "*rms = " << atol << ", rtol " << tol.rtol;
  std::printf("[ max err  ] %s\n", detail.str().c_str());
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ; first mismatch at "
         << format_index(first, shape) << ": got " << got[first] << ", want " << want[first] << "\n"
         << detail.str();
}

// ---------------------------------------------------------------- buffers

// n elements of a dtype in host memory.
class HostBuf {
 public:
  HostBuf() = default;
  HostBuf(DType dt, std::int64_t n) : dt_(dt), n_(n), bytes_(std::size_t(n) * dtype_size(dt), 0) {}
  DType dtype() const { return dt_; }
  std::int64_t size() const { return n_; }
  std::uint64_t bytes() const { return bytes_.size(); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  template <class T>
  T* as() {
    return reinterpret_cast<T*>(bytes_.data());
  }
  template <class T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes_.data());
  }
  float get(std::int64_t i) const { return load_as_f32(data(), std::size_t(i), dt_); }
  void set(std::int64_t i, float v) { store_from_f32(data(), std::size_t(i), dt_, v); }
  std::vector<float> to_f32() const {
    std::vector<float> out(static_cast<std::size_t>(n_));
    for (std::int64_t i = 0; i < n_; ++i) out[std::size_t(i)] = get(i);
    return out;
  }

 private:
  DType dt_ = DType::f32;
  std::int64_t n_ = 0;
  std::vector<unsigned char> bytes_;
};

// Uniform in [lo, hi), rounded to the dtype (so the cpu and cuda backends see the same bits).
// A xorshift stream seeded from rng: LLaMA-sized buffers fill in well under a second.
inline HostBuf random_buf(DType dt, std::int64_t n, std::mt19937& rng, float lo = -1.0f,
                          float hi = 1.0f) {
  HostBuf b(dt, n);
  std::uint64_t x = (std::uint64_t(rng()) << 32 | rng()) | 1;
  const float span = hi - lo;
  for (std::int64_t i = 0; i < n; ++i) {
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    const float u = float((x * 0x2545F4914F6CDD1Dull) >> 40) * (1.0f / 16777216.0f);  // [0,1)
    b.set(i, lo + span * u);
  }
  return b;
}
inline HostBuf int_buf(const std::vector<std::int32_t>& v) {
  HostBuf b(DType::i32, std::int64_t(v.size()));
  for (std::size_t i = 0; i < v.size(); ++i) b.as<std::int32_t>()[i] = v[i];
  return b;
}

// A device allocation from a backend's allocator, released on destruction (never throwing:
// after a device error the synchronize or the free fails, and a throw from a destructor
// while a test's DeviceError unwinds would end the whole binary; the block is then left to
// the device reset, see DeviceWatch).
class DevBuf {
 public:
  DevBuf(Backend& be, std::uint64_t bytes) : be_(&be), bytes_(bytes ? bytes : 1) {
    ptr_ = be.allocator().allocate(bytes_);
    if (ptr_ == nullptr)
      throw Error("test: device allocation of " + std::to_string(bytes_) + " bytes failed");
  }
  DevBuf(Backend& be, const HostBuf& h) : DevBuf(be, h.bytes()) {
    be.upload(ptr_, h.data(), h.bytes());
  }
  DevBuf(DevBuf&& o) noexcept : be_(o.be_), ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf& operator=(DevBuf&&) = delete;
  ~DevBuf() {
    if (ptr_ == nullptr) return;
    try {
      be_->synchronize();
      be_->allocator().deallocate(ptr_, bytes_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[ DEVBUF   ] %llu bytes not freed: %s\n",
                   static_cast<unsigned long long>(bytes_), e.what());
    }
  }
  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  HostBuf download(DType dt, std::int64_t n) const {
    HostBuf h(dt, n);
    be_->download(h.data(), ptr_, h.bytes());
    return h;
  }
  std::vector<float> f32(DType dt, std::int64_t n) const { return download(dt, n).to_f32(); }

 private:
  Backend* be_;
  void* ptr_ = nullptr;
  std::uint64_t bytes_;
};

// ---------------------------------------------------------------- the shared backends

// A device error and the recovery from it. Kernel faults (an illegal address, a misaligned
// access, a trap) are sticky: the context is unusable until cudaDeviceReset(), every later
// call returns the same error, so without this one fault would fail every later test, each at
// its first copy, and hide which test faulted. What is done, after every test (a gtest
// listener, so no test has to ask):
//   1. probe: cudaDeviceSynchronize() and cudaGetLastError() (which clears an error that is not
//      sticky, such as a bad launch configuration; one only pending from a call, with the
//      device fine, is a test's deliberate error: noted and cleared);
//   2. on an error, print "[ DEVICE   ] device error after <Suite.Test>: <name>" (the first is
//      kept and printed again at the end of the run: under CUDA_LAUNCH_BLOCKING=1, as
//      tools/gpu_check.sh runs the binary, that test's own failure names the launcher that
//      faulted, file and line);
//   3. probe again; if the error is still there it is sticky: forget the shared backends
//      (leaked on purpose: their stream, cuBLAS handle and pool belong to the dead context, and
//      destroying them would only report the same error), cudaDeviceReset(), and probe once
//      more. If the device answers, later tests create fresh backends and run as usual; if
//      not, cuda_backend() throws for every later test, naming the first error and its test.
// Kernel attributes need no restoring: the launchers set the shared-memory opt-in before
// every launch (kernels/common/cuda_common.cuh).
struct DeviceWatch {
  std::map<DType, std::unique_ptr<Backend>> backends;
  bool used = false;        // a backend was created: there is a context to probe
  std::string first_error;  // "cudaErrorIllegalAddress (700) after Suite.Test"
  std::string unusable;     // set when a reset did not bring the device back
  int resets = 0;

  static DeviceWatch& get() {
    static auto* w = new DeviceWatch();  // never destroyed (see cuda_backend)
    return *w;
  }

  static cudaError_t probe() {
    const cudaError_t sync = cudaDeviceSynchronize();
    const cudaError_t last = cudaGetLastError();
    return sync != cudaSuccess ? sync : last;
  }
  static std::string describe(cudaError_t e) {
    return std::string(cudaGetErrorName(e)) + " (" + std::to_string(int(e)) +
           "): " + cudaGetErrorString(e);
  }

  void after_test(const std::string& test) {
    if (!used || !unusable.empty()) return;
    const cudaError_t sync = cudaDeviceSynchronize();
    const cudaError_t last = cudaGetLastError();
    if (sync == cudaSuccess && last == cudaSuccess) return;
    if (sync == cudaSuccess) {  // only a pending error of a call (a test's deliberate one)
      std::printf("[ DEVICE   ] note: %s was pending after %s; cleared\n", describe(last).c_str(),
                  test.c_str());
      return;
    }
    const std::string what = describe(sync) + " after " + test;
    if (first_error.empty()) first_error = what;
    std::printf("[ DEVICE   ] device error %s\n", what.c_str());
    if (probe() == cudaSuccess) {
      std::printf("[ DEVICE   ] not sticky: cleared, the shared backends stay\n");
      return;
    }
    for (auto& kv : backends) (void)kv.second.release();  // the dead context's: leaked
    backends.clear();
    ++resets;
    const cudaError_t r = cudaDeviceReset();
    const cudaError_t after = r == cudaSuccess ? probe() : r;
    if (r == cudaSuccess && after == cudaSuccess && cudaFree(nullptr) == cudaSuccess) {
      std::printf("[ DEVICE   ] sticky: device reset (%d so far); later tests get fresh backends\n",
                  resets);
    } else {
      unusable = "the device is unusable since " + what +
                 "; cudaDeviceReset: " + describe(r == cudaSuccess ? after : r);
      std::printf("[ DEVICE   ] %s: every later GPU test fails\n", unusable.c_str());
    }
    std::fflush(stdout);
  }
};

class DeviceWatchListener : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& info) override {
    DeviceWatch::get().after_test(std::string(info.test_suite_name()) + "." + info.name());
  }
  void OnTestProgramEnd(const ::testing::UnitTest&) override {
    const DeviceWatch& w = DeviceWatch::get();
    if (!w.first_error.empty())
      std::printf("[ DEVICE   ] first device error: %s (%d device reset(s))\n",
                  w.first_error.c_str(), w.resets);
  }
};

// Registers the listener once per binary, before RUN_ALL_TESTS (gtest owns and deletes it).
inline const bool device_watch_registered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new DeviceWatchListener);
  return true;
}();

// The cuda backend for a dtype, created on first use and kept for the life of the test binary
// (never destroyed: tearing down cuBLAS after the CUDA runtime's atexit is not worth the
// noise), or until a sticky device error resets the device (DeviceWatch). Call only after
// require_cuda_device().
inline Backend& cuda_backend(DType dt) {
  DeviceWatch& w = DeviceWatch::get();
  if (!w.unusable.empty()) throw Error("test: " + w.unusable);
  auto it = w.backends.find(dt);
  if (it == w.backends.end()) {
    it = w.backends.emplace(dt, make_cuda_backend(dt)).first;
    w.used = true;
  }
  return *it->second;
}

inline std::string dtype_param_name(DType dt) {
  switch (dt) {
    case DType::f32:
      return "fp32";
    case DType::f16:
      return "fp16";
    case DType::bf16:
      return "bf16";
    default:
      return "int32";
  }
}

}  // namespace trainmem::gputest
