// GEMMs through cuBLAS. The row-major to column-major operand swap is in gemm_args.hpp (and
// tested on the CPU); this file only checks the sizes and makes the calls.
#include <cublas_v2.h>

#include <limits>
#include <string>

#include "common/cublas_check.hpp"
#include "matmul/gemm_args.hpp"
#include "matmul/matmul.hpp"
#include "trainmem/base/cuda_check.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

cudaDataType_t cuda_data_type(DType dt, const char* op) {
  switch (dt) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      break;
  }
  throw InputError(std::string(op) + ": dtype must be fp32, fp16 or bf16, got " + dtype_name(dt));
}

cublasOperation_t cublas_op(Trans t) {
  return t == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
}

int as_int(std::int64_t v, const char* op, const char* what) {
  if (v < 0 || v > std::numeric_limits<int>::max())
    throw InputError(std::string(op) + ": " + what + " = " + std::to_string(v) +
                     " is outside cuBLAS's 32-bit range (0.." +
                     std::to_string(std::numeric_limits<int>::max()) + ")");
  return static_cast<int>(v);
}

// The row-major leading dimension must cover the row length (the stored matrix's columns).
void check_ld(std::int64_t ld, std::int64_t cols, const char* op, const char* what) {
  if (ld < (cols > 1 ? cols : 1))
    throw InputError(std::string(op) + ": leading dimension " + what + " = " + std::to_string(ld) +
                     " is smaller than the row length " + std::to_string(cols));
}

}  // namespace

void matmul_cuda(void* c, const void* a, const void* b, std::int64_t M, std::int64_t N,
                 std::int64_t K, Trans ta, Trans tb, float alpha, float beta, DType dt,
                 cublasHandle_t handle) {
  const std::int64_t lda = dense_lda(M, K, ta);
  const std::int64_t ldb = dense_ldb(N, K, tb);
  matmul_strided_batched_cuda(c, N < 1 ? 1 : N, 0, {a, lda < 1 ? 1 : lda, 0},
                              {b, ldb < 1 ? 1 : ldb, 0}, M, N, K, ta, tb, alpha, beta, 1, dt,
                              handle);
}

void matmul_strided_batched_cuda(void* c, std::int64_t ldc, std::int64_t stride_c, StridedOperand a,
                                 StridedOperand b, std::int64_t M, std::int64_t N, std::int64_t K,
                                 Trans ta, Trans tb, float alpha, float beta, std::int64_t batch,
                                 DType dt, cublasHandle_t handle) {
  const char* op = "matmul_cuda";
  check_ld(a.ld, ta == Trans::no ? K : M, op, "lda");
  check_ld(b.ld, tb == Trans::no ? N : K, op, "ldb");
  check_ld(ldc, N, op, "ldc");
  const cudaDataType_t type = cuda_data_type(dt, op);
  const ColumnMajorGemm g = column_major_gemm(M, N, K, ta, tb, a.ld, b.ld, ldc);
  const int m = as_int(g.m, op, "N"), n = as_int(g.n, op, "M"), k = as_int(g.k, op, "K");
  const int count = as_int(batch, op, "batch");
  if (m == 0 || n == 0 || count == 0) return;
  const int ld_first = as_int(g.ld_first, op, "ldb");
  const int ld_second = as_int(g.ld_second, op, "lda");
  const int ld_c = as_int(g.ldc, op, "ldc");
  if (count == 1) {
    TM_CUBLAS_CHECK(cublasGemmEx(handle, cublas_op(g.op_first), cublas_op(g.op_second), m, n, k,
                                 &alpha, b.ptr, type, ld_first, a.ptr, type, ld_second, &beta, c,
                                 type, ld_c, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  TM_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, cublas_op(g.op_first), cublas_op(g.op_second), m, n, k, &alpha, b.ptr, type, ld_first,
      static_cast<long long>(b.stride), a.ptr, type, ld_second, static_cast<long long>(a.stride),
      &beta, c, type, ld_c, static_cast<long long>(stride_c), count, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

}  // namespace trainmem
