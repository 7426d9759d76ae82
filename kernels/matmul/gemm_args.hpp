// The row-major to column-major translation of a GEMM for cuBLAS, as plain C++ so that the
// CPU tests (tests/test_cuda_plans.cpp) check it against the CPU reference without a GPU.
//
// A row-major X (r, c) with leading dimension L is, read column-major, X^T (c, r) with the
// same L. A row-major C = op(A) op(B) is therefore the column-major C^T = op(B)^T op(A)^T:
// cuBLAS gets b first and a second, m = N and n = M, and each operand keeps its own transpose
// flag (Trans::no: the column-major view of b already is op(B)^T).
#pragma once
#include <cstdint>

#include "trainmem/base/op_types.hpp"

namespace trainmem {

// A column-major GEMM C (m,n) = alpha * opA(A) (m,k) * opB(B) (k,n) + beta * C, in cuBLAS's
// terms: `first` is cuBLAS's A argument, `second` its B argument.
struct ColumnMajorGemm {
  bool first_is_b;  // always true: cuBLAS's A is our b
  Trans op_first;   // applied to our b
  Trans op_second;  // applied to our a
  std::int64_t m, n, k;
  std::int64_t ld_first, ld_second, ldc;
};

// Row-major c (M,N) = op(a) (M,K) * op(b) (K,N) with row-major leading dimensions lda, ldb, ldc.
inline ColumnMajorGemm column_major_gemm(std::int64_t M, std::int64_t N, std::int64_t K, Trans ta,
                                         Trans tb, std::int64_t lda, std::int64_t ldb,
                                         std::int64_t ldc) {
  return ColumnMajorGemm{true, tb, ta, N, M, K, ldb, lda, ldc};
}

// The leading dimensions of densely stored operands: a is (M,K) or (K,M), b (K,N) or (N,K).
inline std::int64_t dense_lda(std::int64_t M, std::int64_t K, Trans ta) {
  return ta == Trans::no ? K : M;
}
inline std::int64_t dense_ldb(std::int64_t N, std::int64_t K, Trans tb) {
  return tb == Trans::no ? N : K;
}

}  // namespace trainmem
