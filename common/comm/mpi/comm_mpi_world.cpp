// comm_mpi_world.cpp: the process-wide side of the mpi backend (comm_mpi.h):
// MPI's start and end, this process's place in MPI_COMM_WORLD and on its
// host, the job's abort, and a gather of one int per process.
#include "comm_mpi.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "mpi_check.h"

namespace zf {

namespace {

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

// ------------------------------------------------------------------ process-wide

void mpi_init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;  // the embedding program owns MPI's lifetime
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    // Every MPI call of normal operation comes from one communication thread
    // at a time, so SERIALIZED suffices; MULTIPLE makes MPI_Abort from the
    // rank's thread legal while that thread is inside MPI_Test.
    REQUIRE(provided >= MPI_THREAD_SERIALIZED,
            "this MPI library offers only thread level " << provided
                << "; the mpi backend needs MPI_THREAD_SERIALIZED or better");
    std::atexit(finalize_at_exit);
  });
}

int mpi_world_rank() {
  int r = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &r));
  return r;
}

int mpi_world_size() {
  int n = 1;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &n));
  return n;
}

int mpi_local_size() {
  MPI_Comm local;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
  int n = 1;
  MPI_Comm_size(local, &n);
  MPI_Comm_free(&local);
  return n;
}

int mpi_local_rank() {
  MPI_Comm local;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
  int r = 0;
  MPI_Comm_rank(local, &r);
  MPI_Comm_free(&local);
  return r;
}

void mpi_abort_job(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; should it, leave anyway
}

std::vector<int> mpi_gather_ints(int value) {
  std::vector<int> all(static_cast<size_t>(mpi_world_size()));
  MPI_CHECK(MPI_Allgather(&value, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD));
  return all;
}

}  // namespace zf
