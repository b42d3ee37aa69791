// comm_state.h: what a CommHandle points at (private to the comm backends).
//
// A pending collective is a small shared state: the issuing thread holds it
// through its CommHandle, the backend's communication thread (or watchdog)
// finishes it. It is done once, with or without an error; wait_host() blocks
// on the condition variable until then and rethrows the error (for example
// CommAborted), as often as it is called.
//
// device_wait is the hook that makes CommHandle::wait() a device-side wait
// (comm.h): a backend whose collectives run on a GPU stream (comm_nccl_collectives.cpp)
// sets it to "make the caller's compute stream wait for this collective's
// done event". wait() calls it, with mu not held, while the collective is not
// done; it returns true when the stream now waits (the host goes on), false
// when it cannot order the stream (the communicator has failed, or the
// collective has just left the backend's queue): wait() then waits on the
// host, as the backends without the hook always do. Backends include this
// file; stages only see comm.h.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "comm.h"

namespace zf {

// Waits on cv (with lock held) until pred() or the deadline; false on the
// deadline. It first gives up the core a few times before it sleeps: the
// thread waited for usually gets there within microseconds, while a wake-up
// from sleep costs tens (an interrupt to another core, more inside a virtual
// machine). A yield, not a spin: where threads outnumber cores it hands the
// core to the thread it waits for. A collective's waits (the hand-off to the
// communication thread, the barriers, the caller's wait) go through here.
template <class Pred>
bool wait_for_peer(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                   std::chrono::steady_clock::time_point deadline, Pred pred) {
  if (pred()) return true;  // already there: no clock read, no yield
  constexpr auto kYieldFor = std::chrono::microseconds(50);
  const auto until = std::chrono::steady_clock::now() + kYieldFor;
  do {
    if (std::chrono::steady_clock::now() >= until) {
      if (deadline == std::chrono::steady_clock::time_point::max()) {
        cv.wait(lock, pred);
        return true;
      }
      return cv.wait_until(lock, deadline, pred);
    }
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  } while (!pred());
  return true;
}

struct CommHandle::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;  // null when the collective succeeded

  // Set by the backend before the handle is returned, never changed after
  // (so wait() may call it without the lock). Empty: wait() is wait_host().
  std::function<bool()> device_wait;

  // Set by a decorator before the handle is returned, never changed after:
  // called first thing in every wait() and wait_host() of the handle, by the
  // thread that waits (the schedule recorder, comm_recording.h, logs when a
  // stage waits). Empty for every backend.
  std::function<void()> on_wait;

  // Called once by the backend when the collective has completed or failed.
  void finish(std::exception_ptr err = nullptr) {
    {
      std::lock_guard<std::mutex> lock(mu);
      error = std::move(err);
      done = true;
    }
    cv.notify_all();
  }
};

}  // namespace zf
