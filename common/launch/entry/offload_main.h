// offload_main.h: stage 05's entry. Its training function receives stage
// 05's own flags (offload_options.h) beside the TrainConfig every stage
// reads; the other stages never see them.
#pragma once

#include <functional>

#include "offload_options.h"
#include "stage_main.h"

namespace zf {

using OffloadStageFn =
    std::function<RankResult(const TrainConfig&, const OffloadOptions&, RankContext&, const TokenData&, StepLog&)>;

// The stage with these options: a StageFn, as the harness runs every stage.
StageFn with_options(OffloadStageFn stage, OffloadOptions options);

// stage_main (stage_main.h) for stage 05: the parsed offload flags go to `stage`.
int stage_main(int argc, char** argv, const StageInfo& info, const OffloadStageFn& stage);

}  // namespace zf
