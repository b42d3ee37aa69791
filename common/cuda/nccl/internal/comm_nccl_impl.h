// comm_nccl_impl.h: private to the `nccl` backend (comm_nccl.h), included
// only by its three source files: the two classes behind NcclCommunicator
// and the helpers they share. NCCL does the collectives; the backend orders
// them on streams, counts them, and makes sure a failure ends in an error
// instead of a hang.
//   comm_nccl.cpp              NCCL errors, the timeout, creating the
//                              communicators (ranks as threads of this
//                              process, an NCCL id from MPI or from a
//                              rendezvous file), and a rank's start and close
//   comm_nccl_collectives.cpp  issuing a collective: streams, events, the
//                              counters, and CommHandle::wait() on the device
//   comm_nccl_watchdog.cpp     the watchdog thread, failures, abort, drain
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
// Splits (NcclRank::split, comm_nccl.cpp: ncclCommSplit, untested on a GPU
// so far): the child is an NcclRank of its own, with its own NCCL
// communicator, stream and watchdog, in a child NcclGroup of the ranks of
// its color; the groups split from one another form an NcclFamily, and
// abort_all and drain_all act on every group of the family.
// Locks, to stay clear of deadlocks: the family's mutex may be held while
// taking a group's, the group's mutex while
// taking a rank's nccl_mu_ or q_mu_ (abort_all), never the other way round,
// and no thread holds a rank's nccl_mu_ and q_mu_ together. Nothing waits
// long on a lock a poller holds: every NCCL call returns at once
// (non-blocking), and every poll loop also watches the abort flag and the
// clock.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm_nccl.h"
#include "comm_state.h"
#include "kernels_cuda.h"  // CUDA_CHECK

namespace zf::nccl_detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// DeviceGuard (kernels_cuda.h): NCCL and event calls act on the current device.

inline std::string nccl_error_text(ncclResult_t r) {
  const char* last = ncclGetLastError(nullptr);
  return std::string(ncclGetErrorString(r)) + (last && *last ? std::string(" (") + last + ")" : "");
}

class NcclRank;
class NcclGroup;

// ------------------------------------------------------------------ the group

// The groups split from one another (from one create* down): each joins in
// its constructor and leaves in its destructor.
struct NcclFamily {
  std::mutex mu;
  std::vector<NcclGroup*> groups;
};

class NcclGroup {
 public:
  explicit NcclGroup(std::shared_ptr<NcclFamily> family = nullptr)
      : family_(family ? std::move(family) : std::make_shared<NcclFamily>()) {
    std::lock_guard<std::mutex> lock(family_->mu);
    family_->groups.push_back(this);
  }
  ~NcclGroup() {
    std::lock_guard<std::mutex> lock(family_->mu);
    auto& g = family_->groups;
    g.erase(std::remove(g.begin(), g.end(), this), g.end());
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  // Marks every group of the family aborted (the first reason wins in each)
  // and aborts every member's NCCL communicator. Callers hold no lock of
  // any member.
  void abort_all(const std::string& reason);
  // Waits (at most `limit_s`) until no communication stream of any member of
  // the family has work left, so no collective touches any buffer any more.
  void drain_all(double limit_s);

  // The child group of the ranks of this group that passed `color` to their
  // `split_no`-th split (counted per rank from 0): the first to ask makes
  // it, the last of its `size` members to ask lets the registry forget it.
  std::shared_ptr<NcclGroup> child(uint64_t split_no, int color, int size) {
    std::lock_guard<std::mutex> lock(split_mu_);
    for (auto it = children_.begin(); it != children_.end(); ++it)
      if (it->split_no == split_no && it->color == color) {
        std::shared_ptr<NcclGroup> g = it->group;
        if (++it->taken == size) children_.erase(it);
        return g;
      }
    auto g = std::make_shared<NcclGroup>(family_);
    if (size > 1) children_.push_back(Child{split_no, color, 1, g});
    return g;
  }

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
  // One group's part of abort_all / drain_all (family's mutex held).
  void abort_members(const std::string& reason);
  void drain_members(Clock::time_point deadline, double limit_s);

  struct Child {
    uint64_t split_no;
    int color, taken;
    std::shared_ptr<NcclGroup> group;
  };
  std::shared_ptr<NcclFamily> family_;
  std::mutex split_mu_;  // children_; taken before the family's mutex, never after
  std::vector<Child> children_;
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
  // Start and close: comm_nccl.cpp.
  NcclRank(std::shared_ptr<NcclGroup> group, ncclComm_t comm, int rank, int size, int device,
           double timeout_s);
  ~NcclRank() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }
  cudaStream_t comm_stream() const override { return comm_stream_; }
  cudaStream_t compute_stream() const override { return compute_stream_; }
  void set_compute_stream(cudaStream_t stream) override { compute_stream_ = stream; }
  double timeout_s() const override { return timeout_s_; }

  // The collectives: comm_nccl_collectives.cpp.
  void stream_wait_issued(cudaStream_t stream) override;
  CommHandle all_reduce_async(void* buf, size_t count, DType dt, ReduceOp op) override;
  CommHandle reduce_scatter_async(const void* send, void* recv, size_t recv_count, DType dt,
                                  ReduceOp op) override;
  CommHandle all_gather_async(const void* send, void* recv, size_t send_count,
                              DType dt) override;
  CommHandle broadcast_async(void* buf, size_t count, DType dt, int root) override;
  void barrier() override;

  // Failures: comm_nccl_watchdog.cpp.
  void abort(const std::string& reason) override;

  // ncclCommSplit (comm_nccl.cpp).
  std::unique_ptr<Communicator> split(int color, int key) override;

  // How long to wait for the communication stream to drain after an abort
  // (it may first wait for compute it depends on): the timeout, but at least
  // 10 s and at most 60 s.
  double drain_limit_s() const { return std::max(10.0, std::min(timeout_s_, 60.0)); }

  void fail(const std::string& reason, bool aborted, int64_t seq = -1);
  bool drain_stream(Clock::time_point deadline);

 private:
  struct Op {
    uint64_t seq = 0;
    CollectiveKind kind = CollectiveKind::barrier;
    std::string what;  // describe(...), for messages
    cudaEvent_t start = nullptr, done = nullptr;
    std::shared_ptr<CommHandle::State> state;
    Clock::time_point issued_at;
  };

  // comm_nccl_collectives.cpp
  template <class Launch>
  CommHandle issue(CollectiveKind kind, size_t count, DType dt, ReduceOp rop, int root,
                   size_t full_bytes, Launch launch);
  bool order_after(uint64_t seq);
  void settle_locked(ncclResult_t result, const Op& op);
  cudaEvent_t take_event();
  void give_back(Op& op);

  // comm_nccl_watchdog.cpp
  void drain_after_abort();
  void watchdog_loop();
  bool fail_pending_if_broken();
  bool complete_finished();
  std::exception_ptr error_for(const Op& op) const;
  void abort_comm_locked();

  // comm_nccl.cpp
  void close_comm();
  void release_cuda();

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
  uint64_t splits_ = 0;                 // split() calls so far (the rank's thread only)
  bool stopping_ = false;
  std::string broken_;                  // why this communicator failed ("" while fine)
  bool broken_is_abort_ = false;
  int64_t broken_seq_ = -1;             // the collective broken_ is about (-1: none)
  std::thread watchdog_;
};

}  // namespace zf::nccl_detail
