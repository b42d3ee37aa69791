// stage_main.h: what every stage includes of the harness (launch/entry/ is all
// a stage sees of it). A stage is a function run on every rank (its
// StageFn; stage 05's also receives its own flags, offload_main.h);
// stage_main is its executable's main(): flags, the ranks, the
// closing tables, the exit code. Everything else a stage uses is the course:
// core/, comm/, train/ (docs/ARCHITECTURE.md).
#pragma once

#include <functional>
#include <string>

#include "config.h"
#include "data.h"
#include "rank.h"
#include "step_log.h"

namespace zf {

// The groups of stage-specific flags (docs/SPEC.md): a stage registers the
// ones it has; every other stage refuses them, naming the stage that has them.
// StageFlags::offload includes the FSDP flags.
enum class StageFlags { none, fsdp, offload };

struct StageInfo {
  std::string exe;          // "dp"
  std::string title;        // "stage 00: data parallel"
  StageFlags flags = StageFlags::none;
};

// One rank's training: the stage's loop. `log` reports each step (rank 0).
using StageFn = std::function<RankResult(const TrainConfig&, RankContext&, const TokenData&, StepLog&)>;

// main() of a stage executable: the BLAS's kernels, flags, stop handlers,
// the ranks, the tables, the exit code (0 ok, 2 usage error, 3 out of
// memory, 4 an output not written, 128 + N stopped by signal N, 1 any other
// failure; docs/SPEC.md "Exit codes").
int stage_main(int argc, char** argv, const StageInfo& info, const StageFn& stage);

}  // namespace zf
