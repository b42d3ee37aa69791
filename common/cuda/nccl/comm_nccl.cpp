// comm_nccl.cpp: the `nccl` backend (comm_nccl.h), first of three files:
// NCCL's error check, the timeout, creating the communicators (ranks as
// threads of this process, or one rank per process with an NCCL id from MPI
// or from a rendezvous file, each polled to readiness within the creation
// timeout), and a rank's start and close (its streams, its watchdog thread,
// finalizing its NCCL communicator). The classes and how the backend works:
// comm_nccl_impl.h. Issuing a collective: comm_nccl_collectives.cpp. The
// watchdog, failures and abort: comm_nccl_watchdog.cpp.
#include "comm_nccl.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm_nccl_impl.h"
#include "kernels_cuda.h"  // CUDA_CHECK
#include "rendezvous.h"

namespace zf {

void nccl_check(ncclResult_t result, const char* call, const char* file, int line) {
  if (result == ncclSuccess) return;
  const char* last = ncclGetLastError(nullptr);
  fail_at(file, line,
          std::string("NCCL error ") + ncclGetErrorString(result) + " in " + call +
              (last && *last ? std::string(": ") + last : std::string()));
}

double nccl_timeout_from_env() {
  const char* v = std::getenv("ZF_NCCL_TIMEOUT_S");
  if (!v || !*v) return 600.0;
  char* end = nullptr;
  errno = 0;
  const double s = std::strtod(v, &end);
  USAGE_REQUIRE(errno == 0 && *end == '\0' && std::isfinite(s) && s > 0,
                "ZF_NCCL_TIMEOUT_S=" << v << " is not a positive number of seconds");
  return s;
}

using nccl_detail::Clock;
using nccl_detail::NcclGroup;
using nccl_detail::NcclRank;
using nccl_detail::nccl_error_text;
using nccl_detail::seconds_since;

namespace {

double resolve_timeout(const NcclOptions& opt) {
  return opt.timeout_s > 0 ? opt.timeout_s : nccl_timeout_from_env();
}
double resolve_init_timeout(const NcclOptions& opt) {
  return opt.init_timeout_s > 0 ? opt.init_timeout_s : resolve_timeout(opt);
}

void require_device(int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) (void)cudaGetLastError();
  REQUIRE(err == cudaSuccess, "nccl backend: no CUDA device (cudaGetDeviceCount: "
                                  << cudaGetErrorString(err) << ")");
  REQUIRE(device >= 0 && device < count, "nccl backend: CUDA device " << device
                                             << " does not exist: this machine has " << count
                                             << " (0.." << count - 1 << ")");
}

// Polls a non-blocking NCCL communicator being created until it is ready.
// Throws, after aborting it, on an error or after `timeout_s`.
void wait_until_ready(ncclComm_t comm, int rank, int world, double timeout_s,
                      const std::string& hint, Clock::time_point t0 = Clock::now()) {
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    if (q != ncclSuccess) state = q;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      const std::string why = nccl_error_text(state);
      ncclCommAbort(comm);
      throw Error("[rank " + std::to_string(rank) + "] creating the NCCL communicator of " +
                  std::to_string(world) + " ranks failed: " + why);
    }
    if (seconds_since(t0) > timeout_s) {
      ncclCommAbort(comm);
      std::ostringstream s;
      s << "[rank " << rank << "] creating the NCCL communicator of " << world
        << " ranks did not finish within " << timeout_s << " s (ZF_NCCL_TIMEOUT_S): " << hint;
      throw Error(s.str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // no call blocks: every wait is ours, with its checks
  // NCCL_COMM_BLOCKING in the environment overrides the config (NCCL's
  // parameter of that name): with 1, NCCL's own calls wait (the creation for
  // every rank to join, with no timeout), and a missing rank hangs there.
  static const bool warned = [] {
    const char* b = std::getenv("NCCL_COMM_BLOCKING");
    if (b && std::strcmp(b, "1") == 0)
      std::fprintf(stderr,
                   "warning: NCCL_COMM_BLOCKING=1 makes NCCL's calls block: ZF_NCCL_TIMEOUT_S can "
                   "then not end a wait inside NCCL (a missing rank hangs the others). Unset it.\n");
    return true;
  }();
  (void)warned;
  return config;
}

}  // namespace

// ------------------------------------------------------------------ creation

std::vector<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create_group(
    const std::vector<int>& devices, const NcclOptions& opt) {
  const int N = int(devices.size());
  REQUIRE(N >= 1, "NcclCommunicator::create_group: need at least one device");
  REQUIRE(std::set<int>(devices.begin(), devices.end()).size() == devices.size(),
          "NcclCommunicator::create_group: the devices must be distinct (NCCL does not allow two "
          "ranks of one communicator on one GPU; use the threads backend for virtual ranks)");
  for (int d : devices) require_device(d);
  const double timeout = resolve_timeout(opt), init_timeout = resolve_init_timeout(opt);

  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  std::vector<ncclComm_t> comms(size_t(N), nullptr);
  ncclConfig_t config = nonblocking_config();
  int prev = -1;
  cudaGetDevice(&prev);
  // One thread creates the N communicators: a group call, so that NCCL does
  // not wait in the first init for the others to join.
  NCCL_CHECK(ncclGroupStart());
  ncclResult_t first_error = ncclSuccess;
  int error_rank = -1;
  for (int r = 0; r < N; r++) {
    ncclResult_t res = ncclUnhandledCudaError;
    if (cudaSetDevice(devices[size_t(r)]) == cudaSuccess)
      res = ncclCommInitRankConfig(&comms[size_t(r)], N, id, r, &config);
    if (res != ncclSuccess && res != ncclInProgress && first_error == ncclSuccess) {
      first_error = res;
      error_rank = r;
    }
  }
  const ncclResult_t group_end = ncclGroupEnd();
  if (prev >= 0) cudaSetDevice(prev);
  auto abort_all = [&] {
    for (ncclComm_t& c : comms)
      if (c) ncclCommAbort(c);
  };
  if (first_error != ncclSuccess) {
    abort_all();
    throw Error("[rank " + std::to_string(error_rank) + "] creating the NCCL communicator of " +
                std::to_string(N) + " ranks failed: " + nccl_error_text(first_error));
  }
  if (group_end != ncclSuccess && group_end != ncclInProgress) {
    abort_all();
    throw Error("creating the NCCL communicators of " + std::to_string(N) +
                " in-process ranks failed: " + nccl_error_text(group_end));
  }
  for (int r = 0; r < N; r++) {
    if (!comms[size_t(r)]) {
      abort_all();
      throw Error("[rank " + std::to_string(r) + "] NCCL returned no communicator");
    }
  }
  // One deadline for the whole group (polling the ranks one after the other,
  // each with a fresh timeout, could take N times the timeout).
  const auto t0 = Clock::now();
  for (int r = 0; r < N; r++) {
    try {
      wait_until_ready(comms[size_t(r)], r, N, init_timeout,
                       "the NCCL communicators of one process did not connect to each other", t0);
    } catch (...) {
      comms[size_t(r)] = nullptr;  // aborted by wait_until_ready
      abort_all();
      throw;
    }
  }

  auto group = std::make_shared<NcclGroup>();
  std::vector<std::unique_ptr<NcclCommunicator>> out;
  out.reserve(size_t(N));
  for (int r = 0; r < N; r++) {
    ncclComm_t c = comms[size_t(r)];
    comms[size_t(r)] = nullptr;  // owned by the NcclRank from here (or aborted by it)
    try {
      out.push_back(std::make_unique<NcclRank>(group, c, r, N, devices[size_t(r)], timeout));
    } catch (...) {
      abort_all();  // the ranks not yet made; the ones made abort in their destructors
      out.clear();
      throw;
    }
  }
  return out;
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(const ncclUniqueId& id, int rank,
                                                           int world, int device,
                                                           const NcclOptions& opt) {
  REQUIRE(world >= 1 && rank >= 0 && rank < world,
          "NcclCommunicator::create: rank " << rank << " is not a rank of a world of " << world);
  require_device(device);
  const double timeout = resolve_timeout(opt), init_timeout = resolve_init_timeout(opt);
  ncclConfig_t config = nonblocking_config();
  ncclComm_t comm = nullptr;
  {
    DeviceGuard g(device);
    const ncclResult_t res =
        ncclCommInitRankConfig(&comm, world, id, rank, &config);
    if (res != ncclSuccess && res != ncclInProgress) {
      if (comm) ncclCommAbort(comm);
      throw Error("[rank " + std::to_string(rank) + "] creating the NCCL communicator of " +
                  std::to_string(world) + " ranks failed: " + nccl_error_text(res));
    }
    REQUIRE(comm, "[rank " << rank << "] NCCL returned no communicator");
    wait_until_ready(comm, rank, world, init_timeout,
                     "are all " + std::to_string(world) +
                         " ranks running (RANK 0.." + std::to_string(world - 1) +
                         "), with the same NCCL id (the same rendezvous file)? Each rank needs its "
                         "own GPU, or its own NCCL_HOSTID when several processes share one.");
  }
  return std::make_unique<NcclRank>(std::make_shared<NcclGroup>(), comm, rank, world, device,
                                    timeout);
}

// ------------------------------------------------------------------ file rendezvous

std::unique_ptr<NcclCommunicator> NcclCommunicator::create_from_file(const std::string& path,
                                                                     int rank, int world,
                                                                     int device,
                                                                     const NcclOptions& opt) {
  REQUIRE(world >= 1 && rank >= 0 && rank < world,
          "NcclCommunicator::create_from_file: rank " << rank << " is not a rank of a world of "
                                                      << world);
  NcclOptions o = opt;
  o.timeout_s = resolve_timeout(opt);
  o.init_timeout_s = resolve_init_timeout(opt);
  ncclUniqueId id{};
  if (rank == 0) {
    NCCL_CHECK(ncclGetUniqueId(&id));
    // Kept fresh (and so takeable) until create() returns: by then every
    // rank has joined with this id. Removed on the way out, error or not.
    RendezvousPublisher published(path, std::string(id.internal, sizeof(id.internal)), world);
    return create(id, rank, world, device, o);
  }
  const std::string bytes = rendezvous_read(path, rank, world, o.init_timeout_s);
  USAGE_REQUIRE(bytes.size() == sizeof(id.internal),
                "rank " << rank << ": the rendezvous file " << path << " holds " << bytes.size()
                        << " bytes, not an NCCL id (" << sizeof(id.internal)
                        << "): was it written by another program?");
  std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  return create(id, rank, world, device, o);
}

// ------------------------------------------------------------------ one rank: start and close

namespace nccl_detail {

// ncclCommSplit on this rank's NCCL communicator, from the rank's thread, in
// the order of its collectives (NCCL orders it with them on the parent).
// Non-blocking like the creation: the child is polled until ready within
// the creation timeout. A rank passing a color < 0 takes part as
// NCCL_SPLIT_NOCOLOR (so the others do not wait for it) and raises an
// Error; the others get a child without it (NCCL does not compare the
// ranks' calls). Tested on the emulated GPU (test_comm_nccl.cpp), not yet
// run on GPUs.
std::unique_ptr<Communicator> NcclRank::split(int color, int key) {
  const uint64_t no = splits_++;
  ncclConfig_t config = nonblocking_config();
  ncclComm_t child = nullptr;
  std::string failed;
  {
    DeviceGuard g(device_);
    std::lock_guard<std::mutex> lock(nccl_mu_);
    if (!comm_)
      throw CommAborted("[rank " + std::to_string(rank_) + "] split: the communicator has failed" +
                        (group_->aborted() ? ": " + group_->reason() : std::string()));
    const ncclResult_t res =
        ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
    if (res != ncclSuccess && res != ncclInProgress)
      throw Error("[rank " + std::to_string(rank_) + "] ncclCommSplit failed: " +
                  nccl_error_text(res));
    // Non-blocking: the parent takes no other call until its part is done.
    const auto t0 = Clock::now();
    for (;;) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
      if (q != ncclSuccess) state = q;
      if (state == ncclSuccess) break;
      if (state != ncclInProgress || seconds_since(t0) > timeout_s_) {
        failed = "[rank " + std::to_string(rank_) + "] ncclCommSplit did not complete: " +
                 (state == ncclInProgress ? std::string("timeout (ZF_NCCL_TIMEOUT_S)")
                                          : nccl_error_text(state));
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (!failed.empty()) {
    // NCCL's split job writes the child's handle into `child` when it ends,
    // failed too, and the parent's abort waits for that end: so the parent
    // (which takes no call before the split ends) is aborted, failing this
    // rank, while `child` still exists.
    fail(failed, false);
    DeviceGuard g(device_);
    if (child) ncclCommAbort(child);
    throw Error(failed);
  }
  if (color < 0) {
    if (child) ncclCommAbort(child);
    throw Error("[rank " + std::to_string(rank_) + "] split: color " + std::to_string(color) +
                " is not a color; every rank must pass a color >= 0 (the ranks of one color form "
                "one communicator)");
  }
  REQUIRE(child, "[rank " << rank_ << "] ncclCommSplit returned no communicator");
  int n = 0, r = 0;
  {
    DeviceGuard g(device_);
    wait_until_ready(child, rank_, size_, resolve_init_timeout(NcclOptions{timeout_s_, 0}),
                     "did every rank of the parent call split, in the same order?");
    NCCL_CHECK(ncclCommCount(child, &n));
    NCCL_CHECK(ncclCommUserRank(child, &r));
  }
  auto made = std::make_unique<NcclRank>(group_->child(no, color, n), child, r, n, device_, timeout_s_);
  // The same compute stream as the parent: the child's collectives read what
  // the rank computed, and their waits order the rank's next kernels.
  made->set_compute_stream(compute_stream_);
  return made;
}

// Takes over `comm` (ready: created and polled until ncclSuccess).
NcclRank::NcclRank(std::shared_ptr<NcclGroup> group, ncclComm_t comm, int rank, int size,
                   int device, double timeout_s)
    : group_(std::move(group)), rank_(rank), size_(size), device_(device),
      timeout_s_(timeout_s), comm_(comm) {
  try {
    DeviceGuard g(device_);
    // Non-blocking: no implicit ordering with the legacy default stream;
    // the communication stream waits only where an event says so.
    CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&tail_, cudaEventDisableTiming));
    CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));  // the barrier's one float
    CUDA_CHECK(cudaMemset(scratch_, 0, sizeof(float)));
  } catch (...) {
    ncclCommAbort(comm_);
    release_cuda();
    throw;
  }
  group_->join(this);
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

// Lets the pending collectives finish (the other ranks expect them; the
// watchdog's timeout bounds the wait), then closes the NCCL communicator.
// It stays a member of the group meanwhile, so an abort still reaches it.
NcclRank::~NcclRank() {
  group_->depart(rank_, issued_);  // no collective of this rank beyond these
  {
    std::unique_lock<std::mutex> lock(q_mu_);
    drained_cv_.wait(lock, [&] { return pending_.empty(); });
    stopping_ = true;
  }
  q_cv_.notify_all();
  watchdog_.join();
  group_->leave(this);
  close_comm();
  release_cuda();
}

// Destructor: flush and free the NCCL communicator (finalize, polled with
// the timeout, then destroy), or abort it if that fails. Never throws.
void NcclRank::close_comm() {
  std::lock_guard<std::mutex> lock(nccl_mu_);
  if (!comm_) return;
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device_);
  // ncclCommFinalize on a non-blocking communicator returns at once (its
  // state ncclInProgress); the state turns ncclSuccess once the
  // communicator is quiescent, and only then may ncclCommDestroy free the
  // rest without blocking (nccl.h). Any other outcome, or no answer within
  // the timeout: abort instead, which never waits for peers.
  std::string why;
  ncclResult_t state = ncclCommFinalize(comm_);
  if (state == ncclSuccess || state == ncclInProgress) {
    const auto t0 = Clock::now();
    for (;;) {
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
      if (q != ncclSuccess) state = q;
      if (state != ncclInProgress) break;
      if (seconds_since(t0) > timeout_s_) {
        why = "not quiescent after " + std::to_string(timeout_s_) + " s (ZF_NCCL_TIMEOUT_S)";
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  if (why.empty() && state == ncclSuccess) {
    ncclCommDestroy(comm_);
  } else {
    if (why.empty()) why = nccl_error_text(state);
    std::fprintf(stderr, "[rank %d] nccl: finalizing the communicator failed (%s); aborting it\n",
                 rank_, why.c_str());
    ncclCommAbort(comm_);
  }
  comm_ = nullptr;
  if (prev >= 0 && prev != device_) cudaSetDevice(prev);
}

// Frees the streams, events and scratch (after the stream has drained, at
// most for the timeout: better to leak them than free what a stuck kernel
// might still use). Never throws.
void NcclRank::release_cuda() {
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device_);
  bool drained = true;
  if (comm_stream_) {
    drained = drain_stream(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(drain_limit_s())));
    if (!drained)
      std::fprintf(stderr,
                   "[rank %d] nccl: the communication stream did not drain within %g s; "
                   "leaving its resources allocated\n",
                   rank_, drain_limit_s());
  }
  if (drained) {
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    free_events_.clear();
    if (ready_) cudaEventDestroy(ready_);
    if (tail_) cudaEventDestroy(tail_);
    if (scratch_) cudaFree(scratch_);
    if (comm_stream_) cudaStreamDestroy(comm_stream_);
    ready_ = tail_ = nullptr;
    scratch_ = nullptr;
    comm_stream_ = nullptr;
  }
  (void)cudaGetLastError();
  if (prev >= 0 && prev != device_) cudaSetDevice(prev);
}

}  // namespace nccl_detail

}  // namespace zf
