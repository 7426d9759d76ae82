// A measured multi-rank job (docs/distributed.md, "Measured runs"), started in the run layer:
// MPI under its launcher, every rank agreeing on its request before any collective of data,
// the backend and its collectives (NCCL on cuda, or MPI staged through host memory; MPI on the
// cpu), the rank's own work, and the end of the job through end_job (one rank's failure is
// every rank's exit code, never a hang). The command line builds a RankJob from its flags and
// hands it over.
#pragma once
#include <functional>
#include <string>

#include "trainmem/backends/backend.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/comm/collective.hpp"

namespace trainmem {

// What a rank's work ended with: its exit code and, when it failed, the message to print.
struct Outcome {
  int code = 0;
  std::string message;
};

struct RankJob {
  std::string backend;  // "cpu" or "cuda"
  DType dtype = DType::bf16;
  std::string collectives;  // "nccl", "mpi"; "" the backend's own (cuda: nccl, cpu: mpi)
  double collective_timeout = kDefaultCollectiveTimeout;  // seconds
  RequestLines request;  // what every rank must have been started with (agree_on_request)
  // Checks that need the world (its size against the requested one): InputError to refuse.
  std::function<void(const Collective& world)> check_world;
  // Runs a rank's work, turning what it throws into an exit code and a message (the command
  // line's own mapping: InputError 2, OutOfMemory 3, ...).
  std::function<Outcome(const std::function<int()>&)> capture;
};

// What every rank runs once MPI is started, the request agreed and the collectives answer: the
// backend, the data collectives and the world on host buffers (MPI). Returns the exit code.
using RankBody = std::function<int(Backend&, Collective& data, Collective& world)>;

// Starts the job (MPI_Init_thread), agrees on the request, checks the world, makes the
// collectives and the backend, runs `body` on this rank and ends the job (MPI_Finalize after
// end_job). Returns this rank's exit code, the same on every rank.
int run_ranks(const RankJob& job, const RankBody& body);

}  // namespace trainmem
