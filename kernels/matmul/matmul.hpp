// GEMM, row-major: c (M,N) = alpha * op(a) * op(b) + beta * c. The CPU reference
// (matmul_cpu.cpp) and the CUDA launchers (matmul.cu) side by side, in the same argument order
// (CUDA: plus the cuBLAS handle).
// CPU: OpenBLAS cblas_sgemm (fp32 compute, see sgemm_cpu for threads). 16-bit operands are
// converted to fp32 scratch (not ledger allocations: an implementation detail of the cpu
// backend) and the result is rounded once into c. bf16 on a CPU with AVX512-BF16 uses
// gemm_bf16_avx512 instead (gemm_bf16_cpu.hpp): same semantics, no widening.
// CUDA: cuBLAS (cublasGemmEx / cublasGemmStridedBatchedEx) with CUBLAS_COMPUTE_32F: bf16/fp16
// operands with fp32 accumulation, plain fp32 for fp32 (no TF32). The usual operand swap
// (gemm_args.hpp) turns a row-major C = op(A) op(B) into the column-major C^T = op(B)^T op(A)^T
// that cuBLAS computes. The stream is the handle's (cublasSetStream), and the workspace the
// handle's (cublasSetWorkspace with the ledger's `cublas_workspace`): these calls allocate
// nothing.
#pragma once
#include <cstdint>

#include "common/cuda_handles.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/op_types.hpp"

namespace trainmem {

// c (M,N) = alpha * op(a) * op(b) + beta * c, row-major, all D.
// op(a) is (M,K): a is (M,K) for Trans::no, (K,M) for Trans::yes; op(b) is (K,N): b is
// (K,N) for Trans::no, (N,K) for Trans::yes. beta == 0 never reads c.
void matmul_cpu(void* c, const void* a, const void* b, std::int64_t M, std::int64_t N,
                std::int64_t K, Trans ta, Trans tb, float alpha, float beta, DType dt);
void matmul_cuda(void* c, const void* a, const void* b, std::int64_t M, std::int64_t N,
                 std::int64_t K, Trans ta, Trans tb, float alpha, float beta, DType dt,
                 cublasHandle_t handle);

// One operand of a strided batch of row-major matrices: element (r, c) of matrix i is at
// ptr + i*stride + r*ld + c (in elements).
struct StridedOperand {
  const void* ptr;
  std::int64_t ld;
  std::int64_t stride;
};

// For i < batch: C_i (M,N) = alpha * op(A_i) op(B_i) + beta * C_i, row-major with explicit
// leading dimensions (so a head of a (b, s, a, d) tensor is an (s, d) matrix with ld a*d).
// CUDA only (the cpu attention calls sgemm_cpu with leading dimensions instead).
void matmul_strided_batched_cuda(void* c, std::int64_t ldc, std::int64_t stride_c, StridedOperand a,
                                 StridedOperand b, std::int64_t M, std::int64_t N, std::int64_t K,
                                 Trans ta, Trans tb, float alpha, float beta, std::int64_t batch,
                                 DType dt, cublasHandle_t handle);

// The kernels matmul_cpu can use. generic: widen to fp32 + sgemm_cpu (every dtype);
// avx512_bf16: gemm_bf16_avx512 (bf16 only, needs cpu_has_avx512_bf16()).
enum class CpuGemmPath { generic, avx512_bf16 };
// The path matmul_cpu takes for dt: avx512_bf16 for bf16 when the CPU has it and the
// environment variable TRAINMEM_CPU_GEMM is `auto` or unset; generic otherwise
// (TRAINMEM_CPU_GEMM=generic forces it). Any other value throws InputError naming the variable
// and the allowed values. The variable is read on the first call; the choice is logged once at
// debug level.
CpuGemmPath cpu_gemm_path(DType dt);
// TRAINMEM_CPU_GEMM's value (nullptr: unset) -> true for auto, false for generic; InputError
// otherwise.
bool parse_cpu_gemm_auto(const char* value);
// matmul_cpu on a given path (tests compare the paths); avx512_bf16 requires bf16 and
// cpu_has_avx512_bf16(), else throws InputError.
void matmul_cpu_on(CpuGemmPath path, void* c, const void* a, const void* b, std::int64_t M,
                   std::int64_t N, std::int64_t K, Trans ta, Trans tb, float alpha, float beta,
                   DType dt);

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
