// comm_state.h: what a CommHandle points at (private to the comm backends).
//
// A pending collective is a small shared state: the issuing thread holds it
// through its CommHandle, the backend's communication thread finishes it. It
// is done once, with or without an error; wait() blocks on the condition
// variable until then and rethrows the error (for example CommAborted), as
// often as it is called. Backends include this file; stages only see comm.h.
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>

#include "comm.h"

namespace zf {

struct CommHandle::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;  // null when the collective succeeded

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
