// OpenMP policy of the cpu ops (not for CUDA code).
// - Loops smaller than kParallelMinElements elements (or GEMMs below kParallelMinMacs
//   multiply-adds) run on the calling thread: a team costs more than it saves there.
// - Dynamic team sizes are enabled (unless OMP_DYNAMIC is set): libgomp then shrinks the team
//   when the machine is loaded (it reads the load average), instead of spinning threads that
//   wait for descheduled team mates. On a shared 2-core machine this was 6x faster under load.
// Every cpu op gives the same bits for any team size (work is split into fixed chunks, and
// split GEMMs compute each element exactly as the whole GEMM does), so this is only speed.
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
