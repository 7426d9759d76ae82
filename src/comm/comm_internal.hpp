// Internals of the comm layer shared by its implementations (src/comm/).
#pragma once
#include <cstddef>
#include <string>

#include "trainmem/base/dtype.hpp"

namespace trainmem::comm {

// out[i] = round_to(t, acc) with acc = c_0[i]; acc += c_1[i]; ... in fp32, where c_q is the
// q-th of `n` contributions laid out one after the other (`len` elements each) in `contrib`.
// The order of the additions is fixed: this is what makes the MPI sums bit-reproducible.
void sum_in_rank_order(const void* contrib, int n, std::size_t len, DType t, void* out);

// Training dtypes only (f32, bf16, f16): InputError naming the collective otherwise.
void check_float_dtype(DType t, const char* collective);
// all_to_all_v's rows: InputError naming the collective for a row of 0 elements.
void check_rows(std::size_t row, const char* collective);

// all_gather_v: the rows a rank sends must be the rows every rank expects from it.
void check_own_rows(std::size_t send_rows, std::size_t expected, int rank, const char* collective);

// "rank 1 of 4"
std::string rank_of(int rank, int size);

// The CollectiveTimeout message: "<what>: rank R of N waited S s (--collective-timeout T) <for>".
std::string timeout_message(const std::string& what, int rank, int size, double waited,
                            double timeout, const std::string& waiting_for);

}  // namespace trainmem::comm
