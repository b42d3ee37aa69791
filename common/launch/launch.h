// launch.h: start the ranks of a run and give each its context.
//
// Three ways, one interface (run_ranks):
//   threads   `--ranks N` runs N ranks as threads of this process, each with
//             its own MemoryTracker and its own Communicator over a shared
//             ThreadGroup (the default: no setup at all). If any rank throws,
//             the group is aborted (every other rank's collectives raise
//             CommAborted instead of waiting forever) and run_ranks throws one
//             Error naming the rank that failed first and its message. A rank
//             thread that still has not returned --comm-timeout seconds after
//             the group was aborted (it is stuck) is left behind, named in the
//             error: the process is expected to exit.
//   MPI       under a launcher that started more than one process with MPI
//             (mpirun, srun --mpi=pmix, an MPICH-style launcher), each process
//             runs exactly one rank, with the `mpi` Communicator (or NCCL for
//             --device cuda, its id broadcast over MPI); the launcher's count
//             wins over --ranks. If the rank throws, it prints its error naming
//             itself and ends the whole job (MPI_Abort): a peer waiting inside
//             MPI cannot be woken any other way.
//   env       processes started without MPI, each told its place by the
//             environment: RANK, WORLD_SIZE, LOCAL_RANK (default RANK) and
//             optionally LOCAL_WORLD_SIZE (torchrun's names; a shell loop sets
//             them), or srun without an MPI plugin (SLURM_PROCID,
//             SLURM_NTASKS, SLURM_LOCALID). GPU runs only: one rank per
//             process over NCCL, rank 0 handing NCCL's id to the others
//             through the file ZF_RENDEZVOUS (rendezvous.h), on GPU
//             LOCAL_RANK % (GPUs visible). More local ranks than GPUs share
//             them, each such process with its own NCCL_HOSTID (a
//             correctness-only mode). --device cpu is refused: CPU ranks in
//             separate processes need MPI. If the rank throws, its NCCL
//             communicator is aborted and the process exits non-zero naming
//             the rank; the others see NCCL's error or their timeout
//             (ZF_NCCL_TIMEOUT_S) and exit too.
//   RANK=$r WORLD_SIZE=2 ZF_RENDEZVOUS=/tmp/zf-$$ build/00_data_parallel/dp --device cuda   (r = 0, 1)
#pragma once

#include <cstddef>
#include <functional>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "comm.h"
#include "device.h"
#include "hardware.h"
#include "config.h"
#include "memory.h"
#include "rank.h"

namespace zf {

struct LaunchOptions {
  int ranks = 1;
  std::optional<size_t> device_budget;  // bytes per rank on the device place
  std::string device = "cpu";           // "cpu" (simulated) or "cuda" (GPU rank % count)
  // How long a rank waits for the others in a collective (--comm-timeout),
  // then the job is aborted; 0: kDefaultCommTimeoutS (NCCL: ZF_NCCL_TIMEOUT_S).
  double comm_timeout_s = 0;
  // --clock modeled: the machine every rank's device and communicator are
  // charged on (modeled_clock.h); null: the wall clock. Thread ranks only.
  const Hardware* hardware = nullptr;
  // --dry-run (with hardware): no arithmetic, no data moved, memory counted
  // (dry_device.h); the communicators are the modeled clock's alone.
  bool dry_run = false;
  // With hardware: the clocks of ranks below this record their spans (--trace).
  int record_clock = 0;
};

// How the environment is read: std::getenv, or a map in tests.
using EnvLookup = std::function<const char*(const char*)>;

// Who started this process, read from the environment (a launcher that says
// there is one process counts as none):
//   mpirun   OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_RANK              (MPI)
//   PMI      PMI_SIZE / PMI_RANK: MPICH-style launchers, srun --mpi=pmi2  (MPI)
//   RANK/WORLD_SIZE   RANK, WORLD_SIZE [, LOCAL_RANK, LOCAL_WORLD_SIZE]  (no MPI)
//   srun     inside a job step (SLURM_STEP_ID set: not the batch script):
//            SLURM_STEP_NUM_TASKS or SLURM_NTASKS / SLURM_PROCID; with MPI
//            when PMIX_RANK says srun started the processes with PMIx, else
//            without (SLURM_LOCALID is the local rank)
// in this order: explicit RANK / WORLD_SIZE win over srun's (torchrun under
// srun sets them for its children). Throws UsageError for RANK or WORLD_SIZE
// alone, a value that is not a whole number, or RANK >= WORLD_SIZE.
struct LauncherInfo {
  std::string name;     // "mpirun", "PMI", "RANK/WORLD_SIZE", "srun", or "" (none)
  int size = 1;
  int rank = 0;
  bool mpi = false;     // the processes can reach each other through MPI
  int local_rank = -1;  // without MPI: this process's rank on its host (default: rank)
  int local_size = -1;  // without MPI: processes on this host, when said (LOCAL_WORLD_SIZE)
};
LauncherInfo detect_launcher();
LauncherInfo detect_launcher(const EnvLookup& env);

// How the ranks of a run are laid out.
struct World {
  int size = 1;             // ranks in the run
  int process_rank = -1;    // this process's one rank; -1: every rank is a thread here
  std::string launcher;     // who started the processes ("" for threads)
  bool mpi = false;         // processes: over MPI, else the env launch (NCCL, a rendezvous file)
  int local_rank = -1;      // env launch: rank on this host (its GPU: local_rank % GPUs)
  int local_size = -1;      // env launch: processes on this host, when known
  std::string rendezvous;   // env launch: ZF_RENDEZVOUS, where rank 0 publishes NCCL's id
  bool multi_process() const { return process_rank >= 0; }
  // The process that prints the log and the tables and writes the run log.
  bool prints() const { return process_rank <= 0; }
  std::string describe() const;  // "4 ranks (threads)", "4 ranks (processes, mpirun)"
};

// `--ranks N` threads, unless a launcher started more than one process: then
// one rank per process and the launcher's count, with a note on stderr (from
// rank 0) when --ranks asked for another count above 1. A launcher of one
// process changes nothing (--ranks threads in it). Throws UsageError, saying
// what to do instead, when launched as several processes by a build without
// MPI (under an MPI launcher), or without MPI (env launch) for --device cpu,
// in a build without NCCL, or without ZF_RENDEZVOUS.
World resolve_world(int requested_ranks, const std::string& device);
World resolve_world(int requested_ranks, const std::string& device, const EnvLookup& env);

// Env launch: the NCCL_HOSTID this process must run under so that NCCL
// accepts it on a GPU another process of the run also uses (NCCL refuses two
// ranks of one communicator on one GPU of one host: a distinct host id makes
// each such process a host of its own, connected over NCCL's network
// transport). "" when the process has a GPU to itself: local_rank below
// `gpus`, and local_size (-1: unknown) not above it.
std::string shared_gpu_hostid(int local_rank, int local_size, int gpus, const std::string& hostname);

// Runs fn once per rank of resolve_world(opt.ranks, opt.device): on N
// threads, or as this process's one rank.
void run_ranks(const LaunchOptions& opt, const std::function<void(RankContext&)>& fn);

// Under a launcher each process holds only its own rank's result; this
// collective fills in every other rank's (counters, memory, hash, losses,
// step times, over the communicator), so rank 0's tables and run log list
// every rank as with threads. Call it on every rank with results[ctx.rank]
// set; with ranks as threads there is nothing to do (don't call it).
void share_rank_results(RankContext& ctx, std::vector<RankResult>& results);

}  // namespace zf
