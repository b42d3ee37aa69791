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
//   - sums in a ring's order: chunk c of the buffer is summed starting from
//     rank c mod n, rounded to the element type at each step (bf16 as NCCL
//     adds it, in float32 then rounded), so results are not those of a sum
//     in rank order; avg of floats multiplies each input by 1/n (rounded to
//     the type) before the sum, as ncclAvg does; every rank gets the same bits;
//   - in place only as NCCL defines it (all_reduce, broadcast: send == recv;
//     reduce_scatter: recv == send + rank*count; all_gather: send == recv +
//     rank*count); any other overlap, a buffer that is not device memory of
//     the communicator's GPU, or a stream of another GPU is refused
//     (ncclInvalidArgument / ncclInvalidUsage), where NCCL may garble;
//   - two ranks of one clique on one GPU are refused (ncclInvalidUsage, as
//     NCCL's "Duplicate GPU detected");
//   - non-blocking communicators (ncclConfig_t.blocking = 0) answer
//     ncclInProgress to their creation, split, finalize and collectives, and
//     ncclCommGetAsyncError says when that is over; blocking ones wait, except
//     inside ncclGroupStart/End, whose end waits;
//   - a rank that never reaches a collective leaves its peers waiting in it
//     (a hang, as in NCCL) until ncclCommAbort: an aborted communicator's
//     collectives return at once, their outputs unwritten.
// What it adds: ranks that disagree on a collective (kind, count, type,
// operation, root) fail the clique with ncclInvalidUsage naming both calls,
// where NCCL would hang or garble. Not emulated: ranks in other processes
// (scripts/gpu_check.sh runs those on a GPU), fp16/fp8 types, send/recv.
#include <nccl.h>

#include <cuda_bf16.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "emu_runtime.h"

namespace {

enum class Kind { all_reduce, reduce_scatter, all_gather, broadcast };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::all_reduce: return "ncclAllReduce";
    case Kind::reduce_scatter: return "ncclReduceScatter";
    case Kind::all_gather: return "ncclAllGather";
    case Kind::broadcast: return "ncclBroadcast";
  }
  return "?";
}

// One rank's call of one collective.
struct Call {
  Kind kind;
  const void* send;
  void* recv;
  size_t count;  // NCCL's count: per rank for reduce_scatter (recv) and all_gather (send)
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
  std::string describe() const {
    return std::string(kind_name(kind)) + "(count " + std::to_string(count) + ", type " +
           std::to_string(int(type)) + ", op " + std::to_string(int(op)) + ", root " +
           std::to_string(root) + ")";
  }
  bool same_as(const Call& o) const {
    return kind == o.kind && count == o.count && type == o.type && op == o.op && root == o.root;
  }
};

struct Clique;

// A communicator: its handle (ncclComm) is freed by destroy or abort, this
// state lives on while a task of it is queued on a stream.
struct State {
  std::shared_ptr<Clique> clique;
  int rank = 0, n = 1, device = 0;
  bool blocking = true;
  ncclResult_t status = ncclInProgress;  // ncclSuccess once every rank joined; errors stick
  std::string error;                     // what failed, for ncclGetLastError
  bool aborted = false, finalizing = false, split_pending = false;
  uint64_t issued = 0, splits = 0;  // collectives and splits called so far
  int running = 0;                  // collectives enqueued and not yet over
};

// A collective n ranks take part in: the calls so far, then the outcome.
struct Collective {
  std::vector<Call> calls;
  std::vector<char> arrived;
  int n_arrived = 0, n_left = 0;
  bool done = false;
  std::string mismatch;  // the ranks disagreed: what each called
};

struct Split {
  std::vector<int> color, key;
  std::vector<std::shared_ptr<State>> parent, child;
  int n_called = 0;
};

struct Clique {
  int n = 1;
  std::vector<std::weak_ptr<State>> members;  // by rank, until all joined
  int joined = 0;
  std::map<uint64_t, Collective> collectives;  // by the ranks' call number
  std::map<uint64_t, Split> splits;
};

}  // namespace

struct ncclComm {
  std::shared_ptr<State> state;
};

namespace {

// One lock for every clique: collectives are few and large, and a task's
// wait for its peers is one condition.
std::mutex mu;
std::condition_variable cv;
std::map<std::string, std::weak_ptr<Clique>> forming;  // by id, until every rank joined
std::string last_error;                                // guarded by mu
thread_local int group_depth = 0;
thread_local std::vector<std::shared_ptr<State>> group_pending;

ncclResult_t fail_locked(ncclResult_t r, const std::string& what) {
  last_error = what;
  return r;
}
ncclResult_t fail(ncclResult_t r, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu);
  return fail_locked(r, what);
}

// Fails every rank of a clique (its ranks' pending calls then end when aborted).
void fail_clique_locked(const std::vector<std::shared_ptr<State>>& states, ncclResult_t r,
                        const std::string& what) {
  for (auto& s : states)
    if (s && s->status != r) {
      s->status = r;
      s->error = what;
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

// ------------------------------------------------------------ element types

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;  // fp16, fp8: not emulated
  }
}
bool is_float(ncclDataType_t t) { return t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16; }

double load(ncclDataType_t t, const void* p, size_t i) {
  switch (t) {
    case ncclInt8: return double(static_cast<const int8_t*>(p)[i]);
    case ncclUint8: return double(static_cast<const uint8_t*>(p)[i]);
    case ncclInt32: return double(static_cast<const int32_t*>(p)[i]);
    case ncclUint32: return double(static_cast<const uint32_t*>(p)[i]);
    case ncclInt64: return double(static_cast<const int64_t*>(p)[i]);
    case ncclUint64: return double(static_cast<const uint64_t*>(p)[i]);
    case ncclFloat32: return double(static_cast<const float*>(p)[i]);
    case ncclFloat64: return static_cast<const double*>(p)[i];
    case ncclBfloat16: return double(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
    default: return 0;
  }
}
void store(ncclDataType_t t, void* p, size_t i, double v) {
  switch (t) {
    case ncclInt8: static_cast<int8_t*>(p)[i] = int8_t(v); break;
    case ncclUint8: static_cast<uint8_t*>(p)[i] = uint8_t(v); break;
    case ncclInt32: static_cast<int32_t*>(p)[i] = int32_t(v); break;
    case ncclUint32: static_cast<uint32_t*>(p)[i] = uint32_t(v); break;
    case ncclInt64: static_cast<int64_t*>(p)[i] = int64_t(v); break;
    case ncclUint64: static_cast<uint64_t*>(p)[i] = uint64_t(v); break;
    case ncclFloat32: static_cast<float*>(p)[i] = float(v); break;
    case ncclFloat64: static_cast<double*>(p)[i] = v; break;
    case ncclBfloat16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(float(v)); break;
    default: break;
  }
}
// v as the type holds it (the rounding of one step of the ring).
double round_to(ncclDataType_t t, double v) {
  if (t == ncclFloat32) return double(float(v));
  if (t == ncclBfloat16) return double(__bfloat162float(__float2bfloat16_rn(float(v))));
  return v;
}

constexpr size_t kChunk = 1024;  // elements summed from one starting rank

// out[i] = the reduction over ranks q of in[q][i], in ring order.
void reduce(ncclDataType_t t, ncclRedOp_t op, const std::vector<const void*>& in, size_t offset,
            size_t count, void* out) {
  const int n = int(in.size());
  const double scale = round_to(t, 1.0 / n);
  for (size_t i = 0; i < count; i++) {
    const int first = int(((offset + i) / kChunk) % size_t(n));
    double acc = 0;
    for (int k = 0; k < n; k++) {
      double x = load(t, in[size_t((first + k) % n)], offset + i);
      if (op == ncclAvg && is_float(t)) x = round_to(t, x * scale);
      if (k == 0) {
        acc = x;
        continue;
      }
      switch (op) {
        case ncclProd: acc *= x; break;
        case ncclMax: acc = std::max(acc, x); break;
        case ncclMin: acc = std::min(acc, x); break;
        default: acc += x; break;
      }
      acc = round_to(t, acc);
    }
    if (op == ncclAvg && !is_float(t)) acc = std::trunc(acc / n);
    store(t, out, i, acc);
  }
}

// Every rank's output from every rank's input (mu held; the calls agree).
void compute(const std::vector<Call>& calls) {
  const Call& c0 = calls[0];
  const int n = int(calls.size());
  const size_t es = type_size(c0.type), bytes = c0.count * es;
  std::vector<const void*> in;
  for (const Call& c : calls) in.push_back(c.send);
  std::vector<std::vector<char>> out(calls.size());  // all outputs first: inputs may be outputs
  switch (c0.kind) {
    case Kind::all_reduce:
      out[0].resize(bytes);
      reduce(c0.type, c0.op, in, 0, c0.count, out[0].data());
      for (int r = 1; r < n; r++) out[size_t(r)] = out[0];
      break;
    case Kind::reduce_scatter:
      for (int r = 0; r < n; r++) {
        out[size_t(r)].resize(bytes);
        reduce(c0.type, c0.op, in, size_t(r) * c0.count, c0.count, out[size_t(r)].data());
      }
      break;
    case Kind::all_gather:
      for (int r = 0; r < n; r++) {
        out[size_t(r)].resize(size_t(n) * bytes);
        for (int q = 0; q < n; q++)
          std::memcpy(out[size_t(r)].data() + size_t(q) * bytes, calls[size_t(q)].send, bytes);
      }
      break;
    case Kind::broadcast:
      for (int r = 0; r < n; r++)
        out[size_t(r)].assign(static_cast<const char*>(calls[size_t(c0.root)].send),
                              static_cast<const char*>(calls[size_t(c0.root)].send) + bytes);
      break;
  }
  for (int r = 0; r < n; r++)
    std::memcpy(calls[size_t(r)].recv, out[size_t(r)].data(), out[size_t(r)].size());
}

// The task on a rank's stream: wait for every rank, then the last to come
// computes everyone's outputs.
void run(const std::shared_ptr<State>& s, uint64_t seq, const Call& call) {
  std::unique_lock<std::mutex> lock(mu);
  Clique& cl = *s->clique;
  if (!s->aborted) {
    Collective& c = cl.collectives[seq];
    if (c.calls.empty()) {
      c.calls.resize(size_t(s->n));
      c.arrived.assign(size_t(s->n), 0);
    }
    c.calls[size_t(s->rank)] = call;
    c.arrived[size_t(s->rank)] = 1;
    if (++c.n_arrived == s->n) {
      for (int r = 1; r < s->n && c.mismatch.empty(); r++)
        if (!c.calls[size_t(r)].same_as(c.calls[0]))
          c.mismatch = "collective #" + std::to_string(seq) + ": rank 0 called " +
                       c.calls[0].describe() + ", rank " + std::to_string(r) + " called " +
                       c.calls[size_t(r)].describe();
      if (c.mismatch.empty()) compute(c.calls);
      c.done = true;
      cv.notify_all();
    }
    cv.wait(lock, [&] { return c.done || s->aborted; });
    if (c.done && !c.mismatch.empty() && s->status == ncclSuccess) {  // nothing was written
      s->status = ncclInvalidUsage;
      s->error = last_error = c.mismatch;
    }
    if (c.done && ++c.n_left == s->n) cl.collectives.erase(seq);
  }
  s->running--;
  cv.notify_all();
}

// Where [p, p + bytes) lies, for the checks of a collective's buffers.
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
  const size_t es = type_size(call.type);
  const std::string where = std::string(kind_name(call.kind)) + " on rank " + std::to_string(s->rank);
  if (es == 0)
    return fail(ncclInvalidArgument, where + ": type " + std::to_string(int(call.type)) +
                                         " is not one the emulated NCCL has");
  if (call.op < ncclSum || call.op > ncclAvg)
    return fail(ncclInvalidArgument, where + ": op " + std::to_string(int(call.op)) + " unknown");
  if (call.kind == Kind::broadcast && (call.root < 0 || call.root >= s->n))
    return fail(ncclInvalidArgument, where + ": root " + std::to_string(call.root) +
                                         " is not a rank of " + std::to_string(s->n));
  const int sd = zf::emu::stream_device(stream);
  if (sd != s->device)
    return fail(ncclInvalidUsage, where + ": the stream is on device " + std::to_string(sd) +
                                      ", the communicator on device " + std::to_string(s->device));
  const size_t unit = call.count * es, all = size_t(s->n) * unit;
  size_t send_bytes = unit, recv_bytes = unit;
  if (call.kind == Kind::reduce_scatter) send_bytes = all;
  if (call.kind == Kind::all_gather) recv_bytes = all;
  if (call.kind == Kind::broadcast && s->rank != call.root) send_bytes = 0;  // read on the root only
  if (!on_device(call.send, send_bytes, s->device) || !on_device(call.recv, recv_bytes, s->device))
    return fail(ncclInvalidArgument,
                where + ": a buffer (send " + std::to_string(send_bytes) + " B, recv " +
                    std::to_string(recv_bytes) + " B) is not memory of device " +
                    std::to_string(s->device));
  const char* send = static_cast<const char*>(call.send);
  char* recv = static_cast<char*>(call.recv);
  bool in_place = send == recv;
  if (call.kind == Kind::reduce_scatter) in_place = recv == send + size_t(s->rank) * unit;
  if (call.kind == Kind::all_gather) in_place = send == recv + size_t(s->rank) * unit;
  if (!in_place && overlap(send, send_bytes, recv, recv_bytes))
    return fail(ncclInvalidArgument,
                where + ": the send and receive buffers overlap, and not in NCCL's in-place form");
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (s->aborted) return fail_locked(ncclInvalidUsage, where + ": the communicator was aborted");
    if (s->status == ncclInProgress || s->split_pending)
      return fail_locked(ncclInvalidUsage, where + ": the communicator is not ready "
                                                   "(ncclCommGetAsyncError says ncclInProgress)");
    if (s->status != ncclSuccess) return fail_locked(s->status, s->error);
    if (call.count == 0) return ncclSuccess;
    seq = s->issued++;
    s->running++;
  }
  zf::emu::enqueue_on(stream, [s, seq, call] { run(s, seq, call); });
  return s->blocking ? ncclSuccess : ncclInProgress;
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
  if (cudaGetDeviceCount(&devices) != cudaSuccess || device >= devices)
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
  if (cl->n != nranks)
    return fail_locked(ncclInvalidArgument, "ncclCommInitRankConfig: rank " + std::to_string(rank) +
                                                " says " + std::to_string(nranks) +
                                                " ranks, an earlier rank of this id " +
                                                std::to_string(cl->n));
  if (!cl->members[size_t(rank)].expired())
    return fail_locked(ncclInvalidUsage, "ncclCommInitRankConfig: rank " + std::to_string(rank) +
                                             " joined this id twice");
  std::vector<std::shared_ptr<State>> joined;
  for (auto& w : cl->members)
    if (auto m = w.lock()) joined.push_back(m);
  s->clique = cl;
  cl->members[size_t(rank)] = s;
  cl->joined++;
  joined.push_back(s);
  *comm = new ncclComm{s};
  for (auto& m : joined)
    if (m != s && m->device == device) {
      fail_clique_locked(joined, ncclInvalidUsage,
                         "Duplicate GPU detected: rank " + std::to_string(rank) + " and rank " +
                             std::to_string(m->rank) + " both on device " + std::to_string(device));
      return ncclInvalidUsage;
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
  return s->status == ncclInProgress ? ncclInProgress : s->status;
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
  std::unique_lock<std::mutex> lock(mu);
  ncclResult_t result = ncclSuccess;
  for (auto& s : pending) {
    const ncclResult_t r = s->blocking ? wait_ready_locked(lock, *s) : s->status;
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
  if (s->status != ncclSuccess || s->split_pending || s->aborted)
    return fail_locked(ncclInvalidUsage, "ncclCommSplit: the parent is not ready");
  Split& sp = s->clique->splits[s->splits];
  const uint64_t no = s->splits++;
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
    c->blocking = blocking_of(config);
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
      for (int i = 0; i < cl->n; i++) {
        State& c = *sp.child[size_t(ranks[size_t(i)])];
        c.clique = cl;
        c.rank = i;
        c.n = cl->n;
        c.status = ncclSuccess;
      }
    }
    for (auto& p : sp.parent) p->split_pending = false;
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
  const State& s = *comm->state;
  if (s.status != ncclSuccess) *state = s.status;
  else if (s.split_pending || (s.finalizing && s.running > 0)) *state = ncclInProgress;
  else *state = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  std::unique_lock<std::mutex> lock(mu);
  State& s = *comm->state;
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

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->state->n;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (!comm || !device) return ncclInvalidArgument;
  *device = comm->state->device;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->state->rank;
  return ncclSuccess;
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
