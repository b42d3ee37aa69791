// comm_nccl.cpp: the `nccl` backend (comm_nccl.h): NCCL does the collectives;
// this file orders them on streams, counts them, and makes sure a failure
// ends in an error instead of a hang.
//
// Shape of the backend
//   NcclGroup   shared by the communicators created together (the ranks as
//               threads of this process, or the one rank of this process):
//               the abort flag and its reason, the members (so one rank's
//               abort() aborts them all), and which rank left first.
//   NcclRank    rank r's NcclCommunicator: an NCCL communicator created
//               non-blocking, a communication stream, the pending
//               collectives, and a watchdog thread that completes them.
//
// One collective, issued by the rank's thread (issue()):
//   ready  an event recorded on the compute stream (the inputs are ready when
//          the compute work issued before the collective is done);
//   wait   the communication stream waits on it, on the device;
//   start  an event, then the NCCL call, then a done event, all on the
//          communication stream. Non-blocking NCCL may answer ncclInProgress
//          (e.g. while it connects to the peers on first use): the call is
//          polled until NCCL has enqueued it (settle()), with the watchdog's
//          checks, before anything else is enqueued;
//   queue  the collective joins this rank's pending list, in issue order.
// The watchdog thread polls the oldest pending collective's done event.
// When it has completed, it adds the device time between start and done to
// the counters and finishes the handle, which wakes CommHandle::wait_host()
// (comm.cpp: the same wait on a condition variable as in the other backends).
// CommHandle::wait() waits on the device instead (order_after(), the handle's
// device_wait hook, comm_state.h): while the collective is pending, the
// compute stream waits for its done event and the host goes on.
//
// Failures (the watchdog, and settle() while a call is in progress):
//   - the group was aborted (abort() from any rank): every member's NCCL
//     communicator is aborted at once, and every pending or later collective
//     raises CommAborted with the reason;
//   - a CUDA error on the stream, an NCCL asynchronous error, a collective
//     older than the timeout, or a rank of the group that left with fewer
//     collectives than this one waits for: the rank that sees it aborts its
//     communicator, raises an Error saying what it saw (the cause), and
//     aborts the group, so the other ranks raise CommAborted (echoes).
// Locks, to stay clear of deadlocks: the group's mutex may be held while
// taking a rank's nccl_mu_ or q_mu_ (abort_all), never the other way round,
// and no thread holds a rank's nccl_mu_ and q_mu_ together. Nothing waits
// long on a lock a poller holds: every NCCL call returns at once
// (non-blocking), and every poll loop also watches the abort flag and the
// clock.
#include "comm_nccl.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm_state.h"
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

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// DeviceGuard (kernels_cuda.h): NCCL and event calls act on the current device.

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::i64: return ncclInt64;
    case DType::i32: return ncclInt32;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::avg ? ncclAvg : ncclSum; }

std::string nccl_error_text(ncclResult_t r) {
  const char* last = ncclGetLastError(nullptr);
  return std::string(ncclGetErrorString(r)) + (last && *last ? std::string(" (") + last + ")" : "");
}

// "all_reduce(count 4099, bf16, avg)", as the other backends write it.
std::string describe(CollectiveKind kind, size_t count, DType dt, ReduceOp op, int root) {
  std::ostringstream s;
  s << collective_name(kind);
  if (kind != CollectiveKind::barrier) {
    s << "(count " << count << ", " << dtype_name(dt);
    if (kind == CollectiveKind::all_reduce || kind == CollectiveKind::reduce_scatter)
      s << ", " << (op == ReduceOp::sum ? "sum" : "avg");
    if (kind == CollectiveKind::broadcast) s << ", root " << root;
    s << ")";
  }
  return s.str();
}

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

class NcclRank;

// ------------------------------------------------------------------ the group

class NcclGroup {
 public:
  // Marks the group aborted (the first reason wins) and aborts every
  // member's NCCL communicator. Callers hold no lock of any member.
  void abort_all(const std::string& reason);
  // Waits (at most `limit_s`) until no member's communication stream has work
  // left, so no collective touches any rank's buffers any more.
  void drain_all(double limit_s);

  void join(NcclRank* m) {
    std::lock_guard<std::mutex> lock(mu_);
    members_.push_back(m);
  }
  void leave(NcclRank* m) {
    std::lock_guard<std::mutex> lock(mu_);
    members_.erase(std::remove(members_.begin(), members_.end(), m), members_.end());
  }
  // Rank `rank` will issue nothing more: `issued` collectives in all. The
  // first to go is remembered (the others' watchdogs name it).
  void depart(int rank, uint64_t issued) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!departed_.load()) {
      departed_rank_ = rank;
      departed_issued_ = issued;
      departed_.store(true, std::memory_order_release);
    }
  }

  // Read without a lock: each is written once, before its flag is raised.
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  const std::string& reason() const { return reason_; }
  bool departed() const { return departed_.load(std::memory_order_acquire); }
  int departed_rank() const { return departed_rank_; }
  uint64_t departed_issued() const { return departed_issued_; }

 private:
  std::mutex mu_;
  std::vector<NcclRank*> members_;
  std::atomic<bool> aborted_{false};
  std::string reason_;
  std::atomic<bool> departed_{false};
  int departed_rank_ = -1;
  uint64_t departed_issued_ = 0;
};

// ------------------------------------------------------------------ one rank

class NcclRank final : public NcclCommunicator {
 public:
  // Takes over `comm` (ready: created and polled until ncclSuccess).
  NcclRank(std::shared_ptr<NcclGroup> group, ncclComm_t comm, int rank, int size, int device,
           double timeout_s)
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
  ~NcclRank() override {
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

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }
  cudaStream_t comm_stream() const override { return comm_stream_; }
  cudaStream_t compute_stream() const override { return compute_stream_; }
  void set_compute_stream(cudaStream_t stream) override { compute_stream_ = stream; }
  double timeout_s() const override { return timeout_s_; }

  void stream_wait_issued(cudaStream_t stream) override {
    DeviceGuard g(device_);
    std::lock_guard<std::mutex> lock(nccl_mu_);
    CUDA_CHECK(cudaEventRecord(tail_, comm_stream_));
    CUDA_CHECK(cudaStreamWaitEvent(stream, tail_, 0));
  }

  CommHandle all_reduce_async(void* buf, size_t count, DType dt, ReduceOp op) override {
    const ncclDataType_t t = nccl_type(dt);
    const ncclRedOp_t o = nccl_op(op);
    return issue(CollectiveKind::all_reduce, count, dt, op, 0, count * dtype_size(dt),
                 [=](ncclComm_t c, cudaStream_t s) {
                   return ncclAllReduce(buf, buf, count, t, o, c, s);
                 });
  }
  CommHandle reduce_scatter_async(const void* send, void* recv, size_t recv_count, DType dt,
                                  ReduceOp op) override {
    const ncclDataType_t t = nccl_type(dt);
    const ncclRedOp_t o = nccl_op(op);
    return issue(CollectiveKind::reduce_scatter, recv_count, dt, op, 0,
                 size_t(size_) * recv_count * dtype_size(dt), [=](ncclComm_t c, cudaStream_t s) {
                   return ncclReduceScatter(send, recv, recv_count, t, o, c, s);
                 });
  }
  CommHandle all_gather_async(const void* send, void* recv, size_t send_count,
                              DType dt) override {
    const ncclDataType_t t = nccl_type(dt);
    return issue(CollectiveKind::all_gather, send_count, dt, ReduceOp::sum, 0,
                 size_t(size_) * send_count * dtype_size(dt), [=](ncclComm_t c, cudaStream_t s) {
                   return ncclAllGather(send, recv, send_count, t, c, s);
                 });
  }
  CommHandle broadcast_async(void* buf, size_t count, DType dt, int root) override {
    REQUIRE(root >= 0 && root < size_,
            "broadcast: root " << root << " is not a rank of this group of " << size_);
    const ncclDataType_t t = nccl_type(dt);
    return issue(CollectiveKind::broadcast, count, dt, ReduceOp::sum, root,
                 count * dtype_size(dt), [=](ncclComm_t c, cudaStream_t s) {
                   return ncclBroadcast(buf, buf, count, t, root, c, s);
                 });
  }
  // NCCL has no barrier: an all-reduce of one float does it, waited for on
  // the host (the barrier is host-side in comm.h).
  void barrier() override {
    float* p = scratch_;
    issue(CollectiveKind::barrier, 1, DType::f32, ReduceOp::sum, 0, 0,
          [=](ncclComm_t c, cudaStream_t s) {
            return ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, c, s);
          })
        .wait_host();
  }

  void abort(const std::string& reason) override {
    group_->abort_all(reason);
    group_->drain_all(drain_limit_s());
  }

  // How long to wait for the communication stream to drain after an abort
  // (it may first wait for compute it depends on): the timeout, but at least
  // 10 s and at most 60 s.
  double drain_limit_s() const { return std::max(10.0, std::min(timeout_s_, 60.0)); }

  // Aborts this rank's NCCL communicator (if it still has one) and marks it
  // failed: the watchdog fails the pending collectives, issue() the later
  // ones. `aborted`: CommAborted (an echo of the group's abort) rather than
  // Error (what this rank saw); `seq`: the collective the reason is about, if
  // one of this rank's. The first failure wins.
  // (The reason is set before the communicator goes, so a thread that finds
  // comm_ null always finds the reason too.)
  void fail(const std::string& reason, bool aborted, int64_t seq = -1) {
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      if (broken_.empty()) {
        broken_ = reason;
        broken_is_abort_ = aborted;
        broken_seq_ = seq;
      }
    }
    {
      std::lock_guard<std::mutex> lock(nccl_mu_);
      abort_comm_locked();
    }
    q_cv_.notify_all();
  }

  // Waits until the communication stream has no work left (or `deadline`).
  bool drain_stream(Clock::time_point deadline) {
    for (;;) {
      const cudaError_t e = cudaStreamQuery(comm_stream_);
      if (e != cudaErrorNotReady) {
        if (e != cudaSuccess) (void)cudaGetLastError();
        return true;
      }
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

 private:
  struct Op {
    uint64_t seq = 0;
    CollectiveKind kind = CollectiveKind::barrier;
    std::string what;  // describe(...), for messages
    cudaEvent_t start = nullptr, done = nullptr;
    std::shared_ptr<CommHandle::State> state;
    Clock::time_point issued_at;
  };

  // Called by the rank's thread. See the file comment.
  template <class Launch>
  CommHandle issue(CollectiveKind kind, size_t count, DType dt, ReduceOp rop, int root,
                   size_t full_bytes, Launch launch) {
    auto state = std::make_shared<CommHandle::State>();
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.add(kind, ring_bytes(kind, full_bytes, size_));
    }
    Op op;
    op.kind = kind;
    op.what = describe(kind, count, dt, rop, root);
    op.state = state;
    op.issued_at = Clock::now();
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      op.seq = issued_++;
      // CommHandle::wait() on the device (comm_state.h). Set before the
      // handle leaves this function, never changed after.
      state->device_wait = [this, seq = op.seq] { return order_after(seq); };
      if (!broken_.empty()) {  // nothing runs on a failed communicator
        state->finish(error_for(op));
        return CommHandle(state);
      }
    }
    // A failure while issuing leaves this rank unable to take part, and its
    // peers may wait for it: the communicator fails, and so does the group.
    auto refuse = [&](const std::string& reason, bool aborted, int64_t seq = -1) {
      fail(reason, aborted, seq);
      if (!aborted) group_->abort_all(reason);
      drain_after_abort();  // NCCL may have enqueued part of it
      std::lock_guard<std::mutex> lock(q_mu_);
      give_back(op);
      state->finish(error_for(op));
      return CommHandle(state);
    };
    try {
      DeviceGuard g(device_);
      {
        std::lock_guard<std::mutex> lock(q_mu_);
        op.start = take_event();
        op.done = take_event();
      }
      std::lock_guard<std::mutex> lock(nccl_mu_);
      if (!comm_) throw CommAborted("");  // failed meanwhile: broken_ says why
      // 1-2: the inputs are what the compute stream has produced so far.
      CUDA_CHECK(cudaEventRecord(ready_, compute_stream_));
      CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ready_, 0));
      // 3: start, the collective (nothing to do for an empty buffer), done.
      CUDA_CHECK(cudaEventRecord(op.start, comm_stream_));
      if (count > 0) settle_locked(launch(comm_, comm_stream_), op);
      CUDA_CHECK(cudaEventRecord(op.done, comm_stream_));
    } catch (const CommAborted&) {  // the group was aborted (settle_locked), or we failed
      return refuse(group_->aborted() ? group_->reason() : "aborted", true);
    } catch (const std::exception& e) {
      return refuse("rank " + std::to_string(rank_) + ": " + op.what + " (collective #" +
                        std::to_string(op.seq) + " of this rank): " + e.what(),
                    false, int64_t(op.seq));
    }
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      if (broken_.empty()) {
        pending_.push_back(std::move(op));
        op.state = nullptr;
      }
    }
    if (op.state) {  // failed meanwhile (the watchdog has let go): enqueued on an aborted comm
      drain_after_abort();
      std::lock_guard<std::mutex> lock(q_mu_);
      give_back(op);
      state->finish(error_for(op));
      return CommHandle(state);
    }
    q_cv_.notify_all();
    return CommHandle(state);
  }

  // CommHandle::wait() of collective `seq`, from the rank's thread: the
  // compute stream waits (on the device) for the collective's done event, so
  // the work the caller issues next, frees through the stream-ordered
  // allocator included, comes after the collective; the host goes on. q_mu_
  // is held so the event cannot go back to the pool and be recorded again
  // for a later collective meanwhile (give_back). Returns false, and wait()
  // waits on the host instead, when the collective is no longer pending (the
  // watchdog has seen its done event complete: later device work is after
  // it anyway, and the handle is about to be finished) or when the
  // communicator has failed (the host wait raises once the watchdog has
  // drained the stream).
  bool order_after(uint64_t seq) {
    DeviceGuard g(device_);  // the legacy default stream, when it is the compute stream, is per device
    std::lock_guard<std::mutex> lock(q_mu_);
    if (!broken_.empty()) return false;
    for (const Op& op : pending_)
      if (op.seq == seq) {
        CUDA_CHECK(cudaStreamWaitEvent(compute_stream_, op.done, 0));
        return true;
      }
    return false;
  }

  // Once this communicator is aborted, waits (at most drain_limit_s()) until
  // its stream has nothing left, so that a handle that raises also means
  // that no NCCL kernel of its collective touches the buffers any more:
  // ncclCommAbort tells the kernels to quit but need not wait for them (in a
  // group of threads NCCL frees the resources only at the last member's
  // abort), and a caller that frees a buffer when wait() raises (a staging
  // buffer, a stage without a RankFailureGuard) must not free it under a
  // running kernel. Holds no lock.
  void drain_after_abort() {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(drain_limit_s()));
    if (!drain_stream(deadline))
      std::fprintf(stderr,
                   "[rank %d] nccl: after the abort, the communication stream still has work "
                   "after %g s; its collectives' buffers may still be in use\n",
                   rank_, drain_limit_s());
  }

  // Non-blocking NCCL: a call may return ncclInProgress, and must then be
  // polled (ncclCommGetAsyncError) until NCCL has enqueued it, before the
  // next call on this communicator. Called with nccl_mu_ held; throws
  // CommAborted if the group is aborted meanwhile, Error on an NCCL error
  // or after the timeout (the caller then fails the communicator).
  void settle_locked(ncclResult_t result, const Op& op) {
    if (result == ncclSuccess) return;
    if (result != ncclInProgress) throw Error("NCCL error " + nccl_error_text(result));
    auto nap = std::chrono::microseconds(1);
    for (;;) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
      if (q != ncclSuccess) state = q;
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) throw Error("NCCL error " + nccl_error_text(state));
      if (group_->aborted()) throw CommAborted(group_->reason());
      if (seconds_since(op.issued_at) > timeout_s_) {
        std::ostringstream s;
        s << "NCCL did not enqueue it within " << timeout_s_
          << " s (ZF_NCCL_TIMEOUT_S): are all ranks issuing the same collectives?";
        throw Error(s.str());
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }

  // The watchdog: completes the pending collectives in order, and fails them
  // all if the communicator fails (see the file comment). Polls with naps
  // growing to 50 us while something is pending; sleeps otherwise.
  void watchdog_loop() {
    set_current_rank(rank_);
    // This rank's device: the first CUDA call of a thread would otherwise
    // create a context on device 0 (memory taken from another rank's GPU).
    cudaSetDevice(device_);
    auto nap = std::chrono::microseconds(2);
    auto last_nccl_check = Clock::now();
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(q_mu_);
        if (pending_.empty()) {
          drained_cv_.notify_all();
          q_cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
          if (pending_.empty()) return;  // stopping, and nothing left
          nap = std::chrono::microseconds(2);
        }
      }
      if (fail_pending_if_broken()) continue;
      if (complete_finished()) {
        nap = std::chrono::microseconds(2);
        continue;
      }
      // Still pending: is something wrong? (NCCL's error flag every ms.)
      Op oldest;
      {
        std::lock_guard<std::mutex> lock(q_mu_);
        if (pending_.empty()) continue;
        oldest.seq = pending_.front().seq;
        oldest.what = pending_.front().what;
        oldest.issued_at = pending_.front().issued_at;
      }
      std::string problem;  // about the oldest pending collective
      if (Clock::now() - last_nccl_check > std::chrono::milliseconds(1)) {
        last_nccl_check = Clock::now();
        ncclResult_t state = ncclSuccess;
        {
          std::lock_guard<std::mutex> lock(nccl_mu_);
          if (comm_) {
            const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
            if (q != ncclSuccess) state = q;
          }
        }
        if (state != ncclSuccess && state != ncclInProgress)
          problem = "NCCL reported an asynchronous error while " + oldest.what +
                    " (collective #" + std::to_string(oldest.seq) +
                    " of this rank) was pending: " + nccl_error_text(state);
      }
      if (problem.empty() && group_->departed() && oldest.seq >= group_->departed_issued())
        problem = oldest.what + " (collective #" + std::to_string(oldest.seq) +
                  " of this rank) cannot complete: rank " +
                  std::to_string(group_->departed_rank()) + " finished after issuing only " +
                  std::to_string(group_->departed_issued()) +
                  " collectives. Every rank must issue the same collectives in the same order.";
      if (problem.empty() && seconds_since(oldest.issued_at) > timeout_s_) {
        std::ostringstream s;
        s << oldest.what << " (collective #" << oldest.seq << " of this rank) did not complete within "
          << timeout_s_
          << " s (ZF_NCCL_TIMEOUT_S): a rank is missing or hung, or the ranks issued different "
             "collectives; the NCCL communicator was aborted";
        problem = s.str();
      }
      if (!problem.empty()) {
        const std::string reason = "rank " + std::to_string(rank_) + ": " + problem;
        fail(reason, false, int64_t(oldest.seq));
        group_->abort_all(reason);
        continue;  // fail_pending_if_broken() does the rest
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(50));
    }
  }

  // Watchdog: once the communicator has failed, every pending collective
  // raises. Returns whether it had failed.
  bool fail_pending_if_broken() {
    std::deque<Op> failed;
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      if (broken_.empty()) return false;
      failed.swap(pending_);
    }
    // (Before: the handles raised at once, while the aborted kernels could
    // still be running on the stream.)
    if (!failed.empty()) drain_after_abort();
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      for (Op& op : failed) give_back(op);
    }
    for (Op& op : failed) op.state->finish(error_for(op));
    drained_cv_.notify_all();
    return true;
  }

  // Watchdog: finishes the pending collectives whose done event has
  // completed, oldest first (they complete in order: one stream). Returns
  // whether any did.
  bool complete_finished() {
    bool any = false;
    for (;;) {
      cudaEvent_t start, done;
      {
        std::lock_guard<std::mutex> lock(q_mu_);
        if (pending_.empty() || !broken_.empty()) return any;
        start = pending_.front().start;
        done = pending_.front().done;
      }
      const cudaError_t e = cudaEventQuery(done);
      if (e == cudaErrorNotReady) return any;
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        std::string what;
        int64_t seq = -1;
        {
          std::lock_guard<std::mutex> lock(q_mu_);
          if (!pending_.empty()) {
            what = pending_.front().what + " (collective #" + std::to_string(pending_.front().seq) +
                   " of this rank)";
            seq = int64_t(pending_.front().seq);
          }
        }
        const std::string reason = "rank " + std::to_string(rank_) + ": CUDA error " +
                                   cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                                   ") while waiting for " + what +
                                   " (a kernel on this rank's device failed)";
        fail(reason, false, seq);
        group_->abort_all(reason);
        return any;
      }
      float ms = 0;
      if (cudaEventElapsedTime(&ms, start, done) != cudaSuccess) {
        (void)cudaGetLastError();
        ms = 0;
      }
      Op op;
      {
        std::lock_guard<std::mutex> lock(q_mu_);
        // Failed since we looked: ncclCommAbort makes the collective's
        // kernels quit, so its done event may have completed without the
        // result. fail() marks the communicator broken before it aborts, so
        // a completion the abort caused is always seen here, and
        // fail_pending_if_broken() fails the collective instead. (A caller
        // that waited on the device reads the result only after a host wait
        // has said it is good: comm.h.)
        if (!broken_.empty() || pending_.empty()) return any;
        op = std::move(pending_.front());
        pending_.pop_front();
        give_back(op);
      }
      {
        std::lock_guard<std::mutex> lock(stats_mu_);
        stats_.seconds[int(op.kind)] += double(ms) / 1000.0;
      }
      op.state->finish();
      any = true;
    }
  }

  // The error a collective raises on a failed communicator (q_mu_ held). The
  // collective the failure is about gets the reason alone ("[rank r] ...").
  std::exception_ptr error_for(const Op& op) const {
    const std::string me = "rank " + std::to_string(rank_) + ": ";
    if (!broken_is_abort_ && broken_seq_ == int64_t(op.seq) && broken_.rfind(me, 0) == 0)
      return std::make_exception_ptr(Error("[rank " + std::to_string(rank_) + "] " + broken_.substr(me.size())));
    const std::string head = "[rank " + std::to_string(rank_) + "] " + op.what + " (collective #" +
                             std::to_string(op.seq) + " of this rank) ";
    if (broken_is_abort_) return std::make_exception_ptr(CommAborted(head + "aborted: " + broken_));
    return std::make_exception_ptr(Error(head + "failed: " + broken_));
  }

  // Events come from a small pool (q_mu_ held; the device current).
  cudaEvent_t take_event() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreate(&e));  // with timing: the seconds counters
    return e;
  }
  void give_back(Op& op) {  // q_mu_ held. An event still pending may be re-recorded.
    if (op.start) free_events_.push_back(op.start);
    if (op.done) free_events_.push_back(op.done);
    op.start = op.done = nullptr;
  }

  // nccl_mu_ held. ncclCommAbort also stops this communicator's kernels
  // that wait for peers.
  void abort_comm_locked() {
    if (!comm_) return;
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
    if (prev >= 0 && prev != device_) cudaSetDevice(prev);
  }

  // Destructor: flush and free the NCCL communicator (finalize, polled with
  // the timeout, then destroy), or abort it if that fails. Never throws.
  void close_comm() {
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
      // (Before: the message named ncclCommFinalize's own return, usually
      // "in progress", not the state that failed.)
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
  void release_cuda() {
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

  std::shared_ptr<NcclGroup> group_;
  const int rank_, size_, device_;
  const double timeout_s_;

  std::mutex nccl_mu_;                   // one thread at a time on comm_ and the stream
  ncclComm_t comm_ = nullptr;            // null once aborted or closed
  cudaStream_t comm_stream_ = nullptr;
  cudaStream_t compute_stream_ = nullptr;  // the default stream until set
  cudaEvent_t ready_ = nullptr;          // recorded on the compute stream at each issue
  cudaEvent_t tail_ = nullptr;           // stream_wait_issued
  float* scratch_ = nullptr;             // the barrier's all-reduce

  std::mutex q_mu_;
  std::condition_variable q_cv_;        // something was queued, failed, or we stop
  std::condition_variable drained_cv_;  // nothing pending any more
  std::deque<Op> pending_;              // issued, not completed; oldest first
  std::vector<cudaEvent_t> free_events_;
  uint64_t issued_ = 0;                 // collectives issued (the next seq)
  bool stopping_ = false;
  std::string broken_;                  // why this communicator failed ("" while fine)
  bool broken_is_abort_ = false;
  int64_t broken_seq_ = -1;             // the collective broken_ is about (-1: none)
  std::thread watchdog_;
};

void NcclGroup::abort_all(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_.load()) {
    reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  for (NcclRank* m : members_) m->fail(reason_, true);
}

void NcclGroup::drain_all(double limit_s) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit_s));
  for (NcclRank* m : members_)
    if (!m->drain_stream(deadline))
      std::fprintf(stderr,
                   "[rank %d] nccl: after the abort, the communication stream still has work after "
                   "%g s (a kernel that NCCL did not stop, or compute it waits for)\n",
                   m->rank(), limit_s);
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

}  // namespace zf
