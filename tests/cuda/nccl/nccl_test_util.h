// nccl_test_util.h: what the nccl communicator's GPU tests share
// (test_comm_nccl.cpp, test_comm_nccl_faults.cpp): device buffers, seeded
// integer inputs and their direct reductions, the two worlds, the test
// options. See test_comm_nccl.cpp for how the tests use them.
#pragma once

#include <gtest/gtest.h>
#include "cuda/gpu_test_util.h"
#include <cuda_runtime.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>
#include "comm.h"
#include "comm_nccl.h"
#include "dtype.h"
#include "kernels_cuda.h"

namespace zf::nccl_test {


using zf::CollectiveKind;
using zf::DType;
using zf::NcclCommunicator;
using zf::ReduceOp;
using vf = std::vector<float>;

using zf::test::gpu_count;
using zf::test::no_device_reason;

// The unit roundoff of a dtype: 2^-24 for f32, 2^-8 for bf16.
inline double unit(DType dt) { return dt == DType::bf16 ? 1.0 / 256 : 1.0 / (1 << 24); }

// ------------------------------------------------------------------ buffers

// Host float32 values <-> bytes of dt (bf16 rounded to nearest even).
inline std::vector<uint8_t> encode(const vf& v, DType dt) {
  std::vector<uint8_t> b(v.size() * zf::dtype_size(dt));
  if (dt == DType::f32) {
    if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  } else {
    for (size_t i = 0; i < v.size(); i++) {
      const zf::bf16 h = zf::float_to_bf16(v[i]);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}
inline vf decode(const std::vector<uint8_t>& b, DType dt) {
  vf v(b.size() / zf::dtype_size(dt));
  if (dt == DType::f32) {
    if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
  } else {
    for (size_t i = 0; i < v.size(); i++) {
      zf::bf16 h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      v[i] = zf::bf16_to_float(h);
    }
  }
  return v;
}

// A device array of n elements of dt on the current device. Transfers use
// the default stream, which is the communicator's compute stream unless a
// test sets another: the collective is ordered after them by its ready event.
class DevBuf {
 public:
  DevBuf(size_t n, DType dt) : n_(n), dt_(dt) {
    CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n * zf::dtype_size(dt), 1)));
    poison();
  }
  ~DevBuf() { cudaFree(p_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;

  char* at(size_t element) { return static_cast<char*>(p_) + element * zf::dtype_size(dt_); }
  void* get() { return p_; }
  void poison() { CUDA_CHECK(cudaMemset(p_, 0xFF, n_ * zf::dtype_size(dt_))); }
  // Writes v at element `offset` (and nothing else).
  void upload(const vf& v, size_t offset = 0) {
    const auto b = encode(v, dt_);
    CUDA_CHECK(cudaMemcpy(at(offset), b.data(), b.size(), cudaMemcpyHostToDevice));
  }
  vf download(size_t offset = 0, size_t count = size_t(-1)) {
    if (count == size_t(-1)) count = n_ - offset;
    std::vector<uint8_t> b(count * zf::dtype_size(dt_));
    CUDA_CHECK(cudaMemcpy(b.data(), at(offset), b.size(), cudaMemcpyDeviceToHost));
    return decode(b, dt_);
  }

 private:
  void* p_ = nullptr;
  size_t n_;
  DType dt_;
};

// ------------------------------------------------------------------ inputs and checks

// Rank r's input element i for the collective tagged `salt`: an integer in
// [-8, 8], so sums are exact in f32 and bf16.
inline vf ints(int rank, size_t n, int salt) {
  vf v(n);
  for (size_t i = 0; i < n; i++) v[i] = float(int((size_t(rank) * 7 + i * 3 + size_t(salt) * 5) % 17) - 8);
  return v;
}

// "" if every got[i] is within tol of want[i] (NaN never is); else the first
// mismatch and how many there are.
inline std::string mismatch(const vf& got, const std::vector<double>& want, double tol) {
  if (got.size() != want.size()) return "size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); i++) {
    if (!(std::fabs(double(got[i]) - want[i]) <= tol)) {
      if (bad++ == 0) first = i;
    }
  }
  if (bad == 0) return "";
  char s[200];
  std::snprintf(s, sizeof s, "%zu of %zu elements wrong; first at %zu: got %.9g, want %.9g (tol %.3g)",
                bad, got.size(), first, double(got[first]), want[first], tol);
  return s;
}

// The reduction of every rank's ints(r, n, salt), element by element, and the
// tolerance for it: exact for sums and for N = 1, (N+1) roundings of the
// largest magnitude for avg (ncclAvg multiplies by 1/N before summing).
struct Reduced {
  std::vector<double> value;
  double tol = 0;
};
inline Reduced reduce_ints(int N, size_t n, int salt, ReduceOp op, DType dt) {
  Reduced r;
  r.value.assign(n, 0.0);
  double mag = 0;
  for (int q = 0; q < N; q++) {
    const vf x = ints(q, n, salt);
    for (size_t i = 0; i < n; i++) r.value[i] += x[i];
  }
  for (size_t i = 0; i < n; i++) mag = std::max(mag, std::fabs(r.value[i]));
  if (op == ReduceOp::avg) {
    for (double& v : r.value) v /= N;
    if (N > 1) r.tol = (N + 1) * unit(dt) * std::max(mag, 8.0 * N);
  }
  return r;
}

// ------------------------------------------------------------------ worlds

enum class WorldKind { one_rank, all_gpus };

inline std::string world_name(const ::testing::TestParamInfo<WorldKind>& info) {
  return info.param == WorldKind::one_rank ? "OneRank" : "AllGpus";
}

// The communicators of one world, and a way to run code on every rank.
struct World {
  std::vector<std::unique_ptr<NcclCommunicator>> comms;
  int size() const { return int(comms.size()); }

  // fn(rank, comm) on one thread per rank, with the rank's device current and
  // the rank tagged for error messages. The first exception is rethrown
  // after every thread has joined.
  void run(const std::function<void(int, NcclCommunicator&)>& fn) {
    std::mutex mu;
    std::exception_ptr first;
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); r++)
      threads.emplace_back([&, r] {
        zf::set_current_rank(r);
        try {
          CUDA_CHECK(cudaSetDevice(comms[size_t(r)]->device()));
          fn(r, *comms[size_t(r)]);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!first) first = std::current_exception();
        }
        zf::set_current_rank(-1);
      });
    for (auto& t : threads) t.join();
    if (first) std::rethrow_exception(first);
  }
};

// Short timeouts: a test that hangs fails in a minute, not ten. The
// creation always gets the minute: the fault tests' 0.3 s is for the
// collective, and NCCL's own set-up of a communicator (topology detection,
// buffers, proxy thread) can alone take that long on a first run.
inline zf::NcclOptions test_options(double timeout_s = 60) {
  zf::NcclOptions o;
  o.timeout_s = timeout_s;
  o.init_timeout_s = 60;
  return o;
}

class NcclComm : public ::testing::TestWithParam<WorldKind> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    std::vector<int> devices{0};
    if (GetParam() == WorldKind::all_gpus) {
      const int n = gpu_count();
      if (n < 2)
        GTEST_SKIP() << "needs 2 or more GPUs for ranks as threads (found " << n
                     << "); N = 2 on one GPU is nccl_two_process's job (scripts/gpu_check.sh)";
      devices.clear();
      for (int d = 0; d < n; d++) devices.push_back(d);
    }
    world_.comms = NcclCommunicator::create_group(devices, test_options());
  }
  void TearDown() override { world_.comms.clear(); }
  World world_;
};

inline constexpr DType kDtypes[] = {DType::f32, DType::bf16};
inline constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg};
inline const char* op_name(ReduceOp op) { return op == ReduceOp::sum ? "sum" : "avg"; }


using SleepArg = zf::test::Stall;  // cudaLaunchHostFunc(stream, sleep_on_stream, &stall)
using zf::test::sleep_on_stream;

// One NCCL rank on GPU 0 whose compute stream is stalled for `ms` from the
// start (a host function sleeping on it), so that a collective issued now
// waits for its input. The end waits for the communicator to close and the
// stall to pass (neither may hang).
struct StalledRank {
  StalledRank(double timeout_s, int ms)
      : comms(NcclCommunicator::create_group({0}, test_options(timeout_s))), stall{ms} {
    CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    CUDA_CHECK(cudaDeviceSynchronize());
    comm().set_compute_stream(compute);
    CUDA_CHECK(cudaLaunchHostFunc(compute, sleep_on_stream, &stall));
  }
  ~StalledRank() {  // no CUDA_CHECK: a destructor must not throw
    comms.clear();
    EXPECT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(compute), cudaSuccess);
  }
  NcclCommunicator& comm() { return *comms[0]; }

  std::vector<std::unique_ptr<NcclCommunicator>> comms;
  SleepArg stall;
  cudaStream_t compute = nullptr;
  DevBuf buf{1000, DType::f32};
};

}  // namespace zf::nccl_test
