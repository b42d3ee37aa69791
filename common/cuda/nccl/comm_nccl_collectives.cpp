// comm_nccl_collectives.cpp: the `nccl` backend (comm_nccl.h), second of
// three files: issuing a collective. Each call becomes issue(): the event on
// the compute stream, the device-side wait of the communication stream, the
// NCCL call between a start and a done event (polled while NCCL answers
// ncclInProgress), the byte counters, and the handle whose wait() orders the
// compute stream after the collective on the device (order_after). Also the
// small pool of start/done events. The classes and how the backend works:
// comm_nccl_impl.h. Creating and closing a rank: comm_nccl.cpp. The watchdog
// that completes the collectives, and failures: comm_nccl_watchdog.cpp.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "comm_nccl_impl.h"
#include "comm_state.h"
#include "kernels_cuda.h"  // CUDA_CHECK

namespace zf::nccl_detail {

namespace {

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::i64: return ncclInt64;
    case DType::i32: return ncclInt32;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::avg ? ncclAvg : ncclSum; }

// "all_reduce(count 4099, bf16, avg)", as the other backends write it.
std::string describe(CollectiveKind kind, size_t count, DType dt, ReduceOp op, int root) {
  std::ostringstream s;
  s << collective_name(kind);
  if (kind != CollectiveKind::barrier) {
    s << "(count " << count << ", " << dtype_name(dt);
    if (kind == CollectiveKind::all_reduce || kind == CollectiveKind::reduce_scatter)
      s << ", " << (op == ReduceOp::sum ? "sum" : "avg");
    if (kind == CollectiveKind::broadcast) s << ", root " << root;
    s << ")";
  }
  return s.str();
}

}  // namespace

void NcclRank::stream_wait_issued(cudaStream_t stream) {
  DeviceGuard g(device_);
  std::lock_guard<std::mutex> lock(nccl_mu_);
  CUDA_CHECK(cudaEventRecord(tail_, comm_stream_));
  CUDA_CHECK(cudaStreamWaitEvent(stream, tail_, 0));
}

CommHandle NcclRank::all_reduce_async(void* buf, size_t count, DType dt, ReduceOp op) {
  const ncclDataType_t t = nccl_type(dt);
  const ncclRedOp_t o = nccl_op(op);
  return issue(CollectiveKind::all_reduce, count, dt, op, 0, count * dtype_size(dt),
               [=](ncclComm_t c, cudaStream_t s) {
                 return ncclAllReduce(buf, buf, count, t, o, c, s);
               });
}
CommHandle NcclRank::reduce_scatter_async(const void* send, void* recv, size_t recv_count,
                                          DType dt, ReduceOp op) {
  const ncclDataType_t t = nccl_type(dt);
  const ncclRedOp_t o = nccl_op(op);
  return issue(CollectiveKind::reduce_scatter, recv_count, dt, op, 0,
               size_t(size_) * recv_count * dtype_size(dt), [=](ncclComm_t c, cudaStream_t s) {
                 return ncclReduceScatter(send, recv, recv_count, t, o, c, s);
               });
}
CommHandle NcclRank::all_gather_async(const void* send, void* recv, size_t send_count,
                                      DType dt) {
  const ncclDataType_t t = nccl_type(dt);
  return issue(CollectiveKind::all_gather, send_count, dt, ReduceOp::sum, 0,
               size_t(size_) * send_count * dtype_size(dt), [=](ncclComm_t c, cudaStream_t s) {
                 return ncclAllGather(send, recv, send_count, t, c, s);
               });
}
CommHandle NcclRank::broadcast_async(void* buf, size_t count, DType dt, int root) {
  REQUIRE(root >= 0 && root < size_,
          "broadcast: root " << root << " is not a rank of this group of " << size_);
  const ncclDataType_t t = nccl_type(dt);
  return issue(CollectiveKind::broadcast, count, dt, ReduceOp::sum, root,
               count * dtype_size(dt), [=](ncclComm_t c, cudaStream_t s) {
                 return ncclBroadcast(buf, buf, count, t, root, c, s);
               });
}
// NCCL has no barrier: an all-reduce of one float does it, waited for on
// the host (the barrier is host-side in comm.h).
void NcclRank::barrier() {
  float* p = scratch_;
  issue(CollectiveKind::barrier, 1, DType::f32, ReduceOp::sum, 0, 0,
        [=](ncclComm_t c, cudaStream_t s) {
          return ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, c, s);
        })
      .wait_host();
}

// Called by the rank's thread. See comm_nccl_impl.h.
template <class Launch>
CommHandle NcclRank::issue(CollectiveKind kind, size_t count, DType dt, ReduceOp rop, int root,
                           size_t full_bytes, Launch launch) {
  auto state = std::make_shared<CommHandle::State>();
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.add(kind, ring_bytes(kind, full_bytes, size_));
  }
  Op op;
  op.kind = kind;
  op.what = describe(kind, count, dt, rop, root);
  op.state = state;
  op.issued_at = Clock::now();
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    op.seq = issued_++;
    // CommHandle::wait() on the device (comm_state.h). Set before the
    // handle leaves this function, never changed after.
    state->device_wait = [this, seq = op.seq] { return order_after(seq); };
    if (!broken_.empty()) {  // nothing runs on a failed communicator
      state->finish(error_for(op));
      return CommHandle(state);
    }
  }
  // A failure while issuing leaves this rank unable to take part, and its
  // peers may wait for it: the communicator fails, and so does the group.
  auto refuse = [&](const std::string& reason, bool aborted, int64_t seq = -1) {
    fail(reason, aborted, seq);
    if (!aborted) group_->abort_all(reason);
    drain_after_abort();  // NCCL may have enqueued part of it
    std::lock_guard<std::mutex> lock(q_mu_);
    give_back(op);
    state->finish(error_for(op));
    return CommHandle(state);
  };
  try {
    DeviceGuard g(device_);
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      op.start = take_event();
      op.done = take_event();
    }
    std::lock_guard<std::mutex> lock(nccl_mu_);
    if (!comm_) throw CommAborted("");  // failed meanwhile: broken_ says why
    // 1-2: the inputs are what the compute stream has produced so far.
    CUDA_CHECK(cudaEventRecord(ready_, compute_stream_));
    CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ready_, 0));
    // 3: start, the collective (nothing to do for an empty buffer), done.
    CUDA_CHECK(cudaEventRecord(op.start, comm_stream_));
    if (count > 0) settle_locked(launch(comm_, comm_stream_), op);
    CUDA_CHECK(cudaEventRecord(op.done, comm_stream_));
  } catch (const CommAborted&) {  // the group was aborted (settle_locked), or we failed
    return refuse(group_->aborted() ? group_->reason() : "aborted", true);
  } catch (const std::exception& e) {
    return refuse("rank " + std::to_string(rank_) + ": " + op.what + " (collective #" +
                      std::to_string(op.seq) + " of this rank): " + e.what(),
                  false, int64_t(op.seq));
  }
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    if (broken_.empty()) {
      pending_.push_back(std::move(op));
      op.state = nullptr;
    }
  }
  if (op.state) {  // failed meanwhile (the watchdog has let go): enqueued on an aborted comm
    drain_after_abort();
    std::lock_guard<std::mutex> lock(q_mu_);
    give_back(op);
    state->finish(error_for(op));
    return CommHandle(state);
  }
  q_cv_.notify_all();
  return CommHandle(state);
}

// CommHandle::wait() of collective `seq`, from the rank's thread: the
// compute stream waits (on the device) for the collective's done event, so
// the work the caller issues next, frees through the stream-ordered
// allocator included, comes after the collective; the host goes on. q_mu_
// is held so the event cannot go back to the pool and be recorded again
// for a later collective meanwhile (give_back). Returns false, and wait()
// waits on the host instead, when the collective is no longer pending (the
// watchdog has seen its done event complete: later device work is after
// it anyway, and the handle is about to be finished) or when the
// communicator has failed (the host wait raises once the watchdog has
// drained the stream).
bool NcclRank::order_after(uint64_t seq) {
  DeviceGuard g(device_);  // the legacy default stream, when it is the compute stream, is per device
  std::lock_guard<std::mutex> lock(q_mu_);
  if (!broken_.empty()) return false;
  for (const Op& op : pending_)
    if (op.seq == seq) {
      CUDA_CHECK(cudaStreamWaitEvent(compute_stream_, op.done, 0));
      return true;
    }
  return false;
}

// Non-blocking NCCL: a call may return ncclInProgress, and must then be
// polled (ncclCommGetAsyncError) until NCCL has enqueued it, before the
// next call on this communicator. Called with nccl_mu_ held; throws
// CommAborted if the group is aborted meanwhile, Error on an NCCL error
// or after the timeout (the caller then fails the communicator).
void NcclRank::settle_locked(ncclResult_t result, const Op& op) {
  if (result == ncclSuccess) return;
  if (result != ncclInProgress) throw Error("NCCL error " + nccl_error_text(result));
  auto nap = std::chrono::microseconds(1);
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) state = q;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) throw Error("NCCL error " + nccl_error_text(state));
    if (group_->aborted()) throw CommAborted(group_->reason());
    if (seconds_since(op.issued_at) > timeout_s_) {
      std::ostringstream s;
      s << "NCCL did not enqueue it within " << timeout_s_
        << " s (ZF_NCCL_TIMEOUT_S): are all ranks issuing the same collectives?";
      throw Error(s.str());
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
}

// Events come from a small pool (q_mu_ held; the device current).
cudaEvent_t NcclRank::take_event() {
  if (!free_events_.empty()) {
    cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreate(&e));  // with timing: the seconds counters
  return e;
}
void NcclRank::give_back(Op& op) {  // q_mu_ held. An event still pending may be re-recorded.
  if (op.start) free_events_.push_back(op.start);
  if (op.done) free_events_.push_back(op.done);
  op.start = op.done = nullptr;
}

}  // namespace zf::nccl_detail
