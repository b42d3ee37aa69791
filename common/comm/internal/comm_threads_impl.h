// comm_threads_impl.h: the `threads` backend's data movement, pluggable
// (private to the comm backends; stages only see comm.h).
//
// comm_threads.cpp runs the algorithm of every collective: the posts, the
// barriers, which rank reduces which piece, the checks, abort. The bytes are
// moved by a ThreadTransport, one per rank, which it calls for nothing else
// than the data:
//   host   (comm_threads.cpp, make_thread_communicators): the rank-ordered
//          loops of comm_reduce.cpp and memcpy, on the rank's communication
//          thread. Every call is finished when it returns.
//   cuda   (comm_threads_cuda.cu, make_thread_communicators_cuda): a reduction
//          kernel and cudaMemcpyAsync on the rank's own CUDA stream, which the
//          communication thread synchronizes (complete()) before the barrier
//          that ends the collective.
// Both read the sources in rank order and round once, so the bits are the
// same whichever transport moved them.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "comm.h"

namespace zf {

class ThreadTransport {
 public:
  virtual ~ThreadTransport() = default;
  // What Communicator::backend() answers.
  virtual const char* backend() const = 0;

  // On the rank's own thread, when it issues a collective, before anything
  // is counted or queued. `send`/`recv` are the buffers of the call (both
  // null for a barrier; equal for all_reduce and broadcast). May check them
  // and raise Error (the collective is then not issued). Returns a ticket for
  // inputs_ready: what the collective must come after (cuda: an event
  // recorded on the rank's compute stream), or null.
  virtual void* issued(CollectiveKind /*kind*/, const void* /*send*/, const void* /*recv*/) {
    return nullptr;
  }
  // On the communication thread, once for every ticket issued() returned,
  // before the collective touches any buffer (also when it then fails):
  // returns once this rank's inputs are ready, and releases the ticket.
  virtual void inputs_ready(void* /*ticket*/) {}

  // The data movement, on the communication thread. reduce is exactly
  // reduce_in_rank_order (comm_reduce.h): for i < n, dst[d][i] = (src[0][i] +
  // src[1][i] + ... + src[N-1][i]) [/ N for avg], sources in this order, a
  // destination may be a source. copy moves `bytes` (nothing when dst == src).
  // Either may only have started when it returns: complete() finishes them.
  virtual void reduce(const std::vector<const void*>& src, const std::vector<void*>& dst,
                      size_t n, DType dt, ReduceOp op) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Returns once every reduce and copy called so far has completed: the
  // barrier after it may then let other ranks reuse their buffers.
  virtual void complete() {}
  // After a failure in the data movement: waits, as well as it can and
  // without raising, until nothing this rank started touches a buffer.
  virtual void drain() noexcept {}

  // Communicator::split: whether this transport can make one for a child
  // group, and the child rank's own transport (its own streams, where it
  // has any), on the rank's thread. `members` are the child's ranks as
  // ranks of this transport's group, in the child's order.
  virtual bool splits() const { return false; }
  virtual std::unique_ptr<ThreadTransport> split_transport(int /*rank*/,
                                                           const std::vector<int>& /*members*/) {
    return nullptr;
  }
};

// One rank's buffers of a collective, as it posted them (all_reduce and
// broadcast: send == recv, the one buffer).
struct PostedBuffers {
  const void* send;
  void* recv;
};

// Rank r's share of the bytes of one collective (all_reduce, reduce_scatter,
// all_gather; broadcast on a rank other than the root) over every rank's
// posted buffers, through io: the reduction of its piece and its copies,
// with no synchronisation. comm_threads.cpp runs it between the
// collective's barriers; bench_comm times it alone, as its `bytes` column.
// count is the collective's: the whole buffer for all_reduce and broadcast,
// one rank's piece for reduce_scatter and all_gather.
void move_my_share(ThreadTransport& io, CollectiveKind kind, const std::vector<PostedBuffers>& ranks, int r,
                   int root, size_t count, DType dt, ReduceOp op);

// The host transport: the rank-ordered loops of comm_reduce.cpp and memcpy.
std::unique_ptr<ThreadTransport> make_host_transport();

// The N communicators of one threads group, rank r moving its data with
// transports[r]. make_thread_communicators is this with host transports.
// A barrier waits at most timeout_s (0: kDefaultCommTimeoutS).
std::vector<std::unique_ptr<Communicator>> make_thread_communicators_with(
    std::vector<std::unique_ptr<ThreadTransport>> transports, double timeout_s = 0);

// The transport of a communicator made by make_thread_communicators_with;
// null for any other communicator.
ThreadTransport* thread_transport(Communicator& comm);

}  // namespace zf
