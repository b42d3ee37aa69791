// fsdp.h: stage 04, FSDP: ZeRO-3 with FSDP's units, storage and knobs.
//
// Against stage 03:
// - units: --wrap-blocks K blocks share one flat, padded, sharded parameter
//   (flat_units.h); the head, the last unit of forward, stays gathered into
//   its backward (stage 03 frees it and gathers it again at once);
// - storage: float32 parameter and gradient shards in both recipes, cast to
//   bf16 before the all-gather under --precision bf16, and reduce-scattered
//   in --reduce-dtype (FSDP2's mixed-precision policy; flat_params.h,
//   flat_grads.h);
// - --reshard-after-forward false keeps every unit gathered from its forward
//   to its backward: no backward all-gathers;
// - --prefetch D units ahead, at most --max-gathered M units gathered;
// - --no-sync: gradients accumulated unsharded over the micro-steps and
//   reduce-scattered once;
// - two queues: reduce-scatters on a communicator split from the rank's, so
//   an all-gather never waits behind one;
// - --shard-group S: shard within groups of S ranks, all-reduce the reduced
//   pieces across the N/S groups (hybrid sharding).
//
// Memory per rank: 16P/N in both recipes (4 + 4 + 8 bytes per element of
// the shard; 16P/S with --shard-group S), plus padding; gathered parameters (category gathered) at most
// M units plus the head, or the whole model without resharding.
#pragma once

#include "runner.h"

namespace zf {

RankResult train_fsdp(const TrainConfig& cfg, RankContext& ctx, const TokenData& data, StepReporter& reporter);

}  // namespace zf
