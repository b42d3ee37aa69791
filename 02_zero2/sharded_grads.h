// sharded_grads.h: what is new in ZeRO-2, gradients that never stay whole.
//
// A unit's backward writes its full gradient into a temporary buffer
// (begin_unit). As soon as it is done (reduce_unit), the buffer is
// reduce-scattered asynchronously: each rank receives the sum over ranks of
// its own piece, adds it into its persistent gradient piece (accumulating
// over micro-steps), and the temporary buffers are released. While unit u is
// being reduced, unit u-1's backward runs; at most two units' full gradients
// exist at any moment (category comm: they are communication buckets). The
// reduce-scatter runs in place: my piece of the sum lands in piece r of the
// unit's full buffer, so no receive buffer is needed.
// ZeRO-3 reuses this class unchanged.
#pragma once

#include <deque>

#include "comm.h"
#include "device.h"
#include "shard.h"
#include "tensor.h"

namespace zf {

class ShardedGradients {
 public:
  ShardedGradients(const ShardLayout& shards, DType dtype, MemoryTracker& mem, Device& dev, Communicator& comm);

  // A zeroed buffer for unit u's full gradient (N * S_u elements; the first n_u are the unit's).
  void* begin_unit(int u);
  // Unit u's gradient is complete: start its reduce-scatter, and finish the
  // unit before it (wait, add into its piece, release its buffers).
  void reduce_unit(int u);
  // Finishes every unit still being reduced (end of a micro-step's backward).
  void finish();

  // This rank's accumulated gradient piece of unit u (S_u elements).
  void* piece(int u);
  // Zeroes every piece (after the optimizer step).
  void zero();

 private:
  struct InFlight {
    int unit;
    Tensor full;  // the unit's whole gradient, reduce-scattered in place: my piece of the sum lands in piece r
    CommHandle handle;
  };
  void complete_oldest();
  void* my_piece_in(InFlight& f);  // piece r of the unit's full buffer

  const ShardLayout& shards_;
  DType dtype_;
  MemoryTracker& mem_;
  Device& dev_;
  Communicator& comm_;
  Tensor shard_;                  // shard_total elements, my pieces: the only persistent gradient (category grads)
  Tensor computing_;              // the unit whose backward is running
  int computing_unit_ = -1;
  std::deque<InFlight> inflight_;
};

}  // namespace zf
