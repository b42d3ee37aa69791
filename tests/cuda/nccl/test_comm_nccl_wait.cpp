// test_comm_nccl_wait.cpp: CommHandle::wait() on the nccl backend is a wait
// on the device (comm.h, comm_nccl.h): the compute stream waits for the
// collective, the host does not. Part of the gpu_comm suite (its failure
// test is with the other fault tests, test_comm_nccl.cpp, which run last).
//
//   build/tests/test_gpu_comm --gtest_filter='NcclDeviceWait*'
//
// Each test runs on a group of one rank on GPU 0, and again on one rank per
// GPU when there are two or more (NCCL allows one rank per GPU). Buffers come
// from each rank's GPU Device (device_cuda.cu: the stream-ordered allocator),
// whose compute stream the communicator is ordered after, as in a stage.
//
// How a missing order would show: before the collectives, the communication
// stream is held shut (StreamGate, gpu_test_util.h) until the host has issued
// the work that follows their wait(). If wait() did not make the compute
// stream wait, that work would read the buffer before the collective wrote it
// (poison), or the collective would write into memory already handed to
// someone else; if wait() blocked the host, the host would wait until the
// gate's limit, which the gate reports. Inputs are small integers
// plus 100 (never 0), so every result is exact and nonzero.
#include <gtest/gtest.h>

#include "cuda/gpu_test_util.h"

#include <cuda_runtime.h>

#include <exception>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm.h"
#include "comm_nccl.h"
#include "device.h"
#include "kernels_cuda.h"

namespace {

using zf::DType;
using zf::NcclCommunicator;

using zf::test::StreamGate;

// Rank r's n inputs for round `salt`: integers in [92, 108].
std::vector<float> inputs(int rank, size_t n, int salt) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++)
    v[i] = 100.0f + float(int((size_t(rank) * 7 + i * 3 + size_t(salt) * 5) % 17) - 8);
  return v;
}
// What all_gather of every rank's inputs(q, n, salt) holds.
std::vector<float> gathered(int N, size_t n, int salt) {
  std::vector<float> all;
  for (int q = 0; q < N; q++) {
    const std::vector<float> x = inputs(q, n, salt);
    all.insert(all.end(), x.begin(), x.end());
  }
  return all;
}

// Runs fn(rank, comm, device) on one thread per rank of a group on `gpus`,
// with the rank's GPU Device made on its thread and the communicator ordered
// after its compute stream; rethrows the first exception after all joined.
void run_group(const std::vector<int>& gpus,
               const std::function<void(int, NcclCommunicator&, zf::Device&)>& fn) {
  zf::NcclOptions opt;
  opt.timeout_s = 60;  // a hang fails in a minute
  auto comms = NcclCommunicator::create_group(gpus, opt);
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < int(gpus.size()); r++)
    threads.emplace_back([&, r] {
      zf::set_current_rank(r);
      try {
        NcclCommunicator& comm = *comms[size_t(r)];
        auto dev = zf::make_cuda_device(comm.device());
        dev->make_current();
        comm.set_compute_stream(static_cast<cudaStream_t>(dev->native_stream()));
        try {
          fn(r, comm, *dev);
        } catch (...) {
          comm.set_compute_stream(nullptr);
          throw;
        }
        comm.set_compute_stream(nullptr);  // the device (and its stream) goes first
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
      zf::set_current_rank(-1);
    });
  for (auto& t : threads) t.join();
  comms.clear();
  if (first) std::rethrow_exception(first);
}

// GPU 0 alone, then every GPU when there are two or more.
std::vector<std::vector<int>> groups() {
  std::vector<std::vector<int>> g{{0}};
  const int n = zf::test::gpu_count();
  if (n >= 2) {
    g.emplace_back();
    for (int d = 0; d < n; d++) g.back().push_back(d);
  }
  return g;
}

// A device buffer holding v (synchronizes: to_device).
void* upload(zf::Device& dev, const std::vector<float>& v) {
  void* p = dev.allocate(v.size() * sizeof(float));
  REQUIRE(p, "test: out of device memory");
  dev.to_device(p, v.data(), v.size() * sizeof(float));
  return p;
}
std::vector<float> download(zf::Device& dev, const void* p, size_t n) {
  std::vector<float> v(n);
  dev.to_host(v.data(), p, n * sizeof(float));
  return v;
}
// "" when equal (exact: small integers), else how many differ and the first.
std::string mismatch(const std::vector<float>& got, const std::vector<float>& want) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (got[i] != want[i] && bad++ == 0) first = i;
  if (bad == 0) return "";
  return std::to_string(bad) + " of " + std::to_string(got.size()) + " wrong; first at " +
         std::to_string(first) + ": got " + std::to_string(got[first]) + ", want " +
         std::to_string(want[first]);
}

// Round after round, with no host sync: all_gather into a fresh buffer,
// wait(), a kernel on the compute stream reads the result (out = 2 * recv),
// the buffer is released and the next round's allocation gets it back. The
// communication stream is held shut until the host has issued every round,
// so a wait() that waited on the host would never return (until the gate's
// limit); and every kernel saw its round's result.
TEST(NcclDeviceWait, TheNextKernelSeesTheResultAndTheHostGoesOn) {
  SKIP_WITHOUT_GPU();
  for (const auto& gpus : groups()) {
    SCOPED_TRACE(std::to_string(gpus.size()) + " rank(s)");
    run_group(gpus, [&](int r, NcclCommunicator& comm, zf::Device& dev) {
      const int N = comm.size(), kRounds = 40;
      const size_t n = 1001, full = size_t(N) * n, bytes = full * sizeof(float);
      std::vector<void*> send, out;
      for (int i = 0; i < kRounds; i++) {
        send.push_back(upload(dev, inputs(r, n, i)));
        out.push_back(dev.allocate(bytes));
      }
      {  // Warm-up: NCCL connects on its first collective; the pool gets a block of this size.
        void* recv = dev.allocate(bytes);
        comm.all_gather(send[0], recv, n, DType::f32);
        dev.release(recv);
        dev.synchronize();
      }
      StreamGate gate(comm.comm_stream());
      std::vector<zf::CommHandle> handles;
      for (int i = 0; i < kRounds; i++) {
        void* recv = dev.allocate(bytes);
        handles.push_back(comm.all_gather_async(send[size_t(i)], recv, n, DType::f32));
        handles.back().wait();
        const auto* in = static_cast<const float*>(recv);
        zf::residual_forward_cuda(static_cast<float*>(out[size_t(i)]), in, in, full,
                                  static_cast<cudaStream_t>(dev.native_stream()));
        dev.release(recv);  // stream-ordered: after the kernel that reads it
      }
      EXPECT_TRUE(gate.holds()) << "the gate did not hold the communication stream";
      gate.open();
      for (auto& h : handles) h.wait_host();  // every one succeeded, and has completed
      for (int i = 0; i < kRounds; i++) {
        std::vector<float> want = gathered(N, n, i);
        for (float& x : want) x *= 2.0f;  // exact: small integers
        EXPECT_EQ(mismatch(download(dev, out[size_t(i)], full), want), "") << "round " << i;
      }
      EXPECT_FALSE(gate.opened_by_limit()) << "wait() blocked the host: the " << kRounds
                                           << " rounds were issued only after the gate's limit";
      for (void* p : send) dev.release(p);
      for (void* p : out) dev.release(p);
      dev.synchronize();
    });
  }
}

// The buffer a collective writes, released right after wait() and allocated
// again and zeroed, while the communication stream is held: the zeros must
// land after the collective's write, and the host never waits. That bites only if the pool hands the same block back
// (it usually does, on the same stream); CUDA allows but does not promise
// it ("the allocator is free to reallocate the memory as long as ...",
// runtime API, Stream Ordered Memory Allocator), so another block is only
// noted (and recorded in the XML report), not a failure.
TEST(NcclDeviceWait, FreeAfterWaitIsOrderedAfterTheCollective) {
  SKIP_WITHOUT_GPU();
  for (const auto& gpus : groups()) {
    SCOPED_TRACE(std::to_string(gpus.size()) + " rank(s)");
    run_group(gpus, [&](int r, NcclCommunicator& comm, zf::Device& dev) {
      const int N = comm.size();
      const size_t n = 4099, full = size_t(N) * n, bytes = full * sizeof(float);
      void* send = upload(dev, inputs(r, n, 1));
      void* a = dev.allocate(bytes);
      comm.all_gather(send, a, n, DType::f32);  // warm-up (connects)
      StreamGate gate(comm.comm_stream());
      zf::CommHandle h = comm.all_gather_async(send, a, n, DType::f32);
      h.wait();
      dev.release(a);
      void* b = dev.allocate(bytes);
      dev.zero(b, bytes);
      EXPECT_TRUE(gate.holds()) << "the gate did not hold the communication stream";
      gate.open();
      ::testing::Test::RecordProperty("reused_block", b == a ? "yes" : "no");
      if (b != a)
        std::cout << "  note: the pool handed out another block; the order was not exercised\n";
      // Read only once the collective has written (the host waits for it):
      // had the zeros come first, its write would now be there.
      h.wait_host();
      const std::vector<float> got = download(dev, b, full);
      size_t nonzero = 0;
      for (float x : got) nonzero += x != 0.0f;
      EXPECT_EQ(nonzero, 0u) << "the collective wrote into the buffer after it was released "
                                "and handed out again";
      EXPECT_FALSE(gate.opened_by_limit()) << "wait + release + allocate + zero waited for the collective";
      dev.release(b);
      dev.release(send);
      dev.synchronize();
    });
  }
}

}  // namespace
