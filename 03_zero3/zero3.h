// zero3.h: stage 03, ZeRO-3: also shard the parameters.
//
// Against stage 02: a rank keeps only its piece of every unit's parameters.
// Before a unit's forward, and again before its backward, the unit is
// unsharded: its parameters are all-gathered into a temporary buffer (the
// next unit's all-gather is started while this one computes) that is freed
// right after use (resharded). Gradients are reduce-scattered as in stage
// 02; the optimizer (stage 01's) updates the parameter piece in place, and
// no all-gather follows the step.
//
// Memory per rank: 16P/N in both recipes (plus padding), plus at most two
// units' gathered parameters (category gathered) and two units' gradient
// buffers (category comm).
// Communication: two all-gathers and one reduce-scatter of the parameters'
// size per micro-step; at K = 1, 1.5x data parallel's one all-reduce.
#pragma once

#include "stage_main.h"

namespace zf {

// The most units whose parameters are gathered at any moment (the one being
// computed and the one prefetched).
constexpr int kZero3MaxGatheredUnits = 2;

RankResult train_zero3(const TrainConfig& cfg, RankContext& ctx, const TokenData& data,
                       StepLog& log);

}  // namespace zf
