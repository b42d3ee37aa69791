// comm_threads.cpp: the `threads` backend, every collective written out by
// hand over shared memory. This is the reference the other backends (and every
// stage's parity test) are measured against.
//
// Shape of the backend
//   ThreadGroup          shared by the N communicators of one group: the posted
//                        pointers, one reusable barrier, the aborted flag.
//   ThreadCommunicator   rank r's Communicator. Collectives are queued to one
//                        communication thread per rank and run in issue order,
//                        like kernels on a CUDA stream; the k-th collective of
//                        every rank meets the k-th collective of the others.
//   ThreadTransport      how rank r moves the bytes (comm_threads_impl.h):
//                        HostTransport below (comm_reduce.cpp's loops and
//                        memcpy), or the CUDA one of comm_threads_cuda.cu (a
//                        reduction kernel and device copies on the rank's
//                        stream, for buffers on GPUs). The algorithm below is
//                        the same for both; only the transport's calls differ.
//
// The algorithm (N ranks; rank r; the buffer cut into N contiguous pieces):
//   phase 1  post: rank r publishes its buffers and what it called, then waits
//            at the group barrier. After it every rank checks that all ranks
//            called the same collective (kind, count, dtype, op, root).
//   phase 2  reduce-scatter half: rank r owns piece r. It reads piece r of
//            *every* rank's input in rank order 0, 1, ..., N-1, sums in
//            float32 (bf16 inputs converted up, the result rounded to bf16
//            once; integers summed as integers), divides by N for avg.
//            reduce_scatter writes the result into rank r's recv buffer.
//   phase 3  all-gather half: rank r hands its finished piece to every rank,
//            writing it into piece r of every rank's output buffer (all_gather:
//            its send buffer into slot r of every recv buffer).
//   barrier  once every rank is through, every output is complete and no rank
//            reads another's input any more, so each caller may reuse its
//            buffers: the collective is done.
// all_reduce runs phases 2 and 3 block by block (a few KiB at a time), so each
// block is read once from every rank and written out while still in cache.
// That is safe in place: only rank r ever touches piece r of any buffer, and
// it reads all of a block before writing it. And since all_reduce's phase 2
// is reduce_scatter's loop (same pieces, same order, same rounding) and its
// phase 3 is all_gather's copy, all_gather(reduce_scatter(x)) equals
// all_reduce(x) bit for bit.
//
// Failures: every wait (the barrier, a queued collective) also watches the
// group's aborted flag, so abort() from any thread wakes every rank and each
// pending or later collective raises CommAborted carrying the reason. A rank
// whose communicator is destroyed while the others still wait for it to
// join a collective makes them fail with a message naming it, instead of
// hanging. A rank whose transport fails (a CUDA error; host copies cannot
// fail) marks the group aborted before raising its error, so the other
// ranks raise CommAborted instead of waiting for it at the next barrier.
//
// Waits use a mutex and condition variables, never spinning: a laptop (or a
// 2-core CI machine) runs N rank threads plus N communication threads.
#include "comm_threads.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm_reduce.h"
#include "comm_state.h"
#include "comm_threads_impl.h"

namespace zf {

namespace {

using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------------ what a rank posts

// One rank's call of one collective: what the others check it against, and
// the pointers they read from. `count` is in elements, as in the API:
// all_reduce/broadcast the buffer, reduce_scatter the recv count, all_gather
// the send count.
struct Post {
  uint64_t seq = 0;  // 0 for the first collective of this rank, 1 for the next...
  CollectiveKind kind = CollectiveKind::barrier;
  size_t count = 0;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  const void* send = nullptr;  // all_reduce and broadcast: the buffer (send == recv)
  void* recv = nullptr;
};

// The message of a collective's error.
std::string describe_error(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown error";
  }
}

std::string describe(const Post& p) {
  std::ostringstream s;
  s << collective_name(p.kind);
  if (p.kind != CollectiveKind::barrier) {
    s << "(count " << p.count << ", " << dtype_name(p.dtype);
    if (p.kind == CollectiveKind::all_reduce || p.kind == CollectiveKind::reduce_scatter)
      s << ", " << (p.op == ReduceOp::sum ? "sum" : "avg");
    if (p.kind == CollectiveKind::broadcast) s << ", root " << p.root;
    s << ")";
  }
  return s.str();
}

bool same_call(const Post& a, const Post& b) {
  if (a.kind != b.kind) return false;
  if (a.kind == CollectiveKind::barrier) return true;
  if (a.count != b.count || a.dtype != b.dtype) return false;
  if ((a.kind == CollectiveKind::all_reduce || a.kind == CollectiveKind::reduce_scatter) &&
      a.op != b.op)
    return false;
  if (a.kind == CollectiveKind::broadcast && a.root != b.root) return false;
  return true;
}

// ------------------------------------------------------------------ the group

// State shared by the N communicators of one group. Everything is guarded by
// mu_; buffers are read by other ranks only between two barriers, and the
// barrier's lock/unlock orders those reads after the owner's writes.
class ThreadGroup {
 public:
  explicit ThreadGroup(int n) : n_(n) {
    for (auto& slot : posts_) slot.resize(n);
  }
  int size() const { return n_; }

  // Phase 1. Posts are double-buffered by the parity of seq: a rank can be at
  // most one collective ahead of the slowest (it cannot pass the next
  // collective's first barrier alone), so its next post never overwrites one
  // that a slower rank is still reading.
  void post(int rank, const Post& p) {
    std::lock_guard<std::mutex> lock(mu_);
    posts_[p.seq % 2][rank] = p;
  }
  // Valid after the phase-1 barrier of collective `seq`, until its last barrier.
  const Post& posted(int rank, uint64_t seq) const { return posts_[seq % 2][rank]; }

  // Waits until all N ranks have arrived. Raises CommAborted if the group is
  // (or becomes) aborted, Error if a rank that can never arrive has left.
  void barrier(int rank, const Post& me) {
    std::unique_lock<std::mutex> lock(mu_);
    throw_if_broken(rank, me);
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {  // the last to arrive opens the barrier
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_ || any_departed_; });
    if (generation_ != gen) return;  // opened: later failures are for later barriers
    throw_if_broken(rank, me);
  }

  // Marks the group failed and wakes every waiting rank (the first reason
  // wins), then waits until no communication thread is inside a collective:
  // after abort() returns nobody reads or writes any rank's buffers, so a
  // failing rank may free its memory. Never called by a communication thread.
  void abort(const std::string& reason) {
    std::unique_lock<std::mutex> lock(mu_);
    mark_aborted_locked(reason);
    cv_.wait(lock, [&] { return active_ == 0; });
  }

  // Waits until no communication thread is inside a collective. A rank whose
  // collective failed calls it before it raises: other ranks' threads may
  // still be moving bytes into its buffers (a peer reduces its piece into
  // every rank's output), and the caller frees them once it has the error.
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return active_ == 0; });
  }

  // The first half of abort(), for a communication thread whose own data
  // movement failed: marks the group failed and wakes every rank, without
  // waiting (the caller is itself inside a collective).
  void fail(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    mark_aborted_locked(reason);
  }

  // A communication thread starts / ends running one collective. After an
  // abort no collective starts, so the count only falls.
  void enter(int rank, const Post& me) {
    std::lock_guard<std::mutex> lock(mu_);
    throw_if_broken(rank, me);
    ++active_;
  }
  void leave() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--active_ == 0) cv_.notify_all();
  }

  // Rank `rank` will issue no more collectives (it issued `issued` in all).
  // A rank leaves only after its last barrier has opened, so any barrier that
  // still waits for it can never open.
  void depart(int rank, uint64_t issued) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      any_departed_ = true;
      if (first_departed_ < 0) {
        first_departed_ = rank;
        first_departed_issued_ = issued;
      }
    }
    cv_.notify_all();
  }

 private:
  // Called with mu_ held. The first reason wins.
  void mark_aborted_locked(const std::string& reason) {
    if (aborted_) return;
    aborted_ = true;
    reason_ = reason;
    cv_.notify_all();
  }

  // Called with mu_ held.
  void throw_if_broken(int rank, const Post& me) const {
    if (aborted_)
      throw CommAborted("[rank " + std::to_string(rank) + "] " + describe(me) +
                        " (collective #" + std::to_string(me.seq) + " of this rank) aborted: " +
                        reason_);
    if (any_departed_)
      throw Error("[rank " + std::to_string(rank) + "] " + describe(me) + " (collective #" +
                  std::to_string(me.seq) + " of this rank) cannot complete: rank " +
                  std::to_string(first_departed_) + " finished after issuing only " +
                  std::to_string(first_departed_issued_) +
                  " collectives. Every rank must issue the same collectives in the same "
                  "order.");
  }

  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Post> posts_[2];
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  int active_ = 0;  // communication threads inside a collective
  std::string reason_;
  bool any_departed_ = false;
  int first_departed_ = -1;
  uint64_t first_departed_issued_ = 0;
};

// ------------------------------------------------------------------ the arithmetic
//
// piece_of (how the buffer is cut into N pieces) and reduce (the rank-ordered
// sum) live in comm_reduce.h, shared with the mpi backend so that both give
// the same bits.

// Host memory: the loops of comm_reduce.cpp and memcpy, run right here on
// the communication thread, so every call is complete when it returns.
class HostTransport final : public ThreadTransport {
 public:
  const char* backend() const override { return "threads"; }
  void reduce(const std::vector<const void*>& src, const std::vector<void*>& dst, size_t n,
              DType dt, ReduceOp op) override {
    reduce_in_rank_order(src, dst, n, dt, op);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
  }
};

const char* at(const void* p, size_t byte_offset) {
  return static_cast<const char*>(p) + byte_offset;
}
char* at(void* p, size_t byte_offset) { return static_cast<char*>(p) + byte_offset; }

// ------------------------------------------------------------------ one rank

class ThreadCommunicator : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank,
                     std::unique_ptr<ThreadTransport> io)
      : group_(std::move(group)), rank_(rank), io_(std::move(io)) {
    worker_ = std::thread([this] { worker_loop(); });
  }

  // Lets the communication thread finish what was issued (the other ranks
  // expect it), then tells the group this rank will issue nothing more.
  ~ThreadCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      stopping_ = true;
    }
    q_cv_.notify_all();
    worker_.join();
    group_->depart(rank_, issued_);
  }

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  const char* backend() const override { return io_->backend(); }
  ThreadTransport& transport() { return *io_; }

  CommHandle all_reduce_async(void* buf, size_t count, DType dt, ReduceOp op) override {
    Post p;
    p.kind = CollectiveKind::all_reduce;
    p.count = count; p.dtype = dt; p.op = op;
    p.send = buf; p.recv = buf;
    return issue(p, count * dtype_size(dt));
  }
  CommHandle reduce_scatter_async(const void* send, void* recv, size_t recv_count, DType dt,
                                  ReduceOp op) override {
    Post p;
    p.kind = CollectiveKind::reduce_scatter;
    p.count = recv_count; p.dtype = dt; p.op = op;
    p.send = send; p.recv = recv;
    return issue(p, size_t(size()) * recv_count * dtype_size(dt));
  }
  CommHandle all_gather_async(const void* send, void* recv, size_t send_count,
                              DType dt) override {
    Post p;
    p.kind = CollectiveKind::all_gather;
    p.count = send_count; p.dtype = dt;
    p.send = send; p.recv = recv;
    return issue(p, size_t(size()) * send_count * dtype_size(dt));
  }
  CommHandle broadcast_async(void* buf, size_t count, DType dt, int root) override {
    REQUIRE(root >= 0 && root < size(),
            "broadcast: root " << root << " is not a rank of this group of " << size());
    Post p;
    p.kind = CollectiveKind::broadcast;
    p.count = count; p.dtype = dt; p.root = root;
    p.send = buf; p.recv = buf;
    return issue(p, count * dtype_size(dt));
  }
  void barrier() override {
    Post p;
    p.kind = CollectiveKind::barrier;
    issue(p, 0).wait();
  }

  void abort(const std::string& reason) override { group_->abort(reason); }

 private:
  struct Op {
    Post post;
    std::shared_ptr<CommHandle::State> state;
    Clock::time_point issued_at;
    void* ticket = nullptr;  // the transport's, for inputs_ready
  };

  // Called by the rank's own thread: let the transport check the buffers
  // and mark what the collective comes after, count the collective (bytes
  // and calls at issue time) and queue it for the communication thread.
  CommHandle issue(Post p, size_t full_bytes) {
    void* ticket = io_->issued(p.kind, p.send, p.recv);
    auto state = std::make_shared<CommHandle::State>();
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.add(p.kind, ring_bytes(p.kind, full_bytes, size()));
    }
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      p.seq = issued_++;
      queue_.push_back(Op{p, state, Clock::now(), ticket});
    }
    q_cv_.notify_one();
    return CommHandle(state);
  }

  // The communication thread: runs this rank's collectives one at a time, in
  // the order they were issued.
  void worker_loop() {
    set_current_rank(rank_);
    for (;;) {
      Op op;
      {
        std::unique_lock<std::mutex> lock(q_mu_);
        q_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left to run
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        failing_the_group(op.post, [&] { io_->inputs_ready(op.ticket); });
        group_->enter(rank_, op.post);
        try {
          run(op.post);
        } catch (...) {
          group_->leave();
          throw;
        }
        group_->leave();
      } catch (...) {
        error = std::current_exception();
        // Not done with this rank's buffers until every peer's thread is out
        // of the collective. The group is marked failed first (if it is not
        // already), so that a peer waiting at a barrier for this rank raises
        // and leaves instead of waiting for ever.
        group_->fail("rank " + std::to_string(rank_) + ": " + describe(op.post) + " failed: " +
                     describe_error(error));
        group_->wait_idle();
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - op.issued_at).count();
      {
        std::lock_guard<std::mutex> lock(stats_mu_);
        stats_.seconds[int(op.post.kind)] += seconds;
      }
      op.state->finish(error);
    }
  }

  // Runs f (calls to the transport), then completes what they started. If
  // that fails, this rank cannot go on with the collective while the others
  // would wait for it at the next barrier: the group is marked failed first
  // (they raise CommAborted), then this rank raises the error itself. (The
  // host transport never fails.)
  template <class F>
  void moving(const Post& me, F&& f) {
    failing_the_group(me, [&] {
      f();
      io_->complete();
    });
  }
  template <class F>
  void failing_the_group(const Post& me, F&& f) {
    std::exception_ptr error;
    std::string why = "unknown error";
    try {
      f();
      return;
    } catch (const std::exception& e) {
      error = std::current_exception();
      why = e.what();
    } catch (...) {
      error = std::current_exception();
    }
    io_->drain();
    group_->fail("rank " + std::to_string(rank_) + ": " + describe(me) + " (collective #" +
                 std::to_string(me.seq) + " of this rank) failed: " + why);
    std::rethrow_exception(error);
  }

  // One collective, the three phases of the header comment.
  void run(const Post& me) {
    ThreadGroup& g = *group_;
    const int N = g.size();
    const int r = rank_;

    // Phase 1: post my buffers; once everyone has, check we all called the same thing.
    g.post(r, me);
    g.barrier(r, me);
    for (int q = 0; q < N; q++) {
      const Post& other = g.posted(q, me.seq);
      if (!same_call(g.posted(0, me.seq), other))
        throw Error("collectives do not match at collective #" + std::to_string(me.seq) +
                    ": rank 0 called " + describe(g.posted(0, me.seq)) + " but rank " +
                    std::to_string(q) + " called " + describe(other) +
                    ". Every rank must issue the same collectives, with the same counts and "
                    "dtypes, in the same order.");
    }

    const size_t esz = dtype_size(me.dtype);
    switch (me.kind) {
      case CollectiveKind::all_reduce: {
        // Phase 2: reduce my piece r, reading piece r of every rank's buffer
        // in rank order. Phase 3: hand the finished piece to every rank by
        // writing it into piece r of every buffer (mine included). Both are
        // done block by block, so each block is read once from every rank
        // and written while still in cache. Safe in place: only I touch
        // piece r of any buffer, and I read all of a block before writing it.
        const Piece mine = piece_of(me.count, N, r);
        std::vector<const void*> src(N);
        std::vector<void*> dst(N);
        for (int q = 0; q < N; q++) {
          src[q] = at(g.posted(q, me.seq).recv, mine.begin * esz);
          dst[q] = at(g.posted(q, me.seq).recv, mine.begin * esz);
        }
        moving(me, [&] { io_->reduce(src, dst, mine.size, me.dtype, me.op); });
        g.barrier(r, me);  // every piece is in every buffer: my caller may use mine
        break;
      }
      case CollectiveKind::reduce_scatter: {
        // Phase 2 only: slot r of every rank's send buffer, summed in rank
        // order by the same loop as all_reduce, into my recv buffer.
        std::vector<const void*> src(N);
        for (int q = 0; q < N; q++)
          src[q] = at(g.posted(q, me.seq).send, size_t(r) * me.count * esz);
        const std::vector<void*> dst = {me.recv};
        moving(me, [&] { io_->reduce(src, dst, me.count, me.dtype, me.op); });
        g.barrier(r, me);  // nobody reads my send buffer any more
        break;
      }
      case CollectiveKind::all_gather: {
        // Phase 3 only: my piece is my send buffer; I write it into slot r of
        // every rank's recv buffer. In place (send == recv + r*count) my own
        // copy is skipped, and no other rank writes slot r of my buffer.
        moving(me, [&] {
          for (int k = 0; k < N; k++) {
            const int q = (r + k) % N;  // start with mine, then spread the writes
            io_->copy(at(g.posted(q, me.seq).recv, size_t(r) * me.count * esz), me.send,
                      me.count * esz);
          }
        });
        g.barrier(r, me);  // every rank's slot of my recv buffer is written
        break;
      }
      case CollectiveKind::broadcast: {
        if (r != me.root)
          moving(me, [&] {
            io_->copy(me.recv, g.posted(me.root, me.seq).send, me.count * esz);
          });
        g.barrier(r, me);  // the root may reuse its buffer
        break;
      }
      case CollectiveKind::barrier:
        break;  // phase 1 was the whole collective
    }
  }

  std::shared_ptr<ThreadGroup> group_;
  const int rank_;
  std::unique_ptr<ThreadTransport> io_;  // used by the worker until it is joined
  std::thread worker_;
  std::mutex q_mu_;
  std::condition_variable q_cv_;
  std::deque<Op> queue_;
  bool stopping_ = false;
  uint64_t issued_ = 0;  // guarded by q_mu_ (read in the destructor after join)
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_communicators_with(
    std::vector<std::unique_ptr<ThreadTransport>> transports) {
  const int nranks = int(transports.size());
  REQUIRE(nranks >= 1, "make_thread_communicators: need at least one rank, got " << nranks);
  auto group = std::make_shared<ThreadGroup>(nranks);
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.reserve(nranks);
  for (int r = 0; r < nranks; r++)
    comms.push_back(std::make_unique<ThreadCommunicator>(group, r, std::move(transports[r])));
  return comms;
}

std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int nranks) {
  REQUIRE(nranks >= 1, "make_thread_communicators: need at least one rank, got " << nranks);
  std::vector<std::unique_ptr<ThreadTransport>> transports;
  for (int r = 0; r < nranks; r++) transports.push_back(std::make_unique<HostTransport>());
  return make_thread_communicators_with(std::move(transports));
}

ThreadTransport* thread_transport(Communicator& comm) {
  auto* c = dynamic_cast<ThreadCommunicator*>(&comm);
  return c ? &c->transport() : nullptr;
}

}  // namespace zf
