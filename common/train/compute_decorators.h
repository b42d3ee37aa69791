// compute_decorators.h: what can be wrapped around a rank's compute
// (rank_compute.h) without the stage or the model knowing.
//
//   maybe_faulty    --inject-fault R:S: rank R throws in the middle of step S,
//                   right after the head's backward (the first unit of the
//                   backward), while the other ranks go on into the step's
//                   collectives: the tests' way to show that a failing rank
//                   stops the others instead of leaving them waiting;
//                   --inject-fault R:S:stall: rank R stops there for good
//                   instead, and the others' collectives time out
//   maybe_recorded  a schedule test's recorder (comm_recording.h) as the
//                   rank's communicator: each load, and each unit's forward
//                   and backward, begin and end, go into its log beside the
//                   collectives, and so does the recomputation inside a
//                   block's backward under --recompute
//
// Each returns `inner` itself when the run does not ask for it.
#pragma once

#include <memory>

#include "comm.h"
#include "config.h"
#include "model.h"
#include "rank_compute.h"

namespace zf {

std::unique_ptr<RankCompute> maybe_faulty(std::unique_ptr<RankCompute> inner, const TrainConfig& cfg,
                                          const ModelLayout& layout, int rank);
std::unique_ptr<RankCompute> maybe_recorded(std::unique_ptr<RankCompute> inner, Communicator& comm);

}  // namespace zf
