// GEMMs on the GPU through cuBLAS (cublasGemmEx / cublasGemmStridedBatchedEx) with
// CUBLAS_COMPUTE_32F: bf16/fp16 operands with fp32 accumulation, plain fp32 for fp32 (no TF32).
// Row-major, as the CPU reference (matmul_cpu.hpp): the usual operand swap turns a row-major
// C = op(A) op(B) into the column-major C^T = op(B)^T op(A)^T that cuBLAS computes.
// The stream is the handle's (cublasSetStream), and the workspace the handle's
// (cublasSetWorkspace with the ledger's `cublas_workspace`): these calls allocate nothing.
#pragma once
#include <cublas_v2.h>

#include <cstdint>

#include "trainmem/dtype.hpp"
#include "trainmem/op_types.hpp"

namespace trainmem {

// c (M,N) = alpha * op(a) * op(b) + beta * c, row-major, all D. op(a) is (M,K): a is (M,K) for
// Trans::no, (K,M) for Trans::yes; op(b) is (K,N): b is (K,N) for Trans::no, (N,K) for
// Trans::yes. beta == 0 never reads c.
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
// leading dimensions (so a head of a (B,T,NH,HD) tensor is a (T,HD) matrix with ld NH*HD).
void matmul_strided_batched_cuda(void* c, std::int64_t ldc, std::int64_t stride_c, StridedOperand a,
                                 StridedOperand b, std::int64_t M, std::int64_t N, std::int64_t K,
                                 Trans ta, Trans tb, float alpha, float beta, std::int64_t batch,
                                 DType dt, cublasHandle_t handle);

}  // namespace trainmem
