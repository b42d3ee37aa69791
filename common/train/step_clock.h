// step_clock.h: a clock other than the wall's (--clock modeled:
// modeled/modeled_clock.h). The run asks it for each step's time; the device
// and the communicator it decorates charge it for their work; the work the
// device does not see (an optimizer on the host's CPU, a thread of the
// host's own, a file's transfers) is told to it by the code that does it.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "device.h"
#include "step_log.h"

namespace zf {

// A clock other than the wall's (--clock modeled, modeled/modeled_clock.h):
// at the end of each step the run asks it how long the step took and where
// the time went, in place of what the stage measured.
class StepClock {
 public:
  virtual ~StepClock() = default;
  // The steps begin, from `first_step`: nothing before (loading the states) counts.
  virtual void start(int first_step) = 0;
  // Milliseconds since the last lap (or the start), and where they went (replaces `phases`).
  virtual double lap(StepPhases& phases) = 0;
  // What ran since the last lap (the stop vote, a save) is no step's.
  virtual void skip() = 0;
  // The steps are over: nothing after (the final hash's gather) counts.
  virtual void stop() = 0;
  // `cpu` wrapped so that its work (an optimizer the CPU runs) is charged
  // to the rank's host, which issues the device's work too.
  virtual std::unique_ptr<Device> on_host(std::unique_ptr<Device> cpu) = 0;
  // A thread of the host's own (a delayed update): `work` wrapped
  // so that the host work it charges goes on a timeline of its own, forked
  // from the host's now; join(), once the thread is joined, makes the host
  // wait for that timeline's end.
  virtual std::function<void()> fork(std::function<void()> work) = 0;
  virtual void join() = 0;
  // A transfer of `bytes` between host memory and a file (a disk tier),
  // issued now by the calling thread (the host, or a forked work)
  // and queued behind the earlier ones on the disk: when it ends.
  virtual double disk(size_t bytes) = 0;
  // The calling thread's timeline waits until `t` (a transfer's end).
  virtual void wait_until(double t) = 0;
  // The forward (or backward) of the unit named `unit` begins (begin) or
  // ends: --trace under the modeled clock draws it over its ops.
  virtual void unit(bool /*begin*/, bool /*forward*/, const std::string& /*unit*/) {}
};

}  // namespace zf
