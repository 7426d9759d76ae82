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
// made the elementwise ops ~50x slower), and a call made outside a parallel region splits c
// into row or column blocks, one single-threaded sgemm per OpenMP thread. Inside a parallel
// region it runs single-threaded.
void sgemm_cpu(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
               const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
               float* c, std::int64_t ldc);

}  // namespace trainmem
