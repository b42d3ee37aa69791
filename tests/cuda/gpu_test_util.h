// gpu_test_util.h: what every GPU test suite shares: why there is no usable
// CUDA device (empty when there is one), how many GPUs are visible, and the
// skip that every GPU test starts with, so a run without a GPU says why.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
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
struct Stall {
  int ms;
};
inline void CUDART_CB sleep_on_stream(void* p) {
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<Stall*>(p)->ms));
}

// Holding a stream until the host says so, for tests of what does not wait
// for the GPU: StreamGate gate(stream) holds the stream at that point until
// gate.open() (or the gate's end). A host that waited for the stream before
// opening would wait for ever, so the gate also opens by itself after
// `limit`, and says so (opened_by_limit): no timing of its own to flake.
// The state is shared with the host function, so a test that fails early
// frees nothing the stream still waits on.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream, std::chrono::milliseconds limit = std::chrono::seconds(10))
      : stream_(stream), state_(std::make_shared<State>()) {
    state_->limit = limit;
    auto* ref = new std::shared_ptr<State>(state_);
    if (cudaLaunchHostFunc(stream, wait_open, ref) != cudaSuccess) {
      delete ref;
      throw std::runtime_error("test: cudaLaunchHostFunc failed");
    }
  }
  ~StreamGate() { open(); }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  void open() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->opened = true;
    }
    state_->cv.notify_all();
  }
  // Whether the stream is still held (it has work left: the gate's, at
  // least), so that a test can check it tested what it meant to.
  bool holds() const { return cudaStreamQuery(stream_) == cudaErrorNotReady; }
  // Whether the stream went on by the limit, before open(): meaningful once
  // the stream has passed the gate (after a synchronize).
  bool opened_by_limit() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->timed_out;
  }

 private:
  struct State {
    std::chrono::milliseconds limit{};
    std::mutex mu;
    std::condition_variable cv;
    bool opened = false, timed_out = false;
  };
  static void CUDART_CB wait_open(void* p) {
    const std::unique_ptr<std::shared_ptr<State>> ref(static_cast<std::shared_ptr<State>*>(p));
    State& g = **ref;
    std::unique_lock<std::mutex> lock(g.mu);
    if (!g.cv.wait_for(lock, g.limit, [&g] { return g.opened; })) g.timed_out = true;
  }
  cudaStream_t stream_;
  std::shared_ptr<State> state_;
};

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
