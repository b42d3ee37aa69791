// test_launch_env.cpp: how the launcher reads the environment (launch.h):
// mpirun, srun with or without an MPI plugin, and RANK / WORLD_SIZE /
// LOCAL_RANK set by hand for processes started without MPI (GPU runs only).
//
//   build/tests/test_launch --gtest_filter='LaunchEnv*'
//
// The environment is a map passed to detect_launcher / resolve_world, so the
// tests never touch this process's own. The last tests run dp itself with
// RANK / WORLD_SIZE set: a CPU run must stop at once with a usage error
// (exit 2) saying what to use instead, never train as a lone rank.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "check.h"
#include "launch.h"
#include "test_util.h"

namespace {

using zf::EnvLookup;
using zf::LauncherInfo;
using zf::World;
using Env = std::map<std::string, std::string>;

EnvLookup env_of(Env m) {
  return [m](const char* name) -> const char* {
    const auto it = m.find(name);
    return it == m.end() ? nullptr : it->second.c_str();
  };
}

// The message of the UsageError f throws ("no error" / "not a usage error: ...").
template <class F>
std::string usage_error_of(F f) {
  try {
    f();
  } catch (const zf::UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a usage error: ") + e.what();
  }
  return "no error";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string resolve_error(const Env& env, const std::string& device = "cuda") {
  return usage_error_of([&] { zf::resolve_world(1, device, env_of(env)); });
}

TEST(LaunchEnv, NothingSetMeansThreads) {
  EXPECT_EQ(zf::detect_launcher(env_of({})).name, "");
  const World w = zf::resolve_world(3, "cpu", env_of({}));
  EXPECT_FALSE(w.multi_process());
  EXPECT_EQ(w.size, 3);
  EXPECT_EQ(w.describe(), "3 ranks (threads)");
}

TEST(LaunchEnv, RankAndWorldSize) {
  const LauncherInfo l = zf::detect_launcher(env_of({{"RANK", "1"}, {"WORLD_SIZE", "4"}}));
  EXPECT_EQ(l.name, "RANK/WORLD_SIZE");
  EXPECT_EQ(l.size, 4);
  EXPECT_EQ(l.rank, 1);
  EXPECT_FALSE(l.mpi);
  EXPECT_EQ(l.local_rank, 1) << "LOCAL_RANK defaults to RANK";
  EXPECT_EQ(l.local_size, -1);
  const LauncherInfo m = zf::detect_launcher(
      env_of({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}}));
  EXPECT_EQ(m.local_rank, 1);
  EXPECT_EQ(m.local_size, 4);
}

// A world of one is not a multi-process run: --ranks threads, as with mpirun -np 1.
TEST(LaunchEnv, WorldOfOneKeepsThreads) {
  const World w = zf::resolve_world(2, "cpu", env_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}}));
  EXPECT_FALSE(w.multi_process());
  EXPECT_EQ(w.size, 2);
}

TEST(LaunchEnv, BadValuesAreUsageErrors) {
  auto detect_error = [](const Env& env) {
    return usage_error_of([&] { zf::detect_launcher(env_of(env)); });
  };
  std::string e = detect_error({{"RANK", "abc"}, {"WORLD_SIZE", "2"}});
  EXPECT_TRUE(has(e, "RANK='abc' is not a whole number")) << e;
  e = detect_error({{"RANK", "-1"}, {"WORLD_SIZE", "2"}});
  EXPECT_TRUE(has(e, "RANK='-1' is not a whole number")) << e;
  e = detect_error({{"RANK", "0"}, {"WORLD_SIZE", "2x"}});
  EXPECT_TRUE(has(e, "WORLD_SIZE='2x'")) << e;
  e = detect_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}});
  EXPECT_TRUE(has(e, "RANK=2 is not a rank of WORLD_SIZE=2 (the ranks are 0..1)")) << e;
  e = detect_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}});
  EXPECT_TRUE(has(e, "WORLD_SIZE must be at least 1")) << e;
  e = detect_error({{"RANK", "1"}});
  EXPECT_TRUE(has(e, "RANK is set (RANK=1) but WORLD_SIZE is not")) << e;
  EXPECT_TRUE(has(e, "--ranks N")) << e;
  e = detect_error({{"WORLD_SIZE", "2"}});
  EXPECT_TRUE(has(e, "WORLD_SIZE is set (WORLD_SIZE=2) but RANK is not")) << e;
  e = detect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "zero"}});
  EXPECT_TRUE(has(e, "LOCAL_RANK='zero'")) << e;
  e = detect_error({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_TRUE(has(e, "LOCAL_RANK=2 is not a rank of LOCAL_WORLD_SIZE=2")) << e;
  // Empty is unset (export RANK= clears it); LOCAL_RANK alone means nothing.
  EXPECT_EQ(zf::detect_launcher(env_of({{"RANK", ""}, {"LOCAL_RANK", "3"}})).name, "");
}

// CPU ranks in separate processes need MPI: refused, with what to do instead.
TEST(LaunchEnv, CpuRanksWithoutMpiAreRefused) {
  const std::string e = resolve_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}}, "cpu");
  EXPECT_TRUE(has(e, "RANK=0 and WORLD_SIZE=2 are set")) << e;
  EXPECT_TRUE(has(e, "mpirun -np 2")) << e;
  EXPECT_TRUE(has(e, "--ranks 2")) << e;
}

#if defined(ZF_HAVE_NCCL)
TEST(LaunchEnv, GpuRanksTakeTheRendezvousFile) {
  const World w = zf::resolve_world(
      1, "cuda", env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"ZF_RENDEZVOUS", "/shared/rdv"}}));
  EXPECT_TRUE(w.multi_process());
  EXPECT_FALSE(w.mpi);
  EXPECT_EQ(w.size, 2);
  EXPECT_EQ(w.process_rank, 1);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.rendezvous, "/shared/rdv");
  EXPECT_FALSE(w.prints()) << "only rank 0's process prints";
  EXPECT_EQ(w.describe(), "2 ranks (processes, RANK/WORLD_SIZE)");
}

TEST(LaunchEnv, GpuRanksNeedARendezvousFile) {
  const std::string e = resolve_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  EXPECT_TRUE(has(e, "set ZF_RENDEZVOUS")) << e;
}
#else
TEST(LaunchEnv, GpuRanksNeedNccl) {
  const std::string e = resolve_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"ZF_RENDEZVOUS", "/x"}});
  EXPECT_TRUE(has(e, "no NCCL")) << e;
}
#endif

// srun: MPI when it started the processes with PMIx, else like a shell loop.
TEST(LaunchEnv, SrunWithAndWithoutAnMpiPlugin) {
  const Env step = {{"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "2"},
                    {"SLURM_LOCALID", "0"}};
  LauncherInfo l = zf::detect_launcher(env_of(step));
  EXPECT_EQ(l.name, "srun");
  EXPECT_EQ(l.size, 4);
  EXPECT_EQ(l.rank, 2);
  EXPECT_FALSE(l.mpi);
  EXPECT_EQ(l.local_rank, 0);
  const std::string e = resolve_error(step, "cpu");
  EXPECT_TRUE(has(e, "srun started 4 processes without an MPI plugin")) << e;
  EXPECT_TRUE(has(e, "srun --mpi=pmix")) << e;

  Env pmix = step;
  pmix["PMIX_RANK"] = "2";
  l = zf::detect_launcher(env_of(pmix));
  EXPECT_EQ(l.name, "srun");
  EXPECT_TRUE(l.mpi);

  Env batch = step;  // the batch script itself (no step, task 0) is not a launch
  batch.erase("SLURM_STEP_ID");
  batch["SLURM_PROCID"] = "0";
  EXPECT_EQ(zf::detect_launcher(env_of(batch)).name, "");
}

// A task after the first of a Slurm job is a launched process even where
// the step's id is missing: never a lone CPU run beside the others. The
// batch script itself (task 0, no step) still is not.
TEST(LaunchEnv, ALaterSlurmTaskWithoutAStepIsALaunch) {
  const Env task = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}};
  const LauncherInfo l = zf::detect_launcher(env_of(task));
  EXPECT_EQ(l.name, "srun");
  EXPECT_EQ(l.rank, 1);
  EXPECT_EQ(l.size, 2);
  EXPECT_TRUE(has(resolve_error(task, "cpu"), "srun started 2 processes without an MPI plugin"));
  EXPECT_EQ(zf::detect_launcher(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}})).name, "");
  const auto r = zf::test::run_command("SLURM_PROCID=1 SLURM_NTASKS=2 " + zf::test::dp_binary() +
                                       " --model tiny --steps 2 --batch 1 --quiet");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "srun started 2 processes")) << r.output;
}

// A flag error is the same in every process of a launched run: rank 0
// alone says it (mpirun -np 3 printed it three times), every one exits 2.
TEST(LaunchEnv, AFlagErrorIsSaidOnceUnderALauncher) {
  for (const char* rank : {"0", "1", "2"}) {
    const auto r = zf::test::run_command(std::string("OMPI_COMM_WORLD_RANK=") + rank + " OMPI_COMM_WORLD_SIZE=3 " +
                                         zf::test::dp_binary() + " --model tiny --steps many");
    EXPECT_EQ(r.exit_code, 2) << rank << ": " << r.output;
    EXPECT_EQ(has(r.output, "--steps: not a whole number"), std::string(rank) == "0") << rank << ": " << r.output;
  }
}

// WORLD_SIZE=1 with --ranks N: threads, and a note saying why.
TEST(LaunchEnv, WorldSizeOneWithRanksSaysTheyAreThreads) {
  const auto r = zf::test::run_command("RANK=0 WORLD_SIZE=1 " + zf::test::dp_binary() +
                                       " --model tiny --steps 1 --batch 1 --ranks 2 --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "note: WORLD_SIZE=1 says this is the run's only process: its --ranks 2 ranks run as "
                            "threads in it")) << r.output;
  const auto one = zf::test::run_command("RANK=0 WORLD_SIZE=1 " + zf::test::dp_binary() +
                                         " --model tiny --steps 1 --batch 1 --quiet");
  EXPECT_FALSE(has(one.output, "note:")) << one.output;
}

// Who wins when several say something: mpirun, then RANK/WORLD_SIZE (torchrun
// under srun sets them for its children), then srun.
TEST(LaunchEnv, Precedence) {
  Env env = {{"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "0"},
             {"RANK", "3"}, {"WORLD_SIZE", "8"}};
  EXPECT_EQ(zf::detect_launcher(env_of(env)).name, "RANK/WORLD_SIZE");
  EXPECT_EQ(zf::detect_launcher(env_of(env)).rank, 3);
  env["OMPI_COMM_WORLD_SIZE"] = "2";
  env["OMPI_COMM_WORLD_RANK"] = "1";
  const LauncherInfo l = zf::detect_launcher(env_of(env));
  EXPECT_EQ(l.name, "mpirun");
  EXPECT_EQ(l.rank, 1);
  EXPECT_TRUE(l.mpi);
  // A launcher of one process counts as none: the next one speaks.
  env["OMPI_COMM_WORLD_SIZE"] = "1";
  env["OMPI_COMM_WORLD_RANK"] = "0";
  EXPECT_EQ(zf::detect_launcher(env_of(env)).name, "RANK/WORLD_SIZE");
}

// A process needs its own NCCL host id exactly when its GPU is shared.
TEST(LaunchEnv, SharedGpuHostId) {
  EXPECT_EQ(zf::shared_gpu_hostid(0, -1, 1, "node7"), "");                   // local rank 0 of 1 GPU
  EXPECT_EQ(zf::shared_gpu_hostid(1, -1, 1, "node7"), "node7-zf-local1");    // second on 1 GPU
  EXPECT_EQ(zf::shared_gpu_hostid(1, 2, 2, "node7"), "");                    // a GPU each
  EXPECT_EQ(zf::shared_gpu_hostid(0, 4, 2, "node7"), "node7-zf-local0");     // 4 processes, 2 GPUs
  EXPECT_EQ(zf::shared_gpu_hostid(3, 4, 2, "node7"), "node7-zf-local3");
  EXPECT_EQ(zf::shared_gpu_hostid(2, -1, 0, "node7"), "");                   // no GPU: nothing to share
}

// End to end: the stage executable under RANK / WORLD_SIZE on the CPU.
TEST(LaunchEnv, DpRefusesCpuRanksWithoutMpi) {
  const auto r = zf::test::run_command("RANK=1 WORLD_SIZE=2 " + zf::test::dp_binary() +
                                       " --model tiny --steps 1 --batch 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "mpirun -np 2")) << r.output;
  EXPECT_FALSE(has(r.output, "zero-to-fsdp dp |")) << "it started a run: " << r.output;
}

TEST(LaunchEnv, DpRefusesABadRank) {
  const auto r = zf::test::run_command("RANK=one WORLD_SIZE=2 " + zf::test::dp_binary() +
                                       " --model tiny --steps 1 --batch 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "RANK='one' is not a whole number")) << r.output;
}

}  // namespace
