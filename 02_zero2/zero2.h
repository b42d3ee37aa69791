// zero2.h: stage 02, ZeRO-2: also shard the gradients.
//
// Against stage 01: a rank no longer keeps a full gradient buffer. Each
// unit's gradient is computed into a temporary buffer, reduce-scattered as
// soon as the unit's backward is done (while the next unit's backward runs),
// and the buffer is released; only the rank's gradient piece is kept, and it
// accumulates across micro-steps. The optimizer is stage 01's, unchanged.
//
// Memory per rank: fp32 4P + 12P/N, bf16 2P + 14P/N (plus padding), plus at
// most two units' temporary gradient buffers (category comm).
#pragma once

#include "stage_main.h"

namespace zf {

RankResult train_zero2(const TrainConfig& cfg, RankContext& ctx, const TokenData& data,
                       StepLog& log);

}  // namespace zf
