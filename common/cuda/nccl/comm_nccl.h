// comm_nccl.h: the `nccl` backend, the Communicator of comm.h on device
// buffers, over NCCL. One rank per GPU: ranks as threads of one process
// (NcclCommunicator::create_group), or one rank per process with an NCCL id
// handed out by MPI (NcclCommunicator::create) or a rendezvous file
// (NcclCommunicator::create_from_file).
//
//   build/tests/test_gpu_comm              every collective against a host computation
//   scripts/gpu_check.sh RESULTS           also runs build/tests/nccl_two_process as two
//                                          processes sharing one GPU (NCCL_HOSTID per process)
//
// Same calls, counts and byte counters as the other backends (comm.h):
//   all_reduce(buf, n)             in place
//   reduce_scatter(send, recv, n)  n = recv count per rank, send holds N*n;
//                                  in place when recv == send + rank*n
//   all_gather(send, recv, n)      n = send count per rank, recv holds N*n;
//                                  in place when send == recv + rank*n
//   broadcast(buf, n, root)        in place
//   ReduceOp::avg is NCCL's ncclAvg.
// What differs: every pointer is a device pointer on this rank's GPU, and
// the sums are NCCL's (its order, and for bf16 a rounding at each step of
// its ring), so results match the threads backend within a tolerance, not
// bit for bit. Ranks do not check each other's calls (kind, count, dtype):
// that would cost a round trip per collective. A mismatch hangs or garbles,
// and the watchdog's timeout below turns a hang into an error.
//
// Streams. Each communicator owns a communication stream (non-blocking) and
// borrows the caller's compute stream (set_compute_stream; the default
// stream until set). Issuing a collective:
//   1. record an event on the compute stream: the inputs are ready once the
//      compute work issued so far is done;
//   2. make the communication stream wait on it (device side, no host wait);
//   3. enqueue the NCCL call on the communication stream, between a start
//      and a done event.
// So compute issued after the collective overlaps it on the device.
//
// Waiting. CommHandle::wait() is device side (comm.h): while the collective
// is pending, the compute stream waits for its done event
// (cudaStreamWaitEvent) and the host returns at once, so the compute work
// issued next, and a free of its buffers through the stream-ordered
// allocator (device_cuda.cu), run after the collective without the host
// ever blocking. The host must not read a result before a device sync
// (Device::to_host). CommHandle::wait_host(), the blocking forms
// (all_reduce() ...) and barrier() block the host until the watchdog has
// seen the collective complete. stream_wait_issued(stream) orders
// any stream after every collective issued so far.
//
// Where a failure raises. A collective that has failed when wait() is
// called raises there. One that fails after its wait() returned (on the
// device) raises, at the latest:
//   - at the next collective this rank issues (it fails at once on a failed
//     communicator: its wait() or wait_host() raises);
//   - at the next wait_host() or blocking collective: collectives complete
//     in issue order, one stream, and a failure fails every pending one, so
//     a host wait that succeeds vouches for every collective before it.
// Every stage reads its step's loss through a blocking all-reduce
// (global_mean_loss, host_collectives.h), so a failure raises within the
// step it happens in, or the next one for the parameter all-gathers that
// ZeRO-1/2 issue after the loss (their next collective, or the final gather
// of the model). Meanwhile the compute stream still waits for the failed
// collective: the watchdog aborts it and drains the communication stream
// (ncclCommAbort makes NCCL's kernels quit), and then the compute stream
// goes on with garbage in the collective's buffers: what it computes from
// them is wrong, but no result of the rank leaves it (a logged loss, a
// saved model) before the error raises. Should NCCL's kernels not quit (the watchdog
// says so after the drain limit), a device sync of the compute stream would
// block: the one case where a device-side wait can hang where a host wait
// would have raised.
//
// Failures never hang. The communicator is created non-blocking
// (ncclConfig_t.blocking = 0), so no NCCL call blocks the calling thread;
// every call that returns ncclInProgress is polled to completion with the
// same checks as the watchdog. The watchdog thread polls the pending
// collectives (cudaEventQuery) and, while any is pending, the communicator's
// asynchronous error (ncclCommGetAsyncError). The communicator is aborted
// (ncclCommAbort), and every pending and later collective raises an error
// naming the rank and the cause, when:
//   - abort(reason) is called by any rank of the group (ranks as threads
//     share one abort flag: every rank's communicator is aborted);
//   - NCCL reports an asynchronous error (a peer died, a network failure);
//   - a collective has not completed ZF_NCCL_TIMEOUT_S seconds (default 600)
//     after it was issued (a rank is missing, or called something else);
//   - in a group of threads, a rank destroyed its communicator having issued
//     fewer collectives than this one is waiting for.
// The rank that saw the problem raises Error (the cause); every other rank
// of the group raises CommAborted (an echo, as in comm.h), and so do all
// ranks after abort(). Ranks in other processes cannot be woken from here:
// they see NCCL's asynchronous error or their own timeout. A collective
// raises only once its aborted kernels have left the communication stream
// (waited for at most 10-60 s), so a caller may free its buffers on the error.
// NCCL_COMM_BLOCKING=1 in the environment would make NCCL's own calls block
// and defeat all of this (a warning says so).
//
// Counters: bytes and calls when a collective is issued (ring_bytes, as the
// other backends); seconds when it completes, measured on the device between
// its start and done events: the time the communication stream spent in the
// collective, waiting for peers included, but not the wait for its inputs.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "comm.h"

// NCCL_CHECK(call): throw zf::Error("file:line [rank r] NCCL error <text> in
// <call>: <NCCL's last error>") when the call does not return ncclSuccess.
#define NCCL_CHECK(call) ::zf::nccl_check((call), #call, __FILE__, __LINE__)

namespace zf {

void nccl_check(ncclResult_t result, const char* call, const char* file, int line);

// ZF_NCCL_TIMEOUT_S from the environment (seconds, > 0), else 600. A value
// that is not a positive number is an error naming the variable.
double nccl_timeout_from_env();

struct NcclOptions {
  // How long a collective (or the communicator's creation) may take before
  // the communicator is aborted. <= 0: nccl_timeout_from_env().
  double timeout_s = 0;
  // How long the creation (rendezvous included) may take, when it should
  // differ from timeout_s; <= 0: timeout_s. A test that wants a collective
  // to time out within a fraction of a second still needs NCCL's set-up
  // (topology, buffers, proxy thread), which alone can take that long.
  double init_timeout_s = 0;
};

class NcclCommunicator : public Communicator {
 public:
  // Ranks as threads of this process: rank r drives devices[r] (distinct
  // devices: NCCL does not allow two ranks of one communicator on one GPU).
  // Called from one thread; each communicator is then used from its rank's
  // own thread.
  static std::vector<std::unique_ptr<NcclCommunicator>> create_group(
      const std::vector<int>& devices, const NcclOptions& opt = {});

  // One rank per process: this process is `rank` of `world`, on `device`.
  // Every process calls it with the same id (ncclGetUniqueId on one of them,
  // passed on by MPI). Returns once all `world` ranks have joined; raises an
  // Error after the timeout if they do not.
  static std::unique_ptr<NcclCommunicator> create(const ncclUniqueId& id, int rank, int world,
                                                  int device, const NcclOptions& opt = {});

  // The same, for processes started without MPI (RANK and WORLD_SIZE in the
  // environment): rank 0 makes the id and publishes it in the file `path`
  // (rendezvous.h: a file left by an earlier run is never taken), the other
  // ranks read it; rank 0 removes the file once every rank has joined. The
  // path must be on a file system every rank sees (any local path when all
  // run on one host). Waiting for the file counts against the same timeout.
  static std::unique_ptr<NcclCommunicator> create_from_file(const std::string& path, int rank,
                                                            int world, int device,
                                                            const NcclOptions& opt = {});

  const char* backend() const override { return "nccl"; }

  // This rank's GPU, the communication stream the collectives run on, and
  // the compute stream they are ordered after (must be on device()).
  virtual int device() const = 0;
  virtual cudaStream_t comm_stream() const = 0;
  virtual cudaStream_t compute_stream() const = 0;
  virtual void set_compute_stream(cudaStream_t stream) = 0;

  // Device-side ordering: `stream` waits (on the device) for every collective
  // issued so far; the host does not block. Errors still surface through
  // the handles, or through the next collective. (CommHandle::wait() does
  // the same for one collective and the compute stream.)
  virtual void stream_wait_issued(cudaStream_t stream) = 0;

  virtual double timeout_s() const = 0;
};

}  // namespace zf
