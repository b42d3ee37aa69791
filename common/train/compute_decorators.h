// compute_decorators.h: what can be wrapped around a rank's compute
// (rank_compute.h) without the model knowing: the first by
// make_rank_compute, without the stage knowing either; timed by a stage.
// The harness wraps it too (run_hooks.h): --inject-fault's failing compute,
// the modeled clock's unit spans.
//
//   maybe_recorded  a schedule test's recorder (comm_recording.h) as the
//                   rank's communicator: each load, and each unit's forward
//                   and backward, begin and end, go into its log beside the
//                   collectives, and so does the recomputation inside a
//                   block's backward under --recompute
//   timed           the wall time of a step's forward and backward, for a
//                   stage that splits its step into phases (StepTimes)
//
// maybe_recorded returns `inner` itself when the run is not recorded.
#pragma once

#include <memory>

#include "comm.h"
#include "model.h"
#include "rank_compute.h"

namespace zf {

std::unique_ptr<RankCompute> maybe_recorded(std::unique_ptr<RankCompute> inner, Communicator& comm);

// Milliseconds on the rank's thread, summed over a step's micro-batches:
// the forward, from the end of the micro-batch's load to the end of its
// last unit's forward (the all-gathers waited for on the way included),
// and the backward, from there to the end of unit 0's backward, the last
// it computes. What the stage waits for after that (the last reductions,
// their copies) is in neither. Forwards of held-out batches and samples
// count in neither.
struct StepTimes {
  double forward = 0, backward = 0;
};
std::unique_ptr<RankCompute> timed(std::unique_ptr<RankCompute> inner, StepTimes& times);

}  // namespace zf
