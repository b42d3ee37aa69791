// comm_mpi.h: the `mpi` backend, one rank per process (mpirun, srun), on CPU.
//
//   mpirun -np 4 build/00_data_parallel/dp --model small --steps 50
//
// Same collectives, semantics and byte counters as the `threads` backend
// (comm.h), and the same bits: MPI's own reductions sum in an unspecified
// order, so this backend never asks MPI to add anything. It moves bytes with
// MPI (an all-to-all of pieces, an all-gather) and sums each piece itself, in
// rank order, with the threads backend's loop (comm_reduce.h). So
// `mpirun -np 4 dp` and `dp --ranks 4` give the same losses bit for bit.
//
// Compiled only when Meson finds MPI (option `mpi`; ZF_HAVE_MPI is then
// defined for common/). launch.cpp uses it when a launcher started more than
// one process.
#pragma once

#include <memory>
#include <vector>

#include "comm.h"

namespace zf {

// Initialises MPI for this process once (MPI_Init_thread, asking for
// MPI_THREAD_MULTIPLE, needing at least MPI_THREAD_SERIALIZED) and registers
// MPI_Finalize to run at exit. Later calls do nothing.
void mpi_init_once();

// This process's rank and the number of processes in MPI_COMM_WORLD, and how
// many of them run on this host (to share its cores). Need mpi_init_once().
int mpi_world_rank();
int mpi_world_size();
int mpi_local_size();
// This process's rank among those on its host (picks its GPU). Collective.
int mpi_local_rank();

// This process's Communicator, over its own duplicate of MPI_COMM_WORLD.
// Collective: every process of the job calls it, in the same order. Each
// wait for the other ranks lasts at most timeout_s (0: kDefaultCommTimeoutS),
// then the collective raises an Error naming the ranks not heard from.
std::unique_ptr<Communicator> make_mpi_communicator(double timeout_s = 0);

// Ends the whole job now: MPI_Abort(MPI_COMM_WORLD, exit_code). The only way
// to stop a peer process that waits inside MPI for this one; the launcher
// (mpirun) kills every process and exits non-zero. Print the reason first.
[[noreturn]] void mpi_abort_job(int exit_code);

// Every process's `value`, in rank order (an MPI_Allgather over
// MPI_COMM_WORLD from the calling thread). Collective; for the tests, which
// use it to agree on which ranks saw a failure. Call it only while no
// Communicator of this process has a collective in flight.
std::vector<int> mpi_gather_ints(int value);

}  // namespace zf
