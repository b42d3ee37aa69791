// flat_grads.h: FSDP's gradient path: a unit's unsharded gradient,
// reduce-scattered in the reduce dtype into a float32 gradient shard.
//
// A unit's backward adds its gradient into a full buffer of the recipe's
// dtype (begin_unit: N * S_g elements, zeroed, category comm). When the
// unit's backward is done (reduce_unit), the buffer is reduce-scattered
// asynchronously in the reduce dtype (--reduce-dtype: the recipe's by
// default; fp32 under bf16 widens it first, moving twice the bytes and
// rounding once less), and my piece of the sum is added into my float32
// gradient shard (category grads), which AdamW reads. As in stage 02, one
// reduce-scatter stays in flight behind the next unit's backward.
//
// Hybrid sharding (a `replicate` communicator): the piece, summed over my
// shard group, is then all-reduced across the groups before it is added.
// Once its reduce-scatter is done, my piece is copied out of the full
// buffer, which is freed (FSDP2's reduce-scatter writes a tensor of its
// own). Unit g's reduce-scatter is in flight during unit g-1's backward,
// and its all-reduce during unit g-2's.
//
// --no-sync: every unit's full buffer is kept across the micro-steps
// (category grads: one full gradient in the recipe's dtype, for the whole
// step), the backward adds into it as stage 00 does, and only the last
// micro-step reduce-scatters it: stage 00's order of summation, so its bits
// (with the recipe's reduce dtype; fp32 under bf16 sums without rounding).
#pragma once

#include <deque>
#include <optional>
#include <vector>

#include "comm.h"
#include "device.h"
#include "shard.h"
#include "tensor.h"

namespace zf {

// FlatReducer: the buffers and the reduce-scatters. Each reduction, once
// complete, goes back to its owner (complete()), which adds my piece where
// its gradient shard lives: FlatGrads, below, on the device.
class FlatReducer {
 public:
  FlatReducer(const ShardLayout& shards, DType grad_dtype, DType reduce_dtype, bool no_sync, MemoryTracker& mem,
              Device& dev, Communicator& comm, Communicator* replicate);

  // A completed reduction of one unit: my piece of its sum, S_g elements of
  // the reduce dtype at `mine`, inside a buffer this holds (freed with it).
  struct Reduced {
    int unit;
    Tensor owned;    // the full buffer, when it is not one kept by --no-sync
    Tensor widened;  // --reduce-dtype fp32 under bf16: the float32 copy that is reduced
    void* reduced;   // the buffer reduce-scattered in place
    CommHandle handle;
    void* mine = nullptr;
    Tensor piece;  // hybrid sharding: my piece, copied out and all-reduced across the groups
  };

  // Where unit g's backward adds its full gradient (N * S_g elements; the first n_g are the unit's).
  void* begin_unit(int g);
  // Unit g's backward is done. sync: reduce-scatter it now (always without
  // --no-sync; on the last micro-step with it).
  void reduce_unit(int g, bool sync);
  // The oldest reduction, waited for, while more than `in_flight` are in
  // flight; else none. The owner asks with 1 after each unit (one stays in
  // flight behind the next unit's backward) and with 0 at the end. Under
  // hybrid sharding, in flight counts each stage apart: the reduce-scatters,
  // then the all-reduces across the groups.
  std::optional<Reduced> complete(size_t in_flight);
  // --no-sync: unit g's kept gradient is read; zero it for the next step.
  void zero_kept(int g);
  uint64_t reduce_scatters() const { return reduce_scatters_; }

 private:
  void* my_piece_in(void* full, DType dt, int g) const;

  const ShardLayout& layout_;
  DType grad_dtype_, reduce_dtype_;
  bool no_sync_;
  MemoryTracker& mem_;
  Device& dev_;
  Communicator& comm_;
  Communicator* replicate_;
  std::vector<Tensor> kept_;   // --no-sync: every unit's full gradient (category grads)
  Tensor computing_;           // the unit whose backward is running (without --no-sync)
  int computing_unit_ = -1;
  std::deque<Reduced> inflight_;  // reduce-scatters
  std::deque<Reduced> crossing_;  // hybrid sharding: all-reduces across the groups
  uint64_t reduce_scatters_ = 0;
};

// Stage 04's gradients: my piece of each reduction added into my float32
// gradient shard on the device, which AdamW reads.
class FlatGrads {
 public:
  FlatGrads(const ShardLayout& shards, DType grad_dtype, DType reduce_dtype, bool no_sync, MemoryTracker& mem,
            Device& dev, Communicator& comm, Communicator* replicate);

  void* begin_unit(int g) { return reducer_.begin_unit(g); }
  // reduce-scatter unit g (sync), and add the reduction that completes meanwhile.
  void reduce_unit(int g, bool sync);
  // Waits for every reduce-scatter still in flight (end of a backward) and adds it.
  void finish();
  uint64_t reduce_scatters() const { return reducer_.reduce_scatters(); }

  float* piece(int g);  // my accumulated float32 gradient piece of unit g (S_g elements)
  void zero();          // after the optimizer step

 private:
  void add(FlatReducer::Reduced f);

  const ShardLayout& layout_;
  DType reduce_dtype_;
  MemoryTracker& mem_;
  Device& dev_;
  FlatReducer reducer_;
  Tensor shard_;  // shard_total float32 elements (category grads)
};

}  // namespace zf
