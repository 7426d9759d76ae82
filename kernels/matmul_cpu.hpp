// GEMM, CPU reference through OpenBLAS cblas_sgemm (fp32 compute, see sgemm_cpu for threads).
// 16-bit operands are converted to fp32 scratch (not ledger allocations: an implementation detail
// of the cpu backend) and the result is rounded once into c.
#pragma once
#include <cstdint>

#include "trainmem/backend.hpp"
#include "trainmem/dtype.hpp"

namespace trainmem {

// c (M,N) = alpha * op(a) * op(b) + beta * c, row-major, all D.
// op(a) is (M,K): a is (M,K) for Trans::no, (K,M) for Trans::yes; op(b) is (K,N): b is
// (K,N) for Trans::no, (N,K) for Trans::yes. beta == 0 never reads c.
void matmul_cpu(void* c, const void* a, const void* b, std::int64_t M, std::int64_t N,
                std::int64_t K, Trans ta, Trans tb, float alpha, float beta, DType dt);

// The fp32 building block (also used by the cpu attention): row-major cblas_sgemm with leading
// dimensions, c = alpha * op(a) * op(b) + beta * c. Threading belongs to OpenMP: OpenBLAS is
// set to one thread on first use (its own pthreads spinning beside OpenMP's on the same cores
// made the elementwise ops ~50x slower), and c is split into the row or column blocks of
// gemm_split, one single-threaded sgemm each: spread over the OpenMP team when called outside
// a parallel region, one after the other inside one.
// How sgemm_cpu splits a product among threads: a function of the shape alone, so the result
// has the same bits for any team size. Products below kParallelMinMacs multiply-adds stay whole
// (parts 1); larger ones split the larger of M (rows: `rows` true) and N (columns) into
// min(8, dim / 64) blocks (at least 1) whose bounds are multiples of 16.
struct GemmSplit {
  bool rows = true;
  std::int64_t parts = 1;
};
GemmSplit gemm_split(std::int64_t M, std::int64_t N, std::int64_t K);
// First row/column of block p of `parts` over `dim` (p == parts gives dim).
std::int64_t gemm_split_begin(std::int64_t dim, std::int64_t parts, std::int64_t p);

void sgemm_cpu(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
               const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
               float* c, std::int64_t ldc);

}  // namespace trainmem
