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
// That all-reduce is waited for at once, on the compute thread: it does not
// overlap the next unit's backward as the reduce-scatter does.
//
// --no-sync: every unit's full buffer is kept across the micro-steps
// (category grads: one full gradient in the recipe's dtype, for the whole
// step), the backward adds into it as stage 00 does, and only the last
// micro-step reduce-scatters it: stage 00's order of summation, so its bits
// (with the recipe's reduce dtype; fp32 under bf16 sums without rounding).
#pragma once

#include <deque>
#include <vector>

#include "comm.h"
#include "device.h"
#include "shard.h"
#include "tensor.h"

namespace zf {

// Where the reduced pieces go instead of this class's float32 device shards
// (stage 05: to the host, whose shards AdamW reads there).
class GradSink {
 public:
  virtual ~GradSink() = default;
  // Unit g's reduced piece: n elements of dtype in device memory, kept
  // until the Transfer returned has completed. Start moving it.
  virtual Transfer send(int g, const void* piece, DType dtype, size_t n) = 0;
  // The transfer of send(g) has completed: take the piece in.
  virtual void landed(int g) = 0;
};

class FlatGrads {
 public:
  // sink: nullptr (the float32 shards are on the device, here), or where
  // the pieces go; then shard() has nothing to give.
  FlatGrads(const ShardLayout& shards, DType grad_dtype, DType reduce_dtype, bool no_sync, MemoryTracker& mem,
            Device& dev, Communicator& comm, Communicator* replicate, GradSink* sink = nullptr);

  // Where unit g's backward adds its full gradient (N * S_g elements; the first n_g are the unit's).
  void* begin_unit(int g);
  // Unit g's backward is done. sync: reduce-scatter it now (always without
  // --no-sync; on the last micro-step with it).
  void reduce_unit(int g, bool sync);
  // Waits for every reduce-scatter still in flight (end of a backward).
  void finish();

  float* shard(int g);  // my accumulated float32 gradient piece of unit g (S_g elements)
  void zero();          // after the optimizer step
  uint64_t reduce_scatters() const { return reduce_scatters_; }

 private:
  struct InFlight {
    int unit;
    Tensor owned;     // the full buffer, when it is not one kept by --no-sync
    Tensor widened;   // --reduce-dtype fp32 under bf16: the float32 copy that is reduced
    void* reduced;    // the buffer reduce-scattered in place
    CommHandle handle;
    Transfer copy;    // with a sink: my piece on its way
  };
  void complete_oldest();
  void land_oldest();
  void* slot_of_mine(void* full, DType dt, int g) const;

  const ShardLayout& layout_;
  DType grad_dtype_, reduce_dtype_;
  bool no_sync_;
  MemoryTracker& mem_;
  Device& dev_;
  Communicator& comm_;
  Communicator* replicate_;
  GradSink* sink_;
  Tensor shards_;              // shard_total float32 elements (category grads), without a sink
  std::vector<Tensor> kept_;   // --no-sync: every unit's full gradient (category grads)
  Tensor computing_;           // the unit whose backward is running (without --no-sync)
  int computing_unit_ = -1;
  std::deque<InFlight> inflight_;
  std::deque<InFlight> landing_;  // with a sink: reduced, my piece being sent (at most one waits here)
  uint64_t reduce_scatters_ = 0;
};

}  // namespace zf
