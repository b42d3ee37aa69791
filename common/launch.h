// launch.h: start the ranks of a run and give each its context.
//
// Two ways, one interface (run_ranks):
//   threads   `--ranks N` runs N ranks as threads of this process, each with
//             its own MemoryTracker and its own Communicator over a shared
//             ThreadGroup (the default: no setup at all). If any rank throws,
//             the group is aborted (every other rank's collectives raise
//             CommAborted instead of waiting forever) and run_ranks throws one
//             Error naming the rank that failed first and its message.
//   processes under a launcher that started more than one process (mpirun,
//             srun, an MPICH-style launcher), each process runs exactly one
//             rank, with the `mpi` Communicator; the launcher's count wins
//             over --ranks. If the rank throws, it prints its error naming
//             itself and ends the whole job (MPI_Abort): a peer waiting inside
//             MPI cannot be woken any other way.
#pragma once

#include <cstddef>
#include <functional>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "comm.h"
#include "device.h"
#include "config.h"
#include "memory.h"

namespace zf {

struct RankContext {
  int rank;
  int world;
  Communicator& comm;
  MemoryTracker& mem;
  Device& dev;  // where this rank's device place is: the simulated CPU device or a GPU
};

struct LaunchOptions {
  int ranks = 1;
  std::optional<size_t> device_budget;  // bytes per rank on the device place
  std::string device = "cpu";           // "cpu" (simulated) or "cuda" (GPU rank % count)
};

// Who started this process, read from the environment: mpirun
// (OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_RANK), an MPICH-style launcher
// (PMI_SIZE / PMI_RANK), or srun inside a job step (SLURM_STEP_NUM_TASKS or
// SLURM_NTASKS / SLURM_PROCID, with SLURM_STEP_ID set: not the batch script
// itself). `name` is empty when there is no launcher.
struct LauncherInfo {
  std::string name;  // "mpirun", "PMI", "srun", or ""
  int size = 1;
  int rank = 0;
};
LauncherInfo detect_launcher();

// How the ranks of a run are laid out.
struct World {
  int size = 1;             // ranks in the run
  int process_rank = -1;    // this process's one rank; -1: every rank is a thread here
  std::string launcher;     // who started the processes ("" for threads)
  bool multi_process() const { return process_rank >= 0; }
  // The process that prints the log and the tables and writes the run log.
  bool prints() const { return process_rank <= 0; }
  std::string describe() const;  // "4 ranks (threads)", "4 ranks (processes, mpirun)"
};

// `--ranks N` threads, unless a launcher started more than one process: then
// one rank per process and the launcher's count, with a note on stderr (from
// rank 0) when --ranks asked for another count above 1. A launcher of one
// process changes nothing (--ranks threads in it). Throws UsageError when
// launched as several processes by a build without MPI.
World resolve_world(int requested_ranks);

// Runs fn once per rank of resolve_world(opt.ranks): on N threads, or as this
// process's one rank.
void run_ranks(const LaunchOptions& opt, const std::function<void(RankContext&)>& fn);

// Under a launcher each process holds only its own rank's result; this
// collective fills in every other rank's (counters, memory, hash, losses,
// step times, over the communicator), so rank 0's tables and run log list
// every rank as with threads. Call it on every rank with results[ctx.rank]
// set; with ranks as threads there is nothing to do (don't call it).
void share_rank_results(RankContext& ctx, std::vector<RankResult>& results);

// Declare one in a stage right after the buffers its collectives use (so it
// is destroyed before them). If the rank is leaving by an exception, it
// aborts the group and waits until no collective touches any buffer, so the
// buffers this rank is about to free cannot be written by another rank's
// collective still in flight.
class RankFailureGuard {
 public:
  explicit RankFailureGuard(Communicator& comm)
      : comm_(comm), uncaught_(std::uncaught_exceptions()) {}
  ~RankFailureGuard() {
    if (std::uncaught_exceptions() > uncaught_)
      comm_.abort("rank " + std::to_string(comm_.rank()) + " failed (its error is reported by the launcher)");
  }
  RankFailureGuard(const RankFailureGuard&) = delete;
  RankFailureGuard& operator=(const RankFailureGuard&) = delete;

 private:
  Communicator& comm_;
  int uncaught_;
};

}  // namespace zf
