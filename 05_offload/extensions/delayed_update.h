// delayed_update.h: ZeRO-Offload's delayed parameter update (DPU,
// --delay-update): the CPU update of one step runs on a worker thread
// while the device computes the next step with the parameters it has.
//
// The rank's loop (offload.cpp) gives the update to launch() and goes on;
// it calls finish() before it touches what the update writes (the host's
// float32 shards, moments and bf16 copy: before the upload of the result,
// a checkpoint, the final hash). One update is in flight at most. An
// exception of the update is caught on the worker and thrown again by
// finish() on the rank's thread, where the run's failure handling is
// (RankFailureGuard); the destructor waits for the worker and drops its
// error, so that a rank failing meanwhile for another reason neither
// terminates the process nor frees the states under the running update.
// Under the modeled clock the worker is a timeline of the host's own
// (HostClock::fork), which the host waits for at finish().
#pragma once

#include <exception>
#include <functional>
#include <thread>

#include "host_clock.h"

namespace zf::extensions {

class DelayedUpdate {
 public:
  explicit DelayedUpdate(HostClock* clock) : clock_(clock) {}
  DelayedUpdate(const DelayedUpdate&) = delete;
  DelayedUpdate& operator=(const DelayedUpdate&) = delete;
  ~DelayedUpdate();

  // Runs `update` on the worker thread. Requires no update in flight.
  void launch(std::function<void()> update);
  // Waits for the update in flight, if any, and throws its exception here.
  // Idempotent: a second call returns at once.
  void finish();
  // After finish(): whether an update finished whose result has not been
  // taken yet (the loop then uploads it); clears it. ms: the update's time
  // on the worker.
  bool take(double* ms);

 private:
  HostClock* clock_;  // null on the wall clock
  std::thread worker_;
  std::exception_ptr error_;
  double ms_ = 0;     // written by the worker, read after the join
  bool result_ = false;
};

}  // namespace zf::extensions
