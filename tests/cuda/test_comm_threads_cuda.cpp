// test_comm_threads_cuda.cpp: the threads backend on CUDA device buffers
// (common/cuda/comm_threads_cuda.h): N virtual ranks as threads on one GPU.
//
//   build/tests/test_gpu_comm_threads
//   build/tests/test_gpu_comm_threads --gtest_filter='*HostBackend*'
//
// Every collective (all_reduce, reduce_scatter, all_gather, broadcast; f32,
// bf16, i64; sum and avg; in place and not; blocking and async) runs on
// device buffers for N = 1..4 ranks on one GPU (and N = 8, 9: the kernel's
// pointers as parameters up to 8, from a device array beyond), with counts
// 0, 1, below N and not divisible by N. Each rank's output must equal, bit
// for bit:
//   - a direct computation on the host (expected_output below: the sources
//     summed in rank order in float32, bf16 rounded once), and
//   - the host threads backend's output for the same inputs.
// The inputs have full mantissas (the order of summation shows in the last
// bits), plus subnormals, values whose sums overflow to infinity, and
// infinities (never inf - inf: a NaN's bits are not specified across
// host and GPU). Outputs are poisoned first (all bytes 0xFF), so a forgotten
// element fails. Rank r's inputs are copied on its own compute stream (from
// pinned memory: still in flight when the collective is issued) right before
// the collective, sometimes behind a 2 ms host callback on that stream, so a
// collective that did not wait for its compute stream would read poison.
//
// Without a CUDA device the GPU tests skip with the reason ("no CUDA
// device: ..."); the host-side tests run everywhere: the harness against the
// host backend, the kernel's element arithmetic (the same __host__ __device__
// code, run on the host) against reduce_in_rank_order, the factory's error
// without a device.
#include <gtest/gtest.h>

#include "cuda/gpu_test_util.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
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

namespace {

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
float input_value(uint64_t tag, int r, size_t i) {
  if (i % 101 == 0) return 3e38f;
  if (i % 103 == 0) return float(r + 1) * ((i / 103) % 2 ? -1e-39f : 7e-40f);
  if (i % 107 == 0 && r == 0) return -std::numeric_limits<float>::infinity();
  return zf::test::input_f32(tag, r, i);
}

Bytes input_bytes(DType dt, uint64_t tag, int r, size_t n) {
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
Bytes reduce_direct(const std::vector<Bytes>& ins, size_t offset, size_t n, DType dt,
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

std::string describe(const Case& c) {
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
size_t input_elems(const Case& c, int N) {
  return c.kind == CollectiveKind::reduce_scatter ? size_t(N) * c.n : c.n;
}

// Every collective, dtype and op, with counts 0, 1, below N, not divisible
// by N, and crossing several 2048-element blocks of the host loop.
std::vector<Case> all_cases(int N) {
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
size_t arena_bytes(const std::vector<Case>& cases, int N) {
  size_t m = 1;
  for (const Case& c : cases) m = std::max(m, size_t(N) * std::max<size_t>(c.n, 1) * 8);
  return m;
}

// What rank r must hold after case c: the output buffer's bytes, then for a
// reduce_scatter that is not in place its send buffer (left as it was).
Bytes expected_output(const Case& c, int N, int r) {
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

void sleep_on_stream(void* us) {
  std::this_thread::sleep_for(std::chrono::microseconds(reinterpret_cast<uintptr_t>(us)));
}

// Device buffers on `device`; inputs are written on the rank's compute
// stream, truly asynchronously (from pinned staging memory, so the copy is
// still queued when the collective is issued: the collective must wait for
// it), after a host callback sleeping delay_us on that stream when
// delay_us > 0.
class CudaMem final : public RankMem {
 public:
  CudaMem(int device, cudaStream_t stream, size_t bytes, unsigned delay_us = 0)
      : device_(device), stream_(stream), delay_us_(delay_us), bytes_(bytes) {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaMalloc(&a_, bytes));
    CUDA_CHECK(cudaMalloc(&b_, bytes));
    for (auto& s : staging_) CUDA_CHECK(cudaMallocHost(&s, bytes));
  }
  ~CudaMem() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaFree(a_);
    cudaFree(b_);
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
    if (delay_us_)
      CUDA_CHECK(cudaLaunchHostFunc(stream_, sleep_on_stream,
                                    reinterpret_cast<void*>(uintptr_t(delay_us_))));
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
  int device_;
  cudaStream_t stream_;
  unsigned delay_us_;
  size_t bytes_;
  void* a_ = nullptr;
  void* b_ = nullptr;
  void* staging_[kSlots] = {};
  size_t next_ = 0;
};

// Rank r runs case c (every rank of the group runs the same case) and
// returns what expected_output describes.
Bytes run_case(Communicator& comm, RankMem& mem, const Case& c) {
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
std::vector<std::string> on_ranks(Comms& comms, const std::function<void(int)>& body) {
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

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); r++)
    EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Every rank runs every case; out[r][k] is rank r's output of case k.
using Outputs = std::vector<std::vector<Bytes>>;
Outputs run_cases(Comms& comms, std::vector<std::unique_ptr<RankMem>>& mems,
                  const std::vector<Case>& cases, const std::vector<int>& devices = {}) {
  Outputs out(comms.size());
  expect_no_errors(on_ranks(comms, [&](int r) {
    if (!devices.empty()) CUDA_CHECK(cudaSetDevice(devices[r]));
    for (const Case& c : cases) out[r].push_back(run_case(*comms[r], *mems[r], c));
  }));
  return out;
}

// First differing element of two outputs, for the message.
std::string first_difference(const Bytes& got, const Bytes& want, DType dt) {
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
void expect_outputs(const Outputs& out, const std::vector<Case>& cases,
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

  CudaWorld(int N, size_t bytes, unsigned delay_us = 0, std::vector<int> devs = {},
            bool default_devices = false)
      : devices(std::move(devs)) {
    if (devices.empty()) devices.assign(size_t(N), 0);
    for (int r = 0; r < N; r++) {
      CUDA_CHECK(cudaSetDevice(devices[r]));
      cudaStream_t s;
      CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      streams.push_back(s);
      mems.push_back(std::make_unique<CudaMem>(devices[r], s, bytes, delay_us));
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

}  // namespace

// ------------------------------------------------------------------ host side: runs everywhere

// The harness itself (inputs, cases, expected outputs) against the host
// threads backend, which test_comm checks in its own way: so that a failure
// of the GPU tests below is the CUDA path's, not the harness's.
TEST_P(HostSideRanks, HarnessAgreesWithTheHostBackend) {
  const int N = GetParam();
  const auto cases = all_cases(N);
  HostWorld host(N, arena_bytes(cases, N));
  const Outputs out = run_cases(host.comms, host.mems, cases);
  expect_outputs(out, cases, [&](int r, size_t k) { return expected_output(cases[k], N, r); },
                 "host threads backend vs direct computation");
}
INSTANTIATE_TEST_SUITE_P(N, HostSideRanks, ::testing::Values(1, 2, 3, 4, 9));

// The reduction kernel's element code, run on the host, gives the bits of
// comm_reduce.cpp's loops: every dtype, op and N, several destinations, in
// place, special values (subnormals, overflow, infinities, NaNs: on one
// machine NaNs propagate alike).
TEST(CudaThreadsHostSide, KernelArithmeticMatchesReduceInRankOrder) {
  const size_t n = 5000;
  for (DType dt : {DType::f32, DType::bf16, DType::i64, DType::i32})
    for (int N : {1, 2, 3, 4, 8, 9, 10})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        const size_t esz = zf::dtype_size(dt);
        std::vector<Bytes> ins;
        for (int q = 0; q < N; q++) {
          Bytes b(n * esz);
          if (dt == DType::i32) {
            for (size_t i = 0; i < n; i++) {
              const int32_t v = int32_t(zf::test::input_i64(7, q, i) >> 36);
              std::memcpy(&b[4 * i], &v, 4);
            }
          } else {
            b = input_bytes(dt, 11 + N, q, n);
          }
          if (dt == DType::f32 && q == N - 1) {  // a NaN in the last source
            const float nan = std::numeric_limits<float>::quiet_NaN();
            std::memcpy(&b[4 * 17], &nan, 4);
          }
          ins.push_back(b);
        }
        std::vector<const void*> src;
        for (auto& b : ins) src.push_back(b.data());
        // Host loops: two destinations. Kernel code: in place into source 0
        // and one more destination.
        Bytes h1(n * esz), h2(n * esz), k2(n * esz);
        zf::reduce_in_rank_order(src, {h1.data(), h2.data()}, n, dt, op);
        std::vector<Bytes> kin = ins;
        std::vector<const void*> ksrc;
        for (auto& b : kin) ksrc.push_back(b.data());
        zf::cuda_threads_reduce_on_host(ksrc, {kin[0].data(), k2.data()}, n, dt, op);
        EXPECT_EQ(h1, h2);
        EXPECT_EQ(first_difference(kin[0], h1, dt), "")
            << zf::dtype_name(dt) << " N=" << N << (op == ReduceOp::avg ? " avg" : " sum");
        EXPECT_EQ(first_difference(k2, h1, dt), "")
            << zf::dtype_name(dt) << " N=" << N << (op == ReduceOp::avg ? " avg" : " sum");
      }
}

TEST(CudaThreadsHostSide, WithoutADeviceTheFactorySaysWhy) {
  if (no_device_reason().empty()) GTEST_SKIP() << "a CUDA device is present";
  try {
    zf::make_thread_communicators_cuda(2, {});
    ADD_FAILURE() << "make_thread_communicators_cuda did not raise without a device";
  } catch (const zf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(no_device_reason()), std::string::npos) << e.what();
  }
}

TEST(CudaThreadsHostSide, AccessorsRefuseOtherCommunicators) {
  auto comms = zf::make_thread_communicators(1);
  EXPECT_THROW(zf::cuda_threads_device(*comms[0]), zf::Error);
  EXPECT_THROW(zf::cuda_threads_set_compute_stream(*comms[0], nullptr), zf::Error);
}

// ------------------------------------------------------------------ on a GPU

// Every collective on device buffers: equal, bit for bit, to the direct
// computation and to the host threads backend on the same inputs.
TEST_P(CudaThreadsRanks, EveryCollectiveEqualsTheDirectComputationAndTheHostBackend) {
  SKIP_WITHOUT_GPU();
  const int N = GetParam();
  const auto cases = all_cases(N);
  const size_t bytes = arena_bytes(cases, N);
  HostWorld host(N, bytes);
  const Outputs want = run_cases(host.comms, host.mems, cases);
  CudaWorld dev(N, bytes);
  for (int r = 0; r < N; r++) {
    EXPECT_EQ(dev.comms[r]->rank(), r);
    EXPECT_EQ(dev.comms[r]->size(), N);
    EXPECT_STREQ(dev.comms[r]->backend(), "threads");
    EXPECT_EQ(zf::cuda_threads_device(*dev.comms[r]), 0);
    EXPECT_EQ(zf::cuda_threads_compute_stream(*dev.comms[r]), dev.streams[r]);
  }
  const Outputs got = run_cases(dev.comms, dev.mems, cases, dev.devices);
  expect_outputs(got, cases, [&](int r, size_t k) { return expected_output(cases[k], N, r); },
                 "cuda threads vs direct computation");
  expect_outputs(got, cases, [&](int r, size_t k) { return want[r][k]; },
                 "cuda threads vs host threads backend");
}

// reduce_scatter then all_gather equals all_reduce, bit for bit, on device.
TEST_P(CudaThreadsRanks, ReduceScatterThenAllGatherEqualsAllReduceBitForBit) {
  SKIP_WITHOUT_GPU();
  const int N = GetParam();
  std::vector<Case> cases;
  uint64_t tag = 900;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
    for (DType dt : {DType::f32, DType::bf16})
      for (size_t n : {size_t(1), size_t(777), size_t(4096)}) {
        Case c{CollectiveKind::all_reduce, dt, op, n};
        c.tag = tag++;
        cases.push_back(c);
      }
  const size_t bytes = arena_bytes(cases, N) * 2;
  CudaWorld dev(N, bytes);
  expect_no_errors(on_ranks(dev.comms, [&](int r) {
    CUDA_CHECK(cudaSetDevice(0));
    Communicator& comm = *dev.comms[r];
    RankMem& mem = *dev.mems[r];
    for (const Case& c : cases) {
      const size_t esz = zf::dtype_size(c.dt), full = size_t(N) * c.n;
      const Bytes x = input_bytes(c.dt, c.tag, r, full);
      char* A = mem.buf(0);
      char* B = mem.buf(1);
      char* shard = B + full * esz;  // B holds the gather, then the shard
      mem.put(A, x);
      mem.poison(B, (full + c.n) * esz);
      comm.reduce_scatter(A, shard, c.n, c.dt, c.op);
      comm.all_gather(shard, B, c.n, c.dt);
      comm.all_reduce(A, full, c.dt, c.op);
      const Bytes ar = mem.get(A, full * esz), gathered = mem.get(B, full * esz);
      EXPECT_EQ(first_difference(gathered, ar, c.dt), "") << "N=" << N << " " << describe(c);
    }
  }));
}

INSTANTIATE_TEST_SUITE_P(N, CudaThreadsRanks, ::testing::Values(1, 2, 3, 4, 8, 9));

// A collective comes after the work issued before it on the rank's compute
// stream: every input is written behind a 2 ms sleep on that stream, and
// several collectives are in flight at once, waited in order.
TEST(CudaThreads, WaitsForEachRanksComputeStream) {
  SKIP_WITHOUT_GPU();
  const int N = 3;
  std::vector<Case> cases;
  uint64_t tag = 1000;
  for (CollectiveKind kind : {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter,
                              CollectiveKind::all_gather, CollectiveKind::broadcast})
    for (DType dt : {DType::f32, DType::bf16}) {
      Case c{kind, dt, ReduceOp::sum, 3001, 1};
      c.tag = tag++;
      cases.push_back(c);
    }
  CudaWorld dev(N, arena_bytes(cases, N), /*delay_us=*/2000);
  const Outputs got = run_cases(dev.comms, dev.mems, cases, dev.devices);
  expect_outputs(got, cases, [&](int r, size_t k) { return expected_output(cases[k], N, r); },
                 "behind a sleeping compute stream");

  // Several in flight: K all_reduces on separate buffers, each input written
  // behind a sleep, issued back to back, then waited in order.
  const int K = 4;
  const size_t n = 2500;
  std::vector<std::vector<void*>> bufs(N, std::vector<void*>(K));
  for (int r = 0; r < N; r++)
    for (int k = 0; k < K; k++) CUDA_CHECK(cudaMalloc(&bufs[r][k], n * 4));
  expect_no_errors(on_ranks(dev.comms, [&](int r) {
    CUDA_CHECK(cudaSetDevice(0));
    std::vector<zf::CommHandle> hs;
    for (int k = 0; k < K; k++) {
      dev.mems[r]->put(bufs[r][k], input_bytes(DType::f32, 1100 + k, r, n));
      hs.push_back(dev.comms[r]->all_reduce_async(bufs[r][k], n, DType::f32, ReduceOp::sum));
    }
    for (auto& h : hs) h.wait();
    for (int k = 0; k < K; k++) {
      Case c{CollectiveKind::all_reduce, DType::f32, ReduceOp::sum, n};
      c.tag = 1100 + k;
      EXPECT_EQ(first_difference(dev.mems[r]->get(bufs[r][k], n * 4), expected_output(c, N, r),
                                 DType::f32),
                "")
          << "in flight #" << k << " rank " << r;
    }
  }));
  for (auto& v : bufs)
    for (void* p : v) cudaFree(p);
}

// The compute stream may be set after the group is made (the launcher makes
// communicators before each rank's Device has made its stream).
TEST(CudaThreads, ComputeStreamSetAfterTheGroupIsMade) {
  SKIP_WITHOUT_GPU();
  const int N = 2;
  std::vector<Case> cases;
  for (DType dt : {DType::f32, DType::bf16, DType::i64}) {
    Case c{CollectiveKind::all_reduce, dt, ReduceOp::avg, 4097};
    c.tag = 1200 + uint64_t(dt);
    cases.push_back(c);
  }
  CudaWorld dev(N, arena_bytes(cases, N), /*delay_us=*/2000);
  Comms made = zf::make_thread_communicators_cuda(N, {}, {0, 0});  // stream 0 until set
  for (int r = 0; r < N; r++) {
    EXPECT_EQ(zf::cuda_threads_compute_stream(*made[r]), cudaStream_t(nullptr));
    zf::cuda_threads_set_compute_stream(*made[r], dev.streams[r]);
    EXPECT_EQ(zf::cuda_threads_compute_stream(*made[r]), dev.streams[r]);
  }
  const Outputs got = run_cases(made, dev.mems, cases, dev.devices);
  expect_outputs(got, cases, [&](int r, size_t k) { return expected_output(cases[k], N, r); },
                 "compute stream set later");
}

// barrier() also waits for the rank's compute stream (as the nccl backend's).
TEST(CudaThreads, BarrierWaitsForTheComputeStream) {
  SKIP_WITHOUT_GPU();
  const int N = 2;
  CudaWorld dev(N, 1024);
  expect_no_errors(on_ranks(dev.comms, [&](int r) {
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaLaunchHostFunc(dev.streams[r], sleep_on_stream,
                                  reinterpret_cast<void*>(uintptr_t(20000))));
    dev.comms[r]->barrier();
    EXPECT_EQ(cudaStreamQuery(dev.streams[r]), cudaSuccess) << "rank " << r;
  }));
}

// Counters as the host backend's: bytes (ring model) and calls at issue.
TEST(CudaThreads, ByteCountersEqualTheHostBackends) {
  SKIP_WITHOUT_GPU();
  const int N = 3;
  std::vector<Case> cases = {
      Case{CollectiveKind::all_reduce, DType::f32, ReduceOp::sum, 3000},
      Case{CollectiveKind::all_reduce, DType::bf16, ReduceOp::avg, 1000},
      Case{CollectiveKind::reduce_scatter, DType::f32, ReduceOp::sum, 1000},
      Case{CollectiveKind::all_gather, DType::i64, ReduceOp::sum, 1000},
      Case{CollectiveKind::broadcast, DType::f32, ReduceOp::sum, 1000, 2},
      Case{CollectiveKind::barrier, DType::f32},
  };
  const size_t bytes = arena_bytes(cases, N);
  HostWorld host(N, bytes);
  CudaWorld dev(N, bytes);
  run_cases(host.comms, host.mems, cases);
  run_cases(dev.comms, dev.mems, cases, dev.devices);
  for (int r = 0; r < N; r++) {
    const zf::CommStats h = host.comms[r]->stats(), d = dev.comms[r]->stats();
    for (int k = 0; k < zf::kNumCollectives; k++) {
      EXPECT_EQ(d.bytes[k], h.bytes[k]) << zf::collective_name(CollectiveKind(k));
      EXPECT_EQ(d.calls[k], h.calls[k]) << zf::collective_name(CollectiveKind(k));
      EXPECT_GE(d.seconds[k], 0.0);
    }
    EXPECT_GT(d.total_bytes(), 0.0);
  }
}

// Pageable host memory is refused when the collective is issued, with a
// message that says what the backend takes.
TEST(CudaThreads, PageableHostMemoryIsRefusedAtIssue) {
  SKIP_WITHOUT_GPU();
  Comms comms = zf::make_thread_communicators_cuda(1, {}, {0});
  std::vector<float> host(16, 1.0f);
  try {
    comms[0]->all_reduce(host.data(), host.size(), DType::f32);
    ADD_FAILURE() << "all_reduce on pageable host memory did not raise";
  } catch (const zf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not device memory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(comms[0]->stats().calls[int(CollectiveKind::all_reduce)], 0u);  // not issued
  // The communicator still works.
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, 64));
  CUDA_CHECK(cudaMemset(p, 0, 64));
  comms[0]->all_reduce(p, 16, DType::f32);
  cudaFree(p);
}

// abort() from one rank wakes a rank waiting in a collective (CommAborted,
// with the reason); mismatched calls raise on every rank.
TEST(CudaThreads, AbortAndMismatchRaiseInsteadOfHanging) {
  SKIP_WITHOUT_GPU();
  {
    CudaWorld dev(2, 4096);
    std::string seen;
    const auto errors = on_ranks(dev.comms, [&](int r) {
      CUDA_CHECK(cudaSetDevice(0));
      if (r == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        dev.comms[1]->abort("rank 1 gives up");
        return;
      }
      try {
        dev.comms[0]->all_reduce(dev.mems[0]->buf(0), 100, DType::f32);
      } catch (const zf::CommAborted& e) {
        seen = e.what();
      }
    });
    expect_no_errors(errors);
    EXPECT_NE(seen.find("rank 1 gives up"), std::string::npos) << seen;
  }
  {
    CudaWorld dev(2, 4096);
    const auto errors = on_ranks(dev.comms, [&](int r) {
      CUDA_CHECK(cudaSetDevice(0));
      dev.comms[r]->all_reduce(dev.mems[r]->buf(0), r == 0 ? 100 : 101, DType::f32);
    });
    for (int r = 0; r < 2; r++)
      EXPECT_NE(errors[r].find("do not match"), std::string::npos) << "rank " << r << ": "
                                                                  << errors[r];
  }
}

// The default placement, rank r on GPU r % count: on one GPU every rank on
// GPU 0; on several, ranks on different GPUs through peer access.
TEST(CudaThreads, DefaultPlacementIsRankModuloGpuCount) {
  SKIP_WITHOUT_GPU();
  const int count = gpu_count();
  const int N = 4;
  std::vector<int> devices;
  for (int r = 0; r < N; r++) devices.push_back(r % count);
  std::vector<Case> cases;
  uint64_t tag = 1300;
  for (CollectiveKind kind : {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter,
                              CollectiveKind::all_gather, CollectiveKind::broadcast})
    for (DType dt : {DType::f32, DType::bf16}) {
      Case c{kind, dt, ReduceOp::avg, 1003, 3};
      c.tag = tag++;
      cases.push_back(c);
    }
  std::unique_ptr<CudaWorld> dev;
  try {
    dev = std::make_unique<CudaWorld>(N, arena_bytes(cases, N), 0, devices,
                                      /*default_devices=*/true);
  } catch (const zf::Error& e) {
    if (std::string(e.what()).find("peer access") != std::string::npos)
      GTEST_SKIP() << count << " GPUs without peer access between them: " << e.what();
    throw;
  }
  for (int r = 0; r < N; r++) EXPECT_EQ(zf::cuda_threads_device(*dev->comms[r]), r % count);
  const Outputs got = run_cases(dev->comms, dev->mems, cases, dev->devices);
  expect_outputs(got, cases, [&](int r, size_t k) { return expected_output(cases[k], N, r); },
                 "ranks on GPU r % " + std::to_string(count));
}
