// launch_env.cpp: who started this process, read from the environment
// (launch.h): an MPI launcher (mpirun, PMI, srun --mpi=pmix), RANK /
// WORLD_SIZE set by hand or by a torchrun-style launcher, or srun without an
// MPI plugin; and what that means for the run (resolve_world): threads, one
// rank per process over MPI, or one GPU rank per process over NCCL with a
// rendezvous file. Every mistake in the environment is a UsageError that
// says what to set instead.
//
//   build/tests/test_launch --gtest_filter='LaunchEnv*'
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "check.h"
#include "launch.h"

namespace zf {

namespace {

// A whole number 0..2^24 from text, or -1.
int parse_count(const char* v) {
  if (!v || !*v) return -1;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (errno != 0 || *end != '\0' || x < 0 || x > 1 << 24) return -1;
  return int(x);
}

// An environment variable a launcher sets: a count, or -1 when absent or not one.
int env_int(const EnvLookup& env, const char* name) { return parse_count(env(name)); }

// One the user sets by hand (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE):
// absent is -1, anything but a whole number is an error saying so.
int user_env_int(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  if (!v || !*v) return -1;
  const int x = parse_count(v);
  USAGE_REQUIRE(x >= 0, name << "='" << v
                             << "' is not a whole number (RANK, WORLD_SIZE, LOCAL_RANK and "
                                "LOCAL_WORLD_SIZE must be integers, 0 or more)");
  return x;
}

}  // namespace

LauncherInfo detect_launcher() {
  return detect_launcher([](const char* name) -> const char* { return std::getenv(name); });
}

LauncherInfo detect_launcher(const EnvLookup& env) {
  LauncherInfo l;
  // A launcher that sets these says so correctly; one that says a single
  // process counts as none (--ranks threads in it).
  auto from = [&](const char* name, const char* size_var, const char* rank_var, bool mpi) {
    const int size = env_int(env, size_var), rank = env_int(env, rank_var);
    if (size < 2 || rank < 0) return false;
    USAGE_REQUIRE(rank < size, name << " says this process is rank " << rank << " of only " << size
                                    << " (" << rank_var << ", " << size_var << ")");
    l.name = name;
    l.size = size;
    l.rank = rank;
    l.mpi = mpi;
    return true;
  };
  if (from("mpirun", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", true)) return l;
  if (from("PMI", "PMI_SIZE", "PMI_RANK", true)) return l;

  // Set by hand (a shell loop) or by torchrun-style launchers: checked
  // strictly, as any input of the user.
  const char* rank_s = env("RANK");
  const char* world_s = env("WORLD_SIZE");
  const bool has_rank = rank_s && *rank_s, has_world = world_s && *world_s;
  if (has_rank || has_world) {
    USAGE_REQUIRE(has_rank && has_world,
                  (has_rank ? std::string("RANK is set (RANK=") + rank_s + ") but WORLD_SIZE is not"
                            : std::string("WORLD_SIZE is set (WORLD_SIZE=") + world_s +
                                  ") but RANK is not")
                      << ": a run started without MPI sets both in every process (RANK 0..N-1, "
                         "the same WORLD_SIZE=N). Unset it to run ranks as threads (--ranks N).");
    const int world = user_env_int(env, "WORLD_SIZE"), rank = user_env_int(env, "RANK");
    USAGE_REQUIRE(world >= 1, "WORLD_SIZE must be at least 1 (got " << world << ")");
    USAGE_REQUIRE(rank < world, "RANK=" << rank << " is not a rank of WORLD_SIZE=" << world
                                        << " (the ranks are 0.." << world - 1 << ")");
    const int local_rank = user_env_int(env, "LOCAL_RANK");
    const int local_size = user_env_int(env, "LOCAL_WORLD_SIZE");
    USAGE_REQUIRE(local_size != 0, "LOCAL_WORLD_SIZE must be at least 1 (got 0)");
    l.name = "RANK/WORLD_SIZE";
    l.size = world;
    l.rank = rank;
    l.local_rank = local_rank >= 0 ? local_rank : rank;
    l.local_size = local_size;
    USAGE_REQUIRE(l.local_size < 0 || l.local_rank < l.local_size,
                  "LOCAL_RANK=" << l.local_rank << " is not a rank of LOCAL_WORLD_SIZE=" << l.local_size);
    return l;
  }

  // Inside an srun step (not the batch script). With PMIx (srun --mpi=pmix)
  // MPI can connect the processes; without an MPI plugin they are as a shell
  // loop's (srun --mpi=pmi2 sets PMI_RANK, caught above).
  // A task after the first of a Slurm job is one too, even where the step's
  // id is missing: training alone there would be a second copy of the run.
  if (env("SLURM_STEP_ID") || env_int(env, "SLURM_PROCID") > 0) {
    const bool mpi = env("PMIX_RANK") != nullptr;
    if (from("srun", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", mpi) ||
        from("srun", "SLURM_NTASKS", "SLURM_PROCID", mpi)) {
      if (!mpi) {
        const int local = env_int(env, "SLURM_LOCALID");
        l.local_rank = local >= 0 ? local : l.rank;
      }
      return l;
    }
  }
  return LauncherInfo{};
}

std::string World::describe() const {
  std::string s = std::to_string(size) + (size == 1 ? " rank" : " ranks");
  return s + (multi_process() ? " (processes, " + launcher + ")" : " (threads)");
}

std::string shared_gpu_hostid(int local_rank, int local_size, int gpus, const std::string& hostname) {
  if (gpus < 1 || (local_rank < gpus && local_size <= gpus)) return "";
  return hostname + "-zf-local" + std::to_string(local_rank);
}

World resolve_world(int requested_ranks, const std::string& device) {
  return resolve_world(requested_ranks, device,
                       [](const char* name) -> const char* { return std::getenv(name); });
}

World resolve_world(int requested_ranks, const std::string& device, const EnvLookup& env) {
  World w;
  w.size = requested_ranks;
  const LauncherInfo l = detect_launcher(env);
  if (l.name == "RANK/WORLD_SIZE" && l.size == 1 && requested_ranks > 1)
    std::fprintf(stderr, "note: WORLD_SIZE=1 says this is the run's only process: its --ranks %d ranks run as "
                 "threads in it\n", requested_ranks);
  if (l.name.empty() || l.size <= 1) return w;
  const std::string n = std::to_string(l.size);
  if (l.mpi) {
#ifndef ZF_HAVE_MPI
    throw UsageError(l.name + " started " + n + " processes (this one is rank " +
                     std::to_string(l.rank) +
                     "), but this build has no MPI backend: MPI was not found when it was "
                     "configured. Install libopenmpi-dev and reconfigure (meson setup --reconfigure "
                     "build -Dmpi=enabled), or run one process with --ranks " + n + " instead.");
#endif
  } else {
    const std::string how =
        l.name == "srun"
            ? "srun started " + n + " processes without an MPI plugin (no PMIX_RANK or PMI_RANK)"
            : "RANK=" + std::to_string(l.rank) + " and WORLD_SIZE=" + n +
                  " are set (one rank per process, without MPI)";
    // Never a silent run of one rank per process that cannot talk.
    USAGE_REQUIRE(device == "cuda",
                  how << ", but only --device cuda ranks can run so (NCCL, its id passed through "
                         "a file). CPU ranks in separate processes need MPI: start them with "
                         "mpirun -np "
                      << n << " (or srun --mpi=pmix) in a build with MPI, or run one process "
                              "with --ranks "
                      << n << (l.name == "srun" ? "." : " (and unset RANK and WORLD_SIZE)."));
#ifndef ZF_HAVE_NCCL
    throw UsageError(how + ", but this build has no NCCL, which GPU ranks in separate processes "
                           "need without MPI: reconfigure with -Dnccl=enabled, or start the "
                           "processes with mpirun, or run one process with --ranks " + n + ".");
#endif
    const char* rdv = env("ZF_RENDEZVOUS");
    USAGE_REQUIRE(rdv && *rdv,
                  how << ", so rank 0 hands NCCL's id to the others through a file: set "
                         "ZF_RENDEZVOUS to its path, the same in every process, on a file system "
                         "they all see, used by no other run at the same time (e.g. "
                         "ZF_RENDEZVOUS=/tmp/zf-$$ for processes of one shell on one host, "
                         "ZF_RENDEZVOUS=$HOME/zf-$SLURM_JOB_ID.$SLURM_STEP_ID under srun).");
    w.rendezvous = rdv;
    w.local_rank = l.local_rank;
    w.local_size = l.local_size;
  }
  w.size = l.size;
  w.process_rank = l.rank;
  w.launcher = l.name;
  w.mpi = l.mpi;
  if (requested_ranks > 1 && requested_ranks != l.size && l.rank == 0)
    std::fprintf(stderr, "note: --ranks %d ignored: %s started %d processes, one rank each\n",
                 requested_ranks, l.name == "RANK/WORLD_SIZE" ? "WORLD_SIZE" : l.name.c_str(),
                 l.size);
  return w;
}

}  // namespace zf
