// run_hooks.h: what the harness adds around one rank's run without the
// stage seeing it (rank.h's `hooks`). TrainingRun tells it where the steps
// begin, end and pause, and lets it replace a step's measured time;
// make_rank_compute lets it wrap the rank's compute. The harness's hooks
// are --inject-fault's failing compute (launch/injected_fault.h) and
// --clock modeled's clock (modeled/modeled_clock.h); a context made by hand
// has none.
#pragma once

#include <memory>

#include "model.h"
#include "step_log.h"

namespace zf {

class HostClock;  // host_clock.h
class RankCompute;  // rank_compute.h

class RunHooks {
 public:
  virtual ~RunHooks() = default;
  // The rank's compute, wrapped in what the run asks for around it.
  virtual std::unique_ptr<RankCompute> wrap(std::unique_ptr<RankCompute> rc, const ModelLayout& layout) = 0;
  // The steps begin, from `first_step`: nothing before (loading the states) counts.
  virtual void start(int first_step) = 0;
  // A step is done: its milliseconds and phases as the stage measured them,
  // which a clock other than the wall's replaces with its own.
  virtual void end_step(double& ms, StepPhases& phases) = 0;
  // What ran since the last step's end (the stop vote, a save) is no step's.
  virtual void skip() = 0;
  // The steps are over: nothing after (the final hash's gather) counts.
  virtual void stop() = 0;
  // The clock of the work the rank's device does not see (host_clock.h), or null.
  virtual HostClock* host_clock() = 0;
  // Whether the rank's states hold no values (a dry run: the modeled clock's
  // step with no arithmetic): nothing to load into them, no final hash.
  virtual bool dry() const = 0;
};

}  // namespace zf
