// comm_mpi.cpp: the `mpi` backend, one rank per process over MPI (OpenMPI),
// with the `threads` backend's semantics, counters and bits (comm_mpi.h).
//
//   mpirun -np 4 build/03_zero3/zero3 --model tiny --steps 20
//
// Shape of the backend
//   MpiCommunicator   this process's Communicator, over its own duplicate of
//                     MPI_COMM_WORLD. Collectives are queued to one
//                     communication thread, which makes every MPI call and
//                     runs them in issue order, like the threads backend's
//                     per-rank thread (and a CUDA stream).
//
// One collective, on the communication thread (N ranks, this is rank r):
//   header   every rank sends every other rank what it called (kind, count,
//            dtype, op, root), point to point (so a rank whose header has not
//            come can be named). It is also the barrier. Every rank checks
//            that all called the same thing (a mismatch is the same error on
//            every rank); a rank that has left (its last header says
//            "depart") is named, not waited for.
//   payload  MPI only moves bytes; the sums are ours. The buffer is cut into
//            N pieces exactly as in the threads backend (piece_of).
//              reduce_scatter  all-to-all of the N slots, then rank r sums
//                              slot r of every rank in rank order 0..N-1
//                              (reduce_in_rank_order, the threads backend's
//                              loop: float32, bf16 rounded once).
//              all_reduce      the same with piece_of's pieces (all-to-all-v),
//                              then an all-gather-v of the reduced pieces.
//              all_gather      an all-gather; broadcast a broadcast.
//            So all_gather(reduce_scatter(x)) == all_reduce(x) bit for bit, and
//            every result equals the threads backend's. (MPI_Allreduce would
//            be shorter, but its summation order is unspecified.)
//
// Waiting. Every MPI operation is non-blocking and polled (wait_requests),
// so a waiting rank leaves the core to the ranks that compute (`mpirun
// --oversubscribe`), and gives up after --comm-timeout naming whom it waits
// for. MPI touches only this communicator's own staging buffers
// (internal/comm_mpi_header.h says why).
//
// Failures. abort(reason) marks this communicator failed: queued collectives
// raise CommAborted, the running one gives up at its next poll, and abort()
// returns once the communication thread has left it, so the caller may free
// its buffers. A collective given up is left pending inside MPI, with its
// staging buffers (MPI may still write into them). Peers cannot be woken
// from inside MPI: the launcher (launch.cpp) ends the job with MPI_Abort,
// naming the failed rank, so no process waits for one that will never come.
// A rank that finishes early (fewer collectives) says so in a last header:
// every rank still waiting raises an Error naming it, at the same collective.
#include "comm_mpi.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm_reduce.h"
#include "comm_mpi_header.h"
#include "comm_state.h"
#include "mpi_check.h"

namespace zf {

namespace {

using Clock = std::chrono::steady_clock;
using mpi_detail::bury;
using mpi_detail::copy_bytes;
using mpi_detail::describe;
using mpi_detail::Header;
using mpi_detail::kDepart;
using mpi_detail::kHeaderInts;
using mpi_detail::kHeaderTag;
using mpi_detail::kSplit;
using mpi_detail::leave_pending;
using mpi_detail::mpi_type;
using mpi_detail::same_call;
using mpi_detail::Staging;

// ------------------------------------------------------------------ the communicator

class MpiCommunicator;

// This process's communicators split from one another (from one
// make_mpi_communicator down): abort() of any aborts them all. Members join
// and leave on the rank's thread (constructor, destructor), never on a
// communication thread, so abort_all may hold the mutex while each member's
// communication thread leaves its collective.
struct MpiFamily {
  double timeout_s = kDefaultCommTimeoutS;  // of every wait of every member
  std::mutex mu;
  std::vector<MpiCommunicator*> members;
  bool aborted = false;
  std::string reason;
  void abort_all(const std::string& why);
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm world, double timeout_s)
      : staging_(std::make_unique<Staging>()), family_(std::make_shared<MpiFamily>()) {
    family_->timeout_s = comm_timeout_or_default(timeout_s);
    // Our own communicator: collectives of this one never meet anybody else's
    // MPI traffic, and errors return codes (MPI_CHECK) instead of aborting.
    MPI_CHECK(MPI_Comm_dup(world, &comm_));
    start();
  }
  // A communicator split from one of `family`'s: takes over `comm`.
  MpiCommunicator(MPI_Comm comm, std::shared_ptr<MpiFamily> family)
      : comm_(comm), staging_(std::make_unique<Staging>()), family_(std::move(family)) {
    start();
  }

  // Lets the communication thread finish what was issued (the other ranks
  // expect it), then leaves the group with a last header exchange, so that a
  // rank still waiting in a collective this one never issued gets an error
  // naming it instead of a hang.
  ~MpiCommunicator() override {
    std::shared_ptr<CommHandle::State> depart;
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      if (!aborted_ && gone_rank_ < 0) {  // else there is nobody to say goodbye to
        Header h;
        h.kind = kDepart;
        h.count = int64_t(issued_);
        h.seq = int64_t(issued_);
        depart = std::make_shared<CommHandle::State>();
        queue_.push_back(Op{h, nullptr, nullptr, depart, Clock::now(), true, nullptr, -1});
      }
    }
    q_cv_.notify_all();
    bool clean = false;
    if (depart) {
      try {
        CommHandle(depart).wait();
        clean = true;
      } catch (...) {
        // Another rank is still inside a collective this rank never issued:
        // it has raised an error naming this rank, and the job will end.
      }
    }
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      stopping_ = true;
    }
    q_cv_.notify_all();
    worker_.join();
    {
      std::lock_guard<std::mutex> lock(family_->mu);
      auto& m = family_->members;
      m.erase(std::remove(m.begin(), m.end(), this), m.end());
    }
    // After a failure an operation may still be pending on comm_: leave it.
    if (clean && !abandoned_) MPI_Comm_free(&comm_);
    else leave_pending(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }

  CommHandle all_reduce_async(void* buf, size_t count, DType dt, ReduceOp op) override {
    Header h;
    h.kind = int64_t(CollectiveKind::all_reduce);
    h.count = int64_t(count); h.dtype = int64_t(dt); h.op = int64_t(op);
    return issue(h, buf, buf, count, count * dtype_size(dt));
  }
  CommHandle reduce_scatter_async(const void* send, void* recv, size_t recv_count, DType dt,
                                  ReduceOp op) override {
    Header h;
    h.kind = int64_t(CollectiveKind::reduce_scatter);
    h.count = int64_t(recv_count); h.dtype = int64_t(dt); h.op = int64_t(op);
    const size_t full = size_t(size_) * recv_count;
    return issue(h, send, recv, full, full * dtype_size(dt));
  }
  CommHandle all_gather_async(const void* send, void* recv, size_t send_count,
                              DType dt) override {
    Header h;
    h.kind = int64_t(CollectiveKind::all_gather);
    h.count = int64_t(send_count); h.dtype = int64_t(dt);
    const size_t full = size_t(size_) * send_count;
    return issue(h, send, recv, full, full * dtype_size(dt));
  }
  CommHandle broadcast_async(void* buf, size_t count, DType dt, int root) override {
    REQUIRE(root >= 0 && root < size_,
            "broadcast: root " << root << " is not a rank of this group of " << size_);
    Header h;
    h.kind = int64_t(CollectiveKind::broadcast);
    h.count = int64_t(count); h.dtype = int64_t(dt); h.root = root;
    return issue(h, buf, buf, count, count * dtype_size(dt));
  }
  void barrier() override {
    Header h;
    h.kind = int64_t(CollectiveKind::barrier);
    issue(h, nullptr, nullptr, 0, 0).wait();
  }

  // The whole family: every communicator of this process split from the same
  // one (abort_one on each).
  void abort(const std::string& reason) override { family_->abort_all(reason); }

  // A collective of this communicator like the others (queued; the header
  // exchange compares the calls, then every rank checks every color), not
  // counted. The communication thread then calls MPI_Comm_split, which
  // blocks, but only briefly: every rank has passed the header exchange
  // into it. The child has its own MPI communicator and communication thread.
  std::unique_ptr<Communicator> split(int color, int key) override {
    // Two communicators mean two communication threads calling MPI at once.
    int level = 0;
    MPI_CHECK(MPI_Query_thread(&level));
    REQUIRE(level >= MPI_THREAD_MULTIPLE,
            "split on the mpi backend needs MPI_THREAD_MULTIPLE (two communication threads call "
            "MPI at once); this MPI library offers only thread level "
                << level);
    Header h;
    h.kind = kSplit;
    h.count = color;
    h.root = key;
    MPI_Comm child = MPI_COMM_NULL;
    issue(h, nullptr, nullptr, 0, 0, &child).wait_host();
    return std::make_unique<MpiCommunicator>(child, family_);
  }

  // Fails what is queued, makes the running collective give up at its next
  // poll, and returns once the communication thread has left it.
  void abort_one(const std::string& reason) {
    std::vector<Op> dropped;
    {
      std::unique_lock<std::mutex> lock(q_mu_);
      if (!aborted_) {
        reason_ = reason;
        aborted_ = true;
      }
      dropped.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
      queue_.clear();
      idle_cv_.wait(lock, [&] { return !in_op_; });
    }
    for (Op& op : dropped) op.state->finish(std::make_exception_ptr(aborted_error(op.header)));
  }

 private:
  struct Op {
    Header header;
    const void* send;
    void* recv;
    std::shared_ptr<CommHandle::State> state;
    Clock::time_point issued_at;
    bool internal;  // the departure and split: not a collective of the API, not counted
    MPI_Comm* split_out = nullptr;  // split: the child's communicator
    int step = -1;  // the training step it was issued in (current_step), for messages
  };

  // Both constructors: this rank's place, the family, the communication thread.
  void start() {
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    {
      std::lock_guard<std::mutex> lock(family_->mu);
      family_->members.push_back(this);
      if (family_->aborted) {  // the family failed while this one was being made
        reason_ = family_->reason;
        aborted_ = true;
      }
    }
    worker_ = std::thread([this] { worker_loop(); });
  }

  // Called by the rank's own thread: count the collective (bytes and calls
  // at issue time, as the threads backend does) and queue it.
  CommHandle issue(Header h, const void* send, void* recv, size_t full_count, size_t full_bytes,
                   MPI_Comm* split_out = nullptr) {
    // MPI counts and displacements are ints (in elements).
    REQUIRE(full_count <= size_t(INT_MAX),
            "mpi backend: " << collective_name(CollectiveKind(h.kind)) << " of " << full_count
                            << " elements is over MPI's limit of " << INT_MAX
                            << " elements per call; split the buffer");
    auto state = std::make_shared<CommHandle::State>();
    const bool internal = split_out != nullptr;
    if (!internal) {
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.add(CollectiveKind(h.kind), ring_bytes(CollectiveKind(h.kind), full_bytes, size_));
    }
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      h.seq = int64_t(issued_++);
      if (aborted_ || gone_rank_ >= 0) {  // nothing will run any more
        state->finish(broken_error(h));
        return CommHandle(state);
      }
      queue_.push_back(Op{h, send, recv, state, Clock::now(), internal, split_out, current_step()});
    }
    q_cv_.notify_all();
    return CommHandle(state);
  }

  CommAborted aborted_error(const Header& h) const {  // reason_ is set before aborted_
    return CommAborted("[rank " + std::to_string(rank_) + "] " + describe(h) + " (collective #" +
                       std::to_string(h.seq) + " of this rank) aborted: " + reason_);
  }
  Error gone_error(const Header& h, int rank, int64_t issued) const {
    return Error("[rank " + std::to_string(rank_) + "] " + describe(h) + " (collective #" +
                 std::to_string(h.seq) + " of this rank) cannot complete: rank " +
                 std::to_string(rank) + " finished after issuing only " + std::to_string(issued) +
                 " collectives. Every rank must issue the same collectives in the same order.");
  }
  // Why a collective cannot run once the group is broken. Called with q_mu_ held.
  std::exception_ptr broken_error(const Header& h) const {
    if (aborted_) return std::make_exception_ptr(aborted_error(h));
    return std::make_exception_ptr(gone_error(h, gone_rank_, gone_issued_));
  }

  // The communication thread: runs this rank's collectives one at a time, in
  // the order they were issued.
  void worker_loop() {
    set_current_rank(rank_);
    for (;;) {
      Op op;
      std::exception_ptr error;
      {
        std::unique_lock<std::mutex> lock(q_mu_);
        q_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left to run
        op = std::move(queue_.front());
        queue_.pop_front();
        if (aborted_ || gone_rank_ >= 0) error = broken_error(op.header);
        else in_op_ = true;
      }
      if (!error) {
        try {
          run(op);
        } catch (...) {
          error = std::current_exception();
        }
        if (abandoned_ && staging_) bury(std::move(staging_));
        {
          std::lock_guard<std::mutex> lock(q_mu_);
          in_op_ = false;
        }
        idle_cv_.notify_all();
      }
      if (!op.internal) {
        const double seconds = std::chrono::duration<double>(Clock::now() - op.issued_at).count();
        std::lock_guard<std::mutex> lock(stats_mu_);
        stats_.seconds[int(op.header.kind)] += seconds;
      }
      op.state->finish(error);
    }
  }

  // Polls non-blocking MPI operations to completion: a few quick polls
  // (short collectives end there), then naps growing to 0.2 ms so a waiting
  // rank leaves the core to the ranks that compute. Gives up if aborted, or
  // after the timeout: then `who` says why (which ranks it is waiting for),
  // this communicator is aborted with the message, and it is raised.
  template <class Who>
  void wait_requests(MPI_Request* reqs, int n, const Op& op, Who&& who) {
    auto nap = std::chrono::microseconds(5);
    Clock::time_point deadline{};
    for (int polls = 0;; polls++) {
      int done = 0;
      MPI_CHECK(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
      if (done) return;
      if (aborted_) {  // the request stays pending inside MPI: see bury()
        abandoned_ = true;
        throw aborted_error(op.header);
      }
      if (polls < 64) continue;
      const auto now = Clock::now();
      if (polls == 64) {
        deadline = now + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(family_->timeout_s));
      } else if (now > deadline) {
        abandoned_ = true;
        const std::string msg = comm_timeout_message(rank_, describe(op.header),
                                                     uint64_t(op.header.seq), op.step,
                                                     family_->timeout_s, who());
        {
          std::lock_guard<std::mutex> lock(q_mu_);
          if (!aborted_) {
            reason_ = msg;
            aborted_ = true;
          }
        }
        throw CommTimeout(msg);
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(200));
    }
  }
  void wait_request(MPI_Request& req, const Op& op) {
    wait_requests(&req, 1, op, [] {
      return std::string("every rank passed its header exchange, but the data has not all come "
                         "(a rank stopped in the middle of the transfer)");
    });
  }

  // Header exchange: every rank learns what every rank called. Throws the
  // same error on every rank if they differ, or if a rank has left.
  void exchange_headers(const Op& op) {
    const Header& me = op.header;
    Staging& s = *staging_;
    s.mine = me;
    s.headers.resize(size_t(size_));
    s.headers[size_t(rank_)] = me;
    // Receives first (requests 0..N-2, from the other ranks in rank order),
    // then the sends. Headers between two ranks match in the order sent.
    s.requests.assign(2 * size_t(size_ - 1), MPI_REQUEST_NULL);
    std::vector<int> from;
    for (int q = 0; q < size_; q++)
      if (q != rank_) {
        MPI_CHECK(MPI_Irecv(&s.headers[size_t(q)], kHeaderInts, MPI_INT64_T, q, kHeaderTag, comm_,
                            &s.requests[from.size()]));
        from.push_back(q);
      }
    for (size_t i = 0; i < from.size(); i++)
      MPI_CHECK(MPI_Isend(&s.mine, kHeaderInts, MPI_INT64_T, from[i], kHeaderTag, comm_,
                          &s.requests[from.size() + i]));
    wait_requests(s.requests.data(), int(s.requests.size()), op, [&] {
      std::vector<int> missing;
      for (size_t i = 0; i < from.size(); i++) {
        int came = 0;
        MPI_Test(&s.requests[i], &came, MPI_STATUS_IGNORE);
        if (!came) missing.push_back(from[i]);
      }
      if (missing.empty())
        return std::string("every rank's header has come, but not every rank has taken this "
                           "rank's (a rank stopped right after sending)");
      return rank_names(missing) + (missing.size() == 1 ? " has" : " have") +
             " not reached it (" + (missing.size() == 1 ? "its" : "their") +
             " header of it has not come)";
    });
    for (int q = 0; q < size_; q++) {
      const Header& other = s.headers[size_t(q)];
      if (other.kind == kDepart && me.kind != kDepart) {
        // Every rank still here saw the same departure at the same collective:
        // from now on none of them exchanges anything on this communicator.
        {
          std::lock_guard<std::mutex> lock(q_mu_);
          gone_rank_ = q;
          gone_issued_ = other.count;
        }
        throw gone_error(me, q, other.count);
      }
      if (me.kind == kDepart && other.kind != kDepart)
        throw Error("[rank " + std::to_string(rank_) + "] left the group after " +
                    std::to_string(me.count) + " collectives while rank " + std::to_string(q) +
                    " still issued " + describe(other));
    }
    for (int q = 1; q < size_; q++)
      if (!same_call(s.headers[0], s.headers[size_t(q)]))
        throw Error("collectives do not match at collective #" + std::to_string(me.seq) +
                    ": rank 0 called " + describe(s.headers[0]) + " but rank " +
                    std::to_string(q) + " called " + describe(s.headers[size_t(q)]) +
                    ". Every rank must issue the same collectives, with the same counts and "
                    "dtypes, in the same order.");
  }

  // One collective: the header, then the payload (see the file comment).
  void run(const Op& op) {
    const Header& h = op.header;
    exchange_headers(op);  // also the barrier
    if (h.kind == kSplit) return run_split(op);
    if (h.kind == kDepart || CollectiveKind(h.kind) == CollectiveKind::barrier) return;

    Staging& s = *staging_;
    const int N = size_, r = rank_;
    const DType dt = DType(h.dtype);
    const ReduceOp rop = ReduceOp(h.op);
    const MPI_Datatype t = mpi_type(dt);
    const size_t n = size_t(h.count), esz = dtype_size(dt);
    if (n == 0) return;  // nothing to move; the header exchange synchronised us
    s.counts.resize(size_t(N)); s.displs.resize(size_t(N));
    s.rcounts.resize(size_t(N)); s.rdispls.resize(size_t(N));
    MPI_Request req;

    switch (CollectiveKind(h.kind)) {
      case CollectiveKind::all_reduce: {
        // Piece q of my buffer goes to rank q; I receive piece r of every
        // rank's buffer, rank q's at slot q, and sum them in rank order into
        // piece r of my staged buffer; then every rank's reduced piece is
        // gathered into place everywhere.
        char* a = s.a_bytes(n * esz);
        copy_bytes(a, op.send, n * esz);
        const Piece mine = piece_of(n, N, r);
        char* b = s.b_bytes(size_t(N) * mine.size * esz);
        for (int q = 0; q < N; q++) {
          const Piece p = piece_of(n, N, q);
          s.counts[q] = int(p.size);
          s.displs[q] = int(p.begin);
          s.rcounts[q] = int(mine.size);
          s.rdispls[q] = int(size_t(q) * mine.size);
        }
        MPI_CHECK(MPI_Ialltoallv(a, s.counts.data(), s.displs.data(), t, b, s.rcounts.data(),
                                 s.rdispls.data(), t, comm_, &req));
        wait_request(req, op);
        std::vector<const void*> src(static_cast<size_t>(N));
        for (int q = 0; q < N; q++) src[q] = b + size_t(q) * mine.size * esz;
        reduce_in_rank_order(src, {a + mine.begin * esz}, mine.size, dt, rop);
        MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a, s.counts.data(),
                                  s.displs.data(), t, comm_, &req));
        wait_request(req, op);
        copy_bytes(op.recv, a, n * esz);
        break;
      }
      case CollectiveKind::reduce_scatter: {
        // Slot q of my send buffer goes to rank q; I sum the N slots r I
        // receive, in rank order, straight into my recv buffer (the send
        // buffer is staged, so recv may be my own slot of it).
        const size_t full = size_t(N) * n;
        char* a = s.a_bytes(full * esz);
        copy_bytes(a, op.send, full * esz);
        char* b = s.b_bytes(full * esz);
        MPI_CHECK(MPI_Ialltoall(a, int(n), t, b, int(n), t, comm_, &req));
        wait_request(req, op);
        std::vector<const void*> src(static_cast<size_t>(N));
        for (int q = 0; q < N; q++) src[q] = b + size_t(q) * n * esz;
        reduce_in_rank_order(src, {op.recv}, n, dt, rop);
        break;
      }
      case CollectiveKind::all_gather: {
        const size_t full = size_t(N) * n;
        char* a = s.a_bytes(full * esz);
        copy_bytes(a + size_t(r) * n * esz, op.send, n * esz);
        MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a, int(n), t, comm_, &req));
        wait_request(req, op);
        copy_bytes(op.recv, a, full * esz);
        break;
      }
      case CollectiveKind::broadcast: {
        char* a = s.a_bytes(n * esz);
        if (r == h.root) copy_bytes(a, op.send, n * esz);
        MPI_CHECK(MPI_Ibcast(a, int(n), t, int(h.root), comm_, &req));
        wait_request(req, op);
        if (r != h.root) copy_bytes(op.recv, a, n * esz);
        break;
      }
      case CollectiveKind::barrier:
        break;
    }
  }

  // split, after the header exchange: the same error on every rank for a
  // bad color (every rank has every header), else MPI_Comm_split, which
  // ranks the child by (key, rank) as Communicator::split promises.
  void run_split(const Op& op) {
    const Staging& s = *staging_;
    for (int q = 0; q < size_; q++)
      if (s.headers[size_t(q)].count < 0)
        throw Error("split (collective #" + std::to_string(op.header.seq) + "): rank " +
                    std::to_string(q) + " passed color " +
                    std::to_string(s.headers[size_t(q)].count) +
                    "; every rank must pass a color >= 0 (the ranks of one color form one "
                    "communicator)");
    MPI_CHECK(MPI_Comm_split(comm_, int(op.header.count), int(op.header.root), op.split_out));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<Staging> staging_;  // used only by the communication thread
  bool abandoned_ = false;            // communication thread only: a request was given up
  std::thread worker_;

  std::mutex q_mu_;
  std::condition_variable q_cv_;     // work was queued, or stopping
  std::condition_variable idle_cv_;  // the communication thread left a collective
  std::deque<Op> queue_;
  bool stopping_ = false;
  bool in_op_ = false;
  uint64_t issued_ = 0;
  std::string reason_;
  std::shared_ptr<MpiFamily> family_;
  std::atomic<bool> aborted_{false};  // written under q_mu_, polled without it
  int gone_rank_ = -1;                // a rank that left while this one still issued collectives
  int64_t gone_issued_ = 0;           // ... after issuing this many
};

void MpiFamily::abort_all(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu);
  if (!aborted) {
    aborted = true;
    reason = why;
  }
  for (MpiCommunicator* c : members) c->abort_one(reason);
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(double timeout_s) {
  mpi_init_once();
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, timeout_s);
}

}  // namespace zf
