// sharded_adamw.h: what is new in ZeRO-1, the optimizer state cut into N shards.
//
// Each rank keeps AdamW's moments (and, in the bf16 recipe, the float32
// master weights) for its own piece of every unit only (shard.h): 8 or 12
// bytes per parameter divided by N. After the gradients are reduce-scattered,
// each rank updates its piece and the pieces are all-gathered back into full
// parameters. ZeRO-2 and ZeRO-3 keep this optimizer as it is.
#pragma once

#include <functional>

#include "adamw.h"
#include "comm.h"
#include "config.h"
#include "device.h"
#include "initial_state.h"
#include "shard.h"
#include "shard_pieces.h"
#include "tensor.h"

namespace zf {

class ShardedAdamW {
 public:
  // The state on the device, where dev computes.
  ShardedAdamW(const ModelLayout& layout, const ShardLayout& shards, Precision precision,
               MemoryTracker& mem, Device& dev);

  // Fills this rank's pieces from the initial state: the float32 master (bf16
  // recipe; in fp32 the parameters are their own master) and, on --resume,
  // AdamW's two moments.
  void load(const InitialState& init);

  // The global gradient norm and the clipping coefficient from it, from
  // every rank's gradient pieces (grad_piece(u): S_u elements of the
  // recipe's dtype) with an exact sum (shard_pieces.h), so both equal data
  // parallel's to the bit.
  GradClip clip_scale(Communicator& comm, const std::function<const void*(int)>& grad_piece,
                      float clip) const;

  // AdamW on this rank's piece of unit u (padding skipped), with this step's
  // settings (adam: its learning rate). fp32: param_piece (float) is updated
  // in place. bf16: the master is updated and param_piece (bf16) receives it
  // rounded.
  void update(int u, const void* grad_piece, void* param_piece, const AdamWConfig& adam, long step, float scale);

  // The whole model's float32 values of `kind` (the parameters, or a
  // moment), gathered from every rank's pieces: what ModelStates::full gives
  // for a stage that shards with this optimizer. param_piece(u): this rank's
  // piece of unit u's parameters, as update() takes it.
  std::vector<float> gather(StateKind kind, Communicator& comm,
                            const std::function<const void*(int)>& param_piece, bool every_rank = true) const;
  // This rank's piece of unit u of the same, into out (host memory): what it
  // writes of a sharded checkpoint (ModelStates::copy_piece).
  void copy_piece(StateKind kind, int u, const void* param_piece, float* out) const;

 private:
  // This rank's piece of unit u of `kind`, float32 in device memory: for the
  // parameters, the master (bf16) or param_piece itself (fp32).
  const float* state_piece(StateKind kind, int u, const void* param_piece) const;

  const ModelLayout& layout_;
  const ShardLayout& shards_;
  Precision precision_;
  Device& dev_;
  Tensor m_, v_, master_;  // shard_total float32 each; master only in bf16
};

}  // namespace zf
