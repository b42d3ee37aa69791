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
#include "tensor.h"

namespace zf {

class ShardedAdamW {
 public:
  // The state on the device, where dev computes.
  ShardedAdamW(const ModelLayout& layout, const ShardLayout& shards, Precision precision,
               MemoryTracker& mem, Device& dev);
  virtual ~ShardedAdamW() = default;

  // Fills this rank's pieces from the initial state: the float32 master (bf16
  // recipe; in fp32 the parameters are their own master) and, on --resume,
  // AdamW's two moments.
  void load(const InitialState& init);

  // The global gradient norm and the clipping coefficient from it, computed
  // from every rank's gradient pieces (grad_piece(u): S_u elements of the
  // recipe's dtype) with an exact sum, so both equal data parallel's to the
  // bit. The norm is computed (one small all_reduce) even when clip is 0.
  GradClip clip_scale(Communicator& comm, const std::function<const void*(int)>& grad_piece,
                      float clip) const;

  // AdamW on this rank's piece of unit u (padding skipped), with this step's
  // settings (adam: its learning rate). fp32: param_piece (float) is updated
  // in place. bf16: the master is updated and param_piece (bf16) receives it
  // rounded.
  void update(int u, const void* grad_piece, void* param_piece, const AdamWConfig& adam, long step, float scale) {
    update(u, grad_piece, param_piece, adam, step, scale, nullptr);
  }

  // The float32 values of this rank's piece of unit u (device memory): the
  // master (bf16), or param_piece itself (fp32).
  const float* fp32_piece(int u, const void* param_piece) const;

  // The whole model's float32 values of `kind` (the parameters, or a
  // moment), gathered from every rank's pieces: what ModelStates::full gives
  // for a stage that shards with this optimizer. param_piece(u): this rank's
  // piece of unit u's parameters, as update() takes it.
  std::vector<float> gather(StateKind kind, Communicator& comm,
                            const std::function<const void*(int)>& param_piece, bool every_rank = true) const;
  // This rank's piece of unit u of the same, into host: what it writes of a
  // sharded checkpoint (ModelStates::copy_piece).
  void copy_piece(StateKind kind, int u, const void* param_piece, float* host) const;

 protected:
  // For a subclass that keeps the state somewhere other than the rank's
  // device: m, v and (bf16) master of shard_total float32 elements, given;
  // dev computes where they live, and comm_dev is the rank's device, which
  // the collectives stage through.
  ShardedAdamW(const ModelLayout& layout, const ShardLayout& shards, Precision precision, Tensor m, Tensor v,
               Tensor master, Device& dev, Device& comm_dev);
  // update(), and with `rounded` the updated float32 values rounded to bf16
  // into it too, in the same pass (Device::adamw_copy): what such a subclass
  // sends to the device when its float32 values live elsewhere.
  void update(int u, const void* grad_piece, void* param_piece, const AdamWConfig& adam, long step, float scale,
              bf16* rounded);

 private:
  const float* state_piece(StateKind kind, int u, const void* param_piece) const;

  const ModelLayout& layout_;
  const ShardLayout& shards_;
  Precision precision_;
  Device& dev_;
  Device& comm_dev_;
  Tensor m_, v_, master_;  // shard_total float32 each; master only in bf16
};

// The global gradient norm and clipping coefficient from every rank's
// pieces (grad_piece(u): S_u elements of dtype, memory of dev), with the
// exact sum (ShardedAdamW::clip_scale; comm_dev: what the all_reduce stages through).
GradClip clip_scale(const ShardLayout& shards, Device& dev, Device& comm_dev, Communicator& comm,
                    const std::function<const void*(int)>& grad_piece, DType dtype, float clip);

// The whole model as float32 in consolidated order, gathered from every
// rank's float32 pieces (one all_gather per unit): on every rank, or, when
// every_rank is false, on comm's rank 0 alone (the others pass each unit
// through and return nothing: a checkpoint's write needs one copy, not N).
// For the final parameter hash and consolidated checkpoints; uses untracked
// host memory, so call it after the memory counts are taken. fp32_piece(u)
// is memory of piece_dev (default: dev, the rank's device, which the
// collectives stage through).
std::vector<float> gather_full_model(Communicator& comm, Device& dev, const ModelLayout& layout,
                                     const ShardLayout& shards,
                                     const std::function<const float*(int)>& fp32_piece,
                                     Device* piece_dev = nullptr, bool every_rank = true);

}  // namespace zf
