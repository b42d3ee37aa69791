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

#include "cuda/comm_threads_cuda_harness.h"

using namespace threads_cuda_test;


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
INSTANTIATE_TEST_SUITE_P(N, HostSideRanks, ::testing::Values(1, 2, 3, 4, 9), zf::test::rank_count_name);

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

INSTANTIATE_TEST_SUITE_P(N, CudaThreadsRanks, ::testing::Values(1, 2, 3, 4, 8, 9), zf::test::rank_count_name);
