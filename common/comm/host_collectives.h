// host_collectives.h: collectives on small host values (the step's loss, the
// gradient norm's limbs, the final gather of the model for its hash).
//
// The threads and MPI communicators move host memory; NCCL and the threads
// communicator on GPU buffers move device memory only. These helpers take
// host buffers and, when the rank's device is a GPU, stage them through a
// temporary device buffer (outside the memory tracker, like a backend's own
// internal buffers: a few bytes, or one unit at the end of a run).
#pragma once

#include <cstddef>

#include "comm.h"
#include "device.h"
#include "gradnorm.h"

namespace zf {

void all_reduce_host(Communicator& comm, Device& dev, void* host, size_t count, DType dtype, ReduceOp op);
void all_gather_host(Communicator& comm, Device& dev, const void* host_send, void* host_recv, size_t send_count,
                     DType dtype);

// Sums every rank's exact sum of squares (an i64 all_reduce of the limbs),
// so each rank holds the norm of the whole gradient, whatever its shard.
void all_reduce(SumOfSquares& sq, Communicator& comm, Device& dev);

}  // namespace zf
