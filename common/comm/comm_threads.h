// comm_threads.h: the `threads` backend, ranks as threads over shared memory.
//
// The reference implementation of every collective, written out by hand
// because it is what this project teaches: each rank posts its buffers, each
// rank reduces its own 1/N of the data by reading every rank's buffer in rank
// order (the reduce-scatter half), then writes its reduced piece into every
// rank's buffer (the all-gather half). Collectives issued async run on a
// per-rank communication thread in issue order, like a CUDA stream.
//
// Buffers in host memory. The same backend on CUDA device buffers (virtual
// ranks on one GPU, the same bits): comm_threads_cuda.h.
#pragma once

#include <memory>
#include <vector>

#include "comm.h"

namespace zf {

// Makes the N communicators of one group; communicator r is rank r's. A
// rank waits at most timeout_s (0: kDefaultCommTimeoutS) for the others in
// one barrier of a collective; then the group fails, naming the ranks that
// did not arrive (comm_threads.cpp).
std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int nranks, double timeout_s = 0);

}  // namespace zf
