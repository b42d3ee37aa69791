// comm_nccl_watchdog.cpp: the `nccl` backend (comm_nccl.h), third of three
// files: what completes a collective and what ends a failure. The watchdog
// thread of each rank (completes the pending collectives in order, adds their
// device time to the counters, and watches for NCCL's asynchronous error, a
// CUDA error, the timeout, a rank of the group that left early), fail() and
// abort() (ncclCommAbort, for one rank or the whole group), the drain of the
// communication stream after an abort, and the error each handle raises.
// The classes and how the backend works: comm_nccl_impl.h. Creating and
// closing a rank: comm_nccl.cpp. Issuing a collective:
// comm_nccl_collectives.cpp.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "comm_nccl_impl.h"
#include "comm_state.h"
#include "kernels_cuda.h"  // CUDA_CHECK

namespace zf::nccl_detail {

void NcclRank::abort(const std::string& reason) {
  group_->abort_all(reason);
  group_->drain_all(drain_limit_s());
}

// Aborts this rank's NCCL communicator (if it still has one) and marks it
// failed: the watchdog fails the pending collectives, issue() the later
// ones. `aborted`: CommAborted (an echo of the group's abort) rather than
// Error (what this rank saw); `seq`: the collective the reason is about, if
// one of this rank's. The first failure wins.
// (The reason is set before the communicator goes, so a thread that finds
// comm_ null always finds the reason too.)
void NcclRank::fail(const std::string& reason, bool aborted, int64_t seq) {
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
bool NcclRank::drain_stream(Clock::time_point deadline) {
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

// Once this communicator is aborted, waits (at most drain_limit_s()) until
// its stream has nothing left, so that a handle that raises also means
// that no NCCL kernel of its collective touches the buffers any more:
// ncclCommAbort tells the kernels to quit but need not wait for them (in a
// group of threads NCCL frees the resources only at the last member's
// abort), and a caller that frees a buffer when wait() raises (a staging
// buffer, a stage without a RankFailureGuard) must not free it under a
// running kernel. Holds no lock.
void NcclRank::drain_after_abort() {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(drain_limit_s()));
  if (!drain_stream(deadline))
    std::fprintf(stderr,
                 "[rank %d] nccl: after the abort, the communication stream still has work "
                 "after %g s; its collectives' buffers may still be in use\n",
                 rank_, drain_limit_s());
}

// The watchdog: completes the pending collectives in order, and fails them
// all if the communicator fails (see comm_nccl_impl.h). Polls with naps
// growing to 50 us while something is pending; sleeps otherwise.
void NcclRank::watchdog_loop() {
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
bool NcclRank::fail_pending_if_broken() {
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
bool NcclRank::complete_finished() {
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
std::exception_ptr NcclRank::error_for(const Op& op) const {
  const std::string me = "rank " + std::to_string(rank_) + ": ";
  if (!broken_is_abort_ && broken_seq_ == int64_t(op.seq) && broken_.rfind(me, 0) == 0)
    return std::make_exception_ptr(Error("[rank " + std::to_string(rank_) + "] " + broken_.substr(me.size())));
  const std::string head = "[rank " + std::to_string(rank_) + "] " + op.what + " (collective #" +
                           std::to_string(op.seq) + " of this rank) ";
  if (broken_is_abort_) return std::make_exception_ptr(CommAborted(head + "aborted: " + broken_));
  return std::make_exception_ptr(Error(head + "failed: " + broken_));
}

// nccl_mu_ held. ncclCommAbort also stops this communicator's kernels
// that wait for peers.
void NcclRank::abort_comm_locked() {
  if (!comm_) return;
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device_);
  ncclCommAbort(comm_);
  comm_ = nullptr;
  if (prev >= 0 && prev != device_) cudaSetDevice(prev);
}

void NcclGroup::abort_all(const std::string& reason) {
  std::lock_guard<std::mutex> lock(family_->mu);
  for (NcclGroup* g : family_->groups) g->abort_members(reason);
}

void NcclGroup::abort_members(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_.load()) {
    reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  for (NcclRank* m : members_) m->fail(reason_, true);
}

void NcclGroup::drain_all(double limit_s) {
  std::lock_guard<std::mutex> lock(family_->mu);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit_s));
  for (NcclGroup* g : family_->groups) g->drain_members(deadline, limit_s);
}

void NcclGroup::drain_members(Clock::time_point deadline, double limit_s) {
  std::lock_guard<std::mutex> lock(mu_);
  for (NcclRank* m : members_)
    if (!m->drain_stream(deadline))
      std::fprintf(stderr,
                   "[rank %d] nccl: after the abort, the communication stream still has work after "
                   "%g s (a kernel that NCCL did not stop, or compute it waits for)\n",
                   m->rank(), limit_s);
}

}  // namespace zf::nccl_detail
