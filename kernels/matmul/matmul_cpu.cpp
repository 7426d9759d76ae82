// GEMM, CPU reference: OpenBLAS cblas_sgemm in fp32. For a 16-bit D the operands are widened
// into fp32 scratch (kept by the calling thread between calls; not ledger allocations, they are
// an implementation detail of the cpu backend) and the fp32 result is rounded once into c.
// bf16 on a CPU with AVX512-BF16 goes to gemm_bf16_avx512 instead (unless
// TRAINMEM_CPU_GEMM=generic; cpu_gemm_path). Threads: see sgemm_cpu. Parallel regions here name
// only the function's arguments and raw pointers taken before the region, never thread_local or
// static objects (docs/decisions.md).
#include <cblas.h>
#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/cpu_parallel.hpp"
#include "common/storage.hpp"
#include "matmul/gemm_bf16_cpu.hpp"
#include "matmul/matmul.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

int blas_dim(std::int64_t x, const char* what) {
  if (x < 0 || x > INT_MAX)
    throw InputError(std::string("matmul: ") + what + " = " + std::to_string(x) +
                     " is outside [0, 2^31) (OpenBLAS uses 32-bit dimensions)");
  return int(x);
}

void cblas_rowmajor(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                    const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
                    float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta == Trans::yes ? CblasTrans : CblasNoTrans,
              tb == Trans::yes ? CblasTrans : CblasNoTrans, int(M), int(N), int(K), alpha, a,
              int(lda), b, int(ldb), beta, c, int(ldc));
}

template <class S>
void widen(float* dst, const void* src, std::int64_t n) {
#pragma omp parallel for if (n >= kParallelMinElements)
  for (std::int64_t i = 0; i < n; ++i) dst[i] = S::load(src, i);
}

// fp32 scratch of the calling thread, reused between calls (a GEMM's operands are megabytes:
// allocating them per call made page faults a visible part of the step). Only the calling
// thread touches the vectors; OpenMP workers get raw pointers taken before the region.
struct WidenScratch {
  std::vector<float> a, b, c;
};
WidenScratch& calling_thread_scratch() {
  thread_local WidenScratch scratch;
  return scratch;
}

template <class S>
void matmul_16bit(void* c, const void* a, const void* b, std::int64_t M, std::int64_t N,
                  std::int64_t K, Trans ta, Trans tb, float alpha, float beta) {
  WidenScratch& scratch = calling_thread_scratch();
  scratch.a.resize(std::size_t(M) * K);
  scratch.b.resize(std::size_t(K) * N);
  scratch.c.resize(std::size_t(M) * N);
  float* const fa = scratch.a.data();  // (M,K) or (K,M)
  float* const fb = scratch.b.data();  // (K,N) or (N,K)
  float* const fc = scratch.c.data();  // (M,N)
  widen<S>(fa, a, M * K);
  widen<S>(fb, b, K * N);
  if (beta != 0.0f) widen<S>(fc, c, M * N);
  sgemm_cpu(ta, tb, M, N, K, alpha, fa, ta == Trans::no ? K : M, fb, tb == Trans::no ? N : K, beta,
            fc, N);
  const std::int64_t n = M * N;
#pragma omp parallel for if (n >= kParallelMinElements)
  for (std::int64_t i = 0; i < n; ++i) S::store(c, i, fc[i]);
}

}  // namespace

GemmSplit gemm_split(std::int64_t M, std::int64_t N, std::int64_t K) {
  constexpr std::int64_t kMaxParts = 8, kMinBlock = 64;
  GemmSplit s;
  s.rows = M >= N;
  if (double(M) * double(N) * double(K) < kParallelMinMacs) return s;
  const std::int64_t dim = s.rows ? M : N;
  s.parts = std::max<std::int64_t>(1, std::min<std::int64_t>(kMaxParts, dim / kMinBlock));
  return s;
}

std::int64_t gemm_split_begin(std::int64_t dim, std::int64_t parts, std::int64_t p) {
  if (p <= 0) return 0;
  if (p >= parts) return dim;
  return (dim * p / parts) / 16 * 16;
}

void sgemm_cpu(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
               const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
               float* c, std::int64_t ldc) {
  if (M == 0 || N == 0) return;
  blas_dim(M, "M");
  blas_dim(N, "N");
  blas_dim(K, "K");
  blas_dim(lda, "lda");
  blas_dim(ldb, "ldb");
  blas_dim(ldc, "ldc");
  if (K == 0) {  // op(a) * op(b) is all zeros; BLAS would reject the leading dimensions
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j)
        c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cpu_threads_setup();
  static std::once_flag single_threaded_blas;
  std::call_once(single_threaded_blas, [] { openblas_set_num_threads(1); });
  // The split depends on the shape only, never on the team: every block is the same
  // single-threaded sgemm call whichever thread runs it, so c has the same bits for any team
  // size (a whole-matrix sgemm would not: OpenBLAS picks kernels and blocking by the shape).
  const GemmSplit split = gemm_split(M, N, K);
  if (split.parts == 1) {
    cblas_rowmajor(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const std::int64_t dim = split.rows ? M : N;
#pragma omp parallel for schedule(static) if (!omp_in_parallel())
  for (std::int64_t p = 0; p < split.parts; ++p) {
    const std::int64_t lo = gemm_split_begin(dim, split.parts, p);
    const std::int64_t hi = gemm_split_begin(dim, split.parts, p + 1);
    if (hi <= lo) continue;
    if (split.rows) {  // rows lo..hi of op(a) and c
      const float* ap = ta == Trans::no ? a + lo * lda : a + lo;
      cblas_rowmajor(ta, tb, hi - lo, N, K, alpha, ap, lda, b, ldb, beta, c + lo * ldc, ldc);
    } else {  // columns lo..hi of op(b) and c
      const float* bp = tb == Trans::no ? b + lo : b + lo * ldb;
      cblas_rowmajor(ta, tb, M, hi - lo, K, alpha, a, lda, bp, ldb, beta, c + lo, ldc);
    }
  }
}

bool parse_cpu_gemm_auto(const char* value) {
  if (value == nullptr || std::strcmp(value, "auto") == 0) return true;
  if (std::strcmp(value, "generic") == 0) return false;
  throw InputError(std::string("TRAINMEM_CPU_GEMM = '") + value +
                   "': must be auto (the fastest kernel this CPU has; the default) or generic "
                   "(fp32 sgemm for every dtype)");
}

CpuGemmPath cpu_gemm_path(DType dt) {
  // Read once (a throwing initialiser is retried on the next call, so a bad value keeps
  // failing); immutable afterwards.
  static const CpuGemmPath bf16_path = [] {
    const bool automatic = parse_cpu_gemm_auto(std::getenv("TRAINMEM_CPU_GEMM"));
    const bool has = cpu_has_avx512_bf16();
    const CpuGemmPath path = automatic && has ? CpuGemmPath::avx512_bf16 : CpuGemmPath::generic;
    spdlog::debug("cpu gemm: bf16 uses the {} kernel (TRAINMEM_CPU_GEMM={}, avx512_bf16 {})",
                  path == CpuGemmPath::avx512_bf16 ? "avx512_bf16" : "generic (widen + sgemm)",
                  automatic ? "auto" : "generic", has ? "present" : "absent");
    return path;
  }();
  return dt == DType::bf16 ? bf16_path : CpuGemmPath::generic;
}

void matmul_cpu_on(CpuGemmPath path, void* c, const void* a, const void* b, std::int64_t M,
                   std::int64_t N, std::int64_t K, Trans ta, Trans tb, float alpha, float beta,
                   DType dt) {
  cpu_threads_setup();
  if (path == CpuGemmPath::avx512_bf16) {
    if (dt != DType::bf16 || !cpu_has_avx512_bf16())
      throw InputError(
          "matmul: the avx512_bf16 kernel needs bf16 operands and a CPU with "
          "avx512f/bw/vl and avx512_bf16");
    gemm_bf16_avx512(static_cast<std::uint16_t*>(c), static_cast<const std::uint16_t*>(a),
                     static_cast<const std::uint16_t*>(b), M, N, K, ta, tb, alpha, beta);
    return;
  }
  if (dt == DType::f32) {
    sgemm_cpu(ta, tb, M, N, K, alpha, static_cast<const float*>(a), ta == Trans::no ? K : M,
              static_cast<const float*>(b), tb == Trans::no ? N : K, beta, static_cast<float*>(c),
              N);
    return;
  }
  dispatch_storage(dt, "matmul", [&](auto tag) {
    matmul_16bit<decltype(tag)>(c, a, b, M, N, K, ta, tb, alpha, beta);
  });
}

void matmul_cpu(void* c, const void* a, const void* b, std::int64_t M, std::int64_t N,
                std::int64_t K, Trans ta, Trans tb, float alpha, float beta, DType dt) {
  matmul_cpu_on(cpu_gemm_path(dt), c, a, b, M, N, K, ta, tb, alpha, beta, dt);
}

}  // namespace trainmem
