// test_device_cuda.cpp: the GPU Device's memory (common/cuda/device_cuda.cu): the
// stream-ordered allocator, its out-of-memory path into the MemoryTracker's
// error, and offload's asynchronous copies and pinned memory (the checks of
// tests/core/transfer_checks.h, which the CPU device passes too). Part of
// the gpu_kernels suite; skips without a GPU.
//
//   build/tests/test_gpu_kernels --gtest_filter='CudaDeviceMemory*'
//
// How the "no device sync" tests see it: a host function put on a stream
// (StreamGate, gpu_test_util.h) holds that stream's later work back until
// the host opens it. A release that waited for the GPU (cudaFree waits for
// every stream) would wait until the gate's limit, which the gate reports;
// a stream-ordered one returns at once.
#include <gtest/gtest.h>

#include "cuda/gpu_test_util.h"
#include "core/transfer_checks.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "device.h"
#include "kernels_cuda.h"
#include "memory.h"

namespace {

using zf::test::StreamGate;

// Rank 0's device on GPU 0, current on this thread.
std::unique_ptr<zf::Device> gpu0() {
  auto dev = zf::make_cuda_device(0);
  dev->make_current();
  return dev;
}

cudaStream_t stream_of(zf::Device& dev) { return static_cast<cudaStream_t>(dev.native_stream()); }

// Write with op A (a copy on a stream held shut), release, allocate again:
// the host never waits, and what is written into the new
// buffer lands after A. The pool usually hands the same block back (on the
// same stream the free is ordered before the new allocation), which is what
// makes the last check bite; CUDA allows but does not promise that reuse
// ("the allocator is free to reallocate the memory as long as ...", runtime
// API, Stream Ordered Memory Allocator), so another block is only noted.
TEST(CudaDeviceMemory, ReuseOnTheStreamWithoutWaitingForIt) {
  SKIP_WITHOUT_GPU();
  auto dev = gpu0();
  const size_t n = 1 << 18, bytes = n * sizeof(float);
  std::vector<float> ones(n, 1.0f), got(n, -1.0f);
  void* src = dev->allocate(bytes);
  void* p = dev->allocate(bytes);
  ASSERT_NE(src, nullptr);
  ASSERT_NE(p, nullptr);
  dev->to_device(src, ones.data(), bytes);  // synchronizes

  StreamGate gate(stream_of(*dev));
  dev->copy(p, src, bytes);  // A: p = 1.0f everywhere, once the gate opens
  dev->release(p);
  void* q = dev->allocate(bytes);
  ASSERT_NE(q, nullptr);
  dev->zero(q, bytes);  // after A in stream order, whatever the address
  EXPECT_TRUE(gate.holds()) << "the gate did not hold the stream";
  gate.open();
  // The pool's cache at work (same stream, same size, the block just freed),
  // usually: the XML report says whether the order below was exercised.
  ::testing::Test::RecordProperty("reused_block", q == p ? "yes" : "no");
  if (q != p) std::cout << "  note: the pool handed out another block; the order was not exercised\n";
  dev->to_host(got.data(), q, bytes);  // synchronizes: after the gate
  EXPECT_FALSE(gate.opened_by_limit()) << "copy + release + allocate + zero waited for the held stream";
  size_t nonzero = 0;
  for (float x : got) nonzero += x != 0.0f;
  EXPECT_EQ(nonzero, 0u) << "the new buffer was written before the old one's last write (A)";
  dev->release(q);
  dev->release(src);
  dev->synchronize();
}

// A release on the compute stream does not wait for another stream's work
// (cudaFree may synchronize the device, and does when other streams have
// work), and neither does an allocation the pool's cache serves.
TEST(CudaDeviceMemory, ReleaseDoesNotWaitForOtherStreams) {
  SKIP_WITHOUT_GPU();
  auto dev = gpu0();
  void* p = dev->allocate(1 << 20);
  ASSERT_NE(p, nullptr);
  dev->synchronize();
  cudaStream_t other;
  CUDA_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  {
    StreamGate gate(other);
    dev->release(p);
    void* q = dev->allocate(1 << 20);  // from the pool's cache
    EXPECT_NE(q, nullptr);
    dev->release(q);
    EXPECT_TRUE(gate.holds()) << "the gate did not hold the other stream";
    gate.open();
    CUDA_CHECK(cudaStreamSynchronize(other));
    EXPECT_FALSE(gate.opened_by_limit()) << "release/allocate waited for another stream";
  }
  CUDA_CHECK(cudaStreamDestroy(other));
  dev->synchronize();
}

// More than the GPU has: the allocator says so (nullptr), the tracker raises
// its OutOfMemory naming what was asked for, and the device works on after
// it: the failed call's error is not left as the thread's last error (a
// kernel launch checked with cudaGetLastError right after must not report
// it). Whatever code the runtime gives a size it cannot serve
// (cudaMallocFromPoolAsync lists out of memory and cudaErrorInvalidValue),
// the result is the tracker's message.
TEST(CudaDeviceMemory, MoreThanTheGpuHasIsTheTrackersOutOfMemory) {
  SKIP_WITHOUT_GPU();
  auto dev = gpu0();
  // What this process's pool keeps from earlier tests counts as used in
  // cudaMemGetInfo, but allocate() hands it back before it gives up: hand
  // it back first, so that "more than is free" below is really more.
  cudaMemPool_t pool = nullptr;
  CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  zf::MemoryTracker mem(0);  // no budget: only the GPU can refuse
  mem.set_device(dev.get());
  // More than is free but less than the GPU has (halfway: the driver
  // itself must refuse it, and the pool's trim-and-retry runs), more than
  // the GPU has at all (refused without asking), and a size no GPU has.
  ASSERT_GT(total_bytes, free_bytes);  // this process's context alone uses some
  for (size_t ask : {free_bytes + (total_bytes - free_bytes) / 2,
                     total_bytes + (size_t(1) << 30), size_t(1) << 62}) {
    SCOPED_TRACE("asking for " + zf::format_bytes(ask) + " of a GPU with " +
                 zf::format_bytes(total_bytes) + " (" + zf::format_bytes(free_bytes) + " free)");
    EXPECT_EQ(dev->allocate(ask), nullptr);
    EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess) << "the refused allocation left its error behind";
    try {
      mem.allocate(zf::Place::device, zf::Category::activations, ask);
      ADD_FAILURE() << "the allocation succeeded";
    } catch (const zf::OutOfMemory& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("the system refused " + zf::format_bytes(ask) + " for activations"),
                std::string::npos)
          << what;
    }
    EXPECT_EQ(mem.counts().cur(zf::Place::device, zf::Category::activations), 0u)
        << "a refused allocation stayed counted";
  }
  // The device goes on: a small allocation, zeroed (the tracker zero-fills
  // on the stream), a kernel (checked with cudaGetLastError) that doubles
  // it in place, read back.
  void* p = mem.allocate(zf::Place::device, zf::Category::workspace, 4096);
  EXPECT_NO_THROW(dev->add(p, p, zf::DType::f32, 4096 / sizeof(float)));
  std::vector<uint8_t> back(4096, 0xAB);
  dev->to_host(back.data(), p, back.size());
  EXPECT_EQ(back, std::vector<uint8_t>(4096, 0));
  mem.release(zf::Place::device, zf::Category::workspace, p, 4096);
  dev->synchronize();
}

// The threads backend on device buffers (comm_threads_cuda.cu) checks each
// buffer with cudaPointerGetAttributes: it takes anything but unregistered
// host memory, and device memory only of its group's GPUs. The Devices'
// memory comes from the stream-ordered pool; the runtime documents
// cudaMemoryTypeDevice for "device memory" and the GPU it resides on,
// without naming pools. This says so for pool memory, so that a stage on
// the GPU that fails that check points here.
TEST(CudaDeviceMemory, PoolMemoryIsDeviceMemoryToPointerAttributes) {
  SKIP_WITHOUT_GPU();
  auto dev = gpu0();
  void* p = dev->allocate(1 << 20);
  ASSERT_NE(p, nullptr);
  for (void* q : {p, static_cast<void*>(static_cast<char*>(p) + 4096)}) {
    cudaPointerAttributes a{};
    ASSERT_EQ(cudaPointerGetAttributes(&a, q), cudaSuccess);
    EXPECT_EQ(a.type, cudaMemoryTypeDevice);
    EXPECT_EQ(a.device, dev->ordinal());
  }
  dev->release(p);
  dev->synchronize();
}

}  // namespace

// Offload's copies on the copy stream and pinned memory (cudaHostAlloc):
// the checks the CPU device passes (tests/core/transfer_checks.h).
TEST(CudaDeviceTransfers, CopiesRoundTripAndAreCounted) {
  SKIP_WITHOUT_GPU();
  zf::test::expect_copies_round_trip(*gpu0());
}
TEST(CudaDeviceTransfers, CopiesAreOrderedAfterTheComputeStream) {
  SKIP_WITHOUT_GPU();
  zf::test::expect_copies_ordered(*gpu0());
}
TEST(CudaDeviceTransfers, ADroppedTransferWaits) {
  SKIP_WITHOUT_GPU();
  zf::test::expect_a_dropped_transfer_waits(*gpu0());
}
TEST(CudaDevice, AccumulateWidensAndAdds) {
  SKIP_WITHOUT_GPU();
  zf::test::expect_accumulate_widens_and_adds(*gpu0());
}
TEST(CudaDevice, FoldAddsAndRoundsToNearestEven) {
  SKIP_WITHOUT_GPU();
  zf::test::expect_fold_adds_and_rounds_to_nearest_even(*gpu0());
}
