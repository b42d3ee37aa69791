// zero1.h: stage 01, ZeRO-1: shard the optimizer states.
//
// Against stage 00, one thing changes: each rank keeps AdamW's state for its
// 1/N of the model only (sharded_adamw.h). So the gradients are not
// all-reduced but reduce-scattered (each rank receives the summed gradient
// of its own piece, all it needs to update it), each rank updates its piece,
// and the updated pieces are all-gathered into every rank's full parameters.
// reduce_scatter + all_gather move exactly what an all_reduce moves.
//
// Memory per rank: fp32 8P + 8P/N, bf16 4P + 12P/N (plus padding).
#pragma once

#include "stage_main.h"

namespace zf {

RankResult train_zero1(const TrainConfig& cfg, RankContext& ctx, const TokenData& data,
                       StepLog& log);

}  // namespace zf
