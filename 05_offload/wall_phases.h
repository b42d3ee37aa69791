// wall_phases.h: where the wall time of stage 05's step went, for the step
// line and the run log (phases_ms), measured by decorators as the modeled
// clock measures its own, so that the loop holds no timer:
//
//   fwd, bwd    the rank's compute, timed (compute_decorators.h)
//   cpu adamw   the host CPU's AdamW calls, timed (timed_host below); with
//               --delay-update (extensions/) the worker's whole job for the
//               update that ran during the step (with --offload-dir its file
//               I/O too), off the rank's path
//   adamw wait  --delay-update, from the second step: the rank's wait for
//               that update
//   wait        the rest of the step: the loads, the last reductions and
//               their copies to the host, the wait for the uploads, the
//               loss and the norm
//
// Under --clock modeled the clock's phases replace these (training_run.h).
#pragma once

#include <atomic>
#include <memory>
#include <optional>

#include "compute_decorators.h"
#include "device.h"
#include "step_log.h"

namespace zf {

class WallPhases {
 public:
  // The rank's compute, its forward and backward timed.
  std::unique_ptr<RankCompute> timed_compute(std::unique_ptr<RankCompute> rc) { return timed(std::move(rc), compute_); }
  // The host's CPU device, its AdamW timed.
  std::unique_ptr<Device> timed_host(std::unique_ptr<Device> host);
  // --delay-update: this step's update ran on a worker for worker_ms, and
  // the rank waited wait_ms for it.
  void off_path(double worker_ms, double wait_ms) { off_path_ = {worker_ms, wait_ms}; }
  // The step's phases (step_ms: its wall time), and a fresh start for the next step.
  StepPhases lap(double step_ms);

 private:
  struct OffPath {
    double worker_ms, wait_ms;
  };
  StepTimes compute_;
  std::atomic<int64_t> adamw_ns_{0};  // added to by whichever thread runs the update
  std::optional<OffPath> off_path_;
};

}  // namespace zf
