// gpu_test_util.h: what every GPU test suite shares: why there is no usable
// CUDA device (empty when there is one), how many GPUs are visible, and the
// skip that every GPU test starts with, so a run without a GPU says why.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "kernels_cuda.h"

namespace zf::test {

inline const std::string& no_device_reason() {
  static const std::string reason = zf::cuda_unavailable_reason();
  return reason;
}

inline int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

// Stalling a stream from the host, for tests that check what does or does
// not wait for the GPU: cudaLaunchHostFunc(stream, sleep_on_stream, &stall)
// keeps the stream busy for stall.ms milliseconds.
using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
struct Stall {
  int ms;
};
inline void CUDART_CB sleep_on_stream(void* p) {
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<Stall*>(p)->ms));
}

// Holding a stream until the host says so: cudaLaunchHostFunc(stream,
// hold_until_open, &gate) keeps the stream busy until gate.open(). A host
// that waited for the stream before opening would wait for ever, so the
// gate also opens by itself after `limit`, and says so (timed_out): a test
// of what does not wait for the GPU, with no timing of its own to flake.
struct Gate {
  std::chrono::milliseconds limit{10000};
  std::mutex mu;
  std::condition_variable cv;
  bool opened = false, timed_out = false;
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu);
      opened = true;
    }
    cv.notify_all();
  }
  bool opened_by_limit() {
    std::lock_guard<std::mutex> lock(mu);
    return timed_out;
  }
};
inline void CUDART_CB hold_until_open(void* p) {
  auto* g = static_cast<Gate*>(p);
  std::unique_lock<std::mutex> lock(g->mu);
  if (!g->cv.wait_for(lock, g->limit, [g] { return g->opened; })) g->timed_out = true;
}

}  // namespace zf::test

#define SKIP_WITHOUT_GPU()                     \
  if (!::zf::test::no_device_reason().empty()) \
  GTEST_SKIP() << "no CUDA device: " << ::zf::test::no_device_reason()

// For the few tests that mean something only on a real GPU (a timing at
// full size): on the emulated GPU (tests/emu) they skip with the reason.
#if defined(ZF_GPU_EMULATED)
#define SKIP_ON_EMULATED_GPU(why) GTEST_SKIP() << "on the emulated GPU: " << why
#else
#define SKIP_ON_EMULATED_GPU(why) \
  do {                            \
  } while (false)
#endif
