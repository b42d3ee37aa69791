// data_parallel.h: stage 00, plain data parallelism (PyTorch DDP's scheme).
//
// Every rank holds the whole model: parameters, gradients and AdamW state
// (16P bytes in both recipes). Each rank runs forward and backward on its own
// micro-batches; as soon as a unit's backward is done on the last micro-step,
// its gradient buffer is all-reduced asynchronously while the backward of the
// next unit runs; then every rank applies the same AdamW update to its
// replica. Communication per step: one all-reduce of P gradients, 2(N-1)/N * P
// elements per rank in the ring model.
#pragma once

#include "stage_main.h"

namespace zf {

RankResult train_data_parallel(const TrainConfig& cfg, RankContext& ctx, const TokenData& data,
                               StepLog& log);

}  // namespace zf
