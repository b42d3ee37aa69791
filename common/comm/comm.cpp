// comm.cpp: what every Communicator backend shares: collective names, the
// ring model of bytes moved (as nccl-tests' bus bandwidth counts them), the
// counters, and waiting on a pending collective (CommHandle: on the device
// where the backend can, else on the host).
//
// The ring model, per rank, for a collective over a buffer of `bytes` (the
// full buffer: all_reduce's buffer, reduce_scatter's input, all_gather's
// output) on N ranks:
//   all_reduce      2(N-1)/N * bytes   (a reduce-scatter, then an all-gather)
//   reduce_scatter   (N-1)/N * bytes   (every piece but one's own is sent once)
//   all_gather       (N-1)/N * bytes
//   broadcast              bytes       (0 on a single rank: nothing to send)
//   barrier                  0
// These are the factors that turn nccl-tests' algbw into busbw; a ring
// algorithm achieves exactly these volumes, so they are the numbers the
// logs compare against the formulas of docs/SPEC.md.
#include "comm.h"

#include <sstream>

#include "comm_state.h"

namespace zf {

const char* collective_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::all_gather: return "all_gather";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::barrier: return "barrier";
  }
  return "?";
}

double ring_bytes(CollectiveKind kind, size_t bytes, int nranks) {
  REQUIRE(nranks >= 1, "ring_bytes: nranks must be >= 1, got " << nranks);
  const double b = double(bytes);
  const double n = double(nranks);
  switch (kind) {
    case CollectiveKind::all_reduce: return 2.0 * (n - 1.0) / n * b;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather: return (n - 1.0) / n * b;
    case CollectiveKind::broadcast: return nranks == 1 ? 0.0 : b;
    case CollectiveKind::barrier: return 0.0;
  }
  return 0.0;
}

double CommStats::total_bytes() const {
  double sum = 0;
  for (double b : bytes) sum += b;
  return sum;
}

std::string rank_names(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); i++) {
    if (i > 0) s += i + 1 == ranks.size() ? " and " : ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

std::string comm_timeout_message(int rank, const std::string& collective, uint64_t seq, int step,
                                 double timeout_s, const std::string& who) {
  std::ostringstream s;
  s << "[rank " << rank << "] " << collective << " (collective #" << seq << " on this communicator";
  if (step >= 0) s << ", step " << step;
  s << ") timed out after " << timeout_s << " s: " << who
    << ". A rank is stuck or much slower than the others (a deadlock, a hung device, a stopped "
       "process); if it is only slow, raise the timeout with --comm-timeout SECONDS or "
       "ZF_COMM_TIMEOUT_S (default "
    << kDefaultCommTimeoutS << " s)";
  return s.str();
}

std::unique_ptr<Communicator> Communicator::split(int /*color*/, int /*key*/) {
  throw Error(std::string("split is not supported by ") + backend());
}

namespace {

// Blocks until the collective is done; rethrows its error.
void block_until_done(CommHandle::State& s) {
  std::unique_lock<std::mutex> lock(s.mu);
  wait_for_peer(lock, s.cv, std::chrono::steady_clock::time_point::max(), [&] { return s.done; });
  if (s.error) std::rethrow_exception(s.error);
}

}  // namespace

void CommHandle::wait() {
  if (!state_) return;  // a default handle is already done
  if (state_->on_wait) state_->on_wait();
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->done) {
      if (state_->error) std::rethrow_exception(state_->error);
      return;
    }
  }
  // Pending: a GPU backend orders the caller's compute stream after the
  // collective on the device and the host goes on (comm_state.h).
  if (state_->device_wait && state_->device_wait()) return;
  block_until_done(*state_);
}

void CommHandle::wait_host() {
  if (!state_) return;
  if (state_->on_wait) state_->on_wait();
  block_until_done(*state_);
}

bool CommHandle::done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

}  // namespace zf
