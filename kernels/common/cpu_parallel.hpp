// OpenMP policy of the cpu ops (not for CUDA code).
// - Loops smaller than kParallelMinElements elements (or GEMMs below kParallelMinMacs
//   multiply-adds) run on the calling thread: a team costs more than it saves there.
// - Dynamic team sizes are enabled (unless OMP_DYNAMIC is set): libgomp then shrinks the team
//   when the machine is loaded (it reads the load average), instead of spinning threads that
//   wait for descheduled team mates. On a shared 2-core machine this was 6x faster under load.
// Every cpu op gives the same bits for any team size, so the team size is only speed. The
// rules that make it so (docs/decisions.md, "Threads in the cpu ops"):
// - work is split into chunks fixed by the problem's shape, never by the team size (GEMMs:
//   gemm_split in matmul/matmul.hpp); a chunk computes the same way whichever thread runs it;
// - sums across chunks are combined from per-chunk partials in chunk order (no floating-point
//   `reduction` clauses, no atomics; an order-free one such as OR over booleans is fine);
// - a parallel region names only the function's arguments, raw pointers and values taken
//   before the region, and objects declared inside it (per-thread scratch); never a
//   thread_local or static object, whose identity changes with the executing thread.
#pragma once
#include <omp.h>

#include <cstdint>
#include <cstdlib>

namespace trainmem {

constexpr std::int64_t kParallelMinElements = 1 << 15;
constexpr double kParallelMinMacs = 1 << 18;

// Called at the entry of every cpu op (the OpenMP setting is per calling thread).
inline void cpu_threads_setup() {
  thread_local bool done = false;
  if (!done) {
    done = true;
    if (std::getenv("OMP_DYNAMIC") == nullptr) omp_set_dynamic(1);
  }
}

}  // namespace trainmem
