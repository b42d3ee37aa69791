// host_clock.h: the time of work a rank's device does not see, under a
// clock other than the wall's (--clock modeled, modeled/modeled_clock.h):
// an optimizer on the host's CPU, a thread of the host's own, a file's
// transfers. The code that does such work tells it here; on the wall clock
// there is none, and the work's time is simply the wall's.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "device.h"
#include "rank.h"
#include "run_hooks.h"

namespace zf {

class HostClock {
 public:
  virtual ~HostClock() = default;
  // `cpu` wrapped so that its work (an optimizer the CPU runs) is charged
  // to the rank's host, which issues the device's work too.
  virtual std::unique_ptr<Device> on_host(std::unique_ptr<Device> cpu) = 0;
  // A thread of the host's own (a delayed update): `work` wrapped so that
  // the host work it charges goes on a timeline of its own, forked from the
  // host's now; join(), once the thread is joined, makes the host wait for
  // that timeline's end.
  virtual std::function<void()> fork(std::function<void()> work) = 0;
  virtual void join() = 0;
  // A transfer of `bytes` between host memory and a file (a disk tier),
  // issued now by the calling thread (the host, or a forked work) and
  // queued behind the earlier ones on the disk: when it ends.
  virtual double disk(size_t bytes) = 0;
  // The calling thread's timeline waits until `t` (a transfer's end).
  virtual void wait_until(double t) = 0;
};

// The rank's host clock, or null on the wall clock.
inline HostClock* host_clock(const RankContext& ctx) { return ctx.hooks ? ctx.hooks->host_clock() : nullptr; }

}  // namespace zf
