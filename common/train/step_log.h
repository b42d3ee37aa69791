// step_log.h: where a stage's run reports each step it finishes. The frame
// (frame/report.h's StepReporter) prints the step line and writes the run
// log; rank 0 alone calls it.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm.h"
#include "device.h"

namespace zf {

// Where a step's wall time went, phase by phase, in milliseconds (offload's:
// forward, backward, the CPU optimizer, the wait for a delayed update,
// host->device, and the rest); empty for the stages that do not split
// their steps.
using StepPhases = std::vector<std::pair<std::string, double>>;

// A clock other than the wall's (--clock modeled, frame/modeled_clock.h):
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
  // `cpu` wrapped so that its work (stage 05's CPU optimizer) is charged to
  // the rank's host, which issues the device's work too.
  virtual std::unique_ptr<Device> on_host(std::unique_ptr<Device> cpu) = 0;
  // A thread of the host's own (stage 05's delayed update): `work` wrapped
  // so that the host work it charges goes on a timeline of its own, forked
  // from the host's now; join(), once the thread is joined, makes the host
  // wait for that timeline's end.
  virtual std::function<void()> fork(std::function<void()> work) = 0;
  virtual void join() = 0;
  // A transfer of `bytes` between host memory and a file (stage 05's disk
  // tier), issued now by the calling thread (the host, or a forked work)
  // and queued behind the earlier ones on the disk: when it ends.
  virtual double disk(size_t bytes) = 0;
  // The calling thread's timeline waits until `t` (a transfer's end).
  virtual void wait_until(double t) = 0;
  // The forward (or backward) of the unit named `unit` begins (begin) or
  // ends: --trace under the modeled clock draws it over its ops.
  virtual void unit(bool /*begin*/, bool /*forward*/, const std::string& /*unit*/) {}
};

class StepLog {
 public:
  virtual ~StepLog() = default;
  // step counts from 0; loss is the global-batch mean; grad_norm the global
  // L2 norm of the averaged gradient before clipping; lr the step's learning
  // rate; ms the step's wall time.
  virtual void step(int step, float loss, float grad_norm, float lr, double ms, size_t model_state_bytes_per_rank,
                    const StepPhases& phases) = 0;
  // The held-out loss after `steps_done` steps, over `sequences` sequences;
  // ms its wall time; comm its collectives' bytes and calls (not training's).
  virtual void validation(int steps_done, float loss, long sequences, double ms, const CommStats& comm) = 0;
  // A text sample after `steps_done` steps: the prompt and what the model wrote after it.
  virtual void sample(int steps_done, const std::string& prompt, const std::string& text) = 0;
  // A checkpoint of `steps_done` steps is on disk at `path`: the training
  // waited stall_ms for it, and writing it took write_ms (the same, unless
  // it was written in the background, --save-async).
  virtual void saved(int steps_done, const std::string& path, double stall_ms, double write_ms) = 0;
  // The states were read from `path` (--resume, --init) in ms, on rank 0.
  virtual void loaded(const std::string& path, double ms) = 0;
};

}  // namespace zf
