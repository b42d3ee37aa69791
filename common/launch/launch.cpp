// launch.cpp: run the ranks of a run (launch.h): N threads of this process,
// or this process's one rank, over MPI or, for GPU ranks without MPI, NCCL
// with its id passed through a rendezvous file.
//
//   build/00_data_parallel/dp --ranks 4          four ranks as threads
//   mpirun -np 4 build/00_data_parallel/dp       four processes, one rank each
//   export WORLD_SIZE=2 ZF_RENDEZVOUS=/tmp/zf-$$               (GPU only: two processes)
//   for r in 0 1; do RANK=$r build/00_data_parallel/dp --device cuda & done; wait
//
// Threads: each rank thread tags itself with its rank (so every error message
// names it), owns its MemoryTracker and its Communicator, and runs the stage's
// function. The whole point of this part is the failure path: when a rank
// throws, the group is aborted at once, so the other ranks' collectives raise
// CommAborted instead of waiting forever for a rank that will never come;
// after joining, run_ranks throws one error naming the rank that failed first
// and what went wrong there (its own message, not the CommAborted echoes).
//
// Processes: the same harness around the one rank of this process, with the
// `mpi` communicator (comm_mpi.h). The failure path differs because the other
// ranks are other processes, possibly waiting inside MPI for this one: the
// failing rank prints its error naming itself, then ends the whole job with
// MPI_Abort (mpirun then kills every process and exits non-zero).
//
// Processes without MPI (the env launch): the harness once more, on NCCL. A
// failing rank aborts its NCCL communicator (so nothing of it waits for the
// peers) and its process exits with the error; the peers' NCCL sees the
// connection drop (or their watchdog's timeout) and they exit too.
#include "launch.h"

#include "device_profile.h"
#include "dry_device.h"
#include "fibers.h"
#include "modeled_clock.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <unistd.h>
#include <vector>

#include "blas.h"
#include "comm_threads.h"
#if defined(ZF_HAVE_CUDA)
#include "comm_threads_cuda.h"
#endif
#if defined(ZF_HAVE_NCCL)
#include "comm_nccl.h"
#endif
#ifdef ZF_HAVE_MPI
#include "comm_mpi.h"
#endif

namespace zf {

#if defined(ZF_HAVE_NCCL)
// --comm-timeout bounds NCCL's collectives too. Its set-up keeps at least
// ZF_NCCL_TIMEOUT_S (default 600 s): a timeout short enough to catch a
// stalled peer quickly must not cut NCCL's start-up short.
static NcclOptions nccl_options(double comm_timeout_s) {
  if (comm_timeout_s <= 0) return {};
  return NcclOptions{comm_timeout_s, std::max(comm_timeout_s, nccl_timeout_from_env())};
}
#endif

// Communicators for GPU ranks that are threads of this process: NCCL when
// every rank has a GPU of its own, else the threads backend on device
// buffers (virtual ranks sharing a GPU, for a one-GPU user).
static std::vector<std::unique_ptr<Communicator>> make_gpu_thread_communicators(
    std::vector<std::unique_ptr<Device>>& devices, [[maybe_unused]] double timeout_s) {
  [[maybe_unused]] const int N = int(devices.size());  // unused without NCCL
  std::vector<std::unique_ptr<Communicator>> comms;
#if defined(ZF_HAVE_NCCL)
  if (N > 1 && cuda_device_count() >= N) {
    std::vector<int> ordinals;
    for (auto& d : devices) ordinals.push_back(d->ordinal());
    for (auto& c : NcclCommunicator::create_group(ordinals, nccl_options(timeout_s)))
      comms.push_back(std::move(c));
    for (int r = 0; r < N; r++)
      static_cast<NcclCommunicator&>(*comms[r]).set_compute_stream(
          static_cast<cudaStream_t>(devices[r]->native_stream()));
    return comms;
  }
#endif
#if defined(ZF_HAVE_CUDA)
  std::vector<cudaStream_t> streams;
  for (auto& d : devices) streams.push_back(static_cast<cudaStream_t>(d->native_stream()));
  return make_thread_communicators_cuda(N, streams);
#else
  throw UsageError("--device cuda: " + cuda_device_unavailable_reason());
#endif
}

#if defined(ZF_HAVE_MPI)
// One GPU rank per process: rank 0 makes NCCL's id, MPI broadcasts it.
static std::unique_ptr<Communicator> make_nccl_over_mpi(Communicator& mpi, Device& dev,
                                                        [[maybe_unused]] double timeout_s) {
#if defined(ZF_HAVE_NCCL)
  ncclUniqueId id{};
  if (mpi.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  static_assert(sizeof(id) % 8 == 0, "ncclUniqueId is broadcast as 64-bit words");
  mpi.broadcast(&id, sizeof(id) / 8, DType::i64, 0);
  auto nccl = NcclCommunicator::create(id, mpi.rank(), mpi.size(), dev.ordinal(),
                                       nccl_options(timeout_s));
  nccl->set_compute_stream(static_cast<cudaStream_t>(dev.native_stream()));
  return nccl;
#else
  throw UsageError("--device cuda under mpirun needs NCCL, which this build does not have "
                   "(reconfigure with -Dnccl=enabled, or -Dnccl_dir=... for the nvidia-nccl wheel)");
#endif
}
#endif

// The device of rank r: the simulated CPU device, or GPU r % (GPUs visible).
[[maybe_unused]] static std::unique_ptr<Device> make_rank_device(const LaunchOptions& opt, int r) {
  if (opt.device != "cuda") return make_cpu_device();
  return make_cuda_device(r);
}

// With ZF_PROFILE=1, the device times its ops and rank 0 prints the table
// at the end (device_profile.h).
static std::unique_ptr<Device> maybe_profiled(std::unique_ptr<Device> dev, int rank) {
  return profiling_requested() ? make_profiling_device(std::move(dev), rank == 0) : std::move(dev);
}

namespace {

struct Failure {
  int rank;
  std::exception_ptr error;
  std::string what;
  bool aborted;  // a CommAborted: an echo of another rank's failure
};

// The message of any exception, and whether it is only a CommAborted echo.
void describe_exception(std::exception_ptr e, std::string& what, bool& aborted) {
  aborted = false;
  try {
    std::rethrow_exception(e);
  } catch (const CommAborted& ex) {
    what = ex.what();
    aborted = true;
  } catch (const std::exception& ex) {
    what = ex.what();
  } catch (...) {
    what = "unknown exception (not derived from std::exception)";
  }
}

// What a rank of its own process does first when it fails, whatever the
// launch: abort its communicator, so that no peer waits for it. Returns the
// error's message.
[[maybe_unused]] std::string abort_for_failure(Communicator& comm, int r, std::exception_ptr e) {
  std::string what;
  bool aborted = false;
  describe_exception(e, what, aborted);
  comm.abort("rank " + std::to_string(r) + " failed: " + what);
  return what;
}

// The exit status stage_main gives each kind of error (stage_main.h).
[[maybe_unused]] int exit_status_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const OutOfMemory&) {
    return 3;
  } catch (const UsageError&) {
    return 2;
  } catch (...) {
  }
  return 1;
}

// Rethrows a rank's failure as one error naming the rank, of the same kind,
// so a CLI prints a user mistake or an out-of-memory plainly and exits with
// the right status.
[[noreturn]] void throw_rank_failure(int rank, std::exception_ptr error, const std::string& what) {
  const std::string msg = "rank " + std::to_string(rank) + " failed: " + what;
  try {
    std::rethrow_exception(error);
  } catch (const OutOfMemory&) {
    throw OutOfMemory(msg);
  } catch (const UsageError&) {
    throw UsageError(msg);
  } catch (const CommAborted&) {
    throw CommAborted(msg);
  } catch (...) {
  }
  throw Error(msg);
}

// The first failure that is not an echo of another rank's (if every one is,
// someone aborted the group from outside: the first of them), rethrown;
// `stuck` names the ranks left behind.
[[noreturn]] void throw_first_failure(const std::vector<Failure>& failures, const std::string& stuck = "") {
  auto first = std::find_if(failures.begin(), failures.end(), [](const Failure& f) { return !f.aborted; });
  if (first == failures.end()) first = failures.begin();
  throw_rank_failure(first->rank, first->error, first->what + stuck);
}

// Joins the rank threads. Once a rank has failed (the group is aborted, so
// every rank still in a collective raises), the others get `grace` seconds
// to return; one that has not by then is stuck outside any collective (a
// deadlock, an endless loop: the rank that made the others' collectives
// time out). It cannot be stopped, so it is detached and left behind, and
// the returned text (for the error) names it: the process should exit. Its
// thread must then never return: it uses this frame's state.
std::string join_rank_threads(std::vector<std::thread>& threads, std::mutex& mu,
                              std::condition_variable& done_cv, const std::vector<Failure>& failures,
                              const std::vector<char>& returned, double grace) {
  const size_t started = threads.size();
  auto all_returned = [&] {
    return size_t(std::count(returned.begin(), returned.begin() + long(started), char(1))) == started;
  };
  {
    std::unique_lock<std::mutex> lock(mu);
    done_cv.wait(lock, [&] { return all_returned() || !failures.empty(); });
    done_cv.wait_for(lock, std::chrono::duration<double>(grace), all_returned);
  }
  std::vector<int> stuck;
  for (size_t r = 0; r < started; r++) {
    bool back;
    {
      std::lock_guard<std::mutex> lock(mu);
      back = returned[r] != 0;
    }
    if (back) {
      threads[r].join();
    } else {
      stuck.push_back(int(r));
      threads[r].detach();
    }
  }
  if (stuck.empty()) return "";
  std::ostringstream s;
  s << " (" << rank_names(stuck) << (stuck.size() == 1 ? " has" : " have") << " still not returned "
    << grace << " s after the others were stopped, and " << (stuck.size() == 1 ? "is" : "are")
    << " left behind)";
  return s.str();
}

#if defined(ZF_HAVE_NCCL)
// This machine's name as gethostname gives it, for NCCL_HOSTID (output_file.h's
// host_name() is the same name made fit for a file name).
std::string machine_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "host";
  return buf;
}

// One GPU rank per process, on GPU local_rank % (GPUs visible): when that
// GPU is shared with another process of the run, gives this process its own
// NCCL_HOSTID (unless the user set one) and says so. Must run before this
// process's first NCCL call: NCCL reads NCCL_HOSTID once, the first time it
// needs the host's identity.
void share_gpu_if_needed(int rank, int local_rank, int local_size) {
  const int gpus = cuda_device_count();
  const std::string hostid = shared_gpu_hostid(local_rank, local_size, gpus, machine_name());
  if (hostid.empty()) return;
  const char* set = std::getenv("NCCL_HOSTID");
  const bool own = !(set && *set);
  if (own) ::setenv("NCCL_HOSTID", hostid.c_str(), 1);
  std::fprintf(stderr,
               "note: rank %d shares GPU %d with another process of this run (local rank %d, %d "
               "GPU(s) visible): with NCCL_HOSTID=%s%s NCCL takes this process for a host of its "
               "own and connects it over its network transport. A correctness-only mode: the "
               "results are right, the speed is not a GPU's.\n",
               rank, local_rank % gpus, local_rank, gpus, own ? hostid.c_str() : set,
               own ? "" : " (from the environment)");
}
#endif

// This process's one rank of a run under an MPI launcher (see the file comment).
void run_mpi_process_rank(const LaunchOptions& opt, const World& world,
                           const std::function<void(RankContext&)>& fn) {
#ifdef ZF_HAVE_MPI
  mpi_init_once();
  const int N = mpi_world_size(), r = mpi_world_rank();
  REQUIRE(N == world.size && r == world.process_rank,
          world.launcher << " says this process is rank " << world.process_rank << " of "
                         << world.size << ", but MPI says rank " << r << " of " << N
                         << ": was this program started by another MPI's launcher?");
  set_current_rank(r);
  // The processes on this host share its cores, as rank threads do.
  blas_set_threads(std::max(1, hardware_cores() / std::max(1, mpi_local_size())));
  const int local_rank = mpi_local_rank();
  std::unique_ptr<Communicator> comm = make_mpi_communicator(opt.comm_timeout_s);
  // Outside the try, so that a failure can abort NCCL below: left to its
  // destructor, a failed rank would close it cleanly, and a clean close may
  // wait for the other ranks (newer NCCL versions do), who are stuck in a
  // collective waiting for this one.
  std::unique_ptr<Device> dev;
  std::unique_ptr<Communicator> nccl, control;
  try {
    dev = maybe_profiled(make_rank_device(opt, local_rank), r);
    MemoryTracker mem(r, opt.device_budget);
    mem.set_device(dev.get());
    // GPU ranks train over NCCL; MPI only hands out NCCL's id (and stays for
    // gathering the results at the end, through host_collectives).
#if defined(ZF_HAVE_NCCL)
    if (dev->is_cuda()) share_gpu_if_needed(r, local_rank, mpi_local_size());  // before any NCCL call
#endif
    nccl = dev->is_cuda() ? make_nccl_over_mpi(*comm, *dev, opt.comm_timeout_s) : nullptr;
    // The stop vote's channel (rank.h): a communicator of its own. None on
    // a GPU: signals stop at a step boundary on the CPU device only, until
    // the GPU path has been run (docs/GPU.md).
    if (!dev->is_cuda()) control = make_mpi_communicator(opt.comm_timeout_s);
    RankContext ctx{r, N, nccl ? *nccl : *comm, mem, *dev, control.get(), mpi_local_size()};
    fn(ctx);
  } catch (...) {
    const std::exception_ptr e = std::current_exception();
    if (nccl) abort_for_failure(*nccl, r, e);
    const std::string what = abort_for_failure(*comm, r, e);
    const int status = exit_status_of(e);
    std::fprintf(stderr,
                 "%s: error: rank %d failed: %s\n"
                 "%s: rank %d ends the whole job (MPI_Abort, exit status %d): the other ranks "
                 "wait inside MPI and cannot be stopped any other way\n",
                 program_invocation_short_name, r, what.c_str(), program_invocation_short_name, r,
                 status);
    mpi_abort_job(status);
  }
  // Leaves the group: a rank still waiting for this one to join a collective
  // gets an error naming it, not a hang. NCCL first (it waits for this rank's
  // collectives, then closes), then the device its streams belong to.
  nccl.reset();
  control.reset();
  dev.reset();
  comm.reset();
  set_current_rank(-1);
#else
  (void)opt;
  (void)fn;
  throw UsageError(world.launcher + " started this process as one of " + std::to_string(world.size) +
                   ", but this build has no MPI backend");  // resolve_world says it first
#endif
}

// This process's one rank of a run started without MPI (the env launch):
// NCCL, its id through the rendezvous file (see the file comment).
void run_env_process_rank(const LaunchOptions& opt, const World& world,
                          const std::function<void(RankContext&)>& fn) {
#if defined(ZF_HAVE_NCCL)
  const int r = world.process_rank, N = world.size;
  set_current_rank(r);
  // The processes on this host share its cores, as rank threads do (when
  // the launcher says how many there are).
  blas_set_threads(std::max(1, hardware_cores() / std::max(1, world.local_size)));
  share_gpu_if_needed(r, world.local_rank, world.local_size);  // before any NCCL call
  std::unique_ptr<Device> dev = maybe_profiled(make_cuda_device(world.local_rank), r);
  dev->make_current();
  MemoryTracker mem(r, opt.device_budget);
  mem.set_device(dev.get());
  std::unique_ptr<NcclCommunicator> comm =
      NcclCommunicator::create_from_file(world.rendezvous, r, N, dev->ordinal(),
                                         nccl_options(opt.comm_timeout_s));
  comm->set_compute_stream(static_cast<cudaStream_t>(dev->native_stream()));
  try {
    RankContext ctx{r, N, *comm, mem, *dev, nullptr, std::max(0, world.local_size)};
    fn(ctx);
  } catch (...) {
    const std::exception_ptr e = std::current_exception();
    // Nothing of this rank waits for its peers any more, and no collective
    // touches its buffers; the peers see the connection drop when this
    // process exits, or time out.
    const std::string what = abort_for_failure(*comm, r, e);
    comm.reset();
    set_current_rank(-1);
    throw_rank_failure(r, e, what);
  }
  // Waits for this rank's collectives, then closes the NCCL communicator.
  comm.reset();
  set_current_rank(-1);
#else
  (void)opt;
  (void)fn;
  throw UsageError(world.launcher + " started this process as one of " + std::to_string(world.size) +
                   ", but this build has no NCCL");  // resolve_world says it first
#endif
}

}  // namespace

void run_ranks(const LaunchOptions& opt, const std::function<void(RankContext&)>& fn) {
  USAGE_REQUIRE(opt.ranks >= 1, "--ranks must be at least 1, got " << opt.ranks);
  const World world = resolve_world(opt.ranks, opt.device);
  if (world.multi_process())
    return world.mpi ? run_mpi_process_rank(opt, world, fn) : run_env_process_rank(opt, world, fn);
  const int N = opt.ranks;
  REQUIRE(!opt.dry_run || opt.hardware, "a dry run is the modeled clock's: it needs the hardware it models");
  // GPU ranks get their devices first: their communicators are ordered
  // after the devices' compute streams.
  std::vector<std::unique_ptr<Device>> gpu_devices;
  if (opt.device == "cuda")
    for (int r = 0; r < N; r++) gpu_devices.push_back(make_cuda_device(r));
  // Each communicator of the threads backend has a thread of its own: past
  // the process's limits the system refuses one, and says only why.
  // And, on the CPU device, a second group for the stop vote at the end of
  // each step (rank.h; none on a GPU until the GPU path has been run,
  // docs/GPU.md).
  // A dry run has no backend: its ranks only meet in the modeled clock's groups.
  std::vector<std::unique_ptr<Communicator>> comms, controls;
  try {
    if (opt.dry_run)
      comms.resize(size_t(N));
    else
      comms = opt.device == "cuda" ? make_gpu_thread_communicators(gpu_devices, opt.comm_timeout_s)
                                   : make_thread_communicators(N, opt.comm_timeout_s);
    if (opt.device != "cuda" && !opt.dry_run) controls = make_thread_communicators(N, opt.comm_timeout_s);
  } catch (const std::system_error& e) {
    throw Error("could not make the communicators of the " + std::to_string(N) +
                " ranks (each has a thread; the system could not make another: " + e.what() +
                "); ask for fewer --ranks, or raise the limits on threads and memory (ulimit -u, ulimit -v)");
  }

  // --clock modeled: each rank's clock, which its device and communicator charge.
  std::vector<std::unique_ptr<RankClock>> clocks;
  if (opt.hardware) {
    const std::shared_ptr<ClockGroup> group = make_clock_group(N, opt.comm_timeout_s);
    for (int r = 0; r < N; r++) {
      clocks.push_back(std::make_unique<RankClock>(*opt.hardware, N));
      if (r < opt.record_clock) clocks.back()->record();
      if (opt.dry_run) clocks.back()->set_dry();
      comms[r] = make_modeled_communicator(std::move(comms[r]), group, r, *clocks[r]);
    }
  }

  // Guards failures and returned; done_cv tells run_ranks a rank returned.
  std::mutex failures_mu;
  std::condition_variable done_cv;
  std::vector<Failure> failures;  // in the order they happened
  std::vector<char> returned(size_t(N), 0);
  // The ranks begin together, once every thread exists (or could not be
  // made): a rank running while the others are still being made would
  // reach BLAS, whose buffers then compete for the memory the missing
  // threads needed (OpenBLAS retries a failed allocation for ever).
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  int gate = 0;  // 0 closed, 1 every rank started, -1 not every rank could
  auto wait_for_gate = [&] {
    std::unique_lock<std::mutex> lock(gate_mu);
    gate_cv.wait(lock, [&] { return gate != 0; });
    return gate > 0;
  };
  auto open_gate = [&](bool all_started) {
    {
      std::lock_guard<std::mutex> lock(gate_mu);
      gate = all_started ? 1 : -1;
    }
    gate_cv.notify_all();
  };

  auto rank_main = [&](int r) {
    set_current_rank(r);
    // Every rank calls BLAS at the same time: share the cores between them.
    blas_set_threads(std::max(1, hardware_cores() / N));
    std::unique_ptr<Communicator> comm = std::move(comms[r]);
    std::unique_ptr<Communicator> control = controls.empty() ? nullptr : std::move(controls[r]);
    const bool all_started = wait_for_gate();  // else the group is aborted: nothing to run
    RankClock* clock = clocks.empty() ? nullptr : clocks[r].get();
    try {
      std::unique_ptr<Device> dev = opt.dry_run ? make_dry_device()
                                                : maybe_profiled(gpu_devices.empty() ? make_cpu_device()
                                                                                     : std::move(gpu_devices[r]),
                                                                 r);
      if (clock) dev = make_modeled_device(std::move(dev), *clock);
      dev->make_current();
      MemoryTracker mem(r, opt.device_budget);
      mem.set_device(dev.get());
      mem.set_unbacked_host(opt.dry_run);
      RankContext ctx{r, N, *comm, mem, *dev, control.get(), N, clock};
      if (all_started) fn(ctx);
    } catch (...) {
      Failure f{r, std::current_exception(), "", false};
      describe_exception(f.error, f.what, f.aborted);
      {
        std::lock_guard<std::mutex> lock(failures_mu);
        failures.push_back(f);
      }
      // Wake every rank still waiting in a collective (a no-op if the group
      // was already aborted by the rank that really failed).
      comm->abort("rank " + std::to_string(r) + " failed: " + f.what);
      if (control) control->abort("rank " + std::to_string(r) + " failed: " + f.what);
    }
    // Finishes this rank's queued collectives, then leaves the group: a rank
    // still waiting for this one to join a collective gets an error, not a hang.
    control.reset();
    comm.reset();
    set_current_rank(-1);
    set_current_step(-1);
    {
      std::lock_guard<std::mutex> lock(failures_mu);
      returned[size_t(r)] = 1;
    }
    done_cv.notify_all();
  };

  // A dry run's ranks are fibers on this thread (fibers.h): thousands of
  // them, each running until it waits for the others.
  if (opt.dry_run) {
    open_gate(true);
    const double stall_s = comm_timeout_or_default(opt.comm_timeout_s);
    run_fibers(N, rank_main, stall_s, [stall_s](int r) {
      // The stuck rank holds the only thread: nothing can unwind it.
      std::fprintf(stderr,
                   "%s: error: rank %d of the dry run has run %.0f s (--comm-timeout) without waiting for the "
                   "others or returning: it is stuck (an endless loop?); stopping the process\n",
                   program_invocation_short_name, r, stall_s);
      std::_Exit(1);
    });
    if (failures.empty()) return;
    throw_first_failure(failures);
  }

  // Starting the threads can fail part-way (the process's thread or memory
  // limits). The ranks already started wait at the gate; the group is
  // aborted through a rank that did not start, as a failing rank does, the
  // gate opens on nothing to run, and they are joined; then the error says
  // how many started and why the next could not.
  std::vector<std::thread> threads;
  std::string start_failure;
  try {
    threads.reserve(N);
    for (int r = 0; r < N; r++) threads.emplace_back(rank_main, r);
  } catch (const std::exception& e) {
    const int started = int(threads.size());
    start_failure = "only " + std::to_string(started) + " of the " + std::to_string(N) +
                    " rank threads started: the system could not make another (" + e.what() +
                    "); ask for fewer --ranks, or raise the limits on threads and memory (ulimit -u, ulimit -v)";
    comms[started]->abort(start_failure);
    if (!controls.empty()) controls[started]->abort(start_failure);
  }
  open_gate(start_failure.empty());
  const std::string stuck = join_rank_threads(threads, failures_mu, done_cv, failures, returned,
                                              comm_timeout_or_default(opt.comm_timeout_s));
  if (!start_failure.empty()) throw Error(start_failure);

  if (!failures.empty()) throw_first_failure(failures, stuck);
}

}  // namespace zf
