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
// A rank that never comes (stuck in its own code, or far slower) makes the
// others' barrier time out (the family's timeout, --comm-timeout): the first
// to time out fails the group with a message naming the collective and the
// ranks that have not arrived, and every other rank raises CommAborted.
//
// Waits never spin: a laptop (or a 2-core CI machine) runs N rank threads
// plus N communication threads. Each wait first yields the core a few times
// (the peer is usually microseconds away), then sleeps on a condition
// variable (wait_for_peer, comm_state.h).
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
#include "comm_thread_group.h"
#include "comm_threads_impl.h"

namespace zf {

namespace {

using Clock = std::chrono::steady_clock;
using threads_detail::Post;
using threads_detail::ThreadGroup;
using threads_detail::describe;
using threads_detail::describe_error;
using threads_detail::same_call;
using threads_detail::SplitOut;

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
  bool splits() const override { return true; }
  std::unique_ptr<ThreadTransport> split_transport(int, const std::vector<int>&) override {
    return std::make_unique<HostTransport>();
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

  // A collective of this group like the others (queued, run on the
  // communication thread in issue order, so a split issued where a peer
  // issued something else is the usual mismatch error); not counted. The
  // child is a group of its own in this group's family, with one more
  // communication thread per rank, and a transport split from this one.
  std::unique_ptr<Communicator> split(int color, int key) override {
    if (!io_->splits()) return Communicator::split(color, key);
    Post p;
    p.kind = CollectiveKind::barrier;
    p.split = true;
    p.color = color;
    p.key = key;
    SplitOut out;
    p.out = &out;
    issue(p, 0).wait_host();
    return std::make_unique<ThreadCommunicator>(out.group, out.rank,
                                                io_->split_transport(out.rank, out.members));
  }

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
    if (!p.split) {
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.add(p.kind, ring_bytes(p.kind, full_bytes, size()));
    }
    p.step = current_step();
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      p.seq = issued_++;
      queue_.push_back(Op{p, state, Clock::now(), ticket});
    }
    group_->note_issued(rank_, p.seq + 1);
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
        wait_for_peer(lock, q_cv_, Clock::time_point::max(),
                      [&] { return stopping_ || !queue_.empty(); });
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
        // and leaves instead of waiting for ever. A timeout's message already
        // names this rank and the collective.
        bool timed_out = false;
        try {
          std::rethrow_exception(error);
        } catch (const CommTimeout&) {
          timed_out = true;
        } catch (...) {
        }
        group_->fail(timed_out ? describe_error(error)
                               : "rank " + std::to_string(rank_) + ": " + describe(op.post) +
                                     " failed: " + describe_error(error));
        group_->wait_idle();
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - op.issued_at).count();
      if (!op.post.split) {
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

    switch (me.kind) {
      case CollectiveKind::all_reduce:
      case CollectiveKind::reduce_scatter:
      case CollectiveKind::all_gather:
      case CollectiveKind::broadcast: {
        // Phases 2 and 3 (move_my_share), then the barrier that ends the
        // collective: every rank's share is in place, so my caller may use
        // my buffers and the others may reuse theirs.
        if (me.kind != CollectiveKind::broadcast || r != me.root) {
          std::vector<PostedBuffers> ranks(N);
          for (int q = 0; q < N; q++) ranks[q] = {g.posted(q, me.seq).send, g.posted(q, me.seq).recv};
          moving(me, [&] { move_my_share(*io_, me.kind, ranks, r, me.root, me.count, me.dtype, me.op); });
        }
        g.barrier(r, me);
        break;
      }
      case CollectiveKind::barrier:
        if (me.split) run_split(me);
        break;  // else phase 1 was the whole collective
    }
  }

  // split, after phase 1: every rank reads every rank's color and key, so a
  // bad color is the same error on every rank. The members of my color,
  // ordered by (key, rank), are the child's ranks; its rank 0 (the leader)
  // makes the child's group and offers it, the others take it after the
  // next barrier, and the leader withdraws it after a third (no rank keeps
  // its parent's reference).
  void run_split(const Post& me) {
    ThreadGroup& g = *group_;
    const int N = g.size();
    for (int q = 0; q < N; q++) {
      const Post& other = g.posted(q, me.seq);
      if (other.color < 0)
        throw Error("split (collective #" + std::to_string(me.seq) + "): rank " +
                    std::to_string(q) + " passed color " + std::to_string(other.color) +
                    "; every rank must pass a color >= 0 (the ranks of one color form one "
                    "communicator)");
    }
    std::vector<int> members;
    for (int q = 0; q < N; q++)
      if (g.posted(q, me.seq).color == me.color) members.push_back(q);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return g.posted(a, me.seq).key < g.posted(b, me.seq).key;  // ties: parent rank order
    });
    const int leader = members[0];
    if (rank_ == leader) g.offer_child(leader, ThreadGroup::create(int(members.size()), g.family()));
    g.barrier(rank_, me);
    me.out->group = g.child_of(leader);
    me.out->rank = int(std::find(members.begin(), members.end(), rank_) - members.begin());
    me.out->members = members;
    g.barrier(rank_, me);
    if (rank_ == leader) g.offer_child(leader, nullptr);
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

void move_my_share(ThreadTransport& io, CollectiveKind kind, const std::vector<PostedBuffers>& ranks, int r,
                   int root, size_t count, DType dt, ReduceOp op) {
  const int N = int(ranks.size());
  const size_t esz = dtype_size(dt);
  switch (kind) {
    case CollectiveKind::all_reduce: {
      // Phase 2: reduce my piece r, reading piece r of every rank's buffer in
      // rank order. Phase 3: hand the finished piece to every rank by writing
      // it into piece r of every buffer (mine included). Both are done block
      // by block, so each block is read once from every rank and written
      // while still in cache. Safe in place: only I touch piece r of any
      // buffer, and I read all of a block before writing it.
      const Piece mine = piece_of(count, N, r);
      std::vector<const void*> src(N);
      std::vector<void*> dst(N);
      for (int q = 0; q < N; q++) src[q] = dst[q] = at(ranks[q].recv, mine.begin * esz);
      io.reduce(src, dst, mine.size, dt, op);
      break;
    }
    case CollectiveKind::reduce_scatter: {
      // Phase 2 only: slot r of every rank's send buffer, summed in rank
      // order by the same loop as all_reduce, into my recv buffer.
      std::vector<const void*> src(N);
      for (int q = 0; q < N; q++) src[q] = at(ranks[q].send, size_t(r) * count * esz);
      io.reduce(src, {ranks[r].recv}, count, dt, op);
      break;
    }
    case CollectiveKind::all_gather:
      // Phase 3 only: my piece is my send buffer; I write it into slot r of
      // every rank's recv buffer. In place (send == recv + r*count) my own
      // copy is skipped, and no other rank writes slot r of my buffer.
      for (int k = 0; k < N; k++) {
        const int q = (r + k) % N;  // start with mine, then spread the writes
        io.copy(at(ranks[q].recv, size_t(r) * count * esz), ranks[r].send, count * esz);
      }
      break;
    case CollectiveKind::broadcast:
      if (r != root) io.copy(ranks[r].recv, ranks[root].send, count * esz);
      break;
    case CollectiveKind::barrier:
      break;  // no bytes
  }
}

std::unique_ptr<ThreadTransport> make_host_transport() { return std::make_unique<HostTransport>(); }

std::vector<std::unique_ptr<Communicator>> make_thread_communicators_with(
    std::vector<std::unique_ptr<ThreadTransport>> transports, double timeout_s) {
  const int nranks = int(transports.size());
  REQUIRE(nranks >= 1, "make_thread_communicators: need at least one rank, got " << nranks);
  auto group = ThreadGroup::create(nranks, nullptr, timeout_s);
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.reserve(nranks);
  for (int r = 0; r < nranks; r++)
    comms.push_back(std::make_unique<ThreadCommunicator>(group, r, std::move(transports[r])));
  return comms;
}

std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int nranks, double timeout_s) {
  REQUIRE(nranks >= 1, "make_thread_communicators: need at least one rank, got " << nranks);
  std::vector<std::unique_ptr<ThreadTransport>> transports;
  for (int r = 0; r < nranks; r++) transports.push_back(make_host_transport());
  return make_thread_communicators_with(std::move(transports), timeout_s);
}

ThreadTransport* thread_transport(Communicator& comm) {
  auto* c = dynamic_cast<ThreadCommunicator*>(&comm);
  return c ? &c->transport() : nullptr;
}

}  // namespace zf
