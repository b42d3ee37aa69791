// comm_threads_cuda_harness.h: what the tests of the threads backend on CUDA
// device buffers share (test_comm_threads_cuda.cpp, test_comm_threads_cuda_streams.cpp):
// the inputs, the cases and their expected outputs, where a rank's buffers
// live (host or GPU), and running N ranks. How the tests use them is said at
// the top of test_comm_threads_cuda.cpp.
#pragma once

#include <gtest/gtest.h>
#include "cuda/gpu_test_util.h"
#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include "comm.h"
#include "comm_reduce.h"
#include "comm_threads.h"
#include "comm_threads_cuda.h"
#include "comm/comm_checks.h"
#include "dtype.h"
#include "kernels_cuda.h"

namespace threads_cuda_test {


using zf::CollectiveKind;
using zf::Communicator;
using zf::DType;
using zf::ReduceOp;
using Bytes = std::vector<uint8_t>;
using Comms = std::vector<std::unique_ptr<Communicator>>;

using zf::test::gpu_count;
using zf::test::no_device_reason;

// ------------------------------------------------------------------ inputs

// Element i of rank r's input in test `tag`, as bytes of dt: comm_checks.h's
// full-mantissa values, with special values mixed in for f32 and bf16:
//   i % 101 == 0           3e38 on every rank: sums of 2 or more overflow to +inf
//   i % 103 == 0           a subnormal, different on each rank
//   i % 107 == 0, rank 0   -inf (the others finite: the sum is -inf)
inline float input_value(uint64_t tag, int r, size_t i) {
  if (i % 101 == 0) return 3e38f;
  if (i % 103 == 0) return float(r + 1) * ((i / 103) % 2 ? -1e-39f : 7e-40f);
  if (i % 107 == 0 && r == 0) return -std::numeric_limits<float>::infinity();
  return zf::test::input_f32(tag, r, i);
}

inline Bytes input_bytes(DType dt, uint64_t tag, int r, size_t n) {
  Bytes b(n * zf::dtype_size(dt));
  for (size_t i = 0; i < n; i++) {
    if (dt == DType::f32) {
      const float v = input_value(tag, r, i);
      std::memcpy(&b[4 * i], &v, 4);
    } else if (dt == DType::bf16) {
      const zf::bf16 v = zf::float_to_bf16(input_value(tag, r, i));
      std::memcpy(&b[2 * i], &v, 2);
    } else {
      const int64_t v = zf::test::input_i64(tag, r, i);
      std::memcpy(&b[8 * i], &v, 8);
    }
  }
  return b;
}

// Element i of the reduction of ins (one input per rank), elements from
// `offset`: rank order, float32 for f32 and bf16 (bf16 rounded once), exact
// for i64; avg a division of the sum by N. Written out here, apart from
// comm_reduce.cpp, as the reference.
inline Bytes reduce_direct(const std::vector<Bytes>& ins, size_t offset, size_t n, DType dt,
                    ReduceOp op) {
  const int N = int(ins.size());
  const size_t esz = zf::dtype_size(dt);
  Bytes out(n * esz);
  for (size_t i = 0; i < n; i++) {
    const size_t at = (offset + i) * esz;
    if (dt == DType::i64) {
      int64_t acc = 0;
      for (int q = 0; q < N; q++) {
        int64_t x;
        std::memcpy(&x, &ins[q][at], 8);
        acc += x;
      }
      if (op == ReduceOp::avg) acc /= N;
      std::memcpy(&out[i * 8], &acc, 8);
      continue;
    }
    float acc = 0;
    for (int q = 0; q < N; q++) {
      float x;
      if (dt == DType::f32) {
        std::memcpy(&x, &ins[q][at], 4);
      } else {
        zf::bf16 h;
        std::memcpy(&h, &ins[q][at], 2);
        x = zf::bf16_to_float(h);
      }
      acc = q == 0 ? x : acc + x;
    }
    if (op == ReduceOp::avg) acc /= float(N);
    if (dt == DType::f32) {
      std::memcpy(&out[i * 4], &acc, 4);
    } else {
      const zf::bf16 h = zf::float_to_bf16(acc);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

// ------------------------------------------------------------------ cases

struct Case {
  CollectiveKind kind;
  DType dt;
  ReduceOp op = ReduceOp::sum;
  size_t n = 0;  // the API's count: all_reduce/broadcast buffer, reduce_scatter recv, all_gather send
  int root = 0;
  bool in_place = false;  // reduce_scatter into its own slot, all_gather from its own slot
  bool async = false;
  uint64_t tag = 0;
};

inline std::string describe(const Case& c) {
  std::ostringstream s;
  s << zf::collective_name(c.kind) << "(n " << c.n << ", " << zf::dtype_name(c.dt);
  if (c.kind == CollectiveKind::all_reduce || c.kind == CollectiveKind::reduce_scatter)
    s << ", " << (c.op == ReduceOp::sum ? "sum" : "avg");
  if (c.kind == CollectiveKind::broadcast) s << ", root " << c.root;
  if (c.in_place) s << ", in place";
  if (c.async) s << ", async";
  s << ", tag " << c.tag << ")";
  return s.str();
}

// Elements of rank r's input for a case on N ranks.
inline size_t input_elems(const Case& c, int N) {
  return c.kind == CollectiveKind::reduce_scatter ? size_t(N) * c.n : c.n;
}

// Every collective, dtype and op, with counts 0, 1, below N, not divisible
// by N, and crossing several 2048-element blocks of the host loop.
inline std::vector<Case> all_cases(int N) {
  std::vector<Case> cases;
  uint64_t tag = 1;
  const DType dts[] = {DType::f32, DType::bf16, DType::i64};
  std::vector<size_t> counts = {0, 1, size_t(N) + 1, 1000, size_t(N) * 2048 * 3 + 7};
  if (N > 2) counts.push_back(size_t(N) - 1);
  for (size_t n : counts)
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
      for (DType dt : dts) {
        Case c{CollectiveKind::all_reduce, dt, op, n};
        c.async = tag % 2;
        c.tag = tag++;
        cases.push_back(c);
      }
  for (size_t n : {size_t(0), size_t(1), size_t(3), size_t(1001), size_t(5000)})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
      for (DType dt : dts) {
        Case c{CollectiveKind::reduce_scatter, dt, op, n};
        c.in_place = tag % 3 == 0;
        c.async = tag % 2;
        c.tag = tag++;
        cases.push_back(c);
      }
  for (size_t n : {size_t(0), size_t(1), size_t(3), size_t(1001), size_t(5000)})
    for (DType dt : dts) {
      Case c{CollectiveKind::all_gather, dt, ReduceOp::sum, n};
      c.in_place = tag % 3 == 0;
      c.async = tag % 2;
      c.tag = tag++;
      cases.push_back(c);
    }
  for (int root = 0; root < N; root++)
    for (size_t n : {size_t(0), size_t(1), size_t(N) + 1, size_t(1000)})
      for (DType dt : dts) {
        Case c{CollectiveKind::broadcast, dt, ReduceOp::sum, n, root};
        c.async = tag % 2;
        c.tag = tag++;
        cases.push_back(c);
      }
  return cases;
}

// Bytes of each of the two buffers a rank needs for these cases.
inline size_t arena_bytes(const std::vector<Case>& cases, int N) {
  size_t m = 1;
  for (const Case& c : cases) m = std::max(m, size_t(N) * std::max<size_t>(c.n, 1) * 8);
  return m;
}

// What rank r must hold after case c: the output buffer's bytes, then for a
// reduce_scatter that is not in place its send buffer (left as it was).
inline Bytes expected_output(const Case& c, int N, int r) {
  std::vector<Bytes> ins;
  for (int q = 0; q < N; q++) ins.push_back(input_bytes(c.dt, c.tag, q, input_elems(c, N)));
  const size_t esz = zf::dtype_size(c.dt);
  switch (c.kind) {
    case CollectiveKind::all_reduce: return reduce_direct(ins, 0, c.n, c.dt, c.op);
    case CollectiveKind::reduce_scatter: {
      Bytes out = reduce_direct(ins, size_t(r) * c.n, c.n, c.dt, c.op);
      if (!c.in_place) out.insert(out.end(), ins[r].begin(), ins[r].end());
      return out;
    }
    case CollectiveKind::all_gather: {
      Bytes out;
      for (int q = 0; q < N; q++) out.insert(out.end(), ins[q].begin(), ins[q].end());
      (void)esz;
      return out;
    }
    case CollectiveKind::broadcast: return ins[c.root];
    case CollectiveKind::barrier: break;
  }
  return {};
}

// ------------------------------------------------------------------ where a rank's buffers live

class RankMem {
 public:
  virtual ~RankMem() = default;
  virtual char* buf(int which) = 0;  // two buffers of arena_bytes each
  virtual void put(void* dst, const Bytes& host) = 0;  // the rank's inputs, on its stream
  virtual Bytes get(const void* src, size_t bytes) = 0;  // after the collective's wait()
  virtual void poison(void* p, size_t bytes) = 0;
};

class HostMem final : public RankMem {
 public:
  explicit HostMem(size_t bytes) : a_(bytes), b_(bytes) {}
  char* buf(int which) override { return reinterpret_cast<char*>(which ? b_.data() : a_.data()); }
  void put(void* dst, const Bytes& host) override {
    if (!host.empty()) std::memcpy(dst, host.data(), host.size());
  }
  Bytes get(const void* src, size_t bytes) override {
    Bytes b(bytes);
    if (bytes) std::memcpy(b.data(), src, bytes);
    return b;
  }
  void poison(void* p, size_t bytes) override { std::memset(p, 0xFF, bytes); }

 private:
  Bytes a_, b_;
};

// Device buffers on `device`, A and B: one from the device's memory pool,
// as the GPU Device allocates, the other from cudaMalloc; A from the pool
// on even GPUs, from cudaMalloc on odd ones. Ranks on several GPUs read
// each other's A (the inputs), so both ways of opening memory to another
// GPU are needed: cudaMemPoolSetAccess for a pool, cudaDeviceEnablePeerAccess
// for cudaMalloc. Inputs are written on the rank's compute stream, truly
// asynchronously (from pinned staging memory, so the copy is still queued
// when the collective is issued: the collective must wait for it), after a
// host callback sleeping delay_ms on that stream when delay_ms > 0.
class CudaMem final : public RankMem {
 public:
  CudaMem(int device, cudaStream_t stream, size_t bytes, int delay_ms = 0)
      : device_(device), stream_(stream), delay_{delay_ms}, bytes_(bytes) {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaMallocAsync(from_pool(), bytes, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // usable on every stream from here
    CUDA_CHECK(cudaMalloc(from_malloc(), bytes));
    for (auto& s : staging_) CUDA_CHECK(cudaMallocHost(&s, bytes));
  }
  ~CudaMem() override {
    cudaSetDevice(device_);
    cudaDeviceSynchronize();  // every stream's use of them, as cudaFree waits
    cudaFreeAsync(*from_pool(), stream_);
    cudaStreamSynchronize(stream_);
    cudaFree(*from_malloc());
    for (void* s : staging_) cudaFreeHost(s);
  }
  char* buf(int which) override { return static_cast<char*>(which ? b_ : a_); }
  // A staging slot is reused kSlots puts later: by then the collective that
  // came after its copy has been waited for (the tests issue at most kSlots
  // collectives before waiting).
  void put(void* dst, const Bytes& host) override {
    if (host.empty()) return;
    if (host.size() > bytes_) throw std::runtime_error("CudaMem::put: input larger than the arena");
    void* stage = staging_[next_++ % kSlots];
    std::memcpy(stage, host.data(), host.size());
    if (delay_.ms) CUDA_CHECK(cudaLaunchHostFunc(stream_, zf::test::sleep_on_stream, &delay_));
    CUDA_CHECK(cudaMemcpyAsync(dst, stage, host.size(), cudaMemcpyHostToDevice, stream_));
  }
  Bytes get(const void* src, size_t bytes) override {
    Bytes b(bytes);
    if (bytes) CUDA_CHECK(cudaMemcpy(b.data(), src, bytes, cudaMemcpyDeviceToHost));
    return b;
  }
  void poison(void* p, size_t bytes) override {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0xFF, bytes, stream_));
  }

 private:
  static constexpr int kSlots = 4;
  void** from_pool() { return device_ % 2 ? &b_ : &a_; }
  void** from_malloc() { return device_ % 2 ? &a_ : &b_; }
  int device_;
  cudaStream_t stream_;
  zf::test::Stall delay_;  // the host callback reads it while the stream runs
  size_t bytes_;
  void* a_ = nullptr;
  void* b_ = nullptr;
  void* staging_[kSlots] = {};
  size_t next_ = 0;
};

// Rank r runs case c (every rank of the group runs the same case) and
// returns what expected_output describes.
inline Bytes run_case(Communicator& comm, RankMem& mem, const Case& c) {
  const int N = comm.size(), r = comm.rank();
  const size_t esz = zf::dtype_size(c.dt);
  char* A = mem.buf(0);
  char* B = mem.buf(1);
  const Bytes in = input_bytes(c.dt, c.tag, r, input_elems(c, N));
  auto done = [&](zf::CommHandle h) { h.wait(); };
  switch (c.kind) {
    case CollectiveKind::all_reduce: {
      mem.put(A, in);
      if (c.async) done(comm.all_reduce_async(A, c.n, c.dt, c.op));
      else comm.all_reduce(A, c.n, c.dt, c.op);
      return mem.get(A, c.n * esz);
    }
    case CollectiveKind::reduce_scatter: {
      mem.put(A, in);
      char* recv = c.in_place ? A + size_t(r) * c.n * esz : B;
      if (!c.in_place) mem.poison(B, c.n * esz);
      if (c.async) done(comm.reduce_scatter_async(A, recv, c.n, c.dt, c.op));
      else comm.reduce_scatter(A, recv, c.n, c.dt, c.op);
      Bytes out = mem.get(recv, c.n * esz);
      if (!c.in_place) {
        const Bytes send = mem.get(A, in.size());
        out.insert(out.end(), send.begin(), send.end());
      }
      return out;
    }
    case CollectiveKind::all_gather: {
      const size_t full = size_t(N) * c.n * esz;
      char* recv = c.in_place ? A : B;
      char* send = c.in_place ? A + size_t(r) * c.n * esz : A;
      mem.poison(recv, full);
      mem.put(send, in);
      if (c.async) done(comm.all_gather_async(send, recv, c.n, c.dt));
      else comm.all_gather(send, recv, c.n, c.dt);
      return mem.get(recv, full);
    }
    case CollectiveKind::broadcast: {
      mem.put(A, in);
      if (c.async) done(comm.broadcast_async(A, c.n, c.dt, c.root));
      else comm.broadcast(A, c.n, c.dt, c.root);
      return mem.get(A, c.n * esz);
    }
    case CollectiveKind::barrier: comm.barrier(); return {};
  }
  return {};
}

// ------------------------------------------------------------------ running ranks

// Runs body(r) on one thread per rank. A rank that throws aborts the group
// (so the others do not wait for it); its message is returned ("" if none).
inline std::vector<std::string> on_ranks(Comms& comms, const std::function<void(int)>& body) {
  const int N = int(comms.size());
  std::vector<std::string> errors(N);
  std::vector<std::thread> threads;
  for (int r = 0; r < N; r++)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        comms[r]->abort(std::string("rank ") + std::to_string(r) + " failed: " + e.what());
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

inline void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); r++)
    EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Every rank runs every case; out[r][k] is rank r's output of case k.
using Outputs = std::vector<std::vector<Bytes>>;
inline Outputs run_cases(Comms& comms, std::vector<std::unique_ptr<RankMem>>& mems,
                  const std::vector<Case>& cases, const std::vector<int>& devices = {}) {
  Outputs out(comms.size());
  expect_no_errors(on_ranks(comms, [&](int r) {
    if (!devices.empty()) CUDA_CHECK(cudaSetDevice(devices[r]));
    for (const Case& c : cases) out[r].push_back(run_case(*comms[r], *mems[r], c));
  }));
  return out;
}

// First differing element of two outputs, for the message.
inline std::string first_difference(const Bytes& got, const Bytes& want, DType dt) {
  if (got.size() != want.size())
    return "size " + std::to_string(got.size()) + " want " + std::to_string(want.size());
  const size_t esz = zf::dtype_size(dt);
  for (size_t i = 0; i < got.size(); i += esz)
    if (std::memcmp(&got[i], &want[i], esz) != 0) {
      std::ostringstream s;
      s << "element " << i / esz << ": got 0x" << std::hex;
      for (size_t k = esz; k-- > 0;) s << (got[i + k] >> 4) << (got[i + k] & 15);
      s << " want 0x";
      for (size_t k = esz; k-- > 0;) s << (want[i + k] >> 4) << (want[i + k] & 15);
      return s.str();
    }
  return "";
}

// out must equal `want` (per rank, per case) bit for bit.
inline void expect_outputs(const Outputs& out, const std::vector<Case>& cases,
                    const std::function<Bytes(int r, size_t k)>& want, const std::string& what) {
  int failures = 0;
  for (size_t r = 0; r < out.size(); r++) {
    ASSERT_EQ(out[r].size(), cases.size()) << "rank " << r;
    for (size_t k = 0; k < cases.size(); k++) {
      const Bytes w = want(int(r), k);
      if (out[r][k] != w && failures++ < 5)
        ADD_FAILURE() << what << ": N=" << out.size() << " rank " << r << " "
                      << describe(cases[k]) << ": " << first_difference(out[r][k], w, cases[k].dt);
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

// N ranks on the host threads backend.
struct HostWorld {
  Comms comms;
  std::vector<std::unique_ptr<RankMem>> mems;
  HostWorld(int N, size_t bytes) : comms(zf::make_thread_communicators(N)) {
    for (int r = 0; r < N; r++) mems.push_back(std::make_unique<HostMem>(bytes));
  }
};

// N virtual ranks on GPUs (devices; all 0 by default), each with its own
// non-blocking compute stream.
struct CudaWorld {
  std::vector<int> devices;
  std::vector<cudaStream_t> streams;
  Comms comms;
  std::vector<std::unique_ptr<RankMem>> mems;

  CudaWorld(int N, size_t bytes, int delay_ms = 0, std::vector<int> devs = {},
            bool default_devices = false)
      : devices(std::move(devs)) {
    if (devices.empty()) devices.assign(size_t(N), 0);
    for (int r = 0; r < N; r++) {
      CUDA_CHECK(cudaSetDevice(devices[r]));
      cudaStream_t s;
      CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      streams.push_back(s);
      mems.push_back(std::make_unique<CudaMem>(devices[r], s, bytes, delay_ms));
    }
    comms = zf::make_thread_communicators_cuda(N, streams,
                                               default_devices ? std::vector<int>{} : devices);
  }
  ~CudaWorld() {
    comms.clear();  // joins the communication threads
    mems.clear();
    for (size_t r = 0; r < streams.size(); r++) {
      cudaSetDevice(devices[r]);
      cudaStreamDestroy(streams[r]);
    }
  }
};

class CudaThreadsRanks : public ::testing::TestWithParam<int> {};
class HostSideRanks : public ::testing::TestWithParam<int> {};

}  // namespace threads_cuda_test
