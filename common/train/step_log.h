// step_log.h: where a stage's run reports each step it finishes. The harness
// (report/report.h's StepReporter) prints the step line and writes the run
// log; rank 0 alone calls it.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "comm.h"

namespace zf {

// Where a step's time went, phase by phase, in milliseconds, for a stage
// that splits its step ("fwd", "bwd", ...); empty for the others.
using StepPhases = std::vector<std::pair<std::string, double>>;

class StepLog {
 public:
  virtual ~StepLog() = default;
  // step counts from 0; loss is the global-batch mean; grad_norm the global
  // L2 norm of the averaged gradient before clipping; lr the step's learning
  // rate; ms the step's time (the wall's, or the harness's clock's).
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
