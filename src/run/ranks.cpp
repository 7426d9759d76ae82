// A measured multi-rank job (include/trainmem/run/ranks.hpp).
#include "trainmem/run/ranks.hpp"

#include <spdlog/spdlog.h>

#include <iostream>
#include <memory>

#include "trainmem/base/error.hpp"
#include "trainmem/run/run.hpp"

namespace trainmem {

int run_ranks(const RankJob& job, const RankBody& body) {
  // Only now, under a launcher, is MPI initialised (MPI_Init_thread); MPI_Finalize when `world`
  // is destroyed.
  std::unique_ptr<Collective> world = make_mpi_collective(job.collective_timeout);
  std::unique_ptr<Collective> nccl;  // cuda: the data collectives; `world` stays the bootstrap
  Collective* active = world.get();  // what end_job aborts through (NCCL aborts its comm first)
  const Outcome outcome = job.capture([&]() -> int {
    // Before anything else the ranks exchange: every rank runs the same request, or every rank
    // stops with the same message (no collective of mismatched sizes is ever started).
    agree_on_request(*world, job.request);
    if (job.check_world) job.check_world(*world);
    const bool cuda = job.backend == "cuda";
    const bool staged = job.collectives == "mpi";
    if (job.collectives == "nccl" && !cuda)
      throw InputError(
          "--collectives nccl needs --backend cuda (the cpu backend's ranks use "
          "MPI on host memory)");
    if (cuda && !staged) {
      nccl = make_nccl_collective(*world);
      active = nccl.get();
    }
    if (cuda && staged) {
      const int device = cuda_use_device(world->local_rank());
      spdlog::info("rank {}: device {} (--collectives mpi)", world->rank(), device);
    }
    ChosenBackend be = choose_backend(job.backend, job.dtype);
    // cuda with --collectives mpi: the MPI collectives on the device buffers, copied through
    // host memory by the backend (destroyed before it).
    std::unique_ptr<Collective> through_host;
    Collective* data = active;
    if (cuda && staged) {
      Backend* b = be.backend.get();
      through_host = make_staged_collective(
          *world, DeviceCopies{[b](void* h, const void* d, std::size_t n) { b->download(h, d, n); },
                               [b](void* d, const void* h, std::size_t n) { b->upload(d, h, n); }});
      data = through_host.get();
    }
    // Every rank is here and the collectives answer (a peer that never arrives becomes a
    // CollectiveTimeout naming the barrier).
    data->barrier();
    return body(*be.backend, *data, *world);
  });
  const int code = end_job(*active, outcome.code, outcome.message, std::cerr);
  nccl.reset();
  world.reset();  // MPI_Finalize
  return code;
}

}  // namespace trainmem
