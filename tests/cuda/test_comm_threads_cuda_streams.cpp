// test_comm_threads_cuda_streams.cpp: the threads backend on CUDA device
// buffers, beyond the values of each collective (test_comm_threads_cuda.cpp):
// waiting for each rank's compute stream, the byte counters, refusals, abort
// and mismatch, placement. Skips without a CUDA device.
//
//   build/tests/test_gpu_comm_threads --gtest_filter='CudaThreads.*'
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
  CudaWorld dev(N, arena_bytes(cases, N), /*delay_ms=*/2);
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
  CudaWorld dev(N, arena_bytes(cases, N), /*delay_ms=*/2);
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
  zf::test::Stall stall{20};  // outlives dev, whose end waits for every stream
  CudaWorld dev(N, 1024);
  expect_no_errors(on_ranks(dev.comms, [&](int r) {
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaLaunchHostFunc(dev.streams[r], zf::test::sleep_on_stream, &stall));
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
// GPU 0; on several, ranks on different GPUs through peer access and each
// other's memory pools.
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

// Communicator::split on device buffers (comm.h): HSDP's two splits at
// N = 4, groups {0, 1} and {2, 3} keyed by rank, then {3, 1} and {2, 0}
// keyed by -rank. Each child's all_gather and all_reduce against the direct
// computation over its members in the child's order, bit for bit (the
// threads backend sums in rank order, the child's).
TEST(CudaThreads, SplitChildrenSumOverTheirMembersBitForBit) {
  SKIP_WITHOUT_GPU();
  const int N = 4, F = 2;
  const size_t n = 3001;
  CudaWorld dev(N, N * n * 4);  // the staging arena: the largest transfer
  std::vector<void*> buf(N), gathered(N);
  CUDA_CHECK(cudaSetDevice(0));
  for (int r = 0; r < N; r++) {
    CUDA_CHECK(cudaMalloc(&buf[r], n * 4));
    CUDA_CHECK(cudaMalloc(&gathered[r], N * n * 4));
  }
  expect_no_errors(on_ranks(dev.comms, [&](int r) {
    CUDA_CHECK(cudaSetDevice(0));
    for (int which = 0; which < 2; which++) {
      const uint64_t tag = 1300 + which;
      const int color = which == 0 ? r / F : r % F;
      std::vector<int> members;  // parent ranks, in the child's order
      for (int q = 0; q < N; q++)
        if ((which == 0 ? q / F : q % F) == color) members.push_back(q);
      if (which == 1) std::reverse(members.begin(), members.end());
      auto child = dev.comms[r]->split(color, which == 0 ? r : -r);
      EXPECT_EQ(child->size(), int(members.size()));
      EXPECT_EQ(members[size_t(child->rank())], r);
      std::vector<Bytes> ins;
      Bytes want_gather;
      for (int q : members) {
        ins.push_back(input_bytes(DType::f32, tag, q, n));
        want_gather.insert(want_gather.end(), ins.back().begin(), ins.back().end());
      }
      dev.mems[r]->put(buf[r], input_bytes(DType::f32, tag, r, n));
      child->all_gather(buf[r], gathered[r], n, DType::f32);
      EXPECT_EQ(first_difference(dev.mems[r]->get(gathered[r], want_gather.size()), want_gather,
                                 DType::f32),
                "")
          << "split " << which << ", rank " << r;
      child->all_reduce(buf[r], n, DType::f32, ReduceOp::sum);
      EXPECT_EQ(first_difference(dev.mems[r]->get(buf[r], n * 4),
                                 reduce_direct(ins, 0, n, DType::f32, ReduceOp::sum), DType::f32),
                "")
          << "split " << which << ", rank " << r;
    }
  }));
  for (int r = 0; r < N; r++) {
    cudaFree(buf[r]);
    cudaFree(gathered[r]);
  }
}
