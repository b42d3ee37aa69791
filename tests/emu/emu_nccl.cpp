// emu_nccl.cpp: NCCL (nccl.h) on the emulated GPUs, for ranks that are
// threads of one process (one id, or one split, makes a clique of ranks).
//
// What it keeps of NCCL:
//   - a collective is a task on the caller's stream: it starts once the
//     stream gets to it, waits there for every rank of the clique to reach
//     the same collective (the n-th call of each rank's communicator), and
//     only then reads every rank's input and writes every rank's output, so
//     a stream that does not wait for its input, or reads the output early,
//     sees the 2 ms late start of emu_runtime.cpp;
//   - sums in a ring's order, not in rank order (emu_nccl.h's compute());
//   - in place only as NCCL defines it (all_reduce, broadcast: send == recv;
//     reduce_scatter: recv == send + rank*count; all_gather: send == recv +
//     rank*count); any other overlap, a buffer that is not device memory of
//     the communicator's GPU, or a stream of another GPU is refused
//     (ncclInvalidArgument / ncclInvalidUsage), where NCCL may garble;
//   - two ranks of one clique on one GPU are refused (ncclInvalidUsage, as
//     NCCL's "Duplicate GPU detected");
//   - non-blocking communicators (ncclConfig_t.blocking = 0) answer
//     ncclInProgress to their creation, split, finalize and collectives (in
//     a group, its ncclGroupEnd for them), and refuse other calls (NCCL's
//     "not ready", ncclInvalidArgument) until ncclCommGetAsyncError says
//     that is over; blocking ones wait, except inside ncclGroupStart/End,
//     whose end waits; a split's child without a config takes its parent's;
//   - a call that fails inside a group fails its ncclGroupEnd too (NCCL
//     then also drops the group's other calls; here they still run);
//   - a rank that never reaches a collective, or aborts before its peers
//     reach it, leaves them waiting in it (a hang, as in NCCL) until they
//     abort too: an aborted communicator's collectives end at once, their
//     outputs unwritten;
//   - a collective on a GPU with a sticky error is refused, and one whose
//     GPU fails before it runs fails its communicator (NCCL's
//     ncclUnhandledCudaError).
// What it adds: ranks that disagree on a collective (kind, count, type,
// operation, root) fail the clique with ncclInvalidUsage naming both calls,
// where NCCL would hang or garble. Not emulated: ranks in other processes
// (scripts/gpu_check.sh runs those on a GPU), fp16/fp8 types, send/recv.
#include <nccl.h>

#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "emu_nccl.h"
#include "emu_runtime.h"

namespace {

using zf::emu::nccl::Call;
using zf::emu::nccl::Kind;
using zf::emu::nccl::kind_name;
using zf::emu::nccl::type_size;

struct Clique;
constexpr int kEnqueuePolls = 2;  // State::enqueuing's start

// A communicator: its handle (ncclComm) is freed by destroy or abort, this
// state lives on while a task of it is queued on a stream.
struct State {
  std::shared_ptr<Clique> clique;
  int rank = 0, n = 1, device = 0;
  bool blocking = true;
  ncclResult_t status = ncclInProgress;  // ncclSuccess once every rank joined; errors stick
  std::string error;                     // what failed, for ncclGetLastError
  bool aborted = false, finalizing = false, split_pending = false;
  // Non-blocking: a collective (or a group) is being enqueued, as by NCCL's
  // own thread: polls left until ncclCommGetAsyncError says ncclSuccess
  // (kEnqueuePolls: the first says ncclInProgress); until then it takes no call.
  int enqueuing = 0;
  uint64_t issued = 0, splits = 0;  // collectives and splits called so far
  int running = 0;                  // collectives enqueued and not yet over
};

// A collective n ranks take part in: the calls so far, then the outcome.
struct Collective {
  std::vector<Call> calls;
  std::vector<char> arrived;
  int n_arrived = 0, n_left = 0;
  bool done = false;
  // Why it failed, if it did (nothing was written): the ranks disagreed
  // (ncclInvalidUsage), or a rank's GPU failed before its part ran
  // (ncclUnhandledCudaError).
  ncclResult_t code = ncclSuccess;
  std::string failure;
};

struct Split {
  std::vector<int> color, key;
  std::vector<std::weak_ptr<State>> parent, child;
  int n_called = 0;
};

struct Clique {
  int n = 1;
  std::vector<std::weak_ptr<State>> members;  // by rank, until all joined
  int joined = 0;
  ncclResult_t failed = ncclSuccess;  // the creation failed (every later joiner is told)
  std::string why;
  std::map<uint64_t, Collective> collectives;  // by the ranks' call number
  std::map<uint64_t, Split> splits;
};

}  // namespace

struct ncclComm { std::shared_ptr<State> state; };

namespace {

// One lock for every clique: collectives are few and large, and a task's
// wait for its peers is one condition. Never destroyed: a stream's thread
// may still wait here when the process exits.
struct Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::weak_ptr<Clique>> forming;  // by id, until every rank joined
  std::string last_error;
};
Shared& shared = *new Shared;
std::mutex& mu = shared.mu;
std::condition_variable& cv = shared.cv;
auto& forming = shared.forming;
std::string& last_error = shared.last_error;  // guarded by mu
thread_local int group_depth = 0;
thread_local std::vector<std::shared_ptr<State>> group_pending;
thread_local ncclResult_t group_error = ncclSuccess;  // the group's first failed call, for its end

// A call fails (mu held); inside a group, the group's end fails too.
ncclResult_t fail_locked(ncclResult_t r, const std::string& what) {
  last_error = what;
  if (group_depth > 0 && group_error == ncclSuccess) group_error = r;
  return r;
}
ncclResult_t fail(ncclResult_t r, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu);
  return fail_locked(r, what);
}
// Whether a communicator takes a call (mu held): NCCL's ncclCommEnsureReady,
// whose refusal is ncclInvalidArgument.
bool ready_locked(const State& s) { return s.status != ncclInProgress && !s.split_pending && s.enqueuing == 0; }
// A communicator's error (mu held): it sticks; the first one says why.
void fail_state_locked(State& s, ncclResult_t r, const std::string& what) {
  if (s.status == ncclSuccess || s.status == ncclInProgress) {
    s.status = r;
    s.error = what;
  }
  last_error = what;
  cv.notify_all();
}

bool blocking_of(const ncclConfig_t* config) {
  if (const char* env = std::getenv("NCCL_COMM_BLOCKING"); env && *env) return std::atoi(env) != 0;
  return !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
}

// Waits (mu held) until the state's creation or split is over; returns its status.
ncclResult_t wait_ready_locked(std::unique_lock<std::mutex>& lock, State& s) {
  cv.wait(lock, [&] { return s.status != ncclInProgress && !s.split_pending; });
  return s.status;
}

// ------------------------------------------------------------ collectives

// The task on a rank's stream: wait for every rank, then the last to come
// computes everyone's outputs. An abort meanwhile takes the rank's call
// back: its buffers may be freed, and its peers wait on (as in NCCL).
Collective& collective_locked(State& s, uint64_t seq) {
  Collective& c = s.clique->collectives[seq];
  if (c.calls.empty()) {
    c.calls.resize(size_t(s.n));
    c.arrived.assign(size_t(s.n), 0);
  }
  return c;
}

void run(State& s, uint64_t seq, const Call& call) {
  std::unique_lock<std::mutex> lock(mu);
  if (s.aborted) return;
  Collective& c = collective_locked(s, seq);
  if (!c.done) {
    c.calls[size_t(s.rank)] = call;
    c.arrived[size_t(s.rank)] = 1;
    if (++c.n_arrived == s.n) {
      for (int r = 1; r < s.n && c.failure.empty(); r++)
        if (!c.calls[size_t(r)].same_as(c.calls[0])) {
          c.code = ncclInvalidUsage;
          c.failure = "collective #" + std::to_string(seq) + ": rank 0 called " +
                      c.calls[0].describe() + ", rank " + std::to_string(r) + " called " +
                      c.calls[size_t(r)].describe();
        }
      if (c.failure.empty()) zf::emu::nccl::compute(c.calls);
      c.done = true;
      cv.notify_all();
    }
  }
  cv.wait(lock, [&] { return c.done || s.aborted; });
  if (!c.done) {  // aborted first
    c.arrived[size_t(s.rank)] = 0;
    if (--c.n_arrived == 0) s.clique->collectives.erase(seq);
    return;
  }
  if (!c.failure.empty()) fail_state_locked(s, c.code, c.failure);
  if (++c.n_left == s.n) s.clique->collectives.erase(seq);
}

// What a queued collective holds: `running` goes down when it has run, or
// when its stream drops it unrun (its GPU failed first): then the
// collective fails for its peers too, who would otherwise wait for it.
struct Task {
  std::shared_ptr<State> s;
  uint64_t seq = 0;
  bool ran = false;
  ~Task() {
    std::lock_guard<std::mutex> lock(mu);
    if (!ran && !s->aborted) {
      const std::string why = "collective #" + std::to_string(seq) + ": rank " +
                              std::to_string(s->rank) + "'s GPU failed before its part ran";
      fail_state_locked(*s, ncclUnhandledCudaError, why);
      Collective& c = collective_locked(*s, seq);
      if (!c.done) {
        c.done = true;
        c.code = ncclUnhandledCudaError;
        c.failure = why;
      }
      if (++c.n_left == s->n) s->clique->collectives.erase(seq);
    }
    s->running--;
    cv.notify_all();
  }
};

bool on_device(const void* p, size_t bytes, int device) {
  int d = -1;
  return bytes == 0 || (zf::emu::device_range(p, bytes, &d) && d == device);
}
bool overlap(const void* a, size_t an, const void* b, size_t bn) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

ncclResult_t issue(Call call, ncclComm_t comm, cudaStream_t stream) {
  if (!comm) return fail(ncclInvalidArgument, std::string(kind_name(call.kind)) + ": comm is NULL");
  const std::shared_ptr<State> s = comm->state;
  int rank, n, device;
  {
    std::lock_guard<std::mutex> lock(mu);
    const std::string what = kind_name(call.kind);
    if (s->aborted) return fail_locked(ncclInvalidUsage, what + ": the communicator was aborted");
    if (s->finalizing) return fail_locked(ncclInvalidUsage, what + ": the communicator is finalized");
    if (!ready_locked(*s))
      return fail_locked(ncclInvalidArgument, what + ": the communicator is not ready "
                                                     "(ncclCommGetAsyncError says ncclInProgress)");
    if (s->status != ncclSuccess) return fail_locked(s->status, s->error);
    rank = s->rank;
    n = s->n;
    device = s->device;
  }
  const size_t es = type_size(call.type);
  const std::string where = std::string(kind_name(call.kind)) + " on rank " + std::to_string(rank);
  if (es == 0)
    return fail(ncclInvalidArgument, where + ": type " + std::to_string(int(call.type)) +
                                         " is not one the emulated NCCL has");
  if (call.op < ncclSum || call.op > ncclAvg)
    return fail(ncclInvalidArgument, where + ": op " + std::to_string(int(call.op)) + " unknown");
  if (call.kind == Kind::broadcast && (call.root < 0 || call.root >= n))
    return fail(ncclInvalidArgument, where + ": root " + std::to_string(call.root) +
                                         " is not a rank of " + std::to_string(n));
  const int sd = zf::emu::stream_device(stream);
  if (sd != device)
    return fail(ncclInvalidUsage, where + ": the stream is on device " + std::to_string(sd) +
                                      ", the communicator on device " + std::to_string(device));
  if (zf::emu::stream_error(stream) != cudaSuccess)
    return fail(ncclUnhandledCudaError, where + ": device " + std::to_string(device) + " has failed");
  const size_t unit = call.count * es, all = size_t(n) * unit;
  size_t send_bytes = unit, recv_bytes = unit;
  if (call.kind == Kind::reduce_scatter) send_bytes = all;
  if (call.kind == Kind::all_gather) recv_bytes = all;
  if (call.kind == Kind::broadcast && rank != call.root) send_bytes = 0;  // read on the root only
  if (!on_device(call.send, send_bytes, device) || !on_device(call.recv, recv_bytes, device))
    return fail(ncclInvalidArgument,
                where + ": a buffer (send " + std::to_string(send_bytes) + " B, recv " +
                    std::to_string(recv_bytes) + " B) is not memory of device " +
                    std::to_string(device));
  const char* send = static_cast<const char*>(call.send);
  char* recv = static_cast<char*>(call.recv);
  bool in_place = send == recv;
  if (call.kind == Kind::reduce_scatter) in_place = recv == send + size_t(rank) * unit;
  if (call.kind == Kind::all_gather) in_place = send == recv + size_t(rank) * unit;
  if (!in_place && overlap(send, send_bytes, recv, recv_bytes))
    return fail(ncclInvalidArgument,
                where + ": the send and receive buffers overlap, and not in NCCL's in-place form");
  if (call.count == 0) return ncclSuccess;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu);
    seq = s->issued++;
    s->running++;
    // Non-blocking: in progress until polled (a group's, from its end).
    if (group_depth > 0) group_pending.push_back(s);
    else if (!s->blocking) s->enqueuing = kEnqueuePolls;
  }
  auto task = std::make_shared<Task>();
  task->s = s;
  task->seq = seq;
  zf::emu::enqueue_on(stream, [task, seq, call] {
    run(*task->s, seq, call);
    task->ran = true;
  });
  return s->blocking || group_depth > 0 ? ncclSuccess : ncclInProgress;
}

}  // namespace

// ------------------------------------------------------------ the API

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: id is NULL");
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < sizeof(id->internal); i += 8) {
    const uint64_t x = rng();
    std::memcpy(id->internal + i, &x, 8);
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRankConfig: comm is NULL");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRankConfig: rank " + std::to_string(rank) +
                                         " of " + std::to_string(nranks) + " ranks");
  int devices = 0;
  const int device = zf::emu::current_device_id();
  if (cudaGetDeviceCount(&devices) != cudaSuccess || device < 0 || device >= devices)
    return fail(ncclUnhandledCudaError, "ncclCommInitRankConfig: no current device");
  auto s = std::make_shared<State>();
  s->rank = rank;
  s->n = nranks;
  s->device = device;
  s->blocking = blocking_of(config);
  std::unique_lock<std::mutex> lock(mu);
  const std::string key(id.internal, sizeof(id.internal));
  std::shared_ptr<Clique> cl = forming[key].lock();
  if (!cl) {
    cl = std::make_shared<Clique>();
    cl->n = nranks;
    cl->members.resize(size_t(nranks));
    forming[key] = cl;
  }
  const std::string me = "ncclCommInitRankConfig: rank " + std::to_string(rank);
  if (cl->n != nranks)
    return fail_locked(ncclInvalidArgument, me + " says " + std::to_string(nranks) +
                                                " ranks, an earlier rank of this id " +
                                                std::to_string(cl->n));
  if (!cl->members[size_t(rank)].expired())
    return fail_locked(ncclInvalidUsage, me + " joined this id twice");
  std::vector<std::shared_ptr<State>> joined;
  for (auto& w : cl->members)
    if (auto m = w.lock()) joined.push_back(m);
  s->clique = cl;
  cl->members[size_t(rank)] = s;
  cl->joined++;
  joined.push_back(s);
  *comm = new ncclComm{s};
  for (auto& m : joined)
    if (cl->failed == ncclSuccess && m != s && m->device == device) {
      cl->failed = ncclInvalidUsage;
      cl->why = "Duplicate GPU detected: rank " + std::to_string(rank) + " and rank " +
                std::to_string(m->rank) + " both on device " + std::to_string(device);
    }
  if (cl->failed != ncclSuccess) {  // every rank so far, and every later one, is told
    for (auto& m : joined) fail_state_locked(*m, cl->failed, cl->why);
    return cl->failed;
  }
  if (cl->joined == cl->n) {
    for (auto& m : joined)
      if (m->status == ncclInProgress) m->status = ncclSuccess;
    forming.erase(key);
    cv.notify_all();
  }
  if (group_depth > 0) {
    group_pending.push_back(s);
    return s->blocking ? ncclSuccess : ncclInProgress;
  }
  if (s->blocking) return wait_ready_locked(lock, *s);
  return s->status;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclGroupStart() {
  group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;
  std::vector<std::shared_ptr<State>> pending;
  pending.swap(group_pending);
  ncclResult_t result = std::exchange(group_error, ncclSuccess);
  std::unique_lock<std::mutex> lock(mu);
  for (auto& s : pending) {
    ncclResult_t r = s->blocking ? wait_ready_locked(lock, *s) : s->status;
    if (!s->blocking && (r == ncclSuccess || r == ncclInProgress)) {
      s->enqueuing = kEnqueuePolls;  // NCCL's thread launches the group: in progress until polled
      r = ncclInProgress;
    }
    if (result == ncclSuccess || result == ncclInProgress) result = r == ncclSuccess ? result : r;
  }
  return result;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  if (!comm || !newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: comm or newcomm is NULL");
  if (color < NCCL_SPLIT_NOCOLOR)
    return fail(ncclInvalidArgument, "ncclCommSplit: color " + std::to_string(color));
  *newcomm = nullptr;
  const std::shared_ptr<State> s = comm->state;
  std::unique_lock<std::mutex> lock(mu);
  if (s->aborted) return fail_locked(ncclInvalidUsage, "ncclCommSplit: the parent was aborted");
  if (!ready_locked(*s)) return fail_locked(ncclInvalidArgument, "ncclCommSplit: the parent is not ready");
  if (s->status != ncclSuccess) return fail_locked(s->status, "ncclCommSplit: the parent has failed: " + s->error);
  const uint64_t no = s->splits++;
  Split& sp = s->clique->splits[no];
  if (sp.parent.empty()) {
    sp.color.assign(size_t(s->n), 0);
    sp.key.assign(size_t(s->n), 0);
    sp.parent.resize(size_t(s->n));
    sp.child.resize(size_t(s->n));
  }
  sp.color[size_t(s->rank)] = color;
  sp.key[size_t(s->rank)] = key;
  sp.parent[size_t(s->rank)] = s;
  if (color != NCCL_SPLIT_NOCOLOR) {
    auto c = std::make_shared<State>();
    c->device = s->device;
    c->blocking = config ? blocking_of(config) : s->blocking;
    sp.child[size_t(s->rank)] = c;
    *newcomm = new ncclComm{c};
  }
  s->split_pending = true;
  if (++sp.n_called == s->n) {
    // The ranks of one color, ordered by key and then by parent rank.
    std::map<int, std::vector<int>> by_color;
    for (int r = 0; r < s->n; r++)
      if (sp.color[size_t(r)] != NCCL_SPLIT_NOCOLOR) by_color[sp.color[size_t(r)]].push_back(r);
    for (auto& [col, ranks] : by_color) {
      std::stable_sort(ranks.begin(), ranks.end(),
                       [&](int a, int b) { return sp.key[size_t(a)] < sp.key[size_t(b)]; });
      auto cl = std::make_shared<Clique>();
      cl->n = int(ranks.size());
      cl->joined = cl->n;
      for (int i = 0; i < cl->n; i++)
        if (auto c = sp.child[size_t(ranks[size_t(i)])].lock()) {
          c->clique = cl;
          c->rank = i;
          c->n = cl->n;
          c->status = ncclSuccess;
        }
    }
    for (auto& w : sp.parent)
      if (auto p = w.lock()) p->split_pending = false;
    s->clique->splits.erase(no);
    cv.notify_all();
  }
  if (group_depth > 0) {
    group_pending.push_back(s);
    return s->blocking || !s->split_pending ? ncclSuccess : ncclInProgress;
  }
  if (s->blocking) return wait_ready_locked(lock, *s);
  return s->split_pending ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (!comm || !state) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
  std::lock_guard<std::mutex> lock(mu);
  State& s = *comm->state;
  if (s.enqueuing > 0) s.enqueuing--;
  if (s.status != ncclSuccess) *state = s.status;
  else if (s.split_pending || s.enqueuing > 0 || (s.finalizing && s.running > 0)) *state = ncclInProgress;
  else *state = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  std::unique_lock<std::mutex> lock(mu);
  State& s = *comm->state;
  if (s.status == ncclSuccess && !ready_locked(s))
    return fail_locked(ncclInvalidArgument, "ncclCommFinalize: the communicator is not ready");
  s.finalizing = true;
  if (s.blocking) {
    cv.wait(lock, [&] { return s.running == 0; });
    return ncclSuccess;
  }
  return s.running > 0 ? ncclInProgress : ncclSuccess;
}

// Waits for the communicator's collectives (as NCCL's destroy does), then
// frees the handle.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  {
    std::unique_lock<std::mutex> lock(mu);
    State& s = *comm->state;
    cv.wait(lock, [&] { return s.running == 0; });
  }
  delete comm;
  return ncclSuccess;
}

// Its collectives end at once, queued or waiting for peers; the peers still
// wait for it (they abort too, or hang).
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  {
    std::lock_guard<std::mutex> lock(mu);
    comm->state->aborted = true;
    cv.notify_all();
  }
  delete comm;
  return ncclSuccess;
}

// A communicator's size, rank and GPU: known once it is ready.
static ncclResult_t when_ready(const ncclComm_t comm, int* out, int State::*field, const char* call) {
  if (!comm || !out) return ncclInvalidArgument;
  std::lock_guard<std::mutex> lock(mu);
  if (!ready_locked(*comm->state)) return fail_locked(ncclInvalidArgument, std::string(call) + ": not ready");
  *out = (*comm->state).*field;
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return when_ready(comm, count, &State::n, "ncclCommCount");
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return when_ready(comm, rank, &State::rank, "ncclCommUserRank");
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return when_ready(comm, device, &State::device, "ncclCommCuDevice");
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  thread_local std::string copy;
  std::lock_guard<std::mutex> lock(mu);
  copy = comm && !comm->state->error.empty() ? comm->state->error : last_error;
  if (!copy.empty()) copy = "emulated NCCL: " + copy;
  return copy.c_str();
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return issue(Call{Kind::all_reduce, send, recv, count, type, op, 0}, comm, stream);
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount,
                               ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return issue(Call{Kind::reduce_scatter, send, recv, recvcount, type, op, 0}, comm, stream);
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  return issue(Call{Kind::all_gather, send, recv, sendcount, type, ncclSum, 0}, comm, stream);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  return issue(Call{Kind::broadcast, send, recv, count, type, ncclSum, root}, comm, stream);
}
