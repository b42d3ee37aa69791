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

#include "runner.h"
#include "shard.h"
#include "sharded_adamw.h"

namespace zf {

// Stages 01 and 02 keep whole parameters in the padded layout (each unit
// padded to N pieces). Fills them, and the optimizer's float32 master
// pieces, with the initial model (writing --save-init on rank 0); with
// --resume, also the optimizer's moments. Returns the step to start at.
int init_padded_params(const TrainConfig& cfg, const ModelLayout& layout, const ShardLayout& shards,
                        RankContext& ctx, void* params, ShardedAdamW& opt);

RankResult train_zero1(const TrainConfig& cfg, RankContext& ctx, const TokenData& data,
                       StepReporter& reporter);

}  // namespace zf
