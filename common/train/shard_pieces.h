// shard_pieces.h: what every sharded stage computes over a rank's pieces
// (shard.h) besides its update: the gradient norm over them, and the whole
// model gathered back from them.
#pragma once

#include <functional>
#include <vector>

#include "adamw.h"
#include "comm.h"
#include "device.h"
#include "model.h"
#include "shard.h"

namespace zf {

// The global gradient norm and the clipping coefficient from it, computed
// from every rank's gradient pieces (grad_piece(u): S_u elements of dtype in
// memory of dev) with an exact sum, so both equal data parallel's to the
// bit. The norm is computed (one small all_reduce) even when clip is 0.
// comm_dev: the rank's device, which the all_reduce stages through (dev
// itself, unless the pieces are in host memory).
GradClip clip_scale(const ShardLayout& shards, Device& dev, Device& comm_dev, Communicator& comm,
                    const std::function<const void*(int)>& grad_piece, DType dtype, float clip);

// The whole model as float32 in consolidated order, gathered from every
// rank's pieces (one all_gather per unit): on every rank, or, when
// every_rank is false, on comm's rank 0 alone (the others pass each unit
// through and return nothing: a checkpoint's write needs one copy, not N).
// copy_piece(u, host) writes this rank's float32 piece of unit u (its real
// elements, S_u or fewer) into host memory; dev is the rank's device, which
// the collectives stage through. For the final parameter hash and
// checkpoints; uses untracked host memory, so call it after the memory
// counts are taken.
std::vector<float> gather_full_model(Communicator& comm, Device& dev, const ModelLayout& layout,
                                     const ShardLayout& shards,
                                     const std::function<void(int, float*)>& copy_piece, bool every_rank = true);

}  // namespace zf
