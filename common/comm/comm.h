// comm.h: the Communicator every stage talks to, whatever carries the bytes.
//
// Five collectives (all_reduce, reduce_scatter, all_gather, broadcast,
// barrier), each with an async form that returns a CommHandle to wait() on, so
// a stage can start reducing one unit's gradients while the next unit's
// backward runs. Backends: `threads` (ranks as threads of this process, the
// default and the reference), `mpi` (one process per rank, comm_mpi.h; the
// same rank-ordered sums, so the same bits), the threads backend on GPU
// buffers (comm_threads_cuda.h: virtual ranks sharing a GPU) and `nccl`
// (comm_nccl.h: one GPU per rank). launch.cpp picks one (see launch.h).
//
// Semantics (the same as NCCL's, counts in elements):
//   all_reduce(buf, n)             buf[i] = sum over ranks of buf[i]         (in place)
//   reduce_scatter(send, recv, n)  recv[i] = sum over ranks of send[r*n + i] (send holds N*n)
//   all_gather(send, recv, n)      recv[r*n + i] = send of rank r [i]        (recv holds N*n)
//   broadcast(buf, n, root)        buf = buf of root
// ReduceOp::avg divides the sum by N after summing. Sums run in a fixed rank
// order (rank 0 + rank 1 + ...), in float32 for f32 and bf16 (bf16 rounded
// once at the end), so reduce_scatter followed by all_gather equals
// all_reduce bit for bit.
//
// Sub-communicators (split): every backend cuts its ranks into groups by
// color, each group a communicator with its own queue and counters: HSDP's
// intra-group (color rank / F) and inter-group (color rank % F)
// communicators, or a duplicate (split(0, rank())) as a second queue, so an
// all_gather never waits behind a reduce_scatter issued on the other.
//   threads  a new group of the member ranks, one more communication thread
//            per rank (on GPU buffers also one more CUDA stream: run on the
//            emulated GPU of the tests, not yet on a GPU);
//   mpi      MPI_Comm_split on the communication thread; the child has its
//            own MPI communicator and communication thread (needs
//            MPI_THREAD_MULTIPLE);
//   nccl     ncclCommSplit; the child has its own NCCL communicator, stream
//            and watchdog (run on the emulated GPU, not yet on GPUs).
// The split is checked like a collective (threads, mpi): a rank that issues
// something else, or a color < 0 on any rank, is an error on every rank. The
// sums stay in rank order within the child (the child's ranks), so a child
// of all ranks, a duplicate, gives the parent's bits.
//
// Byte counters follow the ring model of nccl-tests' bus bandwidth: per rank,
// all_reduce moves 2(N-1)/N of the buffer, reduce_scatter and all_gather
// (N-1)/N of the full (N*n) buffer, broadcast the buffer once.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "check.h"
#include "dtype.h"

namespace zf {

enum class ReduceOp { sum, avg };
enum class CollectiveKind { all_reduce, reduce_scatter, all_gather, broadcast, barrier };
constexpr int kNumCollectives = 5;
const char* collective_name(CollectiveKind k);

// Raised on every rank when any rank has failed and the group was aborted.
struct CommAborted : Error {
  using Error::Error;
};

// Raised by the rank whose collective waited longer than the timeout (its
// message is comm_timeout_message's); the other ranks then raise CommAborted
// carrying it.
struct CommTimeout : Error {
  using Error::Error;
};

// The collective timeout (--comm-timeout, ZF_COMM_TIMEOUT_S): how long a rank
// of the threads and mpi backends waits for the others in one wait of a
// collective (its header exchange or barrier, a transfer) before it gives up
// and the job is aborted. A timeout of 0 given to a backend means this.
constexpr double kDefaultCommTimeoutS = 600;
inline double comm_timeout_or_default(double timeout_s) {
  return timeout_s > 0 ? timeout_s : kDefaultCommTimeoutS;
}

// "rank 1", "ranks 1 and 3", "ranks 0, 2 and 5".
std::string rank_names(const std::vector<int>& ranks);

// The one message of a timed-out collective, the same on every backend:
//   [rank 0] all_reduce(count 8, f32, sum) (collective #57 on this communicator,
//   step 2) timed out after 2 s: <who>. <what to do>
// `who` says which ranks have not arrived; step < 0 when unknown.
std::string comm_timeout_message(int rank, const std::string& collective, uint64_t seq, int step,
                                 double timeout_s, const std::string& who);

// Ring-model bytes a rank sends for one collective of `bytes` (the full
// buffer: for reduce_scatter the input, for all_gather the output).
double ring_bytes(CollectiveKind kind, size_t bytes, int nranks);

struct CommStats {
  std::array<double, kNumCollectives> bytes{};  // ring-model bytes sent
  std::array<uint64_t, kNumCollectives> calls{};
  std::array<double, kNumCollectives> seconds{};  // time from issue to completion
  double total_bytes() const;
  void add(CollectiveKind k, double b) { bytes[int(k)] += b; calls[int(k)]++; }
};

// A pending collective. A default handle is already done.
//
// wait(): after it returns, the caller may use the collective's buffers in
// order: work it then issues on its compute stream (the stream the
// communicator is ordered after) sees the result, and it may free or reuse
// the buffers (a release through the stream-ordered allocator is on that
// stream, so it comes after the collective). On the host backends (threads,
// mpi, threads on GPU buffers) the host has waited for the collective. On a
// backend whose collectives run on a GPU stream (nccl) the wait is on the
// device: the compute stream waits for the collective, the host goes on at
// once, and must not read a result without a device sync (Device::to_host
// does one). wait() raises the collective's error if it is known by then; a
// failure found later is raised by wait_host() on this handle or any later
// one, and by every later collective of the rank (comm_nccl.h).
//
// wait_host(): blocks the host until the collective has completed and raises
// its error (CommAborted if the group was aborted). The blocking forms of
// Communicator below and barrier() wait this way, so a collective whose
// result the host reads (the loss, the norm's limbs: host_collectives.h)
// raises every failure of the collectives issued before it.
class CommHandle {
 public:
  struct State;
  CommHandle() = default;
  explicit CommHandle(std::shared_ptr<State> s) : state_(std::move(s)) {}
  void wait();
  void wait_host();
  bool done() const;  // completed (or failed), as the host has seen it

 private:
  std::shared_ptr<State> state_;
};

// Every rank of a group must issue the same collectives (kind, count, dtype)
// in the same order; a mismatch is reported as an error on every rank.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;

  virtual CommHandle all_reduce_async(void* buf, size_t count, DType dt, ReduceOp op) = 0;
  virtual CommHandle reduce_scatter_async(const void* send, void* recv, size_t recv_count,
                                          DType dt, ReduceOp op) = 0;
  virtual CommHandle all_gather_async(const void* send, void* recv, size_t send_count,
                                      DType dt) = 0;
  virtual CommHandle broadcast_async(void* buf, size_t count, DType dt, int root) = 0;
  virtual void barrier() = 0;

  // Blocking forms: return once the collective has completed (wait_host).
  void all_reduce(void* buf, size_t count, DType dt, ReduceOp op = ReduceOp::sum) {
    all_reduce_async(buf, count, dt, op).wait_host();
  }
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dt,
                      ReduceOp op = ReduceOp::sum) {
    reduce_scatter_async(send, recv, recv_count, dt, op).wait_host();
  }
  void all_gather(const void* send, void* recv, size_t send_count, DType dt) {
    all_gather_async(send, recv, send_count, dt).wait_host();
  }
  void broadcast(void* buf, size_t count, DType dt, int root) {
    broadcast_async(buf, count, dt, root).wait_host();
  }

  // Marks the whole group failed: every rank's pending and future collectives
  // raise CommAborted carrying `reason`. Returns once no collective of the
  // group touches any rank's buffers any more, so a failing rank may then free
  // its memory. Call it from a rank's thread or from outside, never from a
  // backend's own communication thread.
  virtual void abort(const std::string& reason) = 0;

  // Collective over this communicator (every rank calls it, in the same order as its other
  // collectives): returns the communicator of the ranks that passed the same color (>= 0),
  // ranked by (key, this rank), like MPI_Comm_split and ncclCommSplit. The child has its own
  // queue (its collectives are ordered only among themselves), and its own stats().
  // Aborting any communicator of a family (this one, or one split from it, at any depth)
  // aborts them all, so a failing rank stops peers waiting on any queue.
  // A color < 0 on any rank is an Error (on the threads and mpi backends on
  // every rank). split(0, rank()) is a duplicate: the same ranks, a second
  // queue. The default raises Error("split is not supported by <backend>").
  virtual std::unique_ptr<Communicator> split(int color, int key);

  // Counters since construction (or reset_stats). Bytes and calls are counted
  // when a collective is issued; seconds when it completes.
  CommStats stats() const {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return stats_;
  }
  void reset_stats() {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_ = CommStats{};
  }
  // Puts the bytes and calls back to an earlier snapshot, so that work which is
  // not training (saving a checkpoint) does not count as training's traffic.
  // Seconds are left as they are: a backend may still be adding the time of
  // collectives that completed on the device before the snapshot.
  void restore_counts(const CommStats& snapshot) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.bytes = snapshot.bytes;
    stats_.calls = snapshot.calls;
  }

 protected:
  mutable std::mutex stats_mu_;
  CommStats stats_;
};

// Declared after the buffers a rank's collectives use (so it is destroyed
// before them; TrainingRun holds one for every stage). If the rank is
// leaving by an exception, it aborts the group and waits until no collective
// touches any buffer, so the buffers this rank is about to free cannot be
// written by another rank's collective still in flight.
class RankFailureGuard {
 public:
  explicit RankFailureGuard(Communicator& comm)
      : comm_(comm), uncaught_(std::uncaught_exceptions()) {}
  ~RankFailureGuard() {
    if (std::uncaught_exceptions() > uncaught_)
      comm_.abort("rank " + std::to_string(comm_.rank()) + " failed (its error is reported by the launcher)");
  }
  RankFailureGuard(const RankFailureGuard&) = delete;
  RankFailureGuard& operator=(const RankFailureGuard&) = delete;

 private:
  Communicator& comm_;
  int uncaught_;
};

}  // namespace zf
